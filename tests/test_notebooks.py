"""Every notebook in notebooks/ runs end to end (as a plain Python script), and is a valid
Databricks source-format notebook."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(
    p
    for p in glob.glob(os.path.join(HERE, "notebooks", "*.py"))
    if not os.path.basename(p).startswith("_")
)


def test_there_are_the_four_notebooks():
    assert {os.path.basename(p) for p in NOTEBOOKS} == {
        "quickstart.py",
        "retries_and_dead_letters.py",
        "exactly_once_sink.py",
        "operations.py",
    }


@pytest.mark.parametrize(
    "path", NOTEBOOKS + [os.path.join(HERE, "notebooks", "_setup.py")], ids=os.path.basename
)
def test_notebook_is_databricks_source_format(path):
    text = open(path, encoding="utf-8").read()
    assert text.startswith("# Databricks notebook source\n")
    cells = text.split("\n# COMMAND ----------\n")
    assert len(cells) >= 2
    assert "# MAGIC %md" in text
    compile(text, path, "exec")  # every cell is Python (MAGIC lines are comments)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs_end_to_end(path, tmp_path):
    env = dict(os.environ, ROCKETSPARK_STORE=str(tmp_path / "store"))
    out = subprocess.run(
        [sys.executable, path], capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path
    )
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-4000:])

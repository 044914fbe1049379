"""Every notebook in notebooks/ runs end to end (as a plain Python script), and is a valid
Databricks source-format notebook."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time

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


def _checks() -> dict:
    """The notebooks' checks: the last cell of _setup.py, run on its own."""
    text = open(os.path.join(HERE, "notebooks", "_setup.py"), encoding="utf-8").read()
    cell = text.split("\n# COMMAND ----------\n")[-1]
    scope: dict = {"RUN_DIR": "/tmp/rocketspark-notebooks-x", "WORK": "/tmp/w"}
    exec(compile(cell, "_setup.py", "exec"), scope)
    return scope


class _Query:
    """A streaming query as the checks see it."""

    def __init__(self, active: bool, error: Exception | None = None):
        self.isActive, self._error = active, error
        self.status = {"message": "Waiting for data to arrive"}
        self.lastProgress = {"batchId": 3}

    def exception(self):
        return self._error

    def awaitTermination(self, timeout=None):
        return not self.isActive


def test_a_notebook_reports_a_failed_stream_at_once_with_its_error():
    checks = _checks()
    dead = _Query(False, RuntimeError("Python worker failed to connect back"))
    started = time.monotonic()
    with pytest.raises(AssertionError) as caught:
        checks["wait_for"](lambda: False, dead, "the auditors stream catching up", timeout=120)
    assert time.monotonic() - started < 5  # not after the 120 s
    message = str(caught.value)
    assert message.startswith("the auditors stream catching up: the stream failed: Python worker")
    assert "kept in /tmp/rocketspark-notebooks-x" in message
    with pytest.raises(AssertionError, match="stopped before it was done"):
        checks["wait_for"](lambda: False, _Query(False), "copying", timeout=120)
    with pytest.raises(AssertionError, match="counting: the stream failed: boom"):
        checks["finish"](_Query(False, ValueError("boom")), "counting")


def test_a_notebook_says_what_it_waited_for_when_time_runs_out():
    checks = _checks()
    with pytest.raises(AssertionError) as caught:
        checks["wait_for"](lambda: False, _Query(True), "copying 800", timeout=0.3, poll=0.05)
    message = str(caught.value)
    assert "copying 800: not done after 0.3 s" in message
    assert "Waiting for data to arrive" in message and "'batchId': 3" in message
    with pytest.raises(AssertionError, match="expected 3 rows, got 2"):
        checks["check"](2 == 3, "expected 3 rows, got 2")

"""The README's Spark quick start, run as written in a fresh interpreter."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.spark

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def test_quick_start_runs_as_written(tmp_path):
    text = open(README, encoding="utf-8").read()
    m = re.search(r"<!-- quickstart -->\s*```python\n(.*?)```\s*<!-- /quickstart -->", text, re.S)
    assert m, "README has no quick start block"
    script = tmp_path / "quickstart.py"
    script.write_text(m.group(1), encoding="utf-8")
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"\|\s*paid\|\s*334\|", out.stdout), out.stdout
    assert re.search(r"\|\s*334\|\s*1003\|", out.stdout), out.stdout
    assert (
        "lag of group billing: {('orders', 0): 0, ('orders', 1): 0, ('orders', 2): 0, "
        "('orders', 3): 0}" in out.stdout
    )
    assert '"id": 42' in out.stdout

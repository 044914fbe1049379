"""The data source through Spark Connect, in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.spark

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_batch_read_and_exactly_once_stream_through_spark_connect(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "tests.helpers.connect_pipeline", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    # round robin over 2 queues: even bodies in queue 0, odd in queue 1
    assert seen["read"] == [
        [i % 2, i // 2, f"o{i}"] for i in sorted(range(10), key=lambda i: (i % 2, i))
    ]
    assert seen["error"] is None
    assert seen["out"] == sorted(f"O{i}" for i in range(10))

"""SIGKILL a running query (driver, JVM and workers) and restart it: every row exactly once."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from rocketspark.store import Message, MessageStore

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PIPELINE = os.path.join(os.path.dirname(__file__), "helpers", "pipeline.py")


def _start(store_path: str, chk: str, mode: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, PIPELINE, store_path, chk, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _out(store_path: str) -> list[tuple[int, str]]:
    with MessageStore.open(store_path) as s:
        out = []
        if not s.has_topic("out"):
            return out
        for q in range(s.topic("out").read_queue_nums):
            out.extend((q, m.body.decode()) for m in s.pull("out", q, 0, 1_000_000).messages)
        return out


def test_killed_pipeline_restarts_without_loss_or_duplicates(store_path, tmp_path):
    rng = random.Random(11)
    chk = str(tmp_path / "chk")
    with MessageStore.open(store_path) as s:
        s.create_topic("in", queues=3)
        s.create_topic("out", queues=3)
        s.put_batch([Message("in", b"x") for _ in range(600)])
    kills = 0
    torn = 0  # kills that left half messages written but not committed
    while kills < 3 or (torn == 0 and kills < 8):
        p = _start(store_path, chk, "forever")
        try:
            # Wait until the query is busy (rows or half messages appear), then kill it
            # at a random moment: between task writes and the batch commit, or not.
            deadline = time.time() + 120
            with MessageStore.open(store_path) as s:
                while time.time() < deadline and p.poll() is None:
                    busy = s.open_transactions() or (
                        s.has_topic("out") and any(s.max_offset("out", q) for q in range(3))
                    )
                    if busy:
                        break
                    time.sleep(0.02)
            if torn == 0 and kills >= 2:  # aim: kill as soon as halves are open
                with MessageStore.open(store_path) as s:
                    while time.time() < deadline and not s.open_transactions():
                        time.sleep(0.005)
            else:
                time.sleep(rng.uniform(0.0, 2.5))
            assert p.poll() is None, p.stdout.read().decode()[-3000:]
        finally:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        kills += 1
        with MessageStore.open(store_path) as s:  # more input while it is down
            torn += bool(s.open_transactions())
            if kills <= 3:
                s.put_batch([Message("in", b"y") for _ in range(30)])
    p = _start(store_path, chk, "available_now")
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 0, out.decode()[-3000:]
    rows = _out(store_path)
    bodies = [b for _, b in rows]
    assert len(bodies) == len(set(bodies)), "a row was written twice"
    want = {f"{q}:{i}" for q in range(3) for i in range(230)}  # (600 + 3*30) / 3 per queue
    assert set(bodies) == want
    # per in-queue, the rows arrive in queue order (they share an out queue)
    for q in range(3):
        seq = [int(b.split(":")[1]) for _, b in rows if b.startswith(f"{q}:")]
        assert seq == sorted(seq)
    with MessageStore.open(store_path) as s:
        assert s.open_transactions() == []
        assert s.lag("pipeline", "in") == {("in", q): 0 for q in range(3)}
    assert torn >= 1, f"none of {kills} kills landed between task writes and the commit"

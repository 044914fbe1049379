"""SIGKILL a running query (driver, JVM and workers) and restart it: every row exactly once.

Runs on every backend (the ``backend`` fixture): the query reaches it with the
backend's options; the test seeds and watches it through the backend's client.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from rocketspark.client import Message

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PIPELINE = os.path.join(os.path.dirname(__file__), "helpers", "pipeline.py")


def _start(backend, topics: tuple[str, str, str], chk: str, mode: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, PIPELINE, json.dumps(backend.options), *topics, chk, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _out(backend, out: str) -> list[tuple[int, str]]:
    return [(r["queueId"], r["body"].decode()) for r in backend.rows(out)]


@pytest.mark.not_on_serve(
    "two minutes of kills, run on the embedded store and the cluster; on serve, "
    "test_sink_commit's crash tests cover the check-backs of a crashed commit's halves"
)
def test_killed_pipeline_restarts_without_loss_or_duplicates(backend, tmp_path):
    rng = random.Random(11)
    chk = str(tmp_path / "chk")
    client = backend.client
    in_, out = backend.fresh_topic("in", queues=3), backend.fresh_topic("out", queues=3)
    group = backend.fresh_name("pipeline")
    topics = (in_, out, group)
    out_queues = backend.queues(out)
    client.put_batch([Message(in_, b"x") for _ in range(600)])
    kills = 0
    torn = 0  # kills that left half messages written but not committed
    while kills < 3 or (torn == 0 and kills < 8):
        p = _start(backend, topics, chk, "forever")
        try:
            # Wait until the query is busy (rows or half messages appear), then kill it
            # at a random moment: between task writes and the batch commit, or not.
            deadline = time.time() + 120
            while time.time() < deadline and p.poll() is None:
                busy = backend.open_halves(out) or any(client.max_offset(q) for q in out_queues)
                if busy:
                    break
                time.sleep(0.02)
            if torn == 0 and kills >= 2:  # aim: kill as soon as halves are open
                while time.time() < deadline and not backend.open_halves(out):
                    time.sleep(0.005)
            else:
                time.sleep(rng.uniform(0.0, 2.5))
            assert p.poll() is None, p.stdout.read().decode()[-3000:]
        finally:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        kills += 1
        torn += bool(backend.open_halves(out))
        if kills <= 3:  # more input while it is down
            client.put_batch([Message(in_, b"y") for _ in range(30)])
    p = _start(backend, topics, chk, "available_now")
    output, _ = p.communicate(timeout=600)
    assert p.returncode == 0, output.decode()[-3000:]
    # (a cluster's brokers end the halves a kill left by their check-backs)
    assert backend.settled_halves(out) == []
    rows = _out(backend, out)
    bodies = [b for _, b in rows]
    assert len(bodies) == len(set(bodies)), "a row was written twice"
    in_queues = [f"{mq.broker}:{mq.queue_id}" for mq in backend.queues(in_)]
    want = {f"{q}:{i}" for q in in_queues for i in range(230)}  # (600 + 3*30) / 3 per queue
    assert set(bodies) == want
    # per in-queue, the rows arrive in queue order (they share an out queue); on a
    # cluster, transactional messages are not ordered messages: a broker commits the
    # halves on its thread pool, in no set order (README: A RocketMQ cluster)
    if backend.name == "embedded":
        for q in in_queues:
            seq = [int(b.rsplit(":", 1)[1]) for _, b in rows if b.startswith(f"{q}:")]
            assert seq == sorted(seq)
    assert backend.lag(group, in_) == {mq: 0 for mq in backend.queues(in_)}
    assert torn >= 1, f"none of {kills} kills landed between task writes and the commit"

"""Several writer processes and a tailing reader process on one store."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict

import pytest

from rocketspark.store import MessageStore
from tests.store.helpers.writer import SMALL
from tests.store.test_crash_recovery import ROOT, acked, read_all, spawn_writer, wait_ready


@pytest.mark.slow
def test_concurrent_writers_and_a_tailing_reader(tmp_path):
    store_dir = tmp_path / "store"
    with MessageStore.open(store_dir, **SMALL) as s:
        s.create_topic("crash", queues=3)
    per_writer = 1500
    writers = 3
    tail_out = tmp_path / "tail"
    tailer = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.store.helpers.tailer",
            str(store_dir),
            str(tail_out),
            str(per_writer * writers),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    wait_ready(tailer)
    procs = [
        spawn_writer(
            store_dir,
            tmp_path / f"acks{i}",
            f"w{i}",
            count=per_writer,
            batch=[1, 5, 50][i],
            flush="ASYNC",
        )
        for i in range(writers)
    ]
    for p in procs:
        wait_ready(p)
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read().decode()
    out, err = tailer.communicate(timeout=300)
    assert tailer.returncode == 0, err.decode()
    assert out.split()[-1] == str(per_writer * writers).encode()

    with MessageStore.open(store_dir, **SMALL) as store:
        messages = read_all(store)
    bodies = [m.body.decode() for m in messages]
    assert len(bodies) == len(set(bodies)) == per_writer * writers
    for i in range(writers):
        assert len(acked(tmp_path / f"acks{i}")) == per_writer
    # Per queue, each writer's messages appear in the order it put them.
    by_queue = defaultdict(list)
    for m in messages:
        by_queue[m.queue_id].append(m.body.decode())
    for q, items in by_queue.items():
        for w in range(writers):
            seqs = [int(b.split(":")[1]) for b in items if b.startswith(f"w{w}:")]
            assert seqs == sorted(seqs), f"queue {q} writer {w} out of order"
    # The tailer saw exactly the same messages, each once, in queue order.
    with open(tail_out) as f:
        lines = [line.split() for line in f]
    assert sorted(b for _, _, b in lines) == sorted(bodies)
    for q in range(3):
        offs = [int(o) for qq, o, _ in lines if int(qq) == q]
        assert offs == list(range(len(offs)))
    assert not os.path.exists(store_dir / "abort")

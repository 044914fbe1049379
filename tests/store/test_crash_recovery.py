"""Crash safety: writers killed with SIGKILL at random moments, then the store reopened."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from rocketspark.store import Message, MessageStore, PullStatus
from tests.store.helpers.writer import SMALL

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def spawn_writer(store_dir, ack_path, tag, count=10**9, batch=1, flush="SYNC"):
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.store.helpers.writer",
            str(store_dir),
            str(ack_path),
            tag,
            str(count),
            str(batch),
            flush,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def wait_ready(proc):
    line = proc.stdout.readline()
    assert line.strip() == b"ready", proc.stderr.read().decode()


def read_all(store, topic="crash"):
    """Return every message of the topic, checking ConsumeQueue against CommitLog."""
    out = []
    info = store.topic(topic)
    for q in range(info.read_queue_nums):
        off = 0
        while True:
            res = store.pull(topic, q, off, max_msgs=256)
            if res.status is not PullStatus.FOUND:
                assert res.status is PullStatus.NO_NEW_MSG
                break
            for i, m in enumerate(res.messages):
                # Each ConsumeQueue entry points at a record of its own queue and offset.
                assert (m.topic, m.queue_id, m.queue_offset) == (topic, q, off + i)
            out += res.messages
            off = res.next_offset
    return out


def acked(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.strip() for line in f if line.strip()]


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 7])
def test_sigkill_at_random_moments_loses_no_acknowledged_message(tmp_path, batch):
    rng = random.Random(1234 + batch)
    store_dir = tmp_path / "store"
    ack_path = tmp_path / "acks"
    rounds = 12
    for round_no in range(rounds):
        proc = spawn_writer(store_dir, ack_path, f"r{round_no}", batch=batch)
        wait_ready(proc)
        time.sleep(rng.uniform(0.01, 0.4))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with MessageStore.open(store_dir, **SMALL) as store:
            assert store.recovery_report.abnormal_exit
            messages = read_all(store)
            bodies = Counter(m.body.decode() for m in messages)
            dupes = [b for b, c in bodies.items() if c > 1]
            assert not dupes, f"round {round_no}: duplicated {dupes[:5]}"
            missing = [a for a in acked(ack_path) if a not in bodies]
            assert not missing, f"round {round_no}: lost acknowledged {missing[:5]}"
            # New puts continue right after what survived, in every queue.
            before = {q: store.max_offset("crash", q) for q in range(3)}
            r = store.put(Message("crash", f"after-{round_no}".encode(), queue_id=round_no % 3))
            assert r.queue_offset == before[round_no % 3]
            assert (
                store.pull("crash", r.queue_id, r.queue_offset).messages[0].body
                == f"after-{round_no}".encode()
            )
            # The index knows the survivors too.
            some = acked(ack_path)[-1:] if acked(ack_path) else []
            for body in some:
                tag, seq = body.split(":")
                hits = store.query_by_key("crash", f"k-{tag}-{seq}")
                assert [h.body.decode() for h in hits] == [body]


@pytest.mark.slow
def test_torn_tail_is_discarded_and_reported(tmp_path):
    store_dir = tmp_path / "store"
    with MessageStore.open(store_dir, **SMALL) as store:
        store.create_topic("t", queues=1)
        rs = store.put_batch([Message("t", b"m%d" % i) for i in range(10)])
    # Tear the last record: flip a byte of its body and pretend the exit was abnormal.
    last = rs[-1]
    seg = store_dir / "commitlog" / f"{0:020d}"
    data = bytearray(seg.read_bytes())
    data[last.commitlog_offset + 88] ^= 0xFF
    seg.write_bytes(bytes(data))
    (store_dir / "abort").touch()
    state = store_dir / "rocketspark.state"
    raw = bytearray(state.read_bytes())
    raw[40:48] = (0).to_bytes(8, "big")  # FLUSHED_POS: scan from the start
    state.write_bytes(bytes(raw))
    with MessageStore.open(store_dir, **SMALL) as store:
        rep = store.recovery_report
        assert rep.abnormal_exit and rep.commit_end == last.commitlog_offset
        assert "CRC" in rep.reason
        assert rep.truncated_queue_entries == 1
        assert store.max_offset("t", 0) == 9
        r = store.put(Message("t", b"new"))
        assert (r.queue_offset, r.commitlog_offset) == (9, last.commitlog_offset)
        assert [m.body for m in read_all(store, "t")][-2:] == [b"m8", b"new"]


_STRADDLE = dict(mappedFileSizeCommitLog="65536", maxHashSlotNum="64", maxIndexNum="4")


def _put_then_die_inside_an_append(store_dir: str) -> None:
    from rocketspark.store import commit_log

    store = MessageStore.open(store_dir, **_STRADDLE)
    store.create_topic("t", queues=1)
    store.put(Message("t", b"m1", keys=["k1"]))  # index entries 1-2 of the first file
    store.put(Message("t", b"m2", keys=["k2"]))  # UNIQ_KEY: entry 3 (full); k2: next file
    write = commit_log.CommitLog.write

    def write_then_die(self, writes):
        write(self, writes)
        os.kill(os.getpid(), signal.SIGKILL)  # copied, never published (COMMIT_POS)

    commit_log.CommitLog.write = write_then_die
    store.put(Message("t", b"m3", keys=["k3"]))


def test_recovery_reindexes_a_message_whose_index_entries_span_two_files(tmp_path):
    # Recovery indexes the killed append, then cuts it: the index file it reached is
    # deleted and rebuilt from its first record, m2, whose UNIQ_KEY entry sits in the
    # file before. m2's keys must be indexed again all the same.
    import multiprocessing

    store_dir = str(tmp_path / "s")
    child = multiprocessing.get_context("spawn").Process(
        target=_put_then_die_inside_an_append, args=(store_dir,)
    )
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    with MessageStore.open(store_dir, **_STRADDLE) as s:
        assert s.recovery_report.reason == "unfinished append"
        msgs = s.pull("t", 0, 0, 10).messages
        assert [m.body for m in msgs] == [b"m1", b"m2"]
        for m in msgs:
            assert [x.commitlog_offset for x in s.query_by_key("t", m.keys[0])] == [
                m.commitlog_offset
            ]
            assert [x.body for x in s.query_by_key("t", m.uniq_key)] == [m.body]
        assert s.query_by_key("t", "k3") == []


def _put_then_die_before_the_index_publishes(store_dir: str) -> None:
    import rocketspark.store.index_file as index_file

    store = MessageStore.open(store_dir, **dict(_STRADDLE, maxIndexNum="400"))
    if not store.has_topic("t"):
        store.create_topic("t", queues=1)
    store.put(Message("t", b"first", keys=["k"]))
    count = index_file._INT

    class DieAtPublish:  # entries, slots and endPhyOffset are written; indexCount is not
        def unpack_from(self, *args):
            return count.unpack_from(*args)

        def pack_into(self, buf, offset, value):
            if offset == index_file.INDEX_COUNT_OFFSET:
                os.kill(os.getpid(), signal.SIGKILL)
            return count.pack_into(buf, offset, value)

    index_file._INT = DieAtPublish()
    store.put(Message("t", b"second", keys=["k"]))


@pytest.mark.parametrize("peer", ["reopened", "open all along"])
def test_a_writer_killed_inside_an_index_update_leaves_every_key_findable(tmp_path, peer):
    # The killed update left k's hash slot pointing at an entry number the next put
    # overwrites (cutting k's chain to "first") and endPhyOffset past "second" (so
    # re-dispatching skipped indexing it). Recovery, or a live process finding the
    # writer dead, relinks the slot and re-indexes.
    import contextlib
    import multiprocessing

    store_dir = str(tmp_path / "s")
    conf = dict(_STRADDLE, maxIndexNum="400")
    with contextlib.ExitStack() as stack:
        if peer == "open all along":
            live = stack.enter_context(MessageStore.open(store_dir, **conf))
            live.create_topic("t", queues=1)
        child = multiprocessing.get_context("spawn").Process(
            target=_put_then_die_before_the_index_publishes, args=(store_dir,)
        )
        child.start()
        child.join(60)
        assert child.exitcode == -signal.SIGKILL
        s = (
            live
            if peer == "open all along"
            else stack.enter_context(MessageStore.open(store_dir, **conf))
        )
        s.put(Message("t", b"third", keys=["other"]))  # writes over the unpublished entry
        assert sorted(m.body for m in s.query_by_key("t", "k")) == [b"first", b"second"]
        assert [m.body for m in s.pull("t", 0, 0, 10).messages] == [b"first", b"second", b"third"]

"""The appender: the write lock, queue offsets, the one commit sequence, flush."""

from __future__ import annotations

import threading
import time

import pytest

from rocketspark.store import Message, MessageStore
from rocketspark.store.appender import Append

SMALL = dict(mappedFileSizeCommitLog=1 << 20, maxHashSlotNum=64, maxIndexNum=4096)


@pytest.fixture
def store(tmp_path, clock):
    with MessageStore.open(tmp_path / "s", clock=clock, **SMALL) as s:
        s.create_topic("t", queues=2)
        yield s


@pytest.fixture
def commits(monkeypatch):
    """Every Append.commit: (end, COMMIT_POS and DISPATCHED_POS seen by the dispatch)."""
    seen = []
    real = Append.commit

    def spy(self, end, dispatch, *args):
        def watched(*a):
            seen.append((end, self.state.commit_pos, self.state.dispatched_pos))
            dispatch(*a)

        real(self, end, watched, *args)

    monkeypatch.setattr(Append, "commit", spy)
    return seen


def _every_put(s, clock):
    s.put(Message("t", b"one"))
    s.put_batch([Message("t", b"a"), Message("t", b"b", keys=("k",))])
    s.put_batch([Message("t", b"d", delay_level=1)])
    s.put_columns([b"x"] * 100, topic="t")
    s.put_columns([b"y", b"z"], topic="t", tags=["A", None], keys=["k1", None])
    halves = s.prepare_columns([b"h1", b"h2"], topic="t", producer_group="g")
    s.commit_transaction(halves)
    s.send_back("g", s.pull("t", 0, 0).messages[0])
    clock.advance(60_000)
    s.run_schedule()


def test_every_append_commits_once_through_the_one_sequence(store, clock, commits):
    _every_put(store, clock)
    assert len(commits) == 10
    previous = 0
    for end, commit_pos, dispatched in commits:
        # COMMIT_POS moved before the dispatch, DISPATCHED_POS after it
        assert commit_pos == end and dispatched < end
        assert end > previous
        previous = end
    assert store.state.commit_pos == store.state.dispatched_pos == commits[-1][0]


def test_a_batch_is_one_append_of_records(store, monkeypatch):
    calls = []
    real = Append.records
    monkeypatch.setattr(
        Append,
        "records",
        lambda self, prepared, now: calls.append(len(prepared)) or real(self, prepared, now),
    )
    store.put_batch([Message("t", b"%d" % i, delay_level=2) for i in range(5)])
    assert calls == [5]


def test_a_failed_append_gives_its_queue_offsets_back(store, monkeypatch):
    first = store.put(Message("t", b"a", queue_id=0))
    commit = store.state.commit_pos

    def refuse(*args, **kwargs):
        raise OSError("no room")

    for put in (
        lambda: store.put(Message("t", b"b", queue_id=0)),
        lambda: store.put_batch([Message("t", b"b", queue_id=0, delay_level=1)]),
        lambda: store.put_columns([b"b"] * 100, topic="t", queue_ids=[0] * 100),
    ):
        with monkeypatch.context() as m:
            m.setattr(store.appender, "make_room", refuse)
            with pytest.raises(OSError):
                put()
        assert store.state.commit_pos == store.state.pending_end == commit
    after = store.put(Message("t", b"c", queue_id=0))
    assert after.queue_offset == first.queue_offset + 1  # no hole
    assert [m.body for m in store.pull("t", 0, 0).messages] == [b"a", b"c"]


def test_reserved_offsets_are_skipped_until_given_back(store):
    store.put(Message("t", b"a", queue_id=1))
    with store.appender.locked() as append:
        assert append.next_queue_offset("t", 1) == 1
        assert append.reserve_queue_offsets("t", 1, 3) == 1
        assert append.next_queue_offset("t", 1) == 4
    store.appender.give_back_queue_offsets()
    with store.appender.locked() as append:
        assert append.next_queue_offset("t", 1) == 1


def test_after_wakes_a_long_poll_of_this_process(store):
    got = []
    poll = threading.Thread(target=lambda: got.append(store.pull("t", 0, 0, timeout_ms=10_000)))
    poll.start()
    time.sleep(0.05)
    start = time.monotonic()
    store.put(Message("t", b"a", queue_id=0))
    poll.join(5)
    assert time.monotonic() - start < 2
    assert [m.body for m in got[0].messages] == [b"a"]


def test_flush_moves_flushed_pos_to_the_end(store):
    r = store.put(Message("t", b"a", queue_id=0))
    store.flush()
    assert store.state.flushed_pos == r.commitlog_offset + r.store_size


def test_sync_flush_group_commit(tmp_path):
    with MessageStore.open(tmp_path / "s", flushDiskType="SYNC_FLUSH", **SMALL) as s:
        s.create_topic("t", queues=1)
        r = s.put(Message("t", b"a"))
        assert s.state.synced_pos >= r.commitlog_offset + r.store_size
        rs = s.put_columns([b"b"] * 100, topic="t")
        assert s.state.synced_pos >= rs[-1].commitlog_offset + rs[-1].store_size

"""The Reader on a store's parts: pull, long polling, Arrow reads, lookups.

A store writes the records; a Reader of its own (its own arrivals condition)
reads them through the store's CommitLog, ConsumeQueues, index and state.
"""

from __future__ import annotations

import threading
import time

import pytest

from rocketspark.errors import ConfigError, CorruptRecordError, OffsetOutOfRangeError
from rocketspark.store import Message, MessageStore, PullStatus
from rocketspark.store import reader as reader_module
from rocketspark.store.reader import MAX_FILTER_SCAN, Reader

SMALL = dict(
    mappedFileSizeCommitLog=1 << 16,
    mappedFileSizeConsumeQueue=20 * 64,
    maxHashSlotNum=64,
    maxIndexNum=1024,
)


class Clock:
    def __init__(self, now: int = 1_700_000_000_000):
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store(tmp_path, clock):
    with MessageStore.open(tmp_path / "s", clock=clock, **SMALL) as s:
        s.create_topic("t", queues=2)
        yield s


def _reader(store: MessageStore, arrivals: threading.Condition | None = None) -> Reader:
    return Reader(
        store.config,
        store.commit_log,
        store.queues,
        store.index,
        store.state,
        arrivals or threading.Condition(),
    )


def test_pull_reads_a_queue_and_says_where_it_stands(store):
    store.put_batch([Message("t", b"m%d" % i, queue_id=0) for i in range(5)])
    r = _reader(store)
    res = r.pull("t", 0, 1, max_msgs=3)
    assert res.status is PullStatus.FOUND
    assert [m.body for m in res.messages] == [b"m1", b"m2", b"m3"]
    assert (res.next_offset, res.min_offset, res.max_offset) == (4, 0, 5)
    assert r.pull("t", 0, 5).status is PullStatus.NO_NEW_MSG
    illegal = r.pull("t", 0, 9)
    assert (illegal.status, illegal.next_offset) == (PullStatus.OFFSET_ILLEGAL, 5)
    with pytest.raises(ConfigError):
        r.pull("t", 0, 0, max_msgs=0)
    with pytest.raises(OffsetOutOfRangeError):
        r.pull("t", 2, 0)  # the topic has queues 0 and 1


def test_a_filtered_pull_scans_at_most_max_filter_scan_entries(store):
    n = MAX_FILTER_SCAN + 10
    store.put_batch([Message("t", b"x", tags="skip", queue_id=0) for _ in range(n)])
    store.put(Message("t", b"wanted", tags="keep", queue_id=0))
    r = _reader(store)
    first = r.pull("t", 0, 0, max_msgs=1, expression="keep")
    assert first.status is PullStatus.NO_MATCHED_MSG
    assert first.next_offset == MAX_FILTER_SCAN
    second = r.pull("t", 0, first.next_offset, max_msgs=1, expression="keep")
    assert [m.body for m in second.messages] == [b"wanted"]
    assert second.next_offset == n + 1


def test_a_long_poll_returns_when_a_put_lands_or_when_it_times_out(store):
    r = _reader(store)
    t0 = time.monotonic()
    res = r.pull("t", 0, 0, timeout_ms=100)
    assert res.status is PullStatus.NO_NEW_MSG and time.monotonic() - t0 >= 0.1

    arrivals = threading.Condition()
    r = _reader(store, arrivals)

    def put_later() -> None:
        time.sleep(0.05)
        store.put(Message("t", b"late", queue_id=0))
        with arrivals:
            arrivals.notify_all()

    th = threading.Thread(target=put_later)
    t0 = time.monotonic()
    th.start()
    try:
        res = r.pull("t", 0, 0, timeout_ms=10_000)
    finally:
        th.join()
    assert [m.body for m in res.messages] == [b"late"]
    assert time.monotonic() - t0 < 5


def test_read_batches_builds_blocks_of_arrow_block_rows(store, monkeypatch):
    store.put_batch([Message("t", b"m%d" % i, tags="a" if i % 2 else "b") for i in range(10)])
    monkeypatch.setattr(reader_module, "ARROW_BLOCK", 4)
    r = _reader(store)
    hi = store.max_offset("t", 0)
    batches, nxt = r.read_batches("t", 0, 0)
    assert nxt == hi and [b.num_rows for b in batches] == [
        min(4, hi - at) for at in range(0, hi, 4)
    ]
    only_a, _ = r.read_batches("t", 0, 0, expression="a")
    assert {t for b in only_a for t in b.column("tags").to_pylist()} <= {"a"}
    assert r.read_batches("t", 0, hi) == ([], hi)
    with pytest.raises(OffsetOutOfRangeError):
        r.read_batches("t", 0, hi + 1)


def test_get_message_checks_the_record_against_its_queue_entry(store):
    res = store.put(Message("t", b"body", queue_id=1))
    r = _reader(store)
    assert r.get_message(res.commitlog_offset).body == b"body"
    with pytest.raises(OffsetOutOfRangeError):
        r.get_message(store.state.commit_pos)
    store.commit_log.set_queue_offset(res.commitlog_offset, 7)  # QUEUEOFFSET has no checksum
    with pytest.raises(CorruptRecordError, match="offset 7, which does not exist"):
        r.get_message(res.commitlog_offset)


def test_query_by_key_returns_the_newest_first_within_the_time_range(store, clock):
    stamps = []
    for i in range(4):
        clock.now += 5_000
        stamps.append(clock.now)
        store.put(Message("t", b"v%d" % i, keys=["k"]))
    store.put(Message("t", b"other", keys=["x"]))
    r = _reader(store)
    assert [m.body for m in r.query_by_key("t", "k")] == [b"v3", b"v2", b"v1", b"v0"]
    assert [m.body for m in r.query_by_key("t", "k", max_num=2)] == [b"v3", b"v2"]
    assert [m.body for m in r.query_by_key("t", "k", stamps[1], stamps[2])] == [b"v2", b"v1"]
    assert r.query_by_key("t", "missing") == []


def test_offset_for_timestamp_finds_the_first_message_at_or_after_it(store, clock):
    start = clock.now
    for i in range(6):
        clock.now = start + 1000 * i
        store.put(Message("t", b"m", queue_id=0))
    r = _reader(store)
    assert r.offset_for_timestamp("t", 0, start - 1) == 0
    assert r.offset_for_timestamp("t", 0, start + 2500) == 3
    assert r.offset_for_timestamp("t", 0, start + 3000) == 3
    assert r.offset_for_timestamp("t", 0, start + 99_999) == 6
    assert r.offset_for_timestamp("t", 1, start) == 0  # an empty queue

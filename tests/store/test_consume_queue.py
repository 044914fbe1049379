"""ConsumeQueues: a store's queues by (topic, queue id), on real files, without a store;
and the bytes of an entry a store's put writes."""

from __future__ import annotations

import os
import threading

import pytest

from rocketspark.errors import OffsetOutOfRangeError, UnknownTopicError
from rocketspark.store import Message, MessageStore
from rocketspark.store.consume_queue import CQ_STORE_UNIT_SIZE, ConsumeQueue, ConsumeQueues
from rocketspark.store.topic_config import TopicConfigTable
from tests.store.helpers.stores import SMALL

FILE = CQ_STORE_UNIT_SIZE * 4  # four entries a file


@pytest.fixture
def queues(tmp_path):
    topics = TopicConfigTable(tmp_path / "config")
    topics.create("t", 2, 2)
    qs = ConsumeQueues(str(tmp_path), FILE, topics)
    yield qs
    qs.close()


def _fill(q: ConsumeQueue, phys: list[int], size: int = 100) -> None:
    """Entries for records of ``size`` bytes at CommitLog ``phys``, from the queue's end."""
    q.put(q.max_offset(), phys, [size] * len(phys), [0] * len(phys))


def test_a_queue_is_opened_once_and_shared_by_threads(queues):
    assert len(queues) == 0 and ("t", 0) not in queues
    got: list[ConsumeQueue] = []
    threads = [threading.Thread(target=lambda: got.append(queues.queue("t", 0))) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len({id(q) for q in got}) == 1
    assert ("t", 0) in queues and len(queues) == 1
    assert queues.queue("t", 0) is got[0]


def test_existing_checks_the_topic_and_the_queue_id(queues):
    assert queues.existing("t", 1) is queues.queue("t", 1)
    with pytest.raises(UnknownTopicError, match="'nope' does not exist"):
        queues.existing("nope", 0)
    for bad in (2, -1):
        with pytest.raises(OffsetOutOfRangeError, match=f"queue {bad} of topic 't'"):
            queues.existing("t", bad)
    assert ("t", 2) not in queues  # nothing opened for a refused queue


def test_may_have_a_queue_on_disk_within_the_counts_or_of_an_unlisted_topic(queues):
    assert queues.may_have("t", 1) and not queues.may_have("t", 2)
    assert not queues.may_have("t", -1)
    assert queues.may_have("unlisted", 99)  # a broker's store: any queue
    os.makedirs(os.path.join(queues.directory, "t", "5"))
    assert queues.on_disk("t", 5) and queues.may_have("t", 5)


def test_holds_messages_counts_entries_at_or_above_the_commit_log_start(queues):
    assert not queues.holds_messages("t", 0, 0)
    assert len(queues) == 0  # no directory: not even opened
    _fill(queues.queue("t", 0), [0, 100, 200])
    assert queues.holds_messages("t", 0, 0)
    assert queues.holds_messages("t", 0, 200)
    assert not queues.holds_messages("t", 0, 300)  # every record expired


def test_truncate_drops_the_entries_past_the_end_in_every_queue(queues):
    _fill(queues.queue("t", 0), [0, 200, 400])
    _fill(queues.queue("t", 1), [100, 300])
    queues.close()
    reopened = ConsumeQueues(queues.root, FILE, queues.topics)  # finds them on disk
    try:
        assert reopened.truncate(300) == 2  # the records at 400 (t/0) and 300 (t/1)
        assert reopened.queue("t", 0).max_offset() == 2
        assert reopened.queue("t", 1).max_offset() == 1
        assert reopened.truncate(10_000) == 0
    finally:
        reopened.close()


def test_delete_below_deletes_whole_files_that_only_point_below(queues):
    q = queues.queue("t", 0)
    _fill(q, [i * 100 for i in range(10)])  # files of 4 entries: [0..300] [400..700] [800, 900]
    assert len(q.files.files) == 3
    assert queues.delete_below(500) == 1  # the second file still points at 500 and above
    assert q.min_offset(500) == 5
    assert queues.delete_below(10_000) == 1  # never the last file
    assert len(q.files.files) == 1


def test_flush_forces_each_dirty_queue_from_its_first_marked_entry(queues, monkeypatch):
    flushed: list[tuple[str, int, int, int]] = []
    for qid in (0, 1):
        q = queues.queue("t", qid)
        _fill(q, [0, 100, 200])
        monkeypatch.setattr(
            q, "flush", lambda a, b, qid=qid: flushed.append(("t", qid, a, b)), raising=False
        )
    queues.mark_dirty(("t", 0), 1)
    queues.mark_dirty(("t", 0), 2)  # the first mark stands
    queues.mark_dirty(("t", 1), 0)
    queues.mark_dirty(("gone", 0), 0)  # a queue this process has not open: skipped
    queues.flush()
    assert sorted(flushed) == [("t", 0, 1, 3), ("t", 1, 0, 3)]
    flushed.clear()
    queues.flush()
    assert flushed == []  # forgotten once flushed


@pytest.fixture
def store(tmp_path):
    with MessageStore.open(tmp_path / "store", **SMALL) as s:
        s.create_topic("orders", queues=4)
        yield s


def test_consume_queue_entry_bytes(store, tmp_path):
    r = store.put(Message("orders", b"abc", tags="TagA", queue_id=1))
    raw = (tmp_path / "store" / "consumequeue" / "orders" / "1" / f"{0:020d}").read_bytes()
    want = (
        r.commitlog_offset.to_bytes(8, "big")
        + r.store_size.to_bytes(4, "big")
        + (2598919).to_bytes(8, "big", signed=True)
    )
    assert raw[:20] == want
    assert raw[20:40] == bytes(20)

"""MessageStore end to end on real files: put, pull, segments, offsets, queries."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketspark.errors import (
    ConfigError,
    InvalidNameError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    PropertiesTooLargeError,
    StoreClosedError,
    UnknownTopicError,
)
from rocketspark.message.java_hash import java_string_hash
from rocketspark.message.record import decode_record
from rocketspark.store import Message, MessageStore, PullStatus, PutStatus
from rocketspark.store.consume_queue import CQ_STORE_UNIT_SIZE
from tests.store.helpers.stores import SMALL


@pytest.fixture
def store(tmp_path):
    with MessageStore.open(tmp_path / "store", **SMALL) as s:
        s.create_topic("orders", queues=4)
        yield s


def test_put_returns_placement_and_pull_reads_it_back(store):
    r = store.put(
        Message("orders", b"body", tags="created", keys=["o-1"], properties={"k": "v"}, queue_id=2)
    )
    assert r.status is PutStatus.PUT_OK
    assert (r.queue_id, r.queue_offset, r.commitlog_offset) == (2, 0, 0)
    assert len(r.msg_id) == 32 and len(r.uniq_key) == 32
    res = store.pull("orders", queue_id=2, offset=0, max_msgs=32)
    assert res.status is PullStatus.FOUND
    (m,) = res.messages
    assert (m.body, m.tags, m.keys, m.properties["k"]) == (b"body", "created", ["o-1"], "v")
    assert m.msg_id == r.msg_id and m.uniq_key == r.uniq_key
    assert (m.queue_id, m.queue_offset, m.commitlog_offset) == (2, 0, 0)
    assert res.next_offset == 1 and (res.min_offset, res.max_offset) == (0, 1)
    assert store.pull("orders", 2, 1).status is PullStatus.NO_NEW_MSG
    assert store.pull("orders", 2, 5).status is PullStatus.OFFSET_ILLEGAL


def test_round_robin_sharding_key_and_explicit_queue(store):
    rs = store.put_batch([Message("orders", b"x") for _ in range(8)])
    assert [r.queue_id for r in rs] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [r.queue_offset for r in rs] == [0, 0, 0, 0, 1, 1, 1, 1]
    a = store.put(Message("orders", b"y", sharding_key="customer-7"))
    b = store.put(Message("orders", b"z", sharding_key="customer-7"))
    assert a.queue_id == b.queue_id == abs(java_string_hash("customer-7")) % 4
    with pytest.raises(OffsetOutOfRangeError, match="queue_id 9"):
        store.put(Message("orders", b"q", queue_id=9))


def test_tag_filter_leaves_gaps(store):
    tags = ["a", "b", "c", "a", "b", "a"]
    store.put_batch([Message("orders", t.encode(), tags=t, queue_id=0) for t in tags])
    res = store.pull("orders", 0, 0, expression="a || c")
    assert [m.body for m in res.messages] == [b"a", b"c", b"a", b"a"]
    assert [m.queue_offset for m in res.messages] == [0, 2, 3, 5]
    assert res.next_offset == 6
    res = store.pull("orders", 0, 0, expression="zzz")
    assert res.status is PullStatus.NO_MATCHED_MSG and res.next_offset == 6


def test_offsets_min_max_timestamp_and_groups(tmp_path, clock):
    with MessageStore.open(tmp_path / "s", clock=clock, **SMALL) as store:
        store.create_topic("t", queues=1)
        for _ in range(5):
            store.put(Message("t", b"x"))
            clock.advance(1000)
        t0 = clock.now - 5000
        assert store.min_offset("t", 0) == 0 and store.max_offset("t", 0) == 5
        assert store.offset_for_timestamp("t", 0, t0) == 0
        assert store.offset_for_timestamp("t", 0, t0 + 2500) == 3
        assert store.offset_for_timestamp("t", 0, t0 + 10_000) == 5
        assert store.committed_offset("g", "t", 0) is None
        assert store.lag("g", "t") == {("t", 0): 5}
        store.commit_offset("g", "t", 0, 3)
        assert store.committed_offset("g", "t", 0) == 3
        assert store.lag("g", "t") == {("t", 0): 2}
        assert store.lag("g") == {("t", 0): 2}


def test_query_by_key_and_uniq_key(store):
    r1 = store.put(Message("orders", b"one", keys=["o-1", "shared"]))
    store.put(Message("orders", b"two", keys="o-2 shared"))
    assert [m.body for m in store.query_by_key("orders", "o-1")] == [b"one"]
    assert sorted(m.body for m in store.query_by_key("orders", "shared")) == [b"one", b"two"]
    assert [m.body for m in store.query_by_key("orders", r1.uniq_key)] == [b"one"]
    assert store.query_by_key("orders", "nope") == []


def test_bad_input_is_rejected_before_writing(store, tmp_path):
    with pytest.raises(UnknownTopicError, match="nope"):
        store.put(Message("nope", b"x"))
    with pytest.raises(InvalidNameError):
        store.create_topic("../escape")
    with pytest.raises(MessageTooLargeError):
        store.put(Message("orders", b"x" * 5000))  # larger than the 4 KiB segment
    with pytest.raises(PropertiesTooLargeError):
        store.put(Message("orders", b"x", properties={"big": "v" * 40000}))
    with pytest.raises(ConfigError):
        Message("orders", b"x", properties={"bad\x01name": "v"})
    with pytest.raises(ConfigError):
        store.pull("orders", 0, 0, max_msgs=0)
    # A batch with one bad message writes nothing at all.
    with pytest.raises(UnknownTopicError):
        store.put_batch([Message("orders", b"ok"), Message("missing", b"x")])
    assert all(store.max_offset("orders", q) == 0 for q in range(4))
    assert not os.path.exists(tmp_path / "store" / "commitlog")


def test_closed_store_raises(tmp_path):
    s = MessageStore.open(tmp_path / "s", **SMALL)
    s.close()
    with pytest.raises(StoreClosedError):
        s.put(Message("t", b"x"))


def test_reopen_after_clean_close_reads_nothing_again(tmp_path):
    with MessageStore.open(tmp_path / "s", **SMALL) as s:
        s.create_topic("t", queues=2)
        s.put_batch([Message("t", str(i).encode()) for i in range(40)])
    assert not os.path.exists(tmp_path / "s" / "abort")
    with MessageStore.open(tmp_path / "s", **SMALL) as s:
        assert s.recovery_report.scanned_from is None
        assert s.max_offset("t", 0) == 20 and s.max_offset("t", 1) == 20
        r = s.put(Message("t", b"next", queue_id=0))
        assert r.queue_offset == 20
        assert os.path.exists(tmp_path / "s" / "abort")


def test_long_poll_wakes_on_put(store):
    out = {}

    def consumer():
        t0 = time.perf_counter()
        out["res"] = store.pull("orders", 3, 0, timeout_ms=5000)
        out["waited"] = time.perf_counter() - t0

    t = threading.Thread(target=consumer)
    t.start()
    time.sleep(0.1)
    store.put(Message("orders", b"wake", queue_id=3))
    t.join()
    assert out["res"].status is PullStatus.FOUND
    assert 0.09 < out["waited"] < 1.0
    t0 = time.perf_counter()
    assert store.pull("orders", 3, 1, timeout_ms=200).status is PullStatus.NO_NEW_MSG
    assert time.perf_counter() - t0 >= 0.19


def test_a_filtered_long_poll_waits_for_a_message_it_matches(tmp_path):
    """As RocketMQ holds a pull until a message of its tags arrives: other tags do not
    end the wait; the pull steps over them, and at the timeout says how far it got.
    The puts come from another process (the shared state, not a same-process notify)."""
    import subprocess
    import sys

    root = str(tmp_path / "s")
    with MessageStore.open(root) as s:
        s.create_topic("t", queues=1)
        writer = (
            "import sys, time\nfrom rocketspark.store import MessageStore, Message\n"
            "with MessageStore.open(sys.argv[1]) as s:\n"
            "    time.sleep(0.3); s.put(Message('t', b'b', tags='B'))\n"
            "    time.sleep(0.5); s.put(Message('t', b'a', tags='A'))\n"
        )
        proc = subprocess.Popen([sys.executable, "-c", writer, root])
        t0 = time.perf_counter()
        res = s.pull("t", 0, 0, expression="A", timeout_ms=10_000)
        waited = time.perf_counter() - t0
        proc.wait(timeout=30)
        assert res.status is PullStatus.FOUND and [m.body for m in res.messages] == [b"a"]
        assert waited > 0.7 and res.next_offset == 2
        t0 = time.perf_counter()
        s.put(Message("t", b"b2", tags="B"))
        res = s.pull("t", 0, 2, expression="A", timeout_ms=300)
        assert time.perf_counter() - t0 >= 0.29
        assert res.status is PullStatus.NO_MATCHED_MSG and res.next_offset == 3


def test_read_batches_matches_pull(store):
    msgs = [
        Message(
            "orders",
            os.urandom(i % 40 + 1),
            tags=["x", "y"][i % 2],
            keys=[f"k{i}"],
            properties={"n": str(i)},
            queue_id=0,
        )
        for i in range(300)
    ]
    store.put_batch(msgs)
    batches, nxt = store.read_batches("orders", 0, 10, 250)
    assert nxt == 250
    table_rows = [row for b in batches for row in b.to_pylist()]
    pulled = []
    off = 10
    while off < 250:
        res = store.pull("orders", 0, off, max_msgs=32)
        pulled += [m for m in res.messages if m.queue_offset < 250]
        off = res.next_offset
    assert len(table_rows) == len(pulled) == 240
    for row, m in zip(table_rows, pulled, strict=True):
        assert row["body"] == m.body and row["msgId"] == m.msg_id
        assert row["queueOffset"] == m.queue_offset and row["tags"] == m.tags
        assert row["keys"] == m.keys and dict(row["properties"]) == {"n": m.properties["n"]}
        assert row["uniqKey"] == m.uniq_key and row["commitLogOffset"] == m.commitlog_offset
        assert row["storeHost"] == str(m.store_host) and row["bornHost"] == str(m.born_host)
        assert int(row["storeTimestamp"].timestamp() * 1000) == m.store_timestamp
    ys, _ = store.read_batches("orders", 0, 0, None, expression="y")
    assert [r["tags"] for b in ys for r in b.to_pylist()] == ["y"] * 150
    with pytest.raises(OffsetOutOfRangeError):
        store.read_batches("orders", 0, 301)


def test_records_decode_as_spec_says(store, tmp_path):
    r = store.put(Message("orders", b"payload", tags="t", queue_id=0))
    raw = (tmp_path / "store" / "commitlog" / f"{0:020d}").read_bytes()
    m = decode_record(raw, r.commitlog_offset)
    assert m.msg_id == r.msg_id and m.store_size == r.store_size


def test_delete_expired_moves_min_offsets_and_keeps_recent_data(tmp_path, clock):
    small = dict(SMALL, mappedFileSizeConsumeQueue=20 * 8)
    with MessageStore.open(tmp_path / "s", clock=clock, **small) as s:
        s.create_topic("orders", queues=1)
        for i in range(60):
            s.put(Message("orders", os.urandom(200), keys=[f"k{i}"]))
        s.flush()
        segs = sorted(os.listdir(tmp_path / "s" / "commitlog"))
        assert len(segs) > 3
        # nothing is old enough yet
        assert s.delete_expired(reserved_hours=1)["commitlog"] == 0
        old = segs[:2]
        for name in old:  # age the first two segments by two hours
            path = tmp_path / "s" / "commitlog" / name
            t = os.stat(path).st_mtime - 7200
            os.utime(path, (t, t))
        done = s.delete_expired(reserved_hours=1)
        assert done["commitlog"] == 2
        assert sorted(os.listdir(tmp_path / "s" / "commitlog")) == segs[2:]
        lo = s.min_offset("orders", 0)
        assert lo > 0
        assert s.pull("orders", 0, lo).messages[0].queue_offset == lo
        with pytest.raises(OffsetOutOfRangeError):
            s.read_batches("orders", 0, 0, None)
        assert done["consumequeue"] >= 1
        # the last messages are still there and new puts continue
        assert s.put(Message("orders", b"new")).queue_offset == 60
    with MessageStore.open(tmp_path / "s", **small) as s:  # reopens cleanly
        assert s.min_offset("orders", 0) == lo and s.max_offset("orders", 0) == 61


def test_a_store_sees_the_end_of_a_queue_another_instance_wrote_far_past(tmp_path):
    """Another process appended 70,000 entries across ConsumeQueue files (as a sink's tasks
    do before the driver commits): max_offset finds the end (by growing numpy scans)."""
    kw = dict(mappedFileSizeConsumeQueue=20 * 3000)
    with MessageStore.open(tmp_path, **kw) as a, MessageStore.open(tmp_path, **kw) as b:
        a.create_topic("t", queues=1)
        assert a.max_offset("t", 0) == 0
        b.put_batch([Message("t", b"x")] * 70_000)
        assert a.max_offset("t", 0) == 70_000
        b.put(Message("t", b"y"))
        assert a.max_offset("t", 0) == 70_001
        r = a.put(Message("t", b"z"))  # and a's own put continues there
        assert r.queue_offset == 70_001
        assert [m.body for m in b.pull("t", 0, 69_999, max_msgs=5).messages] == [b"x", b"y", b"z"]


def test_writers_in_turn_share_index_files_as_they_fill(tmp_path):
    """Two instances put keyed messages in turn with tiny index files: each writes into
    the file the other started (no listing while the last file has room) and every key
    is found from either."""
    kw = dict(maxHashSlotNum=8, maxIndexNum=6)
    with MessageStore.open(tmp_path, **kw) as a, MessageStore.open(tmp_path, **kw) as b:
        a.create_topic("t", queues=1)
        for i in range(40):
            (a if i % 3 else b).put(Message("t", b"x", keys=[f"k{i}"]))
        names = sorted(os.listdir(tmp_path / "index"))
        assert len(names) >= 40 * 2 // 5  # a key and a UNIQ_KEY each: 5 entries a file
        for s in (a, b):
            assert [f.name for f in s.index._files] == names[-len(s.index._files) :]
            for i in range(40):
                assert [m.keys for m in s.query_by_key("t", f"k{i}")] == [[f"k{i}"]]


def test_the_async_flush_thread_never_trips_a_put_that_creates_a_segment(tmp_path):
    # ConsumeQueue files of 10 entries and a 1 ms flush interval: the flusher refreshes
    # the queue's segment list while puts keep creating segments. A refresh that listed
    # the directory just before a new segment used to close or double-map it, and the
    # put raised after its message was stored.
    conf = {
        "mappedFileSizeConsumeQueue": str(10 * CQ_STORE_UNIT_SIZE),
        "flushIntervalCommitLog": "1",
        "flushDiskType": "ASYNC_FLUSH",
    }
    with MessageStore.open(str(tmp_path / "s"), **conf) as s:
        s.create_topic("t", queues=1)
        for i in range(4000):
            s.put(Message("t", b"%d" % i))
        got = []
        while len(got) < 4000:
            res = s.pull("t", 0, len(got), 500)
            assert res.messages, res.status
            got.extend(int(m.body) for m in res.messages)
    assert got == list(range(4000))


def test_a_queue_whose_messages_all_expired_is_empty_not_inverted(tmp_path):
    # Topic a's 5 entries sit in a ConsumeQueue file that is not full, all pointing
    # into the deleted CommitLog segment: min_offset must be its end (5), not the
    # file's capacity (30), or a reader that is caught up meets a data-loss error.
    path = str(tmp_path / "s")
    with MessageStore.open(
        path,
        mappedFileSizeCommitLog="65536",
        mappedFileSizeConsumeQueue=str(30 * CQ_STORE_UNIT_SIZE),
    ) as s:
        s.create_topic("a", queues=1)
        s.create_topic("b", queues=1)
        s.put_batch([Message("a", b"x" * 100) for _ in range(5)])
        s.put_batch([Message("b", b"y" * 1000) for _ in range(200)])  # rolls the CommitLog
        s.flush()
        first = os.path.join(path, "commitlog", sorted(os.listdir(f"{path}/commitlog"))[0])
        old = time.time() - 7 * 24 * 3600
        os.utime(first, (old, old))
        assert s.delete_expired(reserved_hours=1)["commitlog"] == 1
        assert (s.min_offset("a", 0), s.max_offset("a", 0)) == (5, 5)
        assert s.read_batches("a", 0, 5) == ([], 5)
        s.put(Message("a", b"z"))
        assert [m.body for m in s.pull("a", 0, 5, 10).messages] == [b"z"]


def test_a_store_deleted_and_made_again_while_open_is_another_store(tmp_path):
    """The old instance says it was replaced; a new one at the path takes its own lock
    (it is the first opener of the new store, so it recovers it) and both close."""

    root = str(tmp_path / "s")
    old = MessageStore.open(root)
    old.create_topic("t", queues=1)
    old.put(Message("t", b"gone"))
    assert not old.replaced()
    shutil.rmtree(root)
    assert old.replaced()
    new = MessageStore.open(root)
    assert new._opened.lock.first and not new.replaced() and old.replaced()
    new.create_topic("t", queues=1)
    new.put(Message("t", b"kept"))
    assert os.path.exists(os.path.join(root, "abort"))  # the new store is open
    old.close()  # the old one's clean shutdown must leave the new one's marker alone
    assert os.path.exists(os.path.join(root, "abort"))
    assert [m.body for m in new.pull("t", 0, 0).messages] == [b"kept"]
    new.close()
    assert not new.replaced()  # closed: nothing to say
    with MessageStore.open(root) as again:
        assert [m.body for m in again.pull("t", 0, 0).messages] == [b"kept"]


@pytest.mark.parametrize("name", ["TAGS", "KEYS", "DELAY"])
def test_properties_that_message_fields_set_are_refused_before_a_write(tmp_path, name):
    """A TAGS user property would be read as the tag while the ConsumeQueue entry
    filters by another; KEYS would never reach the index; DELAY would not delay.
    Refused on every put path (RocketMQ's putUserProperty refuses them too)."""
    with MessageStore.open(str(tmp_path / "s")) as s:
        s.create_topic("t", queues=1)
        props = {"user": "1", name: "x"}
        attempts = [
            lambda: s.put(Message("t", b"a", properties=props)),
            lambda: s.put_columns([b"a"] * 100, topic="t", properties=[props] * 100),
            lambda: s.put_columns(
                [b"a"] * 3, topic="t", properties=[None, None, list(props.items())]
            ),
            lambda: s.prepare_columns(
                [b"a"] * 3, topic="t", producer_group="g", properties=[props] * 3
            ),
        ]
        attempts += [  # and properties every half of a prepare gets
            lambda: s.prepare_columns(
                [b"a"] * 3, topic="t", producer_group="g", extra_properties={name: "x"}
            ),
            lambda: s.prepare_batch([Message("t", b"a")], properties={name: "x"}),
        ]
        for attempt in attempts:
            with pytest.raises(ConfigError, match=f"'{name}' is set from the message's tags"):
                attempt()
        assert s.open_transactions() == []
        assert s.max_offset("t", 0) == 0
        # Names that only contain a reserved one are user properties like any other.
        s.put_columns([b"a"] * 2, topic="t", properties=[{f"X{name}": "1", "v": name}] * 2)
        assert s.pull("t", 0, 0).messages[0].properties[f"X{name}"] == "1"


def _age_first_segments(root, k: int) -> None:
    segs = sorted(os.listdir(os.path.join(root, "commitlog")))
    assert len(segs) > k
    for name in segs[:k]:
        path = os.path.join(root, "commitlog", name)
        t = os.stat(path).st_mtime - 7200
        os.utime(path, (t, t))


def test_keys_and_ids_pointing_into_deleted_segments_are_skipped(tmp_path, clock):
    """Index files outlive some of the segments they point into: a key query returns the
    messages still stored (RocketMQ's queryMessage skips the rest), and get_message of
    a deleted offset is an OffsetOutOfRangeError, not a corrupt record."""
    root = str(tmp_path / "s")
    with MessageStore.open(root, clock=clock, mappedFileSizeCommitLog=1 << 20) as s:
        s.create_topic("orders", queues=1)
        put = [s.put(Message("orders", os.urandom(30_000), keys=["same"])) for _ in range(80)]
        s.flush()
        _age_first_segments(root, 2)
        assert s.delete_expired(reserved_hours=1)["commitlog"] == 2
        lo = s.min_offset("orders", 0)
        assert 0 < lo < 80
        got = s.query_by_key("orders", "same", max_num=100)
        assert sorted(m.queue_offset for m in got) == list(range(lo, 80))
        with pytest.raises(OffsetOutOfRangeError, match="was deleted"):
            s.get_message(put[0].commitlog_offset)
        assert s.get_message(put[-1].commitlog_offset).queue_offset == 79


def test_a_clean_cut_short_after_the_segments_went_is_finished_by_the_next(
    tmp_path, clock, monkeypatch
):
    """delete_expired died between deleting CommitLog segments and trimming the queues:
    whole ConsumeQueue files point below the CommitLog. The queue's min offset skips
    them, reads work, and the next clean (with no segment to delete) trims them."""
    from rocketspark.store.consume_queue import ConsumeQueue

    root = str(tmp_path / "s")
    small = dict(mappedFileSizeCommitLog=1 << 20, mappedFileSizeConsumeQueue=20 * 10)
    with MessageStore.open(root, clock=clock, **small) as s:
        s.create_topic("orders", queues=1)
        for i in range(200):
            s.put(Message("orders", b"%d" % i + bytes(20_000)))
        s.flush()
        _age_first_segments(root, 3)

        def killed(self, commitlog_min):
            raise KeyboardInterrupt("killed between the CommitLog and the queues")

        with monkeypatch.context() as m:
            m.setattr(ConsumeQueue, "delete_below", killed)
            with pytest.raises(KeyboardInterrupt):
                s.delete_expired(reserved_hours=1)
        lo = s.min_offset("orders", 0)
        first = s.pull("orders", 0, lo).messages[0]
        assert first.queue_offset == lo and first.commitlog_offset >= s.commit_log.min_offset
        below = s.pull("orders", 0, lo - 1)  # points into a deleted segment: too small
        assert not below.messages and below.next_offset == lo
        assert s.read_batches("orders", 0, lo, None)[1] == 200
        done = s.delete_expired(reserved_hours=1)
        assert done["commitlog"] == 0 and done["consumequeue"] >= 1
        assert s.min_offset("orders", 0) == lo
    with MessageStore.open(root, **small) as s:
        assert s.min_offset("orders", 0) == lo
        assert s.pull("orders", 0, lo).messages[0].body.startswith(b"%d" % lo)


def test_commit_offsets_checks_what_commit_offset_checks_and_lag_outlives_a_topic(tmp_path):
    """Many queues in one write are checked as one queue is; a group's offsets of a
    topic that is gone (a consumerOffset.json outlives topics) leave lag working."""
    from tests.store.helpers.admin import delete_topic_as_admin

    with MessageStore.open(str(tmp_path / "s")) as s:
        s.create_topic("t", queues=1)
        s.create_topic("gone", queues=1)
        s.put(Message("t", b"x"))
        for bad, message in [
            ({("t", 0): -3}, "must be >= 0"),
            ({("t", 7): 1}, "queue 7 of topic 't' does not exist"),
            ({("t", 0): 1, ("ghost", 0): 5}, "ghost"),
        ]:
            with pytest.raises((OffsetOutOfRangeError, UnknownTopicError), match=message):
                s.commit_offsets("g", bad)
        assert s.committed_offset("g", "t", 0) is None  # nothing of a refused write
        with pytest.raises(InvalidNameError):
            s.commit_offsets("bad group!", {("t", 0): 1})
        s.commit_offsets("g", {("t", 0): 0, ("gone", 0): 0})
        delete_topic_as_admin(s, "gone")
        assert s.lag("g") == {("t", 0): 1}


# --- segments made whole, the store path, topics that shrink ------------------------


def test_the_store_path_is_given_once(tmp_path):
    with pytest.raises(ConfigError, match="given twice"):
        MessageStore.open(tmp_path / "a", storePathRootDir=str(tmp_path / "b"))
    with pytest.raises(ConfigError, match="given twice"):
        MessageStore.open(tmp_path / "a", store_path_root_dir=str(tmp_path / "b"))
    assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")


@settings(max_examples=30, deadline=None)
@given(
    old=st.integers(1, 6),
    new=st.integers(1, 6),
    holding=st.sets(st.integers(0, 5)),
    force=st.booleans(),
)
def test_a_topic_shrinks_only_where_the_dropped_queues_hold_nothing(old, new, holding, force):
    from rocketspark.errors import TopicShrinkError

    holding = {q for q in holding if q < old}
    with tempfile.TemporaryDirectory() as tmp, MessageStore.open(tmp, **SMALL) as s:
        s.create_topic("orders", queues=old)
        for q in sorted(holding):
            s.put(Message("orders", b"x", queue_id=q))
        lost = sorted(q for q in holding if q >= new)
        if lost and not force:
            with pytest.raises(TopicShrinkError) as info:
                s.create_topic("orders", queues=new)
            text = str(info.value)
            assert "'orders'" in text and f"has {old} queues" in text and f"{new} would" in text
            assert f"queue(s) {', '.join(map(str, lost))}," in text
            assert s.topic("orders").write_queue_nums == old
        else:
            assert s.create_topic("orders", queues=new, force=force).write_queue_nums == new


def test_deferred_offset_commits_are_written_by_close(tmp_path):
    path = str(tmp_path / "deferred")
    with MessageStore.open(path) as store:
        store.create_topic("t", queues=1)
        store.put(Message("t", b"x"))
        store.commit_offset("g", "t", 0, 1, deferred=True)
        assert store.committed_offset("g", "t", 0) == 1
        assert store.lag("g", "t") == {("t", 0): 0}
        with MessageStore.open(path) as other:  # another instance reads the file
            assert other.committed_offset("g", "t", 0) is None
    with MessageStore.open(path) as store:
        assert store.committed_offset("g", "t", 0) == 1


def test_the_min_offset_moves_when_another_instance_cleaned(tmp_path):
    """A store sees the ConsumeQueue files and segments another instance (process)
    deleted: its queue's min offset moves, and reads start there."""
    small = dict(SMALL, mappedFileSizeConsumeQueue=20 * 8)
    with MessageStore.open(tmp_path, **small) as a, MessageStore.open(tmp_path, **small) as b:
        a.create_topic("orders", queues=1)
        for _ in range(60):
            a.put(Message("orders", os.urandom(200)))
        a.flush()
        assert a.min_offset("orders", 0) == 0
        assert a.read_raw("orders", 0, 0, 4, 1 << 20).count == 4
        segs = sorted(os.listdir(tmp_path / "commitlog"))
        for name in segs[:2]:
            path = tmp_path / "commitlog" / name
            t = os.stat(path).st_mtime - 7200
            os.utime(path, (t, t))
        done = b.delete_expired(reserved_hours=1)
        assert done["commitlog"] == 2 and done["consumequeue"] >= 1
        lo = b.min_offset("orders", 0)
        assert lo > 0 and a.min_offset("orders", 0) == lo
        moved = a.read_raw("orders", 0, 0, 4, 1 << 20)
        assert (moved.status, moved.next_offset, moved.min_offset) == (
            PullStatus.OFFSET_ILLEGAL,
            lo,
            lo,
        )
        assert a.read_raw("orders", 0, lo, 4, 1 << 20).count == 4


def test_prefilling_between_puts_never_zeroes_data_another_writer_put(tmp_path):
    """A writer that prefills between its puts (a server after answering one) and
    another that puts past where the first prefilled, in turn, over small segments:
    every message reads back from both, and the first's puts find their pages warm."""
    kw = dict(mappedFileSizeCommitLog=str(256 * 1024))
    with MessageStore.open(tmp_path, **kw) as a, MessageStore.open(tmp_path, **kw) as b:
        a.warm_between_puts()
        a.create_topic("t", queues=2)
        sent: list[bytes] = []
        for i in range(120):
            writer = a if i % 3 else b
            bodies = [b"%d-%d-" % (i, j) + b"x" * (i * 37 % 900) for j in range(1 + i % 40)]
            writer.put_batch([Message("t", body) for body in bodies])
            sent.extend(bodies)
            a.warm_ahead()
            a.warm_ahead()  # again: nothing past what is warm yet
        for s in (a, b):
            got = []
            for q in (0, 1):
                offset = 0
                while offset < s.max_offset("t", q):
                    res = s.pull("t", q, offset, 500)
                    assert res.messages, res.status
                    got.extend(m.body for m in res.messages)
                    offset = res.next_offset
            assert sorted(got) == sorted(sent)


def test_prefilling_between_puts_stops_asking_at_the_end_of_the_segment(tmp_path):
    """Once the prefill reached what it may fill of the current segment (its end, or
    its reserved blocks), warm_ahead has nothing to do and takes no lock: until a put
    moves that limit (a reservation, the next segment)."""
    with MessageStore.open(tmp_path, mappedFileSizeCommitLog=str(1 << 20)) as s:
        s.warm_between_puts()
        s.create_topic("t", queues=1)
        s.put(Message("t", b"x" * 1000))
        log = s.appender.commit_log
        end = s.appender.known_commit_pos
        for _ in range(64):
            s.warm_ahead()
        assert not log.needs_warming(end)
        segment = log.files.get_or_create(end - 1)
        assert log._warm_end == min(segment.end_offset, segment.start_offset + segment.reserved)
        s.put_batch([Message("t", b"y" * 1000)] * 2000)  # into the next segments
        assert log.needs_warming(s.appender.known_commit_pos)

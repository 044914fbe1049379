"""A store directory moves between rocketspark and a real Apache RocketMQ broker, both ways.

A real NameServer and broker (RocketMQ 5.3.1, ``tests/helpers/rocketmq.py``)
run on loopback on the very directory rocketspark opens, and RocketMQ's Java client
produces and consumes through the broker:

- rocketspark writes, the broker serves it, the broker appends, rocketspark opens again
  and appends: nothing is lost or overwritten on either side;
- the broker is SIGKILLed while producers send: every acknowledged message (and every
  record the CommitLog holds) is readable in rocketspark at the broker's queue offsets,
  rocketspark's next write follows the broker's last record, and a broker restarted on
  the directory reads it all.

The CommitLog is the truth: an independent walk of its records (``commitlog_records``)
decides what the store holds. Each broker start costs 10-70 s here, so the checks are
grouped into few scenarios. Marked ``broker``: ``-m "not broker"`` deselects them.
Needs java, javac and the jars ``./dev setup`` fetches; under CI their absence fails.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from pathlib import Path

import pytest

from rocketspark.errors import RocketSparkError
from rocketspark.store import Message, MessageStore
from tests.helpers.rocketmq import (
    RocketMQ,
    body,
    offset_msg_id_phy,
    parse_lines,
)

CL_SIZE = 1024 * 1024
CQ_SIZE = 20 * 1000  # 1000 ConsumeQueue entries per file
SIZES = {"mappedFileSizeCommitLog": CL_SIZE, "mappedFileSizeConsumeQueue": CQ_SIZE}

MAGIC_V1, MAGIC_V2, BLANK_MAGIC = 0xDAA320A7, 0xDAA320AB, 0xCBD43194


def commitlog_records(store: str | os.PathLike[str]) -> tuple[dict[int, tuple], int]:
    """Walk the CommitLog as RocketMQ lays it out; ``{phy: (topic, queue, queue offset,
    size)}`` of every record, and the offset where the next record goes.

    Independent of rocketspark's reader: a record counts when its size, magic code and
    the physical offset it stores itself agree with where it lies; a BLANK record ends
    a segment; the first all-zero (or otherwise invalid) header ends the log.
    """
    d = Path(store) / "commitlog"
    files = sorted(f for f in os.listdir(d) if f.isdigit())
    records: dict[int, tuple] = {}
    end = int(files[0]) if files else 0
    for name in files:
        base = int(name)
        if base != end:
            break
        data = (d / name).read_bytes()
        pos = 0
        while pos + 8 <= len(data):
            size, magic = struct.unpack_from(">iI", data, pos)
            if magic == BLANK_MAGIC:
                pos = len(data)
                break
            if size <= 0 or magic not in (MAGIC_V1, MAGIC_V2) or pos + size > len(data):
                return records, base + pos
            (queue,) = struct.unpack_from(">i", data, pos + 12)
            queue_offset, phy, sys_flag = struct.unpack_from(">qqi", data, pos + 20)
            if phy != base + pos:
                return records, base + pos
            hosts = (8 if sys_flag & 0x10 == 0 else 20) + (8 if sys_flag & 0x20 == 0 else 20)
            at = pos + 48 + hosts + 8 + 4 + 8  # born time, hosts, store time, reconsume, prepared
            (body_len,) = struct.unpack_from(">i", data, at)
            at += 4 + body_len
            if magic == MAGIC_V1:
                topic_len = data[at]
                at += 1
            else:
                (topic_len,) = struct.unpack_from(">H", data, at)
                at += 2
            records[phy] = (data[at : at + topic_len].decode(), queue, queue_offset, size)
            pos += size
        end = base + pos
        if pos != len(data):
            break
    return records, end


def read_all(s: MessageStore, topic: str) -> dict[tuple[int, int], object]:
    """Every message of ``topic`` by (queue, offset), pulled; checked against read_batches."""
    got = {}
    for q in range(s.topic(topic).read_queue_nums):
        lo, hi = s.min_offset(topic, q), s.max_offset(topic, q)
        if hi == lo:
            continue
        msgs = s.pull(topic, q, lo, max_msgs=1_000_000).messages
        assert [m.queue_offset for m in msgs] == list(range(lo, hi)), (topic, q)
        batches, nxt = s.read_batches(topic, q, lo)
        assert nxt == hi
        phys = [p for b in batches for p in b.column("commitLogOffset").to_pylist()]
        assert phys == [m.commitlog_offset for m in msgs], (topic, q)
        for m in msgs:
            got[(q, m.queue_offset)] = m
    return got


def assert_follows(end: int, put) -> None:
    """``put`` lands right after the log's last record at ``end`` (or, when it did not
    fit there, at the next segment's start): no zeros in front of it."""
    assert put.commitlog_offset == end or (
        put.commitlog_offset % CL_SIZE == 0 and put.commitlog_offset - end < put.store_size + 8
    ), (end, put)


def assert_log_is_visible(s: MessageStore, path: str) -> tuple[dict[int, tuple], int]:
    """Every record the CommitLog holds is where its ConsumeQueue entry says, and back."""
    records, end = commitlog_records(path)
    topics = {t for t, _, _, _ in records.values()}
    seen = {}
    for topic in topics:
        for (q, off), m in read_all(s, topic).items():
            seen[m.commitlog_offset] = (topic, q, off, m.store_size)
    assert seen == records
    return records, end


def consumed(rows: list[dict]) -> dict[tuple[int, int], dict]:
    out = {}
    for r in rows:
        assert (r["queue"], r["offset"]) not in out, f"delivered twice: {r}"
        out[(r["queue"], r["offset"])] = r
    return out


@pytest.fixture(scope="module")
def rocketmq(rocketmq_java, tmp_path_factory):
    """One NameServer for the module; brokers are started per scenario.

    Not the NameServer of the run's ``rocketmq_cluster``: routes are per NameServer, so
    a topic these tests use ("orders") that a cluster test also created would route this
    module's clients to broker-a and broker-b of the cluster too, and a topic a producer
    creates on first send (the TBW102 template) would land on any broker registered. A
    NameServer of its own keeps the store's broker alone; it costs one NameServer start
    (a few seconds) in runs that use both.
    """
    cluster = RocketMQ(tmp_path_factory.mktemp("rocketmq"), rocketmq_java)
    yield cluster
    cluster.close()


def _rs_message(i: int) -> Message:
    return Message(
        "orders",
        body(f"rs-{i}", 1000 + i * 37 % 6000),
        tags=["created", "paid", None][i % 3],
        keys=[f"rs-{i}", f"cust-{i % 7}"],
    )


@pytest.mark.broker
def test_rocketspark_then_broker_then_rocketspark(rocketmq, tmp_path):
    path = str(tmp_path / "store")
    # 1. rocketspark writes a store: plain, keyed and tagged messages, a delayed one, offsets
    with MessageStore.open(path, **SIZES) as s:
        s.create_topic("orders", queues=4)
        msgs = [_rs_message(i) for i in range(300)]
        results = list(s.put_batch(msgs[:280])) + [s.put(m) for m in msgs[280:]]
        s.put(
            Message(
                "orders",
                b"delayed by rocketspark",
                tags="later",
                keys=["rs-delayed"],
                delay_level=1,
            )
        )
        s.commit_offsets("rs-group", {("orders", q): 5 + q for q in range(4)})
    ours = {
        (r.queue_id, r.queue_offset): (m, r.commitlog_offset)
        for m, r in zip(msgs, results, strict=True)
    }
    assert len(os.listdir(os.path.join(path, "commitlog"))) >= 2  # crosses a segment

    # 2. the broker serves it: consumer offsets, the IndexFile, every message, the delayed one
    broker = rocketmq.start_broker(
        path, commitlog_size=CL_SIZE, consumequeue_size=CQ_SIZE, topics=["orders"]
    )
    try:
        committed = {
            r["queue"]: r["committed"] for r in rocketmq.client("committed", "orders", "rs-group")
        }
        assert committed == {q: 5 + q for q in range(4)}
        found = {r["key"]: r["phys"] for r in rocketmq.client("query", "orders", "rs-17", "cust-3")}
        assert found == {
            "rs-17": [ours_phy for (m, ours_phy) in ours.values() if "rs-17" in m.keys],
            "cust-3": sorted(p for (m, p) in ours.values() if "cust-3" in m.keys),
        }
        read = consumed(rocketmq.client("consume", "orders", "reader-1", len(ours) + 1))
        delayed = [r for r in read.values() if r["key"] == "rs-delayed"]
        assert [bytes.fromhex(r["body"]) for r in delayed] == [b"delayed by rocketspark"]
        assert len(read) == len(ours) + 1
        for at, (m, phy) in ours.items():
            r = read[at]
            assert (r["key"], r.get("tags"), bytes.fromhex(r["body"]), r["phy"]) == (
                " ".join(m.keys),
                m.tags,
                m.body,
                phy,
            ), at
        # 3. the broker appends
        sent = rocketmq.client("send", "orders", 200, "bk", 3000, 4)
    finally:
        assert broker.terminate() in (0, 143)
    assert [r.get("status") for r in sent] == ["SEND_OK"] * 200, sent[-3:]
    theirs = {(r["queue"], r["offset"]): r for r in sent}

    # 4. rocketspark opens the broker's directory again: all of it, and appends after it
    with MessageStore.open(path, **SIZES) as s:
        records, end = assert_log_is_visible(s, path)
        got = read_all(s, "orders")
        for at, (m, phy) in ours.items():
            assert (got[at].body, got[at].keys, got[at].tags, got[at].commitlog_offset) == (
                m.body,
                list(m.keys),
                m.tags,
                phy,
            ), at
        for at, r in theirs.items():
            assert (got[at].body, got[at].keys, got[at].commitlog_offset) == (
                body(r["key"], 3000),
                [r["key"]],
                offset_msg_id_phy(r["offsetMsgId"]),
            ), at
        assert [m.body for m in got.values() if m.keys == ["rs-delayed"]] == [
            b"delayed by rocketspark"
        ]
        assert len(got) == len(ours) + 1 + len(theirs)
        assert {q: s.committed_offset("rs-group", "orders", q) for q in range(4)} == committed
        assert [m.commitlog_offset for m in s.query_by_key("orders", "bk-17")] == [
            offset_msg_id_phy(r["offsetMsgId"]) for r in sent if r["key"] == "bk-17"
        ]
        more = [Message("orders", body(f"rs2-{i}", 2000), keys=[f"rs2-{i}"]) for i in range(50)]
        placed = list(s.put_batch(more))
        assert_follows(end, placed[0])
    # every record, the broker's and both rocketspark runs', intact after a reopen
    with MessageStore.open(path, **SIZES) as s:
        after, _ = assert_log_is_visible(s, path)
        assert {p: r for p, r in after.items() if p in records} == records
        got = read_all(s, "orders")
        assert len(got) == len(ours) + 1 + len(theirs) + len(more)
        for m, r in zip(more, placed, strict=True):
            assert got[(r.queue_id, r.queue_offset)].body == m.body
        for at, r in theirs.items():
            assert got[at].body == body(r["key"], 3000), at


@pytest.mark.broker
def test_broker_killed_then_rocketspark_then_broker(rocketmq, tmp_path):
    path = str(tmp_path / "store")
    size, n = 1500, 8000
    broker = rocketmq.start_broker(
        path, commitlog_size=CL_SIZE, consumequeue_size=CQ_SIZE, topics=[]
    )
    first = rocketmq.client("send", "crash", 1000, "early", size, 4)
    assert [r.get("status") for r in first] == ["SEND_OK"] * 1000, first[-3:]
    # A broker that has run a while has checkpointed its CommitLog and ConsumeQueue flush
    # times (a fresh one's are 0, which sends a reader back to the first segment); wait
    # for that (about 10 s after the first flush), as the crash of a long-running broker.
    deadline = time.monotonic() + 90
    while 0 in struct.unpack(">qq", (Path(path) / "checkpoint").read_bytes()[:16]):
        assert time.monotonic() < deadline, "the broker never wrote its checkpoint"
        time.sleep(0.5)
    # Four threads send synchronously; the broker is SIGKILLed mid-stream, so records it
    # stored but had not yet dispatched (or acknowledged) are likely at the end, and its
    # next, preallocated segment lies all-zero behind them.
    sender = rocketmq.client_process("send", "crash", n, "ck", size, 4)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(sender.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 240
    while sum('"SEND_OK"' in x for x in list(lines)) < 1000 and time.monotonic() < deadline:
        if sender.poll() is not None:
            break
        time.sleep(0.05)
    broker.kill()
    sender.wait(120)
    reader.join(30)
    acked = [r for r in parse_lines("".join(lines)) if r.get("status") == "SEND_OK"]
    assert len(acked) >= 1000, (len(acked), sender.stderr.read()[-3000:])
    assert len(acked) < n, "the broker was killed only after all sends"
    acked += first

    with MessageStore.open(path, **SIZES) as s:
        got = read_all(s, "crash")
        for r in acked:
            m = got.get((r["queue"], r["offset"]))
            assert m is not None, f"acknowledged send lost: {r}"
            assert (m.keys, m.body, m.commitlog_offset) == (
                [r["key"]],
                body(r["key"], size),
                offset_msg_id_phy(r["offsetMsgId"]),
            ), r
        records, end = assert_log_is_visible(s, path)
        maxes = {q: s.max_offset("crash", q) for q in range(s.topic("crash").read_queue_nums)}
        more = [Message("crash", body(f"rs-{i}", 700), keys=[f"rs-{i}"]) for i in range(40)]
        placed = list(s.put_batch(more))
        # right after the broker's last record: no zeros in front of rocketspark's writes
        assert_follows(end, placed[0])
        for q, hi in maxes.items():
            assert sorted(r.queue_offset for r in placed if r.queue_id == q) == list(
                range(hi, hi + sum(r.queue_id == q for r in placed))
            )
    stored = len(got)

    # the broker, restarted on the directory, reads all of it (rocketspark's writes too)
    broker = rocketmq.start_broker(
        path, commitlog_size=CL_SIZE, consumequeue_size=CQ_SIZE, topics=["crash"]
    )
    try:
        read = consumed(rocketmq.client("consume", "crash", "reader-2", stored + len(more)))
    finally:
        assert broker.terminate() in (0, 143)
    assert len(read) == stored + len(more)
    for (q, off), m in got.items():
        r = read[(q, off)]
        assert (r["key"], bytes.fromhex(r["body"]), r["phy"]) == (
            m.keys[0],
            m.body,
            m.commitlog_offset,
        ), (q, off)
    for m, p in zip(more, placed, strict=True):
        r = read[(p.queue_id, p.queue_offset)]
        assert (r["key"], bytes.fromhex(r["body"]), r["phy"]) == (
            m.keys[0],
            m.body,
            p.commitlog_offset,
        )
    assert len(records) == stored


def test_empty_bodies_are_refused_before_anything_is_written(tmp_path):
    # RocketMQ's producer refuses a 0-byte body; a record the broker's clients cannot
    # have sent must not enter the store through rocketspark either.
    with MessageStore.open(str(tmp_path / "store"), **SIZES) as s:
        s.create_topic("orders", queues=1)
        s.put(Message("orders", b"first"))
        with pytest.raises(RocketSparkError):
            s.put(Message("orders", b""))
        with pytest.raises(RocketSparkError):
            s.put_batch([Message("orders", b"fine"), Message("orders", b"", keys=["k"])])
        assert s.max_offset("orders", 0) == 1
        assert [m.body for m in s.pull("orders", 0, 0).messages] == [b"first"]

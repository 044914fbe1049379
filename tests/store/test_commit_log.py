"""The CommitLog on its own: append, read, scan, segment roll, wipe."""

from __future__ import annotations

import os

import pytest

from rocketspark.errors import CorruptRecordError, MessageTooLargeError
from rocketspark.message.model import Message
from rocketspark.message.record import (
    BLANK_MAGIC_CODE,
    RECORD_END,
    HostAddress,
    decode_record,
)
from rocketspark.store import MessageStore, PullStatus
from rocketspark.store.commit_log import CommitLog
from rocketspark.store.config import MessageStoreConfig
from rocketspark.store.consume_queue import CQ_STORE_UNIT_SIZE
from rocketspark.store.encoder import Encoder
from rocketspark.store.topic_config import TopicConfigTable
from tests.store.helpers.stores import SMALL

NOW = 1_700_000_000_000
SEGMENT = 4096
HOST = HostAddress.parse("127.0.0.1", 10911)


@pytest.fixture
def store(tmp_path):
    with MessageStore.open(tmp_path / "store", **SMALL) as s:
        s.create_topic("orders", queues=4)
        yield s


@pytest.fixture
def log(tmp_path):
    log = CommitLog(str(tmp_path), SEGMENT, HOST)
    yield log
    log.close()


@pytest.fixture
def encoder(tmp_path):
    topics = TopicConfigTable(str(tmp_path / "config"))
    topics.create("t", 2, 2, perm=6, order=False)
    return Encoder(
        root=str(tmp_path),
        config=MessageStoreConfig(),
        topics=topics,
        store_host=HOST,
        born_host=HostAddress(HOST.ip, 4321),
        segment_size=SEGMENT,
    )


def _records(encoder, bodies, queue_id=0):
    return [
        encoder.message(Message("t", b, queue_id=queue_id, keys=["k"]), NOW, f"U{i:030d}")
        for i, b in enumerate(bodies)
    ]


def _append(log, start, records):
    """Append as the appender does, numbering queue offsets from 0; return placements, end."""
    next_offsets: dict[tuple[str, int], int] = {}
    pending = []

    def reserve(topic, queue_id, count):
        first = next_offsets.get((topic, queue_id), 0)
        next_offsets[topic, queue_id] = first + count
        return first

    placed, end = log.append(start, records, NOW + 5, reserve, pending.append)
    assert pending == [end]  # told the region's end before writing it
    return placed, end


def test_appended_records_read_back_with_their_placement(log, encoder):
    bodies = [b"a", b"bb" * 10, bytes(range(200))]
    placed, end = _append(log, 0, _records(encoder, bodies))
    assert [p.queue_offset for p in placed] == [0, 1, 2]
    assert placed[0].physical_offset == 0
    for a, b in zip(placed, placed[1:], strict=False):
        assert b.physical_offset == a.physical_offset + a.size
    assert end == placed[-1].physical_offset + placed[-1].size
    for p, body in zip(placed, bodies, strict=True):
        m = log.read(p.physical_offset, verify_crc=True)
        assert m.body == body and m.topic == "t" and m.queue_id == 0
        assert m.commitlog_offset == p.physical_offset and m.store_size == p.size
        assert m.queue_offset == p.queue_offset and m.store_timestamp == NOW + 5
        assert m.store_host == HOST and m.keys == ["k"]
        assert log.store_timestamp(p.physical_offset) == NOW + 5
    raw = (open(os.path.join(log.directory, f"{0:020d}"), "rb")).read()
    assert decode_record(raw, placed[1].physical_offset).body == bodies[1]


def test_scan_yields_each_record_then_the_end_of_the_data(log, encoder):
    placed, end = _append(log, 0, _records(encoder, [b"x" * 50] * 4))
    checks = list(log.scan(0))
    assert [off for off, _ in checks[:-1]] == [p.physical_offset for p in placed]
    assert [c.size for _, c in checks[:-1]] == [p.size for p in placed]
    assert checks[-1][0] == end and checks[-1][1].size == RECORD_END
    assert log.survey(0) == (0, 4, end)
    assert log.next_valid(0) == 0


def test_a_record_that_does_not_fit_rolls_the_segment_behind_a_blank_filler(log, encoder):
    placed, end = _append(log, 0, _records(encoder, [bytes(1000)] * 6))
    second = [p for p in placed if p.physical_offset >= SEGMENT]
    assert second and second[0].physical_offset == SEGMENT
    last = max((p for p in placed if p.physical_offset < SEGMENT), key=lambda p: p.physical_offset)
    filler_at = last.physical_offset + last.size
    raw = open(os.path.join(log.directory, f"{0:020d}"), "rb").read()
    assert int.from_bytes(raw[filler_at : filler_at + 4], "big") == SEGMENT - filler_at
    assert int.from_bytes(raw[filler_at + 4 : filler_at + 8], "big", signed=True) == (
        BLANK_MAGIC_CODE
    )
    assert sorted(os.listdir(log.directory)) == [f"{0:020d}", f"{SEGMENT:020d}"]
    # a scan follows the filler into the next segment
    assert [off for off, c in log.scan(0) if c.size > 0] == [p.physical_offset for p in placed]
    assert log.min_offset == 0 and log.segment(SEGMENT).start_offset == SEGMENT


def test_a_record_larger_than_a_segment_is_refused_before_any_byte(log, encoder):
    with pytest.raises(MessageTooLargeError, match="mappedFileSizeCommitLog"):
        _append(log, 0, _records(encoder, [b"small", bytes(SEGMENT)]))
    assert list(log.scan(0)) == [] or next(iter(log.scan(0)))[1].size == RECORD_END
    assert log.max_record_size() < SEGMENT


def test_wipe_zeroes_a_dead_writers_region_and_reads_past_the_log_fail(log, encoder):
    placed, end = _append(log, 0, _records(encoder, [b"keep", b"torn"]))
    log.wipe(placed[1].physical_offset, end)
    checks = list(log.scan(0))
    assert [off for off, c in checks if c.size > 0] == [0]
    assert checks[-1] == (placed[1].physical_offset, checks[-1][1])
    assert checks[-1][1].size == RECORD_END
    assert log.read(0).body == b"keep"
    with pytest.raises(CorruptRecordError):
        log.read(10 * SEGMENT)


def test_segments_roll_with_blank_filler_and_reads_cross_them(store, tmp_path):
    bodies = [os.urandom(150 + i) for i in range(100)]
    rs = store.put_batch([Message("orders", b, queue_id=0) for b in bodies[:50]])
    rs += [store.put(Message("orders", b, queue_id=0)) for b in bodies[50:]]
    files = sorted(os.listdir(tmp_path / "store" / "commitlog"))
    assert len(files) > 3
    assert files[1] == "00000000000000004096"
    # Each segment that is followed by another ends with the blank filler.
    raw = (tmp_path / "store" / "commitlog" / files[0]).read_bytes()
    last = max((r for r in rs if r.commitlog_offset < 4096), key=lambda r: r.commitlog_offset)
    end = last.commitlog_offset + last.store_size
    assert int.from_bytes(raw[end + 4 : end + 8], "big", signed=True) == BLANK_MAGIC_CODE
    assert int.from_bytes(raw[end : end + 4], "big") == 4096 - end
    got = []
    off = 0
    while True:
        res = store.pull("orders", 0, off, max_msgs=7)
        if res.status is not PullStatus.FOUND:
            break
        got += [m.body for m in res.messages]
        off = res.next_offset
    assert got == bodies
    # ConsumeQueue entries are 20 bytes; 16 per file here, so it rolled too.
    cq_files = sorted(os.listdir(tmp_path / "store" / "consumequeue" / "orders" / "0"))
    assert cq_files[:2] == ["00000000000000000000", f"{16 * CQ_STORE_UNIT_SIZE:020d}"]

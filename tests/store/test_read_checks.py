"""Reads check what they return: each body against its CRC (checkCRCOnRead, on by
default) and each record's header against what led to it (its ConsumeQueue entry,
or the CommitLog offset asked for).

A byte of a closed CommitLog is flipped on disk, under a store open for reading
(its mapping sees the write), and every read path must either raise
CorruptRecordError naming that record's file and offset, or return exactly what
it returned before the flip; never a message that differs.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketspark.errors import ConfigError, CorruptRecordError
from rocketspark.message.record import HEADER_V4
from rocketspark.store import Message, MessageStore, MessageStoreConfig

SEGMENT = 4096
GEOMETRY = {
    "mappedFileSizeCommitLog": SEGMENT,
    "mappedFileSizeConsumeQueue": 200,
    "maxHashSlotNum": 64,
    "maxIndexNum": 512,
}
TOPICS = ("ta", "tb")  # one flipped byte apart: a damaged topic may name the other


@dataclasses.dataclass(frozen=True)
class Record:
    topic: str
    queue_id: int
    queue_offset: int
    phy: int
    size: int
    body_len: int
    key: str


@dataclasses.dataclass
class Written:
    root: str
    records: list[Record]


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Written:
    """A closed store: two topics of two queues, bodies of 0-60 bytes over several
    CommitLog segments, each message with a key of its own."""
    root = str(tmp_path_factory.mktemp("read-checks") / "store")
    records = []
    with MessageStore.open(root, **GEOMETRY) as store:
        for t in TOPICS:
            store.create_topic(t, queues=2)
        for i in range(48):
            body = bytes((i * 7 + j) % 256 for j in range(1 + i * 5 % 61))
            key = f"key{i}"
            r = store.put(
                Message(
                    TOPICS[i % 2], body, tags=f"tag{i % 3}", keys=[key], properties={"n": str(i)}
                )
            )
            records.append(
                Record(
                    r.topic,
                    r.queue_id,
                    r.queue_offset,
                    r.commitlog_offset,
                    r.store_size,
                    len(body),
                    key,
                )
            )
    assert len({r.phy // SEGMENT for r in records}) >= 3
    return Written(root, records)


@pytest.fixture(scope="module")
def stores(written) -> Iterator[tuple[MessageStore, MessageStore]]:
    """The store opened twice: checking body CRCs (the default) and not."""
    checked = MessageStore.open(written.root, **GEOMETRY)
    unchecked = MessageStore.open(written.root, checkCRCOnRead=False, **GEOMETRY)
    assert checked.config.check_crc_on_read and not unchecked.config.check_crc_on_read
    yield checked, unchecked
    unchecked.close()
    checked.close()


def _segment_path(root: str, phy: int) -> str:
    return os.path.join(root, "commitlog", f"{phy - phy % SEGMENT:020d}")


@contextmanager
def _flipped(root: str, at: int, mask: int) -> Iterator[None]:
    """XOR the CommitLog byte at offset ``at`` with ``mask``; undo it afterwards."""
    path, pos = _segment_path(root, at), at % SEGMENT
    fd = os.open(path, os.O_RDWR)
    try:
        old = os.pread(fd, 1, pos)[0]
        os.pwrite(fd, bytes([old ^ mask]), pos)
        try:
            yield
        finally:
            os.pwrite(fd, bytes([old]), pos)
    finally:
        os.close(fd)


# Every read path of one record, each as a function of the store it reads.
def _reads(r: Record) -> dict[str, Callable[[MessageStore], Any]]:
    return {
        "pull": lambda s: s.pull(r.topic, r.queue_id, r.queue_offset, max_msgs=1).messages,
        "pull of the queue": lambda s: s.pull(r.topic, r.queue_id, 0, max_msgs=100).messages,
        "pull by tag": lambda s: (
            s.pull(
                r.topic, r.queue_id, r.queue_offset, max_msgs=1, expression="tag0 || tag1 || tag2"
            ).messages
        ),
        "get_message": lambda s: s.get_message(r.phy),
        "query_by_key": lambda s: s.query_by_key(r.topic, r.key),
        "read_batches": lambda s: _rows(s.read_batches(r.topic, r.queue_id, 0)[0]),
        "read_batches of one": lambda s: _rows(
            s.read_batches(r.topic, r.queue_id, r.queue_offset, r.queue_offset + 1)[0]
        ),
    }


def _rows(batches: list[pa.RecordBatch]) -> list[dict]:
    return pa.Table.from_batches(batches).to_pylist() if batches else []


def _before(stores, written) -> dict[tuple[int, str, bool], Any]:
    """What every read returns from the intact store."""
    out = {}
    for k, r in enumerate(written.records):
        for name, read in _reads(r).items():
            for checked, store in zip((True, False), stores, strict=True):
                out[(k, name, checked)] = read(store)
    return out


@pytest.fixture(scope="module")
def before(stores, written):
    return _before(stores, written)


def _raises_or_same(read: Callable[[], Any], want: Any, r: Record, root: str, name: str) -> bool:
    """True when ``read`` raised CorruptRecordError naming ``r``; else it must give ``want``."""
    try:
        got = read()
    except CorruptRecordError as e:
        assert (e.file, e.offset) == (_segment_path(root, r.phy), r.phy), (name, str(e))
        assert e.file in str(e) and str(r.phy) in str(e)
        return True
    assert got == want, name
    return False


_examples = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_examples
@given(data=st.data())
def test_a_flipped_body_byte_fails_every_read_unless_checks_are_off(written, stores, before, data):
    k = data.draw(st.sampled_from([i for i, r in enumerate(written.records) if r.body_len]))
    r = written.records[k]
    j = data.draw(st.integers(0, r.body_len - 1))
    mask = data.draw(st.integers(1, 255))
    checked, unchecked = stores
    with _flipped(written.root, r.phy + HEADER_V4.size + j, mask):
        for name, read in _reads(r).items():
            # CRC-32 catches every error in one byte: the checked store always raises.
            assert _raises_or_same(lambda read=read: read(checked), None, r, written.root, name), (
                name
            )
            got = read(unchecked)
            assert got == _with_body_flipped(before[(k, name, False)], r, j, mask), name


def _with_body_flipped(value: Any, r: Record, j: int, mask: int) -> Any:
    """``value`` (messages or rows) with byte ``j`` of record ``r``'s body XORed."""

    def flip(body: bytes) -> bytes:
        return body[:j] + bytes([body[j] ^ mask]) + body[j + 1 :]

    if isinstance(value, list):
        return [_with_body_flipped(v, r, j, mask) for v in value]
    if isinstance(value, dict):
        return (
            {**value, "body": flip(value["body"])} if value["commitLogOffset"] == r.phy else value
        )
    return (
        dataclasses.replace(value, body=flip(value.body))
        if value.commitlog_offset == r.phy
        else value
    )


def _header_bytes(r: Record) -> list[tuple[str, int]]:
    """(field, offset within the record) of every byte a read checks against what led to
    the record, or that places the fields after it."""
    fields = [
        ("TOTALSIZE", 0, 4),
        ("MAGICCODE", 4, 4),
        ("BODYCRC", 8, 4),
        ("QUEUEID", 12, 4),
        ("QUEUEOFFSET", 20, 8),
        ("PHYSICALOFFSET", 28, 8),
        ("BODYLENGTH", 84, 4),
    ]
    topic_at = HEADER_V4.size + r.body_len
    fields += [
        ("TOPICLENGTH", topic_at, 1),
        ("TOPIC", topic_at + 1, len(r.topic)),
        ("PROPERTIESLENGTH", topic_at + 1 + len(r.topic), 2),
    ]
    return [(name, start + i) for name, start, width in fields for i in range(width)]


@_examples
@given(data=st.data())
def test_a_flipped_header_byte_never_passes_for_another_message(written, stores, before, data):
    k = data.draw(st.integers(0, len(written.records) - 1))
    r = written.records[k]
    field, at = data.draw(st.sampled_from(_header_bytes(r)))
    mask = data.draw(st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128, 255]) | st.integers(1, 255))
    checked, unchecked = stores
    with _flipped(written.root, r.phy + at, mask):
        for name, read in _reads(r).items():
            _raises_or_same(
                lambda read=read: read(checked),
                before[(k, name, True)],
                r,
                written.root,
                f"{name}, {field}",
            )
            if field != "BODYCRC":  # (unchecked, a read gives the damaged field as stored)
                _raises_or_same(
                    lambda read=read: read(unchecked),
                    before[(k, name, False)],
                    r,
                    written.root,
                    f"{name} unchecked, {field}",
                )


@pytest.mark.parametrize(
    "field, says",
    [
        ("QUEUEID", "QUEUEID"),
        ("QUEUEOFFSET", "QUEUEOFFSET"),
        ("PHYSICALOFFSET", "PHYSICALOFFSET"),
        ("TOPIC", "topic"),
        ("TOTALSIZE", "TOTALSIZE"),
        ("BODYCRC", "body CRC mismatch"),
    ],
)
def test_each_read_names_the_damaged_field(written, stores, field, says):
    r = next(r for r in written.records if r.body_len and r.queue_offset > 0)
    at = dict(_header_bytes(r)[::-1])[field]  # the field's first byte
    checked, _ = stores
    with _flipped(written.root, r.phy + at, 0x01 if field != "TOPIC" else 0x03):
        for name, read in _reads(r).items():
            with pytest.raises(CorruptRecordError, match=says) as info:
                read(checked)
            assert (info.value.file, info.value.offset) == (
                _segment_path(written.root, r.phy),
                r.phy,
            ), name


def test_a_damaged_body_crc_field_is_returned_as_stored_when_checks_are_off(written, stores):
    r = written.records[5]
    _, unchecked = stores
    want = unchecked.get_message(r.phy)
    with _flipped(written.root, r.phy + 8 + 3, 0x10):
        got = unchecked.get_message(r.phy)
        rows = _rows(
            unchecked.read_batches(r.topic, r.queue_id, r.queue_offset, r.queue_offset + 1)[0]
        )
    assert got == dataclasses.replace(want, body_crc=want.body_crc ^ 0x10)
    assert rows[0]["body"] == want.body


def test_read_batches_check_crc_argument_overrides_the_store_setting(written, stores):
    r = next(r for r in written.records if r.body_len)
    checked, unchecked = stores
    with _flipped(written.root, r.phy + HEADER_V4.size, 0xFF):
        as_stored = unchecked.get_message(r.phy).body
        rows = _rows(checked.read_batches(r.topic, r.queue_id, 0, check_crc=False)[0])
        assert [x["body"] for x in rows if x["commitLogOffset"] == r.phy] == [as_stored]
        with pytest.raises(CorruptRecordError, match="body CRC mismatch"):
            unchecked.read_batches(r.topic, r.queue_id, 0, check_crc=True)
    assert as_stored != checked.get_message(r.phy).body


def test_check_crc_on_read_is_a_broker_conf_key_on_by_default(tmp_path):
    assert MessageStoreConfig().check_crc_on_read is True
    conf = tmp_path / "broker.conf"
    conf.write_text("checkCRCOnRead=false\n")
    assert MessageStoreConfig.load(conf).check_crc_on_read is False
    assert MessageStoreConfig.load(None, check_crc_on_read="true").check_crc_on_read is True
    with pytest.raises(ConfigError, match="did you mean 'checkCRCOnRead'"):
        MessageStoreConfig.load(None, checkCrcOnReads=False)


def test_the_source_option_check_crcs_is_parsed_and_suggested():
    from rocketspark.datasource.options import parse_options

    assert parse_options({"topic": "t"}, "read").get("checkCRCs") is None  # the store's
    assert parse_options({"topic": "t", "checkcrcs": "false"}, "read")["checkCRCs"] is False
    with pytest.raises(ConfigError, match="checkCRCs: expected true or false"):
        parse_options({"topic": "t", "checkCRCs": "maybe"}, "read")
    with pytest.raises(ConfigError, match="did you mean 'checkCRCs'"):
        parse_options({"topic": "t", "check.crcs": "false"}, "read")


@settings(max_examples=300, deadline=None)
@given(
    width=st.integers(1, 40),
    n=st.integers(1, 70),
    seed=st.integers(0, 2**32 - 1),
    damage=st.sampled_from(["none", "body", "crc"]),
)
def test_the_batched_crc_check_agrees_with_one_crc_a_body(width, n, seed, damage):
    import random
    import zlib

    import numpy as np

    from rocketspark.message.arrow import _uniform_crcs_match

    rnd = random.Random(seed)
    raw = bytearray(rnd.randbytes(3 + n * width))  # bodies from offset 3, end to end
    stored = np.array(
        [zlib.crc32(raw[3 + i * width : 3 + (i + 1) * width]) & 0x7FFFFFFF for i in range(n)],
        dtype=">i4",
    )
    if damage == "body":
        raw[3 + rnd.randrange(n * width)] ^= rnd.randrange(1, 256)
    elif damage == "crc":
        stored[rnd.randrange(n)] ^= 1 << rnd.randrange(31)
    assert _uniform_crcs_match(pa.py_buffer(bytes(raw)), 3, n, width, stored) == (damage == "none")


@pytest.mark.parametrize("width", [5, 100, 2000])
def test_bodies_of_one_length_checked_at_once_still_name_the_damaged_one(tmp_path, width):
    with MessageStore.open(tmp_path / "s") as store:
        store.create_topic("t", queues=1)
        results = store.put_batch([Message("t", bytes([i]) * width) for i in range(100)])
        assert len(_rows(store.read_batches("t", 0, 0)[0])) == 100
        r = results[37]
        path = store.commit_log.segment(r.commitlog_offset).path
        fd = os.open(path, os.O_RDWR)
        try:
            os.pwrite(fd, b"\xff", r.commitlog_offset + HEADER_V4.size + width // 2)
        finally:
            os.close(fd)
        with pytest.raises(CorruptRecordError, match="body CRC mismatch") as info:
            store.read_batches("t", 0, 0)
        assert (info.value.file, info.value.offset) == (path, r.commitlog_offset)
        assert len(_rows(store.read_batches("t", 0, 0, check_crc=False)[0])) == 100

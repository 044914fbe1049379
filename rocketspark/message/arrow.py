"""CommitLog records as Arrow record batches: the vectorised read path, and the one
row schema (:data:`ARROW_SCHEMA`) the data source reads and writes.

:func:`records_to_batch` takes any buffer of records in the CommitLog layout: a
mapped CommitLog segment (the store finds the segments, see
``CommitLog.record_batches``) or, later, the body of a PULL_MESSAGE answer. A
queue's records lie in ascending order, so they can be cut out of the buffer
without a per-message Python step: numpy
gathers the fixed 88-byte headers of every record at once, and the variable
parts (bodies, properties) of one length (the usual) straight into the data
buffer of their column, in one more gather each; parts of many lengths are
copied by Arrow, taking every other element of a binary array whose offsets
alternate between "start of a body" and "end of that body". Properties of one
layout are parsed once a block, by the first row's template, the others
with numpy and Arrow kernels. Records with IPv6 hosts or compressed bodies
take the per-record decoder instead.

A row's ``properties`` map holds every property of the message except the
three that have a column of their own (TAGS → ``tags``, KEYS → ``keys``,
UNIQ_KEY → ``uniqKey``): no value appears twice in a row, as in RocketMQ 5's
client API, which keeps the tag, keys and message id apart from the user
properties. A row written back through the sink then carries no stale
TAGS/KEYS/UNIQ_KEY, and Spark copies ~80 fewer bytes a row (the map was the
widest column after the body).
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rocketspark.errors import CorruptRecordError
from rocketspark.message.byte_gather import gather_items
from rocketspark.message.model import (
    KEY_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    HostAddress,
    MessageExt,
    SysFlag,
)
from rocketspark.message.properties import (
    NAME_VALUE_BYTE,
    NAME_VALUE_SEPARATOR_BYTES,
    PROPERTY_BYTE,
    PROPERTY_SEPARATOR_BYTES,
)
from rocketspark.message.record import (
    HEADER_V4,
    HEADER_V4_DTYPE,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    V1_MAX_TOPIC_LENGTH,
    body_crc_error,
    decode_record,
    header_mismatch,
)
from rocketspark.message.schema import ARROW_SCHEMA, COLUMN_NAMES, TIMESTAMP, row_schema

HEADER_DTYPE = HEADER_V4_DTYPE  # the fixed part of a v1/v2 record with IPv4 hosts
assert HEADER_DTYPE.itemsize == HEADER_V4.size
_FIELD_AT = {name: field[1] for name, field in (HEADER_DTYPE.fields or {}).items()}
# A host is an address and the port after it: _one_host compares the two as one word.
assert all(_FIELD_AT[f"{h}_port"] == _FIELD_AT[f"{h}_ip"] + 4 for h in ("born", "store"))
_PROPERTIES_LENGTH = np.dtype(">u2")  # PROPERTIESLENGTH, after the topic
_SLOW_FLAGS = int(SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6 | SysFlag.COMPRESSED)


# The columns read from the properties: a read that wants none of them parses none.
PROPERTY_COLUMNS = frozenset(("uniqKey", "tags", "keys", "properties"))


def empty_batch(columns: tuple[str, ...] | None = None) -> pa.RecordBatch:
    schema = row_schema(columns)
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


def with_tags(columns: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """The columns to decode for a tag filter: ``columns`` and ``tags``."""
    return columns if columns is None or "tags" in columns else (*columns, "tags")


class _Reached(NamedTuple):
    """What a block's records must match: their queue, and whether bodies are checked."""

    topic: str
    queue_id: int
    check_crc: bool


def records_to_batch(
    buffer: Any,
    positions: np.ndarray,
    sizes: np.ndarray,
    *,
    topic: str,
    broker_name: str,
    queue_id: int,
    queue_offsets: np.ndarray,
    commitlog_offsets: np.ndarray,
    check_crc: bool = True,
    file: str | None = None,
    columns: tuple[str, ...] | None = None,
) -> pa.RecordBatch:
    """Return the records at ``positions`` of ``buffer`` (ascending, all of ``topic``
    and queue ``queue_id``) as one batch of :data:`ARROW_SCHEMA`, or of its
    ``columns`` only, in that order (:func:`row_schema`).

    ``buffer`` is any bytes-like object in the CommitLog layout (a mapped segment, or
    a PULL_MESSAGE body); the batch copies what it keeps, so the buffer may be closed
    afterwards. ``sizes``, ``queue_offsets`` and ``commitlog_offsets`` are what each
    record is expected to say (a ConsumeQueue entry's size and offsets). Raises
    CorruptRecordError, naming ``file`` and the CommitLog offset, when a record lies
    past the end of the buffer, its header disagrees with what is expected, or, with
    ``check_crc``, its body does not match its BODYCRC. The checks are the same
    whatever the ``columns``; what no column wanted is not built (the properties
    are parsed only for uniqKey, tags, keys or properties).
    """
    schema = row_schema(columns)
    rel = np.asarray(positions, dtype=np.int64)
    size = np.asarray(sizes, dtype=np.int64)
    qoff = np.asarray(queue_offsets, dtype=np.int64)
    phy = np.asarray(commitlog_offsets, dtype=np.int64)
    if len(phy) == 0:
        return empty_batch(columns)
    reached = _Reached(topic, queue_id, check_crc)
    n = len(phy)
    buf = np.frombuffer(buffer, dtype=np.uint8)
    try:
        past = np.flatnonzero(rel + size > len(buf))
        if len(past) or int(rel[0]) < 0:
            raise CorruptRecordError(
                "record lies past the end of its buffer",
                file=file,
                offset=int(phy[past[0]] if len(past) else phy[0]),
            )
        hdr = gather_items(buf, rel, HEADER_DTYPE)  # every header in one gather
        magic = hdr["magic"]
        total = hdr["total"].astype(np.int64)
        bad = np.flatnonzero(
            ((magic != MESSAGE_MAGIC_CODE) & (magic != MESSAGE_MAGIC_CODE_V2))
            | (total != size)
            | (hdr["phy"] != phy)
            | (hdr["queue_id"] != reached.queue_id)
            | (hdr["queue_offset"] != qoff)
        )
        if len(bad):
            i = int(bad[0])
            what = _header_mismatch(hdr[i], int(phy[i]), int(size[i]), reached, int(qoff[i]))
            raise CorruptRecordError(
                f"record header damaged: {what}", file=file, offset=int(phy[i])
            )
        sys_flag = hdr["sys_flag"].astype(np.int32)
        if np.any(sys_flag & _SLOW_FLAGS):
            return _read_each(buffer, file, reached, broker_name, rel, phy, size, qoff, columns)
        body_len = hdr["body_len"].astype(np.int64)
        topic_bytes = topic.encode("utf-8")
        topic_len = len(topic_bytes)
        v2 = magic == MESSAGE_MAGIC_CODE_V2
        topic_field = np.where(v2, 2, 1)
        # Before anything is read past the header: the body ends inside the record.
        bad = np.flatnonzero(
            (body_len < 0) | (body_len > total - HEADER_V4.size - topic_field - topic_len - 2)
        )
        if len(bad):
            i = int(bad[0])
            raise CorruptRecordError(
                f"record header damaged: BODYLENGTH {int(body_len[i])} overruns TOTALSIZE "
                f"{int(total[i])}",
                file=file,
                offset=int(phy[i]),
            )
        body_start = rel + HEADER_V4.size
        body_end = body_start + body_len
        plen_at = body_end + topic_field + topic_len
        # TOPICLENGTH, the topic and PROPERTIESLENGTH after each body in one gather when
        # the records share one magic (the usual); the topic is checked in it below.
        tails = None
        if bool(v2.all()) or not bool(v2.any()):
            tail = np.dtype((np.void, int(topic_field[0]) + topic_len + 2))
            tails = gather_items(buf, body_end, tail).view(np.uint8).reshape(n, tail.itemsize)
            props_len = tails[:, -2:].view(_PROPERTIES_LENGTH)[:, 0].astype(np.int64)
        else:
            props_len = gather_items(buf, plen_at, _PROPERTIES_LENGTH).astype(np.int64)
        props_start = plen_at + 2
        computed = HEADER_V4.size + body_len + topic_field + topic_len + 2 + props_len
        bad = np.flatnonzero(computed != total)
        if len(bad):
            i = int(bad[0])
            raise CorruptRecordError(
                f"record fields add up to {int(computed[i])} bytes, TOTALSIZE says "
                f"{int(total[i])} (is every record of this queue of topic {topic!r}?)",
                file=file,
                offset=int(phy[i]),
            )
        _check_topics(buf, body_end, v2, topic_bytes, file, phy, tails)
        names = schema.names
        # Bodies are gathered for their check even when no column wants them.
        body = (
            _gather_binary(buffer, buf, body_start, body_len)
            if reached.check_crc or "body" in names
            else None
        )
        props = (
            None
            if PROPERTY_COLUMNS.isdisjoint(names)
            else _gather_properties(buffer, buf, props_start, props_len)
        )
        if body is not None and reached.check_crc:
            _check_body_crcs(body, body_len, hdr["crc"], file, phy)
        parsed = None
        if props is not None:
            try:
                parsed = _parse_properties(props)
            except _NotUtf8:  # a property that is not UTF-8: the per-record decoder copes
                return _read_each(buffer, file, reached, broker_name, rel, phy, size, qoff, columns)
        decoded = _Decoded(n, topic, broker_name, queue_id, hdr, qoff, phy, sys_flag, body, parsed)
        arrays = [_BUILD[name](decoded) for name in names]
    finally:
        del buf
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def record_positions(buffer: Any, *, what: str = "pull answer") -> tuple[np.ndarray, np.ndarray]:
    """The start and size of every record of a buffer of back-to-back records.

    A PULL_MESSAGE (or QUERY_MESSAGE) answer's body is records of the CommitLog
    layout, one after the other, each starting with its TOTALSIZE. Records of
    one size (the common case: one producer's messages) are checked in one
    numpy step; otherwise the sizes are walked. Raises CorruptRecordError when a
    size is not positive or a record runs past the end of the buffer.
    """
    buf = np.frombuffer(buffer, dtype=np.uint8)
    n = len(buf)
    if n == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    if n < 4:
        raise CorruptRecordError(f"{what}: {n} bytes are not a record")
    first = int.from_bytes(buf[:4].tobytes(), "big", signed=True)
    if first >= 4 and n % first == 0:  # (smaller: not a record; the walk below says so)
        starts = np.arange(0, n, first, dtype=np.int64)
        sizes = gather_items(buf, starts, np.dtype(">i4")).astype(np.int64)
        if bool(np.all(sizes == first)):
            return starts, sizes
    out_starts: list[int] = []
    out_sizes: list[int] = []
    pos = 0
    view = memoryview(buffer).cast("B") if not isinstance(buffer, bytes) else buffer
    while pos < n:
        if pos + 4 > n:
            raise CorruptRecordError(
                f"{what}: {n - pos} trailing bytes after record {len(out_starts)}"
            )
        size = int.from_bytes(view[pos : pos + 4], "big", signed=True)
        if size <= 0 or pos + size > n:
            raise CorruptRecordError(
                f"{what}: record {len(out_starts)} at byte {pos} says it is {size} bytes "
                f"long, {n - pos} remain"
            )
        out_starts.append(pos)
        out_sizes.append(size)
        pos += size
    return np.array(out_starts, dtype=np.int64), np.array(out_sizes, dtype=np.int64)


def records_body_to_batch(
    buffer: Any,
    *,
    topic: str,
    broker_name: str,
    queue_id: int,
    check_crc: bool = True,
    what: str = "pull answer",
    columns: tuple[str, ...] | None = None,
) -> pa.RecordBatch:
    """Return the back-to-back records of one queue in ``buffer`` (a pull answer's body)
    as one batch of :data:`ARROW_SCHEMA` (or of its ``columns``), with the same
    vectorised code as a segment.

    Each record's queue offset and CommitLog offset come from its own header
    (there is no ConsumeQueue entry to compare them with); its topic and queue
    id must be ``topic`` and ``queue_id``. Compressed bodies come out inflated,
    as RocketMQ's Java consumer gives them.
    """
    starts, sizes = record_positions(buffer, what=what)
    if len(starts) == 0:
        return empty_batch(columns)
    buf = np.frombuffer(buffer, dtype=np.uint8)
    if int(starts[-1]) + HEADER_DTYPE.itemsize > len(buf):
        raise CorruptRecordError(f"{what}: its last record is shorter than a record header")
    hdr = gather_items(buf, starts, HEADER_DTYPE)
    del buf
    return records_to_batch(
        buffer,
        starts,
        sizes,
        topic=topic,
        broker_name=broker_name,
        queue_id=queue_id,
        queue_offsets=hdr["queue_offset"].astype(np.int64),
        commitlog_offsets=hdr["phy"].astype(np.int64),
        check_crc=check_crc,
        file=what,
        columns=columns,
    )


def _read_each(
    buffer: Any,
    file: str | None,
    reached: _Reached,
    broker_name: str,
    rel: np.ndarray,
    phy: np.ndarray,
    size: np.ndarray,
    qoff: np.ndarray,
    columns: tuple[str, ...] | None,
) -> pa.RecordBatch:
    """The records as one batch, decoded one by one (the per-record path)."""
    rows = zip(rel.tolist(), phy.tolist(), size.tolist(), qoff.tolist(), strict=True)
    return messages_to_batch(
        [_read_reached(buffer, file, reached, r, p, s, q) for r, p, s, q in rows],
        broker_name,
        columns,
    )


def _read_reached(
    buffer: Any, file: str | None, reached: _Reached, pos: int, phy: int, size: int, qoff: int
) -> MessageExt:
    """Decode the record at ``pos``, which a ConsumeQueue entry says is at CommitLog
    offset ``phy``; raise CorruptRecordError when its header disagrees with the entry."""
    msg = decode_record(buffer, pos, file=file, base_offset=phy - pos, verify_crc=reached.check_crc)
    what = header_mismatch(
        msg, phy, size=size, topic=reached.topic, queue_id=reached.queue_id, queue_offset=qoff
    )
    if what is not None:
        raise CorruptRecordError(f"record header damaged: {what}", file=file, offset=phy)
    return msg


def _header_mismatch(hdr: np.void, phy: int, size: int, reached: _Reached, qoff: int) -> str:
    """Which field of one record's header disagrees with its ConsumeQueue entry."""
    magic = int(hdr["magic"])
    if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
        return f"MAGICCODE {magic & 0xFFFFFFFF:#x} is not a message's"
    if int(hdr["phy"]) != phy:
        return f"PHYSICALOFFSET {int(hdr['phy'])} is not the offset it was read at"
    if int(hdr["total"]) != size:
        return f"TOTALSIZE {int(hdr['total'])} is not the ConsumeQueue entry's size {size}"
    if int(hdr["queue_id"]) != reached.queue_id:
        return (
            f"QUEUEID {int(hdr['queue_id'])} is not {reached.queue_id}, whose "
            "ConsumeQueue points at it"
        )
    return (
        f"QUEUEOFFSET {int(hdr['queue_offset'])} is not {qoff}, the ConsumeQueue offset "
        "that points at it"
    )


def _check_topics(
    buf: np.ndarray,
    topic_at: np.ndarray,
    v2: np.ndarray,
    topic: bytes,
    path: str | None,
    phy: np.ndarray,
    tails: np.ndarray | None = None,
) -> None:
    """Raise CorruptRecordError unless every record's TOPICLENGTH and topic (at
    ``topic_at``: 1 length byte, or 2 with the v2 magic) are ``topic``'s.

    The rows take the topic of their ConsumeQueue, not these bytes; checking them
    reports a damaged record here as the per-record decoder would. ``tails``, when
    given, holds those bytes already (a byte matrix, a row a record, all of one magic).
    """
    bad = np.zeros(len(topic_at), dtype=bool)
    for kind, field in ((~v2, bytes([len(topic) & 0xFF])), (v2, len(topic).to_bytes(2, "big"))):
        at = topic_at if kind.all() else topic_at[kind]
        if not len(at):
            continue
        want = field + topic
        item = np.dtype((np.void, len(want)))
        got = (
            tails[:, : len(want)].view(item)[:, 0]
            if tails is not None
            else gather_items(buf, at, item)
        )
        differ = got != np.void(want)
        if kind.all():
            bad = differ
        else:
            bad[kind] = differ
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        start = int(topic_at[i]) + (2 if v2[i] else 1)
        length = int.from_bytes(bytes(buf[topic_at[i] : start]), "big")
        got_topic = bytes(buf[start : start + min(length, len(topic) + 8)])
        raise CorruptRecordError(
            f"record header damaged: topic {got_topic.decode('utf-8', 'replace')!r} "
            f"(TOPICLENGTH {length}) is not {topic.decode('utf-8')!r}, whose ConsumeQueue "
            "points at it",
            file=path,
            offset=int(phy[i]),
        )


def _check_body_crcs(
    body: pa.Array, body_len: np.ndarray, stored: np.ndarray, path: str | None, phy: np.ndarray
) -> None:
    """Raise CorruptRecordError unless each body (a compact binary array, copied out
    of the segment) matches its BODYCRC field ``stored[i]``.

    Bodies of one length up to _BATCH_MAX_WIDTH bytes are checked all at once
    (:func:`_uniform_crcs_match`, ~4x cheaper); otherwise, or to find the
    culprit, zlib.crc32 runs on each body, over objects made in C: numpy void
    items (one length) or bytes. zlib costs ~1 ns a byte on short inputs plus
    ~40 ns a call; a numpy table CRC over all rows was no faster.
    """
    n = len(body)
    width = int(body_len[0]) if n else 0
    _, offsets, data = body.buffers()
    uniform = width > 0 and bool((body_len == width).all())
    if uniform:
        first = int(np.frombuffer(offsets, dtype=np.int32, count=1, offset=body.offset * 4)[0])
        if width <= _BATCH_MAX_WIDTH and _uniform_crcs_match(data, first, n, width, stored):
            return
        items: Any = np.frombuffer(data, dtype=np.dtype((np.void, width)), count=n, offset=first)
    else:
        items = body.to_pylist()
    crcs = np.fromiter(map(zlib.crc32, items), dtype=np.int64, count=n) & 0x7FFFFFFF
    del items
    bad = np.flatnonzero(crcs != stored)
    if len(bad):
        i = int(bad[0])
        raise body_crc_error(int(stored[i]), int(crcs[i]), file=path, offset=int(phy[i]))


_BATCH_MAX_WIDTH = 1024  # wider bodies: one zlib call a body runs near its bulk speed
_SHIFT_LEVELS = 17  # _uniform_crcs_match folds up to 2^17 - 1 bodies


def _uniform_crcs_match(data: Any, first: int, n: int, width: int, stored: np.ndarray) -> bool:
    """True when each of ``n`` bodies of ``width`` bytes, laid end to end in ``data``
    from ``first``, has the CRC whose low 31 bits are ``stored`` (BODYCRC).

    CRC-32 is affine over GF(2): the CRC of a concatenation is the CRCs of its
    parts, each shifted by the length that follows it (``crc(a+b) = shift(crc(a),
    len(b)) ^ crc(b)``). So one zlib pass over all the bodies (bulk speed, not
    ~40 ns a call plus the slow short-input path) is compared with the stored
    CRCs combined by that rule in numpy. BODYCRC drops bit 31, which is a parity
    of some of the body's bits (numpy, 64 bits at a time). A single damaged
    body makes the two differ exactly when its own check would fail; damage in
    several bodies could cancel out with odds of 2^-32. False sends the caller
    to the per-body check, which names the record.
    """
    if n >> _SHIFT_LEVELS:
        return False  # more bodies than the tables fold (read_batches blocks hold 2^16)
    mask, top0 = _top_bit_mask(width)
    if width >= 8:
        # The masked body XORed 8 bytes at a time: one pass a word over all the bodies
        # (a reduce along each row is ~2x slower: numpy steps row by row).
        acc = np.zeros(n, dtype=np.uint64)
        word = np.empty(n, dtype=np.uint64)
        for at, bits in _parity_words(width):
            col = np.ndarray(
                shape=(n,), dtype="<u8", buffer=data, offset=first + at, strides=(width,)
            )
            np.bitwise_and(col, bits, out=word)
            acc ^= word
    else:
        rows = np.ndarray(
            shape=(n, width), dtype=np.uint8, buffer=data, offset=first, strides=(width, 1)
        )
        acc = np.bitwise_xor.reduce(rows & mask, axis=1).astype(np.uint64)
    top = _parity(acc) ^ np.uint32(top0)
    crcs = stored.astype(np.uint32) | (top << np.uint32(31))
    tables = _shift_tables(width)
    wide = _wide_shift_tables(width)
    view = memoryview(data)
    try:
        at = 0
        while at < n:  # chunks of 2^k bodies: each folds evenly, level by level
            size = 1 << ((n - at).bit_length() - 1)
            vals = crcs[at : at + size]
            for level in range(size.bit_length() - 1):
                left = vals[0::2]
                if level < _WIDE_LEVELS:  # most of the pairs: two lookups a pair, not four
                    low, high = wide[level]
                    vals = low.take(left & 0xFFFF) ^ high.take(left >> 16) ^ vals[1::2]
                    continue
                t = tables[level]
                vals = (
                    t[0][left & 0xFF]
                    ^ t[1][(left >> 8) & 0xFF]
                    ^ t[2][(left >> 16) & 0xFF]
                    ^ t[3][left >> 24]
                    ^ vals[1::2]
                )
            start = first + at * width
            if int(vals[0]) != zlib.crc32(view[start : start + size * width]):
                return False
            at += size
    finally:
        view.release()
    return True


@lru_cache(maxsize=64)
def _parity_words(width: int) -> list[tuple[int, np.uint64]]:
    """The 8-byte words that cover a ``width``-byte body (width >= 8), as (offset,
    mask) pairs: :func:`_top_bit_mask` for each word; a last word overlapping the
    one before it masks only the bytes that one did not."""
    mask, _ = _top_bit_mask(width)
    out = [(at, mask[at : at + 8].view("<u8")[0]) for at in range(0, width - 7, 8)]
    if width % 8:
        last = mask[width - 8 :].copy()
        last[: 8 - width % 8] = 0
        out.append((width - 8, last.view("<u8")[0]))
    return out


def _parity(words: np.ndarray) -> np.ndarray:
    """The parity of each uint64 word, as uint32 0 or 1."""
    if _bitwise_count is not None:  # numpy 2
        return (_bitwise_count(words) & 1).astype(np.uint32)
    for bits in (32, 16, 8, 4, 2, 1):
        words = words ^ (words >> np.uint64(bits))
    return (words & np.uint64(1)).astype(np.uint32)


_bitwise_count = getattr(np, "bitwise_count", None)


@lru_cache(maxsize=64)
def _top_bit_mask(width: int) -> tuple[np.ndarray, int]:
    """The bits of a ``width``-byte body whose parity, XOR the second value, is bit 31
    of its CRC: bit 31 of crc(e) ^ crc(zeros) for each one-bit body e."""
    zeros = zlib.crc32(bytes(width))
    mask = np.zeros(width, dtype=np.uint8)
    # The effect of one byte on the register is the byte's table entry, shifted one
    # byte per byte that follows: computed from the last byte backwards.
    regs = [_crc_byte_table()[1 << k] for k in range(8)]
    for j in range(width - 1, -1, -1):
        mask[j] = sum(1 << k for k in range(8) if regs[k] >> 31 & 1)
        regs = [(r >> 8) ^ _crc_byte_table()[r & 0xFF] for r in regs]
    return mask, zeros >> 31 & 1


@lru_cache(maxsize=1)
def _crc_byte_table() -> list[int]:
    """zlib's (reflected, polynomial 0xEDB88320) CRC-32 table of one byte."""
    out = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        out.append(c)
    return out


_WIDE_LEVELS = 4  # the levels folded by 16-bit tables: 15/16 of the pairs


@lru_cache(maxsize=8)
def _wide_shift_tables(width: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`_shift_tables` of the first :data:`_WIDE_LEVELS` levels as two 65536-entry
    tables each (the low and the high 16 bits of a CRC; 512 KiB a level)."""
    low = np.arange(1 << 16, dtype=np.uint32)
    out = []
    for t in _shift_tables(width)[:_WIDE_LEVELS]:
        out.append((t[0][low & 0xFF] ^ t[1][low >> 8], t[2][low & 0xFF] ^ t[3][low >> 8]))
    return out


@lru_cache(maxsize=64)
def _shift_tables(width: int) -> list[list[np.ndarray]]:
    """For level k: four 256-entry tables of the map c -> shift(c, width * 2^k), the
    CRC of a part followed by that many bytes (a linear map, applied byte by byte)."""
    basis = np.array([1 << b for b in range(32)], dtype=np.uint32)
    # shift(c, m) = ~crc32(zeros(m), ~c): zlib runs its register over m zero bytes.
    cols = np.array(
        [~zlib.crc32(bytes(width), ~int(c) & 0xFFFFFFFF) & 0xFFFFFFFF for c in basis],
        dtype=np.uint32,
    )
    bits = (np.arange(256)[:, None] >> np.arange(8)) & 1  # (256, 8)
    out = []
    for _ in range(_SHIFT_LEVELS):
        tables = [
            np.bitwise_xor.reduce(np.where(bits == 1, cols[8 * p : 8 * p + 8], 0), axis=1).astype(
                np.uint32
            )
            for p in range(4)
        ]
        out.append(tables)
        # twice the shift: the map applied to its own columns
        cols = (
            tables[0][cols & 0xFF]
            ^ tables[1][(cols >> 8) & 0xFF]
            ^ tables[2][(cols >> 16) & 0xFF]
            ^ tables[3][cols >> 24]
        )
    return out


def _fixed_rows(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray | None:
    """The pieces ``buf[starts[i]:starts[i] + lengths[i]]`` as one (n, width) byte
    matrix when every length is the same ``width`` (> 0), else None.

    One numpy gather of ``width``-byte items (a strided copy when the pieces are
    evenly spaced: one producer's records in one queue) straight into the
    matrix, which then is the data buffer of the column: no intermediate array.
    """
    width = int(lengths[0])
    if width <= 0 or len(lengths) * width > _MAX_INT32 or bool((lengths != width).any()):
        return None
    items = gather_items(buf, starts, np.dtype((np.void, width)))
    return items.view(np.uint8).reshape(len(starts), width)


_MAX_INT32 = (1 << 31) - 1  # the last offset of a binary (not large_binary) array


def _binary_rows(rows: np.ndarray, kind: pa.DataType) -> pa.Array:
    """The rows of a C-contiguous (n, width) byte matrix as a ``kind`` array (binary or
    large_binary), sharing the matrix's memory."""
    n, width = rows.shape
    dtype = np.int64 if kind == pa.large_binary() else np.int32
    offsets = np.arange(0, (n + 1) * width, width, dtype=dtype)
    return pa.Array.from_buffers(kind, n, [None, pa.py_buffer(offsets), pa.py_buffer(rows)])


def _gather_binary(
    buffer: Any, buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray
) -> pa.Array:
    """Copy the pieces of ``buffer`` at ``starts`` (ascending, not overlapping) of
    ``lengths`` bytes into one compact binary array: gathered once into its data
    buffer when they are of one length, else cut out by :func:`_cut`."""
    rows = _fixed_rows(buf, starts, lengths)
    if rows is not None:
        return _binary_rows(rows, pa.binary())
    return _cut(pa.py_buffer(buffer), starts, starts + lengths).cast(pa.binary())


def _gather_properties(
    buffer: Any, buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray
) -> pa.Array | np.ndarray:
    """The properties strings at ``starts``: a byte matrix when they are all of one
    length (what :func:`_parse_properties` reads by template), else a compact
    large_binary array."""
    rows = _fixed_rows(buf, starts, lengths)
    return rows if rows is not None else _cut(pa.py_buffer(buffer), starts, starts + lengths)


def _cut(segment: pa.Buffer, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
    """Copy [starts[i], ends[i]) of ``segment`` into one compact binary array.

    ``starts``/``ends`` ascend and do not overlap; the odd elements of the
    interleaved array are the gaps between the pieces and are dropped.
    """
    n = len(starts)
    if n == 0:
        return pa.array([], pa.large_binary())
    offsets = np.empty(2 * n, dtype=np.int64)
    offsets[0::2] = starts
    offsets[1::2] = ends
    interleaved = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), 2 * n - 1, [None, pa.py_buffer(offsets), segment]
    )
    return interleaved.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int64)))


def _msg_ids(hdr: np.ndarray, phy: np.ndarray) -> pa.Array:
    """The rows' msgIds: STOREHOST's IPv4 address and port, then the CommitLog offset,
    as 32 hex digits, built four digits at a time (:data:`_HEX_QUADS`); the digits a
    block shares (its one store host, the offsets' high 32 bits) are made once."""
    n = len(phy)
    text = np.empty((n, 8), dtype=np.uint32)  # four hex digits an item, in memory order
    ip, port = hdr["store_ip"], hdr["store_port"]
    if _one_host(hdr, "store_ip"):
        ip, port = ip[:1], port[:1]
    ip = ip.astype(np.int64)
    port = port.astype(np.int64)
    high = phy >> 32
    if int(high.min()) == int(high.max()):
        high = high[:1]
    quads = ((ip, 16), (ip, 0), (port, 16), (port, 0), (high, 16), (high, 0), (phy, 16), (phy, 0))
    for k, (value, shift) in enumerate(quads):
        text[:, k] = _HEX_QUADS[(value >> shift) & 0xFFFF]
    offsets = np.arange(0, 32 * n + 1, 32, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(text))


def _one_host(hdr: np.ndarray, ip_field: str) -> bool:
    """True when every header holds the same host: the 8 bytes of the IPv4 address
    ``ip_field`` and the port after it, compared as one word."""
    at = _FIELD_AT[ip_field]
    raw = np.ndarray(shape=(len(hdr),), dtype="<u8", buffer=hdr, offset=at, strides=hdr.strides)
    return bool((raw == raw[0]).all())


# The 16-bit values as four hex digits each, viewed as uint32 items (256 KiB).
_HEX_QUADS = np.frombuffer(b"".join(b"%04X" % i for i in range(1 << 16)), dtype=np.uint32)


def _hosts(hdr: np.ndarray, ip_field: str, port_field: str) -> pa.Array:
    """The rows' host (``ip_field`` and ``port_field`` of each header) as text."""
    ip, port = hdr[ip_field], hdr[port_field]
    if _one_host(hdr, ip_field):  # the usual: its text repeated, no hashing, no take
        host = HostAddress(int(ip[0]).to_bytes(4, "big"), int(port[0]) & 0xFFFFFFFF)
        return _repeat(str(host), len(ip))
    key = (ip.astype(np.uint64) << np.uint64(32)) | port.astype(np.uint64)
    uniq, inverse = np.unique(key, return_inverse=True)
    names = [
        str(HostAddress(int(k >> np.uint64(32)).to_bytes(4, "big"), int(k & np.uint64(0xFFFFFFFF))))
        for k in uniq
    ]
    return pa.array(names, pa.string()).take(pa.array(inverse.astype(np.int32)))


class _NotUtf8(Exception):
    """Properties that are not valid UTF-8 (RocketMQ decodes them leniently)."""


_LOOKUPS = (PROPERTY_TAGS, PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, PROPERTY_KEYS)
# Properties with a column of their own: left out of the ``properties`` map.
COLUMN_PROPERTIES = frozenset(_LOOKUPS)
_COLUMN_NAMES = frozenset(x.encode("ascii") for x in _LOOKUPS)


def _parse_properties(
    props: pa.Array | np.ndarray,
) -> tuple[pa.MapArray, pa.Array, pa.Array, pa.Array]:
    """Split ``name\\x01value\\x02...`` strings into a map (without TAGS, UNIQ_KEY and
    KEYS), and look those three up: by one row's template when every row has the
    same layout, by one template per length when the rows have a few
    (:func:`_parse_grouped`), else item by item (:func:`_parse_items`).

    ``props`` is a large_binary array, or the rows of one length as an (n, width)
    byte matrix (:func:`_gather_properties`).
    """
    if isinstance(props, np.ndarray):
        parsed = _parse_rows(props)
        # Rows of one length and one layout parse by template; any others item by item.
        return (
            parsed if parsed is not None else _parse_items(_binary_rows(props, pa.large_binary()))
        )
    parsed = _parse_uniform(props)
    if parsed is None:
        parsed = _parse_grouped(props)
    return parsed if parsed is not None else _parse_items(props)


def _offsets(props: pa.Array) -> tuple[np.ndarray, pa.Buffer | None]:
    """A large_binary array's n + 1 offsets (a view) and its data buffer."""
    _, off_buf, data_buf = props.buffers()
    return (
        np.frombuffer(off_buf, dtype=np.int64, count=len(props) + 1, offset=props.offset * 8),
        data_buf,
    )


_MAX_LENGTHS = 16  # properties lengths in one block that _parse_grouped takes on


def _parse_grouped(props: pa.Array) -> tuple[pa.MapArray, pa.Array, pa.Array, pa.Array] | None:
    """Rows of a few layouts, one per properties length, or None.

    Keys or tags of a few lengths (order numbers of 5 or 6 digits) give rows
    of a few layouts, each of one length: the rows are grouped by length
    (one take), each group parsed by its own template (:func:`_parse_uniform`)
    and the results put back in row order. A group that does not share one
    layout sends the block to the item parser.
    """
    n = len(props)
    off, data_buf = _offsets(props)
    kinds, which = np.unique(np.diff(off), return_inverse=True)
    if not 1 < len(kinds) <= _MAX_LENGTHS or data_buf is None or int(kinds[0]) <= 0:
        return None
    order = np.argsort(which, kind="stable")
    bounds = np.searchsorted(which[order], np.arange(len(kinds) + 1))
    # Before copying the block: a few rows spread over each group must have their
    # separators where the group's first row has them (rows of one length but two
    # layouts, like tag "ab" + key "c" and tag "a" + key "bc", go item by item).
    data = np.frombuffer(data_buf, dtype=np.uint8)
    for g, width in enumerate(kinds.tolist()):
        members = order[bounds[g] : bounds[g + 1]]
        sample = members[np.linspace(0, len(members) - 1, min(8, len(members))).astype(np.int64)]
        rows = data[off[sample][:, None] + np.arange(width)]
        seps = (rows == NAME_VALUE_BYTE) | (rows == PROPERTY_BYTE)
        if not bool((seps == seps[0]).all()):
            return None
    grouped = props.take(pa.array(order))
    parts = []
    for a, b in itertools.pairwise(bounds.tolist()):
        parsed = _parse_uniform(grouped.slice(a, b - a))
        if parsed is None:
            return None
        parts.append(parsed)
    back = np.empty(n, dtype=np.int64)
    back[order] = np.arange(n, dtype=np.int64)
    back_arr = pa.array(back)
    out = [pa.concat_arrays([p[i] for p in parts]).take(back_arr) for i in range(4)]
    return out[0], out[1], out[2], out[3]


def _parse_uniform(props: pa.Array) -> tuple[pa.MapArray, pa.Array, pa.Array, pa.Array] | None:
    """The properties of rows that all share the first row's layout, or None.

    A producer that sets the same properties on every message (UNIQ_KEY is
    always 32 hex digits; a fixed tag) writes strings of one length whose
    names and separators sit at the same places. Then the rows are a byte
    matrix: the names are the first row's, each value a column range, and no
    per-item search is needed. Any other byte 1 or 2 in a row (a separator
    where the first row has none) sends the block to the general parser.
    """
    n = len(props)
    if n == 0:
        return None
    off, data_buf = _offsets(props)
    first = int(off[0])
    width = int(off[1]) - first
    if width <= 0 or int(off[-1]) - first != width * n or data_buf is None:
        return None
    if n > 1 and bool((np.diff(off) != width).any()):
        return None
    data = np.frombuffer(data_buf, dtype=np.uint8, count=width * n, offset=first).reshape(n, width)
    return _parse_rows(data)


def _parse_rows(data: np.ndarray) -> tuple[pa.MapArray, pa.Array, pa.Array, pa.Array] | None:
    """:func:`_parse_uniform` of properties strings of one length, the rows of the
    C-contiguous byte matrix ``data``, or None."""
    n = len(data)
    row0 = data[0].tobytes()
    if row0[-1] != PROPERTY_BYTE:
        return None
    names: list[bytes] = []
    spans: list[tuple[int, int]] = []  # each value's [start, end) within a row
    fixed: list[int] = []  # the columns every row must share with the first
    at = 0
    for item in row0[:-1].split(PROPERTY_SEPARATOR_BYTES):
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR_BYTES)
        if not sep or NAME_VALUE_BYTE in value or not item:
            return None  # an item the general parser must judge
        names.append(name)
        fixed.extend(range(at, at + len(name) + 1))
        spans.append((at + len(name) + 1, at + len(item)))
        fixed.append(at + len(item))
        at += len(item) + 1
    k = len(names)
    # The template's bytes (names and separators) in every row: 8 bytes at a time.
    if len(row0) < 8:
        cols = np.array(fixed, dtype=np.intp)
        if bool((data[:, cols] != data[0, cols]).any()):
            return None
    for at, bits, template in _template_words(row0, fixed):
        column = np.ndarray(shape=(n,), dtype="<u8", buffer=data, offset=at, strides=(len(row0),))
        if not bool(((column & bits) == template).all()):
            return None
    # The template's separators are in every row; exactly k of each means no others.
    if (
        int(np.count_nonzero(data == NAME_VALUE_BYTE)) != k * n
        or int(np.count_nonzero(data == PROPERTY_BYTE)) != k * n
    ):
        return None
    kept = [j for j, x in enumerate(names) if x not in _COLUMN_NAMES]  # the map's items
    if k - len(kept) != len(_COLUMN_NAMES.intersection(names)):
        return None  # TAGS, KEYS or UNIQ_KEY twice: the item parser checks every value
    vlen = [spans[j][1] - spans[j][0] for j in kept]
    if len(kept) == 1:
        value_bytes = _columns(data, *spans[kept[0]])
    else:
        value_bytes = np.empty((n, sum(vlen)), dtype=np.uint8)
        at = 0
        for j in kept:
            a, b = spans[j]
            value_bytes[:, at : at + b - a] = data[:, a:b]
            at += b - a
    item_offsets = (
        np.arange(0, len(kept) * n + 1, len(kept), dtype=np.int32)
        if kept
        else np.zeros(n + 1, dtype=np.int32)
    )
    try:
        kept_names = b"".join(names[j] for j in kept)
        keys = _strings(kept_names * n, [len(names[j]) for j in kept], n, kept_names.isascii())
        values = _strings(value_bytes, vlen, n)
        looked_up = []
        for want in _LOOKUPS:
            raw = want.encode("ascii")
            j = max((i for i, x in enumerate(names) if x == raw), default=-1)
            if j < 0:
                looked_up.append(pa.nulls(n, pa.string()))
            else:
                a, b = spans[j]
                looked_up.append(_strings(_columns(data, a, b), [b - a], n))
    except pa.ArrowInvalid as e:
        raise _NotUtf8(str(e)) from None
    prop_map = pa.MapArray.from_arrays(pa.array(item_offsets), keys, values)
    return prop_map, looked_up[0], looked_up[1], looked_up[2]


def _template_words(row0: bytes, fixed: list[int]) -> list[tuple[int, np.uint64, np.uint64]]:
    """The 8-byte words of a row that hold the ``fixed`` bytes of ``row0``, as (offset,
    mask of the fixed bytes, their value): a row matches the template where
    ``word & mask == value`` for each (a last word may overlap the one before)."""
    width = len(row0)
    if width < 8:
        return []  # no word: the caller compares the bytes
    mask = np.zeros(width, dtype=np.uint8)
    mask[fixed] = 0xFF
    template = np.frombuffer(row0, dtype=np.uint8)
    out = []
    for at in range(0, width, 8):
        a = min(at, width - 8)
        bits = mask[a : a + 8].copy()
        bits[: at - a] = 0  # bytes the word before has compared
        word = bits.view("<u8")[0]
        if word:
            out.append((a, word, template[a : a + 8].view("<u8")[0] & word))
    return out


def _columns(rows: np.ndarray, a: int, b: int) -> np.ndarray:
    """Columns [a, b) of a C-contiguous byte matrix, copied compactly (an item of
    b - a raw bytes a row: ~2x faster than copying the 2-D slice)."""
    n, width = rows.shape
    items = np.ndarray(
        shape=(n,), dtype=np.dtype((np.void, b - a)), buffer=rows, offset=a, strides=(width,)
    )
    return items.copy()


def _strings(data: np.ndarray | bytes, lengths: list[int], n: int, ascii: bool = False) -> pa.Array:
    """n rows of strings of ``lengths`` bytes each, laid end to end in ``data`` (UTF-8
    checked: with one numpy pass when the bytes are ASCII, or known to be)."""
    k = len(lengths)
    total = sum(lengths)
    if k == 1:
        offsets = np.arange(n + 1, dtype=np.int32) * np.int32(total)
    else:
        offsets = np.empty(n * k + 1, dtype=np.int32)
        starts = np.cumsum([0, *lengths[:-1]], dtype=np.int32)
        offsets[:-1].reshape(n, k)[:] = np.arange(n, dtype=np.int32)[:, None] * total + starts
        offsets[-1] = n * total
    raw = data if isinstance(data, bytes) else np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(raw)]
    if ascii or not len(raw) or (not isinstance(raw, bytes) and int(raw.max()) < 0x80):
        return pa.StringArray.from_buffers(n * k, *buffers[1:])
    return pa.BinaryArray.from_buffers(pa.binary(), n * k, buffers).cast(pa.string())


def _parse_items(props: pa.Array) -> tuple[pa.MapArray, pa.Array, pa.Array, pa.Array]:
    """Split ``name\\x01value\\x02...`` strings into a map (vectorised in numpy).

    ``props`` is a compact large_binary array. Returns the map and the TAGS,
    UNIQ_KEY and KEYS values (null where absent). Like the per-record decoder,
    a missing final separator is tolerated, items without a name/value
    separator are skipped, and a repeated name keeps its last value.
    """
    n = len(props)
    off, data_buf = _offsets(props)
    data = (
        np.frombuffer(data_buf, dtype=np.uint8)
        if data_buf is not None
        else np.empty(0, dtype=np.uint8)
    )
    rec_start, rec_end = off[:-1], off[1:]
    sep2 = np.flatnonzero(data[: rec_end[-1] if n else 0] == PROPERTY_BYTE)
    nonempty = rec_end > rec_start
    last_byte = data[np.maximum(rec_end - 1, 0)] if len(data) else np.zeros(n, np.uint8)
    open_rows = np.flatnonzero(nonempty & (last_byte != PROPERTY_BYTE))
    # Item ends (exclusive): every \x02, and the end of a record lacking a final \x02
    # (ordered before a \x02 at the same place, which belongs to the next record).
    ends = np.concatenate((sep2, rec_end[open_rows]))
    order = np.argsort(np.concatenate((2 * sep2 + 1, 2 * rec_end[open_rows])), kind="stable")
    ends = ends[order]
    rows = np.concatenate((np.searchsorted(off, sep2, side="right") - 1, open_rows))[order]
    starts = np.empty_like(ends)
    if len(ends):
        starts[0] = rec_start[rows[0]]
        same = rows[1:] == rows[:-1]
        starts[1:] = np.where(same, ends[:-1] + 1, rec_start[rows[1:]])
    sep1 = np.flatnonzero(data[: rec_end[-1] if n else 0] == NAME_VALUE_BYTE)
    at = np.searchsorted(sep1, starts)
    found = at < len(sep1)
    mid = np.where(found, sep1[np.minimum(at, max(len(sep1) - 1, 0))] if len(sep1) else 0, 0)
    keep = found & (mid < ends)
    starts, mid, ends, rows = starts[keep], mid[keep], ends[keep], rows[keep]
    values_buf = data_buf if data_buf is not None else pa.py_buffer(b"")
    try:
        keys = _cut(values_buf, starts, mid).cast(pa.string())
        values = _cut(values_buf, mid + 1, ends).cast(pa.string())
    except pa.ArrowInvalid as e:
        raise _NotUtf8(str(e)) from None
    klen = mid - starts
    in_map = np.ones(len(rows), dtype=bool)  # items that are not a column's property

    def lookup(name: str) -> pa.Array:
        raw = name.encode("ascii")
        hit = klen == len(raw)
        for j, ch in enumerate(raw):
            hit &= data[np.minimum(starts + j, len(data) - 1)] == ch
        in_map[hit] = False
        where = np.full(n, -1, dtype=np.int64)
        items = np.flatnonzero(hit)
        where[rows[items]] = items  # the last one of a row wins, like a HashMap
        return values.take(pa.array(where, mask=where < 0))

    looked_up = [lookup(name) for name in _LOOKUPS]
    if not in_map.all():
        mask = pa.array(in_map)
        keys, values, rows = keys.filter(mask), values.filter(mask), rows[in_map]
    counts = np.bincount(rows, minlength=n) if len(rows) else np.zeros(n, dtype=np.int64)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    prop_map = pa.MapArray.from_arrays(pa.array(offsets), keys, values)
    return prop_map, looked_up[0], looked_up[1], looked_up[2]


def _split_keys(keys_raw: pa.Array, n: int) -> pa.Array:
    """KEYS texts as lists of keys: split at spaces, empty pieces dropped.

    A producer may write ``"a  b"`` or ``" c"`` (RocketMQ stores KEYS as given);
    its index, MessageExt.keys and pull() skip the empty keys, so the rows do too.
    """
    if keys_raw.null_count == 0 and n and keys_raw.type == pa.string():
        # One key a row (no space, none empty: the usual): the texts are the keys.
        _, off_buf, data_buf = keys_raw.buffers()
        off = np.frombuffer(off_buf, dtype=np.int32, count=n + 1, offset=keys_raw.offset * 4)
        data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else None
        if (
            data is not None
            and not bool((off[1:] == off[:-1]).any())
            and _SPACE not in data[int(off[0]) : int(off[-1])]
        ):
            return pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), keys_raw)
    keys = pc.split_pattern(keys_raw, KEY_SEPARATOR)
    flat = keys.flatten()
    if not len(flat):
        return keys
    lengths = pc.binary_length(flat)
    if pc.min(lengths).as_py() > 0:
        return keys  # the usual case: one pass to know it
    keep = pc.greater(lengths, 0)
    rows = pc.filter(pc.list_parent_indices(keys), keep).to_numpy()
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(rows, minlength=n), out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pc.filter(flat, keep), mask=keys.is_null())


_SPACE = np.uint8(ord(KEY_SEPARATOR))


class _Decoded(NamedTuple):
    """What the vectorised decoder has of a block: the columns are built from it."""

    n: int
    topic: str
    broker_name: str
    queue_id: int  # every header's QUEUEID (checked)
    hdr: np.ndarray
    qoff: np.ndarray  # every header's QUEUEOFFSET (checked), in native order
    phy: np.ndarray
    sys_flag: np.ndarray
    body: pa.Array | None  # None when neither the body column nor its check wanted it
    parsed: tuple[pa.MapArray, pa.Array, pa.Array, pa.Array] | None  # (map, tags, uniq, keys)


def _repeat(text: str, n: int) -> pa.Array:
    """``text`` n times as a string array, its buffers made whole (no take)."""
    raw = text.encode("utf-8")
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(raw))
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(raw * n))


def _micros(millis: np.ndarray) -> pa.Array:
    """Timestamps in ms (a header field) as a :data:`TIMESTAMP` array (µs): one pass."""
    return pa.array(np.multiply(millis, 1000, dtype=np.int64), TIMESTAMP)


# How each column is built from a decoded block; only the wanted ones are called.
_BUILD: dict[str, Callable[[_Decoded], pa.Array]] = {
    "topic": lambda d: _repeat(d.topic, d.n),
    "brokerName": lambda d: _repeat(d.broker_name, d.n),
    "queueId": lambda d: pa.array(np.full(d.n, d.queue_id, dtype=np.int32), pa.int32()),
    "queueOffset": lambda d: pa.array(d.qoff, pa.int64()),
    "msgId": lambda d: _msg_ids(d.hdr, d.phy),
    "uniqKey": lambda d: d.parsed[2],  # type: ignore[index]
    "tags": lambda d: d.parsed[1],  # type: ignore[index]
    "keys": lambda d: _split_keys(d.parsed[3], d.n),  # type: ignore[index]
    "body": lambda d: d.body,
    "properties": lambda d: d.parsed[0],  # type: ignore[index]
    "bornTimestamp": lambda d: _micros(d.hdr["born_ts"]),
    "storeTimestamp": lambda d: _micros(d.hdr["store_ts"]),
    "bornHost": lambda d: _hosts(d.hdr, "born_ip", "born_port"),
    "storeHost": lambda d: _hosts(d.hdr, "store_ip", "store_port"),
    "reconsumeTimes": lambda d: pa.array(d.hdr["reconsume"].astype(np.int32), pa.int32()),
    "commitLogOffset": lambda d: pa.array(d.phy, pa.int64()),
    "flag": lambda d: pa.array(d.hdr["flag"].astype(np.int32), pa.int32()),
    "sysFlag": lambda d: pa.array(d.sys_flag, pa.int32()),
}
assert tuple(_BUILD) == COLUMN_NAMES


def messages_to_batch(
    messages: Sequence[MessageExt], broker_name: str, columns: tuple[str, ...] | None = None
) -> pa.RecordBatch:
    """Return decoded messages as one batch (the per-record path), of ``columns`` only
    when given (:func:`row_schema`)."""
    schema = row_schema(columns)
    if not messages:
        return empty_batch(columns)
    cols = {
        "topic": [m.topic for m in messages],
        "brokerName": [broker_name] * len(messages),
        "queueId": [m.queue_id for m in messages],
        "queueOffset": [m.queue_offset for m in messages],
        "msgId": [m.msg_id for m in messages],
        "uniqKey": [m.uniq_key for m in messages],
        "tags": [m.tags for m in messages],
        "keys": [m.keys if m.properties.get(PROPERTY_KEYS) is not None else None for m in messages],
        "body": [m.body for m in messages],
        "properties": [
            [kv for kv in m.properties.items() if kv[0] not in COLUMN_PROPERTIES] for m in messages
        ],
        "bornTimestamp": [m.born_timestamp * 1000 for m in messages],
        "storeTimestamp": [m.store_timestamp * 1000 for m in messages],
        "bornHost": [str(m.born_host) for m in messages],
        "storeHost": [str(m.store_host) for m in messages],
        "reconsumeTimes": [m.reconsume_times for m in messages],
        "commitLogOffset": [m.commitlog_offset for m in messages],
        "flag": [m.flag for m in messages],
        "sysFlag": [m.sys_flag for m in messages],
    }
    return pa.RecordBatch.from_arrays(
        [pa.array(cols[f.name], f.type) for f in schema], schema=schema
    )


def drop_properties(batch: pa.RecordBatch, names: frozenset[str]) -> pa.RecordBatch:
    """The batch with the properties named ``names`` taken out of every row's map.

    One pass of Arrow kernels over all the map entries (no per-row step); a batch
    that holds none of them is returned as it is.
    """
    i = batch.schema.get_field_index("properties")
    props = batch.column(i)
    if len(props) == 0:
        return batch
    offsets = props.offsets.to_numpy()
    base, end = int(offsets[0]), int(offsets[-1])  # a sliced map's entries are a part
    flat_keys = props.keys.slice(base, end - base)
    drop = pc.is_in(flat_keys, value_set=pa.array(sorted(names), pa.string()))
    if not pc.any(drop).as_py():
        return batch
    keep = pc.invert(drop)
    kept = np.concatenate([[0], np.cumsum(keep.to_numpy(zero_copy_only=False), dtype=np.int32)])
    new_offsets = pa.array(kept[offsets - base], pa.int32())
    mapped = pa.MapArray.from_arrays(
        new_offsets,
        flat_keys.filter(keep),
        props.items.slice(base, end - base).filter(keep),
        mask=props.is_null() if props.null_count else None,
    )
    return batch.set_column(i, batch.schema.field(i), mapped.cast(props.type))


def filter_tags(
    batch: pa.RecordBatch, tags: frozenset[str] | None, columns: tuple[str, ...] | None = None
) -> pa.RecordBatch:
    """Keep rows whose tags are in ``tags`` (all rows when None), and of them the
    ``columns`` (all when None): a tags column decoded for the filter alone
    (:func:`with_tags`) goes."""
    mask = None
    if tags is not None and batch.num_rows:
        mask = pc.is_in(batch.column("tags"), value_set=pa.array(sorted(tags), pa.string()))
    if columns is not None and batch.num_columns != len(columns):
        batch = batch.select(list(columns))
    return batch if mask is None else batch.filter(pc.fill_null(mask, False))


__all__ = [
    "ARROW_SCHEMA",
    "COLUMN_NAMES",
    "COLUMN_PROPERTIES",
    "row_schema",
    "with_tags",
    "empty_batch",
    "records_to_batch",
    "messages_to_batch",
    "filter_tags",
    "V1_MAX_TOPIC_LENGTH",
]

"""The CommitLog record: RocketMQ's message encoding, byte for byte.

Grammar of one record (big-endian, see spec/rocketmq-store-format.md)::

    record      := TOTALSIZE:i32 MAGICCODE:i32 BODYCRC:i32 QUEUEID:i32 FLAG:i32
                   QUEUEOFFSET:i64 PHYSICALOFFSET:i64 SYSFLAG:i32
                   BORNTIMESTAMP:i64 BORNHOST:host STORETIMESTAMP:i64 STOREHOST:host
                   RECONSUMETIMES:i32 PREPAREDTRANSACTIONOFFSET:i64
                   BODYLENGTH:i32 BODY TOPICLENGTH:(i8 | i16 with v2 magic) TOPIC
                   PROPERTIESLENGTH:i16 PROPERTIES
    host        := IPv4:4 bytes PORT:i32 | IPv6:16 bytes PORT:i32 (sysflag bits 0x10 / 0x20)
    blank       := REMAINING:i32 BLANK_MAGIC_CODE:i32     (end-of-segment filler)
    PROPERTIES  := (NAME 0x01 VALUE 0x02)*                 (UTF-8; see ``properties``)

The hot paths (``RecordEncoder.encode`` and ``decode_record``) bind locals and
unpack each fixed part with one precompiled ``struct.Struct`` call.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from rocketspark.errors import (
    CorruptRecordError,
    MessageTooLargeError,
    PropertiesTooLargeError,
    RocketSparkError,
)
from rocketspark.message.model import (
    COMPRESSION_TYPE_MASK,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    CompressionType,
    HostAddress,
    MessageExt,
    SysFlag,
)
from rocketspark.message.properties import decode_properties

MESSAGE_MAGIC_CODE = -626843481  # 0xDAA320A7
MESSAGE_MAGIC_CODE_V2 = -626843477  # 0xDAA320AB: 2-byte topic length
BLANK_MAGIC_CODE = -875286124  # 0xCBD43194
END_FILE_MIN_BLANK_LENGTH = 4 + 4
MAX_PROPERTIES_LENGTH = 32767
V1_MAX_TOPIC_LENGTH = 127

TOTAL_SIZE = struct.Struct(">i")
BLANK = struct.Struct(">ii")  # REMAINING, BLANK_MAGIC_CODE
INT = struct.Struct(">i")
SHORT = struct.Struct(">h")
LONG = struct.Struct(">q")

# Everything before BORNHOST is the same for every host kind.
PRE_HOST = struct.Struct(
    ">i"  # TOTALSIZE
    "i"  # MAGICCODE
    "i"  # BODYCRC
    "i"  # QUEUEID
    "i"  # FLAG
    "q"  # QUEUEOFFSET
    "q"  # PHYSICALOFFSET
    "i"  # SYSFLAG
    "q"  # BORNTIMESTAMP
)
MAGIC_OFFSET = 4
BODY_CRC_OFFSET = 8
QUEUE_ID_OFFSET = 12
QUEUE_OFFSET_OFFSET = struct.calcsize(">iiiii")
PHYSICAL_OFFSET_OFFSET = QUEUE_OFFSET_OFFSET + 8
SYS_FLAG_OFFSET = PHYSICAL_OFFSET_OFFSET + 8
BORN_TIMESTAMP_OFFSET = SYS_FLAG_OFFSET + 4
BORN_HOST_OFFSET = PRE_HOST.size
STORE_TIMESTAMP_OFFSET_V4 = BORN_HOST_OFFSET + 8  # with an IPv4 born host


def _header_struct(born_v6: bool, store_v6: bool) -> struct.Struct:
    born = "16s" if born_v6 else "4s"
    store = "16s" if store_v6 else "4s"
    return struct.Struct(
        ">iiiiiqqiq"  # TOTALSIZE .. BORNTIMESTAMP (PRE_HOST)
        f"{born}i"  # BORNHOST, port
        "q"  # STORETIMESTAMP
        f"{store}i"  # STOREHOST, port
        "i"  # RECONSUMETIMES
        "q"  # PREPARED TRANSACTION OFFSET
        "i"  # BODYLENGTH
    )


# The fixed part of a record with IPv4 hosts as one numpy record (vectorised paths).
HEADER_V4_DTYPE = np.dtype(
    [
        ("total", ">i4"),
        ("magic", ">i4"),
        ("crc", ">i4"),
        ("queue_id", ">i4"),
        ("flag", ">i4"),
        ("queue_offset", ">i8"),
        ("phy", ">i8"),
        ("sys_flag", ">i4"),
        ("born_ts", ">i8"),
        ("born_ip", ">u4"),
        ("born_port", ">i4"),
        ("store_ts", ">i8"),
        ("store_ip", ">u4"),
        ("store_port", ">i4"),
        ("reconsume", ">i4"),
        ("prepared", ">i8"),
        ("body_len", ">i4"),
    ]
)

# HEADERS[(born_v6, store_v6)]: the fixed part up to and including BODYLENGTH.
HEADERS = {(b, s): _header_struct(b, s) for b in (False, True) for s in (False, True)}
HEADER_V4 = HEADERS[(False, False)]
assert HEADER_V4.size == 88 == HEADER_V4_DTYPE.itemsize
# Fixed overhead of a v1 record with IPv4 hosts: header + topic length byte + properties length.
FIXED_OVERHEAD_V4 = HEADER_V4.size + 1 + 2


def record_length(
    body_len: int, topic_len: int, props_len: int, born_v6: bool = False, store_v6: bool = False
) -> int:
    """Return the TOTALSIZE of a record with these variable parts."""
    topic_len_size = 1 if topic_len <= V1_MAX_TOPIC_LENGTH else 2
    return HEADERS[(born_v6, store_v6)].size + body_len + topic_len_size + topic_len + 2 + props_len


def message_id(store_host: HostAddress, commitlog_offset: int) -> str:
    """Return the broker's offset msgId: hex of store IP + port (i32) + offset (i64)."""
    return (store_host.ip + struct.pack(">iq", store_host.port, commitlog_offset)).hex().upper()


def parse_message_id(msg_id: str) -> tuple[HostAddress, int]:
    """Return (store host, commit log offset) of an offset msgId."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise RocketSparkError(f"msgId {msg_id!r} is not hexadecimal") from None
    if len(raw) not in (16, 28):
        raise RocketSparkError(f"msgId {msg_id!r} must be 32 or 56 hex digits, got {len(msg_id)}")
    ip_len = len(raw) - 12
    port, offset = struct.unpack_from(">iq", raw, ip_len)
    return HostAddress(raw[:ip_len], port), offset


class UniqueIdGenerator:
    """Client-side message ids (UNIQ_KEY) shaped like MessageClientIDSetter's.

    16 bytes for IPv4: ip(4) pid(2) instance hash(4) ms since start of month(4)
    counter(2), as 32 upper-case hex characters.
    """

    def __init__(self, ip: bytes = b"\x7f\x00\x00\x01") -> None:
        self._lock = threading.Lock()
        fixed = ip + struct.pack(">hi", os.getpid() & 0x7FFF, id(self) & 0x7FFFFFFF)
        self._prefix = fixed.hex().upper()
        self._counter = 0
        self._month_start_ms = 0
        self._next_month_ms = 0
        self._pid = os.getpid()

    def _roll_month(self, now_ms: int) -> None:
        t = time.localtime(now_ms / 1000)
        start = time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, -1))
        year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
        nxt = time.mktime((year, month, 1, 0, 0, 0, 0, 0, -1))
        self._month_start_ms = int(start * 1000)
        self._next_month_ms = int(nxt * 1000)

    def next_ids(self, n: int, now_ms: int) -> list[str]:
        """Return ``n`` fresh ids."""
        prefix, start = self.next_block(n, now_ms)
        return [f"{prefix}{(start + i) & 0xFFFF:04X}" for i in range(n)]

    def next_block(self, n: int, now_ms: int) -> tuple[str, int]:
        """Reserve ``n`` ids; return their common 28-character prefix and first counter.

        Id i is ``prefix + f"{(start + i) & 0xFFFF:04X}"``.
        """
        with self._lock:
            if os.getpid() != self._pid:  # forked: a new process needs a new prefix
                self.__init__(bytes.fromhex(self._prefix[:8]))  # type: ignore[misc]
            if now_ms >= self._next_month_ms:
                self._roll_month(now_ms)
            diff = (now_ms - self._month_start_ms) & 0xFFFFFFFF
            start = self._counter
            self._counter = (start + n) & 0xFFFF
        return self._prefix + f"{diff:08X}", start


def decompress_body(body: bytes, sys_flag: int, *, offset: int | None = None) -> bytes:
    """Return the body uncompressed when SYSFLAG says it is compressed."""
    if not sys_flag & SysFlag.COMPRESSED:
        return body
    kind = (sys_flag & COMPRESSION_TYPE_MASK) >> 8
    if kind in (0, CompressionType.ZLIB):  # 4.x wrote zlib with no type bits
        try:
            return zlib.decompress(body)
        except zlib.error as exc:
            raise CorruptRecordError(
                f"compressed body does not inflate: {exc}", offset=offset
            ) from None
    raise RocketSparkError(
        f"body at offset {offset} is compressed with {CompressionType(kind).name}, "
        "which rocketspark cannot inflate (only ZLIB is supported)"
    )


def body_crc(body: bytes) -> int:
    """Return BODYCRC: crc32 of the body masked to 31 bits (UtilAll.crc32)."""
    return zlib.crc32(body) & 0x7FFFFFFF


def encode_record(
    *,
    topic: str,
    queue_id: int,
    body: bytes,
    properties: bytes,
    queue_offset: int,
    physical_offset: int,
    born_timestamp: int,
    born_host: HostAddress,
    store_timestamp: int,
    store_host: HostAddress,
    flag: int = 0,
    sys_flag: int = 0,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
    max_message_size: int = 4 * 1024 * 1024,
) -> bytes:
    """Return the CommitLog bytes of one message.

    Raises MessageTooLargeError when the body exceeds ``max_message_size`` and
    PropertiesTooLargeError when the properties exceed 32767 bytes.
    """
    topic_bytes = topic.encode("utf-8")
    check_sizes(topic, len(body), len(properties), max_message_size)
    sys_flag = host_sys_flag(sys_flag, born_host, store_host)
    return _pack(
        HEADERS[(born_host.is_v6, store_host.is_v6)],
        topic_bytes,
        queue_id,
        body,
        properties,
        queue_offset,
        physical_offset,
        born_timestamp,
        born_host,
        store_timestamp,
        store_host,
        flag,
        sys_flag,
        reconsume_times,
        prepared_transaction_offset,
        body_crc(body),
    )


def host_sys_flag(sys_flag: int, born_host: HostAddress, store_host: HostAddress) -> int:
    """Return ``sys_flag`` with the IPv6 bits set to match the hosts."""
    sys_flag &= ~(SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6)
    if born_host.is_v6:
        sys_flag |= SysFlag.BORNHOST_V6
    if store_host.is_v6:
        sys_flag |= SysFlag.STOREHOST_V6
    return sys_flag


HALF_SIZE_NOTE = (
    " as a transactional half message, which adds UNIQ_KEY, PGROUP, "
    "__transactionId__, TRAN_MSG, REAL_TOPIC and REAL_QID (~200 bytes) to "
    "the message's own"
)


def check_sizes(
    topic: str, body_len: int, props_len: int, max_message_size: int, note: str = ""
) -> None:
    """Raise when a message breaks RocketMQ's size limits (``note``: what added to them)."""
    if props_len > MAX_PROPERTIES_LENGTH:
        raise PropertiesTooLargeError(
            f"message properties of topic {topic!r} take {props_len} bytes{note}, "
            f"more than the limit of {MAX_PROPERTIES_LENGTH}"
        )
    if body_len > max_message_size:
        raise MessageTooLargeError(
            f"message body of topic {topic!r} has {body_len} bytes, "
            f"more than maxMessageSize {max_message_size}"
        )
    if len(topic.encode("utf-8")) > 32767:
        raise MessageTooLargeError(f"topic name of {len(topic)} characters is too long")


def _pack(
    header: struct.Struct,
    topic_bytes: bytes,
    queue_id: int,
    body: bytes,
    properties: bytes,
    queue_offset: int,
    physical_offset: int,
    born_timestamp: int,
    born_host: HostAddress,
    store_timestamp: int,
    store_host: HostAddress,
    flag: int,
    sys_flag: int,
    reconsume_times: int,
    prepared_offset: int,
    crc: int,
) -> bytes:
    topic_len = len(topic_bytes)
    v2 = topic_len > V1_MAX_TOPIC_LENGTH
    total = header.size + len(body) + (2 if v2 else 1) + topic_len + 2 + len(properties)
    head = header.pack(
        total,
        MESSAGE_MAGIC_CODE_V2 if v2 else MESSAGE_MAGIC_CODE,
        crc,
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        sys_flag,
        born_timestamp,
        born_host.ip,
        born_host.port,
        store_timestamp,
        store_host.ip,
        store_host.port,
        reconsume_times,
        prepared_offset,
        len(body),
    )
    topic_part = (SHORT.pack(topic_len) if v2 else bytes((topic_len,))) + topic_bytes
    return b"".join((head, body, topic_part, SHORT.pack(len(properties)), properties))


# --- decoding --------------------------------------------------------------------


def _host_len(v6: bool) -> int:
    return 16 if v6 else 4


def decode_record(
    buf: bytes | bytearray | memoryview | mmap.mmap,
    pos: int = 0,
    *,
    file: str | None = None,
    base_offset: int = 0,
    verify_crc: bool = True,
    inflate: bool = True,
) -> MessageExt:
    """Decode the record at ``pos`` of ``buf``.

    ``base_offset`` is the CommitLog offset of ``buf[0]`` and only labels errors.
    Raises CorruptRecordError (never struct.error or IndexError) when the bytes
    are not a whole, valid record.
    """
    where = base_offset + pos
    try:
        total, magic = BLANK.unpack_from(buf, pos)
        if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
            raise CorruptRecordError(
                f"bad MAGICCODE, expected {MESSAGE_MAGIC_CODE:#x} or {MESSAGE_MAGIC_CODE_V2:#x}, "
                f"got {magic & 0xFFFFFFFF:#x}",
                file=file,
                offset=where,
            )
        sys_flag = INT.unpack_from(buf, pos + SYS_FLAG_OFFSET)[0]
        born_v6 = bool(sys_flag & SysFlag.BORNHOST_V6)
        store_v6 = bool(sys_flag & SysFlag.STOREHOST_V6)
        header = HEADERS[(born_v6, store_v6)]
        if total < header.size or pos + total > len(buf):
            raise CorruptRecordError(
                f"TOTALSIZE {total} does not fit (header {header.size}, "
                f"{len(buf) - pos} bytes left)",
                file=file,
                offset=where,
            )
        (
            _,
            _,
            crc,
            queue_id,
            flag,
            queue_offset,
            phy_offset,
            sys_flag,
            born_ts,
            born_ip,
            born_port,
            store_ts,
            store_ip,
            store_port,
            reconsume,
            prepared,
            body_len,
        ) = header.unpack_from(buf, pos)
        p = pos + header.size
        if body_len < 0 or p + body_len > pos + total:
            raise CorruptRecordError(
                f"BODYLENGTH {body_len} overruns TOTALSIZE {total}", file=file, offset=where
            )
        body = bytes(buf[p : p + body_len])
        p += body_len
        if magic == MESSAGE_MAGIC_CODE_V2:
            topic_len = SHORT.unpack_from(buf, p)[0]
            p += 2
        else:
            topic_len = buf[p]
            p += 1
        topic = bytes(buf[p : p + topic_len]).decode("utf-8", "replace")
        p += topic_len
        props_len = SHORT.unpack_from(buf, p)[0]
        p += 2
        if props_len < 0 or p + props_len - pos != total:
            raise CorruptRecordError(
                f"TOTALSIZE {total} disagrees with the lengths of its fields "
                f"(they add up to {p + max(props_len, 0) - pos})",
                file=file,
                offset=where,
            )
        properties = decode_properties(buf[p : p + props_len])
    except (struct.error, IndexError, ValueError) as exc:
        if isinstance(exc, CorruptRecordError):
            raise
        raise CorruptRecordError(f"truncated record: {exc}", file=file, offset=where) from None
    if verify_crc and body_crc(body) != crc:
        raise body_crc_error(crc, body_crc(body), file=file, offset=where)
    if inflate:
        body = decompress_body(body, sys_flag, offset=where)
    store_host = HostAddress(store_ip, store_port)
    return MessageExt(
        topic=topic,
        queue_id=queue_id,
        queue_offset=queue_offset,
        commitlog_offset=phy_offset,
        msg_id=message_id(store_host, phy_offset),
        body=body,
        properties=properties,
        born_timestamp=born_ts,
        store_timestamp=store_ts,
        born_host=HostAddress(born_ip, born_port),
        store_host=store_host,
        reconsume_times=reconsume,
        sys_flag=sys_flag,
        flag=flag,
        body_crc=crc,
        store_size=total,
        prepared_transaction_offset=prepared,
    )


def body_crc_error(
    stored: int, computed: int, *, file: str | None, offset: int
) -> CorruptRecordError:
    """The error of a record whose body does not match its BODYCRC field."""
    return CorruptRecordError(
        f"body CRC mismatch: BODYCRC field {stored}, CRC of the body {computed}",
        file=file,
        offset=offset,
    )


def header_mismatch(
    msg: MessageExt,
    offset: int,
    *,
    size: int | None = None,
    topic: str | None = None,
    queue_id: int | None = None,
    queue_offset: int | None = None,
) -> str | None:
    """Say which header field shows that the record read at CommitLog ``offset`` is not
    the one that led there, or return None: its PHYSICALOFFSET must be ``offset``, and
    its TOTALSIZE, topic, QUEUEID and QUEUEOFFSET those given (a ConsumeQueue entry's).

    These fields have no checksum; comparing them with what pointed at the record
    keeps a damaged header from passing for another message.
    """
    if msg.commitlog_offset != offset:
        return f"PHYSICALOFFSET {msg.commitlog_offset} is not the offset it was read at"
    if size is not None and msg.store_size != size:
        return f"TOTALSIZE {msg.store_size} is not the ConsumeQueue entry's size {size}"
    if topic is not None and msg.topic != topic:
        return f"topic {msg.topic!r} is not {topic!r}, whose ConsumeQueue points at it"
    if queue_id is not None and msg.queue_id != queue_id:
        return f"QUEUEID {msg.queue_id} is not {queue_id}, whose ConsumeQueue points at it"
    if queue_offset is not None and msg.queue_offset != queue_offset:
        return (
            f"QUEUEOFFSET {msg.queue_offset} is not {queue_offset}, the ConsumeQueue "
            "offset that points at it"
        )
    return None


# Results of check_record (besides a positive size).
RECORD_BLANK = 0  # the end-of-segment filler
RECORD_END = -1  # zero bytes: nothing written here yet
RECORD_INVALID = -2  # a torn or corrupt record


@dataclass(frozen=True, slots=True)
class RecordCheck:
    """What recovery learns from the bytes at one position."""

    size: int  # > 0 record size; or RECORD_BLANK / RECORD_END / RECORD_INVALID
    reason: str = ""
    queue_id: int = 0
    queue_offset: int = 0
    store_timestamp: int = 0
    sys_flag: int = 0
    topic: str = ""
    tags: str | None = None
    uniq_key: str | None = None
    keys: str | None = None
    properties: Mapping[str, str] | None = None
    prepared_transaction_offset: int = 0


def check_record(
    buf: bytes | bytearray | memoryview | mmap.mmap,
    pos: int,
    expected_offset: int,
    *,
    verify_crc: bool = True,
) -> RecordCheck:
    """Validate the record at ``pos`` as recovery does, never raising.

    A record is valid when its magic is v1/v2, its fields add up to TOTALSIZE,
    its PHYSICALOFFSET equals ``expected_offset`` and its body CRC matches.
    """
    if pos + 8 > len(buf):
        return RecordCheck(
            RECORD_END if pos >= len(buf) else RECORD_INVALID, "segment ends inside a record header"
        )
    total, magic = BLANK.unpack_from(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        return RecordCheck(RECORD_BLANK)
    if total == 0 and magic == 0:
        return RecordCheck(RECORD_END)
    try:
        msg = decode_record(
            buf, pos, base_offset=expected_offset - pos, verify_crc=verify_crc, inflate=False
        )
    except CorruptRecordError as exc:
        return RecordCheck(RECORD_INVALID, str(exc))
    if msg.commitlog_offset != expected_offset:
        return RecordCheck(
            RECORD_INVALID,
            f"PHYSICALOFFSET {msg.commitlog_offset} differs from position {expected_offset}",
        )
    props = msg.properties
    return RecordCheck(
        msg.store_size,
        queue_id=msg.queue_id,
        queue_offset=msg.queue_offset,
        store_timestamp=msg.store_timestamp,
        sys_flag=msg.sys_flag,
        topic=msg.topic,
        tags=props.get(PROPERTY_TAGS),
        uniq_key=props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX),
        keys=props.get(PROPERTY_KEYS),
        properties=props,
        prepared_transaction_offset=msg.prepared_transaction_offset,
    )

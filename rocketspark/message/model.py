"""Messages as a producer hands them in and as the store hands them out.

Property names, system flags and the tag hash follow Apache RocketMQ's
``MessageConst``, ``MessageSysFlag`` and ``String.hashCode`` exactly, since they
end up in the on-disk bytes.
"""

from __future__ import annotations

import enum
import ipaddress
import itertools
import numbers
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from rocketspark.errors import ConfigError, InvalidMessageError

# --- MessageConst property names ------------------------------------------------
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_MIN_OFFSET = "MIN_OFFSET"
# What a broker stamps on every message it stores (SendMessageProcessor): its
# cluster, region and trace switch. They describe the broker, not the message.
PROPERTY_CLUSTER = "CLUSTER"
PROPERTY_MSG_REGION = "MSG_REGION"
PROPERTY_TRACE_SWITCH = "TRACE_ON"
BROKER_STAMPED_PROPERTIES = frozenset(
    {PROPERTY_CLUSTER, PROPERTY_MSG_REGION, PROPERTY_TRACE_SWITCH}
)
PROPERTY_MAX_OFFSET = "MAX_OFFSET"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
PROPERTY_TRANSACTION_ID = "__transactionId__"
PROPERTY_TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_SHARDING_KEY = "__SHARDINGKEY"
PROPERTY_DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
PROPERTY_DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_CONSUME_START_TIMESTAMP = "CONSUME_START_TIME"

KEY_SEPARATOR = " "
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

# Properties the store itself sets; a producer passes them through ``tags`` /
# ``keys`` / ``delay_level`` instead.
# System properties a message's own fields set: as a user property (RocketMQ's
# putUserProperty refuses them too) the record would say one tag while its
# ConsumeQueue entry filters by another, or carry keys the index never saw.
RESERVED_PROPERTIES = frozenset({PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_DELAY_TIME_LEVEL})


# On a half message a check put back: the queue offset of the half its producer was
# given (ours; see transaction.py). Only the store writes it: a prepare refuses it,
# and a commit drops it.
PROPERTY_FIRST_HALF = "RS_FIRST_HALF"
FIRST_HALF_ERROR = (
    f"property {PROPERTY_FIRST_HALF!r} is the store's own record of a "
    "half message a transaction check put back; a prepare does not take it "
    "(drop it from properties copied from another message)"
)
# On a transaction op record (ours; RocketMQ ignores them, and its own op records lack
# them): how the op resolved its halves (commit, rollback, or putback: closed by a
# check that stored them again), and for a putback the half queue offset of the
# first new copy (see transaction.py).
PROPERTY_RESOLUTION = "RS_RESOLUTION"
PROPERTY_MOVED_TO = "RS_MOVED_TO"


# What a prepare sets on each half (see transaction.py).
PREPARE_PROPERTIES = frozenset(
    {
        PROPERTY_PRODUCER_GROUP,
        PROPERTY_TRANSACTION_ID,
        PROPERTY_TRANSACTION_PREPARED,
        PROPERTY_REAL_TOPIC,
        PROPERTY_REAL_QUEUE_ID,
        PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    }
)


def check_extra_properties(extra: Mapping[str, str] | None) -> None:
    """Properties a transactional prepare adds to every half: user properties too."""
    if extra is not None and not isinstance(extra, Mapping):
        raise ConfigError(
            f"extra properties must be a mapping of names to values, got {type(extra).__name__}"
        )
    for k, v in (extra or {}).items():
        if not k or any(c in str(t) for t in (k, v) for c in "\x01\x02"):
            raise ConfigError(
                f"extra property {k!r}: empty name, or a \\x01 / \\x02 "
                "separator in its name or value"
            )
        _check_property_text("name", k, "extra property: ")
        _check_property_text("value", v, f"extra property {k!r}: ")
        if k in RESERVED_PROPERTIES:
            raise ConfigError(reserved_property_error(k, "extra property"))
        if k in PREPARE_PROPERTIES:
            # one value for every half: it would move them to another producer group,
            # give them one message id, or undo what the prepare itself records
            raise ConfigError(f"extra property {k!r} is set by the prepare itself")
        if k == PROPERTY_FIRST_HALF:
            raise ConfigError(f"extra {FIRST_HALF_ERROR}")


def reserved_property_error(name: str, where: str = "message property") -> str:
    """The error for a user property that a message field sets (RESERVED_PROPERTIES)."""
    return (
        f"{where} {name!r} is set from the message's tags, keys or delay level; "
        "give it there, not as a property"
    )


# --- well-known system topics (TopicValidator) -----------------------------------
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
# RocketMQ's own topics (TopicValidator): never subscribed by a pattern, never written
# by a user's producer.
SYSTEM_TOPIC_PREFIXES = ("RMQ_SYS_", "SCHEDULE_TOPIC_", "rmq_sys_")
SYSTEM_TOPICS = frozenset({"TBW102", "BenchmarkTest", "OFFSET_MOVED_EVENT", "SELF_TEST_TOPIC"})
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
TRANS_OP_REMOVE_TAG = "d"


class SysFlag(enum.IntFlag):
    """MessageSysFlag bits as stored in the record's SYSFLAG field."""

    COMPRESSED = 0x1
    MULTI_TAGS = 0x2
    TRANSACTION_PREPARED = 0x4
    TRANSACTION_COMMIT = 0x8
    TRANSACTION_ROLLBACK = 0xC
    BORNHOST_V6 = 0x10
    STOREHOST_V6 = 0x20
    NEED_UNWRAP = 0x40
    INNER_BATCH = 0x80


TRANSACTION_TYPE_MASK = 0xC
COMPRESSION_TYPE_MASK = 0x700  # bits 8-10


class CompressionType(enum.IntEnum):
    """Compression type in SYSFLAG bits 8-10 (when COMPRESSED is set)."""

    LZ4 = 1
    ZSTD = 2
    ZLIB = 3


def transaction_type(sys_flag: int) -> int:
    """Return the transaction bits (0, PREPARED, COMMIT or ROLLBACK) of ``sys_flag``."""
    return sys_flag & TRANSACTION_TYPE_MASK


def retry_topic(group: str) -> str:
    """Return the retry topic name of a consumer group."""
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    """Return the dead-letter topic name of a consumer group."""
    return DLQ_GROUP_TOPIC_PREFIX + group


def _check_property_text(kind: str, text: str, where: str = "") -> None:
    if text.__class__ is str and text.isascii() and "\x01" not in text and "\x02" not in text:
        return  # the common case, in one test
    if not isinstance(text, str):
        raise InvalidMessageError(f"{where}message property {kind} {text!r} must be a string")
    if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
        raise InvalidMessageError(
            f"{where}message property {kind} {text!r} contains a \\x01 or \\x02 separator character"
        )
    if not text.isascii():
        check_utf8(f"message property {kind}", text, where)


def check_utf8(field: str, text: str, where: str = "") -> None:
    """Raise InvalidMessageError naming ``field`` unless ``text`` encodes as UTF-8.

    Only lone surrogates (e.g. from ``surrogateescape``) do not: RocketMQ
    stores properties and bodies as UTF-8.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidMessageError(
            f"{where}{field} {text!r} does not encode as UTF-8 ({e.reason} at character {e.start})"
        ) from None


# Java's int and long: FLAG and RECONSUMETIMES are 4-byte, BORNTIMESTAMP 8-byte fields.
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MAX = (1 << 63) - 1


def check_int(field: str, value: Any, lo: int, hi: int, where: str = "") -> int:
    """Return ``value`` as an int in [lo, hi], else raise InvalidMessageError naming it."""
    if value.__class__ is not int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise InvalidMessageError(f"{where}{field} must be an integer, got {value!r}")
        value = int(value)
    if not lo <= value <= hi:
        raise InvalidMessageError(f"{where}{field} {value} is outside [{lo}, {hi}]")
    return value


EMPTY_BODY_ERROR = (
    "the message body length is zero (RocketMQ's producer refuses empty "
    "bodies, and its consumers stop at them)"
)


def message_body(body: Any, where: str = "") -> bytes:
    """Return ``body`` (bytes, str or another bytes-like object) as non-empty bytes.

    Raises InvalidMessageError for None, other types, a str that does not
    encode as UTF-8 and an empty body, as RocketMQ's producer does.
    """
    if body.__class__ is not bytes:
        if isinstance(body, str):
            check_utf8("str body", body, where)
            body = body.encode("utf-8")
        elif body is None:
            raise InvalidMessageError(f"{where}the message body is null")
        else:
            try:
                body = bytes(memoryview(body))
            except TypeError:  # an int would be bytes(int): that many zero bytes
                raise InvalidMessageError(
                    f"{where}body must be bytes, a bytes-like object or str, got "
                    f"{type(body).__name__}"
                ) from None
    if not body:
        raise InvalidMessageError(f"{where}{EMPTY_BODY_ERROR}")
    return body


def user_properties(
    props: Any, where: str = "", reserved: frozenset[str] = RESERVED_PROPERTIES
) -> dict[str, str]:
    """Return ``props`` (a mapping or (name, value) pairs) as a checked dict.

    Raises InvalidMessageError, prefixed by ``where``, unless every name and
    value is a string that encodes as UTF-8 without a \\x01 / \\x02 separator,
    no name is empty and none is in ``reserved``.
    """
    try:
        if isinstance(props, (str, bytes, bytearray, memoryview)):
            raise TypeError
        props = dict(props)
    except (TypeError, ValueError):
        raise InvalidMessageError(
            f"{where}properties must be a mapping or (name, value) pairs, got {props!r}"
        ) from None
    for name, value in props.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise InvalidMessageError(
                f"{where}message property {name!r}: names and values must be strings"
            )
        if not name:
            raise InvalidMessageError(f"{where}message property names must not be empty")
        if name in reserved:
            raise InvalidMessageError(where + reserved_property_error(name))
        _check_property_text("name", name, where)
        _check_property_text("value", value, where)
    return props


_EMPTY: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Message:
    """A message to put: what a RocketMQ producer sends.

    ``keys`` may be one string (several keys separated by spaces, as RocketMQ
    stores them) or an iterable of strings. ``properties`` are user
    properties; ``tags``, ``keys`` and ``delay_level`` go into the system
    properties TAGS, KEYS and DELAY. ``queue_id`` pins the queue;
    ``sharding_key`` picks one by hash (same key, same queue); otherwise the
    store picks round-robin.
    """

    topic: str
    body: bytes
    tags: str | None = None
    keys: tuple[str, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    flag: int = 0
    delay_level: int = 0
    queue_id: int | None = None
    sharding_key: str | None = None
    born_timestamp: int | None = None
    reconsume_times: int = 0

    def __post_init__(self) -> None:
        # Every field a caller gives is checked here, once, so that every put path
        # (per record or columnar) refuses the same messages before taking a queue
        # offset; what depends on the store (topic, queue count, sizes, the
        # configured delay levels) is checked by the store before it writes.
        if self.topic.__class__ is not str and not isinstance(self.topic, str):
            raise InvalidMessageError(f"topic must be a string, got {self.topic!r}")
        body = self.body
        if body.__class__ is not bytes or not body:
            object.__setattr__(self, "body", message_body(body, f"topic {self.topic!r}: "))
        keys: Any = self.keys
        if isinstance(keys, str):
            keys = tuple(k for k in keys.split(KEY_SEPARATOR) if k)
        elif keys is None:
            keys = ()
        elif keys.__class__ is list:
            keys = tuple(keys)  # the common case, without the ABC checks below
        elif not isinstance(keys, tuple):
            # bytes would be keys of numbers, a mapping its names: refused, as put_columns does
            if isinstance(keys, (bytes, bytearray, memoryview, Mapping)) or not isinstance(
                keys, Iterable
            ):
                raise InvalidMessageError(
                    f"keys must be a string or an iterable of strings, got {keys!r}"
                )
            keys = tuple(keys)
        for k in keys:
            if not isinstance(k, str) or not k or KEY_SEPARATOR in k:
                raise InvalidMessageError(
                    f"message key {k!r} must be a non-empty string without spaces"
                )
            _check_property_text("key", k)
        if keys is not self.keys:
            object.__setattr__(self, "keys", keys)
        tags = self.tags
        if tags is not None and not (
            tags.__class__ is str and tags.isascii() and "\x01" not in tags and "\x02" not in tags
        ):
            _check_property_text("tags", tags)
        props = self.properties
        if props.__class__ is dict and not props:
            pass  # the default
        elif props.__class__ is dict:
            # the common case in a few C-level scans: ASCII strings without separators,
            # no name empty or reserved; anything else is user_properties' to judge
            try:
                text = "".join(props) + "".join(props.values())
            except TypeError:  # not all strings
                text = "\x01"
            if (
                text.isascii()
                and "\x01" not in text
                and "\x02" not in text
                and "" not in props
                and RESERVED_PROPERTIES.isdisjoint(props)
            ):
                object.__setattr__(self, "properties", MappingProxyType(props.copy()))
            else:
                object.__setattr__(self, "properties", MappingProxyType(user_properties(props)))
        elif props is None:
            object.__setattr__(self, "properties", _EMPTY)
        elif self.properties or not isinstance(self.properties, (Mapping, list, tuple)):
            object.__setattr__(
                self, "properties", MappingProxyType(user_properties(self.properties))
            )
        flag, level, times = self.flag, self.delay_level, self.reconsume_times
        if (
            flag.__class__ is not int
            or level.__class__ is not int
            or times.__class__ is not int
            or flag != 0
            or level != 0
            or times != 0
        ):
            self._check_ints(flag, level, times)
        if self.born_timestamp is not None and (
            self.born_timestamp.__class__ is not int or not 0 <= self.born_timestamp <= INT64_MAX
        ):
            object.__setattr__(
                self,
                "born_timestamp",
                check_int(
                    "born_timestamp (milliseconds since the epoch)",
                    self.born_timestamp,
                    0,
                    INT64_MAX,
                ),
            )
        if self.queue_id is not None and self.queue_id.__class__ is not int:
            # the range depends on the topic: the store checks it (OffsetOutOfRangeError)
            object.__setattr__(
                self, "queue_id", check_int("queue_id", self.queue_id, -INT64_MAX, INT64_MAX)
            )
        if self.sharding_key is not None and not isinstance(self.sharding_key, str):
            raise InvalidMessageError(f"sharding_key must be a string, got {self.sharding_key!r}")

    def _check_ints(self, flag: Any, level: Any, times: Any) -> None:
        """flag, delay_level and reconsume_times other than all three 0."""
        if flag.__class__ is not int or not INT32_MIN <= flag <= INT32_MAX:
            object.__setattr__(self, "flag", check_int("flag", flag, INT32_MIN, INT32_MAX))
        if level.__class__ is not int or level < 0:
            object.__setattr__(self, "delay_level", check_int("delay_level", level, 0, INT32_MAX))
        if times.__class__ is not int or not 0 <= times <= INT32_MAX:
            object.__setattr__(
                self, "reconsume_times", check_int("reconsume_times", times, 0, INT32_MAX)
            )

    def all_properties(self) -> dict[str, str]:
        """Return the properties as stored: user properties plus TAGS, KEYS, DELAY."""
        from rocketspark.message.properties import message_properties  # imports this module

        return message_properties(
            self.properties, tags=self.tags, keys=self.keys, delay_level=self.delay_level
        )


def check_messages(messages: Iterable[object]) -> list[Message] | tuple[Message, ...]:
    """Return ``messages`` as a list or tuple of Messages (which checked their fields when
    made); raise InvalidMessageError naming the first that is not one."""
    if not isinstance(messages, (list, tuple)):
        messages = list(messages)
    if not all(map(isinstance, messages, itertools.repeat(Message))):
        i = next(i for i, m in enumerate(messages) if not isinstance(m, Message))
        raise InvalidMessageError(
            f"message {i}: expected a rocketspark Message, got {type(messages[i]).__name__}"
        )
    return messages  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class HostAddress:
    """A host as RocketMQ stores it: raw IP bytes (4 or 16) and a port."""

    ip: bytes
    port: int

    @property
    def is_v6(self) -> bool:
        return len(self.ip) == 16

    @classmethod
    def parse(cls, host: str, port: int) -> HostAddress:
        """Return the address of ``host`` (an IPv4 or IPv6 literal, or a resolvable name)."""
        try:
            addr = ipaddress.ip_address(host)
        except ValueError:
            addr = ipaddress.ip_address(socket.gethostbyname(host))
        return cls(addr.packed, port)

    def __str__(self) -> str:
        addr = ipaddress.ip_address(self.ip)
        return f"[{addr}]:{self.port}" if self.is_v6 else f"{addr}:{self.port}"


@dataclass(frozen=True, slots=True)
class MessageExt:
    """A stored message with every field of its CommitLog record."""

    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    msg_id: str
    body: bytes
    properties: Mapping[str, str]
    born_timestamp: int
    store_timestamp: int
    born_host: HostAddress
    store_host: HostAddress
    reconsume_times: int
    sys_flag: int
    flag: int
    body_crc: int
    store_size: int
    prepared_transaction_offset: int = 0

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(PROPERTY_KEYS)
        return [k for k in raw.split(KEY_SEPARATOR) if k] if raw else []

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)

    @property
    def delay_level(self) -> int:
        return int(self.properties.get(PROPERTY_DELAY_TIME_LEVEL, "0") or 0)


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic's queue counts and permissions (RocketMQ's TopicConfig)."""

    name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    order: bool


def normalise_keys(keys: Iterable[str] | str | None) -> tuple[str, ...]:
    """Return keys as a tuple, splitting a space-separated string."""
    if keys is None:
        return ()
    if isinstance(keys, str):
        return tuple(k for k in keys.split(KEY_SEPARATOR) if k)
    return tuple(keys)


def is_system_topic(name: str) -> bool:
    """Is ``name`` one of RocketMQ's own topics (transactions, delays, ...)?"""
    return name in SYSTEM_TOPICS or name.startswith(SYSTEM_TOPIC_PREFIXES)


@dataclass(frozen=True, order=True)
class MessageQueue:
    """A queue of a topic on a broker: RocketMQ's MessageQueue (what one input partition reads)."""

    topic: str
    broker: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.broker}/{self.queue_id}"


# Our own properties of the Spark side (not RocketMQ's): the exactly-once sink that wrote
# a half message, and the local property Spark's stream execution gives a micro-batch's
# tasks: the query id, which the checkpoint keeps across restarts (a new checkpoint, a
# new id).
PROPERTY_SINK_ID = "RS_SINK"
# The task attempt that wrote a half message on a cluster (a check-back names it).
PROPERTY_WRITER_ID = "RS_WRITER"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
# Our own properties of dead letters (deadletter.py): why a message failed and when it
# first did, on a message sent back; on a replayed dead letter, that it is one and the
# replay that sent it.
PROPERTY_FAILURE_REASON = "RS_FAILURE_REASON"
PROPERTY_FIRST_FAILURE = "RS_FIRST_FAILURE_MS"
PROPERTY_REPLAY = "RS_REPLAY"
PROPERTY_REPLAY_ID = "RS_REPLAY_ID"


class TransactionState(enum.Enum):
    """A producer's answer about one of its transactions (RocketMQ's LocalTransactionState).

    The values are the names END_TRANSACTION and the check-back carry on the wire.
    """

    COMMIT = "COMMIT_MESSAGE"
    ROLLBACK = "ROLLBACK_MESSAGE"
    UNKNOWN = "UNKNOW"


def answer_state(answer: TransactionState | str | bool | None) -> TransactionState:
    """Return the TransactionState a producer's answer means, as every backend reads it.

    A TransactionState is itself; True is COMMIT, False ROLLBACK, None UNKNOWN; a text
    starting with COMMIT or ROLLBACK (any case: a state's name or its wire value) is
    that state; anything else is UNKNOWN (the half stays open).
    """
    if isinstance(answer, TransactionState):
        return answer
    if answer is True:
        return TransactionState.COMMIT
    if answer is False:
        return TransactionState.ROLLBACK
    if answer is None:
        return TransactionState.UNKNOWN
    text = str(answer).upper()
    if text.startswith("COMMIT"):
        return TransactionState.COMMIT
    if text.startswith("ROLLBACK"):
        return TransactionState.ROLLBACK
    return TransactionState.UNKNOWN

"""The PROPERTIES field of a CommitLog record: the one description of its layout.

Grammar (UTF-8; RocketMQ's ``MessageDecoder.messageProperties2String``)::

    PROPERTIES  := (NAME 0x01 VALUE 0x02)*
    NAME, VALUE := text without 0x01 or 0x02

Readers tolerate a missing final 0x02, skip items without a 0x01 and keep the
last value of a name given twice (RocketMQ's ``string2messageProperties``).

The order in which rocketspark writes the properties of a message is part of
its on-disk bytes (every put path writes the same bytes for the same message,
and the vectorised transaction commit depends on it):

1. the user's properties, in the order given;
2. then ``MESSAGE_ORDER``: TAGS, KEYS, DELAY (each when set), and UNIQ_KEY
   (the generated id, unless the user properties named one);
3. a delayed message: DELAY holds the level, then REAL_TOPIC and REAL_QID
   (``DELAYED_TAIL``) name where it is due;
4. a transactional half message: ``HALF_HEAD`` (PGROUP, __transactionId__ = the
   UNIQ_KEY), the prepare's extra properties, then ``HALF_TAIL`` (TRAN_MSG=true,
   REAL_TOPIC, REAL_QID) last.

The half / commit prefix rule: committing a half drops ``HALF_TAIL`` (and the
store's own RS_FIRST_HALF), so the committed record's properties are the half's
bytes before :data:`HALF_COMMIT_MARKER` (for a half as prepared: a check's
put-back copy appends TRANSACTION_CHECK_TIMES and RS_FIRST_HALF after the tail).
:func:`committed_properties` is that rule for one message; the vectorised commit
cuts the same prefix out of many records at once with the byte templates here.

Encoders take their ``NAME\\x01`` prefixes from this module (``*_PREFIX`` as
``str`` for the encoders that build text and encode once, ``*_PREFIX_BYTES`` for
byte templates) instead of typing property names into templates.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rocketspark.message.model import (
    KEY_SEPARATOR,
    NAME_VALUE_SEPARATOR,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_FIRST_HALF,
    PROPERTY_KEYS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
)

__all__ = [
    "DELAYED_TAIL",
    "HALF_COMMIT_MARKER",
    "HALF_HEAD",
    "HALF_TAIL",
    "MESSAGE_ORDER",
    "NAME_VALUE_BYTE",
    "NAME_VALUE_SEPARATOR",
    "NAME_VALUE_SEPARATOR_BYTES",
    "PROPERTY_BYTE",
    "PROPERTY_SEPARATOR",
    "PROPERTY_SEPARATOR_BYTES",
    "committed_properties",
    "decode_properties",
    "encode_properties",
    "half_properties",
    "message_properties",
    "prefix",
    "properties_text",
]

# The separators (NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR from model, re-exported
# here with the layout) as byte values (0x01, 0x02) for byte-level scans, and as
# bytes for byte templates and splits.
NAME_VALUE_BYTE = ord(NAME_VALUE_SEPARATOR)
PROPERTY_BYTE = ord(PROPERTY_SEPARATOR)
PROPERTY_SEPARATOR_BYTES = PROPERTY_SEPARATOR.encode("ascii")
NAME_VALUE_SEPARATOR_BYTES = NAME_VALUE_SEPARATOR.encode("ascii")
TRUE = "true"  # TRAN_MSG's value on a half message


def prefix(name: str) -> str:
    """Return ``NAME\\x01``: what precedes property ``name``'s value in the field."""
    return name + NAME_VALUE_SEPARATOR


# --- the order -----------------------------------------------------------------------

# After the user properties, in this order (each when set).
MESSAGE_ORDER = (
    PROPERTY_TAGS,
    PROPERTY_KEYS,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
)
# A delayed message (in SCHEDULE_TOPIC_XXXX): where it is due, after MESSAGE_ORDER.
DELAYED_TAIL = (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID)
# A half message: after MESSAGE_ORDER, then the prepare's extra properties, then HALF_TAIL.
HALF_HEAD = (PROPERTY_PRODUCER_GROUP, PROPERTY_TRANSACTION_ID)
# What a commit drops; last, so that the committed properties are a prefix of the half's.
HALF_TAIL = (PROPERTY_TRANSACTION_PREPARED, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID)

# --- NAME\x01 prefixes -----------------------------------------------------------------

TAGS_PREFIX = prefix(PROPERTY_TAGS)
KEYS_PREFIX = prefix(PROPERTY_KEYS)
DELAY_PREFIX = prefix(PROPERTY_DELAY_TIME_LEVEL)
UNIQ_KEY_PREFIX = prefix(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
PRODUCER_GROUP_PREFIX = prefix(PROPERTY_PRODUCER_GROUP)
TRANSACTION_ID_PREFIX = prefix(PROPERTY_TRANSACTION_ID)
TRANSACTION_PREPARED_PREFIX = prefix(PROPERTY_TRANSACTION_PREPARED)
REAL_TOPIC_PREFIX = prefix(PROPERTY_REAL_TOPIC)
REAL_QUEUE_ID_PREFIX = prefix(PROPERTY_REAL_QUEUE_ID)

TAGS_PREFIX_BYTES = TAGS_PREFIX.encode("ascii")
KEYS_PREFIX_BYTES = KEYS_PREFIX.encode("ascii")
UNIQ_KEY_PREFIX_BYTES = UNIQ_KEY_PREFIX.encode("ascii")
PRODUCER_GROUP_PREFIX_BYTES = PRODUCER_GROUP_PREFIX.encode("ascii")
TRANSACTION_ID_PREFIX_BYTES = TRANSACTION_ID_PREFIX.encode("ascii")

# Where a half's committed prefix ends: TRAN_MSG=true, then REAL_TOPIC's prefix (the
# topic, then REAL_QUEUE_ID_SEPARATOR and the queue id follow).
HALF_COMMIT_MARKER_TEXT = (
    f"{TRANSACTION_PREPARED_PREFIX}{TRUE}{PROPERTY_SEPARATOR}{REAL_TOPIC_PREFIX}"
)
HALF_COMMIT_MARKER = HALF_COMMIT_MARKER_TEXT.encode("ascii")
REAL_QUEUE_ID_SEPARATOR_TEXT = PROPERTY_SEPARATOR + REAL_QUEUE_ID_PREFIX
REAL_QUEUE_ID_SEPARATOR = REAL_QUEUE_ID_SEPARATOR_TEXT.encode("ascii")


def half_head_text(producer_group: str) -> str:
    """Return ``PGROUP\\x01<group>\\x02__transactionId__\\x01``: the text after a half's
    UNIQ_KEY item, up to its transaction id (the UNIQ_KEY again)."""
    return f"{PRODUCER_GROUP_PREFIX}{producer_group}{PROPERTY_SEPARATOR}{TRANSACTION_ID_PREFIX}"


def half_tail_text(real_topic: str, real_queue_id: int | str) -> str:
    """Return the HALF_TAIL items of a half bound for ``real_topic`` / ``real_queue_id``."""
    return (
        f"{HALF_COMMIT_MARKER_TEXT}{real_topic}{REAL_QUEUE_ID_SEPARATOR_TEXT}"
        f"{real_queue_id}{PROPERTY_SEPARATOR}"
    )


# --- encode / decode -------------------------------------------------------------------


def properties_text(props: Mapping[str, str]) -> str:
    """Return ``props`` as the field's text (not yet UTF-8), in their order."""
    return "".join(f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in props.items())


def encode_properties(props: Mapping[str, str]) -> bytes:
    """Return properties as RocketMQ's messageProperties2String writes them."""
    if not props:
        return b""
    return properties_text(props).encode("utf-8")


def decode_properties(raw: bytes | bytearray | memoryview) -> dict[str, str]:
    """Return the properties of a record; tolerates a missing final separator."""
    if not raw:
        return {}
    text = bytes(raw).decode("utf-8", "replace")
    out: dict[str, str] = {}
    for item in text.split(PROPERTY_SEPARATOR):
        if not item:
            continue
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep:
            out[name] = value
    return out


# --- the order, one message at a time ------------------------------------------------------


def message_properties(
    user: Mapping[str, str],
    *,
    tags: str | None = None,
    keys: Iterable[str] = (),
    delay_level: int = 0,
) -> dict[str, str]:
    """Return a message's stored properties before its UNIQ_KEY: ``user``, then TAGS,
    KEYS and DELAY when set (``MESSAGE_ORDER``)."""
    props = dict(user)
    if tags:
        props[PROPERTY_TAGS] = tags
    if keys:
        props[PROPERTY_KEYS] = KEY_SEPARATOR.join(keys)
    if delay_level:
        props[PROPERTY_DELAY_TIME_LEVEL] = str(delay_level)
    return props


def half_properties(
    props: Mapping[str, str],
    *,
    producer_group: str,
    real_topic: str,
    real_queue_id: int,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Return the properties of the half message of a message whose properties
    (UNIQ_KEY included) are ``props``: HALF_HEAD, ``extra``, then HALF_TAIL."""
    half = dict(props)
    half[PROPERTY_PRODUCER_GROUP] = producer_group
    half[PROPERTY_TRANSACTION_ID] = half[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX]
    if extra:
        half.update(extra)
    half[PROPERTY_TRANSACTION_PREPARED] = TRUE
    half[PROPERTY_REAL_TOPIC] = real_topic
    half[PROPERTY_REAL_QUEUE_ID] = str(real_queue_id)
    return half


def committed_properties(half: Mapping[str, str]) -> tuple[str | None, str, dict[str, str]]:
    """Return (real topic, real queue id, properties) of the record that commits the
    half message whose properties are ``half``: HALF_TAIL and RS_FIRST_HALF dropped.

    The real topic is None when the half names none (not a half of ours).
    """
    props = dict(half)
    topic = props.pop(PROPERTY_REAL_TOPIC, None)
    queue_id = props.pop(PROPERTY_REAL_QUEUE_ID, "0")
    props.pop(PROPERTY_TRANSACTION_PREPARED, None)
    props.pop(PROPERTY_FIRST_HALF, None)  # bookkeeping of the half queue only
    return topic, queue_id, props

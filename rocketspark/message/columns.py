"""The columns of a columnar put, and the checks of their entries that the encoder's
row loop calls when its fast, C-level tests of a row fail.

``Columns`` holds the columns as given (checked for equal lengths only); the
encoder validates each row as a :class:`~rocketspark.message.model.Message`
would, and the helpers here raise the same InvalidMessageError a Message would.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rocketspark.errors import ConfigError, InvalidMessageError
from rocketspark.message.model import Message, check_utf8
from rocketspark.message.properties import decode_properties

__all__ = [
    "Columns",
    "SerializedRows",
    "check_property",
    "check_utf8_fields",
    "encodes_utf8",
    "joined_keys",
    "only_empty",
    "property_pairs",
]


def encodes_utf8(text: str) -> bool:
    """Does ``text`` encode as UTF-8 (holds no lone surrogate)?"""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def property_pairs(props: Any, where: str) -> dict[Any, Any]:
    """Properties given as (name, value) pairs, as a dict (checked as Message does)."""
    try:
        if isinstance(props, (str, bytes, bytearray, memoryview)):
            raise TypeError
        return dict(props)
    except (TypeError, ValueError):
        raise InvalidMessageError(
            f"{where}properties must be a mapping or (name, value) pairs, got {props!r}"
        ) from None


def check_property(where: str, name: Any, value: Any) -> None:
    """Raise unless ``name`` and ``value`` are strings (of a subclass), the name not empty."""
    if not isinstance(name, str) or not isinstance(value, str):
        raise InvalidMessageError(
            f"{where}message property {name!r}: names and values must be strings"
        )
    if not name:
        raise InvalidMessageError(f"{where}message property names must not be empty")


def joined_keys(keys: Any, where: str) -> str:
    """Keys given as a sequence, joined as RocketMQ stores them (checked as Message does)."""
    if keys.__class__ is list or keys.__class__ is tuple:  # the common case, C-level tests
        try:
            joined = " ".join(keys)
        except TypeError:  # not strings: reported below
            pass
        else:
            # no key is empty or holds a space: one space between keys, no more
            if joined.count(" ") == len(keys) - 1 and "" not in keys:
                return joined
    if isinstance(keys, (bytes, bytearray, memoryview, Mapping)) or not isinstance(keys, Iterable):
        raise InvalidMessageError(
            f"{where}keys must be a string or a sequence of strings, got {keys!r}"
        )
    keys = list(keys)
    for k in keys:
        if not isinstance(k, str) or not k or " " in k:
            raise InvalidMessageError(
                f"{where}message key {k!r} must be a non-empty string without spaces"
            )
    return " ".join(keys)


def check_utf8_fields(
    where: str, props: Mapping[str, str], tag: str | None, key: str | None
) -> None:
    """Raise InvalidMessageError naming the field that does not encode as UTF-8."""
    for name, value in props.items():
        check_utf8("message property name", name, where)
        check_utf8("message property value", value, f"{where}property {name!r}: ")
    if tag:
        check_utf8("message property tags", tag, where)
    if key:
        check_utf8("message property key", key, where)


def only_empty(col: Any, n: int, empties: tuple[Any, ...]) -> bool:
    """Is every entry of the list ``col`` (n long) equal to one of ``empties``?

    C-level counts, the likeliest empty first: one scan in the common case.
    """
    if not isinstance(col, list):
        return False
    left = n
    for empty in empties:
        left -= col.count(empty)
        if not left:
            return True
    return False


def _column_length(name: str, col: Any) -> int:
    """The length of a column: a sized sequence, not one text (whose characters a
    column of the same length would silently take for its rows)."""
    if col.__class__ is list:
        return len(col)
    if isinstance(col, (str, bytes, bytearray, Mapping)) or not hasattr(col, "__len__"):
        raise ConfigError(
            f"column {name} must be a sequence with one entry per message, got {type(col).__name__}"
        )
    return len(col)


class Columns:
    """The columns of a columnar put, checked for equal lengths."""

    __slots__ = (
        "bodies",
        "topic",
        "topics",
        "tags",
        "keys",
        "properties",
        "queue_ids",
        "sharding_keys",
        "extra",
        "checked",
    )

    def __init__(
        self,
        bodies: Sequence[Any],
        topic: str | None,
        topics: Any,
        tags: Any,
        keys: Any,
        properties: Any,
        queue_ids: Any,
        sharding_keys: Any,
        extra: tuple[Any, Any, Any] | None = None,
    ):
        n = _column_length("bodies", bodies)
        for name, col in (
            ("topics", topics),
            ("tags", tags),
            ("keys", keys),
            ("properties", properties),
            ("queue_ids", queue_ids),
            ("sharding_keys", sharding_keys),
        ):
            if col is not None and _column_length(name, col) != n:
                raise ConfigError(f"column {name} has {len(col)} entries, bodies has {n}")
        if topic is None and topics is None:
            raise ConfigError("no topic: give topic= (one for all rows) or topics=")
        self.bodies, self.topic, self.topics, self.tags, self.keys = (
            bodies,
            topic,
            topics,
            tags,
            keys,
        )
        self.properties, self.queue_ids, self.sharding_keys = properties, queue_ids, sharding_keys
        self.extra = extra
        self.checked = False  # the columns of Messages, whose fields they checked

    @classmethod
    def of_keywords(cls, bodies: Sequence[Any], columns: dict[str, Any]) -> Columns:
        """The columns of ``put_columns``'s keyword arguments, given as a dict (consumed);
        TypeError for a keyword that names no column."""
        cols = cls(
            bodies,
            columns.pop("topic", None),
            columns.pop("topics", None),
            columns.pop("tags", None),
            columns.pop("keys", None),
            columns.pop("properties", None),
            columns.pop("queue_ids", None),
            columns.pop("sharding_keys", None),
        )
        if columns:
            raise TypeError(f"unknown columns {sorted(columns)}")
        return cols

    @classmethod
    def of_messages(cls, messages: Sequence[Message]) -> Columns:
        extra = None
        if any(m.flag or m.reconsume_times or m.born_timestamp for m in messages):
            extra = (
                [m.flag for m in messages],
                [m.reconsume_times for m in messages],
                [m.born_timestamp for m in messages],
            )
        cols = cls(
            [m.body for m in messages],
            None,
            [m.topic for m in messages],
            [m.tags for m in messages],
            [m.keys for m in messages],
            [m.properties for m in messages],
            [m.queue_id for m in messages],
            [m.sharding_key for m in messages],
            extra,
        )
        cols.checked = True
        return cols

    def messages(self) -> list[Message]:
        n = len(self.bodies)

        def col(c: Any) -> Any:
            return c if c is not None else [None] * n

        out = []
        for b, t, tg, k, p, q, sk in zip(
            self.bodies,
            col(self.topics),
            col(self.tags),
            col(self.keys),
            col(self.properties),
            col(self.queue_ids),
            col(self.sharding_keys),
            strict=False,
        ):
            # None: not set; any other value is Message's to check (as the row loop does)
            out.append(
                Message(
                    # a topic of None (no default either) is Message's to refuse
                    t if t is not None else self.topic,  # type: ignore[arg-type]
                    b,
                    tags=tg,
                    keys=k,
                    properties=p if p is not None else {},
                    queue_id=q,
                    sharding_key=sk,
                )
            )
        return out


@dataclass(frozen=True, slots=True)
class SerializedRows:
    """Messages of one topic whose user properties are already in the PROPERTIES field's
    form (``NAME\\x01VALUE\\x02``..., UTF-8): a SEND_BATCH_MESSAGE's, decoded without a
    Message per row.

    The caller has checked what a Message would: each ``properties`` entry is
    well-formed, names no property twice and none of TAGS, KEYS or DELAY (those
    are ``tags`` and ``keys``, a key string as Message joins its keys); ``uniq``
    is the UNIQ_KEY a row's properties name (None: the store generates one);
    bodies are non-empty. None for a column: no row sets it.
    """

    bodies: list[bytes]
    properties: list[bytes]
    tags: list[str | None] | None
    keys: list[str | None] | None
    uniq: list[str | None] | None
    flags: list[int] | None  # FLAG of each row (None: all 0)
    born_timestamp: int  # of every row (0: the store time)
    reconsume_times: int

    def messages(self, topic: str, queue_id: int | None) -> list[Message]:
        """The rows as Messages (what the per-record put paths take)."""
        n = len(self.bodies)
        none: list[Any] = [None] * n
        return [
            Message(
                topic,
                body,
                tags=tag,
                keys=key or (),
                properties=decode_properties(props),
                flag=flag or 0,
                queue_id=queue_id,
                born_timestamp=self.born_timestamp,
                reconsume_times=self.reconsume_times,
            )
            for body, props, tag, key, flag in zip(
                self.bodies,
                self.properties,
                self.tags if self.tags is not None else none,
                self.keys if self.keys is not None else none,
                self.flags if self.flags is not None else none,
                strict=True,
            )
        ]

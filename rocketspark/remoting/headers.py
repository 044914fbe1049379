"""Request and response headers: typed values that travel as a command's ``ext_fields``.

Each header is a frozen dataclass named after its Java class (``...RequestHeader``
in ``org.apache.rocketmq.remoting.protocol.header``). A field's wire name is its
Java field name: the attribute name in camelCase unless :func:`wire` names it
(``clientID``, ``bname``). Values travel as strings the way Java's
``makeCustomHeaderToNet`` writes them: numbers in decimal, booleans as
``"true"`` / ``"false"``, ``None`` fields left out. Decoding parses them back as
``decodeCommandCustomHeader`` does (a boolean is true only for ``"true"``, any
case).

SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE carry :class:`SendMessageRequestHeader`'s
fields under single letters ``a`` .. ``n``: :class:`SendMessageRequestHeaderV2`
is the same header with those wire names.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from rocketspark.errors import RemotingFrameError

__all__ = [
    "Header",
    "wire",
    # requests
    "GetRouteInfoRequestHeader",
    "SendMessageRequestHeader",
    "SendMessageRequestHeaderV2",
    "PullMessageRequestHeader",
    "GetMaxOffsetRequestHeader",
    "GetMinOffsetRequestHeader",
    "SearchOffsetRequestHeader",
    "GetEarliestMsgStoretimeRequestHeader",
    "QueryConsumerOffsetRequestHeader",
    "UpdateConsumerOffsetRequestHeader",
    "ConsumerSendMsgBackRequestHeader",
    "EndTransactionRequestHeader",
    "CheckTransactionStateRequestHeader",
    "GetConsumerListByGroupRequestHeader",
    "NotifyConsumerIdsChangedRequestHeader",
    "GetConsumerRunningInfoRequestHeader",
    "UnregisterClientRequestHeader",
    "QueryMessageRequestHeader",
    "ViewMessageRequestHeader",
    "CreateTopicRequestHeader",
    "DeleteTopicRequestHeader",
    "DeleteTopicFromNamesrvRequestHeader",
    "GetTopicStatsInfoRequestHeader",
    "GetConsumeStatsRequestHeader",
    "RegisterBrokerRequestHeader",
    "UnRegisterBrokerRequestHeader",
    # responses
    "SendMessageResponseHeader",
    "PullMessageResponseHeader",
    "GetMaxOffsetResponseHeader",
    "GetMinOffsetResponseHeader",
    "SearchOffsetResponseHeader",
    "GetEarliestMsgStoretimeResponseHeader",
    "QueryConsumerOffsetResponseHeader",
    "QueryMessageResponseHeader",
    "CheckTransactionStateResponseHeader",
    "RegisterBrokerResponseHeader",
]

H = TypeVar("H", bound="Header")

_WIRE = "wire"


def wire(name: str | None = None, *, v2: str | None = None) -> dict[str, Any]:
    """Return a field's metadata naming it on the wire: ``field(metadata=wire("clientID"))``.

    ``name`` replaces the camelCased attribute name; ``v2`` is the field's
    single-letter name in SendMessageRequestHeaderV2.
    """
    return {_WIRE: {"v1": name, "v2": v2}}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _format_bool(value: Any) -> str:
    return "true" if value else "false"


def _parse_bool(text: str) -> bool:
    return text.lower() == "true"  # Java's Boolean.parseBoolean


@dataclass(frozen=True)
class _Field:
    attr: str
    wire: str
    parse: Callable[[str], Any]
    format: Callable[[Any], str]
    required: bool


@dataclass(frozen=True, kw_only=True)
class Header:
    """A header: fields ↔ ``ext_fields``. Subclasses only declare their fields."""

    # Which wire names a subclass uses ("v1": Java's field names, "v2": SEND_MESSAGE_V2 letters).
    _wire_names: ClassVar[str] = "v1"
    _fields: ClassVar[tuple[_Field, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._fields = ()  # built on first use: the dataclass decorator has not run yet

    @classmethod
    def _layout(cls) -> tuple[_Field, ...]:
        if not cls._fields:
            hints = typing.get_type_hints(cls)
            out = []
            for f in dataclasses.fields(cls):
                names = f.metadata.get(_WIRE, {})
                name = names.get(cls._wire_names) or names.get("v1") or _camel(f.name)
                kind = _scalar(hints[f.name], f"{cls.__name__}.{f.name}")
                parse: Callable[[str], Any] = _parse_bool if kind is bool else kind
                fmt: Callable[[Any], str] = _format_bool if kind is bool else str
                required = (
                    f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                )
                out.append(_Field(f.name, name, parse, fmt, required))
            cls._fields = tuple(out)
        return cls._fields

    def to_ext_fields(self) -> dict[str, str]:
        """Return the fields as ``ext_fields``: wire name → string, ``None`` fields left out."""
        out = {}
        for f in self._layout():
            value = getattr(self, f.attr)
            if value is not None:
                out[f.wire] = f.format(value)
        return out

    @classmethod
    def from_ext_fields(cls: type[H], ext_fields: Mapping[str, str]) -> H:
        """Parse a header from ``ext_fields``; unknown keys are ignored.

        Raises RemotingFrameError when a field without a default is missing or
        a number does not parse.
        """
        values: dict[str, Any] = {}
        for f in cls._layout():
            text = ext_fields.get(f.wire)
            if text is None:
                if f.required:
                    raise RemotingFrameError(f"{cls.__name__}: field {f.wire!r} is missing")
                continue
            try:
                values[f.attr] = f.parse(text)
            except ValueError:
                raise RemotingFrameError(
                    f"{cls.__name__}: field {f.wire!r} is {text!r}, not a number"
                ) from None
        return cls(**values)


def _scalar(hint: Any, where: str) -> type:
    """The one of str / int / bool a field's annotation (``X`` or ``X | None``) names."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            hint = args[0]
    if hint in (str, int, bool):
        return typing.cast(type, hint)
    raise TypeError(f"{where}: a header field is str, int or bool (optionally | None)")


# --- requests --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class GetRouteInfoRequestHeader(Header):
    """GET_ROUTEINFO_BY_TOPIC (to a NameServer): ask for standard JSON (quoted map keys)."""

    topic: str
    accept_standard_json_only: bool | None = True


@dataclass(frozen=True, kw_only=True)
class SendMessageRequestHeader(Header):
    """SEND_MESSAGE with Java's field names; :meth:`to_v2` for SEND_MESSAGE_V2's letters.

    ``properties`` is the encoded property string (``NAME\\x01VALUE\\x02``...);
    ``broker_name`` travels as ``bname`` (``n`` in v2).
    """

    producer_group: str = field(metadata=wire(v2="a"))
    topic: str = field(metadata=wire(v2="b"))
    default_topic: str = field(default="TBW102", metadata=wire(v2="c"))
    default_topic_queue_nums: int = field(default=4, metadata=wire(v2="d"))
    queue_id: int = field(metadata=wire(v2="e"))
    sys_flag: int = field(default=0, metadata=wire(v2="f"))
    born_timestamp: int = field(metadata=wire(v2="g"))
    flag: int = field(default=0, metadata=wire(v2="h"))
    properties: str | None = field(default=None, metadata=wire(v2="i"))
    reconsume_times: int | None = field(default=0, metadata=wire(v2="j"))
    unit_mode: bool | None = field(default=False, metadata=wire(v2="k"))
    max_reconsume_times: int | None = field(default=None, metadata=wire(v2="l"))
    batch: bool | None = field(default=False, metadata=wire(v2="m"))
    broker_name: str | None = field(default=None, metadata=wire("bname", v2="n"))

    def to_v2(self) -> SendMessageRequestHeaderV2:
        """Return the same header with SEND_MESSAGE_V2's single-letter wire names."""
        return SendMessageRequestHeaderV2(**_values(self))

    def to_v1(self) -> SendMessageRequestHeader:
        """Return the same header with SEND_MESSAGE's (Java's field) wire names."""
        return SendMessageRequestHeader(**_values(self))


@dataclass(frozen=True, kw_only=True)
class SendMessageRequestHeaderV2(SendMessageRequestHeader):
    """SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE: :class:`SendMessageRequestHeader` as ``a`` .. ``n``."""

    _wire_names: ClassVar[str] = "v2"


def _values(header: Header) -> dict[str, Any]:
    return {f.name: getattr(header, f.name) for f in dataclasses.fields(header)}


@dataclass(frozen=True, kw_only=True)
class PullMessageRequestHeader(Header):
    """PULL_MESSAGE: ``sys_flag`` holds PullSysFlag bits; ``subscription`` the tag expression."""

    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int
    sys_flag: int
    commit_offset: int
    suspend_timeout_millis: int
    subscription: str | None = None
    sub_version: int
    expression_type: str | None = None
    max_msg_bytes: int | None = None
    request_source: int | None = None
    # sic: RocketMQ's spelling
    proxy_forward_client_id: str | None = field(default=None, metadata=wire("proxyFrowardClientId"))
    broker_name: str | None = field(default=None, metadata=wire("bname"))


@dataclass(frozen=True, kw_only=True)
class GetMaxOffsetRequestHeader(Header):
    """GET_MAX_OFFSET: the queue's max offset (committed messages only, by default)."""

    topic: str
    queue_id: int
    committed: bool = True
    broker_name: str | None = field(default=None, metadata=wire("bname"))


@dataclass(frozen=True, kw_only=True)
class GetMinOffsetRequestHeader(Header):
    """GET_MIN_OFFSET."""

    topic: str
    queue_id: int
    broker_name: str | None = field(default=None, metadata=wire("bname"))


@dataclass(frozen=True, kw_only=True)
class SearchOffsetRequestHeader(Header):
    """SEARCH_OFFSET_BY_TIMESTAMP: ``timestamp`` in ms; ``boundary_type`` "lower" / "upper"."""

    topic: str
    queue_id: int
    timestamp: int
    boundary_type: str | None = None
    broker_name: str | None = field(default=None, metadata=wire("bname"))


@dataclass(frozen=True, kw_only=True)
class GetEarliestMsgStoretimeRequestHeader(Header):
    """GET_EARLIEST_MSG_STORETIME."""

    topic: str
    queue_id: int
    broker_name: str | None = field(default=None, metadata=wire("bname"))


@dataclass(frozen=True, kw_only=True)
class QueryConsumerOffsetRequestHeader(Header):
    """QUERY_CONSUMER_OFFSET: answered with an offset, or QUERY_NOT_FOUND."""

    consumer_group: str
    topic: str
    queue_id: int
    set_zero_if_not_found: bool | None = None
    broker_name: str | None = field(default=None, metadata=wire("bname"))


@dataclass(frozen=True, kw_only=True)
class UpdateConsumerOffsetRequestHeader(Header):
    """UPDATE_CONSUMER_OFFSET: ``commit_offset`` is the next offset to consume."""

    consumer_group: str
    topic: str
    queue_id: int
    commit_offset: int
    broker_name: str | None = field(default=None, metadata=wire("bname"))


@dataclass(frozen=True, kw_only=True)
class ConsumerSendMsgBackRequestHeader(Header):
    """CONSUMER_SEND_MSG_BACK: ``offset`` is the message's CommitLog offset."""

    offset: int
    group: str
    delay_level: int
    origin_msg_id: str | None = None
    origin_topic: str | None = None
    unit_mode: bool = False
    max_reconsume_times: int | None = None
    broker_name: str | None = field(default=None, metadata=wire("bname"))


@dataclass(frozen=True, kw_only=True)
class EndTransactionRequestHeader(Header):
    """END_TRANSACTION: ``commit_or_rollback`` 8 commits, 12 rolls back, 0 leaves it open."""

    topic: str | None = None
    producer_group: str
    tran_state_table_offset: int
    commit_log_offset: int
    commit_or_rollback: int
    from_transaction_check: bool | None = False
    msg_id: str
    transaction_id: str | None = None
    broker_name: str | None = field(default=None, metadata=wire("bname"))


@dataclass(frozen=True, kw_only=True)
class CheckTransactionStateRequestHeader(Header):
    """CHECK_TRANSACTION_STATE (broker → producer): is this half message committed?"""

    topic: str | None = None
    tran_state_table_offset: int
    commit_log_offset: int
    msg_id: str | None = None
    transaction_id: str | None = None
    offset_msg_id: str | None = None
    broker_name: str | None = field(default=None, metadata=wire("bname"))


@dataclass(frozen=True, kw_only=True)
class GetConsumerListByGroupRequestHeader(Header):
    """GET_CONSUMER_LIST_BY_GROUP: answered with a ``{"consumerIdList": [...]}`` body."""

    consumer_group: str


@dataclass(frozen=True, kw_only=True)
class NotifyConsumerIdsChangedRequestHeader(Header):
    """NOTIFY_CONSUMER_IDS_CHANGED (broker → consumer, one-way)."""

    consumer_group: str


@dataclass(frozen=True, kw_only=True)
class GetConsumerRunningInfoRequestHeader(Header):
    """GET_CONSUMER_RUNNING_INFO (broker → consumer, relayed from an admin tool)."""

    consumer_group: str
    client_id: str
    jstack_enable: bool = False


@dataclass(frozen=True, kw_only=True)
class UnregisterClientRequestHeader(Header):
    """UNREGISTER_CLIENT: ``client_id`` travels as ``clientID``."""

    client_id: str = field(metadata=wire("clientID"))
    producer_group: str | None = None
    consumer_group: str | None = None


@dataclass(frozen=True, kw_only=True)
class QueryMessageRequestHeader(Header):
    """QUERY_MESSAGE: messages of ``topic`` with ``key``, stored in [begin, end] ms."""

    topic: str
    key: str
    max_num: int
    begin_timestamp: int
    end_timestamp: int


@dataclass(frozen=True, kw_only=True)
class ViewMessageRequestHeader(Header):
    """VIEW_MESSAGE_BY_ID: ``offset`` is the CommitLog offset an offset message id holds."""

    topic: str | None = None
    offset: int


@dataclass(frozen=True, kw_only=True)
class CreateTopicRequestHeader(Header):
    """UPDATE_AND_CREATE_TOPIC (to a broker); ``perm`` 6 is read + write."""

    topic: str
    default_topic: str = "TBW102"
    read_queue_nums: int
    write_queue_nums: int
    perm: int = 6
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int | None = None
    order: bool = False
    attributes: str | None = None
    force: bool | None = None


@dataclass(frozen=True, kw_only=True)
class DeleteTopicRequestHeader(Header):
    """DELETE_TOPIC_IN_BROKER."""

    topic: str


@dataclass(frozen=True, kw_only=True)
class DeleteTopicFromNamesrvRequestHeader(Header):
    """DELETE_TOPIC_IN_NAMESRV."""

    topic: str
    cluster_name: str | None = None


@dataclass(frozen=True, kw_only=True)
class GetTopicStatsInfoRequestHeader(Header):
    """GET_TOPIC_STATS_INFO."""

    topic: str


@dataclass(frozen=True, kw_only=True)
class GetConsumeStatsRequestHeader(Header):
    """GET_CONSUME_STATS: a group's offsets and lag, of one topic or all."""

    consumer_group: str
    topic: str | None = None


@dataclass(frozen=True, kw_only=True)
class RegisterBrokerRequestHeader(Header):
    """REGISTER_BROKER (broker → NameServer); the body is the broker's topic config wrapper."""

    broker_name: str
    broker_addr: str
    cluster_name: str
    ha_server_addr: str
    broker_id: int
    heartbeat_timeout_millis: int | None = None
    enable_acting_master: bool | None = None
    compressed: bool = False
    body_crc32: int | None = 0


@dataclass(frozen=True, kw_only=True)
class UnRegisterBrokerRequestHeader(Header):
    """UNREGISTER_BROKER (broker → NameServer)."""

    broker_name: str
    broker_addr: str
    cluster_name: str
    broker_id: int


# --- responses -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SendMessageResponseHeader(Header):
    """A send's answer: the message id (UNIQ_KEY) and where the message went."""

    msg_id: str
    queue_id: int
    queue_offset: int
    transaction_id: str | None = None
    batch_uniq_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class PullMessageResponseHeader(Header):
    """A pull's answer: ``next_begin_offset`` is the next offset to pull from."""

    suggest_which_broker_id: int
    next_begin_offset: int
    min_offset: int
    max_offset: int
    offset_delta: int | None = None
    topic_sys_flag: int | None = None
    group_sys_flag: int | None = None
    forbidden_type: int | None = None


@dataclass(frozen=True, kw_only=True)
class GetMaxOffsetResponseHeader(Header):
    """GET_MAX_OFFSET's answer: the offset one past the queue's last message."""

    offset: int


@dataclass(frozen=True, kw_only=True)
class GetMinOffsetResponseHeader(Header):
    """GET_MIN_OFFSET's answer."""

    offset: int


@dataclass(frozen=True, kw_only=True)
class SearchOffsetResponseHeader(Header):
    """SEARCH_OFFSET_BY_TIMESTAMP's answer."""

    offset: int


@dataclass(frozen=True, kw_only=True)
class GetEarliestMsgStoretimeResponseHeader(Header):
    """GET_EARLIEST_MSG_STORETIME's answer, in ms."""

    timestamp: int


@dataclass(frozen=True, kw_only=True)
class QueryConsumerOffsetResponseHeader(Header):
    """QUERY_CONSUMER_OFFSET's answer: the group's next offset to consume."""

    offset: int


@dataclass(frozen=True, kw_only=True)
class QueryMessageResponseHeader(Header):
    """QUERY_MESSAGE's answer; the body holds the matching records."""

    index_last_update_timestamp: int
    index_last_update_phyoffset: int


@dataclass(frozen=True, kw_only=True)
class CheckTransactionStateResponseHeader(Header):
    """A producer's answer to CHECK_TRANSACTION_STATE (``commit_or_rollback`` 8 / 12 / 0)."""

    producer_group: str
    tran_state_table_offset: int
    commit_log_offset: int
    commit_or_rollback: int


@dataclass(frozen=True, kw_only=True)
class RegisterBrokerResponseHeader(Header):
    """REGISTER_BROKER's answer."""

    ha_server_addr: str | None = None
    master_addr: str | None = None

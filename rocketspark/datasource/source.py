"""The source side: topics → MessageQueues → input partitions of ConsumeQueue ranges.

The driver plans (``initialOffset``, ``latestOffset``, ``partitions``,
``commit``); workers ``read`` a :class:`QueueRange` by asking the client for Arrow
record batches of that range, so no row is ever a Python tuple.

Offsets are the next ConsumeQueue offset to read per queue (see ``offsets``).
A tag filter (``subExpression``) drops messages inside a range, which leaves
gaps between the queueOffsets of the rows: that is normal, not data loss.
"""

from __future__ import annotations

import difflib
import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import FrameType
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

from rocketspark.client import ARROW_SCHEMA, Client, ClientRef, MessageQueue, validate_group
from rocketspark.datasource.offsets import EARLIEST, LATEST, Positions, from_json, to_json
from rocketspark.datasource.options import ParsedOptions, client_ref
from rocketspark.errors import ConfigError, OffsetOutOfRangeError, UnknownTopicError
from rocketspark.message.model import RETRY_GROUP_TOPIC_PREFIX, is_system_topic

try:  # Spark 4.2+: admission control and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        ReadMinRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - Spark 4.0 / 4.1
    ReadLimit = object  # type: ignore[assignment,misc]

    class ReadAllAvailable:  # type: ignore[no-redef]
        pass

    class ReadMaxRows:  # type: ignore[no-redef]
        def __init__(self, max_rows: int):
            self.max_rows = max_rows

    class ReadMinRows:  # type: ignore[no-redef]
        def __init__(self, min_rows: int):
            self.min_rows = min_rows

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass


log = logging.getLogger(__name__)


def _spark_type(t: pa.DataType) -> str:
    """An Arrow type of the row schema as Spark's DDL spells it."""
    if pa.types.is_map(t):
        return f"map<{_spark_type(t.key_type)},{_spark_type(t.item_type)}>"
    if pa.types.is_list(t):
        return f"array<{_spark_type(t.value_type)}>"
    if pa.types.is_timestamp(t):
        return "timestamp"
    names = {pa.string(): "string", pa.binary(): "binary", pa.int32(): "int", pa.int64(): "long"}
    return names[t]


# The rows' schema: the Arrow batches the client reads, in Spark's DDL.
SCHEMA_DDL = ", ".join(f"{f.name} {_spark_type(f.type)}" for f in ARROW_SCHEMA)
# SCHEMA_DDL as (name, type) pairs, types as Spark's simpleString() spells them.
SCHEMA_FIELDS = [
    (f.split(" ", 1)[0], f.split(" ", 1)[1].replace("long", "bigint"))
    for f in SCHEMA_DDL.split(", ")
]
# Offsets read from the store per call inside one partition: bounds a worker's memory.
READ_CHUNK = 1 << 16


def columns_of(schema: Any) -> tuple[str, ...] | None:
    """The columns a ``.schema()`` given to the source picks; None: all, as SCHEMA_DDL.

    Such a schema is some of the source's columns, in any order, none twice,
    each named as in SCHEMA_DDL (case included) with its type, and nullable.
    The rows then have only those columns, in that order, and what none of them
    needs is not decoded (the properties, msgId, the hosts). With no schema
    given, Spark passes the source's own. Raises ConfigError naming the first
    field that is not such a column.
    """
    if schema is None or isinstance(schema, str):
        return None
    from pyspark.sql.pandas.types import from_arrow_schema

    full = {f.name: f for f in from_arrow_schema(ARROW_SCHEMA).fields}
    names = [f.name for f in schema.fields]
    if names == list(full) and all(f == full[f.name] for f in schema.fields):
        return None
    if not names:
        raise ConfigError(f"the rocketmq source cannot read no column; {_SCHEMA_HINT}")
    for f in schema.fields:
        want = full.get(f.name)
        if want is None:
            close = [n for n in full if n.lower() == f.name.lower()] or difflib.get_close_matches(
                f.name, list(full), n=1, cutoff=0.6
            )
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"the rocketmq source has no column {f.name!r}{hint}; {_SCHEMA_HINT}")
        if f.dataType != want.dataType:
            got, typ = f.dataType.simpleString(), want.dataType.simpleString()
            detail = " with nullable elements and values" if got == typ else f", not {got}"
            typ = _DDL_TYPES[f.name]
            raise ConfigError(
                f"column {f.name!r} is {typ} in the rocketmq source{detail}; {_SCHEMA_HINT}"
            )
        if not f.nullable:
            raise ConfigError(
                f"column {f.name!r} of the rocketmq source is nullable: drop its NOT NULL"
            )
    if len(set(names)) < len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"column {twice!r} is given twice in the schema; {_SCHEMA_HINT}")
    return tuple(names)


_DDL_TYPES = dict(f.split(" ", 1) for f in SCHEMA_DDL.split(", "))  # name -> type as in DDL
_SCHEMA_HINT = (
    "a .schema() given to it picks some of its columns, with their types, in any order "
    f"(leave .schema() out to read them all): {SCHEMA_DDL}"
)


# The options that say where a read starts, and where a batch read ends: one of each.
_STARTS = ("startingOffsets", "startingTimestamp", "startingOffsetsByTimestamp")
_ENDS = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")


@dataclass(frozen=True)
class QueueRange(InputPartition):
    """Offsets [start, end) of one MessageQueue: what one task reads."""

    client: ClientRef
    mq: MessageQueue
    start: int
    end: int
    expression: str
    fail_on_data_loss: bool
    check_crc: bool | None = None  # None: the client's (embedded: checkCRCOnRead)
    columns: tuple[str, ...] | None = None  # the rows' columns (columns_of); None: all


@dataclass
class SourcePlan:
    """Everything the driver needs to turn options into queues and offsets."""

    client: ClientRef
    options: ParsedOptions
    broker: str = ""  # the brokerName option: relabels the queues (embedded)
    streaming: bool = False
    columns: tuple[str, ...] | None = None  # a .schema() of some columns (columns_of)
    _topics_checked: bool = field(default=False, repr=False)

    @classmethod
    def create(
        cls,
        options: ParsedOptions,
        *,
        streaming: bool | None,
        columns: tuple[str, ...] | None = None,
    ) -> SourcePlan:
        """Validate the options against each other and the store; None: batch or stream.

        ``columns``: the columns the rows have (:func:`columns_of`); None: all.
        """
        pattern = options.get("topicPattern")
        given = [k for k in ("topic", "topicPattern", "assign") if options.get(k)]
        if len(given) > 1:
            raise ConfigError(
                f"options {' and '.join(given)} exclude each other; give one of "
                "topic, topicPattern and assign"
            )
        if not given:
            raise ConfigError(
                "option topic (or topicPattern, or assign) is required: the "
                "topics to read, comma-separated"
            )
        starts = [k for k in _STARTS if options.raw.get(k) is not None]
        if len(starts) > 1:
            raise ConfigError(f"options {' and '.join(starts)} exclude each other; give one")
        ends = [k for k in _ENDS if options.raw.get(k) is not None]
        if streaming and ends:
            raise ConfigError(
                f"option {ends[0]} applies to batch reads only; a stream reads "
                "on (use Trigger.AvailableNow to stop at the end)"
            )
        if len(ends) > 1:
            raise ConfigError(f"options {' and '.join(ends)} exclude each other; give one")
        if options.get("startingOffsets") == "group" and not options.get("group"):
            raise ConfigError("startingOffsets=group needs the option group")
        lo, hi = options.get("minOffsetsPerTrigger"), options.get("maxOffsetsPerTrigger")
        if lo is not None and hi is not None and lo > hi:
            raise ConfigError(
                f"minOffsetsPerTrigger ({lo}) is larger than maxOffsetsPerTrigger ({hi})"
            )
        if options.get("group"):
            validate_group(options["group"])
        ref = client_ref(options).require()
        plan = cls(ref, options, streaming=bool(streaming), columns=columns)
        client = ref.connect()
        plan.broker = options.get("brokerName") or ""
        queues = plan.queues(client)  # unknown topics and queues fail here, at load()
        if not pattern:  # (a pattern's topics may appear later)
            for key in (
                "startingOffsets",
                "endingOffsets",
                "startingOffsetsByTimestamp",
                "endingOffsetsByTimestamp",
            ):
                spec = options.get(key)
                if isinstance(spec, Mapping):
                    plan.check_given(client, queues, from_json(spec), key)
        return plan

    # -- queues --------------------------------------------------------------------------

    def queues(self, client: Client) -> list[MessageQueue]:
        """Return the MessageQueues to read now (a pattern picks up new topics)."""
        topics: Sequence[str]
        assigned = self.options.get("assign")
        if assigned:
            return self._assigned(client, assigned)
        if self.options.get("topic"):
            topics = self.options["topic"]
            for t in topics:
                if not client.has_topic(t):
                    there = sorted(x.name for x in client.topics()) or ["none"]
                    raise UnknownTopicError(
                        f"option topic: topic {t!r} does not exist in {client.where} "
                        f"(topics there: {', '.join(there)})"
                    )
        else:
            pattern = self.options["topicPattern"]
            topics = [
                t.name
                for t in client.topics()
                if not is_system_topic(t.name) and pattern.fullmatch(t.name)
            ]
        out = []
        for t in topics:
            out.extend(self._topic_queues(client, t))
        return out

    def _topic_queues(self, client: Client, topic: str) -> list[MessageQueue]:
        """The topic's queues, named by the brokerName option when it is given."""
        queues = client.queues(topic)
        if self.broker:
            return [replace(mq, broker=self.broker) for mq in queues]
        return queues

    def _assigned(
        self, client: Client, assigned: Mapping[str, tuple[str | None, tuple[int, ...]]]
    ) -> list[MessageQueue]:
        """The queues of the assign option, each checked to exist (Kafka's assign)."""
        out: list[MessageQueue] = []
        for topic, (broker, ids) in assigned.items():
            if not client.has_topic(topic):
                raise UnknownTopicError(
                    f"option assign: topic {topic!r} does not exist in {client.where}"
                )
            queues = self._topic_queues(client, topic)
            brokers = sorted({mq.broker for mq in queues})
            if broker is not None and broker not in brokers:
                raise ConfigError(
                    f"option assign: broker {broker!r} of topic {topic!r} is not "
                    f"this store's broker {_one_or_all(brokers)}"
                )
            for b in [broker] if broker is not None else brokers:
                n = sum(1 for mq in queues if mq.broker == b)
                missing = [q for q in ids if q >= n]
                if missing:
                    raise ConfigError(
                        f"option assign: topic {topic!r} has no queue "
                        f"{missing[0]} (it has {n} read queues, 0-{n - 1})"
                    )
                out.extend(MessageQueue(topic, b, q) for q in ids)
        return sorted(out)

    def latest(self, client: Client, queues: Sequence[MessageQueue]) -> Positions:
        return {mq: client.max_offset(mq) for mq in queues}

    def earliest(self, client: Client, queues: Sequence[MessageQueue]) -> Positions:
        return {mq: client.min_offset(mq) for mq in queues}

    def resolve(
        self,
        client: Client,
        queues: Sequence[MessageQueue],
        default: str,
        key: str,
        *,
        symbolic_latest: bool = False,
    ) -> Positions:
        """Turn the starting (``key`` startingOffsets) or ending (endingOffsets) options
        into a position for every queue: offsets, one timestamp or one per queue.

        ``symbolic_latest``: a queue that starts at its latest offset gets LATEST
        (-1), not the offset of this moment (see RocketMQStreamReader.initialOffset).
        """
        side = "starting" if key == "startingOffsets" else "ending"
        timestamp = self.options.get(f"{side}Timestamp")
        by_queue = self.options.get(f"{side}OffsetsByTimestamp")
        if timestamp is not None or by_queue is not None:
            stamps = from_json(by_queue) if by_queue is not None else {}
            if by_queue is not None:
                self.check_given(client, queues, stamps, f"{side}OffsetsByTimestamp")
            out: Positions = {}
            for mq in queues:
                ts = stamps.get(mq, timestamp)
                if ts is None:  # a queue the JSON leaves out: as in startingOffsets JSON
                    out[mq] = client.min_offset(mq) if side == "starting" else client.max_offset(mq)
                    continue
                out[mq] = client.offset_for_timestamp(mq, ts)
                if side == "starting" and out[mq] == client.max_offset(mq):
                    if self.options["startingOffsetsByTimestampStrategy"] == "error":
                        raise ConfigError(
                            f"queue {mq} has no message stored at or after timestamp {ts} "
                            f"(its end is offset {out[mq]}); "
                            "startingOffsetsByTimestampStrategy=error. Use latest to start "
                            "such queues at their end"
                        )
                    if symbolic_latest:  # no message at or after it yet: the queue's latest
                        out[mq] = LATEST
            return out
        value = self.options.get(key)
        spec: str | Mapping[str, Mapping[str, Mapping[str, int]]] = (
            default if value is None else value
        )
        if spec == "earliest":
            return self.earliest(client, queues)
        if spec == "latest":
            return {mq: LATEST for mq in queues} if symbolic_latest else self.latest(client, queues)
        if spec == "group":
            group = self.options["group"]
            out = {}
            for mq in queues:
                committed = client.committed_offset(group, mq)
                out[mq] = committed if committed is not None else client.min_offset(mq)
            return out
        assert not isinstance(spec, str)  # the option parsers allow no other word
        given = from_json(spec)
        self.check_given(client, queues, given, key)
        out = {}
        for mq in queues:
            off = given.get(mq, EARLIEST if key == "startingOffsets" else LATEST)
            if off == EARLIEST:
                off = client.min_offset(mq)
            elif off == LATEST and not symbolic_latest:
                off = client.max_offset(mq)
            out[mq] = off
        return out

    def check_given(
        self, client: Client, queues: Sequence[MessageQueue], given: Positions, key: str
    ) -> None:
        """Offsets (or timestamps) a user gave in JSON: subscribed queues, and no offset
        past a queue's end."""
        known = set(queues)
        for mq, off in given.items():
            if mq not in known:
                raise ConfigError(
                    f"option {key}: queue {mq} is not one of the subscribed queues "
                    f"(broker {_one_or_all(sorted({q.broker for q in queues}))}, topics "
                    f"{sorted({q.topic for q in queues})})"
                )
            if off >= 0 and "Timestamp" not in key:
                end = client.max_offset(mq)
                if off > end:
                    raise ConfigError(
                        f"option {key}: offset {off} for queue {mq} is past the queue's end "
                        f"({end}); give an offset up to {end}, or -1 for latest"
                    )

    # -- partitions ----------------------------------------------------------------------

    def check_range(
        self, client: Client, mq: MessageQueue, start: int, end: int
    ) -> tuple[int, int]:
        """Apply failOnDataLoss to a planned range; return the range to read."""
        lo = client.min_offset(mq)
        hi = client.max_offset(mq)
        if start < lo or end > hi:
            what = (
                f"queue {mq}: offset {start} was requested but the earliest offset is {lo}"
                if start < lo
                else f"queue {mq}: offsets up to {end} were planned but the queue ends at {hi} "
                "(was the store replaced?)"
            )
            report_data_loss(what, self.options["failOnDataLoss"], instead="skip ahead")
            start = max(start, lo)
            if start > hi:
                start = lo
            end = max(start, min(end, hi))
        return start, end

    def split(
        self, client: Client, ranges: dict[MessageQueue, tuple[int, int]]
    ) -> list[QueueRange]:
        """Cut ranges into partitions (maxRecordsPerPartition, minPartitions)."""
        sizes = {mq: e - s for mq, (s, e) in ranges.items() if e > s}
        if not sizes:
            return []
        cap = self.options.get("maxRecordsPerPartition")
        min_parts = self.options.get("minPartitions")
        total = sum(sizes.values())
        out = []
        expr = self.options["subExpression"]
        fail = self.options["failOnDataLoss"]
        check_crc = self.options.get("checkCRCs")
        for mq in sorted(sizes):
            s, e = ranges[mq]
            size = e - s
            pieces = 1
            if min_parts and len(sizes) < min_parts:
                # In proportion to the queue's share, rounded up: at least minPartitions
                # in all (Kafka's connector rounds, and can give fewer).
                pieces = min(size, math.ceil(size * min_parts / total))
            if cap:
                pieces = max(pieces, math.ceil(size / max(1, cap)))
            for k in range(pieces):  # nearly equal pieces, none over the cap
                a, b = s + size * k // pieces, s + size * (k + 1) // pieces
                out.append(QueueRange(self.client, mq, a, b, expr, fail, check_crc, self.columns))
        return out


def read_range(part: QueueRange) -> Iterator[Any]:
    """Yield the Arrow record batches of one partition (runs in a worker)."""
    client = part.client.connect()
    mq = part.mq
    start, end = part.start, part.end
    lo = client.min_offset(mq)
    if start < lo:
        report_data_loss(
            f"queue {mq}: offset {start} was requested but the earliest offset is {lo}",
            part.fail_on_data_loss,
            instead="skip ahead",
        )
        start = lo
    pos = start
    while pos < end:
        batches, nxt = client.read_batches(
            mq,
            pos,
            min(end, pos + READ_CHUNK),
            expression=part.expression,
            check_crc=part.check_crc,
            columns=part.columns,
        )
        for b in batches:
            if b.num_rows:
                yield b
        if nxt <= pos:
            report_data_loss(
                f"queue {mq}: offsets [{pos}, {end}) were planned but the queue ends at {nxt}",
                part.fail_on_data_loss,
                instead="skip them",
            )
            break
        pos = nxt


@dataclass
class PushedFilters:
    """What batch-read filters narrowed: topics, brokers, queue ids, offset and time bounds."""

    topics: set[str] | None = None
    brokers: set[str] | None = None  # a queue id names a queue of one broker only
    queue_ids: set[int] | None = None
    offset_lo: int = 0  # inclusive
    offset_hi: int | None = None  # exclusive
    time_lo: int | None = None  # ms, inclusive (a hint: Spark re-checks)
    time_hi: int | None = None  # ms, exclusive

    def push(self, f: Any) -> bool:
        """Narrow by ``f``; True if the filter is fully applied (Spark need not re-check)."""
        from pyspark.sql import datasource as ds

        col = f.attribute[0] if len(getattr(f, "attribute", ())) == 1 else None
        if col == "topic" and isinstance(f, (ds.EqualTo, ds.In)):
            values = {f.value} if isinstance(f, ds.EqualTo) else set(f.value)
            self.topics = values if self.topics is None else self.topics & values
            return True
        if col == "brokerName" and isinstance(f, (ds.EqualTo, ds.In)):
            values = {f.value} if isinstance(f, ds.EqualTo) else set(f.value)
            self.brokers = values if self.brokers is None else self.brokers & values
            return True
        if col == "queueId" and isinstance(f, (ds.EqualTo, ds.In)):
            values = {f.value} if isinstance(f, ds.EqualTo) else set(f.value)
            ints = {int(v) for v in values if isinstance(v, int)}
            self.queue_ids = ints if self.queue_ids is None else self.queue_ids & ints
            return True
        if col == "queueOffset" and isinstance(f.value if hasattr(f, "value") else None, int):
            v = f.value
            bounds = {
                ds.EqualTo: (v, v + 1),
                ds.GreaterThan: (v + 1, None),
                ds.GreaterThanOrEqual: (v, None),
                ds.LessThan: (None, v),
                ds.LessThanOrEqual: (None, v + 1),
            }.get(type(f))
            if bounds is None:
                return False
            lo, hi = bounds
            if lo is not None:
                self.offset_lo = max(self.offset_lo, lo)
            if hi is not None:
                self.offset_hi = hi if self.offset_hi is None else min(self.offset_hi, hi)
            return True
        if col == "storeTimestamp" and hasattr(f, "value") and hasattr(f.value, "timestamp"):
            # Whole seconds, then the milliseconds: exact (a float product of the full
            # timestamp can land 1 ms low), and floored, which keeps the bounds loose.
            v = f.value
            ms = int(v.replace(microsecond=0).timestamp()) * 1000 + v.microsecond // 1000
            if isinstance(f, (ds.GreaterThan, ds.GreaterThanOrEqual)):
                self.time_lo = ms if self.time_lo is None else max(self.time_lo, ms)
            elif isinstance(f, (ds.LessThan, ds.LessThanOrEqual)):
                self.time_hi = ms + 1 if self.time_hi is None else min(self.time_hi, ms + 1)
        return False


class RocketMQBatchReader(DataSourceReader):
    """``spark.read.format("rocketmq")``: a fixed range per queue.

    With ``spark.sql.python.filterPushdown.enabled`` (Spark 4.1+), filters on
    topic and queueId (=, IN) and on queueOffset (=, <, <=, >, >=) pick the
    queues and offsets to read; bounds on storeTimestamp narrow the offsets
    through each queue's time lookup (Spark still checks them row by row).
    """

    def __init__(self, plan: SourcePlan):
        self.plan = plan
        self.pushed = PushedFilters()

    def partitions(self) -> Sequence[InputPartition]:
        plan, pushed = self.plan, self.pushed
        client = plan.client.connect()
        subscribed = plan.queues(client)
        start = plan.resolve(client, subscribed, "earliest", "startingOffsets")
        end = plan.resolve(client, subscribed, "latest", "endingOffsets")
        queues = [
            mq
            for mq in subscribed
            if (pushed.topics is None or mq.topic in pushed.topics)
            and (pushed.brokers is None or mq.broker in pushed.brokers)
            and (pushed.queue_ids is None or mq.queue_id in pushed.queue_ids)
        ]
        ranges = {}
        for mq in queues:
            s, e = start[mq], end[mq]
            if e < s:
                raise ConfigError(
                    f"queue {mq}: the ending offset {e} is before the starting offset {s}"
                )
            s, e = plan.check_range(client, mq, s, e)
            s = max(s, pushed.offset_lo)
            if pushed.offset_hi is not None:
                e = min(e, pushed.offset_hi)
            if pushed.time_lo is not None:
                s = max(s, client.offset_for_timestamp(mq, pushed.time_lo))
            if pushed.time_hi is not None:
                e = min(e, client.offset_for_timestamp(mq, pushed.time_hi))
            if e > s:
                ranges[mq] = (s, e)
        return plan.split(client, ranges)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        # With no partitions planned, Spark still runs one task, with no partition value.
        return read_range(partition) if isinstance(partition, QueueRange) else iter(())


class RocketMQFilteringBatchReader(RocketMQBatchReader):
    """The batch reader Spark gets when it pushes filters down.

    Spark refuses a reader that overrides ``pushFilters`` while
    ``spark.sql.python.filterPushdown.enabled`` is false, and does not tell the
    data source which it is; it asks for the reader from a dedicated planning
    step when the setting is on. ``RocketMQDataSource.reader`` returns this
    class there only (see ``called_for_filter_pushdown``).
    """

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        for f in filters:
            if not self.pushed.push(f):
                yield f


def called_for_filter_pushdown() -> bool:
    """True inside Spark's filter-pushdown planning step (Spark 4.1+)."""
    import sys

    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == "pyspark.sql.worker.data_source_pushdown_filters":
            return True
        frame = frame.f_back
    return False


class RocketMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("rocketmq")``."""

    def __init__(self, plan: SourcePlan):
        self.plan = plan
        self._target: Positions | None = None  # Trigger.AvailableNow: stop here
        self._last_end: dict | None = None
        self._legacy_warned = False
        self._waiting_since: float | None = None  # minOffsetsPerTrigger
        self._group_committed: dict | None = None
        self._initial: dict | None = None

    # -- offsets -------------------------------------------------------------------------

    def initialOffset(self) -> dict:
        """Where the query starts: the same answer every time it is asked.

        Spark asks more than once (as the start of its first latestOffset call,
        and again when it runs batch 0), and asks anew after a restart that
        re-runs a batch 0 never committed, while its end comes from the offset
        log. A queue that starts at its latest offset is therefore LATEST (-1)
        here, not the end of this moment: batch 0 starts such a queue where it
        ends (latestOffset), so a restart can neither skip nor re-read data.
        Kafka's connector writes its initial offsets to the checkpoint instead;
        a Python data source is not given the checkpoint's location.
        """
        if self._initial is None:
            plan = self.plan
            client = plan.client.connect()
            queues = plan.queues(client)
            self._initial = to_json(
                plan.resolve(client, queues, "latest", "startingOffsets", symbolic_latest=True)
            )
        return self._initial

    def getDefaultReadLimit(self) -> Any:
        opts = self.plan.options
        if opts.get("maxOffsetsPerTrigger"):
            return ReadMaxRows(opts["maxOffsetsPerTrigger"])
        if opts.get("minOffsetsPerTrigger"):
            return ReadMinRows(opts["minOffsetsPerTrigger"])
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        client = self.plan.client.connect()
        self._target = self.plan.latest(client, self.plan.queues(client))

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        plan, opts = self.plan, self.plan.options
        client = plan.client.connect()
        if start is None:
            # Spark 4.0/4.1 call it without arguments: no start, no read limit. Only
            # Spark knows where a restarted query resumes, so there is no admission
            # control here (a limit computed from a guessed start could end before the
            # real one): every available offset, as Kafka's connector without limits.
            # The end this reader returned last is processed once Spark asks again.
            if not self._legacy_warned and (
                opts.get("maxOffsetsPerTrigger") or opts.get("minOffsetsPerTrigger")
            ):
                log.warning(
                    "maxOffsetsPerTrigger / minOffsetsPerTrigger need Spark 4.2 "
                    "(admission control for Python data sources); ignored here"
                )
                self._legacy_warned = True
            if self._last_end is not None:
                self._commit_group(client, self._last_end)
            start = self._last_end if self._last_end is not None else self.initialOffset()
            limit = ReadAllAvailable()
        else:
            # Spark asks for the next batch only once the previous one is committed, so
            # ``start`` is processed: the group's offsets follow it now (commit() comes
            # one batch late, and never for the last batch of Trigger.AvailableNow).
            self._commit_group(client, start)
        begin = from_json(start)
        queues = plan.queues(client)
        if any(mq.topic.startswith(RETRY_GROUP_TOPIC_PREFIX) for mq in queues):
            # Retries wait in SCHEDULE_TOPIC_XXXX until due; with no broker daemon, the
            # reader of a retry topic delivers the due ones before looking for new data.
            client.tick()
        latest = plan.latest(client, queues)
        for mq in [mq for mq, off in begin.items() if off == LATEST and mq in latest]:
            # The initial offset's "latest": batch 0 starts (and ends) the queue where it
            # is now, or at Trigger.AvailableNow's target, taken before.
            target = self._target.get(mq) if self._target is not None else None
            begin[mq] = latest[mq] if target is None else min(latest[mq], target)
        new = [mq for mq in queues if mq not in begin]
        if new:  # queues or topics that appeared since: from their earliest
            log.info("new queues %s start at their earliest offset", [str(q) for q in new])
            begin.update(plan.earliest(client, new))
        for mq in [mq for mq in latest if latest[mq] < begin[mq]]:
            # The queue ends before where the stream is: the store was replaced (or a
            # topic re-created). partitions() plans such a queue from its earliest.
            report_data_loss(
                _shrunk(mq, begin[mq], latest[mq]), opts["failOnDataLoss"], instead=_RESTART
            )
            begin[mq] = client.min_offset(mq)
        if self._target is not None:
            # (a start past the target, as a starting timestamp resolved after it: empty)
            latest = {
                mq: max(begin[mq], min(off, self._target[mq])) if mq in self._target else begin[mq]
                for mq, off in latest.items()
            }
        end = dict(latest)
        for mq, off in begin.items():
            if mq not in end:  # a queue no longer subscribed keeps its position
                end[mq] = off
        backlog = {mq: max(0, latest[mq] - begin[mq]) for mq in latest}
        total = sum(backlog.values())
        if not isinstance(limit, ReadAllAvailable):
            max_rows = opts.get("maxOffsetsPerTrigger")
            if isinstance(limit, ReadMaxRows):
                max_rows = limit.max_rows
            min_rows = opts.get("minOffsetsPerTrigger") if self._target is None else None
            if min_rows and 0 < total < min_rows:
                now = time.monotonic()
                if self._waiting_since is None:
                    self._waiting_since = now
                if (now - self._waiting_since) * 1000 < opts["maxTriggerDelay"]:
                    return start  # wait for more (no batch this trigger)
            if max_rows and total > max_rows:
                end = _rate_limit(begin, latest, backlog, total, max_rows) | {
                    mq: off for mq, off in begin.items() if mq not in latest
                }
        if any(end[mq] != begin.get(mq) for mq in end):
            self._waiting_since = None
        result = to_json(end)
        self._last_end = result
        return result

    def reportLatestOffset(self) -> dict | None:
        client = self.plan.client.connect()
        return to_json(self.plan.latest(client, self.plan.queues(client)))

    # -- partitions and reading ------------------------------------------------------------

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        plan = self.plan
        client = plan.client.connect()
        begin, stop = from_json(start), from_json(end)
        ranges = {}
        for mq, e in stop.items():
            s = begin.get(mq)
            if s is None:
                s = client.min_offset(mq)
            elif s == LATEST:  # batch 0 of a queue that starts at its latest offset
                s = e
            elif e < s:
                # latestOffset found the queue ending before the stream's position and
                # (failOnDataLoss=false) restarted it at its earliest: read up to e.
                # (Spark 4.0/4.1 do not tell latestOffset where a restarted query is.)
                report_data_loss(
                    _shrunk(mq, s, e), plan.options["failOnDataLoss"], instead=_RESTART
                )
                s = min(client.min_offset(mq), e)
            if e > s:
                ranges[mq] = plan.check_range(client, mq, s, e)
        return plan.split(client, ranges)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        # With no partitions planned, Spark still runs one task, with no partition value.
        return read_range(partition) if isinstance(partition, QueueRange) else iter(())

    def commit(self, end: dict) -> None:
        self._commit_group(self.plan.client.connect(), end)

    def _commit_group(self, client: Client, processed: dict) -> None:
        """Commit the group's offsets of the queues still read (as RocketMQ's consumer,
        which drops a queue it no longer has): not a queue of a topic that shrank."""
        group = self.plan.options.get("group")
        if not group or processed == self._group_committed:
            return
        live = set(self.plan.queues(client))
        client.commit_offsets(
            group,
            {mq: off for mq, off in from_json(processed).items() if mq in live and off >= 0},
        )
        self._group_committed = processed

    def stop(self) -> None:
        pass


_RESTART = "restart such a queue at its earliest offset"


def report_data_loss(message: str, fail: bool, *, instead: str) -> None:
    """Fail the query, or warn and go on, over offsets that can no longer be read.

    The one failOnDataLoss path, as Spark's Kafka connector has: ``message``
    says what was planned and what the queue holds; ``instead`` what a query
    with failOnDataLoss=false does (the caller then does it).
    """
    if fail:
        raise OffsetOutOfRangeError(
            f"{message}; some data may have been lost. Set failOnDataLoss=false to "
            f"{instead} instead of failing."
        )
    log.warning("%s; going on: %s (failOnDataLoss=false)", message, instead)


def _shrunk(mq: MessageQueue, position: int, end: int) -> str:
    return (
        f"queue {mq}: the stream is at offset {position} but the queue ends at {end} "
        "(was the store replaced, or the topic re-created?)"
    )


def _rate_limit(
    begin: Positions, latest: Positions, backlog: dict[MessageQueue, int], total: int, limit: int
) -> Positions:
    """Share ``limit`` offsets among queues in proportion to their backlog.

    As Kafka's connector does, a queue whose share rounds below one still gets
    one offset, so a small queue is never starved by a big one.
    """
    out = {}
    for mq, size in backlog.items():
        if size == 0:
            out[mq] = begin[mq]
            continue
        share = limit * size / total
        take = math.ceil(share) if share < 1 else math.floor(share)
        out[mq] = min(latest[mq], begin[mq] + take)
    return out


def _one_or_all(brokers: Sequence[str]) -> str:
    """Brokers for a message: ``'broker-a'`` or ``['broker-a', 'broker-b']``."""
    if not brokers:
        return "none"
    return repr(brokers[0]) if len(brokers) == 1 else repr(list(brokers))

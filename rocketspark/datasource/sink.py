"""The sink side: DataFrame rows → messages, exactly once through transactional half messages.

Exactly-once (the default) works like this, per streaming query ("sink id"):

1. Every task writes its rows as half messages (invisible to consumers) tagged
   with the sink id and the id of this run of the query, and reports the
   half-queue offset runs it wrote.
2. ``commit(messages, batchId)`` on the driver: if the ledger
   (``config/rocketsparkSinks.json`` in the store) says this batch id, or a
   later one, is committed already, the batch is a replay after a restart and
   its halves are rolled back. Otherwise the ledger records the batch as
   pending with its runs, the halves are committed, and the ledger records
   the batch as committed.
3. ``abort`` rolls the halves back.
4. Before each commit (or abort), a pending batch left by a crash between 2's
   steps is committed, and every other open half of this sink (task attempts
   that failed, batches never committed, runs that were killed) is rolled
   back: Spark runs one micro-batch at a time, so nothing else can be open.

Spark creates the writer afresh in different processes for planning and for
each commit, so all of this state lives in the store, never in the writer.

At-least-once writes messages directly.
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from rocketspark.datasource.options import ParsedOptions
from rocketspark.datasource.stores import StoreRef
from rocketspark.errors import ConfigError, UnknownTopicError
from rocketspark.store import Message

try:  # Spark 4.1+
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase
except ImportError:  # pragma: no cover - Spark 4.0: rows, converted below
    from pyspark.sql.datasource import DataSourceStreamWriter as _StreamWriterBase

log = logging.getLogger(__name__)

_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
# column -> (accepted Spark types, description for errors)
SINK_COLUMNS: dict[str, tuple[tuple[type, ...], str]] = {
    "body": ((BinaryType, StringType), "binary or string, required"),
    "topic": ((StringType,), "string"),
    "tags": ((StringType,), "string"),
    "keys": ((StringType, ArrayType), "string or array<string>"),
    "properties": ((MapType,), "map<string,string>"),
    "queueId": (_INTEGRAL, "int"),
    "shardingKey": ((StringType,), "string"),
    "delayLevel": (_INTEGRAL, "int"),
}
PROPERTY_SINK_ID = "RS_SINK"
# Messages per store call: bounds memory and lock hold times in a task.
WRITE_CHUNK = 8192


def _expected() -> str:
    return ", ".join(f"{name} ({desc})" for name, (_, desc) in SINK_COLUMNS.items())


def validate_schema(schema: StructType, default_topic: str | None,
                    exactly_once: bool) -> tuple[str, ...]:
    """Check the input columns before anything is written; return their names in order."""
    names = []
    for f in schema.fields:
        spec = SINK_COLUMNS.get(f.name)
        if spec is None:
            close = difflib.get_close_matches(f.name, list(SINK_COLUMNS), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"the rocketmq sink does not know the column {f.name!r}{hint}; expected "
                f"columns: {_expected()}. Select or rename the columns to write.")
        types, desc = spec
        t = f.dataType
        ok = isinstance(t, types)
        if isinstance(t, ArrayType):
            ok = ok and isinstance(t.elementType, StringType)
        if isinstance(t, MapType):
            ok = isinstance(t.keyType, StringType) and isinstance(t.valueType, StringType)
        if not ok:
            raise ConfigError(f"column {f.name!r} has type {t.simpleString()}; the rocketmq "
                              f"sink expects {desc}. Expected columns: {_expected()}")
        names.append(f.name)
    if "body" not in names:
        raise ConfigError(f"the rocketmq sink needs a body column; expected columns: "
                          f"{_expected()}")
    if "topic" not in names and not default_topic:
        raise ConfigError("no topic to write to: give the option topic or a topic column")
    if exactly_once and "delayLevel" in names:
        raise ConfigError("column delayLevel: delayed messages cannot be transactional; write "
                          "with deliveryGuarantee=at_least_once to use delay levels")
    return tuple(names)


@dataclass(frozen=True)
class SinkPlan:
    store: StoreRef
    columns: tuple[str, ...]
    default_topic: str | None
    exactly_once: bool
    sink_id: str
    producer_group: str
    txn_version: int | None = None  # an idempotent batch write's version (txnVersion)

    @classmethod
    def create(cls, options: ParsedOptions, schema: StructType, *, streaming: bool) -> SinkPlan:
        topics = options.get("topic")
        if topics and len(topics) > 1:
            raise ConfigError(f"option topic: the sink writes to one default topic, got "
                              f"{', '.join(topics)} (use a topic column to route rows)")
        default_topic = topics[0] if topics else None
        exactly_once = options["deliveryGuarantee"] == "exactly_once"
        columns = validate_schema(schema, default_topic, exactly_once)
        ref = StoreRef.resolve(options.get("store"), options.store_overrides)
        store = ref.open()
        if default_topic and not store.has_topic(default_topic) and \
                not store.config.auto_create_topic_enable:
            raise UnknownTopicError(
                f"option topic: topic {default_topic!r} does not exist in store {store.root}; "
                "create it first (rocketspark topic create)")
        app, version = options.get("txnAppId"), options.get("txnVersion")
        if (app is None) != (version is None):
            raise ConfigError("options txnAppId and txnVersion go together: give both or neither")
        if app is not None and (streaming or not exactly_once):
            raise ConfigError("txnAppId / txnVersion make a batch write idempotent; they need "
                              "deliveryGuarantee=exactly_once and do not apply to streams "
                              "(a stream's batches are idempotent by themselves)")
        sink_id = options.get("sinkId")
        if app is not None:
            sink_id = "txn-" + hashlib.sha1(app.encode()).hexdigest()[:16]
        if sink_id is None:
            where = options.raw.get("checkpointlocation")
            if streaming and exactly_once and not where:
                raise ConfigError("an exactly-once stream needs the option checkpointLocation "
                                  "(or sinkId) to recognise its batches after a restart")
            sink_id = hashlib.sha1(os.path.abspath(where).encode()).hexdigest()[:16] \
                if where else "batch"
        group = options.get("producerGroup") or f"rocketspark-sink-{sink_id}"
        from rocketspark.store.config import validate_group
        validate_group(group)
        return cls(ref, columns, default_topic, exactly_once, sink_id, group, version)


@dataclass(frozen=True)
class SinkCommit(WriterCommitMessage):
    """What one task wrote: half-queue offset runs [start, end) and the message count."""

    runs: tuple[tuple[int, int], ...]
    count: int


def _batch_columns(batch: pa.RecordBatch) -> tuple[dict[str, list[Any]], int]:
    cols = {}
    for i, name in enumerate(batch.schema.names):
        col = batch.column(i)
        if name == "body" and pa.types.is_string(col.type):
            col = col.cast(pa.binary())  # same UTF-8 bytes, as bytes objects: the store's
        elif name == "body" and pa.types.is_large_string(col.type):  # uniform path
            col = col.cast(pa.large_binary())
        cols[name] = col.to_pylist()
    return cols, batch.num_rows


def _rows_columns(rows: Sequence[Any], names: Sequence[str]) -> tuple[dict[str, list[Any]], int]:
    cols: dict[str, list[Any]] = {name: [] for name in names}
    for r in rows:
        for name, v in zip(names, r):
            cols[name].append(v)
    return cols, len(rows)


def _store_columns(plan: SinkPlan, cols: dict[str, list[Any]]) -> dict[str, Any]:
    """Sink columns → keyword arguments of MessageStore.put_columns / prepare_columns."""
    return {"topic": plan.default_topic, "topics": cols.get("topic"), "tags": cols.get("tags"),
            "keys": cols.get("keys"), "properties": cols.get("properties"),
            "queue_ids": cols.get("queueId"), "sharding_keys": cols.get("shardingKey")}


def write_task(plan: SinkPlan, iterator: Iterator[Any]) -> SinkCommit:
    """Write one task's input; return the runs of half messages (exactly-once)."""
    store = plan.store.open()
    runs: list[tuple[int, int]] = []
    count = 0
    extra = {PROPERTY_SINK_ID: plan.sink_id}
    pending_rows: list[Any] = []

    def flush(cols: dict[str, list[Any]], n: int) -> None:
        nonlocal count
        for a in range(0, n, WRITE_CHUNK):
            part = {k: v[a:a + WRITE_CHUNK] for k, v in cols.items()}
            bodies = part.pop("body")
            kw = _store_columns(plan, part)
            if plan.exactly_once:
                rs = store.prepare_columns(bodies, producer_group=plan.producer_group,
                                           extra_properties=extra, **kw)
                first, last = rs[0].queue_offset, rs[-1].queue_offset
                assert last - first + 1 == len(rs)  # one lock: a consecutive run
                if runs and runs[-1][1] == first:
                    runs[-1] = (runs[-1][0], last + 1)
                else:
                    runs.append((first, last + 1))
            elif "delayLevel" in part:
                store.put_batch(_messages(plan, bodies, kw, part["delayLevel"]))
            else:
                store.put_columns(bodies, **kw)
            count += len(bodies)

    for item in iterator:
        if isinstance(item, pa.RecordBatch):
            if item.num_rows:
                flush(*_batch_columns(item))
        else:
            pending_rows.append(item)
            if len(pending_rows) >= WRITE_CHUNK:
                flush(*_rows_columns(pending_rows, plan.columns))
                pending_rows = []
    if pending_rows:
        flush(*_rows_columns(pending_rows, plan.columns))
    return SinkCommit(tuple(runs), count)


def _messages(plan: SinkPlan, bodies: list[Any], kw: dict[str, Any],
              delays: list[int | None]) -> list[Message]:
    """Messages with delay levels (at-least-once only): the per-record path."""
    n = len(bodies)

    def col(name: str) -> list[Any]:
        return kw.get(name) or [None] * n

    out = []
    for i, (b, t, tg, k, p, q, sk) in enumerate(zip(
            bodies, col("topics"), col("tags"), col("keys"), col("properties"),
            col("queue_ids"), col("sharding_keys"))):
        if b is None:
            raise ConfigError(f"row {i} of a batch has a null body; RocketMQ messages need one")
        out.append(Message(t or plan.default_topic, b, tags=tg, keys=k or (),
                           properties=dict(p) if p else {}, queue_id=q, sharding_key=sk,
                           delay_level=delays[i] or 0))
    return out


def _offsets(messages: Sequence[WriterCommitMessage | None]) -> np.ndarray:
    runs = _runs(messages)
    if not runs:
        return np.empty(0, dtype=np.int64)
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in runs])


def _runs(messages: Sequence[WriterCommitMessage | None]) -> list[tuple[int, int]]:
    return [r for m in messages if isinstance(m, SinkCommit) for r in m.runs]


def finish_pending(plan: SinkPlan) -> int:
    """Commit a batch the ledger shows half-committed (a crash inside ``commit``)."""
    store = plan.store.open()
    _, pending = store.sink_ledger.get(plan.sink_id)
    if pending is None:
        return 0
    batch_id, runs = pending
    offsets = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in runs])
    log.warning("sink %s: finishing the commit of batch %d (%d messages) left by a crash",
                plan.sink_id, batch_id, len(offsets))
    store.commit_transaction(offsets)
    store.sink_ledger.finish(plan.sink_id, batch_id)
    return len(offsets)


def roll_back_orphans(plan: SinkPlan, keep: np.ndarray) -> int:
    """Roll back this sink's open half messages other than ``keep``.

    Called when a batch commits or aborts: Spark runs one micro-batch at a
    time, so any other open half of this sink comes from a task attempt that
    failed, a batch that was never committed, or a run that was killed.
    """
    store = plan.store.open()
    orphans = [h.queue_offset for h in store.open_transactions(plan.producer_group,
                                                                 exclude=keep)
               if h.properties.get(PROPERTY_SINK_ID) == plan.sink_id]
    if orphans:
        log.warning("sink %s: rolling back %d half messages that no batch committed",
                    plan.sink_id, len(orphans))
        store.rollback_transaction(orphans)
    return len(orphans)


def commit_batch(plan: SinkPlan, messages: Sequence[WriterCommitMessage | None],
                 batch_id: int) -> bool:
    """Commit one batch's halves unless the ledger has it; False for a replay."""
    store = plan.store.open()
    finish_pending(plan)
    offsets = _offsets(messages)
    roll_back_orphans(plan, offsets)
    ledger = store.sink_ledger
    committed, _ = ledger.get(plan.sink_id)
    if batch_id <= committed:
        log.warning("sink %s: batch %d was committed before (a replay after a restart); "
                    "discarding its %d new half messages", plan.sink_id, batch_id,
                    len(offsets))
        store.rollback_transaction(offsets)
        return False
    ledger.begin(plan.sink_id, batch_id, _runs(messages))
    store.commit_transaction(offsets)
    ledger.finish(plan.sink_id, batch_id)
    return True


class RocketMQStreamWriter(_StreamWriterBase):
    """``df.writeStream.format("rocketmq")``.

    Spark creates this writer afresh for planning and for every commit, in
    different processes: it keeps no state of its own; the store's ledger does.
    """

    def __init__(self, plan: SinkPlan):
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        return write_task(self.plan, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.plan.exactly_once:
            commit_batch(self.plan, messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.plan.exactly_once:
            self.plan.store.open().rollback_transaction(_offsets(messages))
            roll_back_orphans(self.plan, np.empty(0, dtype=np.int64))


class RocketMQBatchWriter(DataSourceArrowWriter):
    """``df.write.format("rocketmq")``: append only; exactly-once makes the job atomic."""

    def __init__(self, plan: SinkPlan):
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        return write_task(self.plan, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.plan.txn_version is not None:
            commit_batch(self.plan, messages, self.plan.txn_version)
        elif self.plan.exactly_once:
            self.plan.store.open().commit_transaction(_offsets(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.plan.exactly_once:
            self.plan.store.open().rollback_transaction(_offsets(messages))

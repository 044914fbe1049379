"""The sink side: DataFrame rows → messages, exactly once through transactional half messages.

The ledger and the commit protocol are in ``ledger.py``; in short, per
streaming query ("sink id"):

1. Every task writes its rows as half messages (invisible to consumers) tagged
   with the sink id, and reports the half-queue offset runs it wrote and the
   streaming query's id (Spark's, kept in the checkpoint).
2. ``commit(messages, batchId)`` on the driver: if the ledger
   (``client.sink_ledger()``) says this batch id, or a
   later one, is committed already by the same query, the batch is a replay
   after a restart and its halves are rolled back. Otherwise the ledger
   records the batch as pending with its runs, the halves are committed, and
   the ledger records the batch as committed. A query id other than the
   ledger's means the checkpoint was replaced (deleted, or a new query at the
   same location): its batch ids start again, so the ledger's are not compared.
3. ``abort`` rolls the halves back.
4. Before each commit (or abort), a pending batch left by a crash between 2's
   steps is committed, and every other open half of this sink (task attempts
   that failed, batches never committed, runs that were killed) is rolled
   back: Spark runs one micro-batch at a time, so nothing else can be open.

A batch ``df.write`` (exactly once, no ``txnAppId``) gets a sink id of its own
per job, so that its commit (or abort) also rolls back the halves of its failed
task attempts.

Every exactly-once batch job also has a gate in the ledger (the embedded
store: a job file ``config/rocketsparkSinkJobs/<job>.lock``), opened when Spark
plans the write: a task writes each chunk of halves through it, and only while
it is open; the job's commit or abort shuts it (waiting for chunks under way),
then resolves the halves. A task Spark has not stopped yet when its job ends
(cancelled, speculative) then writes nothing more, so once a batch write ends
no half of it stays open.

Spark creates the writer afresh in different processes for planning and for
each commit, so all of this state lives behind the client, never in the writer.

At-least-once writes messages directly.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import logging
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

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

from rocketspark.client import ClientRef, Message, PutResult, validate_group
from rocketspark.datasource.ledger import (
    SinkCommit,
    abort_batch,
    commit_batch,
    commit_job,
    default_producer_group,
    register_answer,
)
from rocketspark.datasource.locations import location_key
from rocketspark.datasource.options import ParsedOptions, client_ref
from rocketspark.errors import ConfigError, UnknownTopicError
from rocketspark.message.model import (
    PROPERTY_FIRST_HALF,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_SINK_ID,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    PROPERTY_WRITER_ID,
    QUERY_ID_PROPERTY,
    RESERVED_PROPERTIES,
    is_system_topic,
)

try:  # Spark 4.1+
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase
except ImportError:  # pragma: no cover - Spark 4.0: rows, converted below
    # the other base class under the same name: mypy checks against Spark 4.1+'s
    from pyspark.sql.datasource import (  # type: ignore[assignment]
        DataSourceStreamWriter as _StreamWriterBase,
    )

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
# Property names a previous write (a transaction, a sink) set on a message: they
# describe that write, so the sink drops them from its input and sets its own. A row
# read from a topic an exactly-once sink wrote then goes back through a sink as-is.
# (TAGS, KEYS and DELAY, which the tags, keys and delayLevel columns carry, are
# refused instead: RESERVED_PROPERTIES.)
SINK_REPLACED_PROPERTIES = frozenset(
    {
        PROPERTY_TRANSACTION_PREPARED,
        PROPERTY_REAL_TOPIC,
        PROPERTY_REAL_QUEUE_ID,
        PROPERTY_PRODUCER_GROUP,
        PROPERTY_TRANSACTION_ID,
        PROPERTY_TRANSACTION_CHECK_TIMES,
        PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
        PROPERTY_FIRST_HALF,
        PROPERTY_SINK_ID,
        PROPERTY_WRITER_ID,
    }
)
# Messages per store call: bounds memory and lock hold times in a task.
WRITE_CHUNK = 8192


def _expected() -> str:
    return ", ".join(f"{name} ({desc})" for name, (_, desc) in SINK_COLUMNS.items())


def validate_schema(
    schema: StructType, default_topic: str | None, exactly_once: bool
) -> tuple[str, ...]:
    """Check the input columns before anything is written; return their names in order."""
    names = []
    for f in schema.fields:
        spec = SINK_COLUMNS.get(f.name)
        if spec is None:
            close = difflib.get_close_matches(f.name, list(SINK_COLUMNS), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"the rocketmq sink does not know the column {f.name!r}{hint}; expected "
                f"columns: {_expected()}. Select or rename the columns to write."
            )
        types, desc = spec
        t = f.dataType
        ok = isinstance(t, types)
        if isinstance(t, ArrayType):
            ok = ok and isinstance(t.elementType, StringType)
        if isinstance(t, MapType):
            ok = isinstance(t.keyType, StringType) and isinstance(t.valueType, StringType)
        if not ok:
            raise ConfigError(
                f"column {f.name!r} has type {t.simpleString()}; the rocketmq "
                f"sink expects {desc}. Expected columns: {_expected()}"
            )
        names.append(f.name)
    if "body" not in names:
        raise ConfigError(f"the rocketmq sink needs a body column; expected columns: {_expected()}")
    if "topic" not in names and not default_topic:
        raise ConfigError("no topic to write to: give the option topic or a topic column")
    if exactly_once and "delayLevel" in names:
        raise ConfigError(
            "column delayLevel: delayed messages cannot be transactional; write "
            "with deliveryGuarantee=at_least_once to use delay levels"
        )
    return tuple(names)


@dataclass(frozen=True)
class SinkPlan:
    client: ClientRef
    columns: tuple[str, ...]
    default_topic: str | None
    exactly_once: bool
    sink_id: str
    producer_group: str
    txn_version: int | None = None  # an idempotent batch write's version (txnVersion)
    job: str | None = None  # an exactly-once batch write's job (its job file), None: a stream

    @classmethod
    def create(cls, options: ParsedOptions, schema: StructType, *, streaming: bool) -> SinkPlan:
        topics = options.get("topic")
        if topics and len(topics) > 1:
            raise ConfigError(
                f"option topic: the sink writes to one default topic, got "
                f"{', '.join(topics)} (use a topic column to route rows)"
            )
        default_topic = topics[0] if topics else None
        if default_topic and is_system_topic(default_topic):
            raise ConfigError(
                f"option topic: {default_topic!r} is a RocketMQ system topic; "
                "the sink does not write there"
            )
        exactly_once = options["deliveryGuarantee"] == "exactly_once"
        columns = validate_schema(schema, default_topic, exactly_once)
        ref = client_ref(options).require()
        client = ref.connect()
        if default_topic and not client.has_topic(default_topic) and not client.auto_create_topics:
            raise UnknownTopicError(
                f"option topic: topic {default_topic!r} does not exist in {client.where}; "
                "create it first (rocketspark topic create)"
            )
        app, version = options.get("txnAppId"), options.get("txnVersion")
        if (app is None) != (version is None):
            raise ConfigError("options txnAppId and txnVersion go together: give both or neither")
        if app is not None and (streaming or not exactly_once):
            raise ConfigError(
                "txnAppId / txnVersion make a batch write idempotent; they need "
                "deliveryGuarantee=exactly_once and do not apply to streams "
                "(a stream's batches are idempotent by themselves)"
            )
        sink_id = options.get("sinkId")
        job = None if streaming or not exactly_once else uuid.uuid4().hex[:16]
        if app is not None:
            # Per application and topic, as Delta's txnAppId is per table: one
            # foreachBatch may write the same version to two topics (results, errors).
            sink_id = (
                "txn-" + hashlib.sha1(f"{app}\x00{default_topic or ''}".encode()).hexdigest()[:16]
            )
        if sink_id is None:
            where = options.raw.get("checkpointlocation")
            if streaming and exactly_once and not where:
                raise ConfigError(
                    "an exactly-once stream needs the option checkpointLocation (or sinkId) "
                    "to recognise its batches after a restart; a checkpoint location from "
                    "spark.sql.streaming.checkpointLocation is not passed to a Python data "
                    "source's writer, so give it as an option of this query"
                )
            if where:
                sink_id = hashlib.sha1(location_key(where).encode()).hexdigest()[:16]
            else:  # a batch write: one id per job (Spark plans the writer once a job)
                sink_id = "batch-" + (job or uuid.uuid4().hex[:16])
        group = options.get("producerGroup") or default_producer_group(sink_id)
        validate_group(group)
        if job is not None:
            client.sink_ledger().start_job(job)
        if exactly_once and ref.kind == "cluster":
            register_answer(client, group)  # check-backs reach the driver while it runs
        return cls(ref, columns, default_topic, exactly_once, sink_id, group, version, job)


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
        for name, v in zip(names, r, strict=False):
            cols[name].append(v)
    return cols, len(rows)


def _store_columns(plan: SinkPlan, cols: dict[str, list[Any]]) -> dict[str, Any]:
    """Sink columns → keyword arguments of Client.put_columns / prepare_columns."""
    return {
        "topic": plan.default_topic,
        "topics": cols.get("topic"),
        "tags": cols.get("tags"),
        "keys": cols.get("keys"),
        "properties": cols.get("properties"),
        "queue_ids": cols.get("queueId"),
        "sharding_keys": cols.get("shardingKey"),
    }


def write_task(plan: SinkPlan, iterator: Iterator[Any]) -> SinkCommit:
    """Write one task's input; return the runs of half messages (exactly-once)."""
    client = plan.client.connect()
    runs: list[tuple[int, int]] = []
    count = 0
    extra = {PROPERTY_SINK_ID: plan.sink_id}
    cluster = plan.client.kind == "cluster"
    writer = ""
    prepared: list[PutResult] = []
    if cluster and plan.exactly_once:
        # A cluster's check-backs name a half's writer; this process answers them too.
        writer = uuid.uuid4().hex
        extra[PROPERTY_WRITER_ID] = writer
        register_answer(client, plan.producer_group)
    pending_rows: list[Any] = []
    gate = client.sink_ledger().job_writes(plan.job) if plan.job is not None else None

    def flush(cols: dict[str, list[Any]], n: int) -> None:
        nonlocal count
        check_columns(cols)  # the whole input block, before any of it is written
        for a in range(0, n, WRITE_CHUNK):
            part = {k: v[a : a + WRITE_CHUNK] for k, v in cols.items()}
            bodies = part.pop("body")
            kw = _store_columns(plan, part)
            if plan.exactly_once:
                with gate.writing() if gate is not None else contextlib.nullcontext():
                    rs = client.prepare_columns(
                        bodies, producer_group=plan.producer_group, extra_properties=extra, **kw
                    )
                if cluster:
                    prepared.extend(rs)
                    count += len(bodies)
                    continue
                first, last = rs[0].queue_offset, rs[-1].queue_offset
                assert last - first + 1 == len(rs)  # one lock: a consecutive run
                if runs and runs[-1][1] == first:
                    runs[-1] = (runs[-1][0], last + 1)
                else:
                    runs.append((first, last + 1))
            elif "delayLevel" in part:
                client.put_batch(_messages(plan, bodies, kw, part["delayLevel"]))
            else:
                client.put_columns(bodies, **kw)
            count += len(bodies)

    try:
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
    finally:
        if gate is not None:
            gate.close()
    halves = tuple(client.halves(prepared, producer_group=plan.producer_group))
    return SinkCommit(tuple(runs), count, _task_query(), halves, writer)


@contextlib.contextmanager
def ending_job(plan: SinkPlan) -> Iterator[None]:
    """Run a batch job's commit or abort with its tasks' writes shut out, then end the job.

    Waits for the chunks of halves its tasks are writing (Spark may still be
    cancelling them when it aborts, or a speculative attempt may run on after
    the commit), so the block sees every half the job will ever have; the job
    ends even if the block raises (Spark calls abort after a failed commit),
    so no task writes after it. A job that has ended already: the block runs
    without waiting.
    """
    if plan.job is None:
        yield
        return
    with plan.client.connect().sink_ledger().ending_job(plan.job):
        yield


def check_columns(cols: dict[str, list[Any]]) -> None:
    """What the store's columnar path would take but a RocketMQ message must not carry.

    Refused: system topics in the topic column; in properties, empty names,
    null values and the names of message fields (a TAGS property would be read
    as the tag without its queue entry's tag code, a KEYS one indexed instead
    of the keys column); in keys arrays, null, empty or space-holding keys
    (RocketMQ separates keys with spaces); null and empty bodies (RocketMQ's
    producer refuses them). Dropped from properties (in ``cols``):
    SINK_REPLACED_PROPERTIES.
    """
    bodies = cols.get("body")
    # C-level scans of the block; the store's per-chunk checks would come too late
    # for the chunks before (the exactly-once sink writes nothing of a bad block)
    if bodies is not None and (None in bodies or b"" in bodies or "" in bodies):
        i = next(i for i, b in enumerate(bodies) if b is None or not len(b))
        raise ConfigError(
            f"column body: row {i} of the batch has a "
            f"{'null' if bodies[i] is None else 'empty'} body; RocketMQ's "
            "producer refuses both (the message body is null / length is zero)"
        )
    topics = cols.get("topic")
    if topics is not None:
        for t in set(topics):
            if t == "":  # only null takes the default topic (the store refuses the name)
                raise ConfigError(
                    "column topic: a row has an empty topic name; give a topic "
                    "or null (null: the option topic)"
                )
            if t is not None and is_system_topic(t):
                raise ConfigError(
                    f"column topic: {t!r} is a RocketMQ system topic; the sink does not write there"
                )
    column: list[Any] = cols.get("properties") or []
    for i, props in enumerate(column):
        if not props:
            continue
        pairs = props.items() if isinstance(props, dict) else props
        replaced = False
        for name, value in pairs:
            if not name:
                raise ConfigError("column properties: a property name is empty")
            if value is None:
                raise ConfigError(
                    f"column properties: property {name!r} is null (leave it "
                    "out of the map, or give a string)"
                )
            if name in RESERVED_PROPERTIES:
                raise ConfigError(
                    f"column properties: {name!r} is set by the sink itself; use the tags, "
                    "keys and delayLevel columns (UNIQ_KEY may be given)"
                )
            replaced = replaced or name in SINK_REPLACED_PROPERTIES
        if replaced:
            column[i] = [(k, v) for k, v in pairs if k not in SINK_REPLACED_PROPERTIES]
    for keys in cols.get("keys") or ():
        if keys is None or isinstance(keys, str):
            continue
        for key in keys:
            if not key or " " in key:
                raise ConfigError(
                    f"column keys: key {key!r} is null, empty or holds a space "
                    "(RocketMQ separates keys with spaces)"
                )


def _task_query() -> str | None:
    """The streaming query id Spark gives this task (None outside a stream's task)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return None if context is None else context.getLocalProperty(QUERY_ID_PROPERTY)


def _messages(
    plan: SinkPlan, bodies: list[Any], kw: dict[str, Any], delays: list[int | None]
) -> list[Message]:
    """Messages with delay levels (at-least-once only): the per-record path."""
    n = len(bodies)

    def col(name: str) -> list[Any]:
        return kw.get(name) or [None] * n

    out = []
    for i, (b, t, tg, k, p, q, sk) in enumerate(
        zip(
            bodies,
            col("topics"),
            col("tags"),
            col("keys"),
            col("properties"),
            col("queue_ids"),
            col("sharding_keys"),
            strict=False,
        )
    ):
        if b is None:
            raise ConfigError(f"row {i} of a batch has a null body; RocketMQ messages need one")
        out.append(
            Message(
                # None (a null topic, no option topic): Message refuses it by name
                t or plan.default_topic,  # type: ignore[arg-type]
                b,
                tags=tg,
                keys=k or (),
                properties=dict(p) if p else {},
                queue_id=q,
                sharding_key=sk,
                delay_level=delays[i] or 0,
            )
        )
    return out


class RocketMQStreamWriter(_StreamWriterBase):
    """``df.writeStream.format("rocketmq")``.

    Spark creates this writer afresh for planning and for every commit, in
    different processes: it keeps no state of its own; the client's ledger does.
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
            abort_batch(self.plan, messages)


class RocketMQBatchWriter(DataSourceArrowWriter):
    """``df.write.format("rocketmq")``: append only; exactly-once makes the job atomic."""

    def __init__(self, plan: SinkPlan):
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        return write_task(self.plan, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if not self.plan.exactly_once:
            return
        with ending_job(self.plan):
            if self.plan.txn_version is not None:
                commit_batch(self.plan, messages, self.plan.txn_version)
            else:
                # The job's own sink id: its other open halves are failed task attempts'.
                commit_job(self.plan, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.plan.exactly_once:
            with ending_job(self.plan):
                abort_batch(self.plan, messages)

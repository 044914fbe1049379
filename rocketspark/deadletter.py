"""Retries and dead letters for Spark pipelines, and their Delta tables.

RocketMQ's answer to a message that fails: send it back to ``%RETRY%group``
with a growing delay (levels 3..18), and after the group's maxReconsumeTimes
(16) park it in ``%DLQ%group``. Here:

- :class:`RetryPipeline` runs a streaming query over a topic *and* its group's
  retry topic; the user's ``process(batch_df, batch_id)`` returns the rows that
  failed (named by ``msgId``), with a ``reason``; they are sent back with the
  reason, the first failure time and the original topic and msgId as properties. All sends of a
  micro-batch are one append, marked with a key naming the pipeline (its
  checkpoint and Spark's query id) and batch: a batch Spark replays after a
  restart finds the mark and sends nothing twice.
- :func:`materialize` mirrors ``%RETRY%group`` (one row per retry attempt) and
  ``%DLQ%group`` (one row per dead letter) into Delta tables partitioned by day,
  merging on ``msgId``: a new checkpoint (or a replayed batch) adds no row twice.
- :func:`replay` sends selected dead letters back to their original topic,
  exactly once: half messages, then a Delta MERGE stamping ``replayedAt`` and a
  ``replayId``, then the commit; an interrupted replay is finished (or rolled
  back) by the next replay of the same table according to what the table says.
  Replays of one table take turns (a client lock); replays of different
  tables never touch each other's half messages.

Everything here goes through :mod:`rocketspark.client`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rocketspark.client import Client, ClientRef, Message, TransactionState
from rocketspark.datasource.locations import location_key
from rocketspark.errors import ConfigError, RocketSparkError, UnknownTopicError
from rocketspark.message.model import (
    PROPERTY_CONSUME_START_TIMESTAMP,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_FAILURE_REASON,
    PROPERTY_FIRST_FAILURE,
    PROPERTY_FIRST_HALF,
    PROPERTY_KEYS,
    PROPERTY_MAX_OFFSET,
    PROPERTY_MIN_OFFSET,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_REPLAY,
    PROPERTY_REPLAY_ID,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_SINK_ID,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    QUERY_ID_PROPERTY,
    SCHEDULE_TOPIC,
    dlq_topic,
    retry_topic,
)

log = logging.getLogger(__name__)

REPLAY_GROUP = "rocketspark-replay"  # + "-" and a hash of the table: one group a table
# Properties a replayed message does not carry over from its dead letter: the retry
# bookkeeping, the failure (a replayed message that fails again is a new incident),
# the transaction of an earlier write or replay, and the sink that wrote it (a replay's
# half carrying a batch write's RS_SINK was taken for that write's abandoned half).
# UNIQ_KEY, TAGS and KEYS appear only in tables materialised before rows' properties
# left them to their own columns.
_RETRY_ONLY = (
    PROPERTY_RETRY_TOPIC,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    PROPERTY_TAGS,
    PROPERTY_KEYS,
    PROPERTY_MAX_OFFSET,
    PROPERTY_MIN_OFFSET,
    PROPERTY_CONSUME_START_TIMESTAMP,
    PROPERTY_FAILURE_REASON,
    PROPERTY_FIRST_FAILURE,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    PROPERTY_FIRST_HALF,
    PROPERTY_SINK_ID,
    PROPERTY_REPLAY,
    PROPERTY_REPLAY_ID,
)

Process = Callable[[Any, int], Any]


@dataclass(frozen=True)
class _Endpoint:
    """Where the pipeline's RocketMQ is: a store (and its overrides) or a cluster."""

    ref: ClientRef
    # the data source options that reach it (a cluster's may hold the ACL secret: no repr)
    options: dict[str, str] = field(repr=False)

    def reader(self, spark: Any) -> Any:
        r = spark.readStream.format("rocketmq")
        for k, v in self.options.items():
            r = r.option(k, v)
        return r


def _endpoint(
    store: str | None,
    overrides: dict[str, str] | None = None,
    name_server: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
) -> _Endpoint:
    """An embedded store (``store``, the default) or a cluster (``name_server``)."""
    if name_server is None:
        if access_key or secret_key:
            raise ConfigError("access_key / secret_key apply to a cluster: give name_server too")
        ref = ClientRef.embedded(store, overrides or {})
        options = {
            "store": ref.address,
            **{f"rocketmq.{k}": v for k, v in (overrides or {}).items()},
        }
        return _Endpoint(ref, options)
    if store is not None or overrides:
        raise ConfigError("store / store_options and name_server exclude each other: give one")
    ref = ClientRef.cluster(name_server, access_key=access_key, secret_key=secret_key)
    options = {"nameServer": name_server}
    if ref.credentials is not None:
        options["accessKey"], options["secretKey"] = ref.credentials
    return _Endpoint(ref, options)


# --- retries inside a pipeline --------------------------------------------------------


@dataclass
class RetryPipeline:
    """A streaming query over ``topic`` and ``%RETRY%group`` with RocketMQ's retry rules.

    ``process(batch_df, batch_id)`` does the work and returns a DataFrame of
    the rows that failed (any columns of the input, at least ``msgId``, plus a
    string ``reason``), or None when nothing failed. A DataFrame without
    ``msgId`` but with ``commitLogOffset`` (as pipelines wrote before rows were
    named by msgId) still works against one broker. Rows of the retry
    topic have ``topic`` = ``%RETRY%group``, the original topic in
    ``properties['RETRY_TOPIC']`` and ``reconsumeTimes`` raised by one per attempt.
    """

    spark: Any
    topic: str
    group: str
    process: Process
    checkpoint: str
    store: str | None = None
    store_options: dict[str, str] | None = None
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    name_server: str | None = None
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._endpoint = _endpoint(
            self.store, self.store_options, self.name_server, self.access_key, self.secret_key
        )
        self._ref = self._endpoint.ref
        client = self._ref.connect()
        if not client.has_topic(self.topic):
            raise UnknownTopicError(f"topic {self.topic!r} does not exist in {client.where}")
        if not client.has_topic(retry_topic(self.group)):
            client.create_topic(retry_topic(self.group), queues=1)
        client.ensure_group(self.group)
        self._location = location_key(self.checkpoint)
        self.pipeline_id = hashlib.sha1(self._location.encode()).hexdigest()[:12]

    def reader(self) -> Any:
        r = (
            self._endpoint.reader(self.spark)
            .option("topic", f"{self.topic},{retry_topic(self.group)}")
            .option("group", self.group)
            .option("startingOffsets", self.starting_offsets)
        )
        if self.max_offsets_per_trigger:
            r = r.option("maxOffsetsPerTrigger", str(self.max_offsets_per_trigger))
        from pyspark.sql import functions as F

        # the batch marks set by send_back are ours, not the user's keys
        return r.load().withColumn("keys", F.filter("keys", lambda k: ~k.startswith("rs-retry-")))

    def start(
        self, *, processing_time: str | None = "1 second", available_now: bool = False
    ) -> Any:
        """Start the query (``available_now``: process what is there, then stop)."""
        w = (
            self.reader()
            .writeStream.foreachBatch(self._batch)
            .option("checkpointLocation", self.checkpoint)
        )
        if available_now:
            w = w.trigger(availableNow=True)
        elif processing_time:
            w = w.trigger(processingTime=processing_time)
        return w.start()

    def _batch(self, batch_df: Any, batch_id: int) -> None:
        client = self._ref.connect()
        failed = self.process(batch_df, batch_id)
        if failed is not None and not hasattr(failed, "select"):
            raise ConfigError(
                f"process() returned a {type(failed).__name__}; it returns a "
                "DataFrame of the failed rows (msgId, reason) or None"
            )
        try:
            name = (
                "commitLogOffset"
                if failed is not None
                and "msgId" not in failed.columns
                and "commitLogOffset" in failed.columns
                else "msgId"
            )
            rows = [] if failed is None else failed.select(name, "reason").collect()
        except Exception as e:
            if "AnalysisException" in type(e).__name__:
                raise ConfigError(
                    "the DataFrame process() returned needs the columns "
                    "msgId (of the input rows) and reason: "
                    f"{str(e).splitlines()[0]}"
                ) from e
            raise
        if rows:
            self.send_back(rows, batch_id, _query_id(batch_df))
        client.tick()  # deliver retries that are due (no daemon in embedded use)

    def send_back(self, rows: list[Any], batch_id: int, query_id: str | None = None) -> int:
        """Send failed rows back (once per batch id, even when Spark replays the batch).

        ``rows`` have ``msgId`` (of a message of this pipeline's topic or retry
        topic; or, from pipelines written before, ``commitLogOffset``) and
        ``reason``; a message named twice is sent back once.
        ``query_id`` (Spark's, kept in the checkpoint) tells a new checkpoint at
        the same location, whose batch ids start again, from a restart.
        """
        client = self._ref.connect()
        pipeline = (
            self.pipeline_id
            if query_id is None
            else hashlib.sha1(f"{self._location}\x00{query_id}".encode()).hexdigest()[:12]
        )
        mark = f"rs-retry-{pipeline}-{batch_id}"
        for t in (retry_topic(self.group), dlq_topic(self.group), SCHEDULE_TOPIC):
            if client.has_topic(t) and client.query_by_key(t, mark, max_num=1):
                log.info(
                    "pipeline %s: retries of batch %d were sent before; not again",
                    self.pipeline_id,
                    batch_id,
                )
                return 0
        now = str(int(time.time() * 1000))
        ids, props = [], []
        ours = (self.topic, retry_topic(self.group))
        seen: set[str] = set()
        for r in rows:
            name, given = _failed_row_id(r)
            if given is None:
                continue
            try:
                # msgIds are hex: one message named in either case is sent back once
                msg_id = client.message_id_at(int(given)) if name != "msgId" else str(given).upper()
                if msg_id in seen:
                    continue
                seen.add(msg_id)
                m = client.get_message(msg_id)
            except RocketSparkError as e:  # not there, damaged, or another broker's
                raise ConfigError(
                    f"process() returned {name} {given}, which is not a message of this batch: {e}"
                ) from e
            if m.topic not in ours:
                raise ConfigError(
                    f"process() returned {name} {given}, a message of "
                    f"topic {m.topic!r}; failed rows come from the batch, whose "
                    f"topics are {ours[0]!r} and {ours[1]!r}"
                )
            ids.append(msg_id)
            keys = " ".join([*(k for k in m.keys if not k.startswith("rs-retry-")), mark])
            props.append(
                {
                    PROPERTY_FAILURE_REASON: _reason_text(r.reason),
                    PROPERTY_FIRST_FAILURE: m.properties.get(PROPERTY_FIRST_FAILURE, now),
                    PROPERTY_KEYS: keys,
                }
            )
        return client.send_back(self.group, ids, properties=props)


def _failed_row_id(row: Any) -> tuple[str, Any]:
    """What names a failed row's message: ("msgId", id), or ("commitLogOffset", offset) in
    rows of pipelines written before rows were named by msgId (one broker only)."""
    fields = row.asDict() if hasattr(row, "asDict") else row._asdict()
    if "msgId" in fields:
        return "msgId", fields["msgId"]
    if "commitLogOffset" in fields:
        return "commitLogOffset", fields["commitLogOffset"]
    raise ConfigError(f"a failed row names no message (it needs msgId): {sorted(fields)}")


def _reason_text(reason: Any) -> str:
    """A failure reason as a property value: RocketMQ's separators and lone surrogates
    (which a property cannot hold) replaced by U+FFFD, cut at 2000 characters."""
    text = "" if reason is None else str(reason)[:2000]
    if "\x01" in text or "\x02" in text:
        text = text.replace("\x01", "\ufffd").replace("\x02", "\ufffd")
    return text.encode("utf-8", "replace").decode("utf-8") if not text.isascii() else text


def _query_id(batch_df: Any) -> str | None:
    """The id of the streaming query running this foreachBatch (None: not available)."""
    try:
        return batch_df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    except (NotImplementedError, AttributeError):  # Spark Connect: no SparkContext, so
        return None  # marks name the checkpoint only


# --- Delta tables ---------------------------------------------------------------------

_COMMON_COLUMNS = """
    coalesce(properties['RETRY_TOPIC'], topic) AS originTopic,
    msgId,
    coalesce(properties['ORIGIN_MESSAGE_ID'], msgId) AS originMsgId,
    uniqKey, filter(keys, k -> NOT startswith(k, 'rs-retry-')) AS keys, tags, body,
    properties, {reconsume} AS reconsumeTimes,
    properties['{reason}'] AS reason,
    timestamp_millis(cast(properties['{first}'] AS BIGINT)) AS firstFailureAt,
    storeTimestamp AS {at},
    to_date(storeTimestamp) AS day
"""


def _require_delta(spark: Any) -> None:
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:  # Spark Connect: no JVM at hand; Databricks has Delta built in
        return
    from py4j.java_gateway import JavaClass

    # py4j resolves names through Spark's class loader (which has spark.jars); an
    # unknown class comes back as a package.
    if not isinstance(jvm.io.delta.tables.DeltaTable, JavaClass):
        raise ConfigError(
            "Delta Lake is not available in this SparkSession: on Databricks it is built in; "
            "locally use rocketspark.session.local_session() (with the delta extra: pip "
            "install '.[delta]' in a clone, or ./dev setup for the jars) or delta's "
            "configure_spark_with_delta_pip"
        )


def _check_table_path(spark: Any, path: str) -> None:
    """A path holding something other than a Delta table is an error, not overwritten."""
    local = path[len("file:") :] if path.startswith("file:") else path
    if (
        os.path.isdir(local)
        and os.listdir(local)
        and not os.path.isdir(os.path.join(local, "_delta_log"))
    ):
        raise ConfigError(
            f"{path} exists and is not a Delta table (no _delta_log); give "
            "an empty directory or a Delta table's path"
        )


def materialize(
    spark: Any,
    *,
    group: str,
    retry_table: str,
    dlq_table: str,
    checkpoint: str,
    store: str | None = None,
    store_options: dict[str, str] | None = None,
    available_now: bool = False,
    name_server: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
) -> list[Any]:
    """Start the two streams mirroring %RETRY%group and %DLQ%group into Delta tables.

    Tables are partitioned by ``day``; the DLQ table also has ``replayedAt`` and
    ``replayId`` (set by :func:`replay`). Returns the two StreamingQuery objects.
    """
    _require_delta(spark)
    for p in (retry_table, dlq_table):
        _check_table_path(spark, p)
    endpoint = _endpoint(store, store_options, name_server, access_key, secret_key)
    client = endpoint.ref.connect()
    for t in (retry_topic(group), dlq_topic(group)):
        if not client.has_topic(t):
            client.create_topic(t, queues=1)
    queries = []
    for topic, path, at, extra in (
        (retry_topic(group), retry_table, "retriedAt", ""),
        (
            dlq_topic(group),
            dlq_table,
            "deadAt",
            ", CAST(NULL AS TIMESTAMP) AS replayedAt, CAST(NULL AS STRING) AS replayId",
        ),
    ):
        r = endpoint.reader(spark).option("topic", topic).option("startingOffsets", "earliest")
        # reconsumeTimes: how often the message was retried. A dead letter's record
        # carries one more (RocketMQ counts the send to the DLQ), the table does not.
        reconsume = "reconsumeTimes - 1" if at == "deadAt" else "reconsumeTimes"
        cols = (
            _COMMON_COLUMNS.format(
                reason=PROPERTY_FAILURE_REASON,
                first=PROPERTY_FIRST_FAILURE,
                at=at,
                reconsume=reconsume,
            )
            + extra
        )
        df = r.load().selectExpr(*[c.strip() for c in _split_columns(cols)])
        w = df.writeStream.foreachBatch(_merge_into(path, endpoint.ref)).option(
            "checkpointLocation", os.path.join(checkpoint, topic.strip("%").replace("%", "-"))
        )
        w = w.trigger(availableNow=True) if available_now else w.trigger(processingTime="2 seconds")
        queries.append(w.start())
    return queries


def _merge_into(path: str, ref: ClientRef) -> Callable[[Any, int], None]:
    """A foreachBatch writer adding the batch's rows whose msgId the table lacks.

    A plain append would add every row again when the checkpoint is new (or
    lost), and a dead letter twice in the table can never be replayed.
    """

    def write(batch_df: Any, batch_id: int) -> None:
        from delta.tables import DeltaTable

        spark = batch_df.sparkSession
        rows = batch_df.dropDuplicates(["msgId"])
        with _table_lock(ref.connect(), path):
            if not DeltaTable.isDeltaTable(spark, path):
                rows.write.format("delta").partitionBy("day").mode("append").save(path)
                return
            _retry_conflicts(
                lambda: (
                    DeltaTable.forPath(spark, path)
                    .alias("t")
                    .merge(rows.alias("s"), "t.day = s.day AND t.msgId = s.msgId")
                    .whenNotMatchedInsertAll()
                    .execute()
                ),
                f"materialize into {path}",
            )

    return write


def _table_lock(client: Client, table: str) -> Any:
    """materialize() and replay() write one table in turn (a lock of the client, which
    both have at hand: the tables may be on object storage).

    Each one's MERGE reads the partitions the other writes, so side by side one of
    them fails Delta's conflict check: a replay every time a dead letter arrived
    while it ran. Other writers of the table are met with _retry_conflicts.
    """
    key = hashlib.sha1(location_key(table).encode()).hexdigest()[:16]
    return client.lock(f"rocketspark-table-{key}")


MERGE_ATTEMPTS = 6  # a MERGE that met a concurrent write is tried again, up to this often


def _retry_conflicts(merge: Callable[[], Any], what: str) -> None:
    """Run a Delta MERGE again when a concurrent write to its table made it fail.

    materialize() merges new dead letters every few seconds while replay()
    stamps replayed rows: each MERGE reads the partitions the other may write.
    Both are idempotent (insert the missing msgIds; stamp the replayed ones),
    so running one again after Delta's conflict check refused it is safe.
    """
    from delta.exceptions import (
        ConcurrentAppendException,
        ConcurrentDeleteDeleteException,
        ConcurrentDeleteReadException,
        ConcurrentTransactionException,
        ConcurrentWriteException,
        DeltaConcurrentModificationException,
        MetadataChangedException,
    )

    conflicts = (
        ConcurrentAppendException,
        ConcurrentDeleteDeleteException,
        ConcurrentDeleteReadException,
        ConcurrentTransactionException,
        ConcurrentWriteException,
        DeltaConcurrentModificationException,
        MetadataChangedException,
    )
    for attempt in range(MERGE_ATTEMPTS):
        try:
            merge()
            return
        except conflicts as e:
            if attempt == MERGE_ATTEMPTS - 1:
                raise
            log.info("%s met a concurrent write (%s); trying again", what, type(e).__name__)
            time.sleep(0.2 * 2**attempt)


def _split_columns(text: str) -> list[str]:
    """Split a select list on top-level commas."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(" or ch == "[":
            depth += 1
        elif ch == ")" or ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur)
    return [c for c in out if c.strip()]


# --- replay ---------------------------------------------------------------------------


def replay(
    spark: Any,
    *,
    dlq_table: str,
    condition: str = "true",
    force: bool = False,
    store: str | None = None,
    store_options: dict[str, str] | None = None,
    name_server: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
) -> int:
    """Send the dead letters selected by the SQL ``condition`` back to their original topic.

    Each comes back with its reconsume count reset and the property RS_REPLAY=true;
    the table records ``replayedAt`` / ``replayId`` (MERGE). Rows replayed before
    are skipped unless ``force``. Returns how many messages were sent.
    """
    _require_delta(spark)
    from delta.tables import DeltaTable

    # (not a look for _delta_log: it exists before the table's first commit)
    if not DeltaTable.isDeltaTable(spark, dlq_table):
        raise ConfigError(
            f"no dead-letter table at {dlq_table} (has the group had dead "
            "letters yet, and is materialize() running?)"
        )
    client = _endpoint(store, store_options, name_server, access_key, secret_key).ref.connect()
    group = _replay_group(dlq_table)
    with _replay_lock(client, group):
        return _replay(spark, client, dlq_table, group, condition, force)


def _replay_group(dlq_table: str) -> str:
    """The producer group of one table's replays (so one table's never touch another's)."""
    return f"{REPLAY_GROUP}-{hashlib.sha1(location_key(dlq_table).encode()).hexdigest()[:16]}"


def _replay_lock(client: Client, group: str) -> Any:
    """Replays of one table take turns: an overlapping one would roll back the halves
    of the other (they are in no table yet) between its prepare and its commit."""
    return client.lock(group)


def _replay(
    spark: Any, client: Client, dlq_table: str, group: str, condition: str, force: bool
) -> int:

    replays = _ReplayAnswer(lambda: _recorded_replays(spark, dlq_table))
    _finish_interrupted(client, group, replays)
    table = spark.read.format("delta").load(dlq_table)
    try:
        selected = table.where(condition)
        if not force:
            selected = selected.where("replayedAt IS NULL")
        rows = selected.select(
            "msgId", "originTopic", "body", "tags", "keys", "properties"
        ).collect()
    except Exception as e:
        if "AnalysisException" in type(e).__name__ or "ParseException" in type(e).__name__:
            raise ConfigError(
                f"replay condition {condition!r} does not work on the "
                f"dead-letter table: {str(e).splitlines()[0]}"
            ) from e
        raise
    rows = list({r.msgId: r for r in rows}.values())  # one message per dead letter
    if not rows:
        return 0
    missing = sorted({r.originTopic for r in rows if not client.has_topic(r.originTopic)})
    if missing:
        raise UnknownTopicError(f"cannot replay to topics that no longer exist: {missing}")
    replay_id = uuid.uuid4().hex
    msgs = []
    for r in rows:
        props = {k: v for k, v in (r.properties or {}).items() if k not in _RETRY_ONLY}
        props[PROPERTY_REPLAY] = "true"
        props[PROPERTY_REPLAY_ID] = replay_id
        msgs.append(
            Message(r.originTopic, bytes(r.body), tags=r.tags, keys=r.keys or (), properties=props)
        )
    replays.replaying.add(replay_id)  # until it ends, a check-back of its halves: UNKNOWN
    try:
        _prepare_record_commit(spark, client, dlq_table, group, msgs, rows, replay_id, replays)
    finally:
        replays.replaying.discard(replay_id)
    return len(msgs)


def _prepare_record_commit(
    spark: Any,
    client: Client,
    dlq_table: str,
    group: str,
    msgs: list[Message],
    rows: list[Any],
    replay_id: str,
    replays: _ReplayAnswer,
) -> None:
    """A replay's halves prepared, its rows stamped in the table (MERGE), then committed."""
    from delta.tables import DeltaTable

    halves = client.halves(client.prepare_batch(msgs, producer_group=group), producer_group=group)
    # By msgId alone: a dead letter in the table twice (two days) is stamped twice.
    ids = spark.createDataFrame([(r.msgId,) for r in rows], "msgId string")
    with _table_lock(client, dlq_table):
        _retry_conflicts(
            lambda: (
                DeltaTable.forPath(spark, dlq_table)
                .alias("t")
                .merge(ids.alias("s"), "t.msgId = s.msgId")
                .whenMatchedUpdate(
                    set={"replayedAt": "current_timestamp()", "replayId": f"'{replay_id}'"}
                )
                .execute()
            ),
            f"replay into {dlq_table}",
        )
    replays.recorded.add(replay_id)  # the MERGE ran: a check-back from now on commits
    client.end_transactions(halves, commit=True)


def _recorded_replays(spark: Any, dlq_table: str) -> set[str]:
    """The replay ids the table recorded (each replay's MERGE stamps its rows)."""
    return {
        r.replayId
        for r in spark.read.format("delta")
        .load(dlq_table)
        .where("replayId IS NOT NULL")
        .select("replayId")
        .distinct()
        .collect()
    }


class _ReplayAnswer:
    """The answer to a check-back of a replay's half (registered for the table's group
    for as long as the client lives, so it also answers the broker's check-backs while
    this process replays): UNKNOWN for a replay of this process still between its
    prepare and its commit (``replaying``), COMMIT if the table recorded the half's
    replay id (the MERGE ran), ROLLBACK otherwise. The table is read when a half is not
    known to be recorded, at most once per ``REREAD_SECONDS`` (a pass over many halves
    of one lost replay reads it once); a replay of this process adds its id to
    ``recorded`` itself once its MERGE ran."""

    REREAD_SECONDS = 5.0

    def __init__(self, read: Callable[[], set[str]], clock: Callable[[], float] = time.monotonic):
        self.read, self.clock = read, clock
        self.recorded: set[str] = set()
        self.replaying: set[str] = set()
        self._read_at: float | None = None

    def __call__(self, half: Any) -> TransactionState:
        replay_id = half.properties.get(PROPERTY_REPLAY_ID, "")
        if replay_id in self.replaying:
            return TransactionState.UNKNOWN
        if replay_id not in self.recorded:
            now = self.clock()
            if self._read_at is None or now - self._read_at >= self.REREAD_SECONDS:
                self.recorded |= self.read()
                self._read_at = now
        if replay_id in self.recorded:
            return TransactionState.COMMIT
        return TransactionState.ROLLBACK


def _finish_interrupted(client: Client, group: str, answer: _ReplayAnswer) -> None:
    """Resolve halves of a replay of this table that stopped between prepare and commit
    (COMMIT if the table recorded their replay id, ROLLBACK otherwise), and answer the
    brokers' check-backs of the group's halves from now on with ``answer``."""
    counts = client.check_transactions(group, answer)
    if counts["commit"]:
        log.warning(
            "%d messages of a replay were recorded but not committed: committed", counts["commit"]
        )
    if counts["rollback"]:
        log.warning(
            "%d messages of a replay never reached the table: rolled back", counts["rollback"]
        )


__all__ = ["RetryPipeline", "materialize", "replay", "RocketSparkError"]

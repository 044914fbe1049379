"""The rocketmq sink on a real SparkSession and a real RocketMQ.

Each test runs on every backend (the ``backend`` fixture): it seeds and
verifies through the backend's client, on topics of its own, and reaches it
with the backend's options. The tests marked ``embedded_only`` are about the
embedded store's directory itself and run on a store.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import threading
import time

import pytest
from pyspark.sql import functions as F

from rocketspark.client import Message
from rocketspark.datasource.locations import location_key
from tests.datasource.spark_version import ADMISSION_CONTROL

pytestmark = pytest.mark.spark


def _sink_id(checkpoint: str) -> str:
    """The exactly-once sink id a stream with this checkpointLocation writes as."""
    return hashlib.sha1(location_key(checkpoint).encode()).hexdigest()[:16]


def _max_offset(backend, topic: str, queue_id: int = 0) -> int:
    (mq,) = [q for q in backend.queues(topic) if q.queue_id == queue_id]
    return backend.client.max_offset(mq)


def _all(store, topic: str) -> list:
    """Every message of ``topic`` in an embedded store (for the embedded_only tests)."""
    out = []
    for q in range(store.topic(topic).read_queue_nums):
        res = store.pull(topic, q, 0, max_msgs=100_000)
        out.extend(res.messages)
    return out


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_batch_write_maps_columns_to_messages(spark, backend, guarantee):
    out = backend.fresh_topic("out", queues=4)
    rows = [
        (f"body-{i}", f"t{i % 2}", [f"k{i}", f"x{i}"], {"p": str(i)}, f"cust-{i % 3}")
        for i in range(30)
    ]
    df = spark.createDataFrame(
        rows,
        "body string, tags string, keys array<string>, "
        "properties map<string,string>, shardingKey string",
    )
    (
        df.write.format("rocketmq")
        .options(**backend.options)
        .option("topic", out)
        .option("deliveryGuarantee", guarantee)
        .mode("append")
        .save()
    )
    msgs = backend.messages(out)
    assert sorted(m.body.decode() for m in msgs) == sorted(f"body-{i}" for i in range(30))
    by_body = {m.body.decode(): m for m in msgs}
    for i in range(30):
        m = by_body[f"body-{i}"]
        assert (m.tags, m.keys, m.properties["p"]) == (f"t{i % 2}", [f"k{i}", f"x{i}"], str(i))
    # same sharding key, same queue (a queue id names a queue of one broker)
    where = {r["body"].decode(): (r["brokerName"], r["queueId"]) for r in backend.rows(out)}
    queues = {}
    for i in range(30):
        queues.setdefault(f"cust-{i % 3}", set()).add(where[f"body-{i}"])
    assert all(len(q) == 1 for q in queues.values())
    assert backend.client.query_by_key(out, "k7")[0].body == b"body-7"


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_rows_read_from_a_sinks_topic_go_back_through_a_sink_as_they_are(spark, backend, guarantee):
    """Committed copies carry their transaction's PGROUP and __transactionId__ and the
    sink's RS_SINK, which the source's properties column shows: copying such rows on
    with their properties replaces those (they described the earlier write)."""
    first = backend.fresh_topic("first", queues=2)
    second = backend.fresh_topic("second", queues=2)
    copier = backend.fresh_name("copier")
    df = spark.createDataFrame(
        [(f"b{i}", {"color": "red"}) for i in range(10)],
        "body string, properties map<string,string>",
    )
    df.write.format("rocketmq").options(**backend.options).option("topic", first).mode(
        "append"
    ).save()
    read = spark.read.format("rocketmq").options(**backend.options).option("topic", first)
    rows = read.load().select("body", "properties")
    assert all("RS_SINK" in r.properties and "PGROUP" in r.properties for r in rows.collect())
    rows.write.format("rocketmq").options(**backend.options).option("topic", second).option(
        "deliveryGuarantee", guarantee
    ).option("sinkId", copier).mode("append").save()
    copies = backend.messages(second)
    assert sorted(m.body for m in copies) == sorted(f"b{i}".encode() for i in range(10))
    for m in copies:
        assert m.properties["color"] == "red"
        if guarantee == "exactly_once":  # this write's transaction, not the first one's
            assert m.properties["RS_SINK"] == copier
            assert m.properties["PGROUP"] == f"rocketspark-sink-{copier}"
            assert m.properties["__transactionId__"] == m.properties["UNIQ_KEY"]
        else:
            assert not {"RS_SINK", "PGROUP", "__transactionId__"} & set(m.properties)


def test_batch_write_routes_by_topic_and_queue_columns(spark, backend):
    a, b = backend.fresh_topic("a", queues=2), backend.fresh_topic("b", queues=2)
    df = spark.createDataFrame(
        [(a, 1, b"x"), (b, 0, b"y"), (a, 1, b"z")], "topic string, queueId int, body binary"
    )
    df.write.format("rocketmq").options(**backend.options).mode("append").save()

    def queue(topic: str, queue_id: int) -> list[bytes]:
        # a queueId column picks the topic's queue_id-th queue (brokers in name order:
        # on a cluster of two, queue 1 of a 2-queue topic is the second broker's 0)
        mq = backend.queues(topic)[queue_id]
        return [
            r["body"]
            for r in backend.rows(topic)
            if (r["brokerName"], r["queueId"]) == (mq.broker, mq.queue_id)
        ]

    assert queue(a, 1) in ([b"x", b"z"], [b"z", b"x"])
    assert queue(b, 0) == [b"y"]


@pytest.mark.parametrize(
    "schema, rows, options, message",
    [
        ("value string", [("v",)], {"topic": "out"}, "does not know the column 'value'"),
        ("body int", [(1,)], {"topic": "out"}, "column 'body' has type int"),
        ("bodi string", [("v",)], {"topic": "out"}, "did you mean 'body'?"),
        ("body string", [("v",)], {}, "no topic to write to"),
        ("body string", [("v",)], {"topic": "missing"}, "topic 'missing' does not exist"),
        (
            "body string, delayLevel int",
            [("v", 2)],
            {"topic": "out"},
            "delayed messages cannot be transactional",
        ),
        (
            "body string",
            [("v",)],
            {"topic": "out", "deliveryGuarantee": "twice"},
            "deliveryGuarantee: expected one of exactly_once, at_least_once",
        ),
        (
            "body string, properties map<string,string>",
            [("v", {"TAGS": "t"})],
            {"topic": "out"},
            "'TAGS' is set by the sink itself",
        ),
        (
            "body string, properties map<string,string>",
            [("v", {"p": None})],
            {"topic": "out", "deliveryGuarantee": "at_least_once"},
            "property 'p' is null",
        ),
        (
            "body string, keys array<string>",
            [("v", ["x y"])],
            {"topic": "out"},
            "key 'x y' is null, empty or holds a space",
        ),
        (
            "body string, topic string",
            [("v", "RMQ_SYS_TRANS_OP_HALF_TOPIC")],
            {"topic": "out", "deliveryGuarantee": "at_least_once"},
            "column topic: 'RMQ_SYS_TRANS_OP_HALF_TOPIC' is a RocketMQ system topic",
        ),
        (
            "body string",
            [("v",)],
            {"topic": "RMQ_SYS_TRANS_HALF_TOPIC"},
            "option topic: 'RMQ_SYS_TRANS_HALF_TOPIC' is a RocketMQ system topic",
        ),
    ],
)
def test_bad_input_fails_before_anything_is_written(spark, backend, schema, rows, options, message):
    # "out" (1 queue) and "missing" (no topic) are this test's names
    out = backend.fresh_topic("out", queues=1)
    missing = backend.fresh_topic("missing")
    names = {"out": out, "missing": missing}
    w = spark.createDataFrame(rows, schema).write.format("rocketmq").options(**backend.options)
    for k, v in options.items():
        w = w.option(k, names.get(v, v) if k == "topic" else v)
    with pytest.raises(Exception, match=re.escape(message.replace("'missing'", f"'{missing}'"))):
        w.mode("append").save()
    assert _max_offset(backend, out) == 0


@pytest.mark.embedded_only
def test_a_store_option_naming_no_store_is_an_error_not_a_new_store(spark, tmp_path):
    typo = str(tmp_path / "typo")
    df = spark.createDataFrame([("v",)], "body string")
    with pytest.raises(Exception, match=re.escape(f"option store: there is no store at {typo}")):
        df.write.format("rocketmq").option("store", typo).option("topic", "out").mode(
            "append"
        ).save()
    with pytest.raises(Exception, match=re.escape(f"option store: there is no store at {typo}")):
        spark.read.format("rocketmq").option("store", typo).option("topic", "out").load()
    assert not os.path.exists(typo)


def test_overwrite_is_rejected(spark, backend):
    out = backend.fresh_topic("out", queues=1)
    df = spark.createDataFrame([("v",)], "body string")
    with pytest.raises(Exception, match="only appends"):
        df.write.format("rocketmq").options(**backend.options).option("topic", out).mode(
            "overwrite"
        ).save()


def test_stream_exactly_once_from_topic_to_topic_with_restart(spark, backend, tmp_path):
    in_, out = backend.fresh_topic("in", queues=2), backend.fresh_topic("out", queues=2)
    backend.client.put_batch([Message(in_, f"m{i}".encode()) for i in range(50)])
    chk = str(tmp_path / "chk")

    def run():
        src = (
            spark.readStream.format("rocketmq")
            .options(**backend.options)
            .option("topic", in_)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "20")
            .load()
        )
        upper = src.select(
            F.upper(F.col("body").cast("string")).alias("body"), F.lit("copied").alias("tags")
        )
        q = (
            upper.writeStream.format("rocketmq")
            .options(**backend.options)
            .option("topic", out)
            .option("checkpointLocation", chk)
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(180)
        assert q.exception() is None

    run()
    backend.client.put_batch([Message(in_, f"n{i}".encode()) for i in range(10)])
    run()
    bodies = backend.bodies(out)
    assert bodies == sorted([f"M{i}" for i in range(50)] + [f"N{i}" for i in range(10)])
    assert backend.settled_halves(out) == []
    committed, pending = backend.client.sink_ledger().get(_sink_id(chk))
    # 50 rows at 20 a batch, then 10 more (Spark 4.0/4.1: no read limit, one batch a run)
    assert committed >= (3 if ADMISSION_CONTROL else 1) and pending is None


def test_a_new_query_at_a_deleted_checkpoint_location_writes_all_its_batches(
    spark, backend, tmp_path
):
    # The sink id comes from the checkpoint location; the ledger keeps the old query's
    # batch ids. The tasks report Spark's query id, so the new query's batches 0, 1..
    # are not taken for replays of the old one's.
    in_, out = backend.fresh_topic("in", queues=1), backend.fresh_topic("out", queues=1)
    chk = str(tmp_path / "chk")
    ids = []

    def run(first: int) -> None:
        backend.client.put_batch([Message(in_, f"m{i}".encode()) for i in range(first, first + 6)])
        src = (
            spark.readStream.format("rocketmq")
            .options(**backend.options)
            .option("topic", in_)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "2")
            .load()
        )
        q = (
            src.select("body")
            .writeStream.format("rocketmq")
            .options(**backend.options)
            .option("topic", out)
            .option("checkpointLocation", chk)
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(180)
        assert q.exception() is None
        ids.append(str(q.id))

    run(0)
    shutil.rmtree(chk)
    run(6)  # reads "in" from the start again: m0..m5 a second time, then m6..m11
    bodies = backend.bodies(out)
    assert bodies == sorted([f"m{i}" for i in range(6)] * 2 + [f"m{i}" for i in range(6, 12)])
    assert ids[0] != ids[1] and backend.client.sink_ledger().query(_sink_id(chk)) == ids[1]
    assert backend.settled_halves(out) == []


def test_stream_sink_needs_its_own_checkpoint_option_to_be_exactly_once(spark, backend, tmp_path):
    # With the checkpoint given only as a session default, the sink cannot tell this
    # query's batches from another's after a restart: it asks for the option.
    out = backend.fresh_topic("out", queues=1)
    src = spark.readStream.format("rate").option("rowsPerSecond", "1").load()
    spark.conf.set("spark.sql.streaming.checkpointLocation", str(tmp_path / "default-chk"))
    q = None
    try:
        with pytest.raises(Exception, match="needs the option checkpointLocation"):
            q = (
                src.select(F.col("value").cast("string").alias("body"))
                .writeStream.format("rocketmq")
                .options(**backend.options)
                .option("topic", out)
                .start()
            )
            q.awaitTermination(60)
            raise AssertionError(f"query did not fail: {q.exception()}")
    finally:
        spark.conf.unset("spark.sql.streaming.checkpointLocation")
        if q is not None:
            q.stop()
    assert _max_offset(backend, out) == 0


def test_txn_app_id_and_version_make_foreach_batch_writes_idempotent(spark, backend):
    out = backend.fresh_topic("out", queues=1)
    df = spark.createDataFrame([(f"r{i}",) for i in range(10)], "body string")

    def write(version: int) -> None:
        (
            df.write.format("rocketmq")
            .options(**backend.options)
            .option("topic", out)
            .option("txnAppId", "my-pipeline")
            .option("txnVersion", str(version))
            .mode("append")
            .save()
        )

    write(0)
    write(1)
    write(1)  # a replayed foreachBatch: nothing new
    write(0)
    assert _max_offset(backend, out) == 20
    # The same application and version into another topic: written (as Delta's
    # txnAppId is per table), then recognised on a replay too.
    errors = backend.fresh_topic("errors", queues=1)
    for _ in range(2):
        (
            df.write.format("rocketmq")
            .options(**backend.options)
            .option("topic", errors)
            .option("txnAppId", "my-pipeline")
            .option("txnVersion", "1")
            .mode("append")
            .save()
        )
    assert _max_offset(backend, errors) == 10
    assert backend.settled_halves(out, errors) == []
    # (with Delta in the session, Delta's own check of these option names answers first)
    with pytest.raises(
        Exception,
        match="txnAppId and txnVersion go together|Both txnVersion and txnAppId must be specified",
    ):
        (
            df.write.format("rocketmq")
            .options(**backend.options)
            .option("topic", out)
            .option("txnAppId", "x")
            .mode("append")
            .save()
        )


def test_stream_at_least_once_writes_directly(spark, backend, tmp_path):
    in_, out = backend.fresh_topic("in", queues=2), backend.fresh_topic("out", queues=1)
    backend.client.put_batch([Message(in_, f"a{i}".encode(), tags="t") for i in range(40)])
    src = (
        spark.readStream.format("rocketmq")
        .options(**backend.options)
        .option("topic", in_)
        .option("startingOffsets", "earliest")
        .load()
    )
    q = (
        src.select("body", "tags")
        .writeStream.format("rocketmq")
        .options(**backend.options)
        .option("topic", out)
        .option("deliveryGuarantee", "at_least_once")
        .option("checkpointLocation", str(tmp_path / "alo-chk"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(180)
    assert q.exception() is None
    got = backend.rows(out)
    assert sorted(m["body"].decode() for m in got) == sorted(f"a{i}" for i in range(40))
    assert all(m["tags"] == "t" for m in got)
    assert backend.settled_halves(out) == []  # (none written: no half topic, on a store)


@pytest.mark.embedded_only
def test_a_store_deleted_and_created_again_is_written_not_its_old_files(spark, store_path):
    """Workers keep stores open across tasks; one deleted under a running application
    (and made again at its path) must be reopened, or acknowledged writes go to the
    deleted files."""
    from rocketspark.store import MessageStore

    df = spark.range(40, numPartitions=2).select(F.col("id").cast("string").alias("body"))

    def write():
        (
            df.write.format("rocketmq")
            .option("store", store_path)
            .option("topic", "out")
            .option("deliveryGuarantee", "at_least_once")
            .mode("append")
            .save()
        )

    for _ in range(2):
        with MessageStore.open(store_path) as s:
            s.create_topic("out", queues=2)
        write()
        with MessageStore.open(store_path) as s:
            assert len(_all(s, "out")) == 40
        shutil.rmtree(store_path)  # the next round's store is a new one at the same path
    with pytest.raises(Exception, match="there is no store at"):
        write()


@pytest.mark.embedded_only
def test_a_failed_batch_write_leaves_no_half_open_once_its_tasks_stop(spark, store_path, store):
    """One task fails while the other is still writing: the job's abort runs before
    that task's halves are in the store.

    The writing task is stalled on the store's topic table (its first half creates
    the half topic) until the write has failed, i.e. the abort is over, or (when
    the abort waits for the task) for a while. A write before it warms the
    driver's Python worker, so that the abort is over before Spark kills the
    stalled task's Python worker (spark.python.task.killTimeout).

    Embedded only: the stall is a flock of the store's topic table file.
    """
    store.create_topic("out", queues=2)
    store.create_topic("warm", queues=1)
    (
        spark.range(1)
        .selectExpr("'w' AS body")
        .write.format("rocketmq")
        .option("store", store_path)
        .option("topic", "warm")
        .option("deliveryGuarantee", "at_least_once")
        .mode("append")
        .save()
    )
    assert not store.has_topic("RMQ_SYS_TRANS_HALF_TOPIC")
    gate = store.topics.lock_path
    stalled, failed = threading.Event(), threading.Event()

    def waiters(lock_path: str) -> int:  # local: pickled by value for the Python workers
        """How many processes wait for a flock of ``lock_path`` (Linux's /proc/locks)."""
        import os as _os

        ino = f":{_os.stat(lock_path).st_ino} "
        with open("/proc/locks") as f:
            return sum(1 for line in f if " -> " in line and ino in line)

    def hold_the_topic_table() -> None:
        with open(gate, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            deadline = time.monotonic() + 120
            while waiters(gate) == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            stalled.set()
            failed.wait(15)
            fcntl.flock(f, fcntl.LOCK_UN)

    holder = threading.Thread(target=hold_the_topic_table)
    holder.start()

    def body(i: int) -> str:
        if i == 0:  # the failing task waits for the writing one to be stalled
            import time as _time

            deadline = _time.monotonic() + 120
            while waiters(gate) == 0 and _time.monotonic() < deadline:
                _time.sleep(0.01)
            raise ValueError("row 0 cannot be written")
        return f"m{i}"

    df = spark.range(0, 26, numPartitions=2).select(F.udf(body, "string")("id").alias("body"))
    try:
        with pytest.raises(Exception, match="row 0 cannot be written"):
            (
                df.write.format("rocketmq")
                .option("store", store_path)
                .option("topic", "out")
                .mode("append")
                .save()
            )
    finally:
        failed.set()
        holder.join(60)
    assert stalled.is_set()
    # Wait for the stalled task to stop: its Python worker may outlive the Spark task.
    deadline, last, since = time.monotonic() + 60, -1, time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < 3:
        halves = (
            store.max_offset("RMQ_SYS_TRANS_HALF_TOPIC", 0)
            if store.has_topic("RMQ_SYS_TRANS_HALF_TOPIC")
            else 0
        )
        if halves != last or waiters(gate):
            last, since = halves, time.monotonic()
        time.sleep(0.1)
    assert store.open_transactions() == []
    assert _all(store, "out") == []
    assert os.listdir(os.path.join(store_path, "config", "rocketsparkSinkJobs")) == []

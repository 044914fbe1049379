"""The rocketmq source on a real SparkSession (local[2]) and a real RocketMQ.

Each test runs on every backend (the ``backend`` fixture): it seeds and
verifies through the backend's client, on topics and groups of its own, and
reaches it with the backend's options. The tests marked ``embedded_only`` are
about the embedded store's directory itself and run on a store.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time

import pytest
from chispa import assert_df_equality
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from rocketspark.client import Message
from tests.datasource.spark_version import ADMISSION_CONTROL, FILTER_PUSHDOWN

pytestmark = pytest.mark.spark


def _fill(client, topic: str, n: int, queues: int = 2, **kw) -> None:
    if not client.has_topic(topic):
        client.create_topic(topic, queues=queues)
    client.put_batch(
        [
            Message(
                topic,
                f"{topic}-{i}".encode(),
                tags="even" if i % 2 == 0 else "odd",
                keys=[f"k{i}"],
                **kw,
            )
            for i in range(n)
        ]
    )


def _bodies(df) -> list[str]:
    return sorted(r.body.decode() for r in df.select("body").collect())


def _read(spark, backend):
    return spark.read.format("rocketmq").options(**backend.options)


def _offsets(positions) -> str:
    """The offsets JSON ({topic: {broker: {queueId: offset}}}) of {MessageQueue: offset}."""
    out: dict = {}
    for mq, offset in positions.items():
        out.setdefault(mq.topic, {}).setdefault(mq.broker, {})[str(mq.queue_id)] = offset
    return json.dumps(out)


def _of(mq) -> str:
    """A filter for the rows of the queue ``mq``."""
    return f"brokerName = '{mq.broker}' and queueId = {mq.queue_id}"


def test_batch_read_returns_every_message_with_its_fields(spark, backend):
    orders = backend.fresh_topic("orders")
    _fill(backend.client, orders, 20, properties={"region": "eu"})
    df = _read(spark, backend).option("topic", orders).load()
    got = df.select(
        "topic", "queueId", "queueOffset", F.col("body").cast("string").alias("b"), "tags", "keys"
    )
    expected = [
        (orders, m.queue_id, m.queue_offset, m.body.decode(), m.tags, m.keys)
        for m in backend.messages(orders)
    ]
    want = spark.createDataFrame(expected, got.schema)
    assert_df_equality(got, want, ignore_row_order=True)
    mq = backend.queues(orders)[0]
    row = df.filter(
        f"brokerName = '{mq.broker}' and queueId = {mq.queue_id} and queueOffset = 0"
    ).collect()[0]
    (m,) = backend.client.query_by_key(orders, row.keys[0])  # found by its key, not the row
    assert (m.queue_id, m.queue_offset) == (mq.queue_id, 0)
    assert (row.msgId, row.uniqKey, row.commitLogOffset, row.storeHost) == (
        m.msg_id,
        m.uniq_key,
        m.commitlog_offset,
        str(m.store_host),
    )
    assert row.brokerName == mq.broker
    # TAGS, KEYS and UNIQ_KEY are columns, not also properties.
    assert dict(row.properties) == {"region": "eu"} and m.properties["TAGS"] == row.tags


def test_batch_read_with_offsets_json_timestamps_and_tag_filter(spark, backend):
    orders = backend.fresh_topic("orders")
    _fill(backend.client, orders, 40)

    def base():  # a DataFrameReader keeps the options set on it: a fresh one each time
        return _read(spark, backend).option("topic", orders)

    q0, q1 = backend.queues(orders)
    ranged = (
        base()
        .option("startingOffsets", _offsets({q0: 5, q1: -2}))
        .option("endingOffsets", _offsets({q0: 8, q1: -1}))
        .load()
    )
    assert ranged.filter(_of(q0)).count() == 3
    assert ranged.filter(_of(q1)).count() == 20
    assert sorted(r.queueOffset for r in ranged.filter(_of(q0)).collect()) == [5, 6, 7]
    evens = base().option("subExpression", "even").load()
    assert evens.count() == 20 and {r.tags for r in evens.collect()} == {"even"}
    both = base().option("subExpression", "even || odd").load()
    assert both.count() == 40
    future = base().option("startingTimestamp", str(int(time.time() * 1000) + 3_600_000)).load()
    assert future.count() == 0
    past = base().option("startingTimestamp", "0").load()
    assert past.count() == 40


@pytest.mark.embedded_only
def test_assign_and_per_queue_timestamps_pick_queues_and_starts(spark, store_path, clock):
    """Kafka's assign and startingOffsetsByTimestamp / endingOffsetsByTimestamp, with the
    broker level of RocketMQ's MessageQueue: the JSON's queues only, each from (or
    before) its first message stored at or after its own timestamp.

    Embedded only: the store's clock stamps the messages at chosen times."""
    from rocketspark.store import MessageStore

    with MessageStore.open(store_path, clock=clock) as store:
        store.create_topic("orders", queues=3)
        for q in range(3):  # stored at t=1000, 2000, ..., 5000 in every queue
            for i in range(5):
                clock.now = 1000 * (i + 1)
                store.put(Message("orders", f"{q}-{i}".encode(), queue_id=q))
        broker = store.config.broker_name

    def read(**options):
        r = spark.read.format("rocketmq").option("store", store_path)
        for k, v in options.items():
            r = r.option(k, json.dumps(v) if isinstance(v, dict) else v)
        return sorted(row.body.decode() for row in r.load().select("body").collect())

    assert read(assign={"orders": [2, 0]}) == [f"{q}-{i}" for q in (0, 2) for i in range(5)]
    assert read(assign={"orders": {broker: [1]}}) == [f"1-{i}" for i in range(5)]
    per_queue = {"orders": {broker: {"0": 3000, "2": 4500}}}
    # queue 0 from t=3000, queue 2 from t=5000, queue 1 (not in the JSON) from its start
    assert read(topic="orders", startingOffsetsByTimestamp=per_queue) == [
        "0-2",
        "0-3",
        "0-4",
        "1-0",
        "1-1",
        "1-2",
        "1-3",
        "1-4",
        "2-4",
    ]
    assert read(
        assign={"orders": [0]},
        startingOffsetsByTimestamp={"orders": {broker: {"0": 2000}}},
        endingOffsetsByTimestamp={"orders": {broker: {"0": 4000}}},
    ) == ["0-1", "0-2"]
    assert read(assign={"orders": [1]}, startingTimestamp="2500", endingTimestamp="3500") == ["1-2"]
    # past every message: the queue's end by default (RocketMQ's searchOffset), or an error
    assert read(assign={"orders": [1]}, startingTimestamp="9000") == []
    with pytest.raises(
        Exception,
        match=re.escape(
            f"queue orders/{broker}/1 has no message stored at or after timestamp 9000"
        ),
    ):
        read(
            assign={"orders": [1]},
            startingTimestamp="9000",
            startingOffsetsByTimestampStrategy="error",
        )
    # a stream reads its assigned queues only, from the per-queue timestamps
    got = []
    q = (
        spark.readStream.format("rocketmq")
        .option("store", store_path)
        .option("assign", json.dumps({"orders": [0, 1]}))
        .option(
            "startingOffsetsByTimestamp", json.dumps({"orders": {broker: {"0": 5000, "1": 4000}}})
        )
        .load()
        .writeStream.foreachBatch(lambda df, _: got.extend(r.body.decode() for r in df.collect()))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    assert sorted(got) == ["0-4", "1-3", "1-4"]


def test_large_ranges_are_split_into_partitions(spark, backend):
    orders, few = backend.fresh_topic("orders"), backend.fresh_topic("few")
    _fill(backend.client, orders, 100, queues=1)
    df = _read(spark, backend).option("topic", orders).option("maxRecordsPerPartition", "30").load()
    assert df.rdd.getNumPartitions() == 4
    assert sorted(r.queueOffset for r in df.collect()) == list(range(100))
    df2 = _read(spark, backend).option("topic", orders).option("minPartitions", "5").load()
    assert df2.rdd.getNumPartitions() == 5 and df2.count() == 100
    # At least minPartitions, even when the ranges do not divide evenly.
    _fill(backend.client, few, 5, queues=1)
    df3 = _read(spark, backend).option("topic", few).option("minPartitions", "4").load()
    assert df3.rdd.getNumPartitions() == 4
    assert sorted(r.queueOffset for r in df3.collect()) == list(range(5))


@pytest.mark.parametrize(
    "options, message",
    [
        ({}, "option topic (or topicPattern, or assign) is required"),
        (
            {"topic": "orders", "assign": '{"orders": [0]}'},
            "options topic and assign exclude each other",
        ),
        (
            {"assign": '{"orders": [0, 2]}'},
            "option assign: topic 'orders' has no queue 2 (it has N read queues, 0-LAST)",
        ),
        (
            {"assign": '{"orders": {"broker-zz": [0]}}'},
            "option assign: broker 'broker-zz' of topic 'orders' is not this store's broker",
        ),
        ({"assign": '{"nope": [0]}'}, "option assign: topic 'nope' does not exist"),
        ({"assign": '{"orders": 0}'}, "option assign: topic 'orders' must list queue ids"),
        (
            {
                "assign": '{"orders": {"broker-a": [0]}}',
                "startingOffsets": '{"orders": {"BROKER1": {"ID1": 0}}}',
            },
            "option startingOffsets: queue orders/BROKER1/ID1 is not one of the subscribed queues",
        ),
        (
            {
                "topic": "orders",
                "startingTimestamp": "0",
                "startingOffsetsByTimestamp": '{"orders": {"broker-a": {"0": 0}}}',
            },
            "options startingTimestamp and startingOffsetsByTimestamp exclude each other",
        ),
        (
            {
                "topic": "orders",
                "startingOffsetsByTimestamp": '{"orders": {"broker-a": {"0": -5}}}',
            },
            "option startingOffsetsByTimestamp: offset -5 of orders/broker-a/0",
        ),
        (
            {"topic": "orders", "endingOffsetsByTimestamp": '{"orders": {"broker-a": {"7": 0}}}'},
            "option endingOffsetsByTimestamp: queue orders/broker-a/7 is not one of the subscribed",
        ),
        (
            {"topic": "orders", "subExpression": " || "},
            "option subExpression: tag expression ' || ' names no tag",
        ),
        (
            {"topic": "orders", "startingOffsetsByTimestampStrategy": "first"},
            "startingOffsetsByTimestampStrategy: expected one of latest, error",
        ),
        ({"topic": "nope"}, "topic 'nope' does not exist"),
        ({"topic": "orders", "startingOffsets": "{not json"}, "startingOffsets: expected earliest"),
        (
            {"topic": "orders", "maxRecordsPerPartition": "-3"},
            "maxRecordsPerPartition: must be a positive integer",
        ),
        ({"topic": "orders", "maxOffsetPerTrigger": "10"}, "did you mean 'maxOffsetsPerTrigger'"),
        (
            {"topic": "orders", "startingOffsets": '{"orders": {"broker-a": {"0": "x"}}}'},
            "offset 'x' of orders/broker-a/0",
        ),
        (
            {"topic": "orders", "startingOffsets": "group"},
            "startingOffsets=group needs the option group",
        ),
        (
            {"topic": "orders", "startingOffsets": '{"orders": {"broker-a": {"9": 0}}}'},
            "option startingOffsets: queue orders/broker-a/9 is not one of the subscribed queues",
        ),
        (
            {"topic": "orders", "endingOffsets": '{"orders": {"broker-zz": {"0": 1}}}'},
            "option endingOffsets: queue orders/broker-zz/0 is not one of the subscribed queues",
        ),
        (
            {"topic": "orders", "endingOffsets": '{"orders": {"broker-a": {"0": 50}}}'},
            "option endingOffsets: offset 50 for queue orders/broker-a/0 is past the queue's "
            "end (END0)",
        ),
        (
            {"topic": "orders", "endingOffsets": "latest", "endingTimestamp": "1700000000000"},
            "options endingOffsets and endingTimestamp exclude each other",
        ),
    ],
)
def test_bad_options_fail_at_load_with_a_clear_message(spark, backend, options, message):
    # "orders" (2 queues), the broker of its first queue "broker-a" and "nope" (no topic)
    # are this test's names; BROKER1/ID1 name its second queue (broker-a/1 in a store,
    # broker-b/0 on a cluster of two), N the queues of a broker (0-LAST), END0 the end
    # of the first queue
    orders, nope = backend.fresh_topic("orders"), backend.fresh_topic("nope")
    _fill(backend.client, orders, 2)
    q0, q1 = backend.queues(orders)
    n = sum(1 for mq in backend.queues(orders) if mq.broker == q0.broker)
    names = {
        "orders": orders,
        "broker-a": q0.broker,
        "nope": nope,
        "BROKER1": q1.broker,
        "ID1": str(q1.queue_id),
        "N read": f"{n} read",
        "LAST": str(n - 1),
        "END0": str(backend.client.max_offset(q0)),
    }

    def ours(text: str) -> str:
        for name, value in names.items():
            text = text.replace(name, value)
        return text

    reader = _read(spark, backend)
    for k, v in options.items():
        reader = reader.option(k, ours(v))
    with pytest.raises(Exception, match=re.escape(ours(message))) as caught:
        reader.load()  # at load(), not later from a worker
    # what the user reads first: Spark's prefix, then our error's class and sentence (the
    # session hides Python tracebacks: conf/spark-defaults.conf)
    assert re.match(
        r"\[PYTHON_DATA_SOURCE_ERROR\] [^:]+: rocketspark\.errors\.\w+: ", str(caught.value)
    )


def test_bad_stream_options_fail_at_load(spark, backend):
    orders = backend.fresh_topic("orders")
    _fill(backend.client, orders, 2)
    with pytest.raises(Exception, match="minOffsetsPerTrigger .* is larger"):
        _stream(
            spark, backend.options, topic=orders, minOffsetsPerTrigger=10, maxOffsetsPerTrigger=5
        )
    df = _stream(spark, backend.options, topic=orders, endingOffsets="latest")
    q = None
    with pytest.raises(Exception, match="option endingOffsets applies to batch reads only") as e:
        q = df.writeStream.format("noop").start()  # stream-only checks: at start()
        q.awaitTermination(60)
        raise AssertionError(f"query did not fail: {q.exception()}")
    if q is not None:
        q.stop()
    # Our error ends the trace, not pyspark's UnboundLocalError over it.
    assert "UnboundLocalError" not in str(e.value)


def _stream(spark, where: dict[str, str], **options):
    reader = spark.readStream.format("rocketmq").options(**where)
    for k, v in options.items():
        reader = reader.option(k, str(v))
    return reader.load()


def _run_available_now(df, tmp_path, name: str, batches: list | None = None):
    out = str(tmp_path / f"{name}-out")
    chk = str(tmp_path / f"{name}-chk")

    def record(batch_df, batch_id):
        rows = batch_df.select("queueId", "queueOffset", "body").collect()
        if batches is not None:
            batches.append((batch_id, len(rows)))
        batch_df.write.mode("append").parquet(out)

    q = (
        df.writeStream.foreachBatch(record)
        .option("checkpointLocation", chk)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(180)
    assert q.exception() is None
    return out, chk


def test_stream_available_now_reads_once_and_resumes_from_checkpoint(spark, backend, tmp_path):
    orders, etl = backend.fresh_topic("orders"), backend.fresh_name("etl")
    _fill(backend.client, orders, 30)
    df = _stream(spark, backend.options, topic=orders, startingOffsets="earliest", group=etl)
    out, _ = _run_available_now(df, tmp_path, "s")
    _fill(backend.client, orders, 10)  # 10 more, bodies orders-0..9 again
    _run_available_now(
        _stream(spark, backend.options, topic=orders, startingOffsets="earliest", group=etl),
        tmp_path,
        "s",
    )
    rows = spark.read.parquet(out).collect()
    seen = sorted((r.brokerName, r.queueId, r.queueOffset) for r in rows)
    assert seen == sorted(set(seen)) and len(seen) == 40  # each message exactly once
    for mq in backend.queues(orders):  # in queue order, no gaps
        assert [o for b, q, o in seen if (b, q) == (mq.broker, mq.queue_id)] == list(range(20))
    # Spark's progress is the group's committed offset: lag is zero. Before Spark 4.2,
    # Spark never tells the source that the last batch of an AvailableNow run is done:
    # the group trails by that batch (5 per queue) until the next run.
    trail = 0 if ADMISSION_CONTROL else 5
    assert backend.lag(etl, orders) == {mq: trail for mq in backend.queues(orders)}


def test_max_offsets_per_trigger_splits_the_backlog_without_starving_a_queue(
    spark, backend, tmp_path
):
    big = backend.fresh_topic("big", queues=2)
    backend.client.put_batch(
        [Message(big, b"x", queue_id=0) for _ in range(95)]
        + [Message(big, b"y", queue_id=1) for _ in range(5)]
    )
    batches: list = []
    df = _stream(
        spark, backend.options, topic=big, startingOffsets="earliest", maxOffsetsPerTrigger=20
    )
    out, _ = _run_available_now(df, tmp_path, "m", batches)
    sizes = [n for _, n in sorted(batches) if n]
    assert sum(sizes) == 100
    if not ADMISSION_CONTROL:  # Spark 4.0/4.1: no read limits, everything at once
        assert sizes == [100]
        return
    assert max(sizes) <= 21 and len(sizes) >= 5
    first = spark.read.parquet(out).filter(_of(backend.queues(big)[1])).count()
    assert first == 5


def test_min_offsets_per_trigger_waits_for_enough_messages(spark, backend, tmp_path):
    trickle = backend.fresh_topic("trickle", queues=1)
    df = _stream(
        spark,
        backend.options,
        topic=trickle,
        startingOffsets="earliest",
        minOffsetsPerTrigger=50,
        maxTriggerDelay="1h",
    )
    seen: list = []

    def record(batch_df, batch_id):
        seen.append(batch_df.count())

    q = (
        df.writeStream.foreachBatch(record)
        .option("checkpointLocation", str(tmp_path / "min-chk"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        backend.client.put_batch([Message(trickle, b"a") for _ in range(10)])
        if not ADMISSION_CONTROL:  # Spark 4.0/4.1: no read limits, the 10 come at once
            deadline = time.time() + 60
            while sum(seen) < 10 and time.time() < deadline:
                time.sleep(0.2)
            assert sum(seen) == 10
            return
        time.sleep(3)
        assert sum(seen) == 0  # 10 < 50: still waiting
        backend.client.put_batch([Message(trickle, b"b") for _ in range(45)])
        deadline = time.time() + 60
        while sum(seen) < 55 and time.time() < deadline:
            time.sleep(0.2)
        assert sum(seen) == 55 and max(seen) == 55
    finally:
        q.stop()


def test_topic_pattern_picks_up_a_new_topic_mid_stream(spark, backend, tmp_path):
    shop = backend.fresh_name("shop")  # "shop-orders" and "shop-payments" of this test
    shop_orders, shop_payments = f"{shop}-orders", f"{shop}-payments"
    other = backend.fresh_topic("other")
    _fill(backend.client, shop_orders, 6)
    df = _stream(spark, backend.options, topicPattern=f"{shop}-.*", startingOffsets="earliest")
    got: list = []
    lock = threading.Lock()

    def record(batch_df, batch_id):
        with lock:
            got.extend((r.topic, r.body.decode()) for r in batch_df.collect())

    q = (
        df.writeStream.foreachBatch(record)
        .option("checkpointLocation", str(tmp_path / "pat-chk"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        deadline = time.time() + 60
        while len(got) < 6 and time.time() < deadline:
            time.sleep(0.2)
        _fill(backend.client, shop_payments, 4)  # a new topic: read from its earliest
        _fill(backend.client, other, 3)  # does not match
        while len(got) < 10 and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(1)
    finally:
        q.stop()
    assert sorted(got) == sorted(
        [(shop_orders, f"{shop_orders}-{i}") for i in range(6)]
        + [(shop_payments, f"{shop_payments}-{i}") for i in range(4)]
    )


@pytest.mark.parametrize(
    "fail_on_data_loss, start",
    [("true", {}), ("false", {}), ("true", {"startingTimestamp": "99999999999999"})],
)
def test_a_latest_start_is_the_same_after_a_restart_before_batch_0_committed(
    spark, backend, tmp_path, fail_on_data_loss, start
):
    """Spark asks for the initial offset again when a restarted query re-runs a batch 0
    that never committed (its end comes from the offset log). A "latest" worked out
    anew was past that end: the query failed, or with failOnDataLoss=false read the
    queues from their earliest offset, history and all. (So was a starting timestamp
    after every message.)"""
    orders = backend.fresh_topic("orders")
    _fill(backend.client, orders, 100)
    chk = str(tmp_path / "chk")
    df = _stream(spark, backend.options, topic=orders, failOnDataLoss=fail_on_data_loss, **start)

    def fail(batch_df, batch_id):
        raise RuntimeError("the sink is down")

    q = (
        df.writeStream.foreachBatch(fail)
        .option("checkpointLocation", chk)
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(StreamingQueryException, match="the sink is down"):
        q.awaitTermination(120)
    _fill(backend.client, orders, 10)  # arrives before the restart
    got = []
    # (Spark 4.0/4.1 end an AvailableNow run that re-ran an uncommitted batch there,
    # without asking the source for more: the next run reads on)
    for _ in range(1 if ADMISSION_CONTROL else 2):
        q = (
            df.writeStream.foreachBatch(
                lambda batch_df, _: got.extend(r.body.decode() for r in batch_df.collect())
            )
            .option("checkpointLocation", chk)
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(120)
        assert q.exception() is None
    assert sorted(got) == sorted(f"{orders}-{i}" for i in range(10))  # the new ten only


@pytest.mark.embedded_only
def test_a_group_stream_goes_on_when_its_topic_has_fewer_queues(spark, store_path, store, tmp_path):
    """As RocketMQ's consumer drops a queue it no longer has, the group's offsets are
    committed for the queues still read: a queue gone made every commit fail.

    Embedded only: the store shrinks a topic whose queues hold messages (force=True);
    the Client interface has no such call."""
    _fill(store, "orders", 40, queues=4)
    df = _stream(
        spark, {"store": store_path}, topic="orders", startingOffsets="earliest", group="g4"
    )
    _run_available_now(df, tmp_path, "a")
    store.create_topic("orders", queues=2, force=True)  # fewer queues now
    _fill(store, "orders", 10)
    out, _ = _run_available_now(df, tmp_path, "a")
    assert len(spark.read.parquet(out).collect()) == 50
    if ADMISSION_CONTROL:  # (before Spark 4.2 the last batch is not committed to the group)
        assert [store.committed_offset("g4", "orders", q) for q in range(2)] == [15, 15]


def test_a_schema_of_some_columns_reads_those_columns_in_its_order(spark, backend):
    orders = backend.fresh_topic("orders")
    _fill(backend.client, orders, 40, properties={"region": "eu"})
    stored = backend.rows(orders)
    for ddl, expression in [
        ("body binary, queueOffset long", "*"),
        ("keys array<string>, msgId string, tags string, properties map<string,string>", "*"),
        ("queueOffset long, queueId int, brokerName string, body binary", "even"),
    ]:
        df = (
            spark.read.format("rocketmq")
            .schema(ddl)
            .options(**backend.options)
            .option("topic", orders)
            .option("subExpression", expression)
            .load()
        )
        names = [c.split(" ")[0] for c in ddl.split(", ")]
        assert df.columns == names
        want = [
            tuple(r[n] for n in names)
            for r in stored
            if expression == "*" or r["tags"] == expression
        ]
        assert len(want) == (40 if expression == "*" else 20)
        got = [tuple(_plain(v) for v in r) for r in df.collect()]
        assert sorted(got, key=repr) == sorted(
            (tuple(_plain(v) for v in r) for r in want), key=repr
        )


def _plain(value):
    """A column's value as both sides compare it (Spark's bytearray, a map's items)."""
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, dict):
        return sorted(value.items())
    if isinstance(value, list):
        return [tuple(v) if isinstance(v, tuple) else v for v in value]
    return value


def test_a_stream_of_some_columns_reads_those_columns(spark, backend, tmp_path):
    orders = backend.fresh_topic("orders")
    _fill(backend.client, orders, 30)
    ddl = "body binary, queueOffset long, queueId int, brokerName string"
    df = (
        spark.readStream.format("rocketmq")
        .schema(ddl)
        .options(**backend.options)
        .option("topic", orders)
        .option("startingOffsets", "earliest")
        .option("subExpression", "odd")
        .load()
    )
    assert df.columns == ["body", "queueOffset", "queueId", "brokerName"]
    out, _ = _run_available_now(df, tmp_path, "s")
    got = sorted(
        (bytes(r.body), r.queueOffset, r.queueId, r.brokerName)
        for r in spark.read.parquet(out).collect()
    )
    want = sorted(
        (r["body"], r["queueOffset"], r["queueId"], r["brokerName"])
        for r in backend.rows(orders)
        if r["tags"] == "odd"
    )
    assert got == want and len(want) == 15


@pytest.mark.parametrize(
    "ddl, message",
    [
        ("topic string, offset long", "the rocketmq source has no column 'offset'"),
        ("Body binary", "the rocketmq source has no column 'Body' (did you mean 'body'?)"),
        ("queueOffset int", "column 'queueOffset' is long in the rocketmq source, not int"),
        ("body binary, body binary", "column 'body' is given twice"),
    ],
)
def test_a_schema_that_is_not_some_of_the_columns_is_refused_before_a_task_runs(
    spark, backend, ddl, message
):
    orders = backend.fresh_topic("orders")
    _fill(backend.client, orders, 2)
    df = (
        spark.read.format("rocketmq")
        .schema(ddl)
        .options(**backend.options)
        .option("topic", orders)
        .load()
    )
    with pytest.raises(Exception, match=re.escape(message)) as e:
        df.collect()
    assert "queueOffset long, msgId string" in str(e.value)  # the columns it could pick
    assert "DATA_SOURCE_RETURN_SCHEMA_MISMATCH" not in str(e.value)


def test_a_stream_with_a_schema_that_is_not_some_of_the_columns_fails_at_start(spark, backend):
    orders = backend.fresh_topic("orders")
    _fill(backend.client, orders, 2)
    df = (
        spark.readStream.format("rocketmq")
        .schema("body string")
        .options(**backend.options)
        .option("topic", orders)
        .load()
    )
    q = None
    with pytest.raises(Exception, match="column 'body' is binary in the rocketmq source") as e:
        q = df.writeStream.format("noop").start()
        q.awaitTermination(60)
        raise AssertionError(f"query did not fail: {q.exception()}")
    if q is not None:
        q.stop()
    assert "UnboundLocalError" not in str(e.value)


def test_starting_offsets_group_resumes_where_the_group_is(spark, backend, tmp_path):
    orders, etl2 = backend.fresh_topic("orders"), backend.fresh_name("etl2")
    _fill(backend.client, orders, 10)
    q0, q1 = backend.queues(orders)
    backend.client.commit_offsets(etl2, {q0: 3, q1: 5})
    df = _stream(spark, backend.options, topic=orders, startingOffsets="group", group=etl2)
    out, _ = _run_available_now(df, tmp_path, "g")
    rows = spark.read.parquet(out).collect()
    assert sorted((r.brokerName, r.queueId, r.queueOffset) for r in rows) == [
        (q0.broker, q0.queue_id, 3),
        (q0.broker, q0.queue_id, 4),
    ]
    # (before Spark 4.2 the last AvailableNow batch is not committed to the group)
    assert backend.client.committed_offset(etl2, q0) == (5 if ADMISSION_CONTROL else 3)


@pytest.mark.embedded_only
def test_a_stream_whose_store_was_replaced_fails_or_restarts_the_queue(spark, tmp_path):
    # The checkpoint says offset 10, the store it now reads (another directory, as after
    # a restore) ends at 3: data loss. The default fails naming the queue;
    # failOnDataLoss=false reads the new queue from its earliest offset.
    # (Embedded only: a second store directory stands for the restored one.)
    from rocketspark.store import MessageStore

    def store_with(name: str, n: int, tag: str) -> str:
        path = str(tmp_path / name)
        with MessageStore.open(path) as s:
            s.create_topic("orders", queues=1)
            s.put_batch([Message("orders", f"{tag}{i}".encode()) for i in range(n)])
        return path

    def run(path: str, chk: str, fail: bool) -> tuple[list[str], Exception | None]:
        got: list[str] = []

        def record(batch_df, batch_id):
            got.extend(r.body.decode() for r in batch_df.select("body").collect())

        df = _stream(
            spark,
            {"store": path},
            topic="orders",
            startingOffsets="earliest",
            failOnDataLoss=str(fail).lower(),
        )
        q = (
            df.writeStream.foreachBatch(record)
            .option("checkpointLocation", str(tmp_path / chk))
            .trigger(availableNow=True)
            .start()
        )
        try:
            q.awaitTermination(180)
        except StreamingQueryException:
            pass  # q.exception() has it, and the caller checks it
        return got, q.exception()

    for fail in (True, False):
        chk = f"chk-{fail}"
        got, error = run(store_with(f"old-{fail}", 10, "a"), chk, fail)
        assert error is None and sorted(got) == sorted(f"a{i}" for i in range(10))
        replaced = store_with(f"new-{fail}", 3, "b")
        got, error = run(replaced, chk, fail)
        if fail:
            assert (
                error is not None
                and "queue orders/broker-a/0: the stream is at offset 10 but the queue ends at 3"
                in str(error)
                and got == []
            )
            continue
        assert error is None and sorted(got) == ["b0", "b1", "b2"]
        with MessageStore.open(replaced) as s:
            s.put_batch([Message("orders", b"b3")])
        got, error = run(replaced, chk, fail)
        assert error is None and got == ["b3"]


def test_a_stream_starting_offset_past_the_queue_end_fails_at_start(spark, backend):
    orders = backend.fresh_topic("orders")
    _fill(backend.client, orders, 4, queues=1)
    broker = backend.broker(orders)
    with pytest.raises(
        Exception,
        match=re.escape(
            f"option startingOffsets: offset 50 for queue {orders}/{broker}/0 is past the "
            "queue's end (4)"
        ),
    ):
        _stream(
            spark,
            backend.options,
            topic=orders,
            startingOffsets=json.dumps({orders: {broker: {"0": 50}}}),
        )


@pytest.mark.embedded_only
def test_fail_on_data_loss_when_segments_were_deleted(spark, tmp_path):
    """Embedded only: the store's expired CommitLog segments are deleted."""
    from rocketspark.store import MessageStore

    small = {"mappedFileSizeCommitLog": "4096", "mappedFileSizeConsumeQueue": "160"}
    path = str(tmp_path / "lossy")
    with MessageStore.open(path, **small) as s:
        s.create_topic("orders", queues=1)
        for _ in range(60):
            s.put(Message("orders", os.urandom(200)))
        s.flush()
        for name in sorted(os.listdir(os.path.join(path, "commitlog")))[:2]:
            f = os.path.join(path, "commitlog", name)
            os.utime(f, (os.stat(f).st_mtime - 7200,) * 2)
        assert s.delete_expired(reserved_hours=1)["commitlog"] == 2
        lo = s.min_offset("orders", 0)
    broker = "broker-a"

    def read(fail: bool):
        r = (
            spark.read.format("rocketmq")
            .option("store", path)
            .option("topic", "orders")
            .option("startingOffsets", json.dumps({"orders": {broker: {"0": 3}}}))
            .option("failOnDataLoss", str(fail).lower())
        )
        for k, v in small.items():
            r = r.option(f"rocketmq.{k}", v)
        return r.load()

    with pytest.raises(
        Exception,
        match=re.escape(
            f"queue orders/{broker}/0: offset 3 was requested but the earliest offset is {lo}"
        ),
    ):
        read(True).collect()
    rows = read(False).collect()
    assert sorted(r.queueOffset for r in rows) == list(range(lo, 60))


def test_filters_on_topic_queue_offset_and_time_are_pushed_down(spark, backend):
    import datetime as dt

    orders, payments = backend.fresh_topic("orders"), backend.fresh_topic("payments")
    _fill(backend.client, orders, 40)
    _fill(backend.client, payments, 10)
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        df = _read(spark, backend).option("topic", f"{orders},{payments}").load()
        q1 = backend.queues(orders)[1]
        q = df.filter(f"topic = '{orders}' and {_of(q1)} and queueOffset >= 5 and queueOffset < 9")
        assert sorted((r.topic, r.brokerName, r.queueId, r.queueOffset) for r in q.collect()) == [
            (orders, q1.broker, q1.queue_id, o) for o in range(5, 9)
        ]
        # pushed down (Spark 4.1+): only the one queue range is planned and read
        assert q.rdd.getNumPartitions() == (1 if FILTER_PUSHDOWN else 4)
        late = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
        assert df.filter(F.col("storeTimestamp") > F.lit(late)).count() == 0
        q0 = backend.queues(orders)[0]
        assert df.filter(f"brokerName in ('{q0.broker}') and queueId in (0)").count() == 25
    finally:
        spark.conf.unset("spark.sql.python.filterPushdown.enabled")


def test_a_bare_max_trigger_delay_is_milliseconds_as_in_kafkas_connector():
    from rocketspark.datasource.options import parse_options

    def delay(value: str) -> int:
        return parse_options({"topic": "t", "maxTriggerDelay": value}, "read")["maxTriggerDelay"]

    assert delay("500") == 500
    assert delay("30s") == 30_000 and delay("15m") == 900_000


@pytest.mark.embedded_only
@pytest.mark.parametrize("role", ["read", "write"])
def test_the_store_directory_is_named_by_one_option_only(role, tmp_path):
    """rocketmq.storePathRootDir beside store was dropped silently; it is refused as the
    store API refuses a path given twice, before any store is opened."""
    from rocketspark.client import ClientRef
    from rocketspark.datasource.options import parse_options
    from rocketspark.errors import ConfigError

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for key in ("rocketmq.storePathRootDir", "rocketmq.storepathrootdir"):
        with pytest.raises(ConfigError, match=f"options store and {re.escape(key)} both"):
            parse_options({"store": a, key: b, "topic": "t"}, role)
    with pytest.raises(ConfigError, match="given twice"):
        parse_options(
            {
                "rocketmq.flushDiskType": "SYNC_FLUSH",
                "rocketmq.flushdisktype": "ASYNC_FLUSH",
                "topic": "t",
            },
            role,
        )
    assert parse_options({"rocketmq.storePathRootDir": b, "topic": "t"}, role).store_overrides == {
        "storePathRootDir": b
    }
    with pytest.raises(ConfigError, match="given twice"):
        ClientRef.embedded(a, {"storePathRootDir": b})
    assert not tmp_path.joinpath("a").exists() and not tmp_path.joinpath("b").exists()


@pytest.mark.embedded_only
def test_a_read_of_a_directory_that_is_not_a_store_writes_nothing(tmp_path):
    from rocketspark.client import ClientRef
    from rocketspark.errors import StorePathError

    other = tmp_path / "project"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    for path in (other, tmp_path / "empty"):
        path.mkdir(exist_ok=True)
        with pytest.raises(StorePathError, match="not a store|no store"):
            ClientRef.embedded(str(path), {}).require()
        with pytest.raises(StorePathError, match="not a store|no store"):
            ClientRef.embedded(str(path), {}).connect()
    assert os.listdir(other) == ["notes.txt"] and os.listdir(tmp_path / "empty") == []


@pytest.mark.embedded_only
def test_a_geometry_option_other_than_the_stores_is_refused_before_a_file_changes(tmp_path):
    """.option("rocketmq.mappedFileSizeConsumeQueue", ...) grew every ConsumeQueue file of
    the store it read, which then could not be read with its own settings."""
    from rocketspark.client import ClientRef, close_all
    from rocketspark.errors import ConfigError
    from rocketspark.store import MessageStore

    root = str(tmp_path / "store")
    with MessageStore.open(root) as s:
        s.create_topic("orders", queues=2)
        s.put_batch([Message("orders", b"x") for _ in range(4)])
    stamps = {
        os.path.join(d, n): os.stat(os.path.join(d, n)).st_mtime_ns
        for d, _, names in os.walk(root)
        for n in names
    }
    sizes = {p: os.path.getsize(p) for p in stamps}
    with pytest.raises(ConfigError, match="mappedFileSizeConsumeQueue=12000000"):
        ClientRef.embedded(root, {"mappedFileSizeConsumeQueue": "12000000"}).require().connect()
    assert {p: os.stat(p).st_mtime_ns for p in stamps} == stamps
    assert {p: os.path.getsize(p) for p in stamps} == sizes
    close_all()


@pytest.mark.embedded_only
def test_a_damaged_body_fails_the_read_unless_check_crcs_is_false(spark, store_path, store):
    """Embedded only: a byte of a CommitLog file is flipped."""
    _fill(store, "orders", 4, queues=1)
    m = store.pull("orders", 0, 1, 1).messages[0]
    seg = store.commit_log.segment(m.commitlog_offset)
    with open(seg.path, "r+b") as f:  # the first byte of the body, as damage on disk would
        f.seek(m.commitlog_offset - seg.start_offset + 88)
        first = f.read(1)[0]
        f.seek(-1, 1)
        f.write(bytes([first ^ 0x20]))
    reader = spark.read.format("rocketmq").option("store", store_path).option("topic", "orders")
    with pytest.raises(Exception, match=f"body CRC mismatch.*offset {m.commitlog_offset}"):
        reader.load().collect()
    rows = reader.option("checkCRCs", "false").load().collect()
    assert sorted(r.body for r in rows) == [b"Orders-1", b"orders-0", b"orders-2", b"orders-3"]


@pytest.mark.embedded_only
def test_a_refused_geometry_option_is_named_as_the_option_given(tmp_path):
    """Spark lower-cases the key and the store sees keyword arguments: the error still
    names the option the user wrote, not a keyword argument they never passed."""
    from rocketspark.client import ClientRef, close_all
    from rocketspark.datasource.options import parse_options
    from rocketspark.errors import ConfigError
    from rocketspark.store import MessageStore

    root = str(tmp_path / "store")
    with MessageStore.open(root, mappedFileSizeCommitLog=4096) as s:
        s.create_topic("orders", queues=1)
    opts = parse_options(
        {"store": root, "topic": "orders", "rocketmq.mappedfilesizecommitlog": "8192"}, "read"
    )
    with pytest.raises(ConfigError) as info:
        ClientRef.embedded(opts.get("store"), opts.store_overrides).require().connect()
    assert "option rocketmq.mappedFileSizeCommitLog" in str(info.value)
    assert "keyword argument" not in str(info.value)
    close_all()

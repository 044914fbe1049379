"""A streaming query's lag, read from its progress: ``lag()`` and ``LagListener``."""

from __future__ import annotations

import json
import time

import pytest

from rocketspark.datasource.lag import LagListener, SourceLag, lag
from rocketspark.errors import ConfigError
from rocketspark.message.model import Message, MessageQueue
from tests.datasource.spark_version import ADMISSION_CONTROL


def _progress(batch: int, *sources: tuple[object, object]) -> dict:
    return {
        "batchId": batch,
        "sources": [{"endOffset": end, "latestOffset": latest} for end, latest in sources],
    }


def test_lag_is_latest_minus_end_queue_by_queue():
    end = {"t": {"broker-a": {"0": 10, "1": 40}}}
    latest = {"t": {"broker-a": {"0": 25, "1": 40}, "broker-b": {"0": 7}}}
    found = lag(_progress(3, (json.dumps(end), json.dumps(latest))))
    assert found == SourceLag(
        3,
        {
            MessageQueue("t", "broker-a", 0): 15,
            MessageQueue("t", "broker-a", 1): 0,
            MessageQueue("t", "broker-b", 0): 7,  # a queue the batch did not reach yet
        },
    )
    assert found.total == 22
    assert str(found) == "batch 3: lag 22 messages over 3 queues (most: 15 on t/broker-a/0)"


def test_lag_skips_other_sources_and_is_none_without_ours():
    kafka = {"orders": {"0": 5}}  # Kafka's source: {topic: {partition: offset}}
    assert lag(_progress(0, (kafka, kafka))) is None
    assert lag(_progress(0, ({"t": {"b": {"0": 1}}}, None))) is None  # no latest reported
    assert lag(None) is None
    ours = ({"t": {"b": {"0": 1}}}, {"t": {"b": {"0": 4}}})
    assert lag(json.dumps(_progress(1, (kafka, kafka), ours))).total == 3


def test_lag_refuses_what_is_not_a_progress():
    with pytest.raises(ConfigError, match="not int"):
        lag(42)
    with pytest.raises(ConfigError, match="not JSON"):
        lag("{oops")


@pytest.mark.skipif(not ADMISSION_CONTROL, reason="Spark 4.2 reports a source's latest offset")
def test_a_listener_reports_each_batchs_lag_and_lag_reads_a_query(spark, store, store_path):
    store.create_topic("lagging", queues=2)
    store.put_batch([Message("lagging", b"%d" % i, queue_id=i % 2) for i in range(100)])
    seen: list[tuple[str, SourceLag]] = []
    listener = LagListener(lambda query, found: seen.append((query, found)))
    spark.streams.addListener(listener)
    try:
        q = (
            spark.readStream.format("rocketmq")
            .option("store", store_path)
            .option("topic", "lagging")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "40")
            .load()
            .writeStream.format("noop")
            .queryName("lag_test")
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(180)
        assert q.exception() is None
        assert lag(q).total == 0  # the last batch read everything
        deadline = time.monotonic() + 30  # listener events come on Spark's bus, later
        while len(seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        spark.streams.removeListener(listener)
    totals = [found.total for _, found in sorted(seen, key=lambda s: s[1].batch_id)]
    assert {query for query, _ in seen} == {"lag_test"}
    assert totals[:3] == [60, 20, 0]  # 100 messages, 40 a batch

"""The Spark data source with ``nameServer`` pointed at ``serve``: batch writes (both
delivery guarantees) land in the store, and batch reads return them."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest

from rocketspark.client import remote
from rocketspark.remoting.processors import serve
from rocketspark.store.message_store import MessageStore


@pytest.fixture
def served(tmp_path: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # msgIds name the broker (the sink finds its halves' broker by them): listenPort is
    # the broker port, as rocketspark serve opens its store.
    with MessageStore.open(str(tmp_path / "store"), listenPort=port) as store:
        with serve(store, namesrv_port=0, broker_port=port) as srv:
            yield store, srv
        remote.close_all()  # the driver's clients of this server


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_spark_writes_and_reads_through_serve(spark, served, guarantee: str) -> None:
    store, srv = served
    topic = f"spark-{uuid.uuid4().hex[:10]}"
    store.create_topic(topic, 2)
    rows = [(f"body-{i}", f"t{i % 2}", [f"k{i}"], {"p": str(i)}) for i in range(20)]
    df = spark.createDataFrame(
        rows, "body string, tags string, keys array<string>, properties map<string,string>"
    )
    (
        df.write.format("rocketmq")
        .option("nameServer", srv.namesrv_address)
        .option("topic", topic)
        .option("deliveryGuarantee", guarantee)
        .mode("append")
        .save()
    )
    stored = [m for q in (0, 1) for m in store.pull(topic, q, 0, 100).messages]
    assert sorted(m.body.decode() for m in stored) == sorted(f"body-{i}" for i in range(20))
    by_body = {m.body.decode(): m for m in stored}
    assert by_body["body-3"].tags == "t1" and list(by_body["body-3"].keys) == ["k3"]
    assert by_body["body-3"].properties["p"] == "3"

    read = (
        spark.read.format("rocketmq")
        .option("nameServer", srv.namesrv_address)
        .option("topic", topic)
        .load()
    )
    got = sorted(r.body.decode() for r in read.select("body").collect())
    assert got == sorted(f"body-{i}" for i in range(20))

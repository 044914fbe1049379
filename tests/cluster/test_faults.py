"""Faults of a real cluster: nothing acknowledged is lost, and errors say what failed.

- One NameServer of two down: the client asks the other (either order).
- Nothing listening where a NameServer should be: a clear error naming the address,
  after the connect timeout, before any data is written.
- A broker SIGKILLed and restarted under an exactly-once stream: the query fails
  while the broker is down; run again from its checkpoint, it holds every input row
  exactly once in its output.

Marked ``cluster``.
"""

from __future__ import annotations

import socket
import time

import pytest

from rocketspark.client import ClientRef, close_all
from rocketspark.errors import RemotingConnectError
from tests.helpers.cluster import unique_topic

pytestmark = pytest.mark.cluster


def _dead_address() -> str:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("dead_first", [True, False])
def test_one_name_server_of_two_down(rocketmq_cluster, dead_first):
    cluster = rocketmq_cluster
    topic = unique_topic("ns-failover")
    cluster.create_topic(topic, queues=1)
    dead = _dead_address()
    both = f"{dead};{cluster.namesrv}" if dead_first else f"{cluster.namesrv};{dead}"
    client = ClientRef.cluster(both).connect()
    try:
        assert {mq.broker for mq in client.queues(topic)} == {"broker-a", "broker-b"}
        client.put_columns([b"x"] * 4, topic=topic)
        assert sum(client.max_offset(mq) for mq in client.queues(topic)) == 4
    finally:
        close_all()


def test_no_name_server_is_a_clear_error_naming_it(spark):
    dead = _dead_address()
    started = time.monotonic()
    with pytest.raises(Exception) as info:
        (
            spark.read.format("rocketmq")
            .option("nameServer", dead)
            .option("connectTimeoutMs", "2000")
            .option("topic", "orders")
            .load()
            .collect()
        )
    assert dead in str(info.value) and "GET_ROUTEINFO_BY_TOPIC" in str(info.value)
    assert time.monotonic() - started < 60
    with pytest.raises(RemotingConnectError, match=dead):
        ClientRef.cluster(dead).connect().queues("orders")
    close_all()


@pytest.mark.spark
def test_a_broker_killed_under_an_exactly_once_stream_loses_and_doubles_nothing(
    spark, rocketmq_cluster, tmp_path
):
    cluster = rocketmq_cluster
    source, out = unique_topic("kill-in"), unique_topic("kill-out")
    cluster.create_topic(source, queues=2)
    cluster.create_topic(out, queues=2)
    client = ClientRef.cluster(cluster.namesrv).connect()
    bodies = [f"row-{i}".encode() for i in range(3000)]
    client.put_columns(bodies[:1500], topic=source)

    def run() -> None:
        query = (
            spark.readStream.format("rocketmq")
            .option("nameServer", cluster.namesrv)
            .option("topic", source)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "300")
            .load()
            .select("body")
            .writeStream.format("rocketmq")
            .option("nameServer", cluster.namesrv)
            .option("topic", out)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(600)

    run()  # the first half, whole
    client.put_columns(bodies[1500:], topic=source)
    cluster.kill("broker-b")
    with pytest.raises(Exception) as info:  # noqa: B017 - Spark wraps what the tasks raised
        run()  # fails: half of the source's queues (and of the sink's) are gone
    assert cluster.addr("broker-b") in str(info.value)  # the error names the broker
    cluster.restart("broker-b")
    close_all()  # the old connections point at the killed broker's sockets
    client = ClientRef.cluster(cluster.namesrv).connect()
    run()
    deadline = time.monotonic() + 60  # halves a dead task left are the check-backs' to end
    while True:
        rows = (
            spark.read.format("rocketmq")
            .option("nameServer", cluster.namesrv)
            .option("topic", out)
            .load()
            .select("body")
            .collect()
        )
        got = sorted(bytes(r.body) for r in rows)
        if len(got) >= len(bodies) or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert got == sorted(bodies)  # every row, once
    close_all()

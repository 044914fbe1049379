"""Reads from a slave: the one the broker suggests, and any member when the master is gone.

A NameServer, a master and its slave of their own (broker group ``broker-ha``,
replicating over loopback). Both have ``slaveReadEnable`` and an
``accessMessageInMemoryMaxRatio`` of 0, so every pull answered short of a queue's end
says "read from broker 1" (the broker suggests its slave when the reader lags by more
than that share of memory: ``DefaultMessageStore.getMessage``, ``PullMessageProcessor``).
Shown: the client follows the suggestion and reads every row exactly, as the Java
consumer does; with the master SIGKILLed, the data source reads the whole topic from the
slave (offsets included), as RocketMQ's consumers fall back to any member of a group.
"""

from __future__ import annotations

import time

import pytest

from rocketspark.client import ClientRef, close_all
from rocketspark.errors import RemotingCommandError
from rocketspark.message.model import MessageQueue
from rocketspark.remoting.codes import ResponseCode
from tests.helpers.rocketmq import Broker, RocketMQ

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

TOPIC = "ha-orders"
ROWS = 600
SLAVE_READS = {"slaveReadEnable": "true", "accessMessageInMemoryMaxRatio": 0}


@pytest.fixture(scope="module")
def ha_group(rocketmq_java, tmp_path_factory):
    run = tmp_path_factory.mktemp("ha")
    rocketmq = RocketMQ(run, rocketmq_java)
    try:
        master = rocketmq.add_broker(
            "broker-ha", run / "master", cluster="HaCluster", **SLAVE_READS
        )
        slave = rocketmq.add_broker(
            "broker-ha",
            run / "slave",
            cluster="HaCluster",
            brokerId=1,
            brokerRole="SLAVE",
            **SLAVE_READS,
        )
        for b in (master, slave):
            b.start()
        for b in (master, slave):
            b.wait_boot()
        client = ClientRef.cluster(rocketmq.addr).connect()
        _wait(lambda: client.remoting.brokers().get("broker-ha", {}).keys() == {0, 1}, "both up")
        client.remoting.create_topic(TOPIC, {"broker-ha": 2})
        client.put_columns([f"m{i}".encode() for i in range(ROWS)], topic=TOPIC)
        yield rocketmq, master, slave
    finally:
        close_all()
        rocketmq.close()


def _wait(ready, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"not {what} within {timeout:.0f} s"
        time.sleep(0.5)


def _replicated(rocketmq: RocketMQ, slave: Broker) -> None:
    """Wait until the slave holds every row (its ConsumeQueues have the master's ends)."""
    client = ClientRef.cluster(rocketmq.addr).connect()
    queues = client.queues(TOPIC)
    want = {mq: client.max_offset(mq) for mq in queues}
    assert sum(want.values()) == ROWS

    def on_slave(mq: MessageQueue) -> int:
        from rocketspark.remoting import headers as h
        from rocketspark.remoting.codes import RequestCode

        header = h.GetMaxOffsetRequestHeader(topic=TOPIC, queue_id=mq.queue_id, broker_name="")
        answer = client.remoting.invoke(slave.addr, RequestCode.GET_MAX_OFFSET, header)
        return int(answer.ext_fields["offset"])

    _wait(lambda: all(on_slave(mq) == n for mq, n in want.items()), "replicated")

    def serves(mq: MessageQueue) -> bool:
        """Whether the slave has the topic's config (synchronized from the master every
        10 s), without which it answers a pull TOPIC_NOT_EXIST."""
        pull = client.remoting.pull_async(mq, 0, 1, group="ha-probe", address=slave.addr)
        try:
            client.remoting.pull_answer(mq, pull.result(), slave.addr)
        except RemotingCommandError as e:
            if e.code != ResponseCode.TOPIC_NOT_EXIST:
                raise
            return False
        return True

    _wait(lambda: all(serves(mq) for mq in queues), "the topic known to the slave")


def _bodies(batches) -> list[str]:
    return [b.decode() for batch in batches for b in batch.column("body").to_pylist()]


def test_pulls_follow_the_slave_the_broker_suggests(ha_group):
    rocketmq, master, slave = ha_group
    _replicated(rocketmq, slave)
    client = ClientRef.cluster(rocketmq.addr, {"pullBatchSize": "32"}).connect()
    rows: list[str] = []
    for mq in client.queues(TOPIC):
        assert client.remoting.read_address(mq) == master.addr  # nothing suggested yet
        batches, _ = client.read_batches(mq, 0, client.max_offset(mq))
        rows += _bodies(batches)
        # the master answered "read from broker 1", and so did the slave after it
        assert client.remoting.read_address(mq) == slave.addr
    assert sorted(rows) == sorted(f"m{i}" for i in range(ROWS))


def test_with_the_master_killed_the_source_reads_the_slave(ha_group, spark):
    rocketmq, master, slave = ha_group
    _replicated(rocketmq, slave)
    master.kill()
    client = ClientRef.cluster(rocketmq.addr).connect()
    # the NameServer forgets the master when its connection closes
    _wait(lambda: client.remoting.brokers().get("broker-ha", {}).keys() == {1}, "master gone")
    df = (
        spark.read.format("rocketmq")
        .option("nameServer", rocketmq.addr)
        .option("topic", TOPIC)
        .load()
    )
    got = [(r.queueId, r.queueOffset, r.body.decode()) for r in df.collect()]
    assert sorted(b for _, _, b in got) == sorted(f"m{i}" for i in range(ROWS))
    assert len({(q, o) for q, o, _ in got}) == ROWS

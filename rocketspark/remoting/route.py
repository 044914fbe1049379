"""Topic routes as a NameServer answers them, and which broker address serves a queue.

A GET_ROUTEINFO_BY_TOPIC answer's body is RocketMQ's ``TopicRouteData`` in
fastjson::

    {"queueDatas":  [{"brokerName": "broker-a", "readQueueNums": 4,
                      "writeQueueNums": 4, "perm": 6, "topicSysFlag": 0}, ...],
     "brokerDatas": [{"cluster": "DefaultCluster", "brokerName": "broker-a",
                      "brokerAddrs": {"0": "127.0.0.1:10911", "1": "..."}}, ...]}

Broker id 0 is the master, others are slaves; an old server writes the ids as
bare integer keys, which :func:`~rocketspark.message.fastjson.loads_lenient`
reads. A topic's readable queues are ``MessageQueue(topic, brokerName, id)``
for every queue data with PERM_READ and every ``id < readQueueNums``, its
writable ones likewise with PERM_WRITE and ``writeQueueNums`` (RocketMQ's
``MQClientInstance.topicRouteData2TopicSubscribeInfo`` and
``topicRouteData2TopicPublishInfo``). A broker data with no master has no
writable queues: a producer cannot send there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rocketspark.errors import RemotingError
from rocketspark.message.fastjson import loads_lenient
from rocketspark.message.model import MessageQueue

__all__ = ["MASTER_ID", "PERM_READ", "PERM_WRITE", "BrokerData", "QueueData", "TopicRoute"]

MASTER_ID = 0
# PermName: bit 2 readable, bit 1 writable (bit 3 priority, bit 0 inherit).
PERM_READ = 0x4
PERM_WRITE = 0x2


@dataclass(frozen=True, slots=True)
class QueueData:
    """One broker's share of a topic (RocketMQ's QueueData)."""

    broker_name: str
    read_queues: int
    write_queues: int
    perm: int
    topic_sys_flag: int = 0

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)


@dataclass(frozen=True, slots=True)
class BrokerData:
    """A broker group: its name, cluster and the address of each member by broker id."""

    cluster: str
    broker_name: str
    addrs: Mapping[int, str]

    @property
    def master(self) -> str | None:
        """The master's address, or None while the group has no master."""
        return self.addrs.get(MASTER_ID)

    def address(self, broker_id: int) -> str | None:
        """The address of ``broker_id`` if it is up, else the master's, else any member's
        (what a consumer falls back to, as ``MQClientInstance.findBrokerAddressInSubscribe``)."""
        addr = self.addrs.get(broker_id) or self.addrs.get(MASTER_ID)
        if addr is None and self.addrs:
            addr = self.addrs[min(self.addrs)]
        return addr


@dataclass(frozen=True, slots=True)
class TopicRoute:
    """One topic's route: the queue data of each broker and the broker groups."""

    topic: str
    queue_datas: tuple[QueueData, ...]
    broker_datas: tuple[BrokerData, ...]

    @classmethod
    def parse(cls, topic: str, body: bytes | bytearray | memoryview) -> TopicRoute:
        """Read a GET_ROUTEINFO_BY_TOPIC body; RemotingError naming the topic if it is not one."""
        try:
            data = loads_lenient(bytes(body).decode("utf-8"))
            return cls.from_json(topic, data)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise RemotingError(
                f"the NameServer's route of topic {topic!r} is not a TopicRouteData: {e}"
            ) from e

    @classmethod
    def from_json(cls, topic: str, data: Mapping[str, Any]) -> TopicRoute:
        queues = tuple(
            sorted(
                (
                    QueueData(
                        q["brokerName"],
                        int(q["readQueueNums"]),
                        int(q["writeQueueNums"]),
                        int(q["perm"]),
                        int(q.get("topicSysFlag") or 0),
                    )
                    for q in data.get("queueDatas") or ()
                ),
                key=lambda q: q.broker_name,
            )
        )
        brokers = tuple(
            sorted(
                (
                    BrokerData(
                        b.get("cluster") or "",
                        b["brokerName"],
                        {int(k): v for k, v in (b.get("brokerAddrs") or {}).items()},
                    )
                    for b in data.get("brokerDatas") or ()
                ),
                key=lambda b: b.broker_name,
            )
        )
        return cls(topic, queues, brokers)

    def broker(self, name: str) -> BrokerData | None:
        for b in self.broker_datas:
            if b.broker_name == name:
                return b
        return None

    def read_queues(self) -> list[MessageQueue]:
        """Every readable queue, by broker name then queue id."""
        return [
            MessageQueue(self.topic, q.broker_name, i)
            for q in self.queue_datas
            if q.readable
            for i in range(q.read_queues)
        ]

    def write_queues(self) -> list[MessageQueue]:
        """Every writable queue of a broker group that has a master, by broker then id."""
        masters = {b.broker_name for b in self.broker_datas if b.master}
        return [
            MessageQueue(self.topic, q.broker_name, i)
            for q in self.queue_datas
            if q.writable and q.broker_name in masters
            for i in range(q.write_queues)
        ]

    def masters(self) -> dict[str, str]:
        """broker name → master address, for every group that has a master."""
        return {b.broker_name: b.master for b in self.broker_datas if b.master}

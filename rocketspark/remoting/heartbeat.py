"""Heartbeats: a client's producer and consumer groups, registered with every master.

A broker sends CHECK_TRANSACTION_STATE only to a connected producer of the half's
group, and creates a consumer group (and its ``%RETRY%`` topic) on the group's
first heartbeat: a client that does either registers the group here, and
HEART_BEAT goes to every master it knows, then every ``HEARTBEAT_INTERVAL``
seconds while it is open (a broker forgets a client silent for 120 s). Closing
sends UNREGISTER_CLIENT for each group.

A registered consumer is listed by ``mqadmin consumerConnection``, and
``mqadmin consumerStatus`` asks it (GET_CONSUMER_RUNNING_INFO, relayed by a
broker) what it runs: :meth:`Heartbeats.running_info` answers as RocketMQ's
pull consumers do (``ConsumerRunningInfo``: properties and subscriptions; no
process queues, since a pull reader holds no messages between pulls).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from rocketspark.errors import RemotingConnectError, RemotingError, RemotingTimeoutError
from rocketspark.remoting import headers as h
from rocketspark.remoting.codes import RequestCode, ResponseCode
from rocketspark.remoting.command import RemotingCommand
from rocketspark.remoting.route import MASTER_ID

if TYPE_CHECKING:  # pragma: no cover
    from rocketspark.remoting.client import RemotingClient
    from rocketspark.remoting.connection import Connection

__all__ = ["HEARTBEAT_INTERVAL", "Heartbeats"]

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL = 30.0  # seconds; a broker drops a client silent for 120 s
CONSUME_TYPE = "CONSUME_ACTIVELY"  # a pull consumer: it asks for messages, none are pushed
CLIENT_VERSION = "rocketspark"  # PROP_CLIENT_VERSION (Java's is MQVersion's, e.g. V5_3_1)


class Heartbeats:
    """The groups ``rc`` registered, and the thread that beats for them."""

    def __init__(self, rc: RemotingClient):
        self.rc = rc
        self._lock = threading.Lock()
        self._producer_groups: set[str] = set()
        self._consumer_groups: dict[str, set[str]] = {}  # group -> topics
        self._heartbeat: threading.Thread | None = None
        self._started_ms: dict[str, int] = {}  # consumer group -> first registered
        self.closed = threading.Event()

    @property
    def registered(self) -> bool:
        return bool(self._producer_groups or self._consumer_groups)

    def register_producer(self, group: str) -> None:
        """Heartbeat as a producer of ``group`` (check-backs come to this client)."""
        with self._lock:
            new = group not in self._producer_groups
            self._producer_groups.add(group)
        if new:
            self.heartbeat()

    def register_consumer(self, group: str, topic: str | None) -> None:
        """Heartbeat as a consumer of ``group`` (reading ``topic``, if given: pull, no
        rebalance). A broker creates the group's retry topic on its first heartbeat."""
        with self._lock:
            new = group not in self._consumer_groups
            self._started_ms.setdefault(group, int(time.time() * 1000))
            topics = self._consumer_groups.setdefault(group, set())
            if topic is not None and topic not in topics:
                topics.add(topic)
                new = True
        if new:
            self.heartbeat()

    def _heartbeat_body(self) -> bytes:
        with self._lock:
            producers = sorted(self._producer_groups)
            consumers = {g: sorted(t) for g, t in self._consumer_groups.items()}
        data = {
            "clientID": self.rc.client_id,
            "producerDataSet": [{"groupName": g} for g in producers],
            "consumerDataSet": [
                {
                    "groupName": g,
                    "consumeType": "CONSUME_ACTIVELY",
                    "messageModel": "CLUSTERING",
                    "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                    "unitMode": False,
                    "subscriptionDataSet": [_subscription(t) for t in topics],
                }
                for g, topics in sorted(consumers.items())
            ],
        }
        return json.dumps(data).encode()

    def running_info(self, request: RemotingCommand, connection: Connection) -> RemotingCommand:
        """Answer GET_CONSUMER_RUNNING_INFO for a consumer group of this client."""
        head = h.GetConsumerRunningInfoRequestHeader.from_ext_fields(request.ext_fields)
        group = head.consumer_group
        with self._lock:
            topics = sorted(self._consumer_groups.get(group, ()))
            known = group in self._consumer_groups
            started = self._started_ms.get(group, 0)
        if not known:
            return RemotingCommand.response_to(
                request,
                ResponseCode.SYSTEM_ERROR,
                f"The Consumer Group <{group}> not exist in this consumer",
            )
        info: dict[str, Any] = {
            "properties": {
                "consumerGroup": group,
                "messageModel": "CLUSTERING",
                "PROP_NAMESERVER_ADDR": "".join(f"{a};" for a in self.rc.namesrv),
                "PROP_CONSUME_TYPE": CONSUME_TYPE,
                "PROP_CONSUMEORDERLY": "false",
                "PROP_CLIENT_VERSION": CLIENT_VERSION,
                "PROP_CONSUMER_START_TIMESTAMP": str(started),
            },
            "subscriptionSet": [_subscription(t) for t in topics],
            "mqTable": {},
            "mqPopTable": {},
            "statusTable": {},
            "userConsumerInfo": {},
        }
        if head.jstack_enable:
            info["jstack"] = ""  # a Python process has no JVM threads to show
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS, body=json.dumps(info).encode()
        )

    def _masters(self) -> list[str]:
        addrs: set[str] = set()
        for route in self.rc.cached_routes():
            addrs.update(route.masters().values())
        if not addrs:
            addrs.update(ids[MASTER_ID] for ids in self.rc.brokers().values() if MASTER_ID in ids)
        return sorted(addrs)

    def heartbeat(self) -> None:
        """Send HEART_BEAT to every master this client knows; start the periodic beat."""
        body = self._heartbeat_body()
        for addr in self._masters():
            try:
                self.rc.invoke(addr, RequestCode.HEART_BEAT, body=body)
            except (RemotingConnectError, RemotingTimeoutError) as e:
                log.warning("heartbeat to %s failed: %s", addr, e)
        with self._lock:
            if self._heartbeat is None and not self.closed.is_set():
                self._heartbeat = threading.Thread(
                    target=self._beat, name="rocketspark-heartbeat", daemon=True
                )
                self._heartbeat.start()

    def _beat(self) -> None:
        while not self.closed.wait(HEARTBEAT_INTERVAL):
            try:
                self.heartbeat()
            except Exception as e:  # noqa: BLE001 - a missed beat is retried on the next
                log.warning("heartbeat failed: %s", e)

    def unregister(self) -> None:
        """UNREGISTER_CLIENT for every group this client registered, from every master."""
        for addr in self._masters():
            for g in sorted(self._producer_groups):
                self._unregister_one(
                    addr,
                    h.UnregisterClientRequestHeader(client_id=self.rc.client_id, producer_group=g),
                )
            for g in sorted(self._consumer_groups):
                self._unregister_one(
                    addr,
                    h.UnregisterClientRequestHeader(client_id=self.rc.client_id, consumer_group=g),
                )

    def _unregister_one(self, addr: str, header: h.UnregisterClientRequestHeader) -> None:
        try:
            self.rc.invoke(addr, RequestCode.UNREGISTER_CLIENT, header, timeout=3.0)
        except RemotingError as e:
            log.info("unregistering from %s: %s", addr, e)


def _subscription(topic: str) -> dict[str, Any]:
    """RocketMQ's ``SubscriptionData`` of a reader of every tag of ``topic``."""
    return {
        "classFilterMode": False,
        "topic": topic,
        "subString": "*",
        "tagsSet": [],
        "codeSet": [],
        "subVersion": 0,
        "expressionType": "TAG",
    }

"""The client registry (RocketMQ's ``ClientManageProcessor`` with its ``ConsumerManager``
and ``ProducerManager``): heartbeats, the consumers and producers of each group and
their connections, consumer groups made on first sight."""

from __future__ import annotations

import logging
import threading

from rocketspark.errors import RocketSparkError
from rocketspark.message.fastjson import loads_lenient
from rocketspark.message.model import retry_topic
from rocketspark.remoting import headers as h
from rocketspark.remoting.codes import ResponseCode
from rocketspark.remoting.command import RemotingCommand
from rocketspark.remoting.processors.common import answer, ok, to_json
from rocketspark.remoting.server import Channel
from rocketspark.store.message_store import MessageStore

log = logging.getLogger(__name__)


class ClientRegistry:
    """The connected consumers and producers of each group, from their heartbeats."""

    def __init__(self, store: MessageStore):
        self.store = store
        self._clients_lock = threading.Lock()
        # group -> client id -> channel (consumers), from heartbeats
        self._consumers: dict[str, dict[str, Channel]] = {}
        self._producers: dict[str, dict[str, Channel]] = {}

    def producer_channels(self, group: str) -> list[Channel]:
        """The open connections of the producers of ``group``."""
        with self._clients_lock:
            return [ch for ch in self._producers.get(group, {}).values() if not ch.closed]

    def heartbeat(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        try:
            data = loads_lenient(bytes(request.body or b"{}").decode("utf-8"))
            client_id = str(data.get("clientID") or channel.address)
            consumers = [str(c["groupName"]) for c in data.get("consumerDataSet") or ()]
            producers = [str(p["groupName"]) for p in data.get("producerDataSet") or ()]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            return answer(request, ResponseCode.SYSTEM_ERROR, f"bad heartbeat: {e}")
        for group in consumers:
            self.ensure_group(group)
        with self._clients_lock:
            for table, groups in ((self._consumers, consumers), (self._producers, producers)):
                for group in groups:
                    table.setdefault(group, {})[client_id] = channel
        if "clientID" not in channel.attributes:
            channel.attributes["clientID"] = client_id
            channel.on_close(self._forget_client)
        return ok(request)

    def ensure_group(self, group: str) -> None:
        """A consumer group and its retry topic, made on its first heartbeat as a broker
        does (the retry topic: one queue)."""
        try:
            if self.store.groups.get(group) is None:
                self.store.groups.get_or_create(group)
            retry = retry_topic(group)
            if not self.store.has_topic(retry):
                # if_absent: pull and heartbeat threads (and mqadmin's updateTopic) may
                # make it at once; checked and made under the topic table's locks, so
                # one made meanwhile, with more queues, is not shrunk to one.
                self.store.create_topic(retry, 1, if_absent=True)
        except RocketSparkError as e:
            log.warning("cannot make consumer group %s: %s", group, e)

    def unregister_client(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        h.UnregisterClientRequestHeader.from_ext_fields(request.ext_fields)
        self._forget_client(channel)
        return ok(request)

    def _forget_client(self, channel: Channel) -> None:
        with self._clients_lock:
            for table in (self._consumers, self._producers):
                for group, clients in list(table.items()):
                    for cid, ch in list(clients.items()):
                        if ch is channel:
                            del clients[cid]
                    if not clients:
                        del table[group]

    def consumer_list(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        header = h.GetConsumerListByGroupRequestHeader.from_ext_fields(request.ext_fields)
        with self._clients_lock:
            ids = sorted(self._consumers.get(header.consumer_group, {}))
        if not ids:
            return answer(
                request,
                ResponseCode.SYSTEM_ERROR,
                f"no consumer for this group, {header.consumer_group}",
            )
        return ok(request, body=to_json({"consumerIdList": ids}))

    def consumer_connections(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        """GET_CONSUMER_CONNECTION_LIST: the connections whose heartbeats name the group."""
        group = request.ext_fields.get("consumerGroup", "")
        with self._clients_lock:
            clients = dict(self._consumers.get(group, {}))
        if not clients:
            return answer(
                request,
                ResponseCode.CONSUMER_NOT_ONLINE,
                f"the consumer group[{group}] not online",
            )
        connections = [
            {"clientId": cid, "clientAddr": ch.address, "language": "JAVA", "version": 0}
            for cid, ch in sorted(clients.items())
        ]
        body = {
            "connectionSet": connections,
            "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
            "consumeType": "CONSUME_PASSIVELY",
            "messageModel": "CLUSTERING",
            "subscriptionTable": {},
        }
        return ok(request, body=to_json(body))

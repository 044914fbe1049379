"""The NameServer's requests (RocketMQ's ``DefaultRequestProcessor`` /
``ClientRequestProcessor``): routes, cluster info and the topic list of the one broker
the store is."""

from __future__ import annotations

from typing import Any

from rocketspark.errors import RocketSparkError
from rocketspark.message.model import RETRY_GROUP_TOPIC_PREFIX, TopicInfo
from rocketspark.message.names import validate_group
from rocketspark.remoting import headers as h
from rocketspark.remoting.codes import RequestCode, ResponseCode
from rocketspark.remoting.command import RemotingCommand
from rocketspark.remoting.processors.common import (
    PERM_READ_WRITE,
    BrokerIdentity,
    answer,
    ok,
    to_json,
)
from rocketspark.remoting.server import Channel, Processor
from rocketspark.store.message_store import MessageStore


class NameServerProcessors:
    """Routes, cluster info and the topic list of the one broker the store is."""

    def __init__(self, store: MessageStore, broker: BrokerIdentity):
        self.store = store
        self.broker = broker

    def table(self) -> dict[int, Processor]:
        return {
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self.route,
            RequestCode.GET_BROKER_CLUSTER_INFO: self.cluster_info,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.topic_list,
            RequestCode.GET_TOPICS_BY_CLUSTER: self.topic_list,
            RequestCode.GET_KV_CONFIG: self.kv_config,
        }

    def _broker_data(self) -> dict[str, Any]:
        b = self.broker
        return {"cluster": b.cluster, "brokerName": b.name, "brokerAddrs": {"0": b.address}}

    def route(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        topic = h.GetRouteInfoRequestHeader.from_ext_fields(request.ext_fields).topic
        info = self.store.topics.info(topic)
        if info is None and topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            # Every group has a retry topic of one queue: the broker makes it on the
            # group's first heartbeat or pull. Routed before that, so that a push
            # consumer, which asks for the route before its first heartbeat, reads it.
            try:
                validate_group(topic[len(RETRY_GROUP_TOPIC_PREFIX) :])
            except RocketSparkError:
                pass
            else:
                info = TopicInfo(topic, 1, 1, PERM_READ_WRITE, False)
        if info is None:
            return answer(
                request,
                ResponseCode.TOPIC_NOT_EXIST,
                f"No topic route info in name server for the topic: {topic}",
            )
        route = {
            "brokerDatas": [self._broker_data()],
            "filterServerTable": {},
            "queueDatas": [
                {
                    "brokerName": self.broker.name,
                    "perm": info.perm,
                    "readQueueNums": info.read_queue_nums,
                    "topicSysFlag": 0,
                    "writeQueueNums": info.write_queue_nums,
                }
            ],
        }
        return ok(request, body=to_json(route))

    def cluster_info(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        info = {
            "brokerAddrTable": {self.broker.name: self._broker_data()},
            "clusterAddrTable": {self.broker.cluster: [self.broker.name]},
        }
        return ok(request, body=to_json(info))

    def topic_list(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        return ok(request, body=to_json({"topicList": sorted(self.store.topics.names())}))

    def kv_config(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        key = request.ext_fields.get("key", "")
        return answer(
            request, ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: ... Key: {key}"
        )

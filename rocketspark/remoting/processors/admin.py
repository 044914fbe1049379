"""Administration and queries (RocketMQ's ``AdminBrokerProcessor`` and
``QueryMessageProcessor``): queue offsets, topic and group creation, runtime info,
topic and consumer statistics, messages by offset and by key."""

from __future__ import annotations

from rocketspark.errors import OffsetOutOfRangeError, RocketSparkError, UnknownTopicError
from rocketspark.message.fastjson import loads_lenient
from rocketspark.remoting import headers as h
from rocketspark.remoting.codes import MQ_VERSION, ResponseCode
from rocketspark.remoting.command import RemotingCommand
from rocketspark.remoting.processors.common import (
    BrokerIdentity,
    answer,
    ok,
    queue_offset,
    to_json,
)
from rocketspark.remoting.server import Channel, Reply
from rocketspark.store.message_store import MessageStore

# RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: the groups that consume a topic (mqadmin queryMsgById).
QUERY_TOPIC_CONSUME_BY_WHO = 300


class AdminProcessor:
    """The requests of ``mqadmin`` and of clients' offset look-ups."""

    def __init__(self, store: MessageStore, broker: BrokerIdentity):
        self.store = store
        self.broker = broker

    def max_offset(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        header = h.GetMaxOffsetRequestHeader.from_ext_fields(request.ext_fields)
        offset = queue_offset(self.store.max_offset, header.topic, header.queue_id)
        return ok(request, h.GetMaxOffsetResponseHeader(offset=offset))

    def min_offset(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        header = h.GetMinOffsetRequestHeader.from_ext_fields(request.ext_fields)
        offset = queue_offset(self.store.min_offset, header.topic, header.queue_id)
        return ok(request, h.GetMinOffsetResponseHeader(offset=offset))

    def search_offset(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        header = h.SearchOffsetRequestHeader.from_ext_fields(request.ext_fields)

        def read(topic: str, queue_id: int) -> int:
            return self.store.offset_for_timestamp(topic, queue_id, header.timestamp)

        offset = queue_offset(read, header.topic, header.queue_id)
        return ok(request, h.SearchOffsetResponseHeader(offset=offset))

    def create_topic(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        header = h.CreateTopicRequestHeader.from_ext_fields(request.ext_fields)
        queues = max(header.read_queue_nums, header.write_queue_nums)
        try:
            self.store.create_topic(
                header.topic,
                queues,
                order=header.order,
                perm=header.perm,
                force=bool(header.force),
            )
        except RocketSparkError as e:
            return answer(request, ResponseCode.SYSTEM_ERROR, str(e))
        return ok(request)

    def create_group(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        try:
            config = loads_lenient(bytes(request.body or b"{}").decode("utf-8"))
            group = str(config["groupName"])
            self.store.groups.get_or_create(group)
        except (ValueError, KeyError, TypeError, RocketSparkError) as e:
            return answer(request, ResponseCode.SYSTEM_ERROR, f"bad subscription group: {e}")
        return ok(request)

    def runtime_info(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        """GET_BROKER_RUNTIME_INFO: the KVTable ``mqadmin clusterList`` prints."""
        import shutil

        usage = shutil.disk_usage(self.store.root)
        table = {
            "brokerActive": "true",
            "brokerVersion": str(int(MQ_VERSION)),
            "brokerVersionDesc": MQ_VERSION.name,
            "putTps": "0.0 0.0 0.0",
            "getTransferredTps": "0.0 0.0 0.0",
            "sendThreadPoolQueueSize": "0",
            "pullThreadPoolQueueSize": "0",
            "sendThreadPoolQueueHeadWaitTimeMills": "0",
            "pullThreadPoolQueueHeadWaitTimeMills": "0",
            "pageCacheLockTimeMills": "0",
            "earliestMessageTimeStamp": str(self._earliest_store_time()),
            "commitLogDiskRatio": f"{usage.used / usage.total if usage.total else 0:.4f}",
            "commitLogMinOffset": str(self.store.commit_log.min_offset),
            "commitLogMaxOffset": str(self.store.state.commit_pos),
            "timerReadBehind": "0",
            "timerOffsetBehind": "0",
            "timerCongestNum": "0",
            "timerEnqueueTps": "0.0",
            "timerDequeueTps": "0.0",
        }
        return ok(request, body=to_json({"table": table}))

    def _earliest_store_time(self) -> int:
        try:
            return self.store.commit_log.store_timestamp(self.store.commit_log.min_offset)
        except RocketSparkError:
            return self.store.clock()

    def topic_config(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        """GET_TOPIC_CONFIG: the topic's TopicConfig (no static-topic mapping)."""
        topic = request.ext_fields.get("topic", "")
        info = self.store.topics.info(topic)
        if info is None:
            return answer(
                request, ResponseCode.TOPIC_NOT_EXIST, f"No topic in this broker. topic: {topic}"
            )
        config = {
            "attributes": {},
            "order": info.order,
            "perm": info.perm,
            "readQueueNums": info.read_queue_nums,
            "topicFilterType": "SINGLE_TAG",
            "topicName": topic,
            "topicSysFlag": 0,
            "writeQueueNums": info.write_queue_nums,
        }
        return ok(request, body=to_json(config))

    def topic_stats(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        """GET_TOPIC_STATS_INFO: each queue's min and max offset (``mqadmin topicStatus``)."""
        header = h.GetTopicStatsInfoRequestHeader.from_ext_fields(request.ext_fields)
        info = self.store.topics.info(header.topic)
        if info is None:
            return answer(request, ResponseCode.TOPIC_NOT_EXIST, f"topic[{header.topic}] not exist")
        entries = {}
        for q in range(info.read_queue_nums):
            entries[(header.topic, q)] = {
                "lastUpdateTimestamp": 0,
                "maxOffset": self.store.max_offset(header.topic, q),
                "minOffset": self.store.min_offset(header.topic, q),
            }
        return ok(request, body=_mq_table(self.broker.name, "offsetTable", entries))

    def consume_stats(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        """GET_CONSUME_STATS: a group's committed offsets against each queue's max offset
        (``mqadmin consumerProgress``)."""
        header = h.GetConsumeStatsRequestHeader.from_ext_fields(request.ext_fields)
        committed = self.store.offsets.offsets_of_group(header.consumer_group)
        entries = {}
        for (topic, queue_id), offset in sorted(committed.items()):
            if header.topic and topic != header.topic:
                continue
            try:
                end = self.store.max_offset(topic, queue_id)
            except (UnknownTopicError, OffsetOutOfRangeError):
                continue
            entries[(topic, queue_id)] = {
                "brokerOffset": end,
                "consumerOffset": offset,
                "lastTimestamp": 0,
                "pullOffset": offset,
            }
        return ok(request, body=_mq_table(self.broker.name, "offsetTable", entries, tps=True))

    def consumed_by(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        """QUERY_TOPIC_CONSUME_BY_WHO: the groups with offsets of the topic, or consuming it."""
        topic = request.ext_fields.get("topic", "")
        groups = {
            g
            for g in self.store.offsets.groups()
            if any(t == topic for t, _ in self.store.offsets.offsets_of_group(g))
        }
        return ok(request, body=to_json({"groupList": sorted(groups)}))

    def view_message(self, request: RemotingCommand, channel: Channel) -> RemotingCommand | Reply:
        """VIEW_MESSAGE_BY_ID: the record at a CommitLog offset, as stored."""
        header = h.ViewMessageRequestHeader.from_ext_fields(request.ext_fields)
        try:
            msg = self.store.get_message(header.offset)
            view = self.store.record_view(header.offset, msg.store_size)
        except RocketSparkError as e:
            return answer(
                request,
                ResponseCode.SYSTEM_ERROR,
                f"can not find message by the offset, {header.offset}: {e}",
            )
        return Reply(ok(request), [view])

    def query_message(self, request: RemotingCommand, channel: Channel) -> RemotingCommand | Reply:
        """QUERY_MESSAGE: the records of a topic indexed under a key (or a UNIQ_KEY)."""
        header = h.QueryMessageRequestHeader.from_ext_fields(request.ext_fields)
        try:
            found = self.store.query_by_key(
                header.topic,
                header.key,
                begin_ms=header.begin_timestamp,
                end_ms=header.end_timestamp,
                max_num=max(1, header.max_num),
            )
            views = [self.store.record_view(m.commitlog_offset, m.store_size) for m in found]
        except UnknownTopicError:
            found, views = [], []
        response_header = h.QueryMessageResponseHeader(
            index_last_update_timestamp=0, index_last_update_phyoffset=0
        )
        if not found:
            return answer(
                request,
                ResponseCode.QUERY_NOT_FOUND,
                "can not find message, maybe time range not correct",
                response_header,
            )
        return Reply(ok(request, response_header), views)


def _mq_table(
    broker: str,
    name: str,
    entries: dict[tuple[str, int], dict[str, int]],
    *,
    tps: bool = False,
) -> bytes:
    """A fastjson map keyed by MessageQueue (RocketMQ's TopicStatsTable, ConsumeStats):
    fastjson writes each key as a JSON object, which its parser reads back."""
    items = ",".join(
        to_json({"brokerName": broker, "queueId": q, "topic": t}).decode()
        + ":"
        + to_json(value).decode()
        for (t, q), value in entries.items()
    )
    extra = '"consumeTps":0.0,' if tps else ""
    return f'{{{extra}"{name}":{{{items}}}}}'.encode()

"""Consumer offsets (RocketMQ's ``ConsumerManageProcessor``): QUERY_CONSUMER_OFFSET and
UPDATE_CONSUMER_OFFSET over the store's committed offsets."""

from __future__ import annotations

from rocketspark.errors import OffsetOutOfRangeError, RocketSparkError, UnknownTopicError
from rocketspark.remoting import headers as h
from rocketspark.remoting.codes import ResponseCode
from rocketspark.remoting.command import RemotingCommand
from rocketspark.remoting.processors.common import answer, ok, queue_offset
from rocketspark.remoting.server import Channel
from rocketspark.store.message_store import MessageStore


class ConsumerOffsetProcessor:
    """A group's committed offset of a queue, read and written."""

    def __init__(self, store: MessageStore):
        self.store = store

    def query_consumer_offset(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        header = h.QueryConsumerOffsetRequestHeader.from_ext_fields(request.ext_fields)
        try:
            offset = self.store.committed_offset(
                header.consumer_group, header.topic, header.queue_id
            )
        except (UnknownTopicError, OffsetOutOfRangeError):
            offset = None
        if offset is not None and offset >= 0:
            return ok(request, h.QueryConsumerOffsetResponseHeader(offset=offset))
        if header.set_zero_if_not_found is False:
            return answer(
                request,
                ResponseCode.QUERY_NOT_FOUND,
                "Not found, do not set to zero, maybe this group boot first",
            )
        # A group that never committed starts at 0 while the queue still holds its first
        # message (RocketMQ: min offset 0 and that message in memory).
        lo = queue_offset(self.store.min_offset, header.topic, header.queue_id)
        hi = queue_offset(self.store.max_offset, header.topic, header.queue_id)
        if lo <= 0 < hi:
            return ok(request, h.QueryConsumerOffsetResponseHeader(offset=0))
        return answer(
            request,
            ResponseCode.QUERY_NOT_FOUND,
            "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first",
        )

    def update_consumer_offset(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        header = h.UpdateConsumerOffsetRequestHeader.from_ext_fields(request.ext_fields)
        try:
            self.store.commit_offset(
                header.consumer_group, header.topic, header.queue_id, header.commit_offset
            )
        except UnknownTopicError as e:
            return answer(request, ResponseCode.TOPIC_NOT_EXIST, str(e))
        except (OffsetOutOfRangeError, RocketSparkError) as e:
            return answer(request, ResponseCode.SYSTEM_ERROR, str(e))
        return ok(request)

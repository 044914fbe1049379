"""Pulls (RocketMQ's ``PullMessageProcessor``): CommitLog bytes answered from the mapped
segments; a pull that finds nothing and may be suspended is parked in the
:class:`~rocketspark.remoting.processors.pull_hold.PullHoldService`."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from rocketspark.errors import (
    ConfigError,
    CorruptRecordError,
    OffsetOutOfRangeError,
    RocketSparkError,
    UnknownTopicError,
)
from rocketspark.message.model import RETRY_GROUP_TOPIC_PREFIX
from rocketspark.message.names import SubscriptionExpression
from rocketspark.message.results import PullStatus
from rocketspark.remoting import headers as h
from rocketspark.remoting.codes import (
    MQ_VERSION,
    LanguageCode,
    PullSysFlag,
    ResponseCode,
    RpcFlag,
    SerializeType,
)
from rocketspark.remoting.command import MAX_FRAME_SIZE, PREFIX, RemotingCommand
from rocketspark.remoting.processors.clients import ClientRegistry
from rocketspark.remoting.processors.common import MASTER_ID, answer, ok
from rocketspark.remoting.processors.pull_hold import PullHoldService
from rocketspark.remoting.server import Channel, Reply, WorkQueue
from rocketspark.store.message_store import MessageStore

log = logging.getLogger(__name__)

# A pull answers at most this much (RocketMQ: maxTransferCountOnMessageInMemory 32 and
# maxTransferBytesOnMessageInMemory 256 KiB; a client asking more gets more here, up to
# what a frame carries with room to spare).
MAX_PULL_MESSAGES = 1024
MAX_PULL_BYTES = 4 * 1024 * 1024

_COMMIT_OFFSET = int(PullSysFlag.COMMIT_OFFSET)
_SUSPEND = int(PullSysFlag.SUSPEND)
_JSON = SerializeType.JSON
# The JSON header of a found pull's answer, as RemotingCommand.encode writes the response
# ok() makes (tests/serve/test_processors.py checks they agree): only the offsets and the
# opaque change from pull to pull, so it is formatted, not built and encoded.
_FOUND_JSON = (
    f'{{"code":{int(ResponseCode.SUCCESS)},"extFields":{{"suggestWhichBrokerId":"{MASTER_ID}",'
    '"nextBeginOffset":"%d","minOffset":"%d","maxOffset":"%d"},'
    f'"flag":{int(RpcFlag.RESPONSE)},"language":"{LanguageCode.PYTHON.name}","opaque":%d,'
    f'"serializeTypeCurrentRPC":"{SerializeType.JSON.name}","version":{int(MQ_VERSION)}}}'
)


class PullProcessor:
    """PULL_MESSAGE and LITE_PULL_MESSAGE; held pulls run again on ``queue`` when woken."""

    def __init__(self, store: MessageStore, clients: ClientRegistry):
        self.store = store
        self.clients = clients
        self.holds = PullHoldService(store, self._pull_again)
        self.queue: WorkQueue | None = None

    def pull(
        self, request: RemotingCommand, channel: Channel, *, may_suspend: bool = True
    ) -> RemotingCommand | Reply | None:
        # Hot path: every pull. The header's fields are read straight from ext_fields
        # (PullMessageRequestHeader.from_ext_fields parses them all, and is the fallback
        # that names what is missing or malformed).
        (
            topic,
            queue_id,
            offset,
            max_msg_nums,
            sys_flag,
            commit_offset,
            suspend_timeout_millis,
            subscription,
            expression_type,
            max_msg_bytes,
            consumer_group,
        ) = _request_fields(request.ext_fields)
        store = self.store
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX) and not store.has_topic(topic):
            self.clients.ensure_group(topic[len(RETRY_GROUP_TOPIC_PREFIX) :])
        # The consumer's offset rides on the pull, committed once: not when a held pull
        # runs again (may_suspend False), by when the group may have committed further
        # (RocketMQ commits only when the broker may suspend).
        commit = may_suspend and sys_flag & _COMMIT_OFFSET and commit_offset >= 0
        # An unknown topic is answered TOPIC_NOT_EXIST before anything else. The read
        # looks the topic up anyway (UnknownTopicError): before it, only when something
        # comes first.
        if (commit or expression_type not in (None, "TAG")) and not store.has_topic(topic):
            return _no_topic(request, topic)
        if expression_type not in (None, "TAG"):
            return answer(
                request,
                ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                f"expression type {expression_type} is not supported (TAG only)",
            )
        try:
            sub = SubscriptionExpression(subscription or "*")
        except ConfigError:
            if not store.has_topic(topic):
                return _no_topic(request, topic)
            raise
        codes = None if sub.matches_all else sub.codes
        max_msgs = max(1, min(max_msg_nums, MAX_PULL_MESSAGES))
        max_bytes = min(max_msg_bytes or MAX_PULL_BYTES, MAX_PULL_BYTES)
        # A commit that fails does not fail the pull: the consumer commits again with
        # its next one.
        if commit:
            try:
                store.commit_offset(consumer_group, topic, queue_id, commit_offset, deferred=True)
            except RocketSparkError as e:
                log.warning(
                    "pull of %s/%d: the offset %d of group %s riding on it was not committed: %s",
                    topic,
                    queue_id,
                    commit_offset,
                    consumer_group,
                    e,
                )
        try:
            try:
                read = store.read_raw(topic, queue_id, offset, max_msgs, max_bytes, codes)
            except CorruptRecordError:
                # Retention deleted the segment of these entries between the read of the
                # queue's min offset and of the segment: read again, which sees the new
                # min offset and answers PULL_OFFSET_MOVED (damage raises again).
                read = store.read_raw(topic, queue_id, offset, max_msgs, max_bytes, codes)
        except UnknownTopicError:
            return _no_topic(request, topic)
        except OffsetOutOfRangeError as e:
            return answer(
                request, ResponseCode.SYSTEM_ERROR, f"queueId[{queue_id}] is illegal: {e}"
            )
        status, next_offset = read.status, read.next_offset
        if status is PullStatus.FOUND and request.serialize_type is _JSON:
            head = (
                _FOUND_JSON % (next_offset, read.min_offset, read.max_offset, request.opaque)
            ).encode()
            length = PREFIX.size + len(head) + read.size
            if length <= MAX_FRAME_SIZE:  # else: the generic path answers the error
                return Reply(_FOUND, read.parts, PREFIX.pack(length - 4, len(head)) + head)
        if read.max_offset == 0 and status is PullStatus.OFFSET_ILLEGAL:
            status, next_offset = PullStatus.NO_NEW_MSG, 0  # NO_MESSAGE_IN_QUEUE
        response_header = h.PullMessageResponseHeader(
            suggest_which_broker_id=MASTER_ID,
            next_begin_offset=next_offset,
            min_offset=read.min_offset,
            max_offset=read.max_offset,
        )
        if status is PullStatus.FOUND:
            return Reply(ok(request, response_header), read.parts)
        if status is PullStatus.NO_NEW_MSG:
            suspend = sys_flag & _SUSPEND and suspend_timeout_millis > 0
            if may_suspend and suspend:
                self.holds.hold(request, channel, topic, queue_id, offset, suspend_timeout_millis)
                return None
            return answer(request, ResponseCode.PULL_NOT_FOUND, None, response_header)
        if status is PullStatus.NO_MATCHED_MSG:
            return answer(request, ResponseCode.PULL_RETRY_IMMEDIATELY, None, response_header)
        return answer(request, ResponseCode.PULL_OFFSET_MOVED, None, response_header)

    def _pull_again(self, request: RemotingCommand, channel: Channel) -> None:
        """Run a held pull again (its queue moved, or its time is up) and answer it."""

        def run() -> None:
            try:
                response = self.pull(request, channel, may_suspend=False)
            except Exception as e:
                log.exception("a held pull failed")
                response = answer(request, ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")
            if response is not None:
                channel.respond(request, response)

        queue = self.queue
        if queue is None or not queue.try_submit(run):
            run()


def _no_topic(request: RemotingCommand, topic: str) -> RemotingCommand:
    return answer(
        request, ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!"
    )


# What a Reply with a formatted head names (its command is not encoded).
_FOUND = RemotingCommand(ResponseCode.SUCCESS, flag=RpcFlag.RESPONSE)


def _request_fields(
    fields: Mapping[str, str],
) -> tuple[str, int, int, int, int, int, int, str | None, str | None, int | None, str]:
    """The fields of a PullMessageRequestHeader a pull uses: topic, queue id, queue offset,
    max messages, sys flag, commit offset, suspend timeout, subscription, expression type,
    max bytes, consumer group. Raises RemotingFrameError as
    ``PullMessageRequestHeader.from_ext_fields`` does."""
    try:
        max_msg_bytes = fields.get("maxMsgBytes")
        request_source = fields.get("requestSource")
        if request_source is not None:
            int(request_source)  # checked as the header's parse checks it
        int(fields["subVersion"])
        return (
            fields["topic"],
            int(fields["queueId"]),
            int(fields["queueOffset"]),
            int(fields["maxMsgNums"]),
            int(fields["sysFlag"]),
            int(fields["commitOffset"]),
            int(fields["suspendTimeoutMillis"]),
            fields.get("subscription"),
            fields.get("expressionType"),
            None if max_msg_bytes is None else int(max_msg_bytes),
            fields["consumerGroup"],
        )
    except (KeyError, ValueError):
        header = h.PullMessageRequestHeader.from_ext_fields(fields)  # raises, naming the field
        return (
            header.topic,
            header.queue_id,
            header.queue_offset,
            header.max_msg_nums,
            header.sys_flag,
            header.commit_offset,
            header.suspend_timeout_millis,
            header.subscription,
            header.expression_type,
            header.max_msg_bytes,
            header.consumer_group,
        )

"""Sends (RocketMQ's ``SendMessageProcessor``): single, V2 headers, batch, transaction
halves, and a consumer's send-back to ``%RETRY%group`` / ``%DLQ%group``."""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence

from rocketspark.errors import (
    DiskFullError,
    FlushTimeoutError,
    InvalidMessageError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    RemotingFrameError,
    RocketSparkError,
    StoreClosedError,
    TransactionError,
    UnknownTopicError,
)
from rocketspark.message.model import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
    RETRY_GROUP_TOPIC_PREFIX,
    Message,
    SysFlag,
    dlq_topic,
    transaction_type,
)
from rocketspark.message.properties import decode_properties
from rocketspark.message.record import decompress_body
from rocketspark.message.results import PutResult, PutStatus
from rocketspark.remoting import headers as h
from rocketspark.remoting.codes import RequestCode, ResponseCode
from rocketspark.remoting.command import RemotingCommand
from rocketspark.remoting.processors.common import answer, ok
from rocketspark.remoting.server import Channel
from rocketspark.store.message_store import MessageStore

# What a prepare sets itself: taken out of a sent half's properties (a prepare refuses
# them, and puts them last, where a commit drops them).
_PREPARE_SETS = frozenset(
    {
        PROPERTY_PRODUCER_GROUP,
        PROPERTY_TRANSACTION_ID,
        PROPERTY_TRANSACTION_PREPARED,
        PROPERTY_REAL_TOPIC,
        PROPERTY_REAL_QUEUE_ID,
    }
)
# SEND_BATCH_MESSAGE body, per message (MessageDecoder.encodeMessages): TOTALSIZE,
# MAGICCODE, BODYCRC, FLAG, BODYLEN; then BODY, PROPERTIESLENGTH:i16, PROPERTIES.
BATCH_HEAD = struct.Struct(">iiiii")
SHORT = struct.Struct(">h")
DLQ_QUEUES = 1  # a dead-letter topic's queues (RocketMQ: DLQ_NUMS_PER_GROUP)


def _put_code(results: Sequence[PutResult]) -> int:
    """SUCCESS, or FLUSH_DISK_TIMEOUT when a SYNC_FLUSH put was stored but its flush timed
    out (the store reports it in the results' status, as RocketMQ's PutMessageStatus):
    the answer keeps the header, as SendMessageProcessor's does, and the producer hears
    that the message may not be on disk."""
    if any(r.status is PutStatus.FLUSH_DISK_TIMEOUT for r in results):
        return ResponseCode.FLUSH_DISK_TIMEOUT
    return ResponseCode.SUCCESS


class SendProcessor:
    """SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE and CONSUMER_SEND_MSG_BACK."""

    def __init__(self, store: MessageStore):
        self.store = store

    def send(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        header: h.SendMessageRequestHeader
        if request.code == RequestCode.SEND_MESSAGE:
            header = h.SendMessageRequestHeader.from_ext_fields(request.ext_fields)
        else:
            header = h.SendMessageRequestHeaderV2.from_ext_fields(request.ext_fields)
        topic = header.topic
        if not self.store.has_topic(topic):
            return answer(
                request,
                ResponseCode.TOPIC_NOT_EXIST,
                f"topic[{topic}] not exist, apply first please!",
            )
        prepared = transaction_type(header.sys_flag) == SysFlag.TRANSACTION_PREPARED
        body = bytes(request.body or b"")
        try:
            if request.code == RequestCode.SEND_BATCH_MESSAGE or header.batch:
                messages = _batch_messages(header, body)
            else:
                messages = [_message(header, body, header.properties or "", header.flag)]
                if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                    messages = [self._retry_or_dead(header, messages[0])]
            messages = _clamp_delay(messages, self.store)
            if prepared:
                halves = self.store.prepare_batch(messages, producer_group=header.producer_group)
                first = halves[0]
                # The queue asked for, the half queue's offset (END_TRANSACTION's
                # tranStateTableOffset), the half's id: as SendMessageProcessor answers.
                return answer(
                    request,
                    _put_code(halves),
                    None,
                    h.SendMessageResponseHeader(
                        msg_id=first.msg_id,
                        queue_id=header.queue_id,
                        queue_offset=first.queue_offset,
                        transaction_id=first.uniq_key,
                    ),
                )
            # One message: put()'s single-record path (the columnar batch machinery costs
            # more than the record for one).
            results = (
                [self.store.put(messages[0])]
                if len(messages) == 1
                else self.store.put_batch(messages)
            )
        except UnknownTopicError as e:
            return answer(request, ResponseCode.TOPIC_NOT_EXIST, str(e))
        except (InvalidMessageError, MessageTooLargeError, RemotingFrameError) as e:
            return answer(request, ResponseCode.MESSAGE_ILLEGAL, str(e))
        except (OffsetOutOfRangeError, TransactionError) as e:  # a queue id it does not have
            return answer(request, ResponseCode.SYSTEM_ERROR, str(e))
        except FlushTimeoutError as e:
            return answer(request, ResponseCode.FLUSH_DISK_TIMEOUT, str(e))
        except (DiskFullError, StoreClosedError) as e:
            return answer(request, ResponseCode.SERVICE_NOT_AVAILABLE, str(e))
        first = results[0]
        return answer(
            request,
            _put_code(results),
            None,
            h.SendMessageResponseHeader(
                msg_id=",".join(r.msg_id for r in results) if len(results) > 1 else first.msg_id,
                queue_id=first.queue_id,
                queue_offset=first.queue_offset,
            ),
        )

    def _retry_or_dead(self, header: h.SendMessageRequestHeader, message: Message) -> Message:
        """A send to ``%RETRY%group`` reconsumed more than the group's retryMaxTimes (or the
        header's maxReconsumeTimes) goes to ``%DLQ%group`` now, undelayed: RocketMQ's
        SendMessageProcessor.handleRetryAndDLQ (a producer's send-back of a failed message)."""
        group = header.topic[len(RETRY_GROUP_TOPIC_PREFIX) :]
        most = header.max_reconsume_times
        if most is None:
            most = self.store.groups.retry_max_times(group)
        if (header.reconsume_times or 0) <= most:
            return message
        dead = dlq_topic(group)
        self.store.create_topic(dead, DLQ_QUEUES, if_absent=True)
        return dataclasses.replace(message, topic=dead, queue_id=0, delay_level=0)

    def send_back(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        """CONSUMER_SEND_MSG_BACK: a message the group failed to consume goes to its retry
        topic (after the delay of level 3 + its reconsume count) or, retried
        maxReconsumeTimes times, to its dead-letter topic (MessageStore.send_back)."""
        header = h.ConsumerSendMsgBackRequestHeader.from_ext_fields(request.ext_fields)
        try:
            msg = self.store.get_message(header.offset)
            self.store.send_back(
                header.group,
                msg,
                header.delay_level,
                max_reconsume_times=header.max_reconsume_times,
            )
        except OffsetOutOfRangeError as e:
            return answer(request, ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {e}")
        except RocketSparkError as e:
            return answer(request, ResponseCode.SYSTEM_ERROR, str(e))
        return ok(request)


def _message(
    header: h.SendMessageRequestHeader, body: bytes, properties: str, flag: int
) -> Message:
    """The Message a send carries, as the embedded API would be given it: TAGS, KEYS and
    DELAY taken out of the properties, the rest (UNIQ_KEY included) kept as they came."""
    props = decode_properties(properties.encode("utf-8")) if properties else {}
    if transaction_type(header.sys_flag) == SysFlag.TRANSACTION_PREPARED:
        for name in _PREPARE_SETS:
            props.pop(name, None)
    tags = props.pop("TAGS", None)
    keys = props.pop("KEYS", "")
    delay = props.pop(PROPERTY_DELAY_TIME_LEVEL, None)
    queue_id = header.queue_id if header.queue_id >= 0 else None
    return Message(
        header.topic,
        decompress_body(body, header.sys_flag),
        tags=tags or None,
        keys=tuple(k for k in keys.split(" ") if k),
        properties=props,
        flag=flag,
        delay_level=int(delay) if delay else 0,
        queue_id=queue_id,
        born_timestamp=header.born_timestamp,
        reconsume_times=header.reconsume_times or 0,
    )


def _clamp_delay(messages: list[Message], store: MessageStore) -> list[Message]:
    """Delay levels past the last one lowered to it, as the broker's
    transformDelayLevelMessage does (a consumer's retry after 16 tries asks for 19)."""
    if not any(m.delay_level for m in messages):
        return messages
    top = len(store.config.delay_levels_ms())
    return [dataclasses.replace(m, delay_level=top) if m.delay_level > top else m for m in messages]


def _batch_messages(header: h.SendMessageRequestHeader, body: bytes) -> list[Message]:
    """The messages of a SEND_BATCH_MESSAGE body; the batch's own properties are added
    to each (RocketMQ's MessageExtEncoder.encodeBatch does too)."""
    batch_props = header.properties or ""
    out = []
    pos, end = 0, len(body)
    try:
        while pos < end:
            total, _magic, _crc, flag, body_len = BATCH_HEAD.unpack_from(body, pos)
            at = pos + BATCH_HEAD.size
            msg_body = body[at : at + body_len]
            at += body_len
            (props_len,) = SHORT.unpack_from(body, at)
            at += SHORT.size
            props = body[at : at + props_len].decode("utf-8")
            at += props_len
            if total <= 0 or at - pos != total or len(msg_body) != body_len:
                raise RemotingFrameError(
                    f"batch message at {pos}: TOTALSIZE {total} disagrees with its fields"
                )
            if batch_props and props and not props.endswith("\x02"):
                props += "\x02"
            out.append(_message(header, msg_body, props + batch_props, flag))
            pos = at
    except (struct.error, UnicodeDecodeError) as e:
        raise RemotingFrameError(f"batch body is malformed at {pos}: {e}") from None
    if not out:
        raise RemotingFrameError("batch body holds no message")
    return out

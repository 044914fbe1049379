"""Sends (RocketMQ's ``SendMessageProcessor``): single, V2 headers, batch, transaction
halves, and a consumer's send-back to ``%RETRY%group`` / ``%DLQ%group``."""

from __future__ import annotations

import dataclasses
import logging
import re
import struct
from collections.abc import Sequence

import numpy as np

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
from rocketspark.message.columns import SerializedRows
from rocketspark.message.model import (
    INT32_MAX,
    INT64_MAX,
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
from rocketspark.message.results import PutResult, PutResults, PutStatus
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

log = logging.getLogger(__name__)


def _put_code(results: Sequence[PutResult]) -> int:
    """SUCCESS, or FLUSH_DISK_TIMEOUT when a SYNC_FLUSH put was stored but its flush timed
    out (the store reports it in the results' status, as RocketMQ's PutMessageStatus):
    the answer keeps the header, as SendMessageProcessor's does, and the producer hears
    that the message may not be on disk."""
    if isinstance(results, PutResults):  # one status for all, without a PutResult each
        timeout = results.status is PutStatus.FLUSH_DISK_TIMEOUT
    else:
        timeout = any(r.status is PutStatus.FLUSH_DISK_TIMEOUT for r in results)
    if timeout:
        return ResponseCode.FLUSH_DISK_TIMEOUT
    return ResponseCode.SUCCESS


def _sent(request: RemotingCommand, results: Sequence[PutResult]) -> RemotingCommand:
    """The answer to a stored send: the first message's queue and offset, every message's
    id (comma-separated, as SendMessageProcessor answers a batch)."""
    first = results[0]
    if isinstance(results, PutResults):
        msg_id = results.joined_msg_ids()
    else:
        msg_id = ",".join(r.msg_id for r in results) if len(results) > 1 else first.msg_id
    return answer(
        request,
        _put_code(results),
        None,
        h.SendMessageResponseHeader(
            msg_id=msg_id, queue_id=first.queue_id, queue_offset=first.queue_offset
        ),
    )


class SendProcessor:
    """SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE and CONSUMER_SEND_MSG_BACK."""

    def __init__(self, store: MessageStore):
        self.store = store
        self._warm_failed = False  # the last warm_ahead after a send raised

    def send_then_warm(self, request: RemotingCommand, channel: Channel) -> None:
        """:meth:`send`, answered at once; then the CommitLog's next pages are prefilled
        (``MessageStore.warm_ahead``) while the client reads the answer and sends its
        next request, where a put would otherwise prefill them before its answer."""
        channel.respond(request, self.send(request, channel))
        try:
            self.store.warm_ahead()
        except Exception:
            # Only a head start: the next put prefills what it needs, and meets (and
            # answers) the same fault if it lasts. Not raised: the request is answered
            # already (the server would answer it again). Logged once until it works.
            if not self._warm_failed:
                log.warning("prefilling the CommitLog after a send failed", exc_info=True)
            self._warm_failed = True
        else:
            self._warm_failed = False

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
                rows = _batch_rows(header, body)
                if rows is not None and len(rows.bodies) > 1:
                    # the columnar path: no Message per row (a Java producer's batches)
                    results = self.store.put_serialized(
                        topic, rows, queue_id=header.queue_id if header.queue_id >= 0 else None
                    )
                    return _sent(request, results)
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
        return _sent(request, results)

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


# A property item of a batch message: NAME (not empty) \x01 VALUE \x02.
_ITEM = re.compile(rb"([^\x01\x02]+)\x01([^\x01\x02]*)\x02")
_TAGS, _KEYS, _UNIQ = b"TAGS", b"KEYS", b"UNIQ_KEY"
# What a row's properties may not name for _batch_rows (the Message path handles them:
# DELAY moves the message to SCHEDULE_TOPIC_XXXX).
_SLOW_NAMES = (PROPERTY_DELAY_TIME_LEVEL.encode(),)


def _items(raw: bytes) -> list[tuple[bytes, bytes]] | None:
    """The (name, value) items of a properties field, None unless it is exactly
    NAME\\x01VALUE\\x02 items with names not empty (a name twice: the caller's to see)."""
    pairs = _ITEM.findall(raw)
    m = len(pairs)
    if raw and (raw[-1] != 2 or raw.count(1) != m or raw.count(2) != m):
        # every separator inside an item and the last byte a \x02: nothing outside them
        return None
    return pairs


def _batch_rows(header: h.SendMessageRequestHeader, body: bytes) -> SerializedRows | None:
    """The messages of a SEND_BATCH_MESSAGE body as columns, with the properties each
    stores (its own with the batch's values, then the batch's that it does not name, as
    ``_batch_messages`` gives them), without a Message per row.

    None for a batch the Message path must take (which then reports what is wrong):
    a malformed body or property, a name given twice, DELAY (or TAGS, KEYS in the
    batch's properties), a compressed or transactional batch, header values a Message
    refuses, a message without a body.
    """
    # Hot path: every batch send of Java's producer; one loop turn per message.
    if header.sys_flag & SysFlag.COMPRESSED or transaction_type(header.sys_flag):
        return None
    born, times = header.born_timestamp, header.reconsume_times or 0
    if not (0 <= born <= INT64_MAX and 0 <= times <= INT32_MAX):
        return None
    batch_raw = (header.properties or "").encode("utf-8")
    batch_items = _items(batch_raw)
    if batch_items is None:
        return None
    # the batch's items: added to the rows that do not name them, their values put in
    # place of a row's (Java's producer gives a batch a UNIQ_KEY of its own: it is
    # every row's then)
    extra = [(k, v, b"%s\x01%s\x02" % (k, v)) for k, v in batch_items]
    named_batch = dict(batch_items)
    if len(named_batch) != len(batch_items) or any(
        k in named_batch for k in (_TAGS, _KEYS, *_SLOW_NAMES)
    ):
        return None
    batch_uniq = named_batch.get(_UNIQ)
    every_uniq = batch_uniq.decode("utf-8") if batch_uniq is not None else None
    same = _same_shape(body, extra, every_uniq, born, times)
    if same is not None:
        return same
    bodies: list[bytes] = []
    props: list[bytes] = []
    tags: list[str | None] = []
    keys: list[str | None] = []
    uniq: list[str | None] = []
    flags: list[int] = []
    unpack = BATCH_HEAD.unpack_from
    head_size = BATCH_HEAD.size
    findall = _ITEM.findall
    slow = _SLOW_NAMES
    pos, end = 0, len(body)
    try:
        while pos < end:
            total, _magic, _crc, flag, body_len = unpack(body, pos)
            at = pos + head_size
            msg_body = body[at : at + body_len]
            at += body_len
            props_len = int.from_bytes(body[at : at + 2], "big", signed=True)
            at += 2
            raw = body[at : at + props_len]
            at += props_len
            if (
                total <= 0
                or at - pos != total
                or not body_len
                or len(msg_body) != body_len
                or len(raw) != props_len
                or props_len < 0
            ):
                return None
            pos = at
            tag = key = None
            own = every_uniq
            if raw:
                if raw[-1] != 2:  # the Message path reads the last item without it too
                    raw += b"\x02"
                pairs = findall(raw)
                m = len(pairs)
                if raw.count(1) != m or raw.count(2) != m:
                    return None
                named = dict(pairs)
                if len(named) != m or not raw.isascii() and not _utf8(raw):
                    return None
                for name in slow:
                    if name in named:
                        return None
                t = named.get(_TAGS)
                k = named.get(_KEYS)
                if t is not None or k is not None:
                    if k is None and pairs[-1][0] == _TAGS:  # TAGS last: cut it off
                        raw = raw[: len(raw) - len(t) - 6]  # type: ignore[arg-type]
                    else:
                        raw = b"".join(
                            [
                                a + b"\x01" + b + b"\x02"
                                for a, b in pairs
                                if a != _TAGS and a != _KEYS
                            ]
                        )
                    if t:
                        tag = t.decode("utf-8")
                    if k:
                        key = " ".join([s for s in k.decode("utf-8").split(" ") if s]) or None
                if own is None:
                    u = named.get(_UNIQ)
                    if u is not None:
                        own = u.decode("utf-8")
                for name, value, item in extra:
                    given = named.get(name)
                    if given is None:
                        raw += item
                    elif given != value:  # the batch's value in the row's item's place
                        raw = (b"\x02" + raw).replace(
                            b"\x02%s\x01%s\x02" % (name, given), b"\x02" + item, 1
                        )[1:]
            elif extra:
                raw = batch_raw
            bodies.append(msg_body)
            props.append(raw)
            tags.append(tag)
            keys.append(key)
            uniq.append(own)
            flags.append(flag)
    except struct.error:
        return None
    if not bodies:
        return None
    return SerializedRows(
        bodies,
        props,
        tags if any(tags) else None,
        keys if any(keys) else None,
        uniq if uniq.count(None) != len(uniq) else None,
        flags if any(flags) else None,
        born,
        times,
    )


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


SAME_SHAPE_MIN = 16  # messages from which a batch of one shape is decoded with numpy


def _same_shape(
    body: bytes,
    extra: list[tuple[bytes, bytes, bytes]],
    every_uniq: str | None,
    born: int,
    times: int,
) -> SerializedRows | None:
    """``_batch_rows`` of a batch whose messages have one shape (a Java producer's of
    like messages): one size, one body length, the same property names at the same
    places, ASCII values without separators. None for any other batch.

    The messages as rows of a byte matrix: the first one's properties are parsed,
    the others checked against its layout, and every row's stored properties are the
    same column slices (with the batch's items) of the matrix.
    """
    # Hot path: numpy over the whole batch, Python per property item, not per message.
    size = len(body)
    head = BATCH_HEAD.size
    if size < head:
        return None
    total, _magic, _crc, _flag, body_len = BATCH_HEAD.unpack_from(body, 0)
    if body_len <= 0 or total <= head + body_len + 2 or size % total:
        return None
    n = size // total
    at = head + body_len  # PROPERTIESLENGTH
    if n < SAME_SHAPE_MIN or int.from_bytes(body[at : at + 2], "big") != total - at - 2:
        return None
    raw = body[at + 2 : total]
    pairs = _items(raw)
    if not pairs or len(dict(pairs)) != len(pairs) or not raw.isascii():
        return None
    matrix = np.frombuffer(body, dtype=np.uint8).reshape(n, total)
    # the layout: TOTALSIZE, BODYLEN, PROPERTIESLENGTH, the names and separators are
    # the first message's; the values hold no separator and are ASCII
    fixed = [np.arange(0, 4), np.arange(16, 20), np.arange(at, at + 2)]
    values = []
    spans: dict[bytes, tuple[int, int, int]] = {}  # name -> item start, value start, end
    pos = at + 2
    for name, value in pairs:
        if name in _SLOW_NAMES:
            return None
        start, v = pos, pos + len(name) + 1
        fixed.append(np.arange(start, v))
        fixed.append(np.arange(v + len(value), v + len(value) + 1))
        values.append(np.arange(v, v + len(value)))
        spans[name] = (start, v, v + len(value) + 1)
        pos = v + len(value) + 1
    cols = np.concatenate(fixed)
    if not (matrix[:, cols] == matrix[0, cols]).all():
        return None
    if values:
        vals = matrix[:, np.concatenate(values)]
        if ((vals == 1) | (vals == 2) | (vals >= 0x80)).any():
            return None
    flags = matrix[:, 12:16].copy().view(">i4").ravel()

    def same(start: int, end: int) -> bool:
        """Whether every row's bytes [start, end) are the first row's."""
        return bool((matrix[:, start:end] == matrix[0, start:end]).all())

    def column(start: int, end: int) -> list[str]:
        """Each row's bytes [start, end) as text (one str n times when they are alike)."""
        width = end - start
        if same(start, end):
            return [matrix[0, start:end].tobytes().decode("ascii")] * n
        text = matrix[:, start:end].tobytes().decode("ascii")
        return [text[i : i + width] for i in range(0, n * width, width)]

    tags: list[str | None] | None = None
    keys: list[str | None] | None = None
    uniq: list[str | None] | None = None
    if _TAGS in spans:
        _, v, end = spans[_TAGS]
        if end - 1 > v:
            tags = list(column(v, end - 1))
    if _KEYS in spans:
        _, v, end = spans[_KEYS]
        if end - 1 > v:
            keys = [" ".join([s for s in k.split(" ") if s]) or None for k in column(v, end - 1)]
    if every_uniq is not None:
        uniq = [every_uniq] * n
    elif _UNIQ in spans:
        _, v, end = spans[_UNIQ]
        uniq = list(column(v, end - 1))
    # the stored properties: the items but TAGS and KEYS, a batch's value in place of
    # a row's, then the batch's items the rows do not name
    # (one bytes object n times when every row's are alike: a Java producer's batch of
    # like messages, whose UNIQ_KEY is the batch's; the store then encodes it once)
    pieces: list[np.ndarray] = []
    alike = True
    batch = {name: item for name, _value, item in extra}
    for name, _value in pairs:
        if name == _TAGS or name == _KEYS:
            continue
        item = batch.pop(name, None)
        start, _v, end = spans[name]
        if item is None:
            pieces.append(matrix[:, start:end])
            alike = alike and same(start, end)
        else:
            pieces.append(np.broadcast_to(np.frombuffer(item, dtype=np.uint8), (n, len(item))))
    for item in batch.values():
        pieces.append(np.broadcast_to(np.frombuffer(item, dtype=np.uint8), (n, len(item))))
    width = sum(p.shape[1] for p in pieces)
    if not width:
        props = [b""] * n
    elif alike:
        props = [b"".join(p[0].tobytes() for p in pieces)] * n
    else:
        stored = np.concatenate(pieces, axis=1).tobytes()
        props = [stored[i : i + width] for i in range(0, n * width, width)]
    return SerializedRows(
        [body[s : s + body_len] for s in range(head, size, total)],
        props,
        tags,
        keys if keys is None or any(keys) else None,
        uniq,
        flags.tolist() if flags.any() else None,
        born,
        times,
    )

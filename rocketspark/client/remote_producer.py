"""The producer side of the cluster backend: sends, transactional halves and check-backs.

What RocketMQ's ``DefaultMQProducerImpl`` does for a Java producer:

- **Sends** go to the master of each row's queue, in SEND_BATCH_MESSAGE batches
  per queue (at most ``BATCH_BYTES`` / ``BATCH_MESSAGES``). Rows without a queue go
  round-robin from a random start (as RocketMQ's producer), avoiding brokers that
  failed or were slow (latency fault tolerance); a ``queueId`` picks the n-th
  writable queue of the topic across brokers in name order, and a sharding key
  hashes over the same list (``SelectMessageQueueByHash``). A batch that fails, or
  cannot start (broker unreachable, no master during a failover), is retried on
  another broker's queue (unless one of its rows' queue was chosen) up to
  ``SEND_RETRIES`` times. Bodies are sent uncompressed. The requests of one
  put go out side by side, one in flight per queue (a queue stores its rows in
  the order given) and ``SEND_WINDOW`` at most, and their answers are read in
  turn; ``put_columns`` of plain rows (body, tags, keys) is encoded from the
  columns, without a ``Message`` per row.
- **Half messages** go one request each (a broker takes no batch of halves),
  ``HALF_WINDOW`` in flight; END_TRANSACTION answers are awaited.
- **Check-backs** (CHECK_TRANSACTION_STATE) are answered with the answer
  registered for the half's producer group, guarded against committing a half
  twice (see :meth:`Producer.on_check`).
"""

from __future__ import annotations

import logging
import random
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from rocketspark.client.api import Answer, MessageQueue, PutResult
from rocketspark.client.remote_halves import EndedTransactions, TransactionKey, transaction_key
from rocketspark.errors import (
    ConfigError,
    CorruptRecordError,
    RemotingError,
    UnknownTopicError,
)
from rocketspark.message import arrow
from rocketspark.message.columns import Columns, only_empty
from rocketspark.message.java_hash import java_string_hash
from rocketspark.message.model import (
    NAME_VALUE_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    Message,
    MessageExt,
    SysFlag,
    TransactionState,
    answer_state,
    check_extra_properties,
)
from rocketspark.message.names import validate_group
from rocketspark.message.properties import encode_properties, properties_text
from rocketspark.message.record import UniqueIdGenerator, decode_record, parse_message_id
from rocketspark.message.results import Halves, PutStatus, offset_runs
from rocketspark.remoting import headers as hdr
from rocketspark.remoting.client import RemotingClient, SendAnswer
from rocketspark.remoting.codes import RequestCode
from rocketspark.remoting.command import RemotingCommand
from rocketspark.remoting.connection import AwaitedResponse, Connection, check_response
from rocketspark.remoting.route import MASTER_ID, TopicRoute

__all__ = ["PRODUCER_GROUP", "Producer"]

log = logging.getLogger(__name__)

PRODUCER_GROUP = "rocketspark-producer"
BATCH_BYTES = 1024 * 1024  # encoded messages per SEND_BATCH_MESSAGE at most
BATCH_MESSAGES = 1024
SEND_RETRIES = 2  # RocketMQ's retryTimesWhenSendFailed
HALF_WINDOW = 64  # half messages in flight per prepare (each is a request of its own)
# END_TRANSACTION requests in flight: enough to keep a broker's end-transaction threads (8
# and 2 a core) busy, no more. A request's timeout runs while it waits behind the others
# in the broker's queue, and an END_TRANSACTION that timed out cannot be sent again (a
# second COMMIT stores the message twice): with 256 in flight, a broker slowed down by a
# loaded machine timed commits out (a Spark exactly-once write failed at load 17).
END_WINDOW = 64
ID_BLOCK = 32768  # UNIQ_KEYs under one millisecond stamp at most
# What encode_properties writes for a TAGS and a UNIQ_KEY property (the common row's).
_TAGS_ITEM = f"{PROPERTY_TAGS}{NAME_VALUE_SEPARATOR}"
_UNIQ_KEY_ITEM = f"{PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX}{NAME_VALUE_SEPARATOR}"
_UNIQ_ITEM = f"{PROPERTY_SEPARATOR}{_UNIQ_KEY_ITEM}"
_KEYS_ITEM = f"{PROPERTY_KEYS}{NAME_VALUE_SEPARATOR}"
SEND_WINDOW = 8  # send requests of one put in flight at most (one per queue)
# A started send: its future, the broker's address and the start time; or None, the
# error and 0 when it could not start (see Producer._start).
_Started = tuple[Future[RemotingCommand] | AwaitedResponse | None, Any, float]
# A half message in flight: its row, queue, response to come, broker address, start time.
_HalfSent = tuple[int, MessageQueue, Future[RemotingCommand] | AwaitedResponse, str, float]
# A request's rows, its answer, and each row's message id and CommitLog offset.
_Sent = tuple[list[int], SendAnswer, list[str], list[int]]


class Producer:
    """Sends for one :class:`RemoteClient` (``address``: its NameServers, for messages)."""

    def __init__(self, remoting: RemotingClient, address: str, clock: Callable[[], int]):
        self.remoting = remoting
        self.address = address
        self.now_ms = clock
        self._ids = UniqueIdGenerator()
        self._ids_lock = threading.Lock()
        self._round_robin: dict[str, int] = {}
        self._queues: dict[str, tuple[TopicRoute, list[MessageQueue]]] = {}
        self.written: dict[MessageQueue, int] = {}  # one past the last offset sent, per queue
        self._answers: dict[str, Answer] = {}  # producer group ("": any) -> check-back answer
        self._answers_lock = threading.Lock()
        self.ended = EndedTransactions()  # every END of this client claims its transaction here
        remoting.register_handler(RequestCode.CHECK_TRANSACTION_STATE, self.on_check)

    def register_answer(self, producer_group: str | None, answer: Answer) -> None:
        """Answer the check-backs of ``producer_group``'s halves (None: of every group)."""
        with self._answers_lock:
            self._answers[producer_group or ""] = answer
        if producer_group is not None:
            self.remoting.register_producer(producer_group)

    def unique_ids(self, n: int, now: int) -> list[str]:
        """``n`` UNIQ_KEYs. An id's counter has 16 bits under a millisecond stamp, so a
        block of more than ``ID_BLOCK`` takes the next millisecond's stamp: no id of a
        put repeats (a cluster's check-backs find a half's committed copy by it)."""
        if n <= ID_BLOCK:
            return self._ids.next_ids(n, now)  # one block: reserved under the ids' own lock
        out: list[str] = []
        with self._ids_lock:
            for k, a in enumerate(range(0, n, ID_BLOCK)):
                out += self._ids.next_ids(min(ID_BLOCK, n - a), now + k)
        return out

    def write_queues(self, topic: str) -> list[MessageQueue]:
        queues = self.remoting.route(topic).write_queues()
        if not queues:
            raise UnknownTopicError(
                f"topic {topic!r} has no writable queue on the cluster ({self.address})"
            )
        return queues

    def select_queue(
        self, msg: Message, queues: list[MessageQueue], avoid: str | None
    ) -> MessageQueue:
        if msg.queue_id is not None:
            if not 0 <= msg.queue_id < len(queues):
                raise ConfigError(
                    f"queueId {msg.queue_id} of topic {msg.topic!r}: the topic has "
                    f"{len(queues)} writable queues on the cluster"
                )
            return queues[msg.queue_id]
        if msg.sharding_key is not None:
            return queues[java_string_hash(msg.sharding_key) % len(queues)]
        n = self._round_robin.get(msg.topic)
        if n is None:
            n = random.randrange(len(queues))  # RocketMQ's producer starts at random
        self._round_robin[msg.topic] = n + 1
        return self.remoting.faults.select(queues, n, avoid)

    def queues_of(self, topic: str) -> list[MessageQueue]:
        """``write_queues`` of the topic's current route, kept while the route is the same."""
        route = self.remoting.route(topic)
        cached = self._queues.get(topic)
        if cached is not None and cached[0] is route:
            return cached[1]
        queues = self.write_queues(topic)
        self._queues[topic] = (route, queues)
        return queues

    def send(self, messages: list[Message]) -> list[PutResult]:
        """Send ``messages`` in batches of one queue; results in input order."""
        if not messages:
            return []
        if len(messages) == 1:
            return [self._send_one(messages[0])]
        now = self.now_ms()
        uniq = self.unique_ids(len(messages), now)
        queues: dict[str, list[MessageQueue]] = {}
        groups: dict[MessageQueue, list[int]] = {}
        encoded: list[bytes] = []
        props_of: list[bytes] = []
        for i, m in enumerate(messages):
            qs = queues.get(m.topic)
            if qs is None:
                qs = queues[m.topic] = self.queues_of(m.topic)
            if m.properties or m.keys or m.delay_level:
                props = m.all_properties()
                props.setdefault(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, uniq[i])
                uniq[i] = props[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX]
                raw = encode_properties(props)
            elif m.tags:  # the same bytes, without the dict (the common row)
                raw = f"{_TAGS_ITEM}{m.tags}{_UNIQ_ITEM}{uniq[i]}{PROPERTY_SEPARATOR}".encode()
            else:
                raw = f"{_UNIQ_KEY_ITEM}{uniq[i]}{PROPERTY_SEPARATOR}".encode()
            props_of.append(raw)
            encoded.append(_encode_for_batch(m.body, m.flag, raw))
            groups.setdefault(self.select_queue(m, qs, None), []).append(i)
        lanes: list[list[_Request]] = []
        for mq, rows in groups.items():
            lane: list[_Request] = []
            for chunk in _chunks(rows, encoded):
                if len(chunk) == 1 or any(messages[i].delay_level for i in chunk):
                    for i in chunk:  # a row on its own: SEND_MESSAGE_V2
                        m = messages[i]
                        lane.append(
                            _Request(
                                mq,
                                [i],
                                m.body,
                                props_of[i].decode("utf-8"),
                                m.born_timestamp or now,
                                m.flag,
                                m.reconsume_times or None,
                                False,
                                m.queue_id is not None,
                            )
                        )
                else:
                    pinned = any(messages[i].queue_id is not None for i in chunk)
                    data = b"".join([encoded[i] for i in chunk])
                    lane.append(_Request.of_batch(mq, chunk, data, now, pinned))
            lanes.append(lane)
        results: list[PutResult | None] = [None] * len(messages)
        for rows, answer, ids, phys in self._send_lanes(lanes):
            mq = answer.mq
            for k, (i, msg_id, phy) in enumerate(zip(rows, ids, phys, strict=True)):
                results[i] = PutResult(
                    PutStatus.PUT_OK,
                    mq.topic,
                    mq.queue_id,
                    answer.queue_offset + k,
                    phy,
                    msg_id,
                    uniq[i],
                    now,
                    0,
                    mq.broker,
                )
        return results  # type: ignore[return-value]

    def _send_one(self, m: Message) -> PutResult:
        """``send([m])``: one SEND_MESSAGE_V2, without the batch machinery."""
        # Hot path: every single send.
        now = self.now_ms()
        uniq = self._ids.next_ids(1, now)[0]
        qs = self.queues_of(m.topic)
        if m.properties or m.keys or m.delay_level:
            props = m.all_properties()
            uniq = props.setdefault(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, uniq)
            text = properties_text(props)
        elif m.tags:  # the same text, without the dict (the common message)
            text = f"{_TAGS_ITEM}{m.tags}{_UNIQ_ITEM}{uniq}{PROPERTY_SEPARATOR}"
        else:
            text = f"{_UNIQ_KEY_ITEM}{uniq}{PROPERTY_SEPARATOR}"
        mq = self.select_queue(m, qs, None)
        request = _Request(
            mq,
            [0],
            m.body,
            text,
            m.born_timestamp or now,
            m.flag,
            m.reconsume_times or None,
            False,
            m.queue_id is not None,
        )
        _, answer, ids, phys = self._answered(
            request, self._finish(request, self._start(request, mq, awaited=True))
        )
        return PutResult(
            PutStatus.PUT_OK,
            m.topic,
            answer.mq.queue_id,
            answer.queue_offset,
            phys[0],
            ids[0],
            uniq,
            now,
            0,
            answer.mq.broker,
        )

    def send_columns(self, cols: Columns) -> Sequence[PutResult]:
        """Send a columnar put: rows that differ only in body, tags and keys (one topic,
        no properties, queue ids or sharding keys) are encoded from the columns; any
        other put goes through :class:`Message` (which reports a bad row)."""
        plan = _plain_columns(cols)
        if plan is None:
            return self.send(cols.messages())
        topic, tag_items, key_items = plan
        bodies: list[bytes] = cols.bodies  # type: ignore[assignment]
        n = len(bodies)
        qs = self.queues_of(topic)
        now = self.now_ms()
        # Queue selection as select_queue's, row by row: round-robin from the topic's
        # counter over the queues faults.select picks for each start.
        first = self._round_robin.get(topic)
        if first is None:
            first = random.randrange(len(qs))
        self._round_robin[topic] = first + n
        select = self.remoting.faults.select
        table = [qs.index(select(qs, k, None)) for k in range(len(qs))]
        which = np.asarray(table, dtype=np.int64)[(first + np.arange(n)) % len(qs)]
        uniq = self.unique_ids(n, now)
        encoded: list[bytes] = [b""] * n
        alike: str | None = None  # the TAGS and KEYS items of every row, when alike
        if (tag_items is None or tag_items.count(tag_items[0]) == n) and (
            key_items is None or key_items.count("") == n
        ):
            alike = tag_items[0] if tag_items is not None else ""

        def lanes() -> Iterator[list[_Request]]:
            # A queue's rows are encoded when its requests are about to go out, so the
            # brokers store one queue's while the next is encoded.
            # Hot path: one lean loop per row, locals bound, no Message per row.
            pack = _BATCH_HEAD.pack
            uniq_item, end = _UNIQ_KEY_ITEM, PROPERTY_SEPARATOR
            for q in sorted(set(table)):
                rows = np.flatnonzero(which == q).tolist()
                if not rows:
                    continue
                mq = qs[q]
                matrix = None
                if alike is not None:  # every row's properties but its UNIQ_KEY alike
                    matrix = _entries_matrix(
                        [bodies[i] for i in rows], alike, [uniq[i] for i in rows]
                    )
                if matrix is not None:
                    yield _matrix_lane(mq, rows, matrix, bodies, now)
                    continue
                for i in rows:
                    body = bodies[i]
                    head = ""
                    if tag_items is not None:
                        head = tag_items[i]
                    if key_items is not None:
                        head += key_items[i]
                    props = f"{head}{uniq_item}{uniq[i]}{end}".encode()
                    size = len(props)  # _encode_for_batch's entry, inlined
                    encoded[i] = b"".join(
                        (
                            pack(22 + len(body) + size, 0, len(body)),
                            body,
                            size.to_bytes(2, "big"),
                            props,
                        )
                    )
                lane = []
                for chunk in _chunks(rows, encoded):
                    if len(chunk) == 1:
                        i = chunk[0]
                        body = bodies[i]
                        lane.append(
                            _Request(
                                mq,
                                chunk,
                                body,
                                # the row's properties: its encoded form after BODY and PROPLEN
                                encoded[i][22 + len(body) :].decode("utf-8"),
                                now,
                                0,
                                None,
                                False,
                                False,
                            )
                        )
                    else:
                        data = b"".join([encoded[i] for i in chunk])
                        lane.append(_Request.of_batch(mq, chunk, data, now, False))
                yield lane

        return SentResults(topic, uniq, now, self._send_lanes(lanes()))

    def _send_lanes(self, lanes: Iterable[list[_Request]]) -> list[_Sent]:
        """Send each lane's requests in order, one in flight per lane (a queue's messages
        are stored in the order given), lanes side by side, ``SEND_WINDOW`` in flight;
        return each request's rows, answer, message ids and CommitLog offsets. A lane is
        taken from ``lanes`` when there is room for it.

        After a failure (of a request, or of making a lane) no request is started; those
        in flight are awaited (their rows are written, see ``written``) and the first
        failure is raised, with notes naming the later ones and the rows the brokers
        stored (see :func:`_failed_send`).
        """
        sent: list[_Sent] = []
        waiting = (deque(lane) for lane in lanes if lane)
        inflight: deque[tuple[deque[_Request], _Request, _Started]] = deque()
        errors: list[Exception] = []
        try:
            while len(inflight) < SEND_WINDOW:
                try:
                    lane = next(waiting, None)
                except Exception as e:  # the requests in flight are awaited first
                    errors.append(e)
                    break
                if lane is None:
                    break
                request = lane.popleft()
                inflight.append((lane, request, self._start(request, request.mq)))
            while inflight:
                lane, request, started = inflight.popleft()
                try:
                    sent.append(self._answered(request, self._finish(request, started)))
                    if errors:
                        continue
                    if not lane:
                        lane = next(waiting, None)
                        if lane is None:
                            continue
                except Exception as e:  # the others in flight are awaited first
                    errors.append(e)
                    continue
                request = lane.popleft()
                inflight.append((lane, request, self._start(request, request.mq)))
        finally:
            for _, _, (future, _, _) in inflight:  # (only when interrupted)
                if future is not None:
                    future.cancel()
        if errors:
            raise _failed_send(errors, sent)
        return sent

    def _answered(self, request: _Request, answer: SendAnswer) -> _Sent:
        """A request's rows, answer, message ids and CommitLog offsets; what it wrote is
        remembered (``written``)."""
        ids = answer.offset_msg_id.split(",")
        if len(ids) != len(request.rows):
            raise CorruptRecordError(
                f"the broker at {answer.broker_addr} answered {len(ids)} message "
                f"ids for a batch of {len(request.rows)} messages"
            )
        phys = _commitlog_offsets(ids)
        end = answer.queue_offset + len(request.rows)
        if self.written.get(answer.mq, 0) < end:
            self.written[answer.mq] = end
        return request.rows, answer, ids, phys

    def _start(self, request: _Request, mq: MessageQueue, awaited: bool = False) -> _Started:
        """Start ``request`` to ``mq``: its future, broker address and start time, or (None,
        the error, 0) when it could not start (the broker unreachable, no master, the route
        not refreshed...): :meth:`_finish` raises that error or retries the request.
        ``awaited``: :meth:`_finish` reads the answer next, on this thread."""
        try:
            return self.remoting.send_async(
                mq,
                request.body,
                producer_group=PRODUCER_GROUP,
                properties=request.properties,
                born_timestamp=request.born,
                flag=request.flag,
                batch=request.batch,
                reconsume_times=request.reconsume,
                awaited=awaited,
            )
        except Exception as e:  # raised by _finish, after the requests in flight
            return None, e, 0.0

    def _finish(self, request: _Request, started: _Started) -> SendAnswer:
        """The answer of a started request; a failed one is sent again to another broker's
        queue (unless its queue was chosen), up to ``SEND_RETRIES`` times."""
        mq = request.mq
        attempt = 0
        while True:
            future, addr, at = started
            try:
                if future is None:
                    raise addr
                return self.remoting.send_answer(mq, future, addr, at)
            except RemotingError as e:  # unreachable, timed out, busy, no master: retriable
                attempt += 1
                if request.pinned or not e.retriable or attempt > SEND_RETRIES:
                    raise
                qs = self.write_queues(mq.topic)
                mq = self.remoting.faults.select(qs, random.randrange(len(qs)), mq.broker)
                started = self._start(request, mq, awaited=True)

    def prepare(
        self,
        messages: list[Message],
        producer_group: str,
        extra: Mapping[str, str] | None,
    ) -> list[PutResult]:
        """Send half messages, ``HALF_WINDOW`` in flight (a broker takes no batch of halves).

        The client is registered as a producer of ``producer_group`` first, so the
        brokers' check-backs for these halves can reach it.
        """
        validate_group(producer_group)
        check_extra_properties(extra)
        if not messages:
            return []
        self.remoting.register_producer(producer_group)
        now = self.now_ms()
        uniq = self.unique_ids(len(messages), now)
        queues: dict[str, list[MessageQueue]] = {}
        results: list[PutResult | None] = [None] * len(messages)
        inflight: deque[_HalfSent] = deque()
        try:
            for i, m in enumerate(messages):
                qs = queues.get(m.topic)
                if qs is None:
                    qs = queues[m.topic] = self.write_queues(m.topic)
                props = m.all_properties()
                props.setdefault(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, uniq[i])
                uniq[i] = props[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX]
                if extra:
                    props.update(extra)
                props[PROPERTY_TRANSACTION_PREPARED] = "true"
                props[PROPERTY_PRODUCER_GROUP] = producer_group
                mq = self.select_queue(m, qs, None)
                future, addr, started = self.remoting.send_async(
                    mq,
                    m.body,
                    producer_group=producer_group,
                    properties=properties_text(props),
                    born_timestamp=m.born_timestamp or now,
                    sys_flag=int(SysFlag.TRANSACTION_PREPARED),
                    flag=m.flag,
                )
                inflight.append((i, mq, future, addr, started))
                if len(inflight) >= HALF_WINDOW:
                    self._half_result(inflight.popleft(), messages, uniq, now, results)
            while inflight:
                self._half_result(inflight.popleft(), messages, uniq, now, results)
        finally:
            for _, _, f, _, _ in inflight:
                f.cancel()
        return results  # type: ignore[return-value]

    def _half_result(
        self,
        sent: _HalfSent,
        messages: list[Message],
        uniq: list[str],
        now: int,
        results: list[PutResult | None],
    ) -> None:
        i, mq, future, addr, started = sent
        answer = self.remoting.send_answer(mq, future, addr, started)
        _, phy = parse_message_id(answer.offset_msg_id)
        results[i] = PutResult(
            PutStatus.PUT_OK,
            messages[i].topic,
            answer.mq.queue_id,
            answer.queue_offset,  # the half's offset in RMQ_SYS_TRANS_HALF_TOPIC
            phy,
            answer.offset_msg_id,
            uniq[i],
            now,
            0,
            mq.broker,
        )

    def halves(self, results: Sequence[PutResult], *, producer_group: str) -> list[Halves]:
        """The halves of prepare results, one :class:`Halves` per broker (in result order)."""
        by_broker: dict[str, list[PutResult]] = {}
        for r in results:
            by_broker.setdefault(r.broker, []).append(r)
        out = []
        for broker, rs in by_broker.items():
            offsets = [r.queue_offset for r in rs]
            out.append(
                Halves(
                    broker,
                    producer_group,
                    offset_runs(offsets),
                    tuple(r.commitlog_offset for r in rs),
                    tuple(r.uniq_key for r in rs),
                    tuple(r.topic for r in rs),
                )
            )
        return out

    def end_halves(self, halves: Iterable[Halves], *, commit: bool, guard: bool = False) -> int:
        """END_TRANSACTION for every half, ``END_WINDOW`` in flight, each answer awaited.

        RocketMQ's producer sends END_TRANSACTION one-way; here every answer is
        awaited, so when this returns each half is ended (or an error is raised,
        naming the first that failed) and a check-back that comes later finds
        the transaction ended (see :meth:`on_check`). A half whose transaction
        (broker, UNIQ_KEY) this client is ending or ended lately is left as it is
        (see ``EndedTransactions``). With ``guard``, a COMMIT whose committed copy
        exists already (a commit cut short by a crash, then finished) is a ROLLBACK
        (see :meth:`end_flag`). Returns how many halves were ended as asked.
        """
        errors: list[BaseException] = []
        done = 0
        for h in halves:
            addr = self.remoting.broker_master(h.broker)
            conn = self.remoting.connection(addr)
            topics = h.topics or ("",) * len(h)
            offsets = h.offsets().tolist()
            keys = [
                transaction_key(h.broker, uniq, offset)
                for uniq, offset in zip(h.transaction_ids, offsets, strict=True)
            ]
            rows = list(
                zip(offsets, h.commitlog_offsets, h.transaction_ids, topics, keys, strict=True)
            )
            free = self._claim(keys, commit)
            mine = [row for row, ok in zip(rows, free, strict=True) if ok]
            claimed = {row[4] for row in mine}  # released below unless settled
            inflight: deque[tuple[Future[RemotingCommand], TransactionKey, bool]] = deque()
            try:
                for offset, phy, uniq, topic, key in mine:
                    flag = self.end_flag(addr, topic, uniq, commit=commit, guard=guard)
                    request = self.remoting.command(
                        RequestCode.END_TRANSACTION,
                        hdr.EndTransactionRequestHeader(
                            topic=topic or None,
                            producer_group=h.producer_group,
                            tran_state_table_offset=offset,
                            commit_log_offset=phy,
                            commit_or_rollback=int(flag),
                            from_transaction_check=False,
                            msg_id=uniq,
                            transaction_id=uniq,
                            broker_name=h.broker,
                        ),
                    )
                    future = conn.invoke_async(request, self.remoting.timeout)
                    inflight.append((future, key, flag == _end_state(commit)))
                    if len(inflight) >= END_WINDOW:
                        done += self._end_answered(
                            inflight.popleft(), addr, errors, claimed, commit
                        )
                while inflight:
                    done += self._end_answered(inflight.popleft(), addr, errors, claimed, commit)
            finally:
                self.ended.release(claimed)
        if errors:
            raise errors[0]
        return done

    def _claim(self, keys: list[TransactionKey], commit: bool) -> list[bool]:
        """Claim transactions for end_halves, waiting (up to the request timeout) for
        those a check-back is ending now: its answer may be a ROLLBACK, after which a
        COMMIT is still due."""
        free = self.ended.claim(keys, commit=commit)
        deadline = time.monotonic() + self.remoting.timeout
        while not all(free) and time.monotonic() < deadline:
            busy = [
                i for i, ok in enumerate(free) if not ok and self.ended.state(keys[i]) == "ending"
            ]
            if not busy:
                break
            time.sleep(0.05)
            again = self.ended.claim([keys[i] for i in busy], commit=commit)
            for i, ok in zip(busy, again, strict=True):
                free[i] = ok
        return free

    def _end_answered(
        self,
        sent: tuple[Future[RemotingCommand], TransactionKey, bool],
        address: str,
        errors: list[BaseException],
        claimed: set[TransactionKey],
        committed: bool,
    ) -> int:
        """Await an END's answer and settle its transaction (1: ended as asked)."""
        future, key, as_asked = sent
        try:
            check_response(
                future.result(), request_code=RequestCode.END_TRANSACTION, address=address
            )
        except RemotingError as e:
            errors.append(e)
            return 0  # (released with the rest of the claims)
        self.ended.settle((key,), committed=committed)
        claimed.discard(key)
        return int(as_asked)

    def end_flag(self, address: str, topic: str, uniq: str, *, commit: bool, guard: bool) -> int:
        """The END_TRANSACTION flag of a half this client claimed: COMMIT or ROLLBACK as
        asked, except that with ``guard`` a COMMIT whose committed copy exists already on
        the broker at ``address`` is a ROLLBACK, which only closes the half (a broker
        commits a half again on a second COMMIT: a duplicate)."""
        if commit and guard and self.committed_copy(address, topic, uniq):
            return SysFlag.TRANSACTION_ROLLBACK
        return _end_state(commit)

    def committed_copy(self, address: str, topic: str, uniq: str) -> bool:
        """Whether the broker at ``address`` holds the committed copy of half ``uniq``
        (a message of ``topic`` with that UNIQ_KEY: QUERY_MESSAGE by unique key)."""
        if not topic:
            return False
        body = self.remoting.query_message(
            address, topic, uniq, 1, 0, self.now_ms() + 60_000, unique=True
        )
        if body is None:
            return False
        starts, _ = arrow.record_positions(body, what=f"QUERY_MESSAGE answer of {address}")
        for s in starts.tolist():
            m = decode_record(body, s, verify_crc=False)
            if (
                m.topic == topic
                and m.uniq_key == uniq
                and not m.sys_flag & SysFlag.TRANSACTION_PREPARED
            ):
                return True
        return False

    def on_check(self, request: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        """CHECK_TRANSACTION_STATE: answer with END_TRANSACTION (one-way) on the same
        connection, as RocketMQ's producer does; no answer registered: no reply.

        The broker asks about a new copy of the half (a new half-queue offset), also of
        one whose END it has not read yet (its op queue lags under load). A transaction
        this client ended lately is rolled back, which only closes the copy, without
        asking; one it is ending now gets no reply (the broker asks again). Any other
        is claimed, asked about, and ended as ``end_flag`` says (guarded).
        """
        head = hdr.CheckTransactionStateRequestHeader.from_ext_fields(request.ext_fields)
        msg = decode_record(request.body or b"", 0, verify_crc=False)
        group = msg.properties.get(PROPERTY_PRODUCER_GROUP, "")
        with self._answers_lock:
            answer = self._answers.get(group) or self._answers.get("")
        if answer is None:
            return None
        uniq = msg.uniq_key or head.msg_id or ""
        broker = head.broker_name or self._broker_name(conn.address)
        key = transaction_key(broker, uniq, head.tran_state_table_offset)
        (free,) = self.ended.claim((key,))
        try:
            if free:
                flag, commit = self._check_flag(
                    answer, msg, head.commit_log_offset, conn.address, uniq
                )
            elif self.ended.state(key) == "ended":
                flag, commit = SysFlag.TRANSACTION_ROLLBACK, False
            else:
                return None  # being ended by another thread of this client
            conn.invoke_oneway(
                self.remoting.command(
                    RequestCode.END_TRANSACTION,
                    hdr.EndTransactionRequestHeader(
                        topic=msg.topic,
                        producer_group=group,
                        tran_state_table_offset=head.tran_state_table_offset,
                        commit_log_offset=head.commit_log_offset,
                        commit_or_rollback=int(flag),
                        from_transaction_check=True,
                        msg_id=uniq,
                        transaction_id=head.transaction_id,
                        broker_name=head.broker_name,
                    ),
                )
            )
            if free and flag:
                self.ended.settle((key,), committed=commit)
                free = False
        finally:
            if free:  # not ended: UNKNOWN, or the END was not sent
                self.ended.release((key,))
        return None

    def _check_flag(
        self, answer: Answer, half: MessageExt, commit_log_offset: int, address: str, uniq: str
    ) -> tuple[int, bool]:
        """The END flag of a check-back's half, and whether its answer was COMMIT: as
        ``answer`` says (0: UNKNOWN, also when the answer raises: the broker asks again),
        guarded by :meth:`end_flag`."""
        try:
            state = answer_state(answer(half))
        except Exception:  # noqa: BLE001 - the broker asks again; the half stays open
            log.exception("answering the check-back of half %s failed", commit_log_offset)
            return 0, False
        if state is TransactionState.UNKNOWN:
            return 0, False
        commit = state is TransactionState.COMMIT
        return self.end_flag(address, half.topic, uniq, commit=commit, guard=True), commit

    def _broker_name(self, address: str) -> str:
        """The name of the broker whose master is at ``address`` (a check-back that does
        not name its broker); the address itself if no route or cluster info names it."""
        for route in self.remoting.cached_routes():
            for name, master in route.masters().items():
                if master == address:
                    return name
        for name, ids in self.remoting.brokers().items():
            if ids.get(MASTER_ID) == address:
                return name
        return address


@dataclass(slots=True)
class _Request:
    """One SEND_MESSAGE_V2 (a row) or SEND_BATCH_MESSAGE (rows of one queue)."""

    mq: MessageQueue
    rows: list[int]
    body: bytes
    properties: str  # a row's ("" for a batch: each message carries its own)
    born: int
    flag: int
    reconsume: int | None
    batch: bool
    pinned: bool  # a row's queue was chosen: no retry on another queue

    @classmethod
    def of_batch(
        cls, mq: MessageQueue, rows: list[int], data: bytes, now: int, pinned: bool
    ) -> _Request:
        """A SEND_BATCH_MESSAGE of ``rows``, their entries back to back in ``data``."""
        return cls(mq, rows, data, "", now, 0, None, True, pinned)


def _plain_columns(
    cols: Columns,
) -> tuple[str, list[str] | None, list[str] | None] | None:
    """The topic and each row's TAGS and KEYS items of columns that ``send_columns``
    encodes itself: one topic, bodies of bytes, ASCII tags and keys, no properties,
    queue ids or sharding keys. None for any other (``Message`` checks those rows)."""
    bodies = cols.bodies
    n = len(bodies)
    if not n or bodies.__class__ is not list or cols.extra is not None:
        return None
    if not all(bodies) or not all(b.__class__ is bytes for b in bodies):
        return None
    topic = cols.topic
    if cols.topics is not None:
        topics = cols.topics
        if topics.__class__ is not list or topics.count(topics[0]) != n:
            return None
        if topics[0] is not None:
            topic = topics[0]
    if topic.__class__ is not str:
        return None
    for col in (cols.queue_ids, cols.sharding_keys):
        if col is not None and (col.__class__ is not list or col.count(None) != n):
            return None
    if cols.properties is not None and not only_empty(cols.properties, n, ({}, None, [], ())):
        return None
    tag_items = key_items = None
    text = ""  # every tag and key, checked at once
    if cols.tags is not None:
        if cols.tags.__class__ is not list:
            return None
        try:
            distinct = list(dict.fromkeys(cols.tags))
        except TypeError:  # unhashable: Message refuses it
            return None
        if not all(t is None or t.__class__ is str for t in distinct):
            return None
        text = "".join(t for t in distinct if t)
        items = {t: f"{_TAGS_ITEM}{t}{PROPERTY_SEPARATOR}" if t else "" for t in distinct}
        tag_items = list(map(items.__getitem__, cols.tags))
    if cols.keys is not None:
        if cols.keys.__class__ is not list:
            return None
        key_items = [""] * n
        joined = []
        for i, k in enumerate(cols.keys):
            if not k:
                if k is None or k.__class__ is str or k.__class__ is list or k.__class__ is tuple:
                    continue
                return None
            if k.__class__ is str:
                if k[0] == " " or k[-1] == " " or "  " in k:  # Message drops empty keys
                    k = " ".join(filter(None, k.split(" ")))
                    if not k:
                        continue
            elif k.__class__ is list or k.__class__ is tuple:
                try:
                    j = " ".join(k)
                except TypeError:
                    return None
                if "" in k or j.count(" ") != len(k) - 1:  # an empty key, or one with a space
                    return None
                k = j
            else:
                return None
            joined.append(k)
            key_items[i] = f"{_KEYS_ITEM}{k}{PROPERTY_SEPARATOR}"
        text += "".join(joined)
    if not text.isascii() or NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
        return None
    return topic, tag_items, key_items


def _end_state(commit: bool) -> int:
    return SysFlag.TRANSACTION_COMMIT if commit else SysFlag.TRANSACTION_ROLLBACK


def _failed_send(errors: list[Exception], sent: list[_Sent]) -> Exception:
    """The first error of a put, with notes: each later error, and the rows the brokers
    stored (per queue, its offset ranges), so a caller can tell acknowledged rows from
    the others."""
    error = errors[0]
    for e in errors[1:]:
        _add_note(error, f"later failure of the same put: {type(e).__name__}: {e}")
    runs: dict[MessageQueue, list[list[int]]] = {}
    n = 0
    for rows, answer, _, _ in sorted(sent, key=lambda s: (str(s[1].mq), s[1].queue_offset)):
        a, b = answer.queue_offset, answer.queue_offset + len(rows)
        n += len(rows)
        ranges = runs.setdefault(answer.mq, [])
        if ranges and ranges[-1][1] == a:
            ranges[-1][1] = b
        else:
            ranges.append([a, b])
    stored = "; ".join(
        f"{mq.topic}/{mq.broker}/{mq.queue_id} offsets "
        + ", ".join(f"[{a}, {b})" for a, b in ranges)
        for mq, ranges in runs.items()
    )
    _add_note(error, f"stored by the brokers before the failure: {n} rows ({stored or 'none'})")
    return error


def _add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)`` (its ``__notes__`` under Python 3.10)."""
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:  # Python 3.10: the same attribute, which tracebacks do not show
        error.__notes__ = [*getattr(error, "__notes__", ()), note]


def _encode_for_batch(body: bytes, flag: int, props: bytes) -> bytes:
    """One message of a SEND_BATCH_MESSAGE body (``MessageDecoder.encodeMessage``):
    TOTALSIZE, MAGICCODE 0, BODYCRC 0, FLAG, BODY (length first), PROPERTIES (length first).
    (``send_columns`` inlines these bytes in its loop over rows.)"""
    return b"".join(
        (
            _BATCH_HEAD.pack(22 + len(body) + len(props), flag & 0xFFFFFFFF, len(body)),
            body,
            len(props).to_bytes(2, "big"),
            props,
        )
    )


def _entries_matrix(bodies: list[bytes], head: str, uniq: list[str]) -> np.ndarray | None:
    """The SEND_BATCH_MESSAGE entries of rows whose properties are ``head`` and their
    UNIQ_KEY (``_encode_for_batch``'s bytes, flag 0) as the rows of a byte matrix; None
    unless the bodies are of one length and the UNIQ_KEYs too."""
    # Hot path: numpy fills a template, no Python code per row.
    m, size = len(bodies), len(bodies[0])
    width = len(uniq[0])
    if len(set(map(len, bodies))) != 1 or len(set(map(len, uniq))) != 1:
        return None
    props = f"{head}{_UNIQ_KEY_ITEM}{'0' * width}{PROPERTY_SEPARATOR}".encode()
    template = _encode_for_batch(bytes(size), 0, props)
    out = np.tile(np.frombuffer(template, dtype=np.uint8), (m, 1))
    at = _BATCH_HEAD.size
    out[:, at : at + size] = np.frombuffer(b"".join(bodies), dtype=np.uint8).reshape(m, size)
    at = len(template) - 1 - width  # the UNIQ_KEY's value: before the last separator
    ids = "".join(uniq).encode("ascii")
    out[:, at : at + width] = np.frombuffer(ids, dtype=np.uint8).reshape(m, width)
    return out


def _matrix_lane(
    mq: MessageQueue, rows: list[int], matrix: np.ndarray, bodies: list[bytes], now: int
) -> list[_Request]:
    """The requests of a queue's rows whose entries are ``matrix``'s rows (as ``_chunks``
    cuts them: at most BATCH_MESSAGES and BATCH_BYTES a request)."""
    width = matrix.shape[1]
    step = min(BATCH_MESSAGES, max(1, BATCH_BYTES // width))
    lane = []
    for a in range(0, len(rows), step):
        chunk = rows[a : a + step]
        if len(chunk) == 1:
            body = bodies[chunk[0]]
            props = matrix[a, _BATCH_HEAD.size + len(body) + 2 :].tobytes().decode("utf-8")
            lane.append(_Request(mq, chunk, body, props, now, 0, None, False, False))
        else:
            data = matrix[a : a + step].tobytes()
            lane.append(_Request.of_batch(mq, chunk, data, now, False))
    return lane


def _chunks(rows: list[int], encoded: list[bytes]) -> Iterator[list[int]]:
    chunk: list[int] = []
    size = 0
    for i in rows:
        n = len(encoded[i])
        if chunk and (size + n > BATCH_BYTES or len(chunk) >= BATCH_MESSAGES):
            yield chunk
            chunk, size = [], 0
        chunk.append(i)
        size += n
    if chunk:
        yield chunk


class SentResults(Sequence[PutResult]):
    """The results of a columnar send: one PutResult per row, built when asked for.

    A sequence as the list of the other backends: ``len``, indexing, slices (lists),
    iteration, ``index``/``count``, ``+`` and ``==`` with a list of the same results."""

    __slots__ = ("_topic", "_uniq", "_now", "_sent", "_which", "_at")

    def __init__(self, topic: str, uniq: list[str], now: int, sent: list[_Sent]):
        self._topic, self._uniq, self._now, self._sent = topic, uniq, now, sent
        self._which = np.empty(len(uniq), dtype=np.int64)  # row -> its request in sent
        self._at = np.empty(len(uniq), dtype=np.int64)  # row -> its place in the request
        for r, (rows, _, _, _) in enumerate(sent):
            self._which[rows] = r
            self._at[rows] = np.arange(len(rows))

    def __len__(self) -> int:
        return len(self._uniq)

    def _one(self, i: int) -> PutResult:
        _, answer, ids, phys = self._sent[int(self._which[i])]
        k = int(self._at[i])
        return PutResult(
            PutStatus.PUT_OK,
            self._topic,
            answer.mq.queue_id,
            answer.queue_offset + k,
            phys[k],
            ids[k],
            self._uniq[i],
            self._now,
            0,
            answer.mq.broker,
        )

    @overload
    def __getitem__(self, i: int) -> PutResult: ...
    @overload
    def __getitem__(self, i: slice) -> list[PutResult]: ...
    def __getitem__(self, i: int | slice) -> PutResult | list[PutResult]:
        if isinstance(i, slice):
            return [self._one(j) for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"put result index {i} out of range for {len(self)} results")
        return self._one(i)

    def __iter__(self) -> Iterator[PutResult]:
        return (self._one(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        """Equal to a list, tuple or results of the same PutResults, in the same order."""
        if not isinstance(other, (list, tuple, SentResults)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # unhashable, as a list

    def __add__(self, other: Iterable[PutResult]) -> list[PutResult]:
        return list(self) + list(other)

    def __radd__(self, other: Iterable[PutResult]) -> list[PutResult]:
        return list(other) + list(self)

    def __repr__(self) -> str:
        return f"SentResults({len(self)} messages to {self._topic!r})"


def _commitlog_offsets(ids: list[str]) -> list[int]:
    """The CommitLog offset in each offset msgId of a batch's answer (``parse_message_id``'s,
    at once when the ids are all of one length and hexadecimal: the broker's answer)."""
    lengths = set(map(len, ids))
    if len(lengths) == 1 and lengths <= {32, 56}:
        text = "".join(ids)
        try:
            raw = bytes.fromhex(text)
        except ValueError:
            raw = b""
        if 2 * len(raw) == len(text):  # (fromhex skips whitespace)
            width = len(ids[0]) // 2
            if len(ids) == 1:  # a single send's
                return [int.from_bytes(raw[width - 8 :], "big", signed=True)]
            table = np.frombuffer(raw, dtype=np.uint8).reshape(len(ids), width)
            return np.ascontiguousarray(table[:, width - 8 :]).view(">i8").ravel().tolist()
    return [parse_message_id(msg_id)[1] for msg_id in ids]  # raises naming the bad one


_BATCH_HEAD = struct.Struct(">I8xII")  # TOTALSIZE, MAGICCODE and BODYCRC (0), FLAG, BODY length

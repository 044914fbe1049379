"""The remote backend: a :class:`Client` of a RocketMQ cluster, over the remoting protocol.

One :class:`RemoteClient` per process and reference (as the embedded backend
keeps one open store): its connections, routes and heartbeats are shared by
every task the process runs. What crosses a pickle is the :class:`ClientRef`
(the NameServer addresses, the settings, and the credentials, which its repr
leaves out).

How the Client's operations map to a cluster:

- **Queues** are ``MessageQueue(topic, brokerName, queueId)`` of every readable
  queue of the topic's route, brokers in name order: partitions span brokers.
- **Reads** pull the range ``[start, end)`` with several PULL_MESSAGE requests in
  flight at once on the broker's connection (offsets in a queue are contiguous,
  so the next request need not wait for the last answer), then turn the
  answers' records into Arrow batches with the embedded store's vectorised
  code (``message.arrow``): bodies are never decoded message by message.
  Tag expressions filter by hash code on the broker and by text here, as
  RocketMQ's consumer does.
- **Group offsets** are the broker's (QUERY_CONSUMER_OFFSET,
  UPDATE_CONSUMER_OFFSET): ``mqadmin consumerProgress`` and RocketMQ's
  dashboard show them.
- **Writes** go to the master of the chosen queue. Rows without a queue go
  round-robin from a random start (as RocketMQ's producer), avoiding brokers
  that failed or were slow (latency fault tolerance); a ``queueId`` picks
  the n-th writable queue of the topic across brokers in name order, and a
  sharding key hashes over the same list (RocketMQ's
  ``SelectMessageQueueByHash``). Messages of one queue go in batches
  (SEND_BATCH_MESSAGE) of at most ``BATCH_BYTES``; a batch that fails is
  retried on another broker's queue (unless its queue was chosen) up to
  ``SEND_RETRIES`` times. Bodies are sent uncompressed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import struct
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import pyarrow as pa

from rocketspark.client.api import Answer, ClientRef, MessageQueue, PutResult, TopicInfo
from rocketspark.client.remote_ledger import RemoteSinkLedger
from rocketspark.errors import (
    ConfigError,
    CorruptRecordError,
    OffsetOutOfRangeError,
    RemotingCommandError,
    RemotingConnectError,
    RemotingError,
    RemotingTimeoutError,
    UnknownTopicError,
)
from rocketspark.message import arrow
from rocketspark.message.byte_gather import gather_items
from rocketspark.message.columns import Columns
from rocketspark.message.java_hash import java_string_hash
from rocketspark.message.model import (
    BROKER_STAMPED_PROPERTIES,
    NAME_VALUE_SEPARATOR,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    Message,
    MessageExt,
    SysFlag,
    TransactionState,
    check_extra_properties,
    retry_topic,
    user_properties,
)
from rocketspark.message.names import SubscriptionExpression, validate_group, validate_topic
from rocketspark.message.properties import encode_properties, properties_text
from rocketspark.message.record import UniqueIdGenerator, decode_record, parse_message_id
from rocketspark.message.results import Halves, PullStatus, PutStatus, offset_runs
from rocketspark.remoting import headers as hdr
from rocketspark.remoting.acl import Credentials
from rocketspark.remoting.client import PullAnswer, RemotingClient, SendAnswer, parse_namesrv
from rocketspark.remoting.codes import RequestCode
from rocketspark.remoting.command import RemotingCommand
from rocketspark.remoting.connection import Connection, check_response
from rocketspark.remoting.route import PERM_READ, PERM_WRITE

__all__ = ["RemoteClient", "close_all", "connect"]

log = logging.getLogger(__name__)

_lock = threading.Lock()
_open: dict[ClientRef, RemoteClient] = {}
_pid = os.getpid()

# The settings a cluster reference takes (option → default); see ``datasource/options.py``.
DEFAULTS = {
    "timeoutMs": "10000",  # a request's answer
    "connectTimeoutMs": "3000",
    "pullBatchSize": "32",  # messages asked for per pull (a broker answers at most 32 from memory)
    "pullPipeline": "8",  # pulls in flight per queue being read
    "consumerGroup": "rocketspark-reader",  # the group pulls are made as (the broker's statistics)
}
BATCH_BYTES = 1024 * 1024  # encoded messages per SEND_BATCH_MESSAGE at most
BATCH_MESSAGES = 1024
SEND_RETRIES = 2  # RocketMQ's retryTimesWhenSendFailed
ARROW_BLOCK_BYTES = 8 * 1024 * 1024  # pulled record bytes turned into one Arrow batch at most
_MSG_HEADER = np.dtype([("total", ">i4"), ("magic", ">i4")])


def connect(ref: ClientRef) -> RemoteClient:
    """Return this process's client for ``ref`` (connected on first use)."""
    global _pid
    with _lock:
        if os.getpid() != _pid:  # a forked child must not share its parent's sockets
            _open.clear()
            _pid = os.getpid()
        client = _open.get(ref)
        if client is None or client.closed:
            client = RemoteClient(ref)
            _open[ref] = client
        return client


def close_all() -> None:
    """Close every cluster client of this process."""
    with _lock:
        clients = list(_open.values())
        _open.clear()
    for c in clients:
        c.close()


def _setting(ref: ClientRef, name: str) -> int:
    value = dict(ref.options).get(name, DEFAULTS[name])
    try:
        n = int(value)
    except ValueError:
        raise ConfigError(f"option {name}: {value!r} is not a whole number") from None
    if n <= 0:
        raise ConfigError(f"option {name}: must be positive, got {n}")
    return n


def resolve(
    namesrv: str,
    settings: Mapping[str, str],
    access_key: str | None,
    secret_key: str | None,
) -> ClientRef:
    """The reference to a cluster, its settings checked (ConfigError naming the option)."""
    addrs = parse_namesrv(namesrv)
    unknown = sorted(set(settings) - set(DEFAULTS))
    if unknown:
        raise ConfigError(
            f"unknown cluster setting {unknown[0]!r} (known: {', '.join(sorted(DEFAULTS))})"
        )
    ref = ClientRef("cluster", ";".join(addrs), tuple(sorted(settings.items())))
    for name in DEFAULTS:
        if name != "consumerGroup":
            _setting(ref, name)
    group = settings.get("consumerGroup")
    if group is not None:
        validate_group(group)
    try:
        creds = Credentials.from_options(access_key, secret_key)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if creds is None:
        return ref
    return ClientRef(ref.kind, ref.address, ref.options, (creds.access_key, creds.secret_key))


class RemoteClient:
    """A :class:`~rocketspark.client.api.Client` of a cluster named by its NameServers."""

    def __init__(self, ref: ClientRef):
        self.ref = ref
        options = dict(ref.options)
        self.pull_batch = _setting(ref, "pullBatchSize")
        self.pipeline = _setting(ref, "pullPipeline")
        self.group = options.get("consumerGroup", DEFAULTS["consumerGroup"])
        creds = ref.credentials
        self.remoting = RemotingClient(
            ref.address,
            credentials=Credentials(*creds) if creds else None,
            timeout=_setting(ref, "timeoutMs") / 1000.0,
            connect_timeout=_setting(ref, "connectTimeoutMs") / 1000.0,
        )
        self.closed = False
        self._ids = UniqueIdGenerator()
        self._ids_lock = threading.Lock()
        self._round_robin: dict[str, int] = {}
        self._answers: dict[str, Answer] = {}  # producer group ("": any) -> check-back answer
        self._answers_lock = threading.Lock()
        self._ledger: RemoteSinkLedger | None = None
        self._locks: dict[str, threading.Lock] = {}
        self._written: dict[MessageQueue, int] = {}  # one past the last offset sent, per queue
        self.remoting.register_handler(RequestCode.CHECK_TRANSACTION_STATE, self._on_check)

    def __repr__(self) -> str:
        return f"RemoteClient({self.where})"

    @property
    def where(self) -> str:
        return f"cluster {self.ref.address}"

    @property
    def auto_create_topics(self) -> bool:
        # A broker's autoCreateTopicEnable is not visible to clients, and a topic made
        # from TBW102 by a send gets the template's queues on one broker only: topics
        # are created on purpose (create_topic, the CLI, mqadmin updateTopic).
        return False

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    # -- topics and queues ---------------------------------------------------------------

    def topics(self) -> list[TopicInfo]:
        out = []
        for name in self.remoting.topic_list():
            try:
                out.append(self.topic(name))
            except UnknownTopicError:
                continue  # listed, but routed by no broker now
        return out

    def has_topic(self, name: str) -> bool:
        return self.remoting.has_topic(name)

    def topic(self, name: str) -> TopicInfo:
        route = self.remoting.route(name)
        perm = 0
        for q in route.queue_datas:
            perm |= q.perm
        return TopicInfo(
            name,
            sum(q.read_queues for q in route.queue_datas if q.perm & PERM_READ),
            sum(q.write_queues for q in route.queue_datas if q.perm & PERM_WRITE),
            perm,
            False,
        )

    def create_topic(self, name: str, *, queues: int) -> TopicInfo:
        """Create ``name`` with ``queues`` queues in all, spread over the cluster's masters
        in name order as evenly as they go (``queues`` 1: one queue on the first master;
        ``mqadmin updateTopic -c`` counts per master instead)."""
        validate_topic(name)
        if queues <= 0:
            raise ConfigError(f"topic {name!r}: queues must be positive, got {queues}")
        masters = sorted(n for n, ids in self.remoting.brokers().items() if 0 in ids)
        if not masters:
            raise ConfigError(f"{self.where} has no master broker to create {name!r} on")
        share, extra = divmod(queues, len(masters))
        counts = {m: share + (i < extra) for i, m in enumerate(masters)}
        self.remoting.create_topic(name, {m: n for m, n in counts.items() if n})
        return self.topic(name)

    def queues(self, topic: str) -> list[MessageQueue]:
        return self.remoting.route(topic).read_queues()

    # -- positions -----------------------------------------------------------------------

    def min_offset(self, mq: MessageQueue) -> int:
        return self.remoting.min_offset(mq)

    def max_offset(self, mq: MessageQueue) -> int:
        """The broker's max offset, at least one past what this client wrote to ``mq``.

        A broker answers a send before its ConsumeQueue has the message (dispatch
        runs behind the CommitLog): a client that reads what it wrote waits for
        that, up to ``READ_YOUR_WRITES_SECONDS``.
        """
        offset = self.remoting.max_offset(mq)
        wrote = self._written.get(mq, 0)
        deadline = time.monotonic() + READ_YOUR_WRITES_SECONDS
        while offset < wrote and time.monotonic() < deadline:
            time.sleep(0.01)
            offset = self.remoting.max_offset(mq)
        return offset

    def offset_for_timestamp(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return self.remoting.search_offset(mq, timestamp_ms)

    def committed_offset(self, group: str, mq: MessageQueue) -> int | None:
        return self.remoting.query_consumer_offset(group, mq)

    def commit_offsets(self, group: str, offsets: Mapping[MessageQueue, int]) -> None:
        validate_group(group)
        for mq, offset in offsets.items():
            self.remoting.update_consumer_offset(group, mq, offset)

    # -- reading -------------------------------------------------------------------------

    def read_batches(
        self,
        mq: MessageQueue,
        start: int,
        end: int,
        *,
        expression: str = "*",
        check_crc: bool | None = None,
    ) -> tuple[list[pa.RecordBatch], int]:
        """Pull ``[start, end)`` of ``mq`` with up to ``pullPipeline`` pulls in flight."""
        sub = SubscriptionExpression(expression)
        crc = True if check_crc is None else check_crc
        reader = _RangeReader(self, mq, start, end, sub)
        batches = [
            arrow.records_body_to_batch(
                block, topic=mq.topic, broker_name=mq.broker, queue_id=mq.queue_id, check_crc=crc
            )
            for block in reader.blocks()
        ]
        # Rows are the same on both backends: the properties every broker adds to
        # every message it stores (its cluster, region, trace switch) are left out.
        batches = [
            arrow.drop_properties(b, BROKER_STAMPED_PROPERTIES) for b in batches if b.num_rows
        ]
        if not sub.matches_all:
            batches = [arrow.filter_tags(b, sub.tags) for b in batches]
        return batches, reader.position

    def get_message(self, msg_id: str) -> MessageExt:
        """The message an offset msgId names: its broker's address and CommitLog offset."""
        host, offset = parse_message_id(msg_id)
        try:
            body = self.remoting.view_message(str(host), offset)
        except RemotingCommandError as e:
            raise OffsetOutOfRangeError(
                f"msgId {msg_id} names no message of {self.where}: the broker at {host} "
                f"has none at CommitLog offset {offset} ({e.remark})"
            ) from None
        return decode_record(body, 0, base_offset=offset)

    def message_id_at(self, commitlog_offset: int) -> str:
        raise ConfigError(
            f"a CommitLog offset ({commitlog_offset}) names no message on a cluster, whose "
            f"brokers each have a CommitLog: name failed rows by msgId"
        )

    def query_by_key(self, topic: str, key: str, *, max_num: int = 64) -> list[MessageExt]:
        route = self.remoting.route(topic)
        out: list[MessageExt] = []
        now = self.now_ms()
        for addr in route.masters().values():
            body = self.remoting.query_message(addr, topic, key, max_num, 0, now + 60_000)
            if body is None:
                continue
            starts, _ = arrow.record_positions(body, what=f"QUERY_MESSAGE answer of {addr}")
            out += [decode_record(body, int(s)) for s in starts]
        out = [m for m in out if m.topic == topic]
        out.sort(key=lambda m: m.store_timestamp, reverse=True)
        return out[:max_num]

    # -- writing -------------------------------------------------------------------------

    def put_batch(self, messages: Sequence[Message]) -> Sequence[PutResult]:
        return self._send(list(messages))

    def put_columns(self, bodies: Sequence[Any], **columns: Any) -> Sequence[PutResult]:
        return self._send(_columns(bodies, columns).messages())

    def _unique_ids(self, n: int, now: int) -> list[str]:
        """``n`` UNIQ_KEYs. An id's counter has 16 bits under a millisecond stamp, so a
        block of more than ``ID_BLOCK`` takes the next millisecond's stamp: no id of a
        put repeats (a cluster's check-backs find a half's committed copy by it)."""
        out: list[str] = []
        with self._ids_lock:
            for k, a in enumerate(range(0, n, ID_BLOCK)):
                out += self._ids.next_ids(min(ID_BLOCK, n - a), now + k)
        return out

    def _write_queues(self, topic: str) -> list[MessageQueue]:
        queues = self.remoting.route(topic).write_queues()
        if not queues:
            raise UnknownTopicError(
                f"topic {topic!r} has no writable queue on the cluster ({self.ref.address})"
            )
        return queues

    def _queue(self, msg: Message, queues: list[MessageQueue], avoid: str | None) -> MessageQueue:
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

    def _send(self, messages: list[Message]) -> list[PutResult]:
        """Send ``messages`` in batches of one queue; results in input order."""
        if not messages:
            return []
        now = self.now_ms()
        uniq = self._unique_ids(len(messages), now)
        queues: dict[str, list[MessageQueue]] = {}
        groups: dict[MessageQueue, list[int]] = {}
        encoded: list[bytes] = []
        props_of: list[bytes] = []
        for i, m in enumerate(messages):
            qs = queues.get(m.topic)
            if qs is None:
                qs = queues[m.topic] = self._write_queues(m.topic)
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
            encoded.append(_encode_for_batch(m, raw))
            groups.setdefault(self._queue(m, qs, None), []).append(i)
        results: list[PutResult | None] = [None] * len(messages)
        for mq, rows in groups.items():
            for chunk in _chunks(rows, encoded):
                self._send_chunk(mq, chunk, messages, encoded, props_of, uniq, now, results)
        return results  # type: ignore[return-value]

    def _send_chunk(
        self,
        mq: MessageQueue,
        rows: list[int],
        messages: list[Message],
        encoded: list[bytes],
        props_of: list[bytes],
        uniq: list[str],
        now: int,
        results: list[PutResult | None],
    ) -> None:
        pinned = all(messages[i].queue_id is not None for i in rows)
        single = len(rows) == 1 or any(messages[i].delay_level for i in rows)
        attempt = 0
        while True:
            try:
                if single and len(rows) > 1:
                    for i in rows:
                        self._send_chunk(mq, [i], messages, encoded, props_of, uniq, now, results)
                    return
                if len(rows) == 1:
                    m = messages[rows[0]]
                    answer = self.remoting.send(
                        mq,
                        m.body,
                        producer_group=PRODUCER_GROUP,
                        properties=props_of[rows[0]].decode("utf-8"),
                        born_timestamp=m.born_timestamp or now,
                        flag=m.flag,
                        reconsume_times=m.reconsume_times or None,
                    )
                else:
                    answer = self.remoting.send(
                        mq,
                        b"".join(encoded[i] for i in rows),
                        producer_group=PRODUCER_GROUP,
                        properties="",
                        born_timestamp=now,
                        batch=True,
                    )
                break
            except (RemotingConnectError, RemotingTimeoutError, RemotingCommandError) as e:
                retriable = not isinstance(e, RemotingCommandError) or e.retriable
                attempt += 1
                if pinned or not retriable or attempt > SEND_RETRIES:
                    raise
                qs = self._write_queues(mq.topic)
                mq = self.remoting.faults.select(qs, random.randrange(len(qs)), mq.broker)
        _record_results(answer, rows, messages, uniq, now, results)
        end = answer.queue_offset + len(rows)
        if self._written.get(answer.mq, 0) < end:
            self._written[answer.mq] = end

    # -- transactions, retries, housekeeping ------------------------------------------------

    def prepare_batch(
        self, messages: Sequence[Message], *, producer_group: str
    ) -> Sequence[PutResult]:
        return self._prepare(list(messages), producer_group, None)

    def prepare_columns(
        self,
        bodies: Sequence[Any],
        *,
        producer_group: str,
        extra_properties: Mapping[str, str] | None = None,
        **columns: Any,
    ) -> Sequence[PutResult]:
        return self._prepare(_columns(bodies, columns).messages(), producer_group, extra_properties)

    def _prepare(
        self, messages: list[Message], producer_group: str, extra: Mapping[str, str] | None
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
        uniq = self._unique_ids(len(messages), now)
        queues: dict[str, list[MessageQueue]] = {}
        results: list[PutResult | None] = [None] * len(messages)
        inflight: deque[tuple[int, MessageQueue, Future[RemotingCommand], str, float]] = deque()
        try:
            for i, m in enumerate(messages):
                qs = queues.get(m.topic)
                if qs is None:
                    qs = queues[m.topic] = self._write_queues(m.topic)
                props = m.all_properties()
                props.setdefault(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, uniq[i])
                uniq[i] = props[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX]
                if extra:
                    props.update(extra)
                props[PROPERTY_TRANSACTION_PREPARED] = "true"
                props[PROPERTY_PRODUCER_GROUP] = producer_group
                mq = self._queue(m, qs, None)
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
        sent: tuple[int, MessageQueue, Future[RemotingCommand], str, float],
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

    def end_halves(self, halves: Iterable[Halves], *, commit: bool, guard: bool = False) -> None:
        """END_TRANSACTION for every half, ``END_WINDOW`` in flight, each answer awaited.

        RocketMQ's producer sends END_TRANSACTION one-way; here every answer is
        awaited, so when this returns each half is ended (or an error is raised,
        naming the first that failed) and a check-back that comes later finds
        the committed copy (see :meth:`_on_check`). With ``guard``, a half whose
        committed copy exists already (a commit cut short by a crash, then
        finished) is rolled back instead: that only closes it.
        """
        state = SysFlag.TRANSACTION_COMMIT if commit else SysFlag.TRANSACTION_ROLLBACK
        errors: list[BaseException] = []
        for h in halves:
            addr = self.remoting.broker_master(h.broker)
            conn = self.remoting.connection(addr)
            topics = h.topics or ("",) * len(h)
            inflight: deque[Future[RemotingCommand]] = deque()
            rows = zip(
                h.offsets().tolist(), h.commitlog_offsets, h.transaction_ids, topics, strict=True
            )
            for offset, phy, uniq, topic in rows:
                flag = state
                if guard and commit and self._committed_copy(addr, topic, uniq):
                    flag = SysFlag.TRANSACTION_ROLLBACK
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
                inflight.append(conn.invoke_async(request, self.remoting.timeout))
                if len(inflight) >= END_WINDOW:
                    _ended(inflight.popleft(), addr, errors)
            while inflight:
                _ended(inflight.popleft(), addr, errors)
        if errors:
            raise errors[0]

    def _committed_copy(self, address: str, topic: str, uniq: str) -> bool:
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

    def end_transactions(self, halves: Sequence[Halves], *, commit: bool) -> None:
        self.end_halves(halves, commit=commit)

    def check_transactions(
        self,
        producer_group: str | None,
        answer: Answer,
        *,
        in_flight: Iterable[int] = (),
    ) -> dict[str, int]:
        """Register ``answer`` for the brokers' check-backs of ``producer_group``'s halves.

        A broker asks about halves older than its transactionTimeOut, every
        transactionCheckInterval, of a producer of the half's group that is
        connected: this client is registered as one. Nothing is answered now,
        so every count is 0.
        """
        key = producer_group or ""
        with self._answers_lock:
            self._answers[key] = answer
        if producer_group is not None:
            self.remoting.register_producer(producer_group)
        return {"commit": 0, "rollback": 0, "unknown": 0}

    def _on_check(self, request: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        """CHECK_TRANSACTION_STATE: answer with END_TRANSACTION (one-way) on the same
        connection, as RocketMQ's producer does; no answer registered: no reply."""
        head = hdr.CheckTransactionStateRequestHeader.from_ext_fields(request.ext_fields)
        msg = decode_record(request.body or b"", 0, verify_crc=False)
        group = msg.properties.get(PROPERTY_PRODUCER_GROUP, "")
        with self._answers_lock:
            answer = self._answers.get(group) or self._answers.get("")
        if answer is None:
            return None
        try:
            state = answer(msg)
        except Exception:  # noqa: BLE001 - the broker asks again; the half stays open
            log.exception("answering the check-back of half %s failed", head.commit_log_offset)
            state = TransactionState.UNKNOWN
        flag = {
            TransactionState.COMMIT: SysFlag.TRANSACTION_COMMIT,
            TransactionState.ROLLBACK: SysFlag.TRANSACTION_ROLLBACK,
        }.get(state, 0)
        # A broker checks halves whose END it has not read yet (its op queue lags behind
        # under load), and commits a half again on a second COMMIT: a duplicate. A half
        # whose committed copy exists is rolled back instead, which only closes it.
        uniq = msg.uniq_key or head.msg_id or ""
        if flag == SysFlag.TRANSACTION_COMMIT and self._committed_copy(
            conn.address, msg.topic, uniq
        ):
            flag = SysFlag.TRANSACTION_ROLLBACK
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
        return None

    def ensure_group(self, group: str) -> None:
        """Create the consumer group on every master, and its retry topic: a heartbeat
        as a consumer of the group makes each broker create ``%RETRY%group``."""
        validate_group(group)
        masters = [ids[0] for ids in self.remoting.brokers().values() if 0 in ids]
        self.remoting.create_group(group, masters)
        self.remoting.register_consumer(group, None)

    def send_back(
        self,
        group: str,
        msg_ids: Sequence[str],
        *,
        properties: Sequence[Mapping[str, str]] = (),
    ) -> int:
        """Send failed messages to ``%RETRY%group`` as RocketMQ's consumer does when the
        broker cannot take CONSUMER_SEND_MSG_BACK: a new message carrying the old one's
        body and properties, RETRY_TOPIC and ORIGIN_MESSAGE_ID, reconsume times one
        more, delay level 3 + reconsume times. The broker sends it to ``%DLQ%group``
        instead once reconsume times pass the group's retryMaxTimes (16). One message
        per request (CONSUMER_SEND_MSG_BACK cannot add ``properties``), in order."""
        validate_group(group)
        if properties and len(properties) != len(msg_ids):
            raise ConfigError(
                f"properties has {len(properties)} entries, msg_ids has {len(msg_ids)}"
            )
        added = [
            user_properties(p, f"message {i}: ", frozenset({PROPERTY_DELAY_TIME_LEVEL}))
            for i, p in enumerate(properties)
        ]
        messages = [self.get_message(m) for m in msg_ids]  # all found before any is sent
        if not messages:
            return 0
        self.ensure_group(group)
        retry = retry_topic(group)
        queues = self._write_queues(retry)
        for i, m in enumerate(messages):
            props = dict(m.properties)
            props.setdefault(PROPERTY_RETRY_TOPIC, m.topic)
            for name in (
                PROPERTY_REAL_TOPIC,
                PROPERTY_REAL_QUEUE_ID,
                PROPERTY_TRANSACTION_PREPARED,
            ):
                props.pop(name, None)
            if added:
                props.update(added[i])
            if not props.get(PROPERTY_ORIGIN_MESSAGE_ID):
                props[PROPERTY_ORIGIN_MESSAGE_ID] = m.msg_id
            props[PROPERTY_DELAY_TIME_LEVEL] = str(3 + m.reconsume_times)
            # the message's own broker when it has a retry queue (as the broker's send-back)
            mq = next((q for q in queues if q.broker == self._broker_of(m)), queues[0])
            self.remoting.send(
                mq,
                m.body,
                producer_group=PRODUCER_GROUP,
                properties=properties_text(props),
                born_timestamp=m.born_timestamp,
                flag=m.flag,
                reconsume_times=m.reconsume_times + 1,
                max_reconsume_times=MAX_RECONSUME_TIMES,
            )
        return len(messages)

    def _broker_of(self, m: MessageExt) -> str | None:
        addr = str(m.store_host)
        for name, ids in self.remoting.brokers().items():
            if addr in ids.values():
                return name
        return None

    @contextlib.contextmanager
    def lock(self, name: str) -> Iterator[None]:
        """Hold ``name`` for the block: a broker's queue lock (LOCK_BATCH_MQ, as orderly
        consumers lock queues) on queue 0 of ``LOCK_TOPIC`` of the first master, for a
        group named after ``name``, renewed while held; waits while another holds it.
        A broker gives the lock up 60 s after its holder stops renewing (a dead process).
        """
        masters = sorted((n, ids[0]) for n, ids in self.remoting.brokers().items() if 0 in ids)
        if not masters:
            raise ConfigError(f"{self.where} has no master broker to hold lock {name!r} on")
        broker, addr = masters[0]
        group = "rocketspark-lock-" + hashlib.sha1(name.encode()).hexdigest()[:20]
        body = json.dumps(
            {
                "consumerGroup": group,
                "clientId": self.remoting.client_id,
                "onlyThisBroker": True,
                "mqSet": [{"topic": LOCK_TOPIC, "brokerName": broker, "queueId": 0}],
            }
        ).encode()
        with self._answers_lock:
            local = self._locks.setdefault(name, threading.Lock())
        local.acquire()  # the broker's lock is this client's: its threads take turns here
        try:
            while not self._try_lock(addr, body):
                time.sleep(0.2)
        except BaseException:
            local.release()
            raise
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(LOCK_RENEW_SECONDS):
                try:
                    self._try_lock(addr, body)
                except RemotingError as e:
                    log.warning("renewing lock %s on %s failed: %s", name, addr, e)

        renewer = threading.Thread(target=renew, name=f"rocketspark-lock-{name}", daemon=True)
        renewer.start()
        try:
            yield
        finally:
            stop.set()
            renewer.join()
            try:
                self.remoting.invoke(addr, RequestCode.UNLOCK_BATCH_MQ, body=body)
            finally:
                local.release()

    def _try_lock(self, addr: str, body: bytes) -> bool:
        response = self.remoting.invoke(addr, RequestCode.LOCK_BATCH_MQ, body=body)
        locked = json.loads(bytes(response.body or b"{}")).get("lockOKMQSet") or []
        return bool(locked)

    def sink_ledger(self) -> RemoteSinkLedger:
        with self._answers_lock:
            if self._ledger is None:
                self._ledger = RemoteSinkLedger(self)
            return self._ledger

    def tick(self) -> int:
        return 0  # the brokers deliver delayed messages themselves

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.remoting.close()


PRODUCER_GROUP = "rocketspark-producer"
MAX_RECONSUME_TIMES = 16  # a subscription group's default retryMaxTimes
LOCK_TOPIC = "rocketspark_locks"  # names the queue a lock is taken on (never written)
LOCK_RENEW_SECONDS = 20.0  # a broker keeps a queue lock 60 s without renewal
READ_YOUR_WRITES_SECONDS = 5.0
ID_BLOCK = 32768  # UNIQ_KEYs under one millisecond stamp at most
# What encode_properties writes for a TAGS and a UNIQ_KEY property (the common row's).
_TAGS_ITEM = f"{PROPERTY_TAGS}{NAME_VALUE_SEPARATOR}"
_UNIQ_KEY_ITEM = f"{PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX}{NAME_VALUE_SEPARATOR}"
_UNIQ_ITEM = f"{PROPERTY_SEPARATOR}{_UNIQ_KEY_ITEM}"
HALF_WINDOW = 64  # half messages in flight per prepare (each is a request of its own)
END_WINDOW = 256  # END_TRANSACTION requests in flight


def _ended(future: Future[RemotingCommand], address: str, errors: list[BaseException]) -> None:
    try:
        check_response(future.result(), request_code=RequestCode.END_TRANSACTION, address=address)
    except RemotingError as e:
        errors.append(e)


def _columns(bodies: Sequence[Any], columns: dict[str, Any]) -> Columns:
    cols = Columns(
        bodies,
        columns.pop("topic", None),
        columns.pop("topics", None),
        columns.pop("tags", None),
        columns.pop("keys", None),
        columns.pop("properties", None),
        columns.pop("queue_ids", None),
        columns.pop("sharding_keys", None),
    )
    if columns:
        raise TypeError(f"unknown columns {sorted(columns)}")
    return cols


def _not_yet(what: str) -> ConfigError:
    return ConfigError(f"{what} on a RocketMQ cluster: not built yet in this version (use store=)")


def _encode_for_batch(msg: Message, props: bytes) -> bytes:
    """One message of a SEND_BATCH_MESSAGE body (``MessageDecoder.encodeMessage``):
    TOTALSIZE, MAGICCODE 0, BODYCRC 0, FLAG, BODY (length first), PROPERTIES (length first)."""
    body = msg.body
    return b"".join(
        (
            _BATCH_HEAD.pack(22 + len(body) + len(props), msg.flag & 0xFFFFFFFF, len(body)),
            body,
            len(props).to_bytes(2, "big"),
            props,
        )
    )


_BATCH_HEAD = struct.Struct(">I8xII")  # TOTALSIZE, MAGICCODE and BODYCRC (0), FLAG, BODY length


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


def _record_results(
    answer: SendAnswer,
    rows: list[int],
    messages: list[Message],
    uniq: list[str],
    now: int,
    results: list[PutResult | None],
) -> None:
    ids = answer.offset_msg_id.split(",")
    if len(ids) != len(rows):
        raise CorruptRecordError(
            f"the broker at {answer.broker_addr} answered {len(ids)} message ids for a batch "
            f"of {len(rows)} messages"
        )
    phys = _commitlog_offsets(ids)
    for k, (i, msg_id, phy) in enumerate(zip(rows, ids, phys, strict=True)):
        results[i] = PutResult(
            PutStatus.PUT_OK,
            messages[i].topic,
            answer.mq.queue_id,
            answer.queue_offset + k,
            phy,
            msg_id,
            uniq[i],
            now,
            0,
            answer.mq.broker,
        )


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
            table = np.frombuffer(raw, dtype=np.uint8).reshape(len(ids), width)
            return np.ascontiguousarray(table[:, width - 8 :]).view(">i8").ravel().tolist()
    return [parse_message_id(msg_id)[1] for msg_id in ids]  # raises naming the bad one


class _RangeReader:
    """Pulls ``[start, end)`` of one queue, several requests in flight, in offset order.

    Each request asks for ``pull_batch`` messages from the offset after the
    previous request's; answers are taken in request order. An answer that
    ends early (the broker's byte limit, a filter) leaves a gap that a request
    from the answer's ``nextBeginOffset`` fills before later answers are used;
    records of an answer that lie before the position reached are dropped.
    """

    def __init__(
        self,
        client: RemoteClient,
        mq: MessageQueue,
        start: int,
        end: int,
        sub: SubscriptionExpression,
    ):
        self.client = client
        self.rc = client.remoting
        self.mq = mq
        self.position = start
        self.end = end
        self.expression = sub.text if not sub.matches_all else "*"

    def _request(self, offset: int, address: str) -> Future[RemotingCommand]:
        n = min(self.client.pull_batch, self.end - offset)
        return self.rc.pull_async(
            self.mq, offset, n, group=self.client.group, expression=self.expression, address=address
        )

    def blocks(self) -> Iterator[bytes | memoryview]:
        """Yield buffers of back-to-back records, in queue order, up to ~ARROW_BLOCK_BYTES."""
        if self.position >= self.end:
            return
        address = self.rc.read_address(self.mq)
        inflight: deque[tuple[int, Future[RemotingCommand]]] = deque()
        ask = self.position
        parts: list[memoryview] = []
        size = 0
        try:
            while self.position < self.end:
                while len(inflight) < self.client.pipeline and ask < self.end:
                    inflight.append((ask, self._request(ask, address)))
                    ask += self.client.pull_batch
                if not inflight:
                    ask = self.position
                    continue
                offset, future = inflight.popleft()
                if offset > self.position:  # a gap: pull it before this answer is used
                    inflight.appendleft((offset, future))
                    inflight.appendleft((self.position, self._request(self.position, address)))
                    continue
                answer = self.rc.pull_answer(self.mq, future.result(), address)
                before = self.position
                got = self._take(answer, offset)
                if got is None or (offset == before and self.position == before):
                    break  # nothing more at the position now
                if len(got):
                    parts.append(got)
                    size += len(got)
                    if size >= ARROW_BLOCK_BYTES:
                        yield _join(parts)
                        parts, size = [], 0
            if parts:
                yield _join(parts)
        finally:
            for _, f in inflight:
                f.cancel()

    def _take(self, answer: PullAnswer, offset: int) -> memoryview | None:
        """The records of ``answer`` in [position, end); advance the position. None: the
        queue has nothing at the position (its end, for now)."""
        mq = self.mq
        if answer.status is PullStatus.OFFSET_ILLEGAL:
            raise OffsetOutOfRangeError(
                f"offset {self.position} of {mq} is outside [{answer.min_offset}, "
                f"{answer.max_offset}] on the broker"
            )
        if answer.status is PullStatus.NO_NEW_MSG:
            if offset == self.position:
                return None
            return memoryview(b"")
        if answer.status is PullStatus.NO_MATCHED_MSG or answer.body is None:
            self.position = max(self.position, min(answer.next_begin_offset, self.end))
            return memoryview(b"")
        body = memoryview(answer.body)
        starts, _ = arrow.record_positions(body, what=f"pull answer of {mq}")
        hdr = gather_items(np.frombuffer(body, dtype=np.uint8), starts, _QOFF)
        qoff = hdr["queue_offset"]
        keep = np.flatnonzero((qoff >= self.position) & (qoff < self.end))
        nxt = min(answer.next_begin_offset, self.end)
        if len(keep) == 0:
            self.position = max(self.position, nxt)
            return memoryview(b"")
        a, b = int(keep[0]), int(keep[-1])
        stop = int(starts[b + 1]) if b + 1 < len(starts) else len(body)
        self.position = max(self.position, nxt, int(qoff[b]) + 1)
        return body[int(starts[a]) : stop]


_QOFF = np.dtype({"names": ["queue_offset"], "formats": [">i8"], "offsets": [20], "itemsize": 28})


def _join(parts: list[memoryview]) -> bytes | memoryview:
    return parts[0] if len(parts) == 1 else b"".join(parts)

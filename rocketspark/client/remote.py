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
  flight (``remote_pull.py``), then turn the answers' records into Arrow batches
  with the embedded store's vectorised code (``message.arrow``): bodies are
  never decoded message by message. Tag expressions filter by hash code on the
  broker and by text here, as RocketMQ's consumer does.
- **Group offsets** are the broker's (QUERY_CONSUMER_OFFSET,
  UPDATE_CONSUMER_OFFSET): ``mqadmin consumerProgress`` and RocketMQ's
  dashboard show them.
- **Writes, halves and check-backs** are the producer's (``remote_producer.py``);
  the sink ledger is a topic of the cluster (``remote_ledger.py``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from rocketspark.client import remote_halves
from rocketspark.client.api import Answer, ClientRef, MessageQueue, PutResult, TopicInfo
from rocketspark.client.remote_ledger import RemoteSinkLedger
from rocketspark.client.remote_producer import PRODUCER_GROUP, Producer
from rocketspark.client.remote_pull import RangeReader, read_ahead
from rocketspark.errors import (
    ConfigError,
    OffsetOutOfRangeError,
    RemotingCommandError,
    RemotingError,
    UnknownTopicError,
)
from rocketspark.message import arrow
from rocketspark.message.columns import Columns
from rocketspark.message.model import (
    BROKER_STAMPED_PROPERTIES,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TRANSACTION_PREPARED,
    Message,
    MessageExt,
    retry_topic,
    user_properties,
)
from rocketspark.message.names import SubscriptionExpression, validate_group, validate_topic
from rocketspark.message.properties import properties_text
from rocketspark.message.record import decode_record, parse_message_id
from rocketspark.message.results import Halves
from rocketspark.remoting.acl import Credentials
from rocketspark.remoting.client import RemotingClient, parse_namesrv
from rocketspark.remoting.codes import RequestCode
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
        self.producer = Producer(self.remoting, ref.address, self.now_ms)
        self._lock = threading.Lock()
        self._ledger: RemoteSinkLedger | None = None
        self._locks: dict[str, threading.Lock] = {}

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
        wrote = self.producer.written.get(mq, 0)
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
        columns: tuple[str, ...] | None = None,
    ) -> tuple[list[pa.RecordBatch], int]:
        """Pull ``[start, end)`` of ``mq`` with up to ``pullPipeline`` pulls in flight."""
        sub = SubscriptionExpression(expression)
        crc = True if check_crc is None else check_crc
        reader = RangeReader(self, mq, start, end, sub)
        blocks = reader.blocks()
        if end - start > self.pull_batch * self.pipeline:
            blocks = read_ahead(blocks)  # more than one burst of pulls: pull while converting
        decode = columns if sub.matches_all else arrow.with_tags(columns)
        with contextlib.closing(blocks):  # a failed conversion stops the pulls at once
            batches = [
                arrow.records_body_to_batch(
                    block,
                    topic=mq.topic,
                    broker_name=mq.broker,
                    queue_id=mq.queue_id,
                    check_crc=crc,
                    columns=decode,
                )
                for block in blocks
            ]
        # Rows are the same on both backends: the properties every broker adds to
        # every message it stores (its cluster, region, trace switch) are left out.
        if columns is None or "properties" in columns:
            batches = [
                arrow.drop_properties(b, BROKER_STAMPED_PROPERTIES) for b in batches if b.num_rows
            ]
        else:
            batches = [b for b in batches if b.num_rows]
        if not sub.matches_all:
            batches = [arrow.filter_tags(b, sub.tags, columns) for b in batches]
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
        return self.producer.send(list(messages))

    def put_columns(self, bodies: Sequence[Any], **columns: Any) -> Sequence[PutResult]:
        return self.producer.send_columns(Columns.of_keywords(bodies, columns))

    # -- transactions, retries, housekeeping ------------------------------------------------

    def prepare_batch(
        self, messages: Sequence[Message], *, producer_group: str
    ) -> Sequence[PutResult]:
        return self.producer.prepare(list(messages), producer_group, None)

    def prepare_columns(
        self,
        bodies: Sequence[Any],
        *,
        producer_group: str,
        extra_properties: Mapping[str, str] | None = None,
        **columns: Any,
    ) -> Sequence[PutResult]:
        return self.producer.prepare(
            Columns.of_keywords(bodies, columns).messages(), producer_group, extra_properties
        )

    def halves(self, results: Sequence[PutResult], *, producer_group: str) -> list[Halves]:
        return self.producer.halves(results, producer_group=producer_group)

    def end_transactions(self, halves: Sequence[Halves], *, commit: bool) -> None:
        self.producer.end_halves(halves, commit=commit)

    def check_transactions(
        self,
        producer_group: str | None,
        answer: Answer,
        *,
        in_flight: Iterable[int] = (),
    ) -> dict[str, int]:
        """Run ``answer`` now over every open half of the group on every master, then
        register it for the brokers' check-backs of the group's halves.

        The open halves are read from each broker's half and op topics (see
        ``remote_halves.py``); each is ended as answered, with END_TRANSACTION
        (every answer awaited). A COMMIT for a half whose committed copy exists
        already only closes it (and is not counted); UNKNOWN leaves a half open.
        Halves at the half-queue offsets in ``in_flight`` (on any broker), and
        halves of a transaction (broker, UNIQ_KEY) this client is ending or ended
        lately, are not asked: within a process a transaction is ended once.

        A broker asks about halves older than its transactionTimeOut, every
        transactionCheckInterval, of a producer of the half's group that is
        connected: this client is registered as one, and ``answer`` answers
        those that are left open or prepared later.
        """
        counts = remote_halves.check(self, producer_group, answer, in_flight=in_flight)
        self.producer.register_answer(producer_group, answer)
        return counts

    def register_answer(self, producer_group: str | None, answer: Answer) -> None:
        """Answer the brokers' check-backs of ``producer_group``'s halves (None: of every
        group) with ``answer``, from now on; nothing is asked now."""
        self.producer.register_answer(producer_group, answer)

    def open_halves(self, producer_group: str | None = None) -> list[MessageExt]:
        """The open halves (of ``producer_group``) on every master, as stored in the half
        topic: by broker name, then half-queue offset (see ``remote_halves.py``)."""
        return [h for _, h in remote_halves.open_halves(self, producer_group)]

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
        queues = self.producer.write_queues(retry)
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
        with self._lock:
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
        with self._lock:
            if self._ledger is None:
                self._ledger = RemoteSinkLedger(self)
            return self._ledger

    def tick(self) -> int:
        return 0  # the brokers deliver delayed messages themselves

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.remoting.close()


MAX_RECONSUME_TIMES = 16  # a subscription group's default retryMaxTimes
LOCK_TOPIC = "rocketspark_locks"  # names the queue a lock is taken on (never written)
LOCK_RENEW_SECONDS = 20.0  # a broker keeps a queue lock 60 s without renewal
READ_YOUR_WRITES_SECONDS = 5.0

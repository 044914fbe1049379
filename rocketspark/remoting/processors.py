"""The requests of a NameServer and a broker, served over one embedded MessageStore.

The only module that imports both ``remoting`` and ``store``: each processor
reads a request's header, asks the store, and answers as Apache RocketMQ's
processors do (``ClientRequestProcessor`` / ``DefaultRequestProcessor`` of the
NameServer; ``SendMessageProcessor``, ``PullMessageProcessor`` +
``PullRequestHoldService``, ``ConsumerManageProcessor``,
``AdminBrokerProcessor``, ``ClientManageProcessor`` of the broker).

The store is one broker: ``brokerName`` and ``brokerClusterName`` of its
config name it in routes, its master (id 0) address is the broker port the
server listens on. :func:`serve` starts a NameServer port and a broker port
(one port may serve both: the request codes do not overlap).

Pulls answer with the CommitLog records of the range as views of the mapped
segments (``MessageStore.read_raw``), sent with scatter-gather, never copied.
A pull that finds nothing and may be suspended is parked in
:class:`PullHoldService` until a put reaches its queue (a put of this process
notifies the store's arrivals condition; one of another process writing the
same directory bumps the store's shared write sequence, checked every
millisecond) or its suspend timeout passes, then is run again and answered.
"""

from __future__ import annotations

import json
import logging
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rocketspark.errors import (
    ConfigError,
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
from rocketspark.message.fastjson import loads_lenient
from rocketspark.message.model import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
    RETRY_GROUP_TOPIC_PREFIX,
    Message,
    MessageExt,
    SysFlag,
    TopicInfo,
    TransactionState,
    retry_topic,
    transaction_type,
)
from rocketspark.message.names import SubscriptionExpression, validate_group
from rocketspark.message.properties import decode_properties
from rocketspark.message.record import decompress_body
from rocketspark.message.results import PullStatus, PutResult, PutStatus
from rocketspark.remoting import headers as h
from rocketspark.remoting.codes import MQ_VERSION, PullSysFlag, RequestCode, ResponseCode
from rocketspark.remoting.command import RemotingCommand
from rocketspark.remoting.server import (
    Channel,
    Processor,
    RemotingServer,
    Reply,
    WorkQueue,
    is_wildcard,
)
from rocketspark.store.message_store import MessageStore

__all__ = [
    "BrokerProcessors",
    "NameServerProcessors",
    "PullHoldService",
    "Served",
    "serve",
]

log = logging.getLogger(__name__)

MASTER_ID = 0
PERM_READ_WRITE = 6
# A pull answers at most this much (RocketMQ: maxTransferCountOnMessageInMemory 32 and
# maxTransferBytesOnMessageInMemory 256 KiB; a client asking more gets more here, up to
# what a frame carries with room to spare).
MAX_PULL_MESSAGES = 1024
MAX_PULL_BYTES = 4 * 1024 * 1024
HOLD_CHECK_SECONDS = 0.001  # how often held pulls look for another process's puts
DELAY_CHECK_SECONDS = 0.1  # how often due delayed messages are delivered (RocketMQ: 100 ms)
CHECK_SECONDS = 1.0  # how often open halves are looked at for check-backs
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
# RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: the groups that consume a topic (mqadmin queryMsgById).
QUERY_TOPIC_CONSUME_BY_WHO = 300


def _answer(
    request: RemotingCommand,
    code: int,
    remark: str | None = None,
    header: h.Header | None = None,
    body: bytes | None = None,
) -> RemotingCommand:
    return RemotingCommand.response_to(
        request, code, remark, header.to_ext_fields() if header is not None else None, body=body
    )


def _ok(
    request: RemotingCommand, header: h.Header | None = None, body: bytes | None = None
) -> RemotingCommand:
    return _answer(request, ResponseCode.SUCCESS, None, header, body)


def _put_code(results: Sequence[PutResult]) -> int:
    """SUCCESS, or FLUSH_DISK_TIMEOUT when a SYNC_FLUSH put was stored but its flush timed
    out (the store reports it in the results' status, as RocketMQ's PutMessageStatus):
    the answer keeps the header, as SendMessageProcessor's does, and the producer hears
    that the message may not be on disk."""
    if any(r.status is PutStatus.FLUSH_DISK_TIMEOUT for r in results):
        return ResponseCode.FLUSH_DISK_TIMEOUT
    return ResponseCode.SUCCESS


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


@dataclass(frozen=True, slots=True)
class BrokerIdentity:
    """How routes name the store's broker."""

    cluster: str
    name: str
    address: str  # the broker port's host:port


# --- the NameServer ------------------------------------------------------------------------


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
            return _answer(
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
        return _ok(request, body=_json(route))

    def cluster_info(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        info = {
            "brokerAddrTable": {self.broker.name: self._broker_data()},
            "clusterAddrTable": {self.broker.cluster: [self.broker.name]},
        }
        return _ok(request, body=_json(info))

    def topic_list(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        return _ok(request, body=_json({"topicList": sorted(self.store.topics.names())}))

    def kv_config(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        key = request.ext_fields.get("key", "")
        return _answer(
            request, ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: ... Key: {key}"
        )


# --- the broker ----------------------------------------------------------------------------


class BrokerProcessors:
    """Sends, pulls, offsets, consumer offsets, heartbeats and topic creation over a store."""

    def __init__(self, store: MessageStore, broker: BrokerIdentity):
        self.store = store
        self.broker = broker
        self.holds = PullHoldService(store, self._pull_again)
        self._stopping = threading.Event()
        self._delivery: threading.Thread | None = None
        self._checker: threading.Thread | None = None
        self._checked: dict[int, float] = {}  # half queue offset -> when a producer was asked
        self.locks = QueueLocks()
        self._next_check = 0
        self._clients_lock = threading.Lock()
        # group -> client id -> channel (consumers), from heartbeats
        self._consumers: dict[str, dict[str, Channel]] = {}
        self._producers: dict[str, dict[str, Channel]] = {}
        self._pull_queue: WorkQueue | None = None

    def register(self, server: RemotingServer, *, threads: int = 4) -> None:
        """Register every broker request on ``server``, each group on its own work queue."""
        send = server.work_queue("send", threads=1, capacity=10_000)
        pull = server.work_queue("pull", threads=threads, capacity=100_000)
        admin = server.work_queue("admin", threads=2, capacity=10_000)
        heartbeat = server.work_queue("heartbeat", threads=1, capacity=50_000)
        self._pull_queue = pull
        server.register(
            (
                RequestCode.SEND_MESSAGE,
                RequestCode.SEND_MESSAGE_V2,
                RequestCode.SEND_BATCH_MESSAGE,
            ),
            self.send,
            send,
        )
        server.register((RequestCode.PULL_MESSAGE, RequestCode.LITE_PULL_MESSAGE), self.pull, pull)
        server.register(RequestCode.END_TRANSACTION, self.end_transaction, send)
        server.register(RequestCode.GET_MAX_OFFSET, self.max_offset, admin)
        server.register(RequestCode.GET_MIN_OFFSET, self.min_offset, admin)
        server.register(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, self.search_offset, admin)
        server.register(RequestCode.QUERY_CONSUMER_OFFSET, self.query_consumer_offset, admin)
        server.register(RequestCode.UPDATE_CONSUMER_OFFSET, self.update_consumer_offset, admin)
        server.register(RequestCode.UPDATE_AND_CREATE_TOPIC, self.create_topic, admin)
        server.register(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, self.create_group, admin)
        server.register(RequestCode.GET_CONSUMER_LIST_BY_GROUP, self.consumer_list, admin)
        server.register(RequestCode.GET_BROKER_RUNTIME_INFO, self.runtime_info, admin)
        server.register(RequestCode.GET_TOPIC_STATS_INFO, self.topic_stats, admin)
        server.register(RequestCode.GET_TOPIC_CONFIG, self.topic_config, admin)
        server.register(QUERY_TOPIC_CONSUME_BY_WHO, self.consumed_by, admin)
        server.register(RequestCode.GET_CONSUME_STATS, self.consume_stats, admin)
        server.register(RequestCode.GET_CONSUMER_CONNECTION_LIST, self.consumer_connections, admin)
        server.register(RequestCode.VIEW_MESSAGE_BY_ID, self.view_message, admin)
        server.register(RequestCode.QUERY_MESSAGE, self.query_message, admin)
        server.register(RequestCode.CONSUMER_SEND_MSG_BACK, self.send_back, send)
        server.register(RequestCode.LOCK_BATCH_MQ, self.lock_queues, admin)
        server.register(RequestCode.UNLOCK_BATCH_MQ, self.unlock_queues, admin)
        server.register(RequestCode.HEART_BEAT, self.heartbeat, heartbeat)
        server.register(RequestCode.UNREGISTER_CLIENT, self.unregister_client, heartbeat)
        self.holds.start()
        self._delivery = threading.Thread(
            target=self._deliver_delayed, name="rocketspark-serve-delay", daemon=True
        )
        self._delivery.start()
        self._checker = threading.Thread(
            target=self._check_transactions, name="rocketspark-serve-tx-check", daemon=True
        )
        self._checker.start()

    def stop(self) -> None:
        """Stop delivering delayed messages and the hold service (held pulls are dropped:
        their connections are closing)."""
        self._stopping.set()
        for thread in (self._delivery, self._checker):
            if thread is not None:
                thread.join()
        self.holds.stop()

    def _deliver_delayed(self) -> None:
        """Deliver delayed messages when due, as a broker's ScheduleMessageService does: no
        other process needs to run for them (``MessageStore.run_schedule``)."""
        while not self._stopping.wait(DELAY_CHECK_SECONDS):
            try:
                self.store.run_schedule()
            except StoreClosedError:
                return
            except Exception:
                log.exception("delivering delayed messages failed; trying again")
                self._stopping.wait(1.0)

    # -- send ----------------------------------------------------------------------------

    def send(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        header: h.SendMessageRequestHeader
        if request.code == RequestCode.SEND_MESSAGE:
            header = h.SendMessageRequestHeader.from_ext_fields(request.ext_fields)
        else:
            header = h.SendMessageRequestHeaderV2.from_ext_fields(request.ext_fields)
        topic = header.topic
        if not self.store.has_topic(topic):
            return _answer(
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
            if prepared:
                halves = self.store.prepare_batch(messages, producer_group=header.producer_group)
                first = halves[0]
                # The queue asked for, the half queue's offset (END_TRANSACTION's
                # tranStateTableOffset), the half's id: as SendMessageProcessor answers.
                return _answer(
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
            return _answer(request, ResponseCode.TOPIC_NOT_EXIST, str(e))
        except (InvalidMessageError, MessageTooLargeError, RemotingFrameError) as e:
            return _answer(request, ResponseCode.MESSAGE_ILLEGAL, str(e))
        except (OffsetOutOfRangeError, TransactionError) as e:  # a queue id it does not have
            return _answer(request, ResponseCode.SYSTEM_ERROR, str(e))
        except FlushTimeoutError as e:
            return _answer(request, ResponseCode.FLUSH_DISK_TIMEOUT, str(e))
        except (DiskFullError, StoreClosedError) as e:
            return _answer(request, ResponseCode.SERVICE_NOT_AVAILABLE, str(e))
        first = results[0]
        return _answer(
            request,
            _put_code(results),
            None,
            h.SendMessageResponseHeader(
                msg_id=",".join(r.msg_id for r in results) if len(results) > 1 else first.msg_id,
                queue_id=first.queue_id,
                queue_offset=first.queue_offset,
            ),
        )

    # -- transactions --------------------------------------------------------------------

    def end_transaction(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        """END_TRANSACTION: commit or roll back the half at ``tranStateTableOffset`` (one-way
        from RocketMQ's producer, also after a check-back; 0 leaves it open)."""
        header = h.EndTransactionRequestHeader.from_ext_fields(request.ext_fields)
        kind = header.commit_or_rollback
        try:
            if kind == SysFlag.TRANSACTION_COMMIT:
                self.store.commit_transaction(header.tran_state_table_offset)
            elif kind == SysFlag.TRANSACTION_ROLLBACK:
                self.store.rollback_transaction(header.tran_state_table_offset)
            else:
                return _ok(request)  # TRANSACTION_NOT_TYPE: the producer does not know yet
        except (TransactionError, OffsetOutOfRangeError) as e:
            log.warning(
                "END_TRANSACTION of group %s at half offset %d from %s: %s",
                header.producer_group,
                header.tran_state_table_offset,
                channel.address,
                e,
            )
            return _answer(request, ResponseCode.SYSTEM_ERROR, str(e))
        self._checked.pop(header.tran_state_table_offset, None)
        return _ok(request)

    def _check_transactions(self) -> None:
        """Ask a connected producer of each half's group about the halves open longer than
        transactionTimeOut, at most once per timeout each (RocketMQ's
        TransactionalMessageCheckService); their answers come back as END_TRANSACTION."""
        timeout_s = max(self.store.config.transaction_timeout / 1000.0, CHECK_SECONDS)
        while not self._stopping.wait(CHECK_SECONDS):
            try:
                self.store.check_transactions(self._ask_producer, unknown="keep")
            except StoreClosedError:
                return
            except Exception:
                log.exception("checking transactions failed; trying again")
            now = time.monotonic()
            for offset, asked in list(self._checked.items()):
                if now - asked > timeout_s:
                    self._checked.pop(offset, None)

    def _ask_producer(self, half: MessageExt) -> TransactionState:
        """Send CHECK_TRANSACTION_STATE for ``half`` to a producer of its group (one-way);
        the half stays open until the producer's END_TRANSACTION."""
        if half.queue_offset in self._checked:
            return TransactionState.UNKNOWN
        group = half.properties.get(PROPERTY_PRODUCER_GROUP, "")
        with self._clients_lock:
            channels = [ch for ch in self._producers.get(group, {}).values() if not ch.closed]
        if not channels:
            return TransactionState.UNKNOWN
        channel = channels[self._next_check % len(channels)]
        self._next_check += 1
        header = h.CheckTransactionStateRequestHeader(
            topic=half.properties.get(PROPERTY_REAL_TOPIC),
            tran_state_table_offset=half.queue_offset,
            commit_log_offset=half.commitlog_offset,
            msg_id=half.uniq_key,
            transaction_id=half.properties.get(PROPERTY_TRANSACTION_ID, half.uniq_key),
            offset_msg_id=half.msg_id,
            broker_name=self.broker.name,
        )
        body = bytes(self.store.record_view(half.commitlog_offset, half.store_size))
        check = RemotingCommand.request(
            RequestCode.CHECK_TRANSACTION_STATE, header.to_ext_fields(), body=body
        )
        if channel.invoke_oneway(check):
            self._checked[half.queue_offset] = time.monotonic()
        return TransactionState.UNKNOWN

    # -- pull ----------------------------------------------------------------------------

    def pull(
        self, request: RemotingCommand, channel: Channel, *, may_suspend: bool = True
    ) -> RemotingCommand | Reply | None:
        header = h.PullMessageRequestHeader.from_ext_fields(request.ext_fields)
        topic, queue_id, offset = header.topic, header.queue_id, header.queue_offset
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX) and not self.store.has_topic(topic):
            self._ensure_group(topic[len(RETRY_GROUP_TOPIC_PREFIX) :])
        if not self.store.has_topic(topic):
            return _answer(
                request,
                ResponseCode.TOPIC_NOT_EXIST,
                f"topic[{topic}] not exist, apply first please!",
            )
        if header.expression_type not in (None, "TAG"):
            return _answer(
                request,
                ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                f"expression type {header.expression_type} is not supported (TAG only)",
            )
        sub = SubscriptionExpression(header.subscription or "*")
        codes = None if sub.matches_all else sub.codes
        max_msgs = max(1, min(header.max_msg_nums, MAX_PULL_MESSAGES))
        max_bytes = min(header.max_msg_bytes or MAX_PULL_BYTES, MAX_PULL_BYTES)
        # The consumer's offset rides on the pull, committed once: not when a held pull
        # runs again (may_suspend False), by when the group may have committed further
        # (RocketMQ commits only when the broker may suspend). A commit that fails does
        # not fail the pull: the consumer commits again with its next one.
        if (
            may_suspend
            and header.sys_flag & PullSysFlag.COMMIT_OFFSET
            and header.commit_offset >= 0
        ):
            try:
                self.store.commit_offset(
                    header.consumer_group, topic, queue_id, header.commit_offset
                )
            except RocketSparkError as e:
                log.warning(
                    "pull of %s/%d: the offset %d of group %s riding on it was not committed: %s",
                    topic,
                    queue_id,
                    header.commit_offset,
                    header.consumer_group,
                    e,
                )
        try:
            read = self.store.read_raw(topic, queue_id, offset, max_msgs, max_bytes, codes)
        except OffsetOutOfRangeError as e:
            return _answer(
                request, ResponseCode.SYSTEM_ERROR, f"queueId[{queue_id}] is illegal: {e}"
            )
        status, next_offset = read.status, read.next_offset
        if read.max_offset == 0 and status is PullStatus.OFFSET_ILLEGAL:
            status, next_offset = PullStatus.NO_NEW_MSG, 0  # NO_MESSAGE_IN_QUEUE
        response_header = h.PullMessageResponseHeader(
            suggest_which_broker_id=MASTER_ID,
            next_begin_offset=next_offset,
            min_offset=read.min_offset,
            max_offset=read.max_offset,
        )
        if status is PullStatus.FOUND:
            return Reply(_ok(request, response_header), read.parts)
        if status is PullStatus.NO_NEW_MSG:
            suspend = header.sys_flag & PullSysFlag.SUSPEND and header.suspend_timeout_millis > 0
            if may_suspend and suspend:
                self.holds.hold(
                    request, channel, topic, queue_id, offset, header.suspend_timeout_millis
                )
                return None
            return _answer(request, ResponseCode.PULL_NOT_FOUND, None, response_header)
        if status is PullStatus.NO_MATCHED_MSG:
            return _answer(request, ResponseCode.PULL_RETRY_IMMEDIATELY, None, response_header)
        return _answer(request, ResponseCode.PULL_OFFSET_MOVED, None, response_header)

    def _pull_again(self, request: RemotingCommand, channel: Channel) -> None:
        """Run a held pull again (its queue moved, or its time is up) and answer it."""

        def run() -> None:
            try:
                response = self.pull(request, channel, may_suspend=False)
            except Exception as e:
                log.exception("a held pull failed")
                response = _answer(request, ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")
            if response is not None:
                channel.respond(request, response)

        queue = self._pull_queue
        if queue is None or not queue.try_submit(run):
            run()

    # -- offsets -------------------------------------------------------------------------

    def _queue_offset(
        self, request: RemotingCommand, read: Callable[[str, int], int], topic: str, queue_id: int
    ) -> int:
        try:
            return read(topic, queue_id)
        except (UnknownTopicError, OffsetOutOfRangeError):
            return 0  # RocketMQ answers 0 for a queue it does not have

    def max_offset(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        header = h.GetMaxOffsetRequestHeader.from_ext_fields(request.ext_fields)
        offset = self._queue_offset(request, self.store.max_offset, header.topic, header.queue_id)
        return _ok(request, h.GetMaxOffsetResponseHeader(offset=offset))

    def min_offset(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        header = h.GetMinOffsetRequestHeader.from_ext_fields(request.ext_fields)
        offset = self._queue_offset(request, self.store.min_offset, header.topic, header.queue_id)
        return _ok(request, h.GetMinOffsetResponseHeader(offset=offset))

    def search_offset(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        header = h.SearchOffsetRequestHeader.from_ext_fields(request.ext_fields)

        def read(topic: str, queue_id: int) -> int:
            return self.store.offset_for_timestamp(topic, queue_id, header.timestamp)

        offset = self._queue_offset(request, read, header.topic, header.queue_id)
        return _ok(request, h.SearchOffsetResponseHeader(offset=offset))

    def query_consumer_offset(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        header = h.QueryConsumerOffsetRequestHeader.from_ext_fields(request.ext_fields)
        try:
            offset = self.store.committed_offset(
                header.consumer_group, header.topic, header.queue_id
            )
        except (UnknownTopicError, OffsetOutOfRangeError):
            offset = None
        if offset is not None and offset >= 0:
            return _ok(request, h.QueryConsumerOffsetResponseHeader(offset=offset))
        if header.set_zero_if_not_found is False:
            return _answer(
                request,
                ResponseCode.QUERY_NOT_FOUND,
                "Not found, do not set to zero, maybe this group boot first",
            )
        # A group that never committed starts at 0 while the queue still holds its first
        # message (RocketMQ: min offset 0 and that message in memory).
        lo = self._queue_offset(request, self.store.min_offset, header.topic, header.queue_id)
        hi = self._queue_offset(request, self.store.max_offset, header.topic, header.queue_id)
        if lo <= 0 < hi:
            return _ok(request, h.QueryConsumerOffsetResponseHeader(offset=0))
        return _answer(
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
            return _answer(request, ResponseCode.TOPIC_NOT_EXIST, str(e))
        except (OffsetOutOfRangeError, RocketSparkError) as e:
            return _answer(request, ResponseCode.SYSTEM_ERROR, str(e))
        return _ok(request)

    # -- administration ------------------------------------------------------------------

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
            return _answer(request, ResponseCode.SYSTEM_ERROR, str(e))
        return _ok(request)

    def create_group(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        try:
            config = loads_lenient(bytes(request.body or b"{}").decode("utf-8"))
            group = str(config["groupName"])
            self.store.groups.get_or_create(group)
        except (ValueError, KeyError, TypeError, RocketSparkError) as e:
            return _answer(request, ResponseCode.SYSTEM_ERROR, f"bad subscription group: {e}")
        return _ok(request)

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
        return _ok(request, body=_json({"table": table}))

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
            return _answer(
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
        return _ok(request, body=_json(config))

    def topic_stats(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        """GET_TOPIC_STATS_INFO: each queue's min and max offset (``mqadmin topicStatus``)."""
        header = h.GetTopicStatsInfoRequestHeader.from_ext_fields(request.ext_fields)
        info = self.store.topics.info(header.topic)
        if info is None:
            return _answer(
                request, ResponseCode.TOPIC_NOT_EXIST, f"topic[{header.topic}] not exist"
            )
        entries = {}
        for q in range(info.read_queue_nums):
            entries[(header.topic, q)] = {
                "lastUpdateTimestamp": 0,
                "maxOffset": self.store.max_offset(header.topic, q),
                "minOffset": self.store.min_offset(header.topic, q),
            }
        return _ok(request, body=_mq_table(self.broker.name, "offsetTable", entries))

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
        return _ok(request, body=_mq_table(self.broker.name, "offsetTable", entries, tps=True))

    def consumed_by(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        """QUERY_TOPIC_CONSUME_BY_WHO: the groups with offsets of the topic, or consuming it."""
        topic = request.ext_fields.get("topic", "")
        groups = {
            g
            for g in self.store.offsets.groups()
            if any(t == topic for t, _ in self.store.offsets.offsets_of_group(g))
        }
        return _ok(request, body=_json({"groupList": sorted(groups)}))

    def consumer_connections(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        """GET_CONSUMER_CONNECTION_LIST: the connections whose heartbeats name the group."""
        group = request.ext_fields.get("consumerGroup", "")
        with self._clients_lock:
            clients = dict(self._consumers.get(group, {}))
        if not clients:
            return _answer(
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
        return _ok(request, body=_json(body))

    def view_message(self, request: RemotingCommand, channel: Channel) -> RemotingCommand | Reply:
        """VIEW_MESSAGE_BY_ID: the record at a CommitLog offset, as stored."""
        header = h.ViewMessageRequestHeader.from_ext_fields(request.ext_fields)
        try:
            msg = self.store.get_message(header.offset)
            view = self.store.record_view(header.offset, msg.store_size)
        except RocketSparkError as e:
            return _answer(
                request,
                ResponseCode.SYSTEM_ERROR,
                f"can not find message by the offset, {header.offset}: {e}",
            )
        return Reply(_ok(request), [view])

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
            return _answer(
                request,
                ResponseCode.QUERY_NOT_FOUND,
                "can not find message, maybe time range not correct",
                response_header,
            )
        return Reply(_ok(request, response_header), views)

    # -- clients -------------------------------------------------------------------------

    def heartbeat(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        try:
            data = loads_lenient(bytes(request.body or b"{}").decode("utf-8"))
            client_id = str(data.get("clientID") or channel.address)
            consumers = [str(c["groupName"]) for c in data.get("consumerDataSet") or ()]
            producers = [str(p["groupName"]) for p in data.get("producerDataSet") or ()]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            return _answer(request, ResponseCode.SYSTEM_ERROR, f"bad heartbeat: {e}")
        for group in consumers:
            self._ensure_group(group)
        with self._clients_lock:
            for table, groups in ((self._consumers, consumers), (self._producers, producers)):
                for group in groups:
                    table.setdefault(group, {})[client_id] = channel
        if "clientID" not in channel.attributes:
            channel.attributes["clientID"] = client_id
            channel.on_close(self._forget_client)
        return _ok(request)

    def _ensure_group(self, group: str) -> None:
        """A consumer group and its retry topic, made on its first heartbeat as a broker
        does (the retry topic: one queue)."""
        try:
            if self.store.groups.get(group) is None:
                self.store.groups.get_or_create(group)
            retry = retry_topic(group)
            if not self.store.has_topic(retry):
                self.store.create_topic(retry, 1)
        except RocketSparkError as e:
            log.warning("cannot make consumer group %s: %s", group, e)

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
            return _answer(
                request, ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {e}"
            )
        except RocketSparkError as e:
            return _answer(request, ResponseCode.SYSTEM_ERROR, str(e))
        return _ok(request)

    def lock_queues(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        """LOCK_BATCH_MQ: lock queues for a client of a group (orderly consumers); answers
        the queues it holds now (RocketMQ's RebalanceLockManager, 60 s without renewal)."""
        group, client, mqs = _lock_body(request)
        held = self.locks.lock(group, client, mqs)
        return _ok(request, body=_json({"lockOKMQSet": [_mq_json(mq) for mq in held]}))

    def unlock_queues(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        """UNLOCK_BATCH_MQ: give queue locks of a client of a group up."""
        group, client, mqs = _lock_body(request)
        self.locks.unlock(group, client, mqs)
        return _ok(request)

    def unregister_client(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        h.UnregisterClientRequestHeader.from_ext_fields(request.ext_fields)
        self._forget_client(channel)
        return _ok(request)

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
            return _answer(
                request,
                ResponseCode.SYSTEM_ERROR,
                f"no consumer for this group, {header.consumer_group}",
            )
        return _ok(request, body=_json({"consumerIdList": ids}))


MQ = tuple[str, str, int]  # topic, broker name, queue id


def _mq_json(mq: MQ) -> dict[str, Any]:
    return {"brokerName": mq[1], "queueId": mq[2], "topic": mq[0]}


def _lock_body(request: RemotingCommand) -> tuple[str, str, list[MQ]]:
    """LockBatchRequestBody / UnlockBatchRequestBody: group, client id, queues."""
    data = loads_lenient(bytes(request.body or b"{}").decode("utf-8"))
    mqs = [
        (str(q["topic"]), str(q["brokerName"]), int(q["queueId"])) for q in data.get("mqSet") or ()
    ]
    return str(data.get("consumerGroup") or ""), str(data.get("clientId") or ""), mqs


class QueueLocks:
    """Which client of a group holds each queue (RocketMQ's RebalanceLockManager): a lock
    lapses 60 s after its holder last locked it."""

    EXPIRY_SECONDS = 60.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple[str, MQ], tuple[str, float]] = {}

    def lock(self, group: str, client: str, mqs: list[MQ]) -> list[MQ]:
        now = time.monotonic()
        out = []
        with self._lock:
            for mq in mqs:
                holder = self._held.get((group, mq))
                if holder is None or holder[0] == client or now - holder[1] > self.EXPIRY_SECONDS:
                    self._held[(group, mq)] = (client, now)
                    out.append(mq)
        return out

    def held(self, group: str) -> list[MQ]:
        """The queues of ``group`` some client holds now."""
        now = time.monotonic()
        with self._lock:
            return sorted(
                mq
                for (g, mq), (_, at) in self._held.items()
                if g == group and now - at <= self.EXPIRY_SECONDS
            )

    def unlock(self, group: str, client: str, mqs: list[MQ]) -> None:
        with self._lock:
            for mq in mqs:
                holder = self._held.get((group, mq))
                if holder is not None and holder[0] == client:
                    del self._held[(group, mq)]


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
        _json({"brokerName": broker, "queueId": q, "topic": t}).decode()
        + ":"
        + _json(value).decode()
        for (t, q), value in entries.items()
    )
    extra = '"consumeTps":0.0,' if tps else ""
    return f'{{{extra}"{name}":{{{items}}}}}'.encode()


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


# --- long polling --------------------------------------------------------------------------


@dataclass(slots=True)
class _Held:
    request: RemotingCommand
    channel: Channel
    offset: int
    deadline: float


class PullHoldService:
    """Pulls that found nothing, parked until their queue moves or their time is up.

    One thread: it waits on the store's arrivals condition (puts of this
    process notify it) at most :data:`HOLD_CHECK_SECONDS`, and looks at the
    store's write sequence (bumped by every put, in any process); when either
    says something was put, each held queue's max offset is read and the pulls
    behind it run again (``wake(request, channel)``). Pulls past their deadline
    run again too, and answer PULL_NOT_FOUND.
    """

    def __init__(self, store: MessageStore, wake: Callable[[RemotingCommand, Channel], None]):
        self.store = store
        self._wake = wake
        self._lock = threading.Lock()
        self._held: dict[tuple[str, int], list[_Held]] = {}
        self._added = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def held(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._held.values())

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="rocketspark-serve-pull-hold", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._added.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            self._held.clear()

    def hold(
        self,
        request: RemotingCommand,
        channel: Channel,
        topic: str,
        queue_id: int,
        offset: int,
        timeout_ms: int,
    ) -> None:
        held = _Held(request, channel, offset, time.monotonic() + timeout_ms / 1000.0)
        with self._lock:
            self._held.setdefault((topic, queue_id), []).append(held)
        self._added.set()
        # A put between the pull's read and now would have been missed: look once more.
        try:
            moved = self.store.max_offset(topic, queue_id) > offset
        except RocketSparkError:
            moved = True
        if moved:
            self._release((topic, queue_id), lambda h: h is held)

    def _release(self, key: tuple[str, int], which: Callable[[_Held], bool]) -> None:
        with self._lock:
            entries = self._held.get(key)
            if not entries:
                return
            out = [e for e in entries if which(e)]
            if not out:
                return
            rest = [e for e in entries if not which(e)]
            if rest:
                self._held[key] = rest
            else:
                del self._held[key]
        for e in out:
            if not e.channel.closed:
                self._wake(e.request, e.channel)

    def _run(self) -> None:
        arrivals = self.store.reader.arrivals
        state = self.store.state
        seq = None
        while not self._stopping.is_set():
            with self._lock:
                empty = not self._held
            if empty:
                self._added.wait(1.0)
                self._added.clear()
                seq = None
                continue
            with arrivals:
                notified = arrivals.wait(HOLD_CHECK_SECONDS)
            if self._stopping.is_set():
                return
            try:
                now_seq = state.write_seq
            except (ValueError, RocketSparkError):  # the store closed under us
                return
            now = time.monotonic()
            with self._lock:
                keys = list(self._held)
            for key in keys:
                end: int | None = -1  # -1: not looked at (nothing was put)
                if notified or now_seq != seq:
                    try:
                        end = self.store.max_offset(*key)
                    except RocketSparkError:
                        end = None  # the topic went: answer them all
                self._release(key, _due(end, now))
            seq = now_seq


def _due(end: int | None, now: float) -> Callable[[_Held], bool]:
    """Which held pulls to run again: those behind ``end`` (the queue's new max offset;
    None: all, -1: none), past their deadline, or whose connection is gone."""

    def due(e: _Held) -> bool:
        return end is None or e.offset < end or e.deadline <= now or e.channel.closed

    return due


# --- starting ------------------------------------------------------------------------------


class Served:
    """A NameServer and a broker over one store, started by :func:`serve`."""

    def __init__(
        self,
        store: MessageStore,
        namesrv: RemotingServer,
        broker_server: RemotingServer,
        broker: BrokerProcessors,
    ):
        self.store = store
        self.namesrv = namesrv
        self.broker_server = broker_server
        self.broker = broker

    @property
    def namesrv_address(self) -> str:
        return self.namesrv.address

    @property
    def broker_address(self) -> str:
        return self.broker_server.address

    def stop(self) -> None:
        """Stop both ports and the hold service (the store stays open: its owner closes it)."""
        self.broker.stop()
        if self.namesrv is not self.broker_server:
            self.namesrv.stop()
        self.broker_server.stop()

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(
    store: MessageStore,
    *,
    host: str = "127.0.0.1",
    namesrv_port: int = 9876,
    broker_port: int = 10911,
    advertised_host: str | None = None,
) -> Served:
    """Start a NameServer on ``namesrv_port`` and a broker on ``broker_port`` over ``store``.

    Port 0 picks a free one; the same port for both serves both on one socket.
    Routes name the broker ``store.config.broker_name`` of cluster
    ``broker_cluster_name`` at ``advertised_host`` (default ``host``) and the broker
    port. A wildcard ``host`` (0.0.0.0, ::) needs ``advertised_host`` (ConfigError).
    """
    shown = advertised_host or host
    if is_wildcard(shown):
        raise ConfigError(
            f"the broker binds {host or 'every address'}: give the address clients reach it "
            f"at as advertised_host"
        )
    same = namesrv_port == broker_port and namesrv_port != 0
    broker_server = RemotingServer(host, broker_port, name="broker").start()
    try:
        namesrv = broker_server if same else RemotingServer(host, namesrv_port, name="namesrv")
        identity = BrokerIdentity(
            store.config.broker_cluster_name,
            store.config.broker_name,
            f"{shown}:{broker_server.port}",
        )
        if store.config.listen_port != broker_server.port:
            log.warning(
                "store %s writes msgIds naming port %d (listenPort), the broker listens on "
                "%d: clients that look a message up by its msgId will not find this broker",
                store.root,
                store.config.listen_port,
                broker_server.port,
            )
        broker = BrokerProcessors(store, identity)
        broker.register(broker_server)
        ns = NameServerProcessors(store, identity)
        queue = namesrv.work_queue("namesrv", threads=2, capacity=10_000)
        for code, processor in ns.table().items():
            namesrv.register(code, processor, queue)
        if not same:
            namesrv.start()
    except BaseException:
        if "broker" in locals():
            broker.stop()
        broker_server.stop()
        raise
    return Served(store, namesrv, broker_server, broker)

"""The broker: every broker request registered on its work queue, over one store (RocketMQ's
``BrokerController.registerProcessor``), and the delivery of delayed messages when due."""

from __future__ import annotations

import logging
import threading

from rocketspark.errors import StoreClosedError
from rocketspark.remoting.codes import RequestCode
from rocketspark.remoting.processors.admin import QUERY_TOPIC_CONSUME_BY_WHO, AdminProcessor
from rocketspark.remoting.processors.clients import ClientRegistry
from rocketspark.remoting.processors.common import BrokerIdentity
from rocketspark.remoting.processors.consumer_offsets import ConsumerOffsetProcessor
from rocketspark.remoting.processors.pull import PullProcessor
from rocketspark.remoting.processors.queue_locks import QueueLockProcessor
from rocketspark.remoting.processors.send import SendProcessor
from rocketspark.remoting.processors.transaction import TransactionProcessor
from rocketspark.remoting.server import RemotingServer
from rocketspark.store.message_store import MessageStore

log = logging.getLogger(__name__)

DELAY_CHECK_SECONDS = 0.1  # how often due delayed messages are delivered (RocketMQ: 100 ms)


class BrokerProcessors:
    """Sends, pulls, offsets, consumer offsets, heartbeats and topic creation over a store."""

    def __init__(self, store: MessageStore, broker: BrokerIdentity):
        self.store = store
        self.broker = broker
        self.clients = ClientRegistry(store)
        self.sends = SendProcessor(store)
        self.pulls = PullProcessor(store, self.clients)
        self.holds = self.pulls.holds
        self.transactions = TransactionProcessor(store, broker, self.clients)
        self.consumer_offsets = ConsumerOffsetProcessor(store)
        self.admin = AdminProcessor(store, broker)
        self.queue_locks = QueueLockProcessor()
        self.locks = self.queue_locks.locks
        self._stopping = threading.Event()
        self._delivery: threading.Thread | None = None

    def register(self, server: RemotingServer, *, threads: int = 4) -> None:
        """Register every broker request on ``server``, each group on its own work queue.

        Sends have one thread: puts take the store's write lock one at a time anyway,
        and one thread stores the requests of a connection in the order they came
        (pipelined async sends, an orderly producer's). END_TRANSACTION has a queue of
        its own (RocketMQ's endTransactionExecutor), so that a producer's commit or
        rollback, and its answers to check-backs, do not wait behind a backlog of sends;
        one thread, so that halves committed one after another (a sink's, pipelined)
        land in the queue in that order.
        """
        send = server.work_queue("send", threads=1, capacity=10_000)
        end_transaction = server.work_queue("end-transaction", threads=1, capacity=100_000)
        pull = server.work_queue("pull", threads=threads, capacity=100_000)
        admin = server.work_queue("admin", threads=2, capacity=10_000)
        heartbeat = server.work_queue("heartbeat", threads=1, capacity=50_000)
        self.pulls.queue = pull
        sends, pulls, tx, adm = self.sends, self.pulls, self.transactions, self.admin
        offsets, locks, clients = self.consumer_offsets, self.queue_locks, self.clients
        server.register(
            (
                RequestCode.SEND_MESSAGE,
                RequestCode.SEND_MESSAGE_V2,
                RequestCode.SEND_BATCH_MESSAGE,
            ),
            sends.send_then_warm,
            send,
        )
        self.store.warm_between_puts()  # send_then_warm prefills between puts
        # Pulls run on the reader thread (a pull never waits: one that finds nothing is
        # parked in the hold service); held pulls run again on the pull queue.
        server.register(
            (RequestCode.PULL_MESSAGE, RequestCode.LITE_PULL_MESSAGE), pulls.pull, pull, inline=True
        )
        server.register(RequestCode.END_TRANSACTION, tx.end_transaction, end_transaction)
        server.register(RequestCode.GET_MAX_OFFSET, adm.max_offset, admin)
        server.register(RequestCode.GET_MIN_OFFSET, adm.min_offset, admin)
        server.register(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, adm.search_offset, admin)
        server.register(RequestCode.QUERY_CONSUMER_OFFSET, offsets.query_consumer_offset, admin)
        server.register(RequestCode.UPDATE_CONSUMER_OFFSET, offsets.update_consumer_offset, admin)
        server.register(RequestCode.UPDATE_AND_CREATE_TOPIC, adm.create_topic, admin)
        server.register(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, adm.create_group, admin)
        server.register(RequestCode.GET_CONSUMER_LIST_BY_GROUP, clients.consumer_list, admin)
        server.register(RequestCode.GET_BROKER_RUNTIME_INFO, adm.runtime_info, admin)
        server.register(RequestCode.GET_TOPIC_STATS_INFO, adm.topic_stats, admin)
        server.register(RequestCode.GET_TOPIC_CONFIG, adm.topic_config, admin)
        server.register(QUERY_TOPIC_CONSUME_BY_WHO, adm.consumed_by, admin)
        server.register(RequestCode.GET_CONSUME_STATS, adm.consume_stats, admin)
        server.register(
            RequestCode.GET_CONSUMER_CONNECTION_LIST, clients.consumer_connections, admin
        )
        server.register(RequestCode.VIEW_MESSAGE_BY_ID, adm.view_message, admin)
        server.register(RequestCode.QUERY_MESSAGE, adm.query_message, admin)
        server.register(RequestCode.CONSUMER_SEND_MSG_BACK, sends.send_back, send)
        server.register(RequestCode.LOCK_BATCH_MQ, locks.lock_queues, admin)
        server.register(RequestCode.UNLOCK_BATCH_MQ, locks.unlock_queues, admin)
        server.register(RequestCode.HEART_BEAT, clients.heartbeat, heartbeat)
        server.register(RequestCode.UNREGISTER_CLIENT, clients.unregister_client, heartbeat)
        self.holds.start()
        self._delivery = threading.Thread(
            target=self._deliver_delayed, name="rocketspark-serve-delay", daemon=True
        )
        self._delivery.start()
        self.transactions.start()
        self.consumer_offsets.start()

    def stop(self) -> None:
        """Stop delivering delayed messages and the hold service (held pulls are dropped:
        their connections are closing), and write the consumer offsets kept in memory."""
        self._stopping.set()
        if self._delivery is not None:
            self._delivery.join()
        self.transactions.stop()
        self.holds.stop()
        self.consumer_offsets.stop()

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

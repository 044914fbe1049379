"""The parts of one open store, made in order and handed each the others it works with.

MessageStore (the facade) keeps them as its attributes; no part is given the facade.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from rocketspark.message.record import HostAddress
from rocketspark.store.appender import Appender
from rocketspark.store.checkpoint import StoreCheckpoint
from rocketspark.store.commit_log import CommitLog
from rocketspark.store.config import MessageStoreConfig
from rocketspark.store.consume_queue import ConsumeQueues
from rocketspark.store.disk_guard import DiskGuard
from rocketspark.store.dispatch import Dispatcher
from rocketspark.store.encoder import Encoder
from rocketspark.store.index_service import IndexService
from rocketspark.store.metadata import (
    ConsumerOffsetTable,
    DelayOffsetTable,
    SinkLedgerTable,
    SubscriptionGroupTable,
)
from rocketspark.store.reader import Reader
from rocketspark.store.recovery import Recovery
from rocketspark.store.schedule import ScheduleService
from rocketspark.store.send_back import SendBack
from rocketspark.store.store_state import StoreState
from rocketspark.store.topic_config import TopicConfigTable
from rocketspark.store.transaction import TransactionService


@dataclass(frozen=True)
class StoreParts:
    """The parts :func:`compose` made."""

    guard: DiskGuard
    commit_log: CommitLog
    checkpoint: StoreCheckpoint
    index: IndexService
    topics: TopicConfigTable
    offsets: ConsumerOffsetTable
    groups: SubscriptionGroupTable
    delay_offsets: DelayOffsetTable
    sink_ledger: SinkLedgerTable
    queues: ConsumeQueues
    encoder: Encoder
    dispatcher: Dispatcher
    recovery: Recovery
    appender: Appender
    transactions: TransactionService
    schedule: ScheduleService
    send_backs: SendBack
    reader: Reader


def compose(
    *,
    root: str,
    config: MessageStoreConfig,
    clock: Callable[[], int],
    state: StoreState,
    store_host: HostAddress,
    born_host: HostAddress,
    writable: bool,
    write_refused: Exception | None,
) -> StoreParts:
    """Make the store's parts and hand each the others it works with."""
    guard = DiskGuard(
        root,
        config.disk_space_warning_level_ratio,
        config.disk_space_clean_forcibly_ratio,
        config.disk_max_used_space_ratio,
    )
    # Warming pages ahead (CommitLog.warm) helps ASYNC_FLUSH ~25% here but makes
    # every SYNC_FLUSH msync slower (3.9k vs 6.6k puts/s, 4 producers, A/B).
    commit_log = CommitLog(
        root,
        config.mapped_file_size_commit_log,
        store_host,
        writable=writable,
        warm=config.flush_disk_type != "SYNC_FLUSH",
    )
    checkpoint = StoreCheckpoint(os.path.join(root, "checkpoint"))
    index = IndexService(
        os.path.join(root, "index"),
        hash_slot_num=config.max_hash_slot_num,
        index_num=config.max_index_num,
        writable=writable,
    )
    config_dir = os.path.join(root, "config")
    topics = TopicConfigTable(config_dir)
    offsets = ConsumerOffsetTable(config_dir)
    groups = SubscriptionGroupTable(config_dir, config.max_reconsume_times)
    delay_offsets = DelayOffsetTable(config_dir)
    sink_ledger = SinkLedgerTable(config_dir)
    queues = ConsumeQueues(root, config.mapped_file_size_consume_queue, topics, writable=writable)
    delay_ms = config.delay_levels_ms()
    encoder = Encoder(
        root=root,
        config=config,
        topics=topics,
        store_host=store_host,
        born_host=born_host,
        segment_size=commit_log.segment_size,
    )
    dispatcher = Dispatcher(
        root=root,
        commit_log=commit_log,
        index=index,
        queues=queues,
        delay_ms=delay_ms,
    )
    recovery = Recovery(
        root=root,
        config=config,
        state=state,
        commit_log=commit_log,
        checkpoint=checkpoint,
        index=index,
        queues=queues,
        topics=topics,
        redispatch=dispatcher.scan,
        queue_code=dispatcher.queue_code,
        gaps=dispatcher.gaps,
    )
    appender = Appender(
        root=root,
        config=config,
        state=state,
        commit_log=commit_log,
        index=index,
        checkpoint=checkpoint,
        queues=queues,
        dispatcher=dispatcher,
        guard=guard,
        write_refused=write_refused,
        clock=clock,
        store_host=store_host,
        born_host=born_host,
        damage_error=recovery.damage_error,
        rebuild_queues=recovery.rebuild_queues,
    )
    transactions = TransactionService(
        appender=appender,
        encoder=encoder,
        queues=queues,
        commit_log=commit_log,
        topics=topics,
        offsets=offsets,
        clock=clock,
        born_host=born_host,
        timeout_ms=config.transaction_timeout,
        max_checks=config.transaction_check_max,
    )
    schedule = ScheduleService(
        appender=appender,
        encoder=encoder,
        queues=queues,
        commit_log=commit_log,
        topics=topics,
        delay_offsets=delay_offsets,
        clock=clock,
        levels=len(delay_ms),
    )
    send_backs = SendBack(
        encoder=encoder,
        appender=appender,
        groups=groups,
        delay_ms=delay_ms,
        clock=clock,
    )
    reader = Reader(config, commit_log, queues, index, state, appender.arrivals)
    return StoreParts(
        guard=guard,
        commit_log=commit_log,
        checkpoint=checkpoint,
        index=index,
        topics=topics,
        offsets=offsets,
        groups=groups,
        delay_offsets=delay_offsets,
        sink_ledger=sink_ledger,
        queues=queues,
        encoder=encoder,
        dispatcher=dispatcher,
        recovery=recovery,
        appender=appender,
        transactions=transactions,
        schedule=schedule,
        send_backs=send_backs,
        reader=reader,
    )

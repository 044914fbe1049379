"""The parts of one open store, made in order and handed each the others it works with.

:func:`open_store` opens a store directory (its lock, geometry, state file and
recovery) around :func:`compose`, which makes the parts; :meth:`OpenStore.close`
shuts them down. MessageStore (the facade) keeps the parts as its attributes; no
part is given the facade.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rocketspark.errors import DiskFullError, StoreLockedError, StorePathError
from rocketspark.message.record import HostAddress
from rocketspark.store import layout
from rocketspark.store.appender import Appender
from rocketspark.store.checkpoint import StoreCheckpoint
from rocketspark.store.clean import CleanService
from rocketspark.store.commit_log import CommitLog
from rocketspark.store.config import MessageStoreConfig
from rocketspark.store.consume_queue import ConsumeQueues
from rocketspark.store.disk_guard import DiskGuard, reserve_sparse_files
from rocketspark.store.dispatch import Dispatcher
from rocketspark.store.encoder import Encoder
from rocketspark.store.group_offsets import GroupOffsets
from rocketspark.store.index_service import IndexService
from rocketspark.store.metadata import (
    ConsumerOffsetTable,
    DelayOffsetTable,
    SinkLedgerTable,
    SubscriptionGroupTable,
)
from rocketspark.store.reader import Reader
from rocketspark.store.recovery import Recovery, RecoveryReport
from rocketspark.store.schedule import ScheduleService
from rocketspark.store.send_back import SendBack
from rocketspark.store.store_state import ABORT_FILE, StoreLock, StoreState
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
    group_offsets: GroupOffsets
    clean: CleanService


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
        group_offsets=GroupOffsets(root, offsets, topics, queues, commit_log),
        clean=CleanService(
            appender=appender,
            state=state,
            commit_log=commit_log,
            queues=queues,
            index=index,
            root=root,
            reserved_hours=config.file_reserved_time,
        ),
    )


@dataclass(frozen=True)
class OpenStore:
    """A store directory :func:`open_store` opened: its settled config, lock, state, parts."""

    root: str
    config: MessageStoreConfig  # with the store's own geometry
    lock: StoreLock
    state: StoreState
    store_host: HostAddress
    born_host: HostAddress
    parts: StoreParts
    recovery_report: RecoveryReport | None  # None unless this process recovered the store
    counted: bool  # this holder must close() for its exit to count as clean

    def close(self) -> None:
        """Flush and close the parts; the last process to close shuts the store down cleanly."""
        parts, state, lock = self.parts, self.state, self.lock
        parts.appender.stop_flusher()
        try:
            parts.appender.flush()
            if self.counted:
                with parts.appender.write_lock:
                    state.holders = max(0, state.holders - 1)
            # A store deleted (and maybe made again) under this instance: its files are
            # gone from the directory, and what is at the path now is another store's,
            # which a clean shutdown by path (the abort file) must not touch.
            gone = lock.replaced()
            last = lock.release()
            if last and gone:
                lock.release_final()
            elif last:
                try:
                    state.flush()
                    parts.checkpoint.flush()
                    abort = os.path.join(self.root, ABORT_FILE)
                    if os.path.exists(abort):
                        os.unlink(abort)
                finally:
                    lock.release_final()
        finally:
            parts.queues.close()
            parts.commit_log.close()
            parts.index.close()
            parts.checkpoint.close()
            state.close()
            parts.appender.close()


def open_store(
    config: MessageStoreConfig,
    *,
    clock: Callable[[], int],
    create: bool | None,
    explicit: Mapping[str, str] | None,
    truncate_at: int | None,
    exit_without_close: bool,
    full_recovery: bool,
) -> OpenStore:
    """Open the store directory ``config`` names and make its parts (MessageStore.open's
    work, whose docstring says what the keywords do).

    The directory is checked (and made) before the store lock is taken; the first
    process to take it checks the files' sizes, reserves sparse files and recovers
    the store, then shares the lock. On failure the lock is let go.
    """
    root = os.path.abspath(config.store_path_root_dir)
    if explicit is None:
        explicit = layout.explicit_geometry(config)
    layout.prepare_directory(root, config, explicit, create)
    lock = StoreLock(root)
    try:
        first = lock.acquire()
    except PermissionError as exc:
        raise StorePathError(
            f"cannot open the store's lock file {exc.filename}: {exc.strerror}", path=root
        ) from exc
    try:
        geometry = layout.settle_geometry(root, config, explicit)
        config = dataclasses.replace(config, **geometry.as_config())
        write_refused = None
        if first:  # nobody else has the store open: nothing is being made or grown
            segments = layout.check_file_sizes(root, geometry)
            # Sparse files (an older store's) get their blocks now; when some cannot
            # (a full disk), files are mapped read-only and writes refused until
            # reopened.
            write_refused = reserve_sparse_files(root, segments)
        store_host = HostAddress.parse(config.broker_ip1, config.listen_port)
        born_host = HostAddress(store_host.ip, os.getpid() & 0xFFFF)
        state = StoreState(root)
        state.check_format(first)
        parts = compose(
            root=root,
            config=config,
            clock=clock,
            state=state,
            store_host=store_host,
            born_host=born_host,
            writable=write_refused is None,
            write_refused=write_refused,
        )
        report = None
        if first:
            report = _recover(root, parts.recovery, write_refused, truncate_at, full_recovery)
            lock.downgrade()
        elif truncate_at is not None:
            raise StoreLockedError(
                f"store {root}: truncate_at needs the store to itself (recovery "
                "runs in the first process to open it); close the other processes"
            )
        # A holder that must close() for its exit to count as clean (see close).
        counted = not exit_without_close
        if counted:
            with parts.appender.write_lock:
                state.holders = state.holders + 1
        if config.flush_disk_type == "ASYNC_FLUSH":
            parts.appender.start_flusher(config.flush_interval_commit_log / 1000.0)
    except BaseException:
        lock.release()
        lock.release_final()
        raise
    return OpenStore(root, config, lock, state, store_host, born_host, parts, report, counted)


def _recover(
    root: str,
    recovery: Recovery,
    write_refused: Exception | None,
    truncate_at: int | None,
    full: bool,
) -> RecoveryReport:
    """Recover (the first opener, holding the lock exclusively) and adopt unlisted topics."""
    try:
        report = recovery.recover(truncate_at, full=full)
    except Exception as exc:
        if write_refused is None:
            raise
        raise DiskFullError(
            f"store {root} needs recovery, which cannot write: {write_refused}"
        ) from exc
    recovery.adopt_unlisted_topics()
    return report

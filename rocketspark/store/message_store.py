"""The MessageStore facade: put, pull, offsets, retry and dead letters, recovery.

It ties the CommitLog, the ConsumeQueues, the IndexFiles, the checkpoint and
the config/ JSON files of one store directory together, and lets several
processes open the same directory at once (see ``store_state``).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import numbers
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rocketspark.errors import (
    ConfigError,
    CorruptRecordError,
    DiskFullError,
    FlushTimeoutError,
    InvalidMessageError,
    OffsetOutOfRangeError,
    StoreClosedError,
    StoreDamagedError,
    StoreLockedError,
    StorePathError,
    TopicShrinkError,
    UnknownTopicError,
)
from rocketspark.message.model import (
    DLQ_GROUP_TOPIC_PREFIX,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    RETRY_GROUP_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    Message,
    MessageExt,
    SysFlag,
    TopicInfo,
    check_extra_properties,
    check_int,
    dlq_topic,
    retry_topic,
    transaction_type,
    user_properties,
)
from rocketspark.message.names import SubscriptionExpression, validate_group, validate_topic
from rocketspark.message.record import (
    RECORD_INVALID,
    HostAddress,
    RecordCheck,
    body_crc,
    check_record,
)
from rocketspark.message.results import (
    PullResult,
    PullStatus,
    PutResult,
    PutResults,
    no_results,
)
from rocketspark.store import layout
from rocketspark.store.appender import Appender
from rocketspark.store.checkpoint import StoreCheckpoint
from rocketspark.store.commit_log import (
    MAGIC_PREFIX,
    ColumnBatch,
    CommitLog,
    PreparedRecord,
    data_ranges,
)
from rocketspark.store.config import MessageStoreConfig, canonical_key
from rocketspark.store.consume_queue import CQ_ENTRY_DTYPE, ConsumeQueue
from rocketspark.store.disk_guard import DiskGuard, reserve_sparse_files
from rocketspark.store.dispatch import DirtyQueues, Dispatcher
from rocketspark.store.encoder import Columns, Encoder
from rocketspark.store.index_service import IndexService
from rocketspark.store.metadata import (
    ConsumerOffsetTable,
    DelayOffsetTable,
    SinkLedgerTable,
    SubscriptionGroupTable,
    TopicConfigTable,
)
from rocketspark.store.schedule import ScheduleService
from rocketspark.store.store_state import (
    ABORT_FILE,
    STATE_FORMAT_VERSION,
    StoreLock,
    StoreState,
)
from rocketspark.store.transaction import TransactionService

log = logging.getLogger(__name__)

DLQ_NUMS_PER_GROUP = 1
RETRY_NUMS_PER_GROUP = 1
# Entries read from a ConsumeQueue per pull when a tag filter skips many (RocketMQ reads
# up to 16000 bytes of ConsumeQueue, i.e. 800 entries).
MAX_FILTER_SCAN = 800
Clock = Callable[[], int]


def system_clock() -> int:
    """Return the wall clock in milliseconds."""
    return time.time_ns() // 1_000_000


class MessageStore:
    """A RocketMQ message store in one directory, shared by any number of processes."""

    def __init__(
        self,
        config: MessageStoreConfig,
        *,
        clock: Clock = system_clock,
        create: bool | None = None,
        explicit: Mapping[str, str] | None = None,
        truncate_at: int | None = None,
        exit_without_close: bool = False,
        full_recovery: bool = False,
    ):
        """Open the store ``config`` names; see :meth:`open` for the keywords.

        ``explicit`` maps the broker.conf keys the caller set on purpose to
        where (for messages); a geometry value among them that differs from
        the store's is refused. None: every geometry value that differs from
        the built-in default counts as set on purpose.
        """
        self.config = config
        self.root = os.path.abspath(config.store_path_root_dir)
        self.clock = clock
        self._closed = True
        if explicit is None:
            defaults = MessageStoreConfig()
            explicit = {
                key: "the given config"
                for key, field in layout.GEOMETRY_KEYS.items()
                if getattr(config, field) != getattr(defaults, field)
            }
        # Everything that can refuse the open runs before the first file is written.
        kind = layout.directory_kind(self.root)
        if kind == "foreign" and create is not True:
            raise StorePathError(layout.describe_foreign(self.root), path=self.root)
        if kind in ("absent", "empty") and create is False:
            raise StorePathError(f"there is no store at {self.root}", path=self.root)
        if kind != "absent":
            layout.check_writable(self.root)
            layout.read_geometry(self.root, config, explicit)
        else:
            layout.check_creatable(self.root)
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as exc:  # e.g. a dangling symbolic link among its parents
            raise StorePathError(
                f"cannot create store directory {self.root}: {exc.strerror} ({exc.filename})",
                path=self.root,
            ) from exc
        self._lock = StoreLock(self.root)
        try:
            first = self._lock.acquire()
        except PermissionError as exc:
            raise StorePathError(
                f"cannot open the store's lock file {exc.filename}: {exc.strerror}", path=self.root
            ) from exc
        try:
            # Under the lock: another process may have made the store meanwhile.
            geometry = layout.read_geometry(self.root, config, explicit)
            if not geometry.recorded and not layout.record_geometry(self.root, geometry):
                geometry = layout.read_geometry(self.root, config, explicit)
            config = dataclasses.replace(config, **geometry.as_config())
            self.config = config
            self._write_refused = None
            if first:  # nobody else has the store open: nothing is being made or grown
                segments = layout.check_file_sizes(self.root, geometry)
                # Sparse files (an older store's) get their blocks now; when some cannot
                # (a full disk), files are mapped read-only and writes refused until
                # reopened.
                self._write_refused = reserve_sparse_files(self.root, segments)
            self._files_writable = self._write_refused is None
            self._guard = DiskGuard(
                self.root,
                config.disk_space_warning_level_ratio,
                config.disk_space_clean_forcibly_ratio,
                config.disk_max_used_space_ratio,
            )
            self.store_host = HostAddress.parse(config.broker_ip1, config.listen_port)
            self.born_host = HostAddress(self.store_host.ip, os.getpid() & 0xFFFF)
            self.state = StoreState(self.root)
            if not first and self.state.format_version not in (None, STATE_FORMAT_VERSION):
                raise StoreLockedError(
                    f"store {self.root} is open in a process using state format "
                    f"{self.state.format_version}; this rocketspark uses {STATE_FORMAT_VERSION}"
                )
            if first and self.state.valid and self.state.format_version > STATE_FORMAT_VERSION:
                raise StoreLockedError(
                    f"store {self.root} was written by a newer rocketspark (state format "
                    f"{self.state.format_version} > {STATE_FORMAT_VERSION})"
                )
            # Warming pages ahead (CommitLog.warm) helps ASYNC_FLUSH ~25% here but makes
            # every SYNC_FLUSH msync slower (3.9k vs 6.6k puts/s, 4 producers, A/B).
            self.commit_log = CommitLog(
                self.root,
                config.mapped_file_size_commit_log,
                self.store_host,
                writable=self._files_writable,
                warm=config.flush_disk_type != "SYNC_FLUSH",
            )
            self.checkpoint = StoreCheckpoint(os.path.join(self.root, "checkpoint"))
            self.index = IndexService(
                os.path.join(self.root, "index"),
                hash_slot_num=config.max_hash_slot_num,
                index_num=config.max_index_num,
                writable=self._files_writable,
            )
            config_dir = os.path.join(self.root, "config")
            self.topics = TopicConfigTable(config_dir)
            self.offsets = ConsumerOffsetTable(config_dir)
            self.groups = SubscriptionGroupTable(config_dir, config.max_reconsume_times)
            self.delay_offsets = DelayOffsetTable(config_dir)
            self.sink_ledger = SinkLedgerTable(config_dir)
            self._queues: dict[tuple[str, int], ConsumeQueue] = {}
            self._queues_guard = threading.Lock()
            self._dirty = DirtyQueues()
            self._delay_ms = config.delay_levels_ms()
            self.encoder = Encoder(
                root=self.root,
                config=config,
                topics=self.topics,
                store_host=self.store_host,
                born_host=self.born_host,
                segment_size=self.commit_log.segment_size,
            )
            self._ids = self.encoder.ids  # (the transaction service's)
            self.recovery_report: RecoveryReport | None = None
            self._transactions = TransactionService(self)
            self.dispatcher = Dispatcher(
                root=self.root,
                commit_log=self.commit_log,
                index=self.index,
                queue=self._cq,
                opened=self._queues,
                may_have_queue=self._may_have_queue,
                dirty=self._dirty,
                delay_ms=self._delay_ms,
            )
            self.appender = Appender(
                root=self.root,
                config=config,
                state=self.state,
                commit_log=self.commit_log,
                index=self.index,
                checkpoint=self.checkpoint,
                queue=self._cq,
                opened=self._queues,
                dispatcher=self.dispatcher,
                dirty=self._dirty,
                guard=self._guard,
                write_refused=self._write_refused,
                clock=clock,
                store_host=self.store_host,
                born_host=self.born_host,
                damage_error=self._damage_error,
                rebuild_queues=self._rebuild_queues,
            )
            self._write_lock = self.appender.write_lock  # (the transaction service's)
            self._schedule = ScheduleService(
                appender=self.appender,
                encoder=self.encoder,
                queue=self._cq,
                commit_log=self.commit_log,
                topics=self.topics,
                delay_offsets=self.delay_offsets,
                clock=clock,
                levels=len(self._delay_ms),
            )
            self._arrivals = self.appender.arrivals
            if first:
                try:
                    self.recovery_report = self._recover(truncate_at, full=full_recovery)
                except Exception as exc:
                    if self._write_refused is None:
                        raise
                    raise DiskFullError(
                        f"store {self.root} needs recovery, which cannot "
                        f"write: {self._write_refused}"
                    ) from exc
                self._adopt_unlisted_topics()
                self._lock.downgrade()
            elif truncate_at is not None:
                raise StoreLockedError(
                    f"store {self.root}: truncate_at needs the store to itself (recovery "
                    "runs in the first process to open it); close the other processes"
                )
            # A holder that must close() for its exit to count as clean (see close).
            self._counted = not exit_without_close
            if self._counted:
                with self.appender.write_lock:
                    self.state.holders = self.state.holders + 1
            self._closed = False
            if config.flush_disk_type == "ASYNC_FLUSH":
                self.appender.start_flusher(config.flush_interval_commit_log / 1000.0)
        except BaseException:
            self._lock.release()
            self._lock.release_final()
            raise

    # -- opening and closing -------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        config_file: str | None = None,
        clock: Clock = system_clock,
        create: bool | None = None,
        truncate_at: int | None = None,
        exit_without_close: bool = False,
        full_recovery: bool = False,
        **overrides: object,
    ) -> MessageStore:
        """Open (creating if needed) the store at ``path``.

        ``overrides`` are broker.conf properties, in RocketMQ's camelCase or in
        snake_case (``flushDiskType="SYNC_FLUSH"``, ``mapped_file_size_commit_log=...``).
        Without ``path`` the storePathRootDir of ``config_file`` (default
        conf/broker.conf, if present) is used.

        A new store is made only where no directory is or an empty one
        (``create=False``: never; ``create=True``: also in a directory with
        other content); any other directory that is not a store is refused
        (StorePathError) before a file is written. An existing store keeps
        its geometry (segment and index sizes) whatever broker.conf says; a
        geometry override that differs from it is refused with a ConfigError.

        A store whose CommitLog is damaged where valid records follow opens for
        reading only (writes raise StoreDamagedError, see ``_recover``);
        ``truncate_at`` (the damage offset it reports) discards everything from
        there on. ``exit_without_close``: this process may end without
        :meth:`close` (Spark's Python workers do); its exit then counts as clean
        unless it left an append, a dispatch or a schedule step unfinished.
        Otherwise a process that ends without close() has crashed, and the next
        opener reports an abnormal exit. ``full_recovery`` (``store recover``)
        verifies the whole CommitLog and every ConsumeQueue file, not only what
        the last run may have left unfinished.
        """
        if path is not None:
            if not isinstance(path, (str, os.PathLike)):
                raise ConfigError(f"the store path must be a str or os.PathLike, got {path!r}")
            for key in overrides:
                if canonical_key(key) == "storePathRootDir":
                    raise ConfigError(f"the store path is given twice, as path and as {key}")
            overrides["store_path_root_dir"] = os.fspath(path)
        config = MessageStoreConfig.load(config_file, **overrides)
        explicit = {canonical_key(key) or key: f"keyword argument {key}" for key in overrides}
        return cls(
            config,
            clock=clock,
            create=create,
            explicit=explicit,
            truncate_at=truncate_at,
            exit_without_close=exit_without_close,
            full_recovery=full_recovery,
        )

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """Has :meth:`close` been called?"""
        return self._closed

    def replaced(self) -> bool:
        """Has this store been deleted, or another store put at its path, while open?

        The instance then reads and writes files no longer in the directory
        (what it writes is lost with them): close it and open the path again.
        """
        return not self._closed and self._lock.replaced()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.root} is closed")

    def close(self) -> None:
        """Flush and close; the last process to close shuts the store down cleanly."""
        if self._closed:
            return
        self._closed = True
        self.appender.stop_flusher()
        try:
            self.flush()
            if self._counted:
                with self.appender.write_lock:
                    self.state.holders = max(0, self.state.holders - 1)
            # A store deleted (and maybe made again) under this instance: its files are
            # gone from the directory, and what is at the path now is another store's,
            # which a clean shutdown by path (the abort file) must not touch.
            gone = self._lock.replaced()
            last = self._lock.release()
            if last and gone:
                self._lock.release_final()
            elif last:
                try:
                    self.state.flush()
                    self.checkpoint.flush()
                    abort = os.path.join(self.root, ABORT_FILE)
                    if os.path.exists(abort):
                        os.unlink(abort)
                finally:
                    self._lock.release_final()
        finally:
            for q in self._queues.values():
                q.close()
            self.commit_log.close()
            self.index.close()
            self.checkpoint.close()
            self.state.close()
            self.appender.close()

    # -- topics ----------------------------------------------------------------------

    def create_topic(
        self,
        topic: str,
        queues: int | None = None,
        *,
        order: bool = False,
        perm: int = 6,
        force: bool = False,
    ) -> TopicInfo:
        """Create ``topic`` with ``queues`` queues (defaultTopicQueueNums if None).

        Creating an existing topic with the same queue count is a no-op; more
        queues grow it. Fewer queues would hide the messages of the queues
        dropped (they stay on disk, unread): refused with TopicShrinkError
        where those queues hold messages, unless ``force``.
        """
        self._check_open()
        validate_topic(topic)
        n = self.config.default_topic_queue_nums if queues is None else queues
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0 or n > 1024:
            raise ConfigError(f"queue count of topic {topic!r} must be 1..1024, got {queues!r}")
        existing = self.topics.get(topic)
        if existing is not None and not force:
            current = max(
                int(existing.get("readQueueNums", 0)), int(existing.get("writeQueueNums", 0))
            )
            holding = [q for q in range(n, current) if self._queue_holds_messages(topic, q)]
            if n < current:
                holding = sorted(set(holding) | self._queues_awaited(topic, n))
            if holding:
                raise TopicShrinkError(
                    f"topic {topic!r} has {current} queues; {n} would hide the messages of "
                    f"queue(s) {', '.join(map(str, holding))}, which hold messages (or "
                    "delayed or half messages are bound for). Pass "
                    "force=True (rocketspark topic create --force) to shrink it anyway"
                )
        self.topics.create(topic, n, n, perm=perm, order=order)
        self.encoder.forget_topics()
        return self.topic(topic)

    def topic(self, topic: str) -> TopicInfo:
        """Return the configuration of ``topic``; raise UnknownTopicError if absent."""
        cfg = self.topics.get(topic)
        if cfg is None:
            raise UnknownTopicError(f"topic {topic!r} does not exist in store {self.root}")
        return TopicInfo(
            cfg["topicName"],
            int(cfg["readQueueNums"]),
            int(cfg["writeQueueNums"]),
            int(cfg.get("perm", 6)),
            bool(cfg.get("order", False)),
        )

    def has_topic(self, topic: str) -> bool:
        return self.topics.get(topic) is not None

    def list_topics(self) -> list[TopicInfo]:
        """Return every topic, sorted by name."""
        return [self.topic(name) for name in sorted(self.topics.names())]

    def _queue_holds_messages(self, topic: str, queue_id: int) -> bool:
        if not os.path.isdir(os.path.join(self.root, "consumequeue", topic, str(queue_id))):
            return False
        q = self._cq(topic, queue_id)
        return q.max_offset() > q.min_offset(self.commit_log.min_offset)

    def _queues_awaited(self, topic: str, first: int) -> set[int]:
        """Queues from ``first`` on of ``topic`` that a delayed message not yet due or an
        open half message is bound for (its REAL_QID): delivered there after a shrink, it
        would be in a queue no consumer reads."""
        found: set[int] = set()

        def note(props: Mapping[str, str]) -> None:
            if props.get(PROPERTY_REAL_TOPIC) == topic:
                q = props.get(PROPERTY_REAL_QUEUE_ID, "0")
                if q.isdigit() and int(q) >= first:
                    found.add(int(q))

        if self.has_topic(SCHEDULE_TOPIC):
            for level in range(1, len(self._delay_ms) + 1):
                if not self._queue_holds_messages(SCHEDULE_TOPIC, level - 1):
                    continue
                cq = self._cq(SCHEDULE_TOPIC, level - 1)
                start, end = self._schedule.start_offset(level), cq.max_offset()
                while start < end:
                    entries = cq.read(start, min(end - start, 4096))
                    if not len(entries):
                        break
                    for phy in entries["offset"].tolist():
                        note(self.commit_log.read(int(phy)).properties)
                    start += len(entries)
        if self.has_topic(TRANS_HALF_TOPIC):
            for half in self.open_transactions():
                note(half.properties)
        return found

    def _ensure_system_topic(self, topic: str, queues: int) -> None:
        self.encoder.ensure_system_topic(topic, queues)

    # -- queues ----------------------------------------------------------------------

    def _cq(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        q = self._queues.get(key)
        if q is None:
            with self._queues_guard:
                q = self._queues.get(key)
                if q is None:
                    q = ConsumeQueue(
                        self.root,
                        topic,
                        queue_id,
                        self.config.mapped_file_size_consume_queue,
                        writable=self._files_writable,
                    )
                    self._queues[key] = q
        return q

    def _existing_cq(self, topic: str, queue_id: int) -> ConsumeQueue:
        _check_queue(self.topic(topic), queue_id)
        return self._cq(topic, queue_id)

    def max_offset(self, topic: str, queue_id: int) -> int:
        """Return the next offset to be written in the queue (its message count so far)."""
        self._check_open()
        return self._existing_cq(topic, queue_id).max_offset()

    def min_offset(self, topic: str, queue_id: int) -> int:
        """Return the first offset still readable in the queue."""
        self._check_open()
        return self._existing_cq(topic, queue_id).min_offset(self.commit_log.min_offset)

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """Return the first offset whose store timestamp is >= ``timestamp_ms``.

        Returns the max offset when every message is older, the min offset
        when every message is newer.
        """
        self._check_open()
        cq = self._existing_cq(topic, queue_id)
        lo = cq.min_offset(self.commit_log.min_offset)
        hi = cq.max_offset()
        while lo < hi:
            mid = (lo + hi) // 2
            e = cq.entry(mid)
            if e is None:
                hi = mid
                continue
            if self.commit_log.store_timestamp(e[0]) < timestamp_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # -- put -------------------------------------------------------------------------

    def put(self, message: Message) -> PutResult:
        """Store one message; returns once it is in the page cache (or on disk, SYNC_FLUSH)."""
        if self.encoder.columnar and isinstance(message, Message) and not message.delay_level:
            return self._put_one(message)
        return self.put_batch((message,))[0]

    def _put_one(self, msg: Message) -> PutResult:
        """put() of one message: the columnar path's bytes without its batch machinery."""
        self._check_open()
        now = self.clock()
        encoded = self.encoder.one(msg, now)
        with self.appender.locked() as append:
            result = append.one(*encoded)
        return self.appender.after([result])[0]

    def put_batch(self, messages: Sequence[Message] | Iterable[Message]) -> Sequence[PutResult]:
        """Store several messages under one lock and one flush; all or none are validated.

        Returns one PutResult per message, in order: a list, or (for the
        common case of messages without a delay level) a lazy
        :class:`PutResults` sequence that builds each PutResult when asked.
        """
        self._check_open()
        if not isinstance(messages, (list, tuple)):
            messages = list(messages)
        if not messages:
            return []
        if not all(map(isinstance, messages, itertools.repeat(Message))):
            # a Message checked its fields when it was made; anything else did not
            i = next(i for i, m in enumerate(messages) if not isinstance(m, Message))
            raise InvalidMessageError(
                f"message {i}: expected a rocketspark Message, got {type(messages[i]).__name__}"
            )
        now = self.clock()
        if not any(m.delay_level for m in messages):
            if self.encoder.columnar:
                return self._put_columns(Columns.of_messages(messages), now)
        else:
            for i, m in enumerate(messages):
                if m.delay_level:
                    self.encoder.check_delay_level(
                        m.delay_level, f"message {i} (topic {m.topic!r}): "
                    )
        ids = self.encoder.ids.next_ids(len(messages), now)
        prepared = [self.encoder.message(m, now, uid) for m, uid in zip(messages, ids)]
        return self._append(prepared, now)

    def put_columns(
        self,
        bodies: Sequence[bytes | str],
        *,
        topic: str | None = None,
        topics: Sequence[str | None] | None = None,
        tags: Sequence[str | None] | None = None,
        keys: Sequence[str | Sequence[str] | None] | None = None,
        properties: Sequence[Mapping[str, str] | Sequence[tuple[str, str]] | None] | None = None,
        queue_ids: Sequence[int | None] | None = None,
        sharding_keys: Sequence[str | None] | None = None,
    ) -> PutResults:
        """Store messages given column by column: the fast path for Arrow / Spark data.

        ``bodies`` has one entry per message; every other column is optional
        and, when given, has the same length (None in a row: not set).
        ``topic`` is the topic of rows whose ``topics`` entry is None. ``keys``
        entries are one string (keys separated by spaces, as RocketMQ stores
        them) or a sequence of keys; ``properties`` entries a mapping or a list
        of (name, value) pairs. Queue choice and validation are those of
        :meth:`put_batch`; nothing is written when any row is invalid.
        """
        self._check_open()
        cols = Columns(bodies, topic, topics, tags, keys, properties, queue_ids, sharding_keys)
        if not len(bodies):
            return no_results(self.store_host)
        if not self.encoder.columnar:
            return self.put_batch(cols.messages())  # type: ignore[return-value]
        return self._put_columns(cols, self.clock())

    def prepare_columns(
        self,
        bodies: Sequence[bytes | str],
        *,
        producer_group: str,
        extra_properties: Mapping[str, str] | None = None,
        **columns: Any,
    ) -> PutResults:
        """Store half messages given column by column (see :meth:`put_columns`).

        The halves stay invisible until :meth:`commit_transaction`; their
        ``queue_offset`` values (consecutive) identify them.
        """
        self._check_open()
        validate_group(producer_group)
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
        if not len(bodies):
            return no_results(self.store_host)
        self.encoder.ensure_system_topic(TRANS_HALF_TOPIC, 1)
        self.encoder.ensure_system_topic(TRANS_OP_HALF_TOPIC, 1)
        check_extra_properties(extra_properties)
        extra = "".join(f"{k}\x01{v}\x02" for k, v in (extra_properties or {}).items())
        if not self.encoder.columnar:
            return self.prepare_batch(
                cols.messages(),
                producer_group=producer_group,
                properties=dict(extra_properties or {}),
            )  # type: ignore
        return self._put_columns(cols, self.clock(), half=(producer_group, extra))

    def _put_columns(
        self, cols: Columns, now: int, half: tuple[str, str] | None = None
    ) -> PutResults:
        """The columnar put (no delay, IPv4 hosts): encoded, then one append."""
        batch, uniq_prefix, uniq_start, uniq_given, keyed, key_strings = self.encoder.columns(
            cols, now, half
        )
        with self.appender.locked() as append:
            results, _ = append.columns(
                batch, now, uniq_prefix, uniq_start, uniq_given, keyed, key_strings
            )
        return self.appender.after(results)  # type: ignore[no-any-return]

    def _topic_info(self, topic: str) -> tuple[int, bytes, int]:
        """(write queues, TOPICLENGTH+TOPIC bytes, magic) for the transaction service."""
        info = self.encoder.topic_info(topic)
        return info.write_queues, info.topic_field, info.magic

    def _append_columns_then_locked(
        self,
        batch: ColumnBatch,
        then: Sequence[PreparedRecord],
        now: int,
        uniq_prefix: str,
        uniq_start: int,
        uniq_given: dict[int, str],
        keyed: list[int],
        key_strings: list[str],
        uniq_hashes: np.ndarray | None = None,
    ) -> tuple[PutResults, list[PutResult]]:
        """Append.columns for the transaction service (the caller holds the write lock)."""
        return self.appender.locked().columns(
            batch,
            now,
            uniq_prefix,
            uniq_start,
            uniq_given,
            keyed,
            key_strings,
            then=then,
            uniq_hashes=uniq_hashes,
        )

    def _prepare(
        self,
        msg: Message,
        now: int,
        uniq: str,
        *,
        sys_flag: int = 0,
        prepared_offset: int = 0,
        check_topic: bool = True,
    ) -> PreparedRecord:
        return self.encoder.message(
            msg,
            now,
            uniq,
            sys_flag=sys_flag,
            prepared_offset=prepared_offset,
            check_topic=check_topic,
        )

    def _prepare_raw(self, *args: Any, **kwargs: Any) -> PreparedRecord:
        return self.encoder.record(*args, **kwargs)

    def _append(self, prepared: Sequence[PreparedRecord], now: int) -> list[PutResult]:
        with self.appender.locked() as append:
            results = append.records(prepared, now)
        return self.appender.after(results)  # type: ignore[no-any-return]

    # The transaction service's way to the appender (until it is given the appender).

    def _append_locked(self, prepared: Sequence[PreparedRecord], now: int) -> list[PutResult]:
        return self.appender.locked().records(prepared, now)

    def _after_append(self, results: Any) -> Any:
        return self.appender.after(results)

    def _next_queue_offset(self, topic: str, queue_id: int) -> int:
        return self.appender.next_queue_offset(topic, queue_id)

    def _sync_with_writers(self) -> None:
        self.appender.sync()

    @property
    def _columnar(self) -> bool:
        return self.encoder.columnar

    @property
    def _known_commit_pos(self) -> int:
        return self.appender.known_commit_pos

    @_known_commit_pos.setter
    def _known_commit_pos(self, pos: int) -> None:
        self.appender.known_commit_pos = pos

    def _damage_error(self) -> StoreDamagedError:
        state = self.state
        pos = state.damage_pos
        f = self.commit_log.files.find(pos)
        report = DamageReport(
            f.path if f else self.commit_log.directory,
            pos,
            state.damage_resume,
            state.damage_following,
        )
        return StoreDamagedError(
            f"store {self.root}: {report.describe()}",
            file=report.file,
            offset=pos,
            resume=report.resume,
            following=report.following,
        )

    def _mark_dirty(self, key: tuple[str, int], first: int) -> None:
        self._dirty.mark(key, first)

    def _redispatch(
        self,
        start: int,
        end: int | None,
        *,
        index_from: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> tuple[int, str]:
        """Rebuild ConsumeQueue and index entries from CommitLog records in [start, end)."""
        return self.dispatcher.scan(start, end, index_from=index_from, progress=progress)

    @property
    def _gaps(self) -> dict[tuple[str, int], int]:
        """Queues whose ConsumeQueue lacks entries a redispatch met records for:
        (topic, queue id) -> first missing entry (see _rebuild_queues)."""
        return self.dispatcher.gaps

    @_gaps.setter
    def _gaps(self, gaps: dict[tuple[str, int], int]) -> None:
        self.dispatcher.gaps = gaps

    # -- expiry ----------------------------------------------------------------------

    def delete_expired(
        self, now_ms: int | None = None, *, reserved_hours: float | None = None
    ) -> dict[str, int]:
        """Delete CommitLog segments older than fileReservedTime, and what pointed into them.

        As RocketMQ's clean services do: only whole segments from the front, by
        their file's last modification time, never the segment being written or
        one holding bytes not yet flushed and dispatched; then ConsumeQueue files
        and index files that only point below the new CommitLog start. Queues'
        min offsets move up; a reader asking for older offsets meets data loss
        (OffsetOutOfRangeError, or the data source's failOnDataLoss). Embedded
        stores have no daemon: call it (or ``rocketspark store clean``) from a job.
        Returns how many files of each kind were deleted.
        """
        self._check_open()
        # File ages are wall-clock times (mtime), whatever clock stamps messages.
        now = time.time() * 1000 if now_ms is None else now_ms
        hours = self.config.file_reserved_time if reserved_hours is None else reserved_hours
        cutoff = now - hours * 3_600_000
        done = {"commitlog": 0, "consumequeue": 0, "index": 0}
        with self._write_lock:
            self._sync_with_writers()
            state = self.state
            safe_end = min(state.commit_pos, state.dispatched_pos, state.flushed_pos)
            files = self.commit_log.files
            files.refresh()
            while len(files.files) > 1:
                f = files.files[0]
                if f.end_offset > safe_end or os.stat(f.path).st_mtime * 1000 > cutoff:
                    break
                files.delete_first()
                done["commitlog"] += 1
            # Queues and index are trimmed even when no segment went this time: a
            # clean cut short after deleting segments left them pointing below.
            new_min = files.min_offset
            base = os.path.join(self.root, "consumequeue")
            for topic in sorted(os.listdir(base)) if os.path.isdir(base) else []:
                for qdir in sorted(os.listdir(os.path.join(base, topic))):
                    if qdir.isdigit():
                        done["consumequeue"] += self._cq(topic, int(qdir)).delete_below(new_min)
            done["index"] = self.index.delete_below(new_min)
        log.info("store %s: deleted %s; CommitLog now starts at %d", self.root, done, new_min)
        return done

    # -- flushing ----------------------------------------------------------------------

    def flush(self) -> None:
        """Force the CommitLog, the ConsumeQueues, the index and the checkpoint to disk."""
        self.appender.flush()

    # -- pull ----------------------------------------------------------------------

    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_msgs: int = 32,
        expression: str | None = "*",
        timeout_ms: int = 0,
    ) -> PullResult:
        """Read up to ``max_msgs`` messages of one queue from ``offset``.

        ``expression`` filters by tag (``*`` or ``TagA || TagB``). With
        ``timeout_ms`` > 0 a pull that finds nothing for the expression waits
        that long for a put of a message it matches (long polling; messages
        that do not match are stepped over, as RocketMQ only wakes a held pull
        for a matching tag). Messages that do not match leave gaps in the
        offsets; ``next_offset`` steps over them.
        """
        self._check_open()
        if max_msgs <= 0:
            raise ConfigError(f"max_msgs must be positive, got {max_msgs}")
        sub = SubscriptionExpression(expression)
        cq = self._existing_cq(topic, queue_id)
        deadline = time.monotonic() + timeout_ms / 1000.0
        stepped = False  # over messages the expression does not match
        while True:
            result = self._pull_once(cq, offset, max_msgs, sub)
            if timeout_ms <= 0 or result.status not in (
                PullStatus.NO_NEW_MSG,
                PullStatus.NO_MATCHED_MSG,
            ):
                return result
            if result.status is PullStatus.NO_MATCHED_MSG:
                offset, stepped = result.next_offset, True
                if time.monotonic() < deadline:
                    continue  # the rest, or wait at the end
                return result
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if stepped:  # say how far it got
                    return PullResult(
                        PullStatus.NO_MATCHED_MSG, [], offset, result.min_offset, result.max_offset
                    )
                return result
            self._wait_for_arrival(cq, offset, remaining)

    def _wait_for_arrival(self, cq: ConsumeQueue, offset: int, remaining: float) -> None:
        # Same-process puts notify the condition at once; puts from other processes
        # bump WRITE_SEQ in the shared state, read every millisecond (one load; the
        # queue's end is looked up only when it moved).
        state = self.state
        seq = None
        end = time.monotonic() + remaining
        with self._arrivals:
            while True:
                now_seq = state.write_seq
                if now_seq != seq:
                    seq = now_seq
                    if cq.max_offset() > offset:
                        return
                left = end - time.monotonic()
                if left <= 0:
                    return
                if self._arrivals.wait(min(left, 0.001)):
                    seq = None  # notified: look at the queue again

    def _pull_once(
        self, cq: ConsumeQueue, offset: int, max_msgs: int, sub: SubscriptionExpression
    ) -> PullResult:
        lo = cq.min_offset(self.commit_log.min_offset)
        hi = cq.max_offset()
        if offset == hi:
            return PullResult(PullStatus.NO_NEW_MSG, [], offset, lo, hi)
        if offset < lo or offset > hi:
            return PullResult(PullStatus.OFFSET_ILLEGAL, [], lo if offset < lo else hi, lo, hi)
        scan = max_msgs if sub.matches_all else max(max_msgs, MAX_FILTER_SCAN)
        entries = cq.read(offset, scan)
        messages: list[MessageExt] = []
        read = self.commit_log.read_reached
        verify = self.config.check_crc_on_read
        topic, queue_id = cq.topic, cq.queue_id
        n = 0
        for phy, size, code in zip(
            entries["offset"].tolist(), entries["size"].tolist(), entries["tags"].tolist()
        ):
            n += 1
            if not sub.matches_code(code):
                continue
            msg = read(
                phy,
                verify_crc=verify,
                size=size,
                topic=topic,
                queue_id=queue_id,
                queue_offset=offset + n - 1,
            )
            if not sub.matches_tags(msg.tags):
                continue
            messages.append(msg)
            if len(messages) >= max_msgs:
                break
        status = PullStatus.FOUND if messages else PullStatus.NO_MATCHED_MSG
        return PullResult(status, messages, offset + n, lo, hi)

    def read_batches(
        self,
        topic: str,
        queue_id: int,
        start: int,
        end: int | None = None,
        expression: str | None = "*",
        *,
        broker_name: str | None = None,
        check_crc: bool | None = None,
    ) -> tuple[list[Any], int]:
        """Read queue offsets [start, end) as ``pyarrow.RecordBatch`` objects (vectorised).

        Returns the batches (schema ``message.arrow.ARROW_SCHEMA``) and the offset
        to read next. ``end`` None or past the max offset reads to the max.
        Raises OffsetOutOfRangeError when ``start`` is below the min offset, and
        CorruptRecordError for a damaged record (a body CRC mismatch only when
        ``check_crc``, by default the store's checkCRCOnRead).
        """
        from rocketspark.message import arrow

        self._check_open()
        sub = SubscriptionExpression(expression)
        cq = self._existing_cq(topic, queue_id)
        lo = cq.min_offset(self.commit_log.min_offset)
        hi = cq.max_offset()
        if start < lo or start > hi:
            raise OffsetOutOfRangeError(
                f"offset {start} of {topic}/{queue_id} is outside [{lo}, {hi}]"
            )
        stop = hi if end is None else min(end, hi)
        if stop <= start:
            return [], start
        entries = cq.read(start, stop - start)
        next_offset = start + len(entries)
        qoffsets = np.arange(start, next_offset, dtype=np.int64)
        if not sub.matches_all:
            kept = np.isin(entries["tags"], np.fromiter(sub.codes, dtype=np.int64))
            entries, qoffsets = entries[kept], qoffsets[kept]
        if check_crc is None:
            check_crc = self.config.check_crc_on_read
        # Blocks of ARROW_BLOCK records: a million-row block is ~3x slower per row
        # here (its arrays no longer fit in the caches) and holds more memory at once.
        broker = broker_name or self.config.broker_name
        batches = []
        for at in range(0, len(entries), ARROW_BLOCK):
            block = entries[at : at + ARROW_BLOCK]
            batches += self.commit_log.record_batches(
                topic,
                broker,
                block["offset"],
                block["size"],
                queue_id=queue_id,
                queue_offsets=qoffsets[at : at + ARROW_BLOCK],
                check_crc=check_crc,
            )
        if not sub.matches_all:
            batches = [arrow.filter_tags(b, sub.tags) for b in batches]
        return batches, next_offset

    def get_message(self, commitlog_offset: int) -> MessageExt:
        """Return the message stored at ``commitlog_offset``."""
        self._check_open()
        if not 0 <= commitlog_offset < self.state.commit_pos:
            raise OffsetOutOfRangeError(
                f"commit log offset {commitlog_offset} is outside [0, {self.state.commit_pos})"
            )
        msg = self._read_live(commitlog_offset)
        if msg is None:
            raise OffsetOutOfRangeError(
                f"commit log offset {commitlog_offset} was deleted (expired): the CommitLog "
                f"now starts at {self.commit_log.files.min_offset}"
            )
        return msg

    def _read_live(self, offset: int) -> MessageExt | None:
        """The record at ``offset``, or None when its segment was deleted (delete_expired,
        here or in another process).

        Nothing led there but the offset: the record's header is checked against
        that (PHYSICALOFFSET) and against its ConsumeQueue entry, when it has one.
        """
        files = self.commit_log.files
        if offset >= files.min_offset:
            try:
                msg = self.commit_log.read_reached(offset, verify_crc=self.config.check_crc_on_read)
                self._check_queue_entry(msg)
                return msg
            except CorruptRecordError:
                files.refresh()  # another process may have deleted it meanwhile
                if offset >= files.min_offset:
                    raise
        return None

    def _check_queue_entry(self, msg: MessageExt) -> None:
        """Raise CorruptRecordError unless the ConsumeQueue entry that the record's topic,
        QUEUEID and QUEUEOFFSET name points back at it (those fields have no checksum).

        Not judged: records no queue holds (half messages) and records not
        dispatched yet (a put in another process).
        """
        if transaction_type(msg.sys_flag) not in (0, SysFlag.TRANSACTION_COMMIT):
            return
        phy = msg.commitlog_offset
        if phy >= self.state.dispatched_pos:
            return
        where = f"ConsumeQueue {msg.topic!r} queue {msg.queue_id} offset {msg.queue_offset}"
        try:
            validate_topic(msg.topic, on_disk=True)
        except ConfigError:
            entry: tuple[int, int, int] | None = None  # (and no path is made of the name)
        else:
            key = (msg.topic, msg.queue_id)
            entry = None
            if key in self._queues or os.path.isdir(
                os.path.join(self.root, "consumequeue", msg.topic, str(msg.queue_id))
            ):
                entry = self._cq(*key).entry(msg.queue_offset)
                if entry is not None and entry[:2] == (phy, msg.store_size):
                    return
        raise CorruptRecordError(
            f"record header damaged: its topic, QUEUEID and QUEUEOFFSET name {where}, which "
            + (
                f"points at offset {entry[0]} (size {entry[1]})"
                if entry is not None
                else "does not exist"
            ),
            file=self.commit_log.segment(phy).path,
            offset=phy,
        )

    # -- consumer groups -------------------------------------------------------------

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Record that ``group`` will next consume ``offset`` of the queue."""
        self._check_open()
        validate_group(group)
        if offset < 0:
            raise OffsetOutOfRangeError(f"offset to commit must be >= 0, got {offset}")
        self._existing_cq(topic, queue_id)
        self.offsets.commit(group, topic, queue_id, offset)

    def commit_offsets(self, group: str, offsets: dict[tuple[str, int], int]) -> None:
        """Record several ``(topic, queue_id) -> next offset`` of ``group`` in one write."""
        self._check_open()
        if not offsets:
            return
        validate_group(group)
        infos: dict[str, TopicInfo] = {}
        for (topic, queue_id), offset in offsets.items():
            if offset < 0:
                raise OffsetOutOfRangeError(
                    f"offset to commit for {topic}/{queue_id} must be >= 0, got {offset}"
                )
            _check_queue(infos.get(topic) or infos.setdefault(topic, self.topic(topic)), queue_id)
        self.offsets.commit_many(group, offsets)

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        """Return the group's next offset for the queue, or None if it never committed."""
        self._check_open()
        return self.offsets.query(group, topic, queue_id)

    def lag(self, group: str, topic: str | None = None) -> dict[tuple[str, int], int]:
        """Return, per (topic, queue), how many messages the group has yet to consume.

        Queues the group never committed count from their min offset. Without
        ``topic``, topics the group committed that no longer exist are left out
        (a consumerOffset.json can outlive a topic, as a broker's does).
        """
        self._check_open()
        topics = (
            [topic]
            if topic is not None
            else sorted({t for t, _q in self.offsets.offsets_of_group(group) if self.has_topic(t)})
        )
        out: dict[tuple[str, int], int] = {}
        for t in topics:
            info = self.topic(t)
            for q in range(info.read_queue_nums):
                hi = self.max_offset(t, q)
                done = self.committed_offset(group, t, q)
                if done is None:
                    done = self.min_offset(t, q)
                out[(t, q)] = max(0, hi - done)
        return out

    # -- retry and dead letters --------------------------------------------------------

    def send_back(
        self,
        group: str,
        message: MessageExt,
        delay_level: int = 0,
        *,
        max_reconsume_times: int | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> PutResult:
        """Send a message the group failed to consume to %RETRY%group or %DLQ%group.

        With ``delay_level`` 0 the retry waits level 3 + reconsumeTimes; once
        the message was reconsumed ``max_reconsume_times`` times (the group's
        retryMaxTimes, 16 by default) or ``delay_level`` is negative, it goes to
        the dead-letter topic instead. ``properties`` are added to the message.
        """
        return self.send_back_batch(
            group,
            [message],
            [delay_level],
            max_reconsume_times=max_reconsume_times,
            properties=[properties or {}],
        )[0]

    def send_back_batch(
        self,
        group: str,
        messages: Sequence[MessageExt],
        delay_levels: Sequence[int] | None = None,
        *,
        max_reconsume_times: int | None = None,
        properties: Sequence[Mapping[str, str]] | None = None,
    ) -> Sequence[PutResult]:
        """send_back for several messages in one append: after a crash, all or none are there."""
        self._check_open()
        validate_group(group)
        self.groups.get_or_create(group)
        max_times = (
            self.groups.retry_max_times(group)
            if max_reconsume_times is None
            else check_int("max_reconsume_times", max_reconsume_times, INT32_MIN, INT32_MAX)
        )
        messages = list(messages)
        for i, m in enumerate(messages):
            if not isinstance(m, MessageExt):
                raise InvalidMessageError(
                    f"message {i}: expected a MessageExt the store "
                    f"handed out, got {type(m).__name__}"
                )
        for name, col in (("delay_levels", delay_levels), ("properties", properties)):
            if col is not None and len(col) != len(messages):
                raise ConfigError(f"{name} has {len(col)} entries, messages has {len(messages)}")
        # Checked as a Message's are, before anything is written; the delay comes from
        # delay_levels (the store sets DELAY), the rest may replace the message's own.
        added = [
            {}
            if p is None
            else user_properties(p, f"message {i}: ", frozenset({PROPERTY_DELAY_TIME_LEVEL}))
            for i, p in enumerate(() if properties is None else properties)
        ]
        for i, level in enumerate(() if delay_levels is None else delay_levels):
            # negative: straight to the dead-letter topic; 0: 3 + reconsumeTimes, capped
            # at the last level as RocketMQ's broker does; a given level must exist
            check_int("delay_level", level, -INT32_MAX, INT32_MAX, f"message {i}: ")
            if level > 0:
                self.encoder.check_delay_level(level, f"message {i}: ")
        now = self.clock()
        recs = []
        for i, message in enumerate(messages):
            delay_level = delay_levels[i] if delay_levels is not None else 0
            props = dict(message.properties)
            props.setdefault(PROPERTY_RETRY_TOPIC, message.topic)
            props.pop(PROPERTY_REAL_TOPIC, None)
            props.pop(PROPERTY_REAL_QUEUE_ID, None)
            props.pop(PROPERTY_DELAY_TIME_LEVEL, None)
            if added:
                props.update(added[i])
            delay_ms = 0
            if message.reconsume_times >= max_times or delay_level < 0:
                topic = dlq_topic(group)
                self.encoder.ensure_system_topic(topic, DLQ_NUMS_PER_GROUP)
                queue_id = 0
            else:
                topic = retry_topic(group)
                self.encoder.ensure_system_topic(topic, RETRY_NUMS_PER_GROUP)
                queue_id = 0
                level = delay_level or 3 + message.reconsume_times
                level = min(level, len(self._delay_ms))
                props[PROPERTY_DELAY_TIME_LEVEL] = str(level)
                props[PROPERTY_REAL_TOPIC] = topic
                props[PROPERTY_REAL_QUEUE_ID] = str(queue_id)
                delay_ms = self._delay_ms[level - 1]
                topic, queue_id = SCHEDULE_TOPIC, level - 1
                self.encoder.ensure_system_topic(SCHEDULE_TOPIC, len(self._delay_ms))
            if not props.get(PROPERTY_ORIGIN_MESSAGE_ID):
                props[PROPERTY_ORIGIN_MESSAGE_ID] = message.msg_id
            born = message.born_host
            recs.append(
                self.encoder.record(
                    topic,
                    queue_id,
                    message.body,
                    props,
                    now,
                    sys_flag=message.sys_flag & ~SysFlag.COMPRESSED & ~0x700,
                    flag=message.flag,
                    born_timestamp=message.born_timestamp,
                    born_host=born,
                    reconsume_times=message.reconsume_times + 1,
                    delay_ms=delay_ms,
                )
            )
        if not recs:
            return []
        return self._append(recs, now)

    # -- delay levels ---------------------------------------------------------------

    def run_schedule(self, now_ms: int | None = None) -> int:
        """Deliver every delayed message that is due; return how many were delivered.

        Idempotent and crash-safe; any process that has the store open may run it.
        """
        self._check_open()
        return self._schedule.run(now_ms)

    # -- transactions ---------------------------------------------------------------

    def prepare(
        self,
        message: Message,
        *,
        producer_group: str = "rocketspark",
        properties: dict[str, str] | None = None,
    ) -> PutResult:
        """Store a transactional half message, invisible to consumers until committed.

        ``result.queue_offset`` identifies it for :meth:`commit_transaction` /
        :meth:`rollback_transaction`.
        """
        return self.prepare_batch([message], producer_group=producer_group, properties=properties)[
            0
        ]

    def prepare_batch(
        self,
        messages: Sequence[Message],
        *,
        producer_group: str = "rocketspark",
        properties: dict[str, str] | None = None,
    ) -> list[PutResult]:
        """Store several half messages under one lock."""
        validate_group(producer_group)
        messages = list(messages)
        for i, m in enumerate(messages):
            if not isinstance(m, Message):
                raise InvalidMessageError(
                    f"message {i}: expected a rocketspark Message, got {type(m).__name__}"
                )
        return self._transactions.prepare(
            messages, producer_group=producer_group, extra_properties=properties
        )

    def commit_transaction(
        self, half: PutResult | int | Iterable[PutResult | int]
    ) -> list[PutResult]:
        """Make half messages visible in their real topics (idempotent)."""
        return self._transactions.end(_half_offsets(half), True)

    def rollback_transaction(self, half: PutResult | int | Iterable[PutResult | int]) -> None:
        """Discard half messages (idempotent)."""
        self._transactions.end(_half_offsets(half), False)

    def transaction_status(self, half: PutResult | int) -> str:
        """Return "open", "committed", "rolled_back" or "resolved"."""
        (offset,) = _half_offsets(half)
        return self._transactions.status(offset)

    def open_transactions(
        self, producer_group: str | None = None, *, exclude: Iterable[int] | None = None
    ) -> list[MessageExt]:
        """Return the half messages still open (of ``producer_group``), oldest first.

        Halves at the half-queue offsets in ``exclude`` are left out (unread).
        """
        self._check_open()
        ex = None if exclude is None else _half_offsets(exclude)
        return self._transactions.open_halves(
            producer_group, None if ex is None else np.asarray(ex, dtype=np.int64)
        )

    def check_transactions(
        self,
        callback: Callable[[MessageExt], object],
        *,
        now_ms: int | None = None,
        timeout_ms: int | None = None,
    ) -> dict[str, int]:
        """Resolve half messages open longer than transactionTimeOut through ``callback``."""
        self._check_open()
        return self._transactions.check(callback, now_ms=now_ms, timeout_ms=timeout_ms)

    # -- queries ---------------------------------------------------------------------

    def query_by_key(
        self, topic: str, key: str, begin_ms: int = 0, end_ms: int | None = None, max_num: int = 64
    ) -> list[MessageExt]:
        """Return messages of ``topic`` whose KEYS or UNIQ_KEY equal ``key``, newest first."""
        self._check_open()
        self.topic(topic)
        self.index.refresh()
        hi = end_ms if end_ms is not None else (1 << 63) - 1
        found: list[MessageExt] = []
        # The index keeps seconds: ask it with a second of slack, then filter exactly.
        for phy in self.index.query(topic, key, max_num * 4, max(0, begin_ms - 1000), hi):
            if phy >= self.state.commit_pos:
                continue
            msg = self._read_live(phy)
            if msg is None:  # an index file outlives some segments it points into
                continue
            if msg.topic != topic:
                continue
            if key not in msg.keys and msg.uniq_key != key:
                continue
            if not begin_ms <= msg.store_timestamp <= hi:
                continue
            found.append(msg)
            if len(found) >= max_num:
                break
        found.sort(key=lambda m: m.commitlog_offset, reverse=True)
        return found

    # -- recovery --------------------------------------------------------------------

    def _recover(self, truncate_at: int | None = None, *, full: bool = False) -> RecoveryReport:
        """Bring the store to a consistent state (first opener only, lock held exclusively).

        The CommitLog is the truth, whoever wrote it (rocketspark or a RocketMQ
        broker); ``rocketspark.state`` only says where to start looking:

        - a trusted state (format 2, every field's check passes) starts at
          min(FLUSHED_POS, DISPATCHED_POS, COMMIT_POS): for a clean store, its
          end, so opening verifies a few bytes, not the whole log;
        - an untrusted one (damaged, format 1, or none: a broker's store)
          starts at a segment whose first record verifies (_safe_scan_start),
          and is rebuilt from what the log holds.

        The scan goes on while records verify (magic code, sizes,
        PHYSICALOFFSET, body CRC), across end-of-segment blanks, and dispatches
        what ConsumeQueues and index lack, records past COMMIT_POS (a broker's
        appends) included. Where verified data ends, the rest of the log is
        searched for records that verify:

        - none: the end is a torn tail; its bytes are zeroed, queue and index
          entries past it dropped;
        - with a trusted state (or a format-1 one whose COMMIT_POS a record
          ends at) saying a writer died inside an append
          (COMMIT_POS < PENDING_END) and no record verifying at or past
          PENDING_END: the whole append goes, as a live writer would wipe it
          (_sync_with_writers), so an append of several records is all or
          nothing (the exactly-once sink's commit relies on it);
        - otherwise the store is damaged: nothing is cut or zeroed. Reads
          work: records before the damage, and those after it that
          ConsumeQueues already point at (a read of a damaged record raises
          CorruptRecordError). Records after the damage that no queue points at
          stay unread, and every write raises StoreDamagedError (naming file,
          offset and how many valid records follow) until an open with
          ``truncate_at`` equal to the damage offset discards them all.

        ConsumeQueues are then checked for holes (an empty entry with written
        ones after it) and rebuilt from the CommitLog where they disagree
        (_rebuild_queues). With ``full``, the scan starts at the first segment.
        """
        state = self.state
        abort_path = os.path.join(self.root, ABORT_FILE)
        abort = os.path.exists(abort_path)
        # A format-1 file (no checks, written by an older rocketspark) is not damaged:
        # its positions serve as a scan start once the CommitLog confirms it.
        legacy = state.existed and state.valid and state.format_version == 1
        damaged = state.damaged_fields() if state.existed and state.valid and not legacy else []
        trusted = state.valid and not damaged and not legacy
        report = RecoveryReport(abnormal_exit=abort)
        log_files = self.commit_log.files
        if not state.valid:
            state.initialise()  # a new store, or a broker's: nothing in the file to keep
        if damaged:
            report.state_damaged = damaged
            log.warning(
                "store %s: %s fails its checks (%s); finding the end of the data "
                "from the CommitLog",
                self.root,
                state.path,
                ", ".join(damaged),
            )
        if trusted:
            commit, pending = state.commit_pos, state.pending_end
            # Processes that may exit without close() (Spark's workers) and left
            # nothing unfinished did not crash; one that had to close() and did not did.
            report.abnormal_exit = abort and (
                state.holders > 0
                or pending != commit
                or state.dispatched_pos != commit
                or state.intent()[0] != 0
            )
            start = min(state.flushed_pos, state.dispatched_pos, commit)
            if start < log_files.min_offset:  # segments expired (a broker deleted them)
                start = log_files.min_offset
            # (Damage found last time starts where the last valid record ended; a torn
            # record at COMMIT_POS, as a writer killed inside an append leaves it,
            # starts where a verified record ends.)
            if (
                not (state.damage_following and start == state.damage_pos)
                and not self._is_boundary(start)
                and not self._ends_a_record(start)
            ):
                log.warning(
                    "store %s: position %d of %s is not a record boundary of the "
                    "CommitLog; scanning from a segment start",
                    self.root,
                    start,
                    state.path,
                )
                trusted = False
                start = self._safe_scan_start(abort)
        else:
            commit = pending = -1
            start = None
            if legacy:
                commit_v1, pending_v1, dispatched_v1, flushed_v1 = state.legacy_positions()
                start = self._confirmed_start(min(commit_v1, dispatched_v1, flushed_v1))
                if start is not None and self._ends_a_record(commit_v1):
                    # A writer of that rocketspark killed inside an append: all or
                    # nothing, as it recovered (the unfinished-append rule below).
                    commit, pending = commit_v1, pending_v1
            elif damaged and "FLUSHED_POS" not in damaged:
                # FLUSHED_POS <= DISPATCHED_POS: all before it was dispatched and flushed.
                start = self._confirmed_start(state.flushed_pos)
            if start is None:
                start = self._safe_scan_start(abort)
        if full:
            start = log_files.min_offset
        flushed_before = state.flushed_pos if trusted else start
        report.scanned_from = start
        # An orderly end: every position equal, no holder died. Nothing past the
        # end was dispatched, no index update was cut short.
        quick = (
            trusted
            and not full
            and not report.abnormal_exit
            and start == commit == pending == state.dispatched_pos
        )
        if not quick:
            self.index.repair_tail()  # a writer killed inside an index update
        self._gaps.clear()
        end, reason = self._redispatch(start, None)
        if quick and end == commit and self._ends_a_record(end):
            # An orderly end, and a record ends there (zeros inside a record look the
            # same): what follows was never written. Searching it would cost the
            # pages of WARM_AHEAD on every open.
            after = None
        else:
            quick = quick and end != commit
            after = self.commit_log.next_valid(end)
        seg_start = self._segment_end(start) - self.config.mapped_file_size_commit_log
        if (
            after is not None
            and start != seg_start
            and not self._is_record(start)
            and not self._ends_a_record(start)
        ):
            # Zeros at a position the state gave could be zeros inside a record:
            # damage is only ever judged by a scan from a known record boundary.
            start = report.scanned_from = max(seg_start, log_files.min_offset)
            end, reason = self._redispatch(start, None)
            after = self.commit_log.next_valid(end)
        report.reason = reason
        damage: tuple[int, int, int] | None = None  # (resume, following, end of valid data)
        cut = end
        if (
            commit < pending
            and commit <= end <= pending
            and (self.commit_log.next_valid(pending) is None)
        ):
            # A writer was killed inside an append: what it had copied was never
            # acknowledged (COMMIT_POS had not moved). A record verifying past
            # PENDING_END means the state is older than the log (an OS crash lost
            # its page): then this rule does not apply.
            if end > commit or (after is not None and after < pending):
                log.warning(
                    "store %s: discarding an unfinished append at CommitLog [%d, %d)",
                    self.root,
                    commit,
                    pending,
                )
                report.reason = "unfinished append"
            cut = commit
            garbage_end = max(
                pending,
                self.commit_log.first_nonzero_tail(end, self.config.max_message_size + 65536),
            )
        elif after is None and quick and end == commit:
            garbage_end = end
        elif after is None:
            garbage_end = self.commit_log.first_nonzero_tail(
                end, self.config.max_message_size + 65536
            )
            if trusted:
                garbage_end = max(garbage_end, min(pending, self._segment_end(end)))
        else:
            resume, following, valid_end = self.commit_log.survey(after)
            damage = (resume, following, valid_end)
        if damage is not None and truncate_at is not None and truncate_at == end:
            log.warning(
                "store %s: truncating the CommitLog at %d as asked: %d valid "
                "record(s) after it are discarded",
                self.root,
                end,
                damage[1],
            )
            report.truncated_valid_records = damage[1]
            self.commit_log.zero_from(end)
            damage = None
            garbage_end = end
        elif truncate_at is not None:
            where = (
                f"the damage is at offset {end}"
                if damage is not None
                else "the store is not damaged"
            )
            raise ConfigError(f"truncate_at {truncate_at}: {where}; nothing was truncated")
        report.commit_end = cut
        if damage is not None:
            resume, following, valid_end = damage
            f = self.commit_log.files.find(end)
            report.damage = DamageReport(
                f.path if f else self.commit_log.directory, end, resume, following
            )
            log.error("store %s: %s", self.root, report.damage.describe())
            state.damage_pos, state.damage_resume = end, resume
            state.damage_following = following
            # Readers may reach records up to the last valid one; the next first
            # opener scans from the damage again (DISPATCHED_POS stays before it).
            state.commit_pos = state.pending_end = max(valid_end, end)
            state.dispatched_pos = end
            state.flushed_pos = min(flushed_before, end)
            state.synced_pos = min(state.synced_pos if trusted else end, end)
        else:
            if garbage_end > cut:
                report.discarded_bytes = garbage_end - cut
                self.commit_log.wipe(cut, garbage_end)
            if not (quick and cut == commit):  # else nothing lies past the end
                self.commit_log.files.delete_from(self._segment_end(cut))
                report.truncated_queue_entries = self._truncate_queues(cut)
                rebuild = self.index.truncate(cut)
                if rebuild is not None and rebuild < cut:
                    self._redispatch(cut, None, index_from=rebuild)
            state.commit_pos = state.dispatched_pos = state.pending_end = cut
            state.flushed_pos = min(flushed_before, cut)
            state.synced_pos = min(state.synced_pos if trusted else cut, cut)
            state.damage_pos = state.damage_resume = state.damage_following = 0
        if not trusted:
            state.stamp()  # every checked field is written: the file is trusted again
        state.holders = 0
        clean = quick and end == commit
        if clean and damage is None:
            report.scanned_from = None  # verified the end only: nothing re-read
        if damage is None and (not clean or self._gaps):
            # After an orderly end no queue can have a hole (a refused put gives its
            # offsets back; the abort file may still be there, as Spark's workers leave
            # it), and walking every queue costs a store of many queues more than the
            # rest of the open together: only a crash or an older rocketspark's store
            # (a format-1 state, never clean here) needs the walk.
            report.repaired_queues = self._repair_queues(cut, full=not clean)
        elif self._gaps:
            # A rebuild would drop the entries of records past the damage: queues
            # are repaired once the damage is resolved.
            log.warning(
                "store %s: ConsumeQueues %s lack entries; rebuilt once the damage is resolved",
                self.root,
                sorted(self._gaps),
            )
            self._gaps.clear()
        with open(abort_path, "wb"):
            pass
        self._known_commit_pos = -1
        return report

    def _segment_end(self, pos: int) -> int:
        seg = self.config.mapped_file_size_commit_log
        return pos - pos % seg + seg

    def _ends_a_record(self, pos: int) -> bool:
        """Does a record that verifies end exactly at ``pos`` (or a segment start there)?

        Looks back for the last record before ``pos`` by its magic code (a few
        hundred bytes, usually), checking PHYSICALOFFSET and CRC.
        """
        f = self.commit_log.files.find(pos)
        if f is None:
            f = self.commit_log.files.find(pos - 1)
            if f is None or f.end_offset != pos:
                return pos == self.commit_log.files.min_offset
        rel = pos - f.start_offset
        if rel == 0:
            return True
        low = max(0, rel - self.config.max_message_size - 65536)
        mm = f.mm
        hi = rel
        while True:
            hit = mm.rfind(MAGIC_PREFIX, low, hi)
            if hit < 4:
                return False
            hi = hit + 2  # the next search ends before this hit
            check = check_record(mm, hit - 4, f.start_offset + hit - 4)
            if check.size > 0:
                return hit - 4 + check.size == rel

    def _is_record(self, pos: int) -> bool:
        """Does a record that verifies start at ``pos``?"""
        f = self.commit_log.files.find(pos)
        return f is not None and check_record(f.mm, pos - f.start_offset, pos).size > 0

    def _is_boundary(self, pos: int) -> bool:
        """Can a scan start at ``pos``: a segment start, a record, a blank or the zeros
        past the end (a trusted state's position only: zeros mid-record look the same)."""
        f = self.commit_log.files.find(pos)
        if f is None or pos == f.start_offset:
            return True
        check = check_record(f.mm, pos - f.start_offset, pos, verify_crc=True)
        return check.size != RECORD_INVALID

    def _adopt_unlisted_topics(self) -> None:
        """List topics that have ConsumeQueues but no entry in topics.json.

        A store written by RocketMQ's store module alone (or whose topics.json
        was lost) still has its queues on disk; a user expects to read them.
        Each such topic gets as many queues as its highest queue directory + 1.
        """
        base = os.path.join(self.root, "consumequeue")
        if not os.path.isdir(base):
            return
        for topic in sorted(os.listdir(base)):
            if self.topics.get(topic) is not None:
                continue
            try:
                validate_topic(topic, on_disk=True)
            except ConfigError:
                log.warning(
                    "store %s: ignoring ConsumeQueue directory %r (not a topic name)",
                    self.root,
                    topic,
                )
                continue
            qids = [int(q) for q in os.listdir(os.path.join(base, topic)) if q.isdigit()]
            if qids:
                n = max(qids) + 1
                self.topics.create(topic, n, n, perm=6, order=False, on_disk=True)
                log.info(
                    "store %s: adopted topic %r with %d queue(s) found on disk", self.root, topic, n
                )

    def _is_empty(self) -> bool:
        return not self.commit_log.files.files

    def _confirmed_start(self, start: int) -> int | None:
        """``start`` (a position of a state file not trusted as a whole) if the CommitLog
        confirms it as a place to scan from: a record starts or ends there."""
        if start < self.commit_log.files.min_offset or not (
            self._is_record(start) or self._ends_a_record(start)
        ):
            return None
        log.info(
            "store %s: scanning from %d, where %s says the data was dispatched",
            self.root,
            start,
            self.state.path,
        )
        return start

    def _safe_scan_start(self, abnormal: bool) -> int:
        """Where to scan from without a trusted state (damaged, or a RocketMQ broker's store).

        A scan starts only at a segment whose first record verifies (magic
        code, PHYSICALOFFSET, CRC): a broker's preallocated, all-zero next
        segment is never one. After a clean shutdown, the third segment from
        the end (as RocketMQ's normal recovery); after an abnormal exit, the
        newest whose first record was stored before the checkpoint's time (by
        then, everything before it was flushed and dispatched), else the first.
        """
        files = self.commit_log.files.files
        if not files:
            return 0
        starts = []
        for f in files:
            check = check_record(f.mm, 0, f.start_offset, verify_crc=True)
            if check.size > 0:
                starts.append((f.start_offset, check.store_timestamp))
        if not starts:
            return files[0].start_offset
        if not abnormal:
            return starts[max(0, len(starts) - 3)][0]
        safe = self.checkpoint.min_timestamp
        for offset, first_ts in reversed(starts):
            if safe and first_ts <= safe:
                return offset
        return starts[0][0]

    def _repair_queues(self, upto: int, *, full: bool) -> list[tuple[str, int, int, int]]:
        """Find ConsumeQueue holes and rebuild those queues from the CommitLog.

        A hole (an empty entry with written entries after it) hides every
        later entry from readers. A first open after processes that ended
        without close() checks each queue's last file (the one max_offset
        reads anyway); one after a crash, an older rocketspark or anything
        the scan repaired checks every file (a clean shutdown: none). Holes in the half-message queue are
        only reported: its offsets identify transactions.
        """
        base = os.path.join(self.root, "consumequeue")
        for topic in sorted(os.listdir(base)) if os.path.isdir(base) else []:
            tdir = os.path.join(base, topic)
            if not os.path.isdir(tdir):
                continue
            for qid in sorted(os.listdir(tdir)):
                if not qid.isdigit():
                    continue
                hole = _find_hole(self._cq(topic, int(qid)), full)
                if hole is None:
                    continue
                if topic == TRANS_HALF_TOPIC:
                    log.error(
                        "store %s: ConsumeQueue %s/%s has a hole at entry %d; half "
                        "messages are named by their offsets, so it is left as is",
                        self.root,
                        topic,
                        qid,
                        hole,
                    )
                    continue
                key = (topic, int(qid))
                self._gaps[key] = min(hole, self._gaps.get(key, hole))
        return self._rebuild_queues(upto)

    def _rebuild_queues(self, upto: int) -> list[tuple[str, int, int, int]]:
        """Rebuild the queues in ``_gaps`` from the CommitLog, from their first missing entry.

        The queue's records after its last good entry, in CommitLog order
        (verified, up to ``upto``), become its entries from there. A record
        numbered after a hole gets its entry's offset written into its
        QUEUEOFFSET (BODYCRC does not cover it), so that a record's
        QUEUEOFFSET is its entry again, as consumers expect (RocketMQ's
        clients commit offsets by it). Entries once behind a hole thus move
        down: an acknowledged put's queue offset changes, its message stays.
        Returns (topic, queue id, first entry rebuilt, entries now) per queue.
        """
        done = []
        gaps, self._gaps = self._gaps, {}
        starts = {}
        for key, first in gaps.items():
            prev = self._cq(*key).entry(first - 1) if first > 0 else None
            starts[key] = prev[0] + prev[1] if prev is not None else self.commit_log.min_offset
        # A process killed half way leaves entries dropped and records renumbered
        # with no hole left to find: DISPATCHED_POS goes back to where the scans
        # start, so the next sync or open redispatches from there, meets the
        # records not yet renumbered as a gap and rebuilds again.
        state = self.state
        dispatched = state.dispatched_pos
        if starts and min(starts.values()) < dispatched:
            state.dispatched_pos = min(starts.values())
        for (topic, qid), first in sorted(gaps.items()):
            q = self._cq(topic, qid)
            phy = starts[(topic, qid)]
            q.truncate_to(first)
            written = _written_end(q)
            if written > first:
                q._zero(first, written)
            q._max = first
            n = first
            for pos, check in self.commit_log.scan(phy, verify_crc=True):
                if pos >= upto or check.size <= 0:
                    break
                if (
                    (check.topic, check.queue_id) != (topic, qid)
                    or check.queue_offset < first
                    or transaction_type(check.sys_flag) not in (0, SysFlag.TRANSACTION_COMMIT)
                ):
                    continue
                if check.queue_offset != n:
                    self.commit_log.set_queue_offset(pos, n)
                q.put(n, [pos], [check.size], [self._queue_code(check)])
                n += 1
            self.commit_log.flush(phy, upto)
            self._mark_dirty((topic, qid), first)
            log.warning(
                "store %s: ConsumeQueue %s/%d rebuilt from the CommitLog from entry "
                "%d; it has %d entries",
                self.root,
                topic,
                qid,
                first,
                n,
            )
            done.append((topic, qid, first, n))
        state.dispatched_pos = dispatched
        return done

    def _may_have_queue(self, topic: str, queue_id: int) -> bool:
        """Is (topic, queue_id) a queue: on disk already, or within the topic's queue count
        (a topic not listed in topics.json may have any queue, as a broker's store does)."""
        if queue_id < 0:
            return False
        if os.path.isdir(os.path.join(self.root, "consumequeue", topic, str(queue_id))):
            return True
        cfg = self.topics.get(topic)
        return cfg is None or queue_id < max(int(cfg["readQueueNums"]), int(cfg["writeQueueNums"]))

    def _queue_code(self, check: RecordCheck) -> int:
        """The ConsumeQueue tags code of a record (the delivery time for a delayed one)."""
        return self.dispatcher.queue_code(check)

    def _truncate_queues(self, end: int) -> int:
        dropped = 0
        base = os.path.join(self.root, "consumequeue")
        if not os.path.isdir(base):
            return 0
        for topic in os.listdir(base):
            tdir = os.path.join(base, topic)
            if not os.path.isdir(tdir):
                continue
            for qid in os.listdir(tdir):
                if not qid.isdigit():
                    continue
                q = self._cq(topic, int(qid))
                before = q.max_offset()
                after = q.truncate_from_phy(end)
                dropped += before - after
        return dropped


@dataclass(frozen=True)
class DamageReport:
    """Damage in the CommitLog with valid records after it (the store is read-only)."""

    file: str
    offset: int
    resume: int  # the first valid record after the damage
    following: int  # how many valid records follow it

    def describe(self) -> str:
        return (
            f"the CommitLog is damaged at offset {self.offset} (file {self.file}), and "
            f"{self.following} valid record(s) follow from offset {self.resume}; writes "
            f"are refused until `rocketspark store recover --truncate-at {self.offset}` "
            "discards everything from the damage on (or the bytes are restored)"
        )


@dataclass
class RecoveryReport:
    """What opening the store found and repaired.

    ``abnormal_exit``: the last run did not end cleanly: the abort file was
    left by a holder that had to close() and did not, by a writer killed
    inside an append, a dispatch or a schedule step, or the state file could
    not be trusted (a process opened with ``exit_without_close`` that ended
    with nothing unfinished is not one). ``scanned_from``: where the CommitLog
    scan started (None: only the recorded end was verified); ``commit_end``:
    where the data ends now (the damage offset when ``damage`` is set);
    ``state_damaged``: the state fields whose checks failed.
    """

    abnormal_exit: bool
    scanned_from: int | None = None
    commit_end: int = 0
    reason: str = ""
    discarded_bytes: int = 0
    truncated_queue_entries: int = 0
    state_damaged: list[str] = dataclasses.field(default_factory=list)
    damage: DamageReport | None = None
    truncated_valid_records: int = 0
    # (topic, queue id, first entry rebuilt, entries it has now)
    repaired_queues: list[tuple[str, int, int, int]] = dataclasses.field(default_factory=list)


def _find_hole(q: ConsumeQueue, full: bool) -> int | None:
    """The first empty entry of ``q`` with a written entry after it (its last file only
    unless ``full``), or None. Zeros before the queue's first entry are no hole (a
    queue may start at any offset, see _dispatch_check)."""
    all_files = q.files.files
    files = all_files if full else all_files[-1:]
    pending = None
    for f in files:
        # Only as far as the file holds data: the never-written rest is a hole of
        # the sparse file (reading it would fault in every page for nothing).
        stop = max((hi for _lo, hi in data_ranges(f, 0)), default=0)
        count = min(q.entries_per_file, -(-stop // CQ_ENTRY_DTYPE.itemsize))
        sizes = np.frombuffer(f.mm, dtype=CQ_ENTRY_DTYPE, count=count)["size"]
        written = np.flatnonzero(sizes)
        base = f.start_offset // CQ_ENTRY_DTYPE.itemsize
        if pending is not None and len(written):
            return pending
        lead = int(written[0]) if f is all_files[0] and len(written) else 0
        zeros = np.flatnonzero(sizes[lead:] == 0)
        if len(zeros):
            z = lead + int(zeros[0])
        elif count < q.entries_per_file:
            z = count
        else:
            continue  # a full file
        if len(written) and int(written[-1]) > z:
            return base + z
        if pending is None:
            pending = base + z
    return None


def _written_end(q: ConsumeQueue) -> int:
    """One past the last written entry of ``q``, holes or not."""
    for f in reversed(q.files.files):
        sizes = np.frombuffer(f.mm, dtype=CQ_ENTRY_DTYPE, count=q.entries_per_file)["size"]
        written = np.flatnonzero(sizes)
        if len(written):
            return f.start_offset // CQ_ENTRY_DTYPE.itemsize + int(written[-1]) + 1
    return 0


def _half_offsets(half: object) -> list[int] | np.ndarray:
    """Half-queue offsets of PutResults, ints or an integer array; anything else (a
    bool, a float that would be truncated, a negative number) is refused by name."""
    if isinstance(half, np.ndarray):
        if half.dtype.kind not in "iu":
            raise ConfigError(
                f"half message offsets must be integers, got an array of {half.dtype}"
            )
        half = half.astype(np.int64, copy=False)
        if len(half) and int(half.min()) < 0:  # (a uint64 beyond int64 wraps negative)
            raise OffsetOutOfRangeError(
                f"no half message at offset {half.min()} of {TRANS_HALF_TOPIC}"
            )
        return half
    if isinstance(half, PutResults):
        if len(half) and half.topics != TRANS_HALF_TOPIC:
            raise ConfigError(f"these are not half messages (topic {half.topics!r})")
        return half.queue_offsets
    if isinstance(half, (PutResult, numbers.Integral)) or not isinstance(half, Iterable):
        half = [half]
    out = []
    for h in half:
        if isinstance(h, PutResult):
            if h.topic != TRANS_HALF_TOPIC:
                raise ConfigError(f"{h.msg_id} is not a half message (topic {h.topic!r})")
            out.append(h.queue_offset)
        elif h.__class__ is int and 0 <= h <= INT64_MAX:
            out.append(h)
        else:
            if isinstance(h, bool) or not isinstance(h, numbers.Integral):
                raise ConfigError(
                    f"a half message is named by its PutResult or its queue "
                    f"offset (an integer), got {h!r}"
                )
            if not 0 <= h <= INT64_MAX:
                raise OffsetOutOfRangeError(f"no half message at offset {h} of {TRANS_HALF_TOPIC}")
            out.append(int(h))
    return out


__all__ = [
    "MessageStore",
    "RecoveryReport",
    "FlushTimeoutError",
    "body_crc",
    "DLQ_GROUP_TOPIC_PREFIX",
    "RETRY_GROUP_TOPIC_PREFIX",
]


def _check_queue(info: TopicInfo, queue_id: int) -> None:
    """Raise OffsetOutOfRangeError unless the topic has queue ``queue_id``."""
    if not 0 <= queue_id < max(info.read_queue_nums, info.write_queue_nums):
        raise OffsetOutOfRangeError(
            f"queue {queue_id} of topic {info.name!r} does not exist "
            f"(the topic has {info.read_queue_nums} queues)"
        )


ARROW_BLOCK = 65536  # records per Arrow batch that read_batches builds at most

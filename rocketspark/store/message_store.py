"""The MessageStore facade: put, pull, offsets, retry and dead letters, recovery.

It ties the CommitLog, the ConsumeQueues, the IndexFiles, the checkpoint and
the config/ JSON files of one store directory together, and lets several
processes open the same directory at once (see ``store_state``).
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import logging
import numbers
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rocketspark.errors import (
    ConfigError,
    DiskFullError,
    FlushTimeoutError,
    InvalidMessageError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    StoreClosedError,
    StoreDamagedError,
    StoreLockedError,
    StorePathError,
    TopicShrinkError,
    UnknownTopicError,
)
from rocketspark.message.byte_gather import Pieces
from rocketspark.message.model import (
    DLQ_GROUP_TOPIC_PREFIX,
    FIRST_HALF_ERROR,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_FIRST_HALF,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    RESERVED_PROPERTIES,
    RETRY_GROUP_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    Message,
    MessageExt,
    SysFlag,
    check_extra_properties,
    check_int,
    check_utf8,
    dlq_topic,
    java_string_hash,
    message_body,
    reserved_property_error,
    retry_topic,
    tags_code,
    transaction_type,
    user_properties,
)
from rocketspark.message.record import (
    BLANK,
    BLANK_MAGIC_CODE,
    END_FILE_MIN_BLANK_LENGTH,
    HALF_SIZE_NOTE,
    HEADER_V4,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    RECORD_INVALID,
    SHORT,
    V1_MAX_TOPIC_LENGTH,
    HostAddress,
    RecordCheck,
    UniqueIdGenerator,
    body_crc,
    check_sizes,
    encode_properties,
    message_id,
)
from rocketspark.store import layout
from rocketspark.store.checkpoint import StoreCheckpoint
from rocketspark.store.commit_log import (
    SMALL_BATCH,
    Appended,
    ColumnBatch,
    CommitLog,
    Placement,
    PreparedRecord,
)
from rocketspark.store.config import (
    MessageStoreConfig,
    canonical_key,
    validate_group,
    validate_topic,
)
from rocketspark.store.consume_queue import (
    CQ_STORE_UNIT_SIZE,
    ConsumeQueues,
    check_queue,
)
from rocketspark.store.disk_guard import DiskGuard, reserve_sparse_files
from rocketspark.store.index_file import (
    IndexService,
    hex_suffixed_hash,
    java_hash_hex_suffixed,
    java_hash_many,
)
from rocketspark.store.metadata import (
    ConsumerOffsetTable,
    DelayOffsetTable,
    SinkLedgerTable,
    SubscriptionGroupTable,
    TopicConfigTable,
)
from rocketspark.store.recovery import Recovery, RecoveryReport
from rocketspark.store.schedule import ScheduleService
from rocketspark.store.store_state import (
    ABORT_FILE,
    FLUSH_LOCK_FILE,
    STATE_FORMAT_VERSION,
    StoreLock,
    StoreState,
    WriteLock,
)
from rocketspark.store.transaction import TransactionService

log = logging.getLogger(__name__)

DLQ_NUMS_PER_GROUP = 1
RETRY_NUMS_PER_GROUP = 1
Clock = Callable[[], int]


def system_clock() -> int:
    """Return the wall clock in milliseconds."""
    return time.time_ns() // 1_000_000


class PutStatus(enum.Enum):
    """RocketMQ's PutMessageStatus, as far as an embedded store can reach it."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"


class PullStatus(enum.Enum):
    """The client-side PullStatus."""

    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


@dataclass(frozen=True, slots=True)
class PutResult:
    """Where a put message landed."""

    status: PutStatus
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    msg_id: str
    uniq_key: str
    store_timestamp: int
    store_size: int


class PutResults(Sequence[PutResult]):
    """The results of a columnar put_batch: built lazily, one PutResult per index.

    A batch of a million messages should not pay for a million result objects
    that its caller may never look at; the columns are kept as numpy arrays
    (``commitlog_offsets``, ``queue_offsets``, ``queue_ids``) for callers that
    want them whole.
    """

    __slots__ = (
        "status",
        "topics",
        "queue_ids",
        "queue_offsets",
        "commitlog_offsets",
        "store_sizes",
        "store_timestamp",
        "_host_hex",
        "_uniq_prefix",
        "_uniq_start",
        "_uniq_given",
    )

    def __init__(
        self,
        status: PutStatus,
        topics: list[str] | str,
        queue_ids: np.ndarray,
        queue_offsets: np.ndarray,
        commitlog_offsets: np.ndarray,
        store_sizes: np.ndarray,
        store_timestamp: int,
        store_host: HostAddress,
        uniq_prefix: str,
        uniq_start: int,
        uniq_given: dict[int, str],
    ):
        self.status = status
        self.topics = topics
        self.queue_ids = queue_ids
        self.queue_offsets = queue_offsets
        self.commitlog_offsets = commitlog_offsets
        self.store_sizes = store_sizes
        self.store_timestamp = store_timestamp
        self._host_hex = message_id(store_host, 0)[:-16]
        self._uniq_prefix = uniq_prefix
        self._uniq_start = uniq_start
        self._uniq_given = uniq_given

    def __len__(self) -> int:
        return len(self.commitlog_offsets)

    def _one(self, i: int) -> PutResult:
        phy = int(self.commitlog_offsets[i])
        uniq = self._uniq_given.get(i)
        if uniq is None:
            uniq = f"{self._uniq_prefix}{(self._uniq_start + i) & 0xFFFF:04X}"
        topic = self.topics if isinstance(self.topics, str) else self.topics[i]
        return PutResult(
            self.status,
            topic,
            int(self.queue_ids[i]),
            int(self.queue_offsets[i]),
            phy,
            f"{self._host_hex}{phy:016X}",
            uniq,
            self.store_timestamp,
            int(self.store_sizes[i]),
        )

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self._one(j) for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"put result index {i} out of range for {len(self)} results")
        return self._one(i)

    def __iter__(self):
        return (self._one(i) for i in range(len(self)))

    def __add__(self, other: Iterable[PutResult]) -> list[PutResult]:
        return list(self) + list(other)

    def __radd__(self, other: Iterable[PutResult]) -> list[PutResult]:
        return list(other) + list(self)

    def __repr__(self) -> str:
        return f"PutResults({len(self)} messages, {self.status.name})"


@dataclass(frozen=True, slots=True)
class PullResult:
    """What a pull found; ``next_offset`` is the offset to pull from next."""

    status: PullStatus
    messages: list[MessageExt]
    next_offset: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    order: bool


class SubscriptionExpression:
    """A tag expression: ``*`` (or empty) for all, or ``TagA || TagB``."""

    __slots__ = ("text", "tags", "codes")

    def __init__(self, text: str | None):
        self.text = (text or "*").strip()
        if self.text in ("", "*"):
            self.tags: frozenset[str] | None = None
            self.codes: frozenset[int] = frozenset()
            return
        tags = [t.strip() for t in self.text.split("||")]
        tags = [t for t in tags if t]
        if not tags:
            raise ConfigError(f"tag expression {text!r} names no tag; use '*' for all")
        self.tags = frozenset(tags)
        self.codes = frozenset(java_string_hash(t) for t in tags)

    @property
    def matches_all(self) -> bool:
        return self.tags is None

    def matches_code(self, code: int) -> bool:
        return self.tags is None or code in self.codes

    def matches_tags(self, tags: str | None) -> bool:
        return self.tags is None or (tags is not None and tags in self.tags)


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
            self._touched: list[tuple[str, int, int, int]] = []  # queue offsets an append took
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
            self._write_lock = WriteLock(self.root)
            self.queues = ConsumeQueues(
                self.root,
                config.mapped_file_size_consume_queue,
                self.topics,
                writable=self._files_writable,
            )
            # The names the write side, schedule.py and transaction.py reach them by.
            self._queues = self.queues
            self._cq = self.queues.queue
            self._may_have_queue = self.queues.may_have
            self._qo: dict[tuple[str, int], int] = {}
            self._known_commit_pos = -1
            self._round_robin: dict[str, int] = {}
            self._ids = UniqueIdGenerator(
                self.store_host.ip if not self.store_host.is_v6 else b"\x7f\x00\x00\x01"
            )
            self._arrivals = threading.Condition()
            # (reader.py takes the pull results from this module: imported once it is loaded)
            from rocketspark.store.reader import Reader

            self.reader = Reader(
                config, self.commit_log, self.queues, self.index, self.state, self._arrivals
            )
            self._flush_lock = WriteLock(self.root, FLUSH_LOCK_FILE)
            self._delay_ms = config.delay_levels_ms()
            # The columnar put needs IPv4 hosts (one fixed header layout).
            self._columnar = not (self.store_host.is_v6 or self.born_host.is_v6)
            self._uniq_hash_cache: list[Any] = [None, 0]
            self._topic_cache: dict[str, tuple[int, bytes, int]] = {}
            self._topic_cache_until = 0.0
            self.recovery_report: RecoveryReport | None = None
            self._schedule = ScheduleService(self)
            self._transactions = TransactionService(self)
            # Queues whose ConsumeQueue lacks entries a redispatch met records for:
            # (topic, queue id) -> first missing entry (see _rebuild_queues).
            self._gaps: dict[tuple[str, int], int] = {}
            self.recovery = Recovery(
                root=self.root,
                config=config,
                state=self.state,
                commit_log=self.commit_log,
                checkpoint=self.checkpoint,
                index=self.index,
                queues=self.queues,
                topics=self.topics,
                redispatch=self._redispatch,
                queue_code=self._queue_code,
                gaps=self._gaps,
            )
            if first:
                try:
                    self.recovery_report = self.recovery.recover(truncate_at, full=full_recovery)
                except Exception as exc:
                    if self._write_refused is None:
                        raise
                    raise DiskFullError(
                        f"store {self.root} needs recovery, which cannot "
                        f"write: {self._write_refused}"
                    ) from exc
                self.recovery.adopt_unlisted_topics()
                self._lock.downgrade()
            elif truncate_at is not None:
                raise StoreLockedError(
                    f"store {self.root}: truncate_at needs the store to itself (recovery "
                    "runs in the first process to open it); close the other processes"
                )
            # A holder that must close() for its exit to count as clean (see close).
            self._counted = not exit_without_close
            if self._counted:
                with self._write_lock:
                    self.state.holders = self.state.holders + 1
            self._closed = False
            self._flusher: _Flusher | None = None
            if config.flush_disk_type == "ASYNC_FLUSH":
                self._flusher = _Flusher(self, config.flush_interval_commit_log / 1000.0)
                self._flusher.start()
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
        reading only (writes raise StoreDamagedError, see ``Recovery.recover``);
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
        if self._flusher is not None:
            self._flusher.stop()
        try:
            self.flush()
            if self._counted:
                with self._write_lock:
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
            self.queues.close()
            self.commit_log.close()
            self.index.close()
            self.checkpoint.close()
            self.state.close()
            self._write_lock.close()
            self._flush_lock.close()

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
            cl_min = self.commit_log.min_offset
            holding = [q for q in range(n, current) if self.queues.holds_messages(topic, q, cl_min)]
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
        self._topic_cache.clear()
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
                if not self.queues.holds_messages(
                    SCHEDULE_TOPIC, level - 1, self.commit_log.min_offset
                ):
                    continue
                cq = self._cq(SCHEDULE_TOPIC, level - 1)
                start, end = self._schedule._start_offset(level), cq.max_offset()
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
        if self.topics.get(topic) is None:
            self.topics.create(topic, queues, queues, perm=6, order=False)

    # -- queues ----------------------------------------------------------------------

    def max_offset(self, topic: str, queue_id: int) -> int:
        """Return the next offset to be written in the queue (its message count so far)."""
        self._check_open()
        return self.queues.existing(topic, queue_id).max_offset()

    def min_offset(self, topic: str, queue_id: int) -> int:
        """Return the first offset still readable in the queue."""
        self._check_open()
        return self.queues.existing(topic, queue_id).min_offset(self.commit_log.min_offset)

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """Return the first offset whose store timestamp is >= ``timestamp_ms``.

        Returns the max offset when every message is older, the min offset
        when every message is newer.
        """
        self._check_open()
        return self.reader.offset_for_timestamp(topic, queue_id, timestamp_ms)

    # -- put -------------------------------------------------------------------------

    def put(self, message: Message) -> PutResult:
        """Store one message; returns once it is in the page cache (or on disk, SYNC_FLUSH)."""
        if self._columnar and isinstance(message, Message) and not message.delay_level:
            return self._put_one(message)
        return self.put_batch((message,))[0]

    def _put_one(self, msg: Message) -> PutResult:
        """put() of one message: the columnar path's bytes without its batch machinery.

        Same property order as the row loop of :meth:`_put_columns` (user
        properties, TAGS, KEYS, UNIQ_KEY unless given), one ``struct`` header,
        one ConsumeQueue entry and the index entries written directly.
        """
        # Hot path: every single put. Plain ints and struct, no numpy, no batch objects.
        self._check_open()
        now = self.clock()
        topic = msg.topic
        mono = time.monotonic()
        if mono > self._topic_cache_until:
            self._topic_cache.clear()
            self._topic_cache_until = mono + 1.0
        info = self._topic_cache.get(topic)
        if info is None:
            info = self._topic_cache[topic] = self._topic_info(topic)
        write_queues, topic_part, magic = info
        queue_id = self._select_queue(msg, write_queues)
        user = msg.properties
        text = "".join([f"{k}\x01{v}\x02" for k, v in user.items()]) if user else ""
        tags = msg.tags
        if tags:
            text += f"TAGS\x01{tags}\x02"
        keys = msg.keys
        if keys:
            text += f"KEYS\x01{' '.join(keys)}\x02"
        uniq_prefix, counter = self._ids.next_block(1, now)
        own = user.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) if user else None
        if own is None:
            uniq = uniq_prefix + _HEX4[counter & 0xFFFF]
            text += f"UNIQ_KEY\x01{uniq}\x02"
        else:
            uniq = own
        props = text.encode("utf-8")
        body = msg.body
        if len(props) > 32767 or len(body) > self.config.max_message_size:
            check_sizes(topic, len(body), len(props), self.config.max_message_size)
        rest = b"".join((topic_part, len(props).to_bytes(2, "big"), props))
        total = HEADER_V4.size + len(body) + len(rest)
        seg_size = self.commit_log.segment_size
        if total + END_FILE_MIN_BLANK_LENGTH > seg_size:
            raise MessageTooLargeError(
                f"a record of {total} bytes does not fit in a CommitLog segment of "
                f"{seg_size} bytes (mappedFileSizeCommitLog)"
            )
        crc = zlib.crc32(body) & 0x7FFFFFFF
        born, store = self.born_host, self.store_host
        with self._write_lock:
            self._sync_with_writers()
            state = self.state
            pos = state.commit_pos
            store_ts = max(now, self.clock())
            seg_end = (pos // seg_size + 1) * seg_size
            writes = []
            if total + END_FILE_MIN_BLANK_LENGTH > seg_end - pos:
                writes.append((pos, [BLANK.pack(seg_end - pos, BLANK_MAGIC_CODE)]))
                pos = seg_end
            try:
                queue_offset = self._reserve_queue_offsets(topic, queue_id, 1)
                writes.append(
                    (
                        pos,
                        [
                            HEADER_V4.pack(
                                total,
                                magic,
                                crc,
                                queue_id,
                                msg.flag,
                                queue_offset,
                                pos,
                                0,
                                msg.born_timestamp or now,
                                born.ip,
                                born.port,
                                store_ts,
                                store.ip,
                                store.port,
                                msg.reconsume_times,
                                0,
                                len(body),
                            ),
                            body,
                            rest,
                        ],
                    )
                )
                end = pos + total
                self._make_room(writes[0][0], end, 1 + len(keys))
                state.pending_end = end
                self.commit_log.warm(writes[0][0], end)
                self.commit_log._write(writes)
            except BaseException:
                self._give_back_queue_offsets()
                raise
            state.commit_pos = end
            self._cq(topic, queue_id).put(
                queue_offset, (pos,), (total,), (tags_code(tags) if tags else 0,)
            )
            self._mark_dirty((topic, queue_id), queue_offset)
            hashes = [
                hex_suffixed_hash(self._uniq_hash_base(topic, uniq_prefix), counter)
                if own is None
                else java_string_hash(f"{topic}#{own}")
            ]
            hashes += [java_string_hash(f"{topic}#{k}") for k in keys]
            self.index.put_hashes(hashes, [pos] * len(hashes), [store_ts] * len(hashes))
            state.dispatched_pos = end
            state.write_seq = state.write_seq + 1
            self._known_commit_pos = end
        result = PutResult(
            PutStatus.PUT_OK,
            topic,
            queue_id,
            queue_offset,
            pos,
            message_id(store, pos),
            uniq,
            store_ts,
            total,
        )
        return self._after_append([result])[0]

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
            if self._columnar:
                return self._put_columns(_Columns.of_messages(messages), now)
        else:
            for i, m in enumerate(messages):
                if m.delay_level:
                    self._check_delay_level(m.delay_level, f"message {i} (topic {m.topic!r}): ")
        ids = self._ids.next_ids(len(messages), now)
        prepared = [self._prepare(m, now, uid) for m, uid in zip(messages, ids)]
        return self._append(prepared, now)

    def _topic_for_put(self, topic: str, *, check_topic: bool = True) -> dict[str, Any]:
        """The topic's config; unknown: created when autoCreateTopicEnable (or not checked)."""
        cfg = self.topics.get(topic)
        if cfg is None:
            if check_topic and not self.config.auto_create_topic_enable:
                raise UnknownTopicError(
                    f"topic {topic!r} does not exist in store {self.root}; create it first "
                    "(MessageStore.create_topic or `rocketspark topic create`)"
                )
            validate_topic(topic)
            self.topics.create(
                topic,
                self.config.default_topic_queue_nums,
                self.config.default_topic_queue_nums,
                perm=6,
                order=False,
            )
            cfg = self.topics.get(topic)
            assert cfg is not None
        return cfg

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
        cols = _Columns(bodies, topic, topics, tags, keys, properties, queue_ids, sharding_keys)
        if not len(bodies):
            return _no_results(self.store_host)
        if not self._columnar:
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
        cols = _Columns(
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
            return _no_results(self.store_host)
        self._ensure_system_topic(TRANS_HALF_TOPIC, 1)
        self._ensure_system_topic(TRANS_OP_HALF_TOPIC, 1)
        check_extra_properties(extra_properties)
        extra = "".join(f"{k}\x01{v}\x02" for k, v in (extra_properties or {}).items())
        if not self._columnar:
            return self.prepare_batch(
                cols.messages(),
                producer_group=producer_group,
                properties=dict(extra_properties or {}),
            )  # type: ignore
        return self._put_columns(cols, self.clock(), half=(producer_group, extra))

    def _put_columns(
        self, cols: _Columns, now: int, half: tuple[str, str] | None = None
    ) -> PutResults:
        """The columnar put (no delay, IPv4 hosts).

        Writes exactly the bytes of the per-record path (same property order:
        user properties, TAGS, KEYS, UNIQ_KEY; for a half message then PGROUP,
        __transactionId__, the caller's extra properties, and last TRAN_MSG,
        REAL_TOPIC, REAL_QID, so that committing keeps a prefix of them) with
        one numpy header build and one ``bytes.join`` per CommitLog segment.
        """
        # Hot path: one lean loop per message, locals bound, no per-message objects.
        n = len(cols.bodies)
        uniq_prefix, uniq_start = self._ids.next_block(n, now)
        max_body = self.config.max_message_size
        topics: list[str] = [""] * n
        queue_ids = [0] * n
        bodies: list[bytes] = [b""] * n
        rests: list[bytes] = [b""] * n
        codes = [0] * n
        crc32 = zlib.crc32
        code_of = tags_code
        java_hash = java_string_hash
        rr = self._round_robin
        uniq_given: dict[int, str] = {}
        keyed: list[int] = []
        key_strings: list[str] = []
        # Topic configs are re-read at most once a second (a stat of topics.json
        # costs more than encoding a message); create_topic here clears it.
        mono = time.monotonic()
        if mono > self._topic_cache_until:
            self._topic_cache.clear()
            self._topic_cache_until = mono + 1.0
        topic_info = self._topic_cache
        uniform = self._uniform_batch(cols, now, uniq_prefix, uniq_start, half)
        if uniform is not None:
            batch, keyed_rows, keys_text = uniform
            with self._write_lock:
                self._sync_with_writers()
                results = self._append_columns_locked(
                    batch, now, uniq_prefix, uniq_start, {}, keyed_rows, keys_text
                )
            return self._after_append(results)  # type: ignore[return-value]
        cache: dict[str, tuple[int, bytes, int, str]] = {}
        last_topic = None
        write_queues = 0
        topic_part = b""
        magic = MESSAGE_MAGIC_CODE
        uniq_tail = ""
        same_topic = True
        col_bodies, col_topics, default_topic = cols.bodies, cols.topics, cols.topic
        col_tags, col_keys, col_props = cols.tags, cols.keys, cols.properties
        col_qids, col_shard = cols.queue_ids, cols.sharding_keys
        hex4 = _HEX4
        topic_head = half_head_text = ""
        size_note = ""
        if half is not None:
            group, extra = half
            half_head = f"PGROUP\x01{group}\x02__transactionId__\x01"
            size_note = HALF_SIZE_NOTE

            half_info = self._topic_info(TRANS_HALF_TOPIC)
            half_head_text = half_info[1].decode("latin-1")
        for i in range(n):
            # only None takes the default: an empty name is refused as Message's is
            topic = col_topics[i] if col_topics is not None else None
            if topic is None:
                topic = default_topic
            if topic is None or (topic is not last_topic and topic != last_topic):
                if topic is None:
                    raise InvalidMessageError(
                        f"row {i}: no topic (give a topic for every row, or a default topic)"
                    )
                if topic.__class__ is not str and not isinstance(topic, str):
                    raise InvalidMessageError(f"row {i}: topic must be a string, got {topic!r}")
                info = cache.get(topic)
                if info is None:
                    known = topic_info.get(topic)
                    if known is None:
                        known = topic_info[topic] = self._topic_info(topic)
                    info = cache[topic] = (*known, "UNIQ_KEY\x01" + uniq_prefix)
                    if last_topic is not None:
                        same_topic = False
                write_queues, topic_part, magic, uniq_tail = info
                topic_head = topic_part.decode("latin-1")
                last_topic = topic
            topics[i] = topic
            q = col_qids[i] if col_qids is not None else None
            if q is not None:
                if q.__class__ is not int:
                    q = check_int(
                        "queue_id", q, -INT64_MAX, INT64_MAX, f"row {i} of topic {topic!r}: "
                    )
                if not 0 <= q < write_queues:
                    raise OffsetOutOfRangeError(
                        f"queue_id {q} is out of range for topic {topic!r} "
                        f"with {write_queues} write queues"
                    )
            else:
                shard = col_shard[i] if col_shard is not None else None
                if shard is not None:
                    if shard.__class__ is not str and not isinstance(shard, str):
                        raise InvalidMessageError(
                            f"row {i} of topic {topic!r}: sharding_key "
                            f"must be a string, got {shard!r}"
                        )
                    h = java_hash(shard)
                    q = h % write_queues if h >= 0 else -(-h % write_queues)
                    q = -q if q < 0 else q
                else:
                    q = rr.get(topic, -1) + 1
                    rr[topic] = q
                    q %= write_queues
            queue_ids[i] = q
            text = ""
            pairs = 0
            own_uniq = None
            props = col_props[i] if col_props is not None else None
            if props:
                # (name, value) pairs naming one property twice keep the last, as a
                # Message's dict does (RocketMQ's properties are a map).
                if isinstance(props, Mapping):
                    named = props
                else:
                    try:  # the common case without formatting the error's prefix per row
                        named = (
                            dict(props)
                            if (props.__class__ is list or props.__class__ is tuple)
                            else None
                        )
                    except (TypeError, ValueError):
                        named = None
                    if named is None:
                        named = _property_pairs(props, f"row {i} of topic {topic!r}: ")
                parts = []
                for k, v in named.items():
                    if k.__class__ is not str or v.__class__ is not str or not k:
                        _bad_property(f"row {i} of topic {topic!r}: ", k, v)
                    parts.append(f"{k}\x01{v}\x02")
                text = "".join(parts)
                pairs = len(parts)
                if "UNIQ_KEY\x01" in text:
                    own_uniq = named.get("UNIQ_KEY")
                if "TAGS\x01" in text or "KEYS\x01" in text or "DELAY\x01" in text:
                    for k in named:
                        if k in RESERVED_PROPERTIES:
                            raise InvalidMessageError(
                                reserved_property_error(k, f"row {i} of topic {topic!r}: property")
                            )
                if half is not None and PROPERTY_FIRST_HALF in named:
                    raise ConfigError(f"row {i} of topic {topic!r}: {FIRST_HALF_ERROR}")
            elif props is not None and not isinstance(props, (Mapping, list, tuple)):
                _property_pairs(props, f"row {i} of topic {topic!r}: ")
            tag = col_tags[i] if col_tags is not None else None
            if tag:
                if tag.__class__ is not str and not isinstance(tag, str):
                    raise InvalidMessageError(
                        f"row {i} of topic {topic!r}: tags must be a string, got {tag!r}"
                    )
                text += f"TAGS\x01{tag}\x02"
                codes[i] = code_of(tag)
                pairs += 1
            elif tag is not None and not isinstance(tag, str):
                raise InvalidMessageError(
                    f"row {i} of topic {topic!r}: tags must be a string, got {tag!r}"
                )
            key = col_keys[i] if col_keys is not None else None
            if key:
                if not isinstance(key, str):
                    # the common case (one space between keys, none in them) checked here,
                    # without formatting the error's prefix per row; the rest there
                    try:
                        joined = (
                            " ".join(key)
                            if (key.__class__ is list or key.__class__ is tuple) and "" not in key
                            else None
                        )
                    except TypeError:  # not strings
                        joined = None
                    if joined is not None and joined.count(" ") == len(key) - 1:
                        key = joined
                    else:
                        key = _joined_keys(key, f"row {i} of topic {topic!r}: ")
                text += f"KEYS\x01{key}\x02"
                keyed.append(i)
                key_strings.append(key)
                pairs += 1
            elif key is not None and not isinstance(key, (str, list, tuple)):
                _joined_keys(key, f"row {i} of topic {topic!r}: ")
            if pairs and (text.count("\x01") != pairs or text.count("\x02") != pairs):
                raise InvalidMessageError(
                    f"row {i} of topic {topic!r}: a property name or value, tag or key "
                    "contains a \\x01 or \\x02 separator character"
                )
            if own_uniq is None:
                suffix = hex4[(uniq_start + i) & 0xFFFF]
                text += f"{uniq_tail}{suffix}\x02"
                uniq = uniq_prefix + suffix if half is not None else ""
            else:
                uniq = own_uniq
                uniq_given[i] = own_uniq
            if half is not None:
                text += (
                    f"{half_head}{uniq}\x02{extra}TRAN_MSG\x01true\x02"
                    f"REAL_TOPIC\x01{topic}\x02REAL_QID\x01{q}\x02"
                )
            body = col_bodies[i]
            if body.__class__ is not bytes or not body:
                body = message_body(body, f"row {i} of topic {topic!r}: ")
            bodies[i] = body
            head = topic_head if half is None else half_head_text
            if text.isascii():
                size = len(text)
                if size > 32767 or len(body) > max_body:
                    check_sizes(topic, len(body), size, max_body, size_note)
                # one encode: TOPICLENGTH+TOPIC, PROPERTIESLENGTH (2 bytes) and the text
                rests[i] = f"{head}{chr(size >> 8)}{chr(size & 0xFF)}{text}".encode("latin-1")
            else:
                try:
                    pb = text.encode("utf-8")
                except UnicodeEncodeError:
                    _not_utf8(f"row {i} of topic {topic!r}: ", named if props else {}, tag, key)
                    raise  # the extra properties of a half were checked before
                size = len(pb)
                if size > 32767 or len(body) > max_body:
                    check_sizes(topic, len(body), size, max_body, size_note)
                rests[i] = b"".join((head.encode("latin-1"), size.to_bytes(2, "big"), pb))
        crcs = np.fromiter(map(crc32, bodies), dtype=np.int64, count=n) & 0x7FFFFFFF
        if half is not None:
            batch = ColumnBatch(
                topics=TRANS_HALF_TOPIC,
                queue_ids=np.zeros(n, dtype=np.int32),
                bodies=bodies,
                rests=rests,
                crcs=crcs,
                magics=half_info[2],
                tags_codes=np.asarray(codes, dtype=np.int64),
                born_host=self.born_host,
                born_ts=now,
            )
        else:
            batch = ColumnBatch(
                topics=last_topic if same_topic else topics,  # type: ignore[arg-type]
                queue_ids=np.asarray(queue_ids, dtype=np.int32),
                bodies=bodies,
                rests=rests,
                crcs=crcs,
                magics=magic
                if same_topic
                else np.fromiter((cache[t][2] for t in topics), dtype=np.int32, count=n),
                tags_codes=np.asarray(codes, dtype=np.int64),
                born_host=self.born_host,
                born_ts=now,
            )
        if cols.extra is not None:  # flag, reconsume times, born timestamp (put_batch)
            flags, reconsume, born = cols.extra
            batch.flags = np.asarray(flags, dtype=np.int64)
            batch.reconsume = np.asarray(reconsume, dtype=np.int64)
            batch.born_ts = np.asarray([b or now for b in born], dtype=np.int64)
        with self._write_lock:
            self._sync_with_writers()
            results = self._append_columns_locked(
                batch, now, uniq_prefix, uniq_start, uniq_given, keyed, key_strings
            )
        return self._after_append(results)  # type: ignore[return-value]

    def _uniform_batch(
        self,
        cols: _Columns,
        now: int,
        uniq_prefix: str,
        uniq_start: int,
        half: tuple[str, str] | None,
    ) -> tuple[ColumnBatch, list[int], list[str]] | None:
        """The batch of rows that differ only in body and keys, built without a row loop.

        One topic, no properties, queue ids or sharding keys: every record's
        properties are then one template with the UNIQ_KEY counter (and for a
        half, REAL_QID) patched in, built as a numpy byte matrix, after the TAGS
        (one of a few values) and KEYS of each row. Same bytes as the row loop; None when
        the rows are not uniform (the loop then also reports any bad row).
        Returns the batch, the rows with keys and their KEYS.
        """
        # Hot path: the common put and the sink's; a few C-level scans of the columns.
        bodies = cols.bodies
        n = len(bodies)
        if n < UNIFORM_MIN or cols.extra is not None or not isinstance(bodies, list):
            return None
        topic = cols.topic
        if cols.topics is not None:
            if not isinstance(cols.topics, list) or cols.topics.count(cols.topics[0]) != n:
                return None
            topic = cols.topics[0] if cols.topics[0] is not None else cols.topic
        tag = None
        tag_of: np.ndarray | None = None  # per row, an index into tag_values (tags vary)
        tag_values: list[Any] = []
        if cols.tags is not None:
            if not isinstance(cols.tags, list):
                return None
            if cols.tags.count(cols.tags[0]) == n:
                tag = cols.tags[0]
            else:
                tag_values = list(dict.fromkeys(cols.tags))
                if len(tag_values) > UNIFORM_MAX_TAGS or not all(
                    t is None
                    or (isinstance(t, str) and "\x01" not in t and "\x02" not in t and _utf8(t))
                    for t in tag_values
                ):
                    return None
                number = {t: i for i, t in enumerate(tag_values)}
                tag_of = np.fromiter(map(number.__getitem__, cols.tags), dtype=np.int64, count=n)
        for col in (cols.queue_ids, cols.sharding_keys):
            if col is not None and (not isinstance(col, list) or col.count(None) != n):
                return None
        # An empty row is None or an empty mapping / sequence; any other false value
        # (0, False, b"") is one the row loop refuses. (Columns of Messages hold no such.)
        props_col = cols.properties
        if props_col is not None and (
            any(props_col) or not (cols.checked or _only_empty(props_col, n, ({}, None, [], ())))
        ):
            return None
        key_texts: list[bytes] | None = None
        keyed: list[int] = []
        key_strings: list[str] = []
        has_keys = cols.keys is not None and any(cols.keys)
        if (
            cols.keys is not None
            and not has_keys
            and not (cols.checked or _only_empty(cols.keys, n, (None, (), [], "")))
        ):
            return None
        if has_keys:
            if not isinstance(cols.keys, list):
                return None
            listed = []  # keys given as sequences, and the spaces joining them
            spaces = 0
            try:
                for i, k in enumerate(cols.keys):
                    if not k:
                        if k is not None and not isinstance(k, (str, list, tuple)):
                            return None
                    else:
                        keyed.append(i)
                        if isinstance(k, str):
                            key_strings.append(k)
                        elif k.__class__ is not list and k.__class__ is not tuple:
                            return None
                        else:
                            k = " ".join(k)
                            key_strings.append(k)
                            listed.append(k)
                            spaces += len(cols.keys[i]) - 1
            except TypeError:  # not a sequence of strings
                return None
            joined = "\x01".join(key_strings)
            if (
                "\x02" in joined
                or joined.count("\x01") != len(key_strings) - 1
                or (not joined.isascii() and not _utf8(joined))
            ):
                return None  # the row loop reports the bad key
            if listed:
                # a key of a sequence is non-empty and without spaces (as Message's):
                # its joined text then has exactly one space between keys, none at the ends
                seq = "\x01" + "\x01".join(listed) + "\x01"
                if (
                    seq.count(" ") != spaces
                    or "  " in seq
                    or "\x01 " in seq
                    or " \x01" in seq
                    or "\x01\x01" in seq
                ):
                    return None
            key_texts = [b""] * n
            for i, k in zip(keyed, key_strings):
                key_texts[i] = f"KEYS\x01{k}\x02".encode()
        if topic.__class__ is not str or (tag is not None and not isinstance(tag, str)):
            return None
        if tag and ("\x01" in tag or "\x02" in tag or not _utf8(tag)):
            return None
        if not all(b.__class__ is bytes for b in bodies):
            return None
        lengths = np.fromiter(map(len, bodies), dtype=np.int64, count=n)
        if n and (
            int(lengths.max()) > self.config.max_message_size or not lengths.all()
        ):  # an empty body: the row loop reports it
            return None
        known = self._topic_cache.get(topic)
        if known is None:
            known = self._topic_cache[topic] = self._topic_info(topic)
        write_queues, topic_part, magic = known
        first = self._round_robin.get(topic, -1) + 1  # taken below, once nothing can fail
        queue_ids = (first + np.arange(n, dtype=np.int64)) % write_queues
        counters = (uniq_start + np.arange(n, dtype=np.int64)) & 0xFFFF
        hex4 = _hex4_bytes()[counters]
        head = f"TAGS\x01{tag}\x02" if tag else ""
        # With keys, TAGS and KEYS (which vary) come before the template as pieces of
        # their own, and PROPERTIESLENGTH with them; without, the template has it all.
        separate = key_texts is not None or tag_of is not None
        uniq_head = (
            f"UNIQ_KEY\x01{uniq_prefix}" if separate else f"{head}UNIQ_KEY\x01{uniq_prefix}"
        ).encode()
        if half is None:
            text = [uniq_head, b"\x02"]
            groups = [(None, np.arange(n))]
            lead = topic_part
        else:
            group, extra = half
            half_topic = self._topic_info(TRANS_HALF_TOPIC)
            lead = half_topic[1]
            text = [
                uniq_head,
                f"\x02PGROUP\x01{group}\x02__transactionId__\x01{uniq_prefix}".encode(),
                f"\x02{extra}TRAN_MSG\x01true\x02REAL_TOPIC\x01{topic}\x02REAL_QID\x01".encode(),
            ]
            order = np.argsort(queue_ids, kind="stable")
            per_queue = np.bincount(queue_ids, minlength=write_queues)
            ends = np.cumsum(per_queue)
            groups = [
                (q, order[ends[q] - per_queue[q] : ends[q]])
                for q in range(write_queues)
                if per_queue[q]
            ]
        buffers = []
        offsets = np.empty(n, dtype=np.int64)
        rest_len = np.empty(n, dtype=np.int64)
        which = np.zeros(n, dtype=np.int64)
        for g, (q, rows) in enumerate(groups):
            pieces = text if q is None else [*text, f"{q}\x02".encode()]
            size = sum(len(p) for p in pieces) + 4 * (1 if q is None else 2)
            if size > 32767:
                return None
            template = bytearray(b"" if separate else lead + size.to_bytes(2, "big"))
            slots = []
            for k, piece in enumerate(pieces):
                template += piece
                if k < (1 if q is None else 2):
                    slots.append(len(template))
                    template += b"0000"
            m = len(rows)
            matrix = np.tile(np.frombuffer(bytes(template), dtype=np.uint8), (m, 1))
            for at in slots:
                matrix[:, at : at + 4] = hex4[rows]
            buffers.append(matrix)
            width = len(template)
            offsets[rows] = np.arange(m, dtype=np.int64) * width
            rest_len[rows] = width
            which[rows] = g
        rests: Pieces | tuple[Pieces, ...] = Pieces(
            buffers, offsets, rest_len, which if len(buffers) > 1 else 0
        )
        if tag_of is not None:
            heads = [f"TAGS\x01{t}\x02".encode() if t else b"" for t in tag_values]
            head_p = Pieces(
                heads,
                np.zeros(n, dtype=np.int64),
                np.asarray([len(h) for h in heads], dtype=np.int64)[tag_of],
                tag_of,
            )
            codes = np.asarray([tags_code(t) if t else 0 for t in tag_values], dtype=np.int64)[
                tag_of
            ]
        else:
            head_p = Pieces.repeated(head.encode(), n)
            codes = np.full(n, tags_code(tag) if tag else 0, dtype=np.int64)
        if separate:
            # TAGS and KEYS vary: lead, PROPERTIESLENGTH, TAGS, KEYS, then the template
            keys_p = None if key_texts is None else Pieces.of_list(key_texts)
            sizes = head_p.lengths + rest_len
            if keys_p is not None:
                sizes = sizes + keys_p.lengths
            if int(sizes.max()) > 32767:
                return None
            rests = (
                Pieces.repeated(lead, n),
                Pieces.fixed(sizes.astype(">u2"), 2, n),
                head_p,
                *((keys_p,) if keys_p is not None else ()),
                rests,
            )
        self._round_robin[topic] = first + n - 1  # the row loop would have got as far
        crcs = np.fromiter(map(zlib.crc32, bodies), dtype=np.int64, count=n) & 0x7FFFFFFF
        if half is None:
            return (
                ColumnBatch(
                    topics=topic,
                    queue_ids=queue_ids.astype(np.int32),
                    bodies=bodies,
                    rests=rests,
                    crcs=crcs,
                    magics=magic,
                    tags_codes=codes,
                    born_host=self.born_host,
                    born_ts=now,
                ),
                keyed,
                key_strings,
            )
        half_batch = ColumnBatch(
            topics=TRANS_HALF_TOPIC,
            queue_ids=np.zeros(n, dtype=np.int32),
            bodies=bodies,
            rests=rests,
            crcs=crcs,
            magics=half_topic[2],
            tags_codes=codes,
            born_host=self.born_host,
            born_ts=now,
        )
        return half_batch, keyed, key_strings  # halves are indexed by key too, as RocketMQ does

    def _topic_info(self, topic: str) -> tuple[int, bytes, int]:
        """(write queues, TOPICLENGTH+TOPIC bytes, magic) of a topic to put to."""
        cfg = self._topic_for_put(topic)
        tb = topic.encode("utf-8")
        v2 = len(tb) > V1_MAX_TOPIC_LENGTH
        return (
            int(cfg["writeQueueNums"]),
            (SHORT.pack(len(tb)) if v2 else bytes((len(tb),))) + tb,
            MESSAGE_MAGIC_CODE_V2 if v2 else MESSAGE_MAGIC_CODE,
        )

    def _append_columns_locked(
        self,
        batch: ColumnBatch,
        now: int,
        uniq_prefix: str,
        uniq_start: int,
        uniq_given: dict[int, str],
        keyed: list[int],
        key_strings: list[str],
    ) -> PutResults:
        return self._append_columns_then_locked(
            batch, (), now, uniq_prefix, uniq_start, uniq_given, keyed, key_strings
        )[0]

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
        """Append ``batch`` and then the records ``then`` as ONE append.

        COMMIT_POS moves once, after both are copied: a writer killed between
        them leaves an unfinished append that the next writer or recovery wipes
        whole (a transaction commit's final records never outlive its op record).
        """
        state = self.state
        start = state.commit_pos
        store_ts = max(now, self.clock())
        index_entries = (
            len(batch) + sum(s.count(" ") + 1 for s in key_strings) + _index_entries(then)
        )

        def set_pending(end: int) -> None:
            self._make_room(start, end, index_entries)
            state.pending_end = end

        try:
            placed = self.commit_log.append_columns(
                start, batch, store_ts, self._reserve_queue_offsets, set_pending
            )
            end = placed.end
            placed_then: list[Appended] = []
            if then:
                placed_then, end = self.commit_log.append(
                    end, then, store_ts, self._reserve_queue_offsets, set_pending
                )
        except BaseException:
            self._give_back_queue_offsets()
            raise
        state.commit_pos = end
        for topic, qid, idx in placed.groups:
            first = int(placed.queue_offsets[idx[0]])
            self._cq(topic, qid).put(
                first, placed.phys[idx], placed.sizes[idx], batch.tags_codes[idx]
            )
            self._mark_dirty((topic, qid), first)
        self._index_columns(
            batch,
            placed,
            store_ts,
            uniq_prefix,
            uniq_start,
            uniq_given,
            keyed,
            key_strings,
            uniq_hashes,
        )
        if then:
            self._dispatch(then, placed_then, store_ts)
        state.dispatched_pos = end
        state.write_seq = state.write_seq + 1
        self._known_commit_pos = end
        results = PutResults(
            PutStatus.PUT_OK,
            batch.topics,
            batch.queue_ids,
            placed.queue_offsets,
            placed.phys,
            placed.sizes,
            store_ts,
            self.store_host,
            uniq_prefix,
            uniq_start,
            uniq_given,
        )
        return results, self._record_results(then, placed_then, store_ts)

    def _index_columns(
        self,
        batch: ColumnBatch,
        placed: Placement,
        store_ts: int,
        uniq_prefix: str,
        uniq_start: int,
        uniq_given: dict[int, str],
        keyed: list[int],
        key_strings: list[str],
        uniq_hashes: np.ndarray | None = None,
    ) -> None:
        """Index topic#UNIQ_KEY then topic#key of each record, in record order.

        ``uniq_hashes``: the topic#UNIQ_KEY hashCodes, when the caller has them.
        """
        n = len(batch)
        if uniq_hashes is not None:
            hashes = uniq_hashes
        elif n <= SMALL_BATCH and not keyed and not uniq_given:
            hashes_small = []
            for i in range(n):
                base = self._uniq_hash_base(batch.topic_of(i), uniq_prefix)
                hashes_small.append(hex_suffixed_hash(base, uniq_start + i))
            self.index.put_hashes(hashes_small, placed.phys.tolist(), [store_ts] * n)
            return
        else:
            counters = uniq_start + np.arange(n, dtype=np.int64)
            if isinstance(batch.topics, str):
                hashes = java_hash_hex_suffixed(f"{batch.topics}#{uniq_prefix}", counters)
            else:
                hashes = np.empty(n, dtype=np.int32)
                topics_arr = np.asarray(batch.topics, dtype=object)
                for t in set(batch.topics):
                    sel = np.flatnonzero(topics_arr == t)
                    hashes[sel] = java_hash_hex_suffixed(f"{t}#{uniq_prefix}", counters[sel])
        owners = np.arange(n, dtype=np.int64)
        if uniq_given and uniq_hashes is None:
            at = np.fromiter(uniq_given, dtype=np.int64, count=len(uniq_given))
            hashes[at] = java_hash_many(
                [f"{batch.topic_of(int(i))}#{uniq_given[int(i)]}" for i in at]
            )
        if keyed:
            strings: list[str] = []
            owner_list: list[int] = []
            for i, joined in zip(keyed, key_strings):
                prefix = batch.topic_of(i) + "#"
                parts = [prefix + k for k in joined.split(" ") if k]
                strings.extend(parts)
                owner_list.extend([i] * len(parts))
            key_owner = np.asarray(owner_list, dtype=np.int64)
            # Each record's UNIQ_KEY entry comes before its key entries.
            owners = np.concatenate((owners, key_owner))
            order = np.argsort(
                owners * 2
                + np.concatenate(
                    (np.zeros(n, dtype=np.int64), np.ones(len(key_owner), dtype=np.int64))
                ),
                kind="stable",
            )
            hashes = np.concatenate((hashes, java_hash_many(strings)))[order]
            owners = owners[order]
        self.index.put_hashes(
            hashes, placed.phys[owners], np.full(len(owners), store_ts, dtype=np.int64)
        )

    def _uniq_hash_base(self, topic: str, uniq_prefix: str) -> int:
        """hashCode of ``topic#<uniq_prefix>``, cached: it changes once a millisecond."""
        key = (topic, uniq_prefix)
        cached = self._uniq_hash_cache
        if cached[0] != key:
            cached[:] = [key, java_string_hash(f"{topic}#{uniq_prefix}") & 0xFFFFFFFF]
        return cached[1]

    def _select_queue(self, msg: Message, write_queues: int) -> int:
        if msg.queue_id is not None:
            if not 0 <= msg.queue_id < write_queues:
                raise OffsetOutOfRangeError(
                    f"queue_id {msg.queue_id} is out of range for topic {msg.topic!r} "
                    f"with {write_queues} write queues"
                )
            return msg.queue_id
        if msg.sharding_key is not None:
            # SelectMessageQueueByHash: hashCode % n, made non-negative.
            return abs(
                java_string_hash(msg.sharding_key) % write_queues
                if java_string_hash(msg.sharding_key) >= 0
                else -(-java_string_hash(msg.sharding_key) % write_queues)
            )
        n = self._round_robin.get(msg.topic, -1) + 1
        self._round_robin[msg.topic] = n
        return n % write_queues

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
        topic = msg.topic
        cfg = self._topic_for_put(topic, check_topic=check_topic)
        queue_id = self._select_queue(msg, int(cfg["writeQueueNums"]))
        props = msg.all_properties()
        props.setdefault(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, uniq)
        delay_ms = 0
        if msg.delay_level > 0 and transaction_type(sys_flag) in (0, SysFlag.TRANSACTION_COMMIT):
            level = self._check_delay_level(msg.delay_level, f"topic {topic!r}: ")
            props[PROPERTY_DELAY_TIME_LEVEL] = str(level)
            props[PROPERTY_REAL_TOPIC] = topic
            props[PROPERTY_REAL_QUEUE_ID] = str(queue_id)
            topic = SCHEDULE_TOPIC
            queue_id = level - 1
            delay_ms = self._delay_ms[level - 1]
            self._ensure_system_topic(SCHEDULE_TOPIC, len(self._delay_ms))
        return self._prepare_raw(
            topic,
            queue_id,
            msg.body,
            props,
            now,
            sys_flag=sys_flag,
            flag=msg.flag,
            born_timestamp=msg.born_timestamp or now,
            reconsume_times=msg.reconsume_times,
            prepared_offset=prepared_offset,
            delay_ms=delay_ms,
        )

    def _prepare_raw(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        props: dict[str, str],
        now: int,
        *,
        sys_flag: int = 0,
        flag: int = 0,
        born_timestamp: int = 0,
        born_host: HostAddress | None = None,
        reconsume_times: int = 0,
        prepared_offset: int = 0,
        delay_ms: int = 0,
    ) -> PreparedRecord:
        props_bytes = encode_properties(props)
        if topic == TRANS_HALF_TOPIC:  # name the real topic, and what the half added
            check_sizes(
                props.get(PROPERTY_REAL_TOPIC, topic),
                len(body),
                len(props_bytes),
                self.config.max_message_size,
                HALF_SIZE_NOTE,
            )
        else:
            check_sizes(topic, len(body), len(props_bytes), self.config.max_message_size)
        topic_bytes = topic.encode("utf-8")
        v2 = len(topic_bytes) > V1_MAX_TOPIC_LENGTH
        topic_part = SHORT.pack(len(topic_bytes)) if v2 else bytes((len(topic_bytes),))
        tail = b"".join((body, topic_part, topic_bytes, SHORT.pack(len(props_bytes)), props_bytes))
        born = born_host or self.born_host
        sys_flag &= ~(SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6)
        if born.is_v6:
            sys_flag |= SysFlag.BORNHOST_V6
        if self.store_host.is_v6:
            sys_flag |= SysFlag.STOREHOST_V6
        tran = transaction_type(sys_flag)
        keys_raw = props.get("KEYS")
        return PreparedRecord(
            topic=topic,
            queue_id=queue_id,
            body_len=len(body),
            tail=tail,
            crc=zlib.crc32(body) & 0x7FFFFFFF,
            flag=flag,
            sys_flag=sys_flag,
            born_timestamp=born_timestamp or now,
            born_host=born,
            reconsume_times=reconsume_times,
            prepared_offset=prepared_offset,
            magic=MESSAGE_MAGIC_CODE_V2 if v2 else MESSAGE_MAGIC_CODE,
            tags_code=tags_code(props.get(PROPERTY_TAGS)),
            uniq_key=props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX),
            keys=tuple(k for k in keys_raw.split(" ") if k) if keys_raw else (),
            dispatch=tran in (0, SysFlag.TRANSACTION_COMMIT),
            delay_ms=delay_ms,
        )

    def _append(self, prepared: Sequence[PreparedRecord], now: int) -> list[PutResult]:
        with self._write_lock:
            self._sync_with_writers()
            results = self._append_locked(prepared, now)
        return self._after_append(results)

    def _append_locked(self, prepared: Sequence[PreparedRecord], now: int) -> list[PutResult]:
        """Append and dispatch ``prepared`` (the caller holds the write lock and synced)."""
        state = self.state
        start = state.commit_pos
        store_ts = max(now, self.clock())

        def set_pending(end: int) -> None:
            self._make_room(start, end, _index_entries(prepared))
            state.pending_end = end

        try:
            placed, end = self.commit_log.append(
                start, prepared, store_ts, self._reserve_queue_offsets, set_pending
            )
        except BaseException:
            self._give_back_queue_offsets()
            raise
        state.commit_pos = end
        self._dispatch(prepared, placed, store_ts)
        state.dispatched_pos = end
        state.write_seq = state.write_seq + 1
        self._known_commit_pos = end
        return self._record_results(prepared, placed, store_ts)

    def _record_results(
        self, prepared: Sequence[PreparedRecord], placed: Sequence[Appended], store_ts: int
    ) -> list[PutResult]:
        host = self.store_host
        return [
            PutResult(
                PutStatus.PUT_OK,
                r.topic,
                r.queue_id,
                a.queue_offset,
                a.physical_offset,
                message_id(host, a.physical_offset),
                r.uniq_key or "",
                store_ts,
                a.size,
            )
            for r, a in zip(prepared, placed)
        ]

    def _after_append(self, results: list[PutResult]) -> list[PutResult]:
        """Wake long polls and, under SYNC_FLUSH, wait for the group commit."""
        with self._arrivals:
            self._arrivals.notify_all()
        if results and self.config.flush_disk_type == "SYNC_FLUSH":
            last = results[-1]
            end = last.commitlog_offset + last.store_size
            if not self._flush_commit_log(end, self.config.sync_flush_timeout / 1000.0):
                if isinstance(results, PutResults):
                    results.status = PutStatus.FLUSH_DISK_TIMEOUT
                    return results
                results = [
                    dataclasses.replace(r, status=PutStatus.FLUSH_DISK_TIMEOUT) for r in results
                ]
        return results

    def _next_queue_offset(self, topic: str, queue_id: int) -> int:
        """The queue offset the next append gives the queue (caller holds the write lock)."""
        n = self._qo.get((topic, queue_id))
        return self._cq(topic, queue_id).max_offset() if n is None else n

    def _reserve_queue_offsets(self, topic: str, queue_id: int, count: int) -> int:
        n = self._next_queue_offset(topic, queue_id)
        self._qo[(topic, queue_id)] = n + count
        self._touched.append((topic, queue_id, n, count))
        return n

    def _make_room(self, start: int, end: int, index_entries: int) -> None:
        """Reserve the blocks an append of CommitLog [start, end) writes, or refuse it.

        Called holding the write lock once the append has reserved its queue
        offsets (``_touched``) and before it writes a byte, so a refused append
        (DiskFullError: the disk guard, or no blocks for its writes; its caller
        gives the queue offsets back) leaves nothing behind but, at most,
        ConsumeQueue blocks or files past their queue's end, which hold
        nothing. Blocks are reserved a chunk ahead (MappedFile.reserve): most
        appends cost a comparison per file. The ConsumeQueue entries first,
        then the index entries, the CommitLog last (a segment past an
        unfinished one would be left empty). An index file the append will
        start is only checked for room: it is created, with the blocks of its
        slot table and first entries, when the append's entries reach it.
        """
        touched = self._touched
        if touched:
            self._touched = []
        if self._write_refused is not None:
            raise self._write_refused
        self._guard.check()
        for topic, qid, first, count in touched:
            q = self._cq(topic, qid)
            q_files = q.files.files
            if q_files:  # the hot path, inlined: within the last file's reserved blocks
                last = q_files[-1]
                pos = first * CQ_STORE_UNIT_SIZE - last.start_offset
                if pos >= 0 and pos + count * CQ_STORE_UNIT_SIZE <= last.reserved:
                    continue
            q.reserve(first, count)
        need = self.index.reserve(index_entries)
        if need:
            self._guard.require(need, "the new index files of this put")
        cl = self.commit_log.files
        files = cl.files
        if (
            not files
            or start < files[-1].start_offset
            or end - files[-1].start_offset > files[-1].reserved
        ):
            cl.reserve(start, end)

    def _give_back_queue_offsets(self) -> None:
        """Forget reserved queue offsets after an append failed before COMMIT_POS moved.

        A kept reservation would make the next append skip offsets: a
        ConsumeQueue hole, behind which readers never see a record. The next
        append reads each queue's end from its ConsumeQueue again.
        """
        self._qo.clear()
        self._touched = []

    def _check_delay_level(self, level: int, where: str = "") -> int:
        """Return ``level`` if it is one of the configured delay levels (1..n)."""
        n = len(self._delay_ms)
        if not 1 <= level <= n:
            raise InvalidMessageError(
                f"{where}delay_level {level} is not one of the store's delay levels 1..{n} "
                "(messageDelayLevel)"
            )
        return level

    def _sync_with_writers(self) -> None:
        """Catch up with what other processes wrote (call holding the write lock)."""
        state = self.state
        commit = state.commit_pos
        if commit == self._known_commit_pos and state.pending_end <= commit:
            return
        if state.damage_following:
            raise self._damage_error()
        self._qo.clear()
        self.index.sync_tail()  # another writer may have started an index file
        if state.pending_end > commit:
            # A writer died mid-append: its bytes past COMMIT_POS were never acknowledged.
            log.warning(
                "store %s: wiping an unfinished append at CommitLog [%d, %d)",
                self.root,
                commit,
                state.pending_end,
            )
            self.commit_log.wipe(commit, state.pending_end)
            state.pending_end = commit
        if state.dispatched_pos < commit:
            # The writer died before dispatching all it committed, maybe inside an
            # index update: relink the index before the records are indexed again.
            self.index.repair_tail()
            self._redispatch(state.dispatched_pos, commit)
            self._rebuild_queues(commit)
            state.dispatched_pos = commit
        self._known_commit_pos = commit

    def _dispatch(
        self, prepared: Sequence[PreparedRecord], placed: Sequence[Appended], store_ts: int
    ) -> None:
        groups: dict[tuple[str, int], tuple[int, list[int], list[int], list[int]]] = {}
        index_topics: list[str] = []
        index_uniq: list[str | None] = []
        index_keys: list[tuple[str, ...]] = []
        index_phy: list[int] = []
        for r, a in zip(prepared, placed):
            if r.dispatch:
                key = (r.topic, r.queue_id)
                g = groups.get(key)
                if g is None:
                    g = groups[key] = (a.queue_offset, [], [], [])
                g[1].append(a.physical_offset)
                g[2].append(a.size)
                g[3].append(store_ts + r.delay_ms if r.delay_ms else r.tags_code)
            if transaction_type(r.sys_flag) != SysFlag.TRANSACTION_ROLLBACK and (
                r.uniq_key or r.keys
            ):
                index_topics.append(r.topic)
                index_uniq.append(r.uniq_key)
                index_keys.append(r.keys)
                index_phy.append(a.physical_offset)
        for key, (first, offs, sizes, tags) in groups.items():
            self._cq(*key).put(first, offs, sizes, tags)
            self._mark_dirty(key, first)
        if index_phy:
            self.index.build_index_batch(
                index_topics, index_uniq, index_keys, index_phy, [store_ts] * len(index_phy)
            )

    def _mark_dirty(self, key: tuple[str, int], first: int) -> None:
        self.queues.mark_dirty(key, first)

    def _redispatch(
        self,
        start: int,
        end: int | None,
        *,
        index_from: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> tuple[int, str]:
        """Rebuild ConsumeQueue and index entries from CommitLog records in [start, end).

        With ``end`` None, goes on until the data ends (recovery) and returns
        where the last valid record ends and why the scan stopped.
        """
        scan_from = start if index_from is None else min(start, index_from)
        pos = scan_from
        reason = ""
        for pos, check in self.commit_log.scan(scan_from, verify_crc=True):
            if end is not None and pos >= end:
                break
            if check.size <= 0:
                if check.size == RECORD_INVALID:
                    reason = check.reason
                break
            if progress is not None:
                progress(pos)
            self._dispatch_check(pos, check, cq=pos >= start, reindex_from=index_from)
        else:  # pragma: no cover - scan always ends with an END/INVALID check
            pass
        return pos, reason

    def _dispatch_check(
        self, pos: int, check: RecordCheck, *, cq: bool = True, reindex_from: int | None = None
    ) -> None:
        tran = transaction_type(check.sys_flag)
        key = (check.topic, check.queue_id)
        if cq and key not in self._queues and not self._may_have_queue(*key):
            # QUEUEID is outside every check (BODYCRC covers the body only): a flipped
            # bit there must not make a queue the topic does not have.
            log.error(
                "store %s: the record at CommitLog %d names queue %d of %r, which "
                "the topic does not have; not dispatched",
                self.root,
                pos,
                check.queue_id,
                check.topic,
            )
            cq = False
        if cq and tran in (0, SysFlag.TRANSACTION_COMMIT):
            q = self._cq(*key)
            have = q.max_offset()
            if key in self._gaps:
                pass  # rebuilt from its first missing entry (_rebuild_queues)
            elif (
                check.queue_offset > have
                and check.topic != TRANS_HALF_TOPIC
                and have > 0
                and q.entry(have - 1) is not None
            ):
                # Entries missing before this record: a hole (a put refused after it
                # took its queue offset), or entries lost. Never written at its own
                # offset: an empty entry would hide it and every later one. (A queue
                # with no entry yet starts at the record's offset, as RocketMQ's does:
                # the records before it may have expired.)
                log.warning(
                    "ConsumeQueue %s/%d: entries %d to %d missing before the record "
                    "at CommitLog %d; rebuilding the queue",
                    check.topic,
                    check.queue_id,
                    have,
                    check.queue_offset - 1,
                    pos,
                )
                self._gaps[key] = have
            elif check.queue_offset >= have:
                q.put(check.queue_offset, [pos], [check.size], [self._queue_code(check)])
                self._mark_dirty(key, check.queue_offset)
        if tran != SysFlag.TRANSACTION_ROLLBACK and (check.uniq_key or check.keys):
            keys = tuple(k for k in (check.keys or "").split(" ") if k)
            self.index.build_index_batch(
                [check.topic],
                [check.uniq_key],
                [keys],
                [pos],
                [check.store_timestamp],
                reindex_from=reindex_from,
            )

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
            done["consumequeue"] = self.queues.delete_below(new_min)
            done["index"] = self.index.delete_below(new_min)
        log.info("store %s: deleted %s; CommitLog now starts at %d", self.root, done, new_min)
        return done

    # -- flushing ----------------------------------------------------------------------

    def _flush_commit_log(self, end: int, timeout: float) -> bool:
        """Group commit: force the CommitLog up to at least ``end``; False on timeout.

        A put covered by an earlier sync returns at once; otherwise this process
        syncs everything committed so far, its own put and any other's. Syncs of
        several processes run side by side, without a lock: an msync of pages
        another msync is writing back waits for that write rather than writing
        them again, so concurrent syncs share their I/O. (Behind a lock, waiters
        queued one sync after another: 4 single-put producers reached 5.9k
        puts/s with it, 8.3k without, here.) SYNCED_POS only ever holds a
        position a finished sync covered: two processes racing to write it can
        move it back to the smaller of theirs, never past what is on disk, which
        at worst makes a later put sync again.
        """
        state = self.state
        if state.synced_pos >= end:
            return True
        deadline = time.monotonic() + timeout
        synced = state.synced_pos
        upto = state.commit_pos  # one fsync covers every put committed so far
        self.commit_log.flush(synced, upto)
        if upto > state.synced_pos:
            state.synced_pos = upto
        return time.monotonic() <= deadline

    def flush(self) -> None:
        """Force the CommitLog, the ConsumeQueues, the index and the checkpoint to disk."""
        state = self.state
        with self._flush_lock:
            # Below DISPATCHED_POS every ConsumeQueue entry is written and marked dirty
            # (COMMIT_POS moves before the dispatch): FLUSHED_POS may only claim that.
            dispatched = state.dispatched_pos
            end = state.commit_pos
            start = state.flushed_pos
            if end <= start:
                return
            self.commit_log.flush(min(start, state.synced_pos), end)
            self.queues.flush()
            self.index.flush()
            now = self.clock()
            self.checkpoint.update(physic=now, logics=now, index=now)
            self.checkpoint.flush()
            if end > state.synced_pos:
                state.synced_pos = end
            flushed = min(end, dispatched)
            if flushed > state.flushed_pos:
                state.flushed_pos = flushed

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
        return self.reader.pull(topic, queue_id, offset, max_msgs, expression, timeout_ms)

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

        Returns the batches (schema ``record_batch.ARROW_SCHEMA``) and the offset
        to read next. ``end`` None or past the max offset reads to the max.
        Raises OffsetOutOfRangeError when ``start`` is below the min offset, and
        CorruptRecordError for a damaged record (a body CRC mismatch only when
        ``check_crc``, by default the store's checkCRCOnRead).
        """
        self._check_open()
        return self.reader.read_batches(
            topic,
            queue_id,
            start,
            end,
            expression,
            broker_name=broker_name,
            check_crc=check_crc,
        )

    def get_message(self, commitlog_offset: int) -> MessageExt:
        """Return the message stored at ``commitlog_offset``."""
        self._check_open()
        return self.reader.get_message(commitlog_offset)

    # -- consumer groups -------------------------------------------------------------

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Record that ``group`` will next consume ``offset`` of the queue."""
        self._check_open()
        validate_group(group)
        if offset < 0:
            raise OffsetOutOfRangeError(f"offset to commit must be >= 0, got {offset}")
        self.queues.existing(topic, queue_id)
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
            info = infos.get(topic) or infos.setdefault(topic, self.topic(topic))
            check_queue(info.name, queue_id, info.read_queue_nums, info.write_queue_nums)
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
                self._check_delay_level(level, f"message {i}: ")
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
                self._ensure_system_topic(topic, DLQ_NUMS_PER_GROUP)
                queue_id = 0
            else:
                topic = retry_topic(group)
                self._ensure_system_topic(topic, RETRY_NUMS_PER_GROUP)
                queue_id = 0
                level = delay_level or 3 + message.reconsume_times
                level = min(level, len(self._delay_ms))
                props[PROPERTY_DELAY_TIME_LEVEL] = str(level)
                props[PROPERTY_REAL_TOPIC] = topic
                props[PROPERTY_REAL_QUEUE_ID] = str(queue_id)
                delay_ms = self._delay_ms[level - 1]
                topic, queue_id = SCHEDULE_TOPIC, level - 1
                self._ensure_system_topic(SCHEDULE_TOPIC, len(self._delay_ms))
            if not props.get(PROPERTY_ORIGIN_MESSAGE_ID):
                props[PROPERTY_ORIGIN_MESSAGE_ID] = message.msg_id
            born = _parse_host(message.born_host)
            recs.append(
                self._prepare_raw(
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
        return self.reader.query_by_key(topic, key, begin_ms, end_ms, max_num)

    # -- recovery --------------------------------------------------------------------

    def _rebuild_queues(self, upto: int) -> list[tuple[str, int, int, int]]:
        return self.recovery.rebuild_queues(upto)

    def _damage_error(self) -> StoreDamagedError:
        return self.recovery.damage_error()

    def _queue_code(self, check: RecordCheck) -> int:
        """The ConsumeQueue tags code of a record (the delivery time for a delayed one)."""
        if check.topic == SCHEDULE_TOPIC:
            level = int((check.properties or {}).get(PROPERTY_DELAY_TIME_LEVEL, "1"))
            level = min(max(level, 1), len(self._delay_ms))
            return check.store_timestamp + self._delay_ms[level - 1]
        return tags_code(check.tags)


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


def _index_entries(records: Sequence[PreparedRecord]) -> int:
    """At most how many index entries ``records`` add (UNIQ_KEY and each key)."""
    return sum(1 + len(r.keys) for r in records)


def _parse_host(text: str) -> HostAddress:
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    return HostAddress.parse(host, int(port))


class _Flusher(threading.Thread):
    """ASYNC_FLUSH: force dirty pages every flushIntervalCommitLog ms."""

    def __init__(self, store: MessageStore, interval: float):
        super().__init__(name=f"rocketspark-flush-{os.path.basename(store.root)}", daemon=True)
        self.store = store
        self.interval = interval
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                self.store.flush()
            except Exception:  # keep flushing; the next put or close will report
                log.exception("background flush of %s failed", self.store.root)

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=10)


__all__ = [
    "MessageStore",
    "PutResult",
    "PutStatus",
    "PullResult",
    "PullStatus",
    "SubscriptionExpression",
    "TopicInfo",
    "FlushTimeoutError",
    "body_crc",
    "DLQ_GROUP_TOPIC_PREFIX",
    "RETRY_GROUP_TOPIC_PREFIX",
]


def _utf8(text: str) -> bool:
    """Does ``text`` encode as UTF-8 (holds no lone surrogate)?"""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _property_pairs(props: Any, where: str) -> dict[Any, Any]:
    """Properties given as (name, value) pairs, as a dict (checked as Message does)."""
    try:
        if isinstance(props, (str, bytes, bytearray, memoryview)):
            raise TypeError
        return dict(props)
    except (TypeError, ValueError):
        raise InvalidMessageError(
            f"{where}properties must be a mapping or (name, value) pairs, got {props!r}"
        ) from None


def _bad_property(where: str, name: Any, value: Any) -> None:
    """Raise unless ``name`` and ``value`` are strings (of a subclass), the name not empty."""
    if not isinstance(name, str) or not isinstance(value, str):
        raise InvalidMessageError(
            f"{where}message property {name!r}: names and values must be strings"
        )
    if not name:
        raise InvalidMessageError(f"{where}message property names must not be empty")


def _joined_keys(keys: Any, where: str) -> str:
    """Keys given as a sequence, joined as RocketMQ stores them (checked as Message does)."""
    if keys.__class__ is list or keys.__class__ is tuple:  # the common case, C-level tests
        try:
            joined = " ".join(keys)
        except TypeError:  # not strings: reported below
            pass
        else:
            # no key is empty or holds a space: one space between keys, no more
            if joined.count(" ") == len(keys) - 1 and "" not in keys:
                return joined
    if isinstance(keys, (bytes, bytearray, memoryview, Mapping)) or not isinstance(keys, Iterable):
        raise InvalidMessageError(
            f"{where}keys must be a string or a sequence of strings, got {keys!r}"
        )
    keys = list(keys)
    for k in keys:
        if not isinstance(k, str) or not k or " " in k:
            raise InvalidMessageError(
                f"{where}message key {k!r} must be a non-empty string without spaces"
            )
    return " ".join(keys)


def _not_utf8(where: str, props: Mapping[str, str], tag: str | None, key: str | None) -> None:
    """Raise InvalidMessageError naming the field that does not encode as UTF-8."""
    for name, value in props.items():
        check_utf8("message property name", name, where)
        check_utf8("message property value", value, f"{where}property {name!r}: ")
    if tag:
        check_utf8("message property tags", tag, where)
    if key:
        check_utf8("message property key", key, where)


def _only_empty(col: Any, n: int, empties: tuple[Any, ...]) -> bool:
    """Is every entry of the list ``col`` (n long) equal to one of ``empties``?

    C-level counts, the likeliest empty first: one scan in the common case.
    """
    if not isinstance(col, list):
        return False
    left = n
    for empty in empties:
        left -= col.count(empty)
        if not left:
            return True
    return False


def _column_length(name: str, col: Any) -> int:
    """The length of a column: a sized sequence, not one text (whose characters a
    column of the same length would silently take for its rows)."""
    if col.__class__ is list:
        return len(col)
    if isinstance(col, (str, bytes, bytearray, Mapping)) or not hasattr(col, "__len__"):
        raise ConfigError(
            f"column {name} must be a sequence with one entry per message, got {type(col).__name__}"
        )
    return len(col)


class _Columns:
    """The columns of a columnar put, checked for equal lengths."""

    __slots__ = (
        "bodies",
        "topic",
        "topics",
        "tags",
        "keys",
        "properties",
        "queue_ids",
        "sharding_keys",
        "extra",
        "checked",
    )

    def __init__(
        self,
        bodies: Sequence[Any],
        topic: str | None,
        topics: Any,
        tags: Any,
        keys: Any,
        properties: Any,
        queue_ids: Any,
        sharding_keys: Any,
        extra: tuple[Any, Any, Any] | None = None,
    ):
        n = _column_length("bodies", bodies)
        for name, col in (
            ("topics", topics),
            ("tags", tags),
            ("keys", keys),
            ("properties", properties),
            ("queue_ids", queue_ids),
            ("sharding_keys", sharding_keys),
        ):
            if col is not None and _column_length(name, col) != n:
                raise ConfigError(f"column {name} has {len(col)} entries, bodies has {n}")
        if topic is None and topics is None:
            raise ConfigError("no topic: give topic= (one for all rows) or topics=")
        self.bodies, self.topic, self.topics, self.tags, self.keys = (
            bodies,
            topic,
            topics,
            tags,
            keys,
        )
        self.properties, self.queue_ids, self.sharding_keys = properties, queue_ids, sharding_keys
        self.extra = extra
        self.checked = False  # the columns of Messages, whose fields they checked

    @classmethod
    def of_messages(cls, messages: Sequence[Message]) -> _Columns:
        extra = None
        if any(m.flag or m.reconsume_times or m.born_timestamp for m in messages):
            extra = (
                [m.flag for m in messages],
                [m.reconsume_times for m in messages],
                [m.born_timestamp for m in messages],
            )
        cols = cls(
            [m.body for m in messages],
            None,
            [m.topic for m in messages],
            [m.tags for m in messages],
            [m.keys for m in messages],
            [m.properties for m in messages],
            [m.queue_id for m in messages],
            [m.sharding_key for m in messages],
            extra,
        )
        cols.checked = True
        return cols

    def messages(self) -> list[Message]:
        n = len(self.bodies)

        def col(c: Any) -> Any:
            return c if c is not None else [None] * n

        out = []
        for b, t, tg, k, p, q, sk in zip(
            self.bodies,
            col(self.topics),
            col(self.tags),
            col(self.keys),
            col(self.properties),
            col(self.queue_ids),
            col(self.sharding_keys),
        ):
            # None: not set; any other value is Message's to check (as the row loop does)
            out.append(
                Message(
                    t if t is not None else self.topic,
                    b,
                    tags=tg,
                    keys=k,
                    properties=p if p is not None else {},
                    queue_id=q,
                    sharding_key=sk,
                )
            )
        return out


# The last four hex digits of generated UNIQ_KEYs, by counter value.
_HEX4 = tuple(f"{i:04X}" for i in range(65536))
_HEX4_BYTES: list[np.ndarray] = []
UNIFORM_MIN = 64  # rows from which a uniform batch is built without the row loop
UNIFORM_MAX_TAGS = 1024  # distinct tags a uniform batch may have (one piece each)


def _hex4_bytes() -> np.ndarray:
    """_HEX4 as a (65536, 4) uint8 matrix (built on first use)."""
    if not _HEX4_BYTES:
        _HEX4_BYTES.append(np.frombuffer("".join(_HEX4).encode(), dtype=np.uint8).reshape(65536, 4))
    return _HEX4_BYTES[0]


def _no_results(host: HostAddress) -> PutResults:
    empty = np.empty(0, dtype=np.int64)
    return PutResults(PutStatus.PUT_OK, [], empty, empty, empty, empty, 0, host, "", 0, {})

"""The MessageStore facade: put, pull, offsets, retry and dead letters, recovery.

It composes the parts of one store directory (the CommitLog, ConsumeQueues,
index, checkpoint and config/ JSON files; the encoder, appender, dispatcher,
reader, recovery, schedule, transaction and send-back services) and lets
several processes open the same directory at once (see ``store_state``). The
work is the parts'; the facade checks that the store is open and delegates.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from rocketspark.errors import ConfigError, StoreClosedError
from rocketspark.message.columns import Columns, SerializedRows
from rocketspark.message.model import (
    TRANS_HALF_TOPIC,
    Message,
    MessageExt,
    TopicInfo,
    check_messages,
)
from rocketspark.message.names import validate_group, validate_topic
from rocketspark.message.results import PullResult, PutResult, PutResults, no_results
from rocketspark.store.config import MessageStoreConfig, open_config
from rocketspark.store.half_resolution import half_offset_array, half_offsets
from rocketspark.store.parts import open_store
from rocketspark.store.reader import RawRead
from rocketspark.store.transaction import HalfStatus, UnknownHalves

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
        self.clock = clock
        self._closed = True
        opened = open_store(
            config,
            clock=clock,
            create=create,
            explicit=explicit,
            truncate_at=truncate_at,
            exit_without_close=exit_without_close,
            full_recovery=full_recovery,
        )
        self._opened = opened
        self.root = opened.root
        self.config = opened.config
        self.recovery_report = opened.recovery_report
        self.store_host = opened.store_host
        self.born_host = opened.born_host
        self.state = opened.state
        parts = opened.parts
        self._guard = parts.guard
        self.commit_log = parts.commit_log
        self.checkpoint = parts.checkpoint
        self.index = parts.index
        self.topics = parts.topics
        self.offsets = parts.offsets
        self.groups = parts.groups
        self.delay_offsets = parts.delay_offsets
        self.sink_ledger = parts.sink_ledger
        self.queues = parts.queues
        self.encoder = parts.encoder
        self.dispatcher = parts.dispatcher
        self.recovery = parts.recovery
        self.appender = parts.appender
        self._transactions = parts.transactions
        self._schedule = parts.schedule
        self._send_backs = parts.send_backs
        self.reader = parts.reader
        self.group_offsets = parts.group_offsets
        self._clean = parts.clean
        self._closed = False

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
        config, explicit = open_config(path, config_file, overrides)
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
        return not self._closed and self._opened.lock.replaced()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.root} is closed")

    def close(self) -> None:
        """Flush and close; the last process to close shuts the store down cleanly."""
        if self._closed:
            return
        self._closed = True
        try:
            self.offsets.flush()  # deferred consumer offset commits
        finally:
            self._opened.close()

    # -- topics ----------------------------------------------------------------------

    def create_topic(
        self,
        topic: str,
        queues: int | None = None,
        *,
        order: bool = False,
        perm: int = 6,
        force: bool = False,
        if_absent: bool = False,
    ) -> TopicInfo:
        """Create ``topic`` with ``queues`` queues (defaultTopicQueueNums if None).

        Creating an existing topic with the same queue count is a no-op; more
        queues grow it. Fewer queues would hide the messages of the queues
        dropped (they stay on disk, unread): refused with TopicShrinkError
        where those queues hold messages, unless ``force``. ``if_absent``: an
        existing topic is left as it is, whatever its settings (decided under the
        topic table's locks, so a topic made meanwhile by another thread or
        process is not changed).
        """
        self._check_open()
        validate_topic(topic)
        n = self.config.default_topic_queue_nums if queues is None else queues
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0 or n > 1024:
            raise ConfigError(f"queue count of topic {topic!r} must be 1..1024, got {queues!r}")
        if if_absent:
            self.topics.create(topic, n, n, perm=perm, order=order, if_absent=True)
            self.encoder.forget_topics()
            return self.topic(topic)
        if not force:
            cl_min = self.commit_log.min_offset
            self.topics.check_shrink(
                topic,
                n,
                holds_messages=lambda q: self.queues.holds_messages(topic, q, cl_min),
                pending=self._undelivered,
            )
        self.topics.create(topic, n, n, perm=perm, order=order)
        self.encoder.forget_topics()
        return self.topic(topic)

    def topic(self, topic: str) -> TopicInfo:
        """Return the configuration of ``topic``; raise UnknownTopicError if absent."""
        return self.topics.require(topic, self.root)

    def has_topic(self, topic: str) -> bool:
        """Does ``topic`` exist?"""
        return self.topics.get(topic) is not None

    def list_topics(self) -> list[TopicInfo]:
        """Return every topic, sorted by name."""
        return [self.topic(name) for name in sorted(self.topics.names())]

    def _undelivered(self) -> Iterator[MessageExt]:
        """The delayed messages not yet due and the open half messages: their REAL_TOPIC
        and REAL_QID name where they are still to be delivered."""
        yield from self._schedule.pending()
        if self.has_topic(TRANS_HALF_TOPIC):
            yield from self.open_transactions()

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
        """Return the first offset whose store timestamp is >= ``timestamp_ms``
        (see Reader.offset_for_timestamp)."""
        self._check_open()
        return self.reader.offset_for_timestamp(topic, queue_id, timestamp_ms)

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
        messages = check_messages(messages)
        if not messages:
            return []
        now = self.clock()
        if self.encoder.columnar and not any(m.delay_level for m in messages):
            return self._put_columns(Columns.of_messages(messages), now)
        return self.appender.append_records(self.encoder.messages(messages, now), now)

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

    def warm_between_puts(self) -> None:
        """From now on, a put prefills only its own bytes that are not prefilled yet; the
        caller calls :meth:`warm_ahead` between puts (a server: after answering one, so
        that its client does not wait for page allocation the next put may never need)."""
        self.appender.commit_log.ahead = 0

    def warm_ahead(self) -> None:
        """Prefill some of the CommitLog's next bytes (256 KiB a call, to 8 MiB past its
        end): the pages the next puts write are then ready. Takes the write lock when
        there is something to prefill."""
        self._check_open()
        self.appender.warm_ahead()

    def put_serialized(
        self, topic: str, rows: SerializedRows, *, queue_id: int | None = None
    ) -> Sequence[PutResult]:
        """Store messages of ``topic`` whose properties come serialized (a served batch
        send): the bytes, checks and errors of :meth:`put_batch` given the same
        messages, without a Message per row. ``queue_id`` None: round robin.
        """
        self._check_open()
        if not rows.bodies:
            return no_results(self.store_host)
        if not self.encoder.columnar:
            return self.put_batch(rows.messages(topic, queue_id))
        now = self.clock()
        encoded, uniq_hashes = self.encoder.serialized(topic, queue_id, rows, now)
        return self.appender.append_columns(encoded, now, uniq_hashes)

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
        cols = Columns.of_keywords(bodies, columns)
        if not len(bodies):
            return no_results(self.store_host)
        return self._transactions.prepare_columns(
            cols, producer_group=producer_group, extra_properties=extra_properties
        )

    def _put_columns(self, cols: Columns, now: int) -> PutResults:
        """The columnar put (no delay, IPv4 hosts): encoded, then one append."""
        return self.appender.append_columns(self.encoder.columns(cols, now), now)

    # -- expiry ----------------------------------------------------------------------

    def delete_expired(
        self, now_ms: int | None = None, *, reserved_hours: float | None = None
    ) -> dict[str, int]:
        """Delete CommitLog segments older than fileReservedTime (``reserved_hours``), and
        what pointed into them; returns how many files of each kind went (see clean.py)."""
        self._check_open()
        return self._clean.delete_expired(now_ms, reserved_hours)

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
        """Read up to ``max_msgs`` messages of one queue from ``offset``, matching the tag
        ``expression``, waiting up to ``timeout_ms`` for one (see Reader.pull)."""
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
        columns: tuple[str, ...] | None = None,
    ) -> tuple[list[Any], int]:
        """Read queue offsets [start, end) as ``pyarrow.RecordBatch`` objects (of
        ``columns`` only when given) and return them with the offset to read next
        (see Reader.read_batches)."""
        self._check_open()
        return self.reader.read_batches(
            topic,
            queue_id,
            start,
            end,
            expression,
            broker_name=broker_name,
            check_crc=check_crc,
            columns=columns,
        )

    def get_message(self, commitlog_offset: int) -> MessageExt:
        """Return the message stored at ``commitlog_offset``."""
        self._check_open()
        return self.reader.get_message(commitlog_offset)

    def read_raw(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_msgs: int,
        max_bytes: int,
        codes: frozenset[int] | None = None,
    ) -> RawRead:
        """Return records of one queue from ``offset`` as views of the mapped CommitLog
        (a server's pull answer; see Reader.read_raw)."""
        self._check_open()
        return self.reader.read_raw(topic, queue_id, offset, max_msgs, max_bytes, codes)

    def record_view(self, commitlog_offset: int, size: int) -> memoryview:
        """Return the record at ``commitlog_offset`` (``size`` bytes) as a view of the
        mapped CommitLog, not decoded (see Reader.record_view)."""
        self._check_open()
        return self.reader.record_view(commitlog_offset, size)

    # -- consumer groups -------------------------------------------------------------

    def commit_offset(
        self, group: str, topic: str, queue_id: int, offset: int, *, deferred: bool = False
    ) -> None:
        """Record that ``group`` will next consume ``offset`` of the queue.

        ``deferred``: keep the commit in memory (this instance reads it at once) until
        :meth:`flush_offsets` or :meth:`close` writes it, as a broker keeps its
        consumers' offsets; a process killed before then loses it.
        """
        self._check_open()
        self.group_offsets.commit(group, topic, queue_id, offset, deferred=deferred)

    def flush_offsets(self) -> None:
        """Write the deferred consumer offset commits to consumerOffset.json now."""
        self._check_open()
        self.offsets.flush()

    def commit_offsets(self, group: str, offsets: dict[tuple[str, int], int]) -> None:
        """Record several ``(topic, queue_id) -> next offset`` of ``group`` in one write."""
        self._check_open()
        self.group_offsets.commit_many(group, offsets)

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        """Return the group's next offset for the queue, or None if it never committed."""
        self._check_open()
        return self.offsets.query(group, topic, queue_id)

    def lag(self, group: str, topic: str | None = None) -> dict[tuple[str, int], int]:
        """Return, per (topic, queue), how many messages the group has yet to consume
        (from the min offset where it never committed; see GroupOffsets.lag)."""
        self._check_open()
        return self.group_offsets.lag(group, topic)

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
        return self._send_backs.send(
            group,
            messages,
            delay_levels,
            max_reconsume_times=max_reconsume_times,
            properties=properties,
        )

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
        messages = check_messages(messages)
        self._check_open()
        return self._transactions.prepare(
            messages, producer_group=producer_group, extra_properties=properties
        )

    def commit_transaction(
        self, half: PutResult | int | Iterable[PutResult | int]
    ) -> list[PutResult]:
        """Make half messages visible in their real topics (idempotent)."""
        self._check_open()
        return self._transactions.end(half_offsets(half), True)  # type: ignore[return-value]

    def rollback_transaction(self, half: PutResult | int | Iterable[PutResult | int]) -> None:
        """Discard half messages (idempotent)."""
        self._check_open()
        self._transactions.end(half_offsets(half), False)

    def transaction_status(self, half: PutResult | int) -> HalfStatus:
        """Return "open", "committed", "rolled_back" or "resolved"."""
        (offset,) = half_offsets(half)
        return self._transactions.status(offset)

    def open_transactions(
        self, producer_group: str | None = None, *, exclude: Iterable[int] | None = None
    ) -> list[MessageExt]:
        """Return the half messages still open (of ``producer_group``), oldest first.

        Halves at the half-queue offsets in ``exclude`` are left out (unread).
        """
        self._check_open()
        return self._transactions.open_halves(producer_group, half_offset_array(exclude))

    def check_transactions(
        self,
        callback: Callable[[MessageExt], Any],
        *,
        now_ms: int | None = None,
        timeout_ms: int | None = None,
        producer_group: str | None = None,
        immediately: bool = False,
        unknown: UnknownHalves = "put_back",
        in_flight: Iterable[int] | None = None,
    ) -> dict[str, int]:
        """Resolve half messages open longer than transactionTimeOut through ``callback``.

        ``callback(half)`` answers a TransactionState (or True / False / None).
        ``producer_group``: only that group's halves; ``immediately``: every open
        half now, whatever its age; ``unknown="keep"``: an UNKNOWN answer leaves
        the half where it is (by default it is put back with its check count
        raised); ``in_flight``: half-queue offsets left open unread and unasked.
        See ``TransactionService.check``.
        """
        self._check_open()
        return self._transactions.check(
            callback,
            now_ms=now_ms,
            timeout_ms=timeout_ms,
            producer_group=producer_group,
            immediately=immediately,
            unknown=unknown,
            in_flight=half_offset_array(in_flight),
        )

    # -- queries ---------------------------------------------------------------------

    def query_by_key(
        self, topic: str, key: str, begin_ms: int = 0, end_ms: int | None = None, max_num: int = 64
    ) -> list[MessageExt]:
        """Return messages of ``topic`` whose KEYS or UNIQ_KEY equal ``key``, newest first."""
        self._check_open()
        self.topic(topic)
        return self.reader.query_by_key(topic, key, begin_ms, end_ms, max_num)


__all__ = ["Clock", "MessageStore", "system_clock"]

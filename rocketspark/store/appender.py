"""The appender: the write lock, queue offsets, the one commit sequence, group commit, flush.

RocketMQ's QueueOffsetOperator and CommitLog flush services in one class.
Several processes append to one store: each append runs under an
inter-process lock (``rocketspark.write.lock``), first catches up with what
other writers did (:meth:`Appender.sync`), reserves its queue offsets and its
disk blocks, writes, and then commits in one sequence (:meth:`Append.commit`):

    COMMIT_POS = end  ->  dispatch (ConsumeQueue + index)  ->  DISPATCHED_POS = end,
    WRITE_SEQ + 1

A writer killed before COMMIT_POS moved leaves an unfinished append
(PENDING_END past COMMIT_POS) that the next writer or recovery wipes whole;
one killed before DISPATCHED_POS moved leaves records that the next writer
dispatches again. Only this module moves COMMIT_POS after an append.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rocketspark.message.record import (
    BLANK,
    BLANK_MAGIC_CODE,
    END_FILE_MIN_BLANK_LENGTH,
    HEADER_V4,
    HostAddress,
    message_id,
)
from rocketspark.message.results import PutResult, PutResults, PutStatus
from rocketspark.store.checkpoint import StoreCheckpoint
from rocketspark.store.commit_log import Appended, ColumnBatch, CommitLog, PreparedRecord
from rocketspark.store.config import MessageStoreConfig
from rocketspark.store.consume_queue import CQ_STORE_UNIT_SIZE, ConsumeQueues
from rocketspark.store.disk_guard import DiskGuard
from rocketspark.store.dispatch import Dispatcher
from rocketspark.store.encoder import EncodedColumns
from rocketspark.store.index_service import IndexService
from rocketspark.store.store_state import FLUSH_LOCK_FILE, StoreState, WriteLock

log = logging.getLogger(__name__)


def index_entries(records: Sequence[PreparedRecord]) -> int:
    """At most how many index entries ``records`` add (UNIQ_KEY and each key)."""
    return sum(1 + len(r.keys) for r in records)


class Append:
    """The appends of the holder of the write lock: valid only inside Appender.locked().

    ``with appender.locked() as append:`` takes the lock and catches up with
    other writers; every method then appends (or reserves) at the CommitLog's
    end. Results go through :meth:`Appender.after` once the lock is released.
    """

    def __init__(self, appender: Appender):
        self._appender = appender
        self.state = appender.state
        # bound once: every put takes and releases the lock
        self._lock = appender.write_lock.acquire
        self._unlock = appender.write_lock.__exit__
        self._sync = appender.sync

    def __enter__(self) -> Append:
        self._lock()
        try:
            self._sync()
        except BaseException:
            self._unlock()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._unlock()

    def next_queue_offset(self, topic: str, queue_id: int) -> int:
        """The queue offset the next append gives the queue."""
        return self._appender.next_queue_offset(topic, queue_id)

    def reserve_queue_offsets(self, topic: str, queue_id: int, count: int) -> int:
        """Take ``count`` queue offsets of the queue; return the first."""
        return self._appender.reserve_queue_offsets(topic, queue_id, count)

    def commit(self, end: int, dispatch: Callable[..., None], *args: Any) -> None:
        """THE commit sequence of an append whose bytes end at ``end``.

        COMMIT_POS moves first (the append is acknowledged: a crash from here
        on keeps it), then ``dispatch(*args)`` writes its ConsumeQueue and index
        entries, then DISPATCHED_POS and WRITE_SEQ (which wakes other
        processes' long polls) move.
        """
        state = self.state
        state.commit_pos = end
        dispatch(*args)
        state.dispatched_pos = end
        state.write_seq = state.write_seq + 1
        self._appender.known_commit_pos = end

    def records(self, prepared: Sequence[PreparedRecord], now: int) -> list[PutResult]:
        """Append and dispatch ``prepared`` as one append."""
        ap = self._appender
        state = self.state
        start = state.commit_pos
        store_ts = max(now, ap.clock())

        def set_pending(end: int) -> None:
            ap.make_room(start, end, index_entries(prepared))
            state.pending_end = end

        try:
            placed, end = ap.commit_log.append(
                start, prepared, store_ts, ap.reserve_queue_offsets, set_pending
            )
        except BaseException:
            ap.give_back_queue_offsets()
            raise
        self.commit(end, ap.dispatcher.records, prepared, placed, store_ts)
        return ap.record_results(prepared, placed, store_ts)

    def columns(
        self,
        batch: ColumnBatch,
        now: int,
        uniq_prefix: str,
        uniq_start: int,
        uniq_given: Mapping[int, str],
        keyed: list[int],
        key_strings: list[str],
        *,
        then: Sequence[PreparedRecord] = (),
        uniq_hashes: np.ndarray | None = None,
    ) -> tuple[PutResults, list[PutResult]]:
        """Append ``batch`` and then the records ``then`` as ONE append.

        COMMIT_POS moves once, after both are copied: a writer killed between
        them leaves an unfinished append that the next writer or recovery wipes
        whole (a transaction commit's final records never outlive its op record).
        """
        ap = self._appender
        state = self.state
        start = state.commit_pos
        store_ts = max(now, ap.clock())
        entries = len(batch) + sum(s.count(" ") + 1 for s in key_strings) + index_entries(then)

        def set_pending(end: int) -> None:
            ap.make_room(start, end, entries)
            state.pending_end = end

        try:
            placed = ap.commit_log.append_columns(
                start, batch, store_ts, ap.reserve_queue_offsets, set_pending
            )
            end = placed.end
            placed_then: list[Appended] = []
            if then:
                placed_then, end = ap.commit_log.append(
                    end, then, store_ts, ap.reserve_queue_offsets, set_pending
                )
        except BaseException:
            ap.give_back_queue_offsets()
            raise
        self.commit(
            end,
            ap.dispatch_columns,
            batch,
            placed,
            store_ts,
            uniq_prefix,
            uniq_start,
            uniq_given,
            keyed,
            key_strings,
            uniq_hashes,
            then,
            placed_then,
        )
        results = PutResults(
            PutStatus.PUT_OK,
            batch.topics,
            batch.queue_ids,
            placed.queue_offsets,
            placed.phys,
            placed.sizes,
            store_ts,
            ap.store_host,
            uniq_prefix,
            uniq_start,
            uniq_given,
        )
        return results, ap.record_results(then, placed_then, store_ts)

    def one(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        rest: bytes,
        total: int,
        magic: int,
        crc: int,
        flag: int,
        born_timestamp: int,
        reconsume_times: int,
        code: int,
        now: int,
        uniq: str,
        uniq_prefix: str,
        counter: int,
        own_uniq: str | None,
        keys: Sequence[str],
    ) -> PutResult:
        """Append one record encoded by ``Encoder.one`` (put's fast path, struct only)."""
        # Hot path: every single put. Plain ints and struct, no numpy, no batch objects.
        ap = self._appender
        state = self.state
        commit_log = ap.commit_log
        seg_size = commit_log.segment_size
        born, store = ap.born_host, ap.store_host
        pos = state.commit_pos
        store_ts = max(now, ap.clock())
        seg_end = (pos // seg_size + 1) * seg_size
        writes = []
        if total + END_FILE_MIN_BLANK_LENGTH > seg_end - pos:
            writes.append((pos, [BLANK.pack(seg_end - pos, BLANK_MAGIC_CODE)]))
            pos = seg_end
        try:
            queue_offset = ap.reserve_queue_offsets(topic, queue_id, 1)
            writes.append(
                (
                    pos,
                    [
                        HEADER_V4.pack(
                            total,
                            magic,
                            crc,
                            queue_id,
                            flag,
                            queue_offset,
                            pos,
                            0,
                            born_timestamp,
                            born.ip,
                            born.port,
                            store_ts,
                            store.ip,
                            store.port,
                            reconsume_times,
                            0,
                            len(body),
                        ),
                        body,
                        rest,
                    ],
                )
            )
            end = pos + total
            ap.make_room(writes[0][0], end, 1 + len(keys))
            state.pending_end = end
            commit_log.warm(writes[0][0], end)
            commit_log.write(writes)
        except BaseException:
            ap.give_back_queue_offsets()
            raise
        self.commit(
            end,
            ap.dispatcher.one,
            topic,
            queue_id,
            queue_offset,
            pos,
            total,
            code,
            store_ts,
            uniq_prefix,
            counter,
            own_uniq,
            keys,
        )
        return PutResult(
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


class Appender:
    """Serialises appends across processes; the only code that moves COMMIT_POS.

    ``arrivals`` is the condition long polls of this process wait on (shared
    with the reader); :meth:`after` notifies it.
    """

    def __init__(
        self,
        *,
        root: str,
        config: MessageStoreConfig,
        state: StoreState,
        commit_log: CommitLog,
        index: IndexService,
        checkpoint: StoreCheckpoint,
        queues: ConsumeQueues,
        dispatcher: Dispatcher,
        guard: DiskGuard,
        write_refused: Exception | None,
        clock: Callable[[], int],
        store_host: HostAddress,
        born_host: HostAddress,
        damage_error: Callable[[], Exception],
        rebuild_queues: Callable[[int], object],
    ):
        self.root = root
        self.config = config
        self.state = state
        self.commit_log = commit_log
        self.index = index
        self.checkpoint = checkpoint
        self.queues = queues
        self.queue = queues.queue
        self.dispatcher = dispatcher
        self.guard = guard
        self.write_refused = write_refused
        self.clock = clock
        self.store_host = store_host
        self.born_host = born_host
        self.damage_error = damage_error
        self.rebuild_queues = rebuild_queues
        self.write_lock = WriteLock(root)
        self.flush_lock = WriteLock(root, FLUSH_LOCK_FILE)
        self.arrivals = threading.Condition()
        # The next queue offset of each queue this process appended to, while no other
        # writer appended (cleared by sync when one did).
        self._qo: dict[tuple[str, int], int] = {}
        self._touched: list[tuple[str, int, int, int]] = []  # queue offsets an append took
        self.known_commit_pos = -1  # COMMIT_POS as this process last left or saw it
        self._append = Append(self)
        self._flusher: _Flusher | None = None

    def locked(self) -> Append:
        """``with appender.locked() as append:`` the write lock, caught up with other writers."""
        return self._append

    def append_records(self, prepared: Sequence[PreparedRecord], now: int) -> list[PutResult]:
        """Append ``prepared`` as one append under the write lock; see :meth:`after`."""
        with self._append as append:
            results = append.records(prepared, now)
        return self.after(results)

    def append_columns(
        self, encoded: EncodedColumns, now: int, uniq_hashes: np.ndarray | None = None
    ) -> PutResults:
        """Append a columnar put (``Encoder.columns``) as one append under the write lock
        (``uniq_hashes``: the records' topic#UNIQ_KEY hashCodes, when the caller has them)."""
        batch, uniq_prefix, uniq_start, uniq_given, keyed, key_strings = encoded
        with self._append as append:
            results, _ = append.columns(
                batch,
                now,
                uniq_prefix,
                uniq_start,
                uniq_given,
                keyed,
                key_strings,
                uniq_hashes=uniq_hashes,
            )
        return self.after(results)

    def warm_ahead(self) -> None:
        """Prefill some of the CommitLog's next bytes (CommitLog.warm_ahead), under the
        write lock: no other writer appends meanwhile, what is past the end is no data."""
        if not self.commit_log.needs_warming(self.known_commit_pos):
            return  # (as this process last saw the end: the lock is taken only to prefill)
        with self._append:
            self.commit_log.warm_ahead(self.state.commit_pos)

    # -- queue offsets ---------------------------------------------------------

    def next_queue_offset(self, topic: str, queue_id: int) -> int:
        """The queue offset the next append gives the queue (caller holds the write lock)."""
        n = self._qo.get((topic, queue_id))
        return self.queue(topic, queue_id).max_offset() if n is None else n

    def reserve_queue_offsets(self, topic: str, queue_id: int, count: int) -> int:
        """Take ``count`` queue offsets of the queue; return the first."""
        n = self.next_queue_offset(topic, queue_id)
        self._qo[(topic, queue_id)] = n + count
        self._touched.append((topic, queue_id, n, count))
        return n

    def give_back_queue_offsets(self) -> None:
        """Forget reserved queue offsets after an append failed before COMMIT_POS moved.

        A kept reservation would make the next append skip offsets: a
        ConsumeQueue hole, behind which readers never see a record. The next
        append reads each queue's end from its ConsumeQueue again.
        """
        self._qo.clear()
        self._touched = []

    # -- catching up -------------------------------------------------------------

    def sync(self) -> None:
        """Catch up with what other processes wrote (call holding the write lock)."""
        state = self.state
        commit = state.commit_pos
        if commit == self.known_commit_pos and state.pending_end <= commit:
            return
        if state.damage_following:
            raise self.damage_error()
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
            self.dispatcher.scan(state.dispatched_pos, commit)
            self.rebuild_queues(commit)
            state.dispatched_pos = commit
        self.known_commit_pos = commit

    # -- room on disk --------------------------------------------------------------

    def make_room(self, start: int, end: int, index_entries: int) -> None:
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
        if self.write_refused is not None:
            raise self.write_refused
        self.guard.check()
        for topic, qid, first, count in touched:
            q = self.queue(topic, qid)
            q_files = q.files.files
            if q_files:  # the hot path, inlined: within the last file's reserved blocks
                last = q_files[-1]
                pos = first * CQ_STORE_UNIT_SIZE - last.start_offset
                if pos >= 0 and pos + count * CQ_STORE_UNIT_SIZE <= last.reserved:
                    continue
            q.reserve(first, count)
        need = self.index.reserve(index_entries)
        if need:
            self.guard.require(need, "the new index files of this put")
        cl = self.commit_log.files
        files = cl.files
        if (
            not files
            or start < files[-1].start_offset
            or end - files[-1].start_offset > files[-1].reserved
        ):
            cl.reserve(start, end)

    # -- after an append -------------------------------------------------------------

    def dispatch_columns(
        self,
        batch: ColumnBatch,
        placed: Any,
        store_ts: int,
        uniq_prefix: str,
        uniq_start: int,
        uniq_given: Mapping[int, str],
        keyed: list[int],
        key_strings: list[str],
        uniq_hashes: np.ndarray | None,
        then: Sequence[PreparedRecord],
        placed_then: Sequence[Appended],
    ) -> None:
        """The dispatch of :meth:`Append.columns`: the batch, then the records after it."""
        dispatcher = self.dispatcher
        dispatcher.columns(
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
            dispatcher.records(then, placed_then, store_ts)

    def record_results(
        self, prepared: Sequence[PreparedRecord], placed: Sequence[Appended], store_ts: int
    ) -> list[PutResult]:
        """One PutResult per appended record."""
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
            for r, a in zip(prepared, placed, strict=False)
        ]

    def after(self, results: Any) -> Any:
        """Wake long polls and, under SYNC_FLUSH, wait for the group commit.

        Call with an append's results once the write lock is released; returns
        them (marked FLUSH_DISK_TIMEOUT when the flush took longer than
        syncFlushTimeout).
        """
        with self.arrivals:
            self.arrivals.notify_all()
        if results and self.config.flush_disk_type == "SYNC_FLUSH":
            last = results[-1]
            end = last.commitlog_offset + last.store_size
            if not self.flush_commit_log(end, self.config.sync_flush_timeout / 1000.0):
                if isinstance(results, PutResults):
                    results.status = PutStatus.FLUSH_DISK_TIMEOUT
                    return results
                results = [
                    dataclasses.replace(r, status=PutStatus.FLUSH_DISK_TIMEOUT) for r in results
                ]
        return results

    # -- flushing ------------------------------------------------------------------------

    def flush_commit_log(self, end: int, timeout: float) -> bool:
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
        with self.flush_lock:
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

    def start_flusher(self, interval: float) -> None:
        """ASYNC_FLUSH: flush every ``interval`` seconds in a background thread."""
        self._flusher = _Flusher(self.flush, self.root, interval)
        self._flusher.start()

    def stop_flusher(self) -> None:
        if self._flusher is not None:
            self._flusher.stop()

    def close(self) -> None:
        """Close the lock files (after the last flush)."""
        self.write_lock.close()
        self.flush_lock.close()


class _Flusher(threading.Thread):
    """ASYNC_FLUSH: force dirty pages every flushIntervalCommitLog ms."""

    def __init__(self, flush: Callable[[], None], root: str, interval: float):
        super().__init__(name=f"rocketspark-flush-{os.path.basename(root)}", daemon=True)
        self.flush = flush
        self.root = root
        self.interval = interval
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                self.flush()
            except Exception:  # keep flushing; the next put or close will report
                log.exception("background flush of %s failed", self.root)

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=10)

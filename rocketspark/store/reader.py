"""The reader: pull with long polling, Arrow reads, lookups by offset, key and time.

RocketMQ's DefaultMessageStore.getMessage, lookMessageByOffset, queryMessage
and getOffsetInQueueByTime. Reads never lock: they go from a ConsumeQueue entry
to its CommitLog record, and see another process's put once its entry is
written.
"""

from __future__ import annotations

import operator
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from rocketspark.errors import ConfigError, CorruptRecordError, OffsetOutOfRangeError
from rocketspark.message.model import MessageExt, SysFlag, transaction_type
from rocketspark.message.names import SubscriptionExpression, validate_topic
from rocketspark.message.results import PullResult, PullStatus
from rocketspark.store.commit_log import CommitLog
from rocketspark.store.config import MessageStoreConfig
from rocketspark.store.consume_queue import ConsumeQueue, ConsumeQueues
from rocketspark.store.index_service import IndexService
from rocketspark.store.store_state import StoreState

# Entries read from a ConsumeQueue per pull when a tag filter skips many (RocketMQ reads
# up to 16000 bytes of ConsumeQueue, i.e. 800 entries).
MAX_FILTER_SCAN = 800
ARROW_BLOCK = 65536  # records per Arrow batch that read_batches builds at most


@dataclass(frozen=True, slots=True)
class RawRead:
    """What :meth:`Reader.read_raw` found: the CommitLog records of a queue range as they
    lie in the mapped segments (a PULL_MESSAGE answer's body), never copied.

    ``parts`` are memoryviews of the segments, adjacent records joined into one
    view; ``count`` records in all, ``size`` bytes. ``next_offset`` is the queue
    offset to read next. ``status`` is the reader's PullStatus (FOUND,
    NO_NEW_MSG, NO_MATCHED_MSG, OFFSET_ILLEGAL), ``next_offset`` for
    OFFSET_ILLEGAL the nearest valid one.
    """

    status: PullStatus
    parts: list[memoryview]
    count: int
    size: int
    next_offset: int
    min_offset: int
    max_offset: int


class Reader:
    """The reads of one store: pull, read_batches, get_message, query_by_key, offsets by time.

    ``arrivals`` is notified after every put of this process (long polls wait
    on it); puts of other processes show in ``state.write_seq``. Callers check
    that the store is open, and query_by_key's caller that the topic exists.
    """

    def __init__(
        self,
        config: MessageStoreConfig,
        commit_log: CommitLog,
        queues: ConsumeQueues,
        index: IndexService,
        state: StoreState,
        arrivals: threading.Condition,
    ):
        self.config = config
        self.commit_log = commit_log
        self.queues = queues
        self.index = index
        self.state = state
        self.arrivals = arrivals

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
        if max_msgs <= 0:
            raise ConfigError(f"max_msgs must be positive, got {max_msgs}")
        sub = SubscriptionExpression(expression)
        cq = self.queues.existing(topic, queue_id)
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
        with self.arrivals:
            while True:
                now_seq = state.write_seq
                if now_seq != seq:
                    seq = now_seq
                    if cq.max_offset() > offset:
                        return
                left = end - time.monotonic()
                if left <= 0:
                    return
                if self.arrivals.wait(min(left, 0.001)):
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
            entries["offset"].tolist(),
            entries["size"].tolist(),
            entries["tags"].tolist(),
            strict=False,
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

    def read_raw(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_msgs: int,
        max_bytes: int,
        codes: frozenset[int] | None = None,
    ) -> RawRead:
        """Return up to ``max_msgs`` records (``max_bytes`` in all, at least one) of one queue
        from ``offset`` as views of the CommitLog's mapped segments, for the server's pulls.

        ``codes``: keep only records whose tags code is one of these (the
        ConsumeQueue's hash, as a broker filters; None keeps all). Records are not
        decoded nor checked: their ConsumeQueue entries locate them. A queue never
        written reads as empty (NO_NEW_MSG at offset 0). Raises UnknownTopicError
        for an unknown topic, OffsetOutOfRangeError for a queue id it does not have.
        """
        # Hot path: every server pull. The entries come as numpy arrays; views are
        # taken per run of adjacent records, not per record.
        cq = self.queues.existing(topic, queue_id)
        lo = cq.min_offset(self.commit_log.min_offset)
        hi = cq.max_offset()
        if offset == hi:
            return RawRead(PullStatus.NO_NEW_MSG, [], 0, 0, offset, lo, hi)
        if offset < lo or offset > hi:
            near = lo if offset < lo else hi
            return RawRead(PullStatus.OFFSET_ILLEGAL, [], 0, 0, near, lo, hi)
        scan = max_msgs if codes is None else max(max_msgs, MAX_FILTER_SCAN)
        entries = cq.read(offset, scan)
        phys = entries["offset"].tolist()
        sizes = entries["size"].tolist()
        keep = codes if codes is not None else frozenset()
        tags = entries["tags"].tolist() if codes is not None else None
        segment = self.commit_log.segment
        if tags is None and phys:
            # The usual answer: records that follow each other in one segment (a batch
            # of one queue), answered as one view without a step per record. Any other
            # case (gaps, another segment, the byte limit) is the loop's below.
            n = len(phys)  # at most max_msgs: what was scanned
            first = phys[0]
            total = phys[-1] + sizes[-1] - first
            if (
                (total <= max_bytes or n == 1)
                and min(sizes) > 0
                and phys[1:] == list(map(operator.add, phys[:-1], sizes[:-1]))
            ):
                seg = segment(first)
                rel = first - seg.start_offset
                if 0 <= rel and rel + total <= seg.size:
                    view = memoryview(seg.mm)[rel : rel + total]
                    return RawRead(PullStatus.FOUND, [view], n, total, offset + n, lo, hi)
        parts: list[memoryview] = []
        f = None
        run_start = run_end = -1  # the current run of adjacent records, file positions
        count = total = 0
        n = 0
        for i, (phy, size) in enumerate(zip(phys, sizes, strict=True)):
            if tags is not None and tags[i] not in keep:
                n = i + 1
                continue
            if count and (count >= max_msgs or total + size > max_bytes):
                break
            n = i + 1
            if f is None or not f.start_offset <= phy < f.end_offset:
                if f is not None and run_end > run_start:
                    parts.append(memoryview(f.mm)[run_start:run_end])
                f = segment(phy)
                run_start = run_end = phy - f.start_offset
            rel = phy - f.start_offset
            if rel + size > f.size:
                raise CorruptRecordError(
                    "ConsumeQueue entry points past its CommitLog segment", file=f.path, offset=phy
                )
            if rel != run_end:
                if run_end > run_start:
                    parts.append(memoryview(f.mm)[run_start:run_end])
                run_start = rel
            run_end = rel + size
            count += 1
            total += size
        if f is not None and run_end > run_start:
            parts.append(memoryview(f.mm)[run_start:run_end])
        status = PullStatus.FOUND if count else PullStatus.NO_MATCHED_MSG
        return RawRead(status, parts, count, total, offset + n, lo, hi)

    def record_view(self, commitlog_offset: int, size: int) -> memoryview:
        """Return the ``size`` bytes of the record at ``commitlog_offset`` as a view of its
        mapped segment (a server's answer to VIEW_MESSAGE_BY_ID or QUERY_MESSAGE)."""
        if not 0 <= commitlog_offset < self.state.commit_pos:
            raise OffsetOutOfRangeError(
                f"commit log offset {commitlog_offset} is outside [0, {self.state.commit_pos})"
            )
        f = self.commit_log.segment(commitlog_offset)
        rel = commitlog_offset - f.start_offset
        if rel + size > f.size:
            raise CorruptRecordError(
                "record runs past its CommitLog segment", file=f.path, offset=commitlog_offset
            )
        return memoryview(f.mm)[rel : rel + size]

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
        """Read queue offsets [start, end) as ``pyarrow.RecordBatch`` objects (vectorised).

        Returns the batches (schema ``message.arrow.ARROW_SCHEMA``, or its
        ``columns`` only, in that order: what no column wants is not decoded) and
        the offset to read next. ``end`` None or past the max offset reads to the max.
        Raises OffsetOutOfRangeError when ``start`` is below the min offset, and
        CorruptRecordError for a damaged record (a body CRC mismatch only when
        ``check_crc``, by default the store's checkCRCOnRead).
        """
        from rocketspark.message import arrow

        sub = SubscriptionExpression(expression)
        cq = self.queues.existing(topic, queue_id)
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
        decode = columns if sub.matches_all else arrow.with_tags(columns)
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
                columns=decode,
            )
        if not sub.matches_all:
            batches = [arrow.filter_tags(b, sub.tags, columns) for b in batches]
        return batches, next_offset

    def get_message(self, commitlog_offset: int) -> MessageExt:
        """Return the message stored at ``commitlog_offset``."""
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
            if key in self.queues or self.queues.on_disk(*key):
                entry = self.queues.queue(*key).entry(msg.queue_offset)
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

    def query_by_key(
        self, topic: str, key: str, begin_ms: int = 0, end_ms: int | None = None, max_num: int = 64
    ) -> list[MessageExt]:
        """Return messages of ``topic`` whose KEYS or UNIQ_KEY equal ``key``, newest first."""
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

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """Return the first offset whose store timestamp is >= ``timestamp_ms``.

        Returns the max offset when every message is older, the min offset
        when every message is newer.
        """
        cq = self.queues.existing(topic, queue_id)
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

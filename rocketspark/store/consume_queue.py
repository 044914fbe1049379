"""The ConsumeQueue: one per (topic, queueId), 20-byte entries, O(1) lookup;
ConsumeQueues: a store's queues by (topic, queueId) (RocketMQ's ConsumeQueueStore).

Entry grammar (big-endian)::

    entry := COMMITLOG_OFFSET:i64 SIZE:i32 TAGS_CODE:i64

Entry n (the logical queue offset) sits at byte n * 20 of the queue, whose
files hold 300,000 entries each and are named by their first byte offset. An
entry whose SIZE is 0 marks the end of what is written.

Readers in other processes never lock: a writer copies a block of entries with
SIZE zero first and then fills in the SIZE fields in ascending order, so a
reader that sees a non-zero SIZE sees the whole entry and every one before it.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Sequence

import numpy as np

from rocketspark.errors import CorruptRecordError, OffsetOutOfRangeError
from rocketspark.store.mapped_file import (
    CONSUME_QUEUE_CHUNK,
    MappedFile,
    MappedFileQueue,
    data_end,
)
from rocketspark.store.topic_config import TopicConfigTable, unknown_topic

CQ_STORE_UNIT_SIZE = 20
CQ_ENTRY = struct.Struct(
    ">q"  # commit log offset
    "i"  # record size
    "q"  # tags code
)
SIZE_FIELD_OFFSET = 8
CQ_ENTRY_DTYPE = np.dtype([("offset", ">i8"), ("size", ">i4"), ("tags", ">i8")])
assert CQ_ENTRY_DTYPE.itemsize == CQ_STORE_UNIT_SIZE == CQ_ENTRY.size
_SIZE = struct.Struct(">i")


class ConsumeQueue:
    """The logical queue of one (topic, queueId)."""

    def __init__(
        self, root: str, topic: str, queue_id: int, file_size: int, *, writable: bool = True
    ):
        if file_size % CQ_STORE_UNIT_SIZE:
            raise CorruptRecordError(
                f"mappedFileSizeConsumeQueue {file_size} is not a multiple of {CQ_STORE_UNIT_SIZE}"
            )
        self.topic = topic
        self.queue_id = queue_id
        self.directory = os.path.join(root, "consumequeue", topic, str(queue_id))
        self.entries_per_file = file_size // CQ_STORE_UNIT_SIZE
        self.files = MappedFileQueue(
            self.directory, file_size, writable=writable, chunk=CONSUME_QUEUE_CHUNK
        )
        self._max = -1  # cached next logical offset; -1 until first looked up
        # min_offset's last scan for a CommitLog min: (first file, CommitLog min, result).
        self._min_found: tuple[MappedFile, int, int] | None = None

    # -- positions ---------------------------------------------------------------

    def _size_at(self, n: int) -> int:
        """Return the SIZE field of entry n, 0 when it lies past the mapped files."""
        pos = n * CQ_STORE_UNIT_SIZE
        # Refresh when n lies past the mapped files: another process may have
        # started the next file.
        f = self.files.find(pos)
        if f is None:
            return 0
        rel = pos - f.start_offset
        if _entries_with_data(f, rel) < 1:  # a hole: never written
            return 0
        return _SIZE.unpack_from(f.mm, rel + SIZE_FIELD_OFFSET)[0]

    def max_offset(self) -> int:
        """Return the next logical offset to be written (entries below it exist)."""
        n = self._max
        if n < 0:
            n = self._find_end()
        elif self._size_at(n):
            n = self._scan_end(n)  # another process appended: step over what it wrote
        self._max = n
        return n

    def _scan_end(self, n: int) -> int:
        """The first empty entry at or after entry ``n``, read in growing blocks.

        Another process may have appended a few entries or half a million
        (a sink's tasks, before the driver commits): a few entries one by one,
        then blocks of 64 entries and 8x larger, each one numpy scan of the
        SIZE fields.
        """
        for _ in range(8):
            if not self._size_at(n):
                return n
            n += 1
        block = 64
        while True:
            pos = n * CQ_STORE_UNIT_SIZE
            f = self.files.find(pos)
            if f is None:
                return n
            first = (pos - f.start_offset) // CQ_STORE_UNIT_SIZE
            count = min(
                block, self.entries_per_file - first, _entries_with_data(f, pos - f.start_offset)
            )
            if count <= 0:  # a hole: never written
                return n
            sizes = np.frombuffer(
                f.mm, dtype=CQ_ENTRY_DTYPE, count=count, offset=pos - f.start_offset
            )["size"]
            empty = np.flatnonzero(sizes == 0)
            del sizes
            if len(empty):
                return n + int(empty[0])
            n += count
            block = min(block * 8, 1 << 20)

    def _find_end(self) -> int:
        self.files.refresh()
        files = self.files.files
        if not files:
            return 0
        # Files made ahead of their entries (room a put reserved before it was refused,
        # or its process killed) hold none: the queue ends in the last file that holds
        # one, or the next file's start, never at an empty file's start.
        i = len(files) - 1
        while i > 0 and not self._holds_an_entry(files[i]):
            i -= 1
        last = files[i]
        base = last.start_offset // CQ_STORE_UNIT_SIZE
        # Only the part holding data is read: reading a hole through a mapping
        # allocates a page on tmpfs (SIGBUS when it is full); holes hold no entry.
        count = min(self.entries_per_file, data_end(last.fileno(), last.size) // CQ_STORE_UNIT_SIZE)
        sizes = np.frombuffer(last.mm, dtype=CQ_ENTRY_DTYPE, count=count)["size"]
        empty = np.flatnonzero(sizes == 0)
        del sizes
        # Entries are written in order, so the first empty slot ends the queue.
        if len(empty) or count < self.entries_per_file:
            return base + (int(empty[0]) if len(empty) else count)
        return self._scan_end(base + count)

    @staticmethod
    def _holds_an_entry(f: MappedFile) -> bool:
        # Entries are written in order: a file holds one when its first is written
        # (read only where data is: see _find_end).
        if data_end(f.fileno(), CQ_STORE_UNIT_SIZE) == 0:
            return False
        return bool(np.frombuffer(f.mm, dtype=CQ_ENTRY_DTYPE, count=1)["size"][0])

    def min_offset(self, commitlog_min: int = 0) -> int:
        """Return the first logical offset still readable.

        Entries whose record lies below ``commitlog_min`` (deleted CommitLog
        segments) do not count.
        """
        # Hot path (every pull answers it): the first file decides, and only a clean (of
        # this process or another) changes which it is. Re-list the directory when it is
        # gone, not every time.
        files = self.files.files
        if not files or not os.path.exists(files[0].path):
            self.files.refresh()
            files = self.files.files
        if not files:
            return 0
        if commitlog_min <= 0:
            return files[0].start_offset // CQ_STORE_UNIT_SIZE
        found = self._min_found
        if found is not None and found[0] is files[0] and found[1] == commitlog_min:
            return found[2]  # written entries do not change: the scan would find it again
        self.files.refresh()
        files = list(self.files.files)
        if not files:
            return 0
        # Entries point into the CommitLog in rising order: the first one at or above
        # its start is the queue's first readable. Usually in the first file; later
        # ones when whole files still point below (a clean that stopped half way, or
        # a store whose broker trims its queues later than its CommitLog).
        for k, f in enumerate(files):
            base = f.start_offset // CQ_STORE_UNIT_SIZE
            entries = np.frombuffer(f.mm, dtype=CQ_ENTRY_DTYPE, count=self.entries_per_file)
            written = entries["size"] > 0
            ok = np.flatnonzero((entries["offset"] >= commitlog_min) & written)
            if len(ok):
                self._min_found = (files[0], commitlog_min, base + int(ok[0]))
                return base + int(ok[0])
            count = int(np.count_nonzero(written))
            if count < self.entries_per_file or k == len(files) - 1:
                # Every entry points below: the queue starts after its last one (its
                # end: an empty queue, min = max).
                return base + count
        raise AssertionError("unreachable")

    # -- reading -----------------------------------------------------------------

    def read(self, start: int, count: int) -> np.ndarray:
        """Return up to ``count`` entries from logical offset ``start`` (a copy).

        Stops at the first empty entry, so the result holds only written ones.
        """
        out = []
        n = start
        remaining = count
        while remaining > 0:
            pos = n * CQ_STORE_UNIT_SIZE
            f = self.files.find(pos)
            if f is None:
                break
            first = (pos - f.start_offset) // CQ_STORE_UNIT_SIZE
            # Not into a hole past the queue's end (see MappedFile.data_limit).
            take = min(
                remaining,
                self.entries_per_file - first,
                _entries_with_data(f, pos - f.start_offset),
            )
            if take <= 0:
                break
            view = np.frombuffer(
                f.mm, dtype=CQ_ENTRY_DTYPE, count=take, offset=first * CQ_STORE_UNIT_SIZE
            )
            # SIZE fields first: a writer fills SIZE last, so every entry whose SIZE
            # we saw is whole when we copy it afterwards (copying in address order
            # could read an entry's offset before its writer stored it).
            empty = np.flatnonzero(view["size"] == 0)
            valid = int(empty[0]) if len(empty) else take
            out.append(view[:valid].copy())
            del view
            if valid < take:
                break
            n += take
            remaining -= take
        if not out:
            return np.empty(0, dtype=CQ_ENTRY_DTYPE)
        return out[0] if len(out) == 1 else np.concatenate(out)

    def entry(self, n: int) -> tuple[int, int, int] | None:
        """Return (commit log offset, size, tags code) of entry n, or None if unwritten."""
        pos = n * CQ_STORE_UNIT_SIZE
        f = self.files.find(pos)
        if f is None:
            return None
        rel = pos - f.start_offset
        if _entries_with_data(f, rel) < 1:  # a hole: never written
            return None
        if not _SIZE.unpack_from(f.mm, rel + SIZE_FIELD_OFFSET)[0]:  # SIZE first (see read)
            return None
        off, size, tags = CQ_ENTRY.unpack_from(f.mm, rel)
        return off, size, tags

    # -- writing (callers hold the store's write lock) -----------------------------

    def reserve(self, start: int, count: int) -> None:
        """Give entries [start, start + count) their files and blocks (DiskFullError if not).

        An append calls it before writing its record; ``put`` calls it again
        (a comparison) for the writes of recovery and redispatch.
        """
        pos = start * CQ_STORE_UNIT_SIZE
        end = pos + count * CQ_STORE_UNIT_SIZE
        files = self.files.files
        if files:
            last = files[-1]
            if last.start_offset <= pos and end - last.start_offset <= last.reserved:
                return
        self.files.reserve(pos, end)

    def put(
        self,
        start: int,
        offsets: Sequence[int] | np.ndarray,
        sizes: Sequence[int] | np.ndarray,
        tags: Sequence[int] | np.ndarray,
    ) -> None:
        """Write entries for logical offsets start, start+1, ...

        The SIZE fields are written last and in ascending order so that
        lock-free readers never see a half-written entry.
        """
        n = len(offsets)
        self.reserve(start, n)
        if n == 1:  # the common single put: struct, not numpy
            pos = start * CQ_STORE_UNIT_SIZE
            f = self.files.get_or_create(pos)
            rel = pos - f.start_offset
            CQ_ENTRY.pack_into(f.mm, rel, int(offsets[0]), 0, int(tags[0]))
            _SIZE.pack_into(f.mm, rel + SIZE_FIELD_OFFSET, int(sizes[0]))
            if self._max >= 0:
                self._max = max(self._max, start + 1)
            return
        block = np.empty(n, dtype=CQ_ENTRY_DTYPE)
        block["offset"] = offsets
        block["size"] = 0
        block["tags"] = tags
        sizes_be = np.asarray(sizes, dtype=">i4")
        done = 0
        while done < n:
            logical = start + done
            pos = logical * CQ_STORE_UNIT_SIZE
            f = self.files.get_or_create(pos)
            first = (pos - f.start_offset) // CQ_STORE_UNIT_SIZE
            take = min(n - done, self.entries_per_file - first)
            view = np.frombuffer(
                f.mm, dtype=CQ_ENTRY_DTYPE, count=take, offset=first * CQ_STORE_UNIT_SIZE
            )
            view[:] = block[done : done + take]
            view["size"] = sizes_be[done : done + take]
            del view
            done += take
        if self._max == start:
            self._max = start + n
        elif self._max >= 0:
            self._max = max(self._max, start + n)

    def delete_below(self, commitlog_min: int) -> int:
        """Delete files (never the last) whose entries all point below ``commitlog_min``."""
        self.files.refresh()
        deleted = 0
        while len(self.files.files) > 1:
            f = self.files.files[0]
            last = np.frombuffer(f.mm, dtype=CQ_ENTRY_DTYPE, count=self.entries_per_file)[-1]
            if int(last["size"]) == 0 or int(last["offset"]) >= commitlog_min:
                break
            self.files.delete_first()
            deleted += 1
        return deleted

    def truncate_from_phy(self, phy_end: int) -> int:
        """Drop entries whose record does not end at or before ``phy_end``.

        Returns the new max offset. Used by recovery after a torn CommitLog tail.
        """
        end = self._find_end()
        n = end
        while n > 0:
            e = self.entry(n - 1)
            if e is None or e[0] + e[1] <= phy_end:
                break
            n -= 1
        if n < end:
            self._zero(n, end)
        self._max = n
        return n

    def truncate_to(self, n: int) -> None:
        """Drop entries at logical offsets >= n."""
        end = self._find_end()
        if n < end:
            self._zero(n, end)
        self._max = min(end, n)

    def zero_from(self, n: int, end: int) -> None:
        """Zero entries [n, end), holes among them or not, and end the queue at n.

        ``truncate_to`` stops at the queue's end (its first empty entry); a
        queue rebuilt from a hole at n also loses the entries behind the hole.
        """
        if end > n:
            self._zero(n, end)
        self._max = n

    def _zero(self, first: int, end: int) -> None:
        # Highest entries first so readers never see a gap below a written entry.
        n = end
        while n > first:
            pos = (n - 1) * CQ_STORE_UNIT_SIZE
            f = self.files.find(pos)
            if f is None:
                n -= 1
                continue
            lo = max(first * CQ_STORE_UNIT_SIZE, f.start_offset)
            view = np.frombuffer(
                f.mm,
                dtype=np.uint8,
                count=pos + CQ_STORE_UNIT_SIZE - lo,
                offset=lo - f.start_offset,
            )
            sizes = view.reshape(-1, CQ_STORE_UNIT_SIZE)[
                :, SIZE_FIELD_OFFSET : SIZE_FIELD_OFFSET + 4
            ]
            sizes[::-1] = 0
            view[:] = 0
            del view, sizes
            n = lo // CQ_STORE_UNIT_SIZE
        # Drop files wholly past the end.
        self.files.delete_from(
            -(-first * CQ_STORE_UNIT_SIZE // self.files.file_size) * self.files.file_size
            if first
            else 1 << 62
        )

    def flush(self, start: int, end: int) -> None:
        self.files.flush(start * CQ_STORE_UNIT_SIZE, end * CQ_STORE_UNIT_SIZE)

    def close(self) -> None:
        self.files.close()


class ConsumeQueues:
    """The ConsumeQueues of one store by (topic, queue id): RocketMQ's ConsumeQueueStore.

    Opens each queue once per process, on first use (from any thread);
    truncates and trims across queues; and tracks the queues this process
    wrote entries to that are not flushed yet.
    """

    def __init__(
        self, root: str, file_size: int, topics: TopicConfigTable, *, writable: bool = True
    ):
        self.root = root
        self.directory = os.path.join(root, "consumequeue")
        self.file_size = file_size
        self.topics = topics
        self.writable = writable
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._guard = threading.Lock()
        # First unflushed ConsumeQueue offset per queue this process wrote to. The
        # background flusher swaps the dict under this guard while writers add.
        self._dirty: dict[tuple[str, int], int] = {}
        self._dirty_guard = threading.Lock()

    def __contains__(self, key: object) -> bool:
        """Is the queue ``(topic, queue id)`` open in this process?"""
        return key in self._queues

    def __len__(self) -> int:
        """How many queues this process has open."""
        return len(self._queues)

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """Return the queue, opening it (and making its directory on a write) if needed."""
        key = (topic, queue_id)
        q = self._queues.get(key)
        if q is None:
            with self._guard:
                q = self._queues.get(key)
                if q is None:
                    q = ConsumeQueue(
                        self.root, topic, queue_id, self.file_size, writable=self.writable
                    )
                    self._queues[key] = q
        return q

    def existing(self, topic: str, queue_id: int) -> ConsumeQueue:
        """Return queue ``queue_id`` of a topic of topics.json.

        Raises UnknownTopicError for an unknown topic, OffsetOutOfRangeError
        for a queue id the topic does not have.
        """
        cfg = self.topics.get(topic)
        if cfg is None:
            raise unknown_topic(topic, self.root)
        check_queue(
            cfg["topicName"], queue_id, int(cfg["readQueueNums"]), int(cfg["writeQueueNums"])
        )
        return self.queue(topic, queue_id)

    def on_disk(self, topic: str, queue_id: int) -> bool:
        """Does the queue have a directory (made by this process or another)?"""
        return os.path.isdir(os.path.join(self.directory, topic, str(queue_id)))

    def may_have(self, topic: str, queue_id: int) -> bool:
        """Is (topic, queue_id) a queue: on disk already, or within the topic's queue count
        (a topic not listed in topics.json may have any queue, as a broker's store does)."""
        if queue_id < 0:
            return False
        if self.on_disk(topic, queue_id):
            return True
        cfg = self.topics.get(topic)
        return cfg is None or queue_id < max(int(cfg["readQueueNums"]), int(cfg["writeQueueNums"]))

    def holds_messages(self, topic: str, queue_id: int, commitlog_min: int) -> bool:
        """Does the queue hold entries whose records are at or above ``commitlog_min``?"""
        if not self.on_disk(topic, queue_id):
            return False
        q = self.queue(topic, queue_id)
        return q.max_offset() > q.min_offset(commitlog_min)

    # -- across queues (callers hold the store's write lock) --------------------------

    def truncate(self, end: int) -> int:
        """Drop the entries of every queue whose record does not end by CommitLog ``end``.

        Returns how many entries were dropped.
        """
        dropped = 0
        base = self.directory
        if not os.path.isdir(base):
            return 0
        for topic in os.listdir(base):
            tdir = os.path.join(base, topic)
            if not os.path.isdir(tdir):
                continue
            for qid in os.listdir(tdir):
                if not qid.isdigit():
                    continue
                q = self.queue(topic, int(qid))
                before = q.max_offset()
                after = q.truncate_from_phy(end)
                dropped += before - after
        return dropped

    def delete_below(self, commitlog_min: int) -> int:
        """Delete the files of every queue that only point below CommitLog ``commitlog_min``.

        Returns how many files were deleted.
        """
        done = 0
        base = self.directory
        for topic in sorted(os.listdir(base)) if os.path.isdir(base) else []:
            for qdir in sorted(os.listdir(os.path.join(base, topic))):
                if qdir.isdigit():
                    done += self.queue(topic, int(qdir)).delete_below(commitlog_min)
        return done

    # -- flushing ------------------------------------------------------------------

    def mark_dirty(self, key: tuple[str, int], first: int) -> None:
        """Note that queue ``key`` has entries from ``first`` on that are not flushed."""
        with self._dirty_guard:
            if key not in self._dirty:
                self._dirty[key] = first

    def flush(self) -> None:
        """Force the entries marked dirty to disk, and forget them."""
        with self._dirty_guard:
            dirty, self._dirty = self._dirty, {}
        for (topic, qid), first in dirty.items():
            q = self._queues.get((topic, qid))
            if q is not None:
                q.flush(first, q.max_offset())

    def close(self) -> None:
        for q in self._queues.values():
            q.close()


def check_queue(topic: str, queue_id: int, read_queue_nums: int, write_queue_nums: int) -> None:
    """Raise OffsetOutOfRangeError unless ``topic``, with these queue counts, has ``queue_id``."""
    if not 0 <= queue_id < max(read_queue_nums, write_queue_nums):
        raise OffsetOutOfRangeError(
            f"queue {queue_id} of topic {topic!r} does not exist "
            f"(the topic has {read_queue_nums} queues)"
        )


def _entries_with_data(f: MappedFile, rel: int) -> int:
    """How many entries from byte ``rel`` of ``f`` lie where data is: reads stop before
    a hole past the queue's end (see MappedFile.data_limit)."""
    return (f.data_limit(rel, CQ_STORE_UNIT_SIZE) - rel) // CQ_STORE_UNIT_SIZE

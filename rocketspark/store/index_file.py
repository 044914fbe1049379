"""The IndexFile: a hash index from ``topic#key`` to CommitLog offsets.

File grammar (big-endian)::

    file   := header slot{hashSlotNum} entry{indexNum}
    header := beginTimestamp:i64 endTimestamp:i64 beginPhyOffset:i64 endPhyOffset:i64
              hashSlotCount:i32 indexCount:i32                           (40 bytes)
    slot   := headIndex:i32                                  (0: empty)   (4 bytes)
    entry  := keyHash:i32 phyOffset:i64 timeDiff:i32 prevIndex:i32       (20 bytes)

Entry n sits at byte ``40 + hashSlotNum * 4 + n * 20``. Entry 0 is never
written: indexCount starts at 1 and is the number of the next entry, so 0 can
mean "none" in a slot or a prevIndex. A file is full when indexCount reaches
indexNum. Files are sparse: untouched slots and entries read as zero.

Putting a key (RocketMQ's ``IndexFile.putKey``):

- keyHash = abs(Java ``String.hashCode()``), 0 when abs overflows (Integer.MIN_VALUE);
  the slot is keyHash % hashSlotNum;
- the slot's old value becomes the entry's prevIndex when 0 < value <= indexCount;
  otherwise (empty, or left over from a torn write) prevIndex is 0 and
  hashSlotCount grows by one; the slot then holds the new entry's number;
- timeDiff = (storeTimestamp - beginTimestamp) / 1000 in seconds, 0 while
  beginTimestamp <= 0, clamped to [0, 2**31 - 1]. beginTimestamp is read before
  the first entry sets it, so the first entry of a rolled file is measured from
  the previous file's endTimestamp, which the new file inherited;
- the first entry sets beginTimestamp and beginPhyOffset; every entry sets
  endTimestamp and endPhyOffset.

Readers in other processes never lock. The writer (one at a time, under the
store's lock) writes the entry bytes, then the slots, then the header with
indexCount last; a reader ignores a slot or prevIndex above the indexCount it
reads, so it never follows a link to an entry that is not written yet.

Index files live in ``<root>/index/`` and are named by their creation time,
``yyyyMMddHHmmssSSS`` in local time (RocketMQ's ``UtilAll.timeMillisToHumanString``).
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import mmap
import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from rocketspark.errors import ConfigError, CorruptRecordError, RocketSparkError
from rocketspark.message.java_hash import java_string_hash
from rocketspark.store.mapped_file import INDEX_CHUNK, reserve_ahead, reserve_blocks
from rocketspark.store.mapped_file import publish as _publish

__all__ = [
    "INDEX_HEADER",
    "INDEX_HEADER_SIZE",
    "HASH_SLOT_SIZE",
    "INDEX_ENTRY",
    "INDEX_ENTRY_SIZE",
    "INVALID_INDEX",
    "IndexHeader",
    "IndexFile",
    "check_dimensions",
    "index_file_name",
    "index_file_name_after",
    "index_file_size",
    "index_key_hash",
    "is_index_file_name",
]

INDEX_HEADER = struct.Struct(
    ">q"  # beginTimestamp (ms)
    "q"  # endTimestamp (ms)
    "q"  # beginPhyOffset
    "q"  # endPhyOffset
    "i"  # hashSlotCount
    "i"  # indexCount
)
INDEX_HEADER_SIZE = INDEX_HEADER.size
BEGIN_TIMESTAMP_OFFSET = 0
END_TIMESTAMP_OFFSET = struct.calcsize(">q")
BEGIN_PHY_OFFSET_OFFSET = struct.calcsize(">qq")
END_PHY_OFFSET_OFFSET = struct.calcsize(">qqq")
HASH_SLOT_COUNT_OFFSET = struct.calcsize(">qqqq")
INDEX_COUNT_OFFSET = struct.calcsize(">qqqqi")
# Everything in the header but indexCount, which is written last to publish entries.
_HEADER_BEFORE_COUNT = struct.Struct(INDEX_HEADER.format[:-1])

HASH_SLOT = struct.Struct(">i")
HASH_SLOT_SIZE = HASH_SLOT.size

INDEX_ENTRY = struct.Struct(
    ">i"  # keyHash
    "q"  # phyOffset
    "i"  # timeDiff (s since beginTimestamp)
    "i"  # prevIndex
)
INDEX_ENTRY_SIZE = INDEX_ENTRY.size
INDEX_ENTRY_DTYPE = np.dtype(
    [("key_hash", ">i4"), ("phy_offset", ">i8"), ("time_diff", ">i4"), ("prev_index", ">i4")]
)
assert INDEX_ENTRY_DTYPE.itemsize == INDEX_ENTRY_SIZE

INVALID_INDEX = 0
INDEX_FILE_NAME_LENGTH = len("yyyyMMddHHmmssSSS")
DEFAULT_HASH_SLOT_NUM = 5_000_000
DEFAULT_INDEX_NUM = 5_000_000 * 4

JAVA_INT_MIN = -(2**31)
JAVA_INT_MAX = 2**31 - 1
JAVA_LONG_MAX = 2**63 - 1
_LONG = struct.Struct(">q")
_INT = struct.Struct(">i")


# --- hashing ------------------------------------------------------------------------


def index_key_hash(key: str) -> int:
    """Return the keyHash RocketMQ stores for ``key``: abs(hashCode), 0 when that overflows."""
    return _abs_java_hash(java_string_hash(key))


def _abs_java_hash(h: int) -> int:
    # Java's Math.abs(Integer.MIN_VALUE) stays negative; IndexFile then uses 0.
    return 0 if h == JAVA_INT_MIN else abs(h)


# --- file geometry and names ------------------------------------------------------


def index_file_size(hash_slot_num: int, index_num: int) -> int:
    """Return the byte size of an index file with these dimensions."""
    return INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE + index_num * INDEX_ENTRY_SIZE


def check_dimensions(hash_slot_num: int, index_num: int) -> None:
    """Raise ConfigError unless RocketMQ could open a file of these dimensions."""
    if isinstance(hash_slot_num, bool) or not isinstance(hash_slot_num, int) or hash_slot_num < 1:
        raise ConfigError(f"maxHashSlotNum must be an int >= 1, got {hash_slot_num!r}")
    if isinstance(index_num, bool) or not isinstance(index_num, int) or index_num < 2:
        raise ConfigError(
            f"maxIndexNum must be an int >= 2 (entry 0 is never used), got {index_num!r}"
        )
    size = index_file_size(hash_slot_num, index_num)
    if size > JAVA_INT_MAX:
        # RocketMQ computes the file size in a Java int: it could not open such a file.
        raise ConfigError(
            f"an index file with maxHashSlotNum {hash_slot_num} and maxIndexNum {index_num} "
            f"would be {size} bytes, more than {JAVA_INT_MAX}"
        )


def index_file_name(millis: int) -> str:
    """Return RocketMQ's index file name for a creation time: ``yyyyMMddHHmmssSSS``, local time."""
    seconds, ms = divmod(millis, 1000)
    return time.strftime("%Y%m%d%H%M%S", time.localtime(seconds)) + f"{ms:03d}"


def index_file_name_after(name: str) -> str:
    """Return the file name one millisecond after ``name``."""
    try:
        t = datetime.datetime.strptime(name[:14], "%Y%m%d%H%M%S")
    except ValueError:  # digits but not a date: any larger name keeps the order
        return f"{int(name) + 1:0{INDEX_FILE_NAME_LENGTH}d}"
    t += datetime.timedelta(milliseconds=int(name[14:]) + 1)
    return t.strftime("%Y%m%d%H%M%S") + f"{t.microsecond // 1000:03d}"


def is_index_file_name(name: str) -> bool:
    """Is ``name`` an index file's name (17 digits)?"""
    return len(name) == INDEX_FILE_NAME_LENGTH and name.isdigit()


# --- time arithmetic as Java does it ------------------------------------------------


def _time_diff(store_timestamp: int, begin_timestamp: int) -> int:
    """Return the stored timeDiff (s): Java long arithmetic, clamped to [0, INT_MAX]."""
    if begin_timestamp <= 0:
        return 0
    diff = (store_timestamp - begin_timestamp + 2**63) % 2**64 - 2**63  # long wrap-around
    # Java's / truncates toward zero; negative results become 0 either way.
    return 0 if diff < 0 else min(diff // 1000, JAVA_INT_MAX)


def _time_diffs(store_timestamps: np.ndarray, begin_timestamp: int) -> np.ndarray:
    """Vectorised :func:`_time_diff`; int64 subtraction wraps like Java's long."""
    if begin_timestamp <= 0:
        return np.zeros(len(store_timestamps), dtype=np.int64)
    diff = store_timestamps - np.int64(begin_timestamp)
    return np.clip(diff // 1000, 0, JAVA_INT_MAX)


# --- one file ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IndexHeader:
    """The 40-byte header of an index file, as read at one moment."""

    begin_timestamp: int
    end_timestamp: int
    begin_phy_offset: int
    end_phy_offset: int
    hash_slot_count: int
    index_count: int  # the next entry's number; a stored 0 reads as 1, like RocketMQ's load()


class IndexFile:
    """One memory-mapped index file; build it with :meth:`create` or :meth:`open`."""

    def __init__(
        self, path: str, mm: mmap.mmap, *, hash_slot_num: int, index_num: int, writable: bool
    ):
        self.path = path
        self.name = os.path.basename(path)
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.size = index_file_size(hash_slot_num, index_num)
        self.writable = writable
        self._mm = mm
        self._entries_at = INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE
        # Bytes [0, _reserved) have their blocks (known to this process): the header
        # and slot table (random writes) whole, the entries a chunk ahead.
        self._reserved = 0
        self._slots: np.ndarray | None = np.frombuffer(
            mm, dtype=">i4", count=hash_slot_num, offset=INDEX_HEADER_SIZE
        )
        self._entries: np.ndarray | None = np.frombuffer(
            mm, dtype=INDEX_ENTRY_DTYPE, count=index_num, offset=self._entries_at
        )

    @classmethod
    def create(
        cls,
        path: str,
        *,
        hash_slot_num: int,
        index_num: int,
        prev_end_phy_offset: int = 0,
        prev_end_timestamp: int = 0,
    ) -> IndexFile:
        """Create a new, empty index file at ``path``; FileExistsError if it exists.

        ``prev_end_*`` are the previous file's endPhyOffset / endTimestamp, which
        the new file takes as its begin and end fields (each only when > 0).
        The file appears at ``path`` complete: it is sized and its header written
        under a hidden temporary name first.
        """
        check_dimensions(hash_slot_num, index_num)
        size = index_file_size(hash_slot_num, index_num)
        directory, name = os.path.split(path)
        tmp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        mm = None
        try:
            os.ftruncate(fd, size)
            # The header, the slot table and the first entries get their blocks: a
            # store into a page the file system cannot allocate kills the process
            # (SIGBUS). Later entries are reserved ahead as they come (reserve).
            reserved = min(size, INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE + INDEX_CHUNK)
            reserve_blocks(fd, reserved, path, fresh=True)
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)
            phy = prev_end_phy_offset if prev_end_phy_offset > 0 else 0
            ts = prev_end_timestamp if prev_end_timestamp > 0 else 0
            INDEX_HEADER.pack_into(mm, 0, ts, ts, phy, phy, 0, 1)
            _publish(tmp, path)
        except BaseException:
            if mm is not None:
                mm.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        finally:
            os.close(fd)
        f = cls(path, mm, hash_slot_num=hash_slot_num, index_num=index_num, writable=True)
        f._reserved = reserved
        return f

    def reserve(self, entries: int) -> None:
        """Give the next ``entries`` entries (and the slot table) blocks; DiskFullError if not.

        A comparison unless they pass the reserved mark; then up to a chunk
        (INDEX_CHUNK) past them, capped at the file's size. A process that
        opened the file reserves from its start once (the header and slot
        table, a no-op where the file system already has their blocks).
        """
        count = max(_INT.unpack_from(self._mm, INDEX_COUNT_OFFSET)[0], 1)
        end = self._entries_at + min(count + entries, self.index_num) * INDEX_ENTRY_SIZE
        if end <= self._reserved:
            return
        fd = os.open(self.path, os.O_RDWR)
        try:
            self._reserved = reserve_ahead(
                fd,
                self.path,
                self._reserved,
                end,
                min(self.size, max(end, self._reserved) + INDEX_CHUNK),
            )
        finally:
            os.close(fd)

    def reserve_room(self, entries: int) -> int:
        """Return how many more entries fit in this file, up to ``entries`` of them reserved.

        Asked before every put's append (holding the write lock): a header read
        and a comparison while the entries' blocks are reserved already, else
        :meth:`reserve` for as many of them as fit.
        """
        count = max(_INT.unpack_from(self._mm, INDEX_COUNT_OFFSET)[0], 1)
        room = max(0, self.index_num - count)
        if entries <= room and (
            self._entries_at + (count + entries) * INDEX_ENTRY_SIZE <= self._reserved
        ):
            return room  # the hot path: reserved already
        if room:
            self.reserve(min(entries, room))
        return room

    @classmethod
    def open(
        cls, path: str, *, hash_slot_num: int, index_num: int, writable: bool = True
    ) -> IndexFile:
        """Map an existing index file; CorruptRecordError if its size or header is wrong."""
        check_dimensions(hash_slot_num, index_num)
        size = index_file_size(hash_slot_num, index_num)
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        try:
            actual = os.fstat(fd).st_size
            if actual != size:
                raise CorruptRecordError(
                    f"index file is {actual} bytes, expected {size} for maxHashSlotNum "
                    f"{hash_slot_num} and maxIndexNum {index_num}",
                    file=path,
                )
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
        finally:
            os.close(fd)
        f = cls(path, mm, hash_slot_num=hash_slot_num, index_num=index_num, writable=writable)
        try:
            f._index_count()
        except CorruptRecordError:
            f.close()
            raise
        return f

    def __repr__(self) -> str:
        return f"IndexFile({self.path!r}, index_count={self.index_count})"

    def __enter__(self) -> IndexFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- header (read from the mapping each time: another process may write it) ------

    def _index_count(self) -> int:
        count = _INT.unpack_from(self._mm, INDEX_COUNT_OFFSET)[0]
        if count > self.index_num:
            raise CorruptRecordError(
                f"indexCount is {count}, expected at most maxIndexNum {self.index_num}",
                file=self.path,
                offset=INDEX_COUNT_OFFSET,
            )
        return count if count > 0 else 1

    @property
    def header(self) -> IndexHeader:
        begin_ts, end_ts, begin_phy, end_phy, slot_count, _ = INDEX_HEADER.unpack_from(self._mm)
        return IndexHeader(begin_ts, end_ts, begin_phy, end_phy, slot_count, self._index_count())

    @property
    def begin_timestamp(self) -> int:
        return _LONG.unpack_from(self._mm, BEGIN_TIMESTAMP_OFFSET)[0]

    @property
    def end_timestamp(self) -> int:
        return _LONG.unpack_from(self._mm, END_TIMESTAMP_OFFSET)[0]

    @property
    def begin_phy_offset(self) -> int:
        return _LONG.unpack_from(self._mm, BEGIN_PHY_OFFSET_OFFSET)[0]

    @property
    def end_phy_offset(self) -> int:
        return _LONG.unpack_from(self._mm, END_PHY_OFFSET_OFFSET)[0]

    @property
    def hash_slot_count(self) -> int:
        return _INT.unpack_from(self._mm, HASH_SLOT_COUNT_OFFSET)[0]

    @property
    def index_count(self) -> int:
        """The number the next entry gets (1 while the file is empty)."""
        return self._index_count()

    @property
    def entry_count(self) -> int:
        """How many entries the file holds."""
        return self._index_count() - 1

    @property
    def is_full(self) -> bool:
        return self._index_count() >= self.index_num

    def is_time_matched(self, begin_ms: int, end_ms: int) -> bool:
        """Say whether [begin_ms, end_ms] overlaps the file's [beginTimestamp, endTimestamp]."""
        b, e = self.begin_timestamp, self.end_timestamp
        return (begin_ms < b and end_ms > e) or b <= begin_ms <= e or b <= end_ms <= e

    # -- writing -----------------------------------------------------------------------

    def _check_writable(self) -> None:
        if not self.writable:
            raise RocketSparkError(f"index file {self.path} is open read-only")

    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        """Index ``key`` (already ``topic#key``); False when the file is full."""
        return self.put_hash(java_string_hash(key), phy_offset, store_timestamp)

    def put_hash(self, java_hash: int, phy_offset: int, store_timestamp: int) -> bool:
        """Index a key given its Java hashCode (signed int32); False when the file is full."""
        self._check_writable()
        mm = self._mm
        begin_ts, _, begin_phy, _, slot_count, _ = INDEX_HEADER.unpack_from(mm)
        count = self._index_count()
        if count >= self.index_num:
            return False
        if self._entries_at + (count + 1) * INDEX_ENTRY_SIZE > self._reserved:
            self.reserve(1)
        key_hash = _abs_java_hash(java_hash)
        slot_at = INDEX_HEADER_SIZE + (key_hash % self.hash_slot_num) * HASH_SLOT_SIZE
        prev = HASH_SLOT.unpack_from(mm, slot_at)[0]
        if prev <= INVALID_INDEX or prev > count:
            prev = INVALID_INDEX
        time_diff = _time_diff(store_timestamp, begin_ts)
        INDEX_ENTRY.pack_into(
            mm, self._entries_at + count * INDEX_ENTRY_SIZE, key_hash, phy_offset, time_diff, prev
        )
        HASH_SLOT.pack_into(mm, slot_at, count)
        if count <= 1:
            begin_ts, begin_phy = store_timestamp, phy_offset
        if prev == INVALID_INDEX:
            slot_count = _wrap_i32(slot_count + 1)
        _HEADER_BEFORE_COUNT.pack_into(
            mm, 0, begin_ts, store_timestamp, begin_phy, phy_offset, slot_count
        )
        _INT.pack_into(mm, INDEX_COUNT_OFFSET, count + 1)
        return True

    def put_hashes(
        self, key_hashes: np.ndarray, phy_offsets: np.ndarray, store_timestamps: np.ndarray
    ) -> int:
        """Index a batch of keys given their Java hashCodes (signed int32), in order.

        Writes the same bytes as :meth:`put_hash` called once per key. Returns
        how many keys were written: fewer than given when the file filled up.
        """
        # Hot path: a whole batch in a few numpy passes, no per-key Python work.
        # Within the batch an entry links to the previous batch entry of its
        # slot (found by a stable sort on the slot), the first one of a slot to
        # the slot's old value, and each slot ends up holding its last entry.
        self._check_writable()
        assert self._slots is not None and self._entries is not None
        hashes = np.asarray(key_hashes, dtype=np.int32)
        phys = np.asarray(phy_offsets, dtype=np.int64)
        stamps = np.asarray(store_timestamps, dtype=np.int64)
        if not len(hashes) == len(phys) == len(stamps):
            raise ValueError(
                f"batch arrays differ in length: {len(hashes)} hashes, {len(phys)} offsets, "
                f"{len(stamps)} timestamps"
            )
        begin_ts, _, begin_phy, _, slot_count, _ = INDEX_HEADER.unpack_from(self._mm)
        count = self._index_count()
        n = min(len(hashes), self.index_num - count)
        if n <= 0:
            return 0
        if self._entries_at + (count + n) * INDEX_ENTRY_SIZE > self._reserved:
            self.reserve(n)
        h = hashes[:n].astype(np.int64)
        phys, stamps = phys[:n], stamps[:n]
        key_hash = np.abs(h)
        key_hash[h == JAVA_INT_MIN] = 0
        slot = key_hash % self.hash_slot_num
        number = np.arange(count, count + n, dtype=np.int64)

        time_diff = np.empty(n, dtype=np.int64)
        time_diff[:1] = _time_diffs(stamps[:1], begin_ts)
        if count <= 1:  # the first entry sets the begin fields, after its own timeDiff
            begin_ts, begin_phy = int(stamps[0]), int(phys[0])
        time_diff[1:] = _time_diffs(stamps[1:], begin_ts)

        order = np.argsort(slot, kind="stable")
        sorted_slot = slot[order]
        sorted_number = number[order]
        first = np.empty(n, dtype=bool)
        first[0] = True
        np.not_equal(sorted_slot[1:], sorted_slot[:-1], out=first[1:])
        last = np.empty(n, dtype=bool)
        last[-1] = True
        last[:-1] = first[1:]
        old = self._slots[sorted_slot[first]].astype(np.int64)
        # Valid as putKey sees it: 0 < old <= indexCount at the time of that put.
        old_valid = (old > INVALID_INDEX) & (old <= sorted_number[first])
        sorted_prev = np.empty(n, dtype=np.int64)
        sorted_prev[1:] = sorted_number[:-1]
        sorted_prev[first] = np.where(old_valid, old, INVALID_INDEX)
        prev = np.empty(n, dtype=np.int64)
        prev[order] = sorted_prev
        new_slots = len(old) - int(np.count_nonzero(old_valid))

        entries = self._entries[count : count + n]
        entries["key_hash"] = key_hash
        entries["phy_offset"] = phys
        entries["time_diff"] = time_diff
        entries["prev_index"] = prev
        del entries
        self._slots[sorted_slot[last]] = sorted_number[last]
        _HEADER_BEFORE_COUNT.pack_into(
            self._mm,
            0,
            begin_ts,
            int(stamps[-1]),
            begin_phy,
            int(phys[-1]),
            _wrap_i32(slot_count + new_slots),
        )
        _INT.pack_into(self._mm, INDEX_COUNT_OFFSET, count + n)  # publishes the batch
        return n

    def repair(self) -> int:
        """Undo an index update that a killed writer left half done; return slots repaired.

        ``put_hash(es)`` write the entries, then the slots, then the header's end
        fields, and last indexCount, which publishes them. A writer killed before
        that leaves slots pointing at entry numbers at or past indexCount, whose
        bytes the next put overwrites (cutting each such slot's chain from its
        older entries), and an endPhyOffset past the last published record
        (which re-dispatching would then skip). Each such slot goes back along
        its chain (an unpublished entry's prev was written before the slot) to
        a published entry, and endPhyOffset to the last published entry's.
        """
        self._check_writable()
        assert self._slots is not None and self._entries is not None
        count = max(self._index_count(), 1)
        slots, entries = self._slots, self._entries
        repaired = 0
        for _ in range(64):  # a batch chains its own entries: a few steps back at most
            bad = np.flatnonzero(slots >= count)
            if not len(bad):
                break
            if not repaired:
                repaired = len(bad)
            at = slots[bad].astype(np.int64)
            prev = np.zeros(len(bad), dtype=np.int64)
            inside = at < self.index_num
            prev[inside] = entries["prev_index"][at[inside]]
            slots[bad] = prev
        else:
            slots[slots >= count] = INVALID_INDEX
        torn = repaired or (
            count < self.index_num
            and (int(entries["key_hash"][count]) or int(entries["phy_offset"][count]))
        )
        if count > 1 and torn:
            # The record of the last published entry may have more entries among the
            # unpublished ones: it is indexed again too (a repeated entry is harmless).
            last_phy = int(entries["phy_offset"][count - 1]) - 1
            if self.end_phy_offset > last_phy:
                _LONG.pack_into(self._mm, END_PHY_OFFSET_OFFSET, last_phy)
        return repaired

    # -- reading -----------------------------------------------------------------------

    def select_phy_offsets(
        self, key: str, max_num: int, begin_ms: int = 0, end_ms: int = JAVA_LONG_MAX
    ) -> list[int]:
        """Return up to ``max_num`` CommitLog offsets indexed under ``key``, newest first.

        ``key`` is the full ``topic#key``. Keeps entries whose keyHash matches
        and whose time (beginTimestamp + timeDiff s) lies in [begin_ms, end_ms];
        different keys can share a keyHash, so callers compare the real key.
        """
        if max_num <= 0:
            return []
        return list(itertools.islice(self.walk(index_key_hash(key), begin_ms, end_ms), max_num))

    def walk(self, key_hash: int, begin_ms: int, end_ms: int) -> Iterator[int]:
        """Yield CommitLog offsets of entries with ``key_hash`` in [begin_ms, end_ms], newest first.

        Follows the slot's chain as RocketMQ's ``selectPhyOffset`` does: it stops
        at an entry older than ``begin_ms`` or at a link that is not valid.
        """
        mm = self._mm
        begin_ts = _LONG.unpack_from(mm, BEGIN_TIMESTAMP_OFFSET)[0]
        count = self._index_count()
        if count <= 1:
            return
        at = HASH_SLOT.unpack_from(
            mm, INDEX_HEADER_SIZE + (key_hash % self.hash_slot_num) * HASH_SLOT_SIZE
        )[0]
        if at <= INVALID_INDEX or at > count:
            return
        entries_at = self._entries_at
        for _ in range(count):  # a chain visits an entry at most once unless the file is corrupt
            stored_hash, phy, time_diff, prev = INDEX_ENTRY.unpack_from(
                mm, entries_at + at * INDEX_ENTRY_SIZE
            )
            if time_diff < 0:
                return
            stored_at = begin_ts + time_diff * 1000
            if stored_hash == key_hash and begin_ms <= stored_at <= end_ms:
                yield phy
            if prev <= INVALID_INDEX or prev > count or prev == at or stored_at < begin_ms:
                return
            at = prev

    # -- lifecycle ---------------------------------------------------------------------

    def flush(self) -> None:
        """Force the mapped pages to disk."""
        self._mm.flush()

    def close(self) -> None:
        """Unmap the file (idempotent)."""
        self._slots = self._entries = None
        if not self._mm.closed:
            self._mm.close()

    def destroy(self) -> None:
        """Unmap and delete the file."""
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _wrap_i32(v: int) -> int:
    return (v + 2**31) % 2**32 - 2**31

"""The IndexFile: a hash index from ``topic#key`` to CommitLog offsets.

File grammar (big-endian)::

    file   := header slot{hashSlotNum} entry{indexNum}
    header := beginTimestamp:i64 endTimestamp:i64 beginPhyOffset:i64 endPhyOffset:i64
              hashSlotCount:i32 indexCount:i32          (indexCount starts at 1)
    slot   := entryNumber:i32                           (0: empty)
    entry  := keyHash:i32 phyOffset:i64 timeDiff:i32 prevIndex:i32

keyHash is abs(Java hashCode of the key) (0 for Integer.MIN_VALUE); the slot is
keyHash % hashSlotNum; a new entry links to the slot's previous entry and
becomes the slot's head. timeDiff is in seconds from beginTimestamp.

Writers (under the store's write lock) write entries first, then slots, then
the header's indexCount, so readers in other processes never follow a link to
an unwritten entry. :meth:`IndexFile.put_hashes` writes a whole batch with
numpy and yields the same bytes as one put per key.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from rocketspark.errors import CorruptRecordError
from rocketspark.store.message import java_string_hash

INDEX_HEADER = struct.Struct(
    ">q"  # beginTimestamp
    "q"  # endTimestamp
    "q"  # beginPhyOffset
    "q"  # endPhyOffset
    "i"  # hashSlotCount
    "i"  # indexCount
)
INDEX_HEADER_SIZE = INDEX_HEADER.size
HASH_SLOT_SIZE = 4
INDEX_ENTRY = struct.Struct(">iqii")
INDEX_ENTRY_SIZE = INDEX_ENTRY.size
INVALID_INDEX = 0
HASH_SLOT_COUNT_OFFSET = struct.calcsize(">qqqq")
INDEX_COUNT_OFFSET = HASH_SLOT_COUNT_OFFSET + 4
ENTRY_DTYPE = np.dtype([("hash", ">i4"), ("phy", ">i8"), ("time_diff", ">i4"),
                        ("prev", ">i4")])
assert INDEX_HEADER_SIZE == 40 and INDEX_ENTRY_SIZE == ENTRY_DTYPE.itemsize == 20
INT_MAX = 2**31 - 1
INT_MIN = -(2**31)
_I32 = struct.Struct(">i")


def key_hash(key: str) -> int:
    """Return RocketMQ's index hash of ``key``: abs(hashCode), 0 when that overflows."""
    h = java_string_hash(key)
    return 0 if h == INT_MIN else abs(h)


def java_hash_many(strings: Sequence[str]) -> np.ndarray:
    """Return Java ``String.hashCode()`` of each string as int32 (vectorised for ASCII)."""
    out = np.empty(len(strings), dtype=np.int32)
    by_len: dict[int, list[int]] = {}
    for i, s in enumerate(strings):
        if s.isascii():
            by_len.setdefault(len(s), []).append(i)
        else:
            out[i] = java_string_hash(s)
    for length, idx in by_len.items():
        if length == 0:
            out[idx] = 0
            continue
        data = np.frombuffer("".join(strings[i] for i in idx).encode("ascii"),
                            dtype=np.uint8).reshape(len(idx), length).astype(np.uint32)
        powers = _powers_of_31(length)
        with np.errstate(over="ignore"):
            h = (data * powers).sum(axis=1, dtype=np.uint32)
        out[idx] = h.view(np.int32)
    return out


@lru_cache(maxsize=256)
def _powers_of_31(length: int) -> np.ndarray:
    """31**(length-1-j) mod 2**32 for j in 0..length-1: the weights of String.hashCode."""
    return np.array([pow(31, length - 1 - j, 1 << 32) for j in range(length)], dtype=np.uint32)


class IndexFile:
    """One mapped index file."""

    def __init__(self, path: str, hash_slot_num: int, index_num: int, *, create: bool,
                 begin_phy: int = 0, begin_ts: int = 0):
        self.path = path
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.size = INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE + index_num * INDEX_ENTRY_SIZE
        self.entries_at = INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE
        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o644)
        try:
            actual = os.fstat(fd).st_size
            if create:
                os.ftruncate(fd, self.size)
            elif actual != self.size:
                raise CorruptRecordError(
                    f"index file is {actual} bytes, expected {self.size} for maxHashSlotNum "
                    f"{hash_slot_num} and maxIndexNum {index_num}", file=path)
            self.mm = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)
        if create:
            INDEX_HEADER.pack_into(self.mm, 0, max(begin_ts, 0), max(begin_ts, 0),
                                   max(begin_phy, 0), max(begin_phy, 0), 0, 1)

    # header fields, read from the mapping every time (other processes write them)
    def header(self) -> tuple[int, int, int, int, int, int]:
        return INDEX_HEADER.unpack_from(self.mm, 0)

    @property
    def begin_timestamp(self) -> int:
        return self.header()[0]

    @property
    def end_timestamp(self) -> int:
        return self.header()[1]

    @property
    def begin_phy_offset(self) -> int:
        return self.header()[2]

    @property
    def end_phy_offset(self) -> int:
        return self.header()[3]

    @property
    def hash_slot_count(self) -> int:
        return self.header()[4]

    @property
    def index_count(self) -> int:
        return _I32.unpack_from(self.mm, INDEX_COUNT_OFFSET)[0]

    @property
    def is_full(self) -> bool:
        return self.index_count >= self.index_num

    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        """Index one key; False when the file is full."""
        return self.put_hashes(np.array([java_string_hash(key)], dtype=np.int32),
                               np.array([phy_offset], dtype=np.int64),
                               np.array([store_timestamp], dtype=np.int64)) == 1

    def put_hashes(self, hashes: np.ndarray, phy_offsets: np.ndarray,
                   store_timestamps: np.ndarray) -> int:
        """Index a batch of Java key hashes; return how many fit (the rest: file full)."""
        begin_ts, _end_ts, begin_phy, _end_phy, slot_count, count = self.header()
        n = min(len(hashes), self.index_num - count)
        if n <= 0:
            return 0
        h = np.asarray(hashes[:n], dtype=np.int64)
        kh = np.where(h == INT_MIN, 0, np.abs(h))
        phy = np.asarray(phy_offsets[:n], dtype=np.int64)
        ts = np.asarray(store_timestamps[:n], dtype=np.int64)
        slots = (kh % self.hash_slot_num).astype(np.int64)
        # timeDiff as Java computes it: the first entry of a fresh file is measured
        # against the inherited begin, then the begin becomes its own timestamp.
        td = np.empty(n, dtype=np.int64)
        td[0] = _time_diff(ts[:1], begin_ts)[0]
        if count <= 1:
            begin_ts, begin_phy = int(ts[0]), int(phy[0])
        td[1:] = _time_diff(ts[1:], begin_ts)
        numbers = np.arange(count, count + n, dtype=np.int64)
        slot_view = np.frombuffer(self.mm, dtype=">i4", count=self.hash_slot_num,
                                  offset=INDEX_HEADER_SIZE)
        old = slot_view[slots].astype(np.int64)
        old = np.where((old <= INVALID_INDEX) | (old > count), INVALID_INDEX, old)
        order = np.argsort(slots, kind="stable")
        s_sorted = slots[order]
        first_of_group = np.ones(n, dtype=bool)
        first_of_group[1:] = s_sorted[1:] != s_sorted[:-1]
        prev_sorted = np.empty(n, dtype=np.int64)
        prev_sorted[first_of_group] = old[order][first_of_group]
        prev_sorted[~first_of_group] = numbers[order][:-1][~first_of_group[1:]]
        prev = np.empty(n, dtype=np.int64)
        prev[order] = prev_sorted
        new_slots = int(np.count_nonzero(old[order][first_of_group] == INVALID_INDEX))
        block = np.empty(n, dtype=ENTRY_DTYPE)
        block["hash"] = kh
        block["phy"] = phy
        block["time_diff"] = td
        block["prev"] = prev
        entries = np.frombuffer(self.mm, dtype=ENTRY_DTYPE, count=n,
                                offset=self.entries_at + count * INDEX_ENTRY_SIZE)
        entries[:] = block
        last_of_group = np.ones(n, dtype=bool)
        last_of_group[:-1] = s_sorted[1:] != s_sorted[:-1]
        slot_view[s_sorted[last_of_group]] = numbers[order][last_of_group]
        del entries, slot_view
        INDEX_HEADER.pack_into(self.mm, 0, begin_ts, int(ts[n - 1]), begin_phy, int(phy[n - 1]),
                               slot_count + new_slots, count)
        _I32.pack_into(self.mm, INDEX_COUNT_OFFSET, count + n)  # last: publishes the batch
        return n

    def select_phy_offsets(self, key: str, max_num: int, begin_ms: int, end_ms: int
                           ) -> list[int]:
        """Walk ``key``'s chain, newest first; keep matching hashes stored in [begin, end]."""
        begin_ts, _e, _bp, _ep, _sc, count = self.header()
        kh = key_hash(key)
        slot = kh % self.hash_slot_num
        value = _I32.unpack_from(self.mm, INDEX_HEADER_SIZE + slot * HASH_SLOT_SIZE)[0]
        out: list[int] = []
        if value <= INVALID_INDEX or value > count or count <= 1:
            return out
        nxt = value
        steps = 0
        while len(out) < max_num and steps <= count:
            steps += 1
            h, phy, td, prev = INDEX_ENTRY.unpack_from(
                self.mm, self.entries_at + nxt * INDEX_ENTRY_SIZE)
            if td < 0:
                break
            t = begin_ts + td * 1000
            if h == kh and begin_ms <= t <= end_ms:
                out.append(phy)
            if prev <= INVALID_INDEX or prev > count or prev == nxt or t < begin_ms:
                break
            nxt = prev
        return out

    def is_time_matched(self, begin: int, end: int) -> bool:
        b, e = self.begin_timestamp, self.end_timestamp
        return (begin < b and end > e) or (b <= begin <= e) or (b <= end <= e)

    def flush(self) -> None:
        self.mm.flush()

    def close(self) -> None:
        try:
            self.mm.close()
        except BufferError:
            pass

    def destroy(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _time_diff(ts: np.ndarray, begin: int) -> np.ndarray:
    if begin <= 0:
        return np.zeros(len(ts), dtype=np.int64)
    d = (ts - begin) // 1000
    # Java divides with truncation toward zero; negative diffs clamp to 0 anyway.
    return np.clip(d, 0, INT_MAX)


class IndexService:
    """The index files of one store (``<root>/index``)."""

    def __init__(self, index_dir: str, *, hash_slot_num: int = 5_000_000,
                 index_num: int = 20_000_000):
        self.directory = index_dir
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.files: list[IndexFile] = []
        self.refresh()

    def refresh(self) -> None:
        """Map index files another process created; forget deleted ones."""
        try:
            names = sorted(n for n in os.listdir(self.directory) if n.isdigit())
        except FileNotFoundError:
            names = []
        known = {os.path.basename(f.path): f for f in self.files}
        files = []
        for name in names:
            f = known.pop(name, None)
            if f is None:
                f = IndexFile(os.path.join(self.directory, name), self.hash_slot_num,
                              self.index_num, create=False)
            files.append(f)
        for stale in known.values():
            stale.close()
        self.files = files

    def max_phy_offset(self) -> int:
        """The highest CommitLog offset indexed so far (-1 when none)."""
        for f in reversed(self.files):
            if f.index_count > 1:
                return f.end_phy_offset
        return -1

    def _new_file(self) -> IndexFile:
        os.makedirs(self.directory, exist_ok=True)
        last = self.files[-1] if self.files else None
        now = time.time()
        while True:
            name = time.strftime("%Y%m%d%H%M%S", time.localtime(now)) + f"{int(now * 1000) % 1000:03d}"
            path = os.path.join(self.directory, name)
            if not os.path.exists(path) and (not self.files or name > os.path.basename(
                    self.files[-1].path)):
                break
            now += 0.001
        f = IndexFile(path, self.hash_slot_num, self.index_num, create=True,
                      begin_phy=last.end_phy_offset if last else 0,
                      begin_ts=last.end_timestamp if last else 0)
        self.files.append(f)
        return f

    def build_index_batch(self, topics: Sequence[str], uniq_keys: Sequence[str | None],
                          keys: Sequence[Sequence[str]], phy_offsets: Sequence[int],
                          store_timestamps: Sequence[int]) -> int:
        """Index ``topic#UNIQ_KEY`` and ``topic#key`` of each record; return entries written.

        Records at or below the highest offset already indexed are skipped, so
        re-dispatching after a crash does not index twice.
        """
        self.refresh()
        floor = self.max_phy_offset()
        strings: list[str] = []
        phys: list[int] = []
        times: list[int] = []
        for topic, uniq, ks, phy, ts in zip(topics, uniq_keys, keys, phy_offsets,
                                            store_timestamps):
            if phy <= floor:
                continue
            if uniq:
                strings.append(f"{topic}#{uniq}")
                phys.append(phy)
                times.append(ts)
            for k in ks:
                strings.append(f"{topic}#{k}")
                phys.append(phy)
                times.append(ts)
        if not strings:
            return 0
        hashes = java_hash_many(strings)
        phy_arr = np.asarray(phys, dtype=np.int64)
        ts_arr = np.asarray(times, dtype=np.int64)
        done = 0
        while done < len(strings):
            f = self.files[-1] if self.files and not self.files[-1].is_full else self._new_file()
            done += f.put_hashes(hashes[done:], phy_arr[done:], ts_arr[done:])
        return done

    def query(self, topic: str, key: str, max_num: int = 64, begin_ms: int = 0,
              end_ms: int = 2**63 - 1) -> list[int]:
        """Return CommitLog offsets indexed under ``topic#key``, newest file first.

        Hash collisions are possible: callers compare the real key.
        """
        self.refresh()
        full = f"{topic}#{key}"
        out: list[int] = []
        seen: set[int] = set()
        for f in reversed(self.files):
            if len(out) >= max_num:
                break
            if f.index_count <= 1 or not f.is_time_matched(begin_ms, end_ms):
                continue
            for phy in f.select_phy_offsets(full, max_num - len(out), begin_ms, end_ms):
                if phy not in seen:
                    seen.add(phy)
                    out.append(phy)
        return out

    def truncate(self, phy_offset: int) -> int | None:
        """Drop index files holding entries at or past ``phy_offset`` (recovery).

        Returns the CommitLog offset from which the caller must re-index, or
        None when nothing was dropped.
        """
        self.refresh()
        rebuild = None
        keep = []
        for f in self.files:
            if f.index_count > 1 and f.end_phy_offset >= phy_offset:
                if f.begin_phy_offset < phy_offset:
                    rebuild = f.begin_phy_offset if rebuild is None else min(rebuild,
                                                                              f.begin_phy_offset)
                f.destroy()
            else:
                keep.append(f)
        self.files = keep
        return rebuild

    def flush(self) -> None:
        for f in self.files:
            f.flush()

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files = []

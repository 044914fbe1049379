"""IndexService: the index files of one store, oldest first (RocketMQ's ``IndexService``).

It maps the files of ``<root>/index`` (:mod:`rocketspark.store.index_file`
has the format of one), rolls to a new file when the newest fills up, finds
the offsets indexed under a key newest file first, and deletes or truncates
files for expiry and recovery.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence

import numpy as np

from rocketspark.errors import RocketSparkError
from rocketspark.message.java_hash import java_hash_many
from rocketspark.message.model import KEY_SEPARATOR
from rocketspark.store.index_file import (
    DEFAULT_HASH_SLOT_NUM,
    DEFAULT_INDEX_NUM,
    HASH_SLOT_SIZE,
    INDEX_ENTRY_SIZE,
    INDEX_HEADER_SIZE,
    JAVA_LONG_MAX,
    IndexFile,
    check_dimensions,
    index_file_name,
    index_file_name_after,
    index_file_size,
    index_key_hash,
    is_index_file_name,
)
from rocketspark.store.mapped_file import INDEX_CHUNK

log = logging.getLogger(__name__)

__all__ = ["IndexService"]


class IndexService:
    """The index files of one store (``<root>/index``), oldest first.

    Several processes may map the same directory. Writers (``build_*``,
    ``truncate``) must hold the store's lock; readers do not lock and call
    :meth:`refresh` to see files that another process created.
    """

    def __init__(
        self,
        index_dir: str,
        *,
        hash_slot_num: int = DEFAULT_HASH_SLOT_NUM,
        index_num: int = DEFAULT_INDEX_NUM,
        writable: bool = True,
    ):
        check_dimensions(hash_slot_num, index_num)
        self.directory = index_dir
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.writable = writable
        self._files: list[IndexFile] = []
        self._flushed_count: dict[str, int] = {}
        self.refresh()

    @property
    def files(self) -> tuple[IndexFile, ...]:
        """The mapped index files, oldest first."""
        return tuple(self._files)

    def sync_tail(self) -> None:
        """:meth:`refresh` for a writer, after another process's append, when needed.

        A writer starts a new file only when the last one is full, and deletion
        takes the oldest files, never the last (it indexes the newest records):
        while this process's last file has room, no other can have started one,
        and the directory listing (~10-20 µs, at every put of a busy
        multi-process SYNC_FLUSH store) is skipped.
        """
        if not self._files or self._files[-1].is_full:
            self.refresh()

    def refresh(self) -> None:
        """Map index files another process created and forget ones it deleted."""
        try:
            names = sorted(n for n in os.listdir(self.directory) if is_index_file_name(n))
        except FileNotFoundError:
            names = []
        if names == [f.name for f in self._files]:
            return
        known = {f.name: f for f in self._files}
        files: list[IndexFile] = []
        try:
            for name in names:
                f = known.pop(name, None)
                if f is None:
                    f = IndexFile.open(
                        os.path.join(self.directory, name),
                        hash_slot_num=self.hash_slot_num,
                        index_num=self.index_num,
                        writable=self.writable,
                    )
                files.append(f)
        except BaseException:
            for f in files:
                if f not in self._files:
                    f.close()
            raise
        for gone in known.values():
            gone.close()
            self._flushed_count.pop(gone.name, None)
        self._files = files

    def repair_tail(self) -> int:
        """:meth:`IndexFile.repair` on the newest files (a writer died; only the last
        one or two can hold its half-done update). Returns the slots repaired."""
        self._check_writable()
        self.refresh()
        repaired = sum(f.repair() for f in self._files[-2:])
        if repaired:
            log.warning(
                "index %s: %d hash slots pointed at entries a killed writer never "
                "published; relinked",
                self.directory,
                repaired,
            )
        return repaired

    @property
    def max_phy_offset(self) -> int:
        """The endPhyOffset of the newest file holding entries; -1 when nothing is indexed.

        Records at or below it are indexed already: ``build_*`` skip them.
        """
        for f in reversed(self._files):
            if f.index_count > 1:
                return f.end_phy_offset
        return -1

    def reserve(self, entries: int) -> int:
        """Reserve the blocks of ``entries`` more entries in the newest file (DiskFullError
        if not); return the bytes the new files they would start need (0: none).

        Called by an append before it writes (holding the write lock): its
        entries then never meet a missing block in the newest file; new files
        reserve their blocks when created (only checked for room here).
        """
        room = self._files[-1].reserve_room(entries) if self._files else 0
        if entries <= room:
            return 0
        per_file = self.index_num - 1  # entry 0 is never used
        left = entries - room
        size = index_file_size(self.hash_slot_num, self.index_num)
        slots_end = INDEX_HEADER_SIZE + self.hash_slot_num * HASH_SLOT_SIZE
        need = 0
        while left > 0:
            take = min(left, per_file)
            need += min(size, slots_end + (take + 1) * INDEX_ENTRY_SIZE + INDEX_CHUNK)
            left -= take
        return need

    # -- writing -----------------------------------------------------------------------

    def _check_writable(self) -> None:
        if not self.writable:
            raise RocketSparkError(f"index directory {self.directory} is open read-only")

    def build_index(
        self,
        topic: str,
        phy_offset: int,
        store_timestamp: int,
        uniq_key: str | None,
        keys: str | Sequence[str] | None,
    ) -> int:
        """Index one record under ``topic#uniq_key`` and ``topic#<each key>``.

        ``keys`` is the KEYS property (keys separated by one space) or a
        sequence of keys; empty keys are skipped. Returns the entries written
        (0 when ``phy_offset`` is at or below :attr:`max_phy_offset`).
        """
        return self.build_index_batch([topic], [uniq_key], [keys], [phy_offset], [store_timestamp])

    def build_index_batch(
        self,
        topics: str | Sequence[str],
        uniq_keys: Sequence[str | None],
        keys: Sequence[str | Sequence[str] | None],
        phy_offsets: Sequence[int] | np.ndarray,
        store_timestamps: Sequence[int] | np.ndarray,
        *,
        reindex_from: int | None = None,
    ) -> int:
        """Index a batch of records in order, as :meth:`build_index` one by one would.

        ``topics`` is one topic for every record or one per record. Records at
        or below :attr:`max_phy_offset` are skipped, so re-dispatching after a
        crash does not index twice, except those at or past ``reindex_from``
        (recovery re-indexing a deleted file: its first record may have entries
        in the file before it too, and a repeated entry is harmless, since
        queries drop duplicates). Rolls to a new file when one fills up.
        Returns the entries written.
        """
        self._check_writable()
        self.refresh()
        floor = self.max_phy_offset
        if reindex_from is not None:
            floor = min(floor, reindex_from - 1)
        topic_of = [topics] * len(uniq_keys) if isinstance(topics, str) else topics
        strings: list[str] = []
        owner: list[int] = []
        for i, (topic, uniq, ks, phy) in enumerate(
            zip(topic_of, uniq_keys, keys, phy_offsets, strict=True)
        ):
            if phy <= floor:
                continue
            prefix = topic + "#"
            if uniq is not None:  # RocketMQ indexes an empty UNIQ_KEY too
                strings.append(prefix + uniq)
                owner.append(i)
            if ks:
                for k in ks.split(KEY_SEPARATOR) if isinstance(ks, str) else ks:
                    if k:
                        strings.append(prefix + k)
                        owner.append(i)
        if not strings:
            return 0
        at = np.asarray(owner, dtype=np.intp)
        return self._put(
            java_hash_many(strings),
            np.asarray(phy_offsets, dtype=np.int64)[at],
            np.asarray(store_timestamps, dtype=np.int64)[at],
        )

    def put_hashes(
        self,
        hashes: Sequence[int] | np.ndarray,
        phys: Sequence[int] | np.ndarray,
        stamps: Sequence[int] | np.ndarray,
    ) -> int:
        """Index keys given their Java hashCodes (``topic#key`` hashed), in order.

        The fast path of a put: the caller holds the store's write lock, has
        called :meth:`refresh` since another process last wrote, and passes
        records above :attr:`max_phy_offset` only. Rolls to a new file when
        one fills up; returns the entries written. Lists or arrays: a single
        put passes lists of plain ints (no numpy).
        """
        self._check_writable()
        if len(hashes) <= 4:  # a single put: struct beats numpy's per-call cost
            done = 0
            for h, phy, ts in zip(hashes, phys, stamps, strict=True):
                f = self._files[-1] if self._files and not self._files[-1].is_full else None
                if f is None:
                    f = self._new_file()
                if not f.put_hash(int(h), int(phy), int(ts)):
                    f = self._new_file()
                    f.put_hash(int(h), int(phy), int(ts))
                done += 1
            return done
        return self._put(
            np.asarray(hashes, dtype=np.int32),
            np.asarray(phys, dtype=np.int64),
            np.asarray(stamps, dtype=np.int64),
        )

    def _put(self, hashes: np.ndarray, phys: np.ndarray, stamps: np.ndarray) -> int:
        done = 0
        while done < len(hashes):
            f = self._files[-1] if self._files and not self._files[-1].is_full else None
            if f is None:
                f = self._new_file()
            done += f.put_hashes(hashes[done:], phys[done:], stamps[done:])
        return done

    def _new_file(self) -> IndexFile:
        """Create the next file, named by the current time and after every existing one."""
        os.makedirs(self.directory, exist_ok=True)
        prev = self._files[-1] if self._files else None
        name = index_file_name(time.time_ns() // 1_000_000)
        if prev is not None and name <= prev.name:
            name = index_file_name_after(prev.name)  # same millisecond, or the clock went back
        while True:
            try:
                f = IndexFile.create(
                    os.path.join(self.directory, name),
                    hash_slot_num=self.hash_slot_num,
                    index_num=self.index_num,
                    prev_end_phy_offset=prev.end_phy_offset if prev else 0,
                    prev_end_timestamp=prev.end_timestamp if prev else 0,
                )
            except FileExistsError:
                name = index_file_name_after(name)
                continue
            self._files.append(f)
            return f

    def delete_below(self, phy_offset: int) -> int:
        """Delete index files (never the newest) that only index records below ``phy_offset``."""
        self._check_writable()
        self.refresh()
        deleted = 0
        while len(self._files) > 1 and self._files[0].end_phy_offset < phy_offset:
            f = self._files.pop(0)
            self._flushed_count.pop(f.name, None)
            f.destroy()
            deleted += 1
        return deleted

    def truncate(self, phy_offset: int) -> int | None:
        """Delete the index files that reach ``phy_offset`` or past it (recovery).

        A file is deleted when its begin or end phyOffset is at or past
        ``phy_offset``. Returns the lowest beginPhyOffset below ``phy_offset`` of
        a deleted file that held entries: the caller must re-index from there
        (entries of that file below ``phy_offset`` are gone too). None when no
        such file was deleted.
        """
        self._check_writable()
        self.refresh()
        rebuild: int | None = None
        keep: list[IndexFile] = []
        for f in self._files:
            begin, end = f.begin_phy_offset, f.end_phy_offset
            if begin < phy_offset and end < phy_offset:
                keep.append(f)
                continue
            if f.index_count > 1 and begin < phy_offset:
                rebuild = begin if rebuild is None else min(rebuild, begin)
            f.destroy()
            self._flushed_count.pop(f.name, None)
        self._files = keep
        self._remove_temporaries()
        return rebuild

    def _remove_temporaries(self) -> None:
        """Delete half-created files a crashed writer left behind (recovery only)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return
        for name in names:
            if name.startswith(".") and name.endswith(".tmp"):
                try:
                    os.unlink(os.path.join(self.directory, name))
                except FileNotFoundError:
                    pass

    # -- reading -----------------------------------------------------------------------

    def query(
        self,
        topic: str,
        key: str,
        max_num: int = 64,
        begin_ms: int = 0,
        end_ms: int = JAVA_LONG_MAX,
    ) -> list[int]:
        """Return up to ``max_num`` CommitLog offsets indexed under ``topic#key``.

        Newest file first, newest entry first within a file, without duplicates.
        Times are matched at the index's one-second resolution, [begin_ms, end_ms]
        inclusive. Hash collisions are possible: callers compare the real key.
        Call :meth:`refresh` first to see files another process created.
        """
        out: list[int] = []
        if max_num <= 0:
            return out
        key_hash = index_key_hash(f"{topic}#{key}")
        seen: set[int] = set()
        for f in reversed(self._files):
            if f.index_count > 1 and f.is_time_matched(begin_ms, end_ms):
                for phy in f.walk(key_hash, begin_ms, end_ms):
                    if phy not in seen:
                        seen.add(phy)
                        out.append(phy)
                        if len(out) >= max_num:
                            return out
            if f.begin_timestamp < begin_ms:  # older files end before begin_ms
                break
        return out

    # -- lifecycle ---------------------------------------------------------------------

    def flush(self) -> None:
        """Force every file that gained entries since its last flush."""
        for f in self._files:
            count = f.index_count
            if self._flushed_count.get(f.name) != count:
                f.flush()
                self._flushed_count[f.name] = count

    def close(self) -> None:
        """Unmap every file."""
        for f in self._files:
            f.close()
        self._files = []
        self._flushed_count.clear()

    def __enter__(self) -> IndexService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

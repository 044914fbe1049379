"""Memory-mapped, preallocated segment files and the queue of them.

A segment is named by the 20-digit offset of its first byte and preallocated
to its full size, its blocks reserved (``posix_fallocate``) when it is
created: a store into a mapped page whose block the file system cannot
allocate kills the process with SIGBUS, so no file the store writes through a
mapping may be sparse. Several processes map the same files; a reader learns
of a segment another process created with :meth:`MappedFileQueue.refresh`.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from collections.abc import Iterator

from rocketspark.errors import CorruptRecordError, DiskFullError, StoreClosedError

FILE_NAME_DIGITS = 20
PAGE_SIZE = mmap.PAGESIZE
_ZEROS = memoryview(bytes(1 << 20))


_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
# posix_fallocate's answers when the file system cannot preallocate (glibc emulates
# most of these itself; EINVAL also means "not supported" per POSIX).
_NO_FALLOCATE = (errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS)


def disk_full(path: str, needed: int, cause: OSError | None = None) -> DiskFullError:
    """Return the DiskFullError for ``needed`` bytes that ``path`` could not get."""
    why = f": {cause.strerror}" if cause is not None and cause.strerror else ""
    return DiskFullError(
        f"no space left on the device for {path} ({needed} bytes needed{why}); "
        "free disk space (e.g. delete expired files with `rocketspark store clean`) "
        "and retry", file=path, needed=needed)


def is_sparse(st: os.stat_result) -> bool:
    """Does the file have blocks left to allocate (a write into it may meet no space)?"""
    return st.st_blocks * 512 < st.st_size


def reserve_blocks(fd: int, size: int, path: str, *, fresh: bool) -> None:
    """Allocate every block of bytes [0, size) of ``fd``; DiskFullError when there is no room.

    ``fresh``: the file holds nothing yet, so where the file system has no
    ``fallocate`` zeros are written over all of it; otherwise only over its
    holes (found with SEEK_HOLE), which must not be written by anyone else
    meanwhile (the store's first opener, holding its lock exclusively).
    Never changes a byte of data. The caller undoes a creation that fails.
    """
    if size <= 0:
        return
    try:
        os.posix_fallocate(fd, 0, size)
        return
    except OSError as exc:
        if exc.errno in _NO_SPACE:
            raise disk_full(path, size, exc) from None
        if exc.errno not in _NO_FALLOCATE:
            raise
    try:
        if fresh:
            _write_zeros(fd, 0, size)
            return
        pos = 0
        while pos < size:
            try:
                hole = os.lseek(fd, pos, os.SEEK_HOLE)
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
                return
            if hole >= size:
                return
            try:
                data = os.lseek(fd, hole, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
                data = size
            _write_zeros(fd, hole, min(data, size))
            pos = data
    except OSError as exc:
        if exc.errno in _NO_SPACE:
            raise disk_full(path, size, exc) from None
        raise


def _write_zeros(fd: int, start: int, end: int) -> None:
    zeros = _ZEROS
    pos = start
    while pos < end:
        pos += os.pwrite(fd, zeros[:min(len(zeros), end - pos)], pos)


def segment_name(start_offset: int) -> str:
    """Return the file name of the segment starting at ``start_offset``."""
    return f"{start_offset:0{FILE_NAME_DIGITS}d}"


class MappedFile:
    """One segment: a file of fixed size mapped into memory."""

    __slots__ = ("path", "start_offset", "size", "_fd", "mm", "writable")

    def __init__(self, path: str, start_offset: int, size: int, *, create: bool, writable: bool):
        self.path = path
        self.start_offset = start_offset
        self.size = size
        self.writable = writable
        flags = os.O_RDWR if writable else os.O_RDONLY
        if create:
            flags |= os.O_CREAT
        fd = os.open(path, flags, 0o644)
        try:
            actual = os.fstat(fd).st_size
            if actual < size:
                if not writable:
                    raise CorruptRecordError(
                        f"segment is {actual} bytes, expected {size}", file=path)
                try:
                    os.ftruncate(fd, size)
                    reserve_blocks(fd, size, path, fresh=actual == 0)
                except BaseException:
                    if create and actual == 0:  # new: leave no empty or sparse file behind
                        os.unlink(path)
                    raise
            elif actual > size:
                raise CorruptRecordError(
                    f"segment is {actual} bytes, larger than the configured size {size}; "
                    "is mappedFileSize set as the store was written?", file=path)
            access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
            self.mm = mmap.mmap(fd, size, access=access)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    @property
    def end_offset(self) -> int:
        return self.start_offset + self.size

    def prefill(self, start: int, end: int) -> None:
        """Write zeros over bytes [start, end) of this segment with write(2).

        The first store into a page of a fresh mapping costs a page fault that
        allocates and zeroes the page (~8 µs here); write(2) puts the same
        pages in the page cache ~9x cheaper, and without holding the GIL.
        Only for bytes that hold nothing yet (past the CommitLog's end).
        """
        _write_zeros(self._fd, start, end)

    def flush(self, start: int = 0, end: int | None = None) -> None:
        """Force bytes [start, end) of this segment (file positions) to disk."""
        if end is None:
            end = self.size
        start -= start % PAGE_SIZE
        if end > start:
            self.mm.flush(start, end - start)

    def close(self) -> None:
        if self._fd < 0:
            return
        try:
            self.mm.close()
        except BufferError:
            # A zero-copy view (an Arrow batch) still uses the mapping; the
            # kernel unmaps it when that view is released.
            pass
        os.close(self._fd)
        self._fd = -1

    def destroy(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class MappedFileQueue:
    """The ordered segments of one directory (a CommitLog or one ConsumeQueue).

    Changes to the list (refresh, create, delete, close) take the queue's lock:
    the ASYNC_FLUSH thread refreshes a queue the writer may be extending, and a
    refresh that listed the directory before the writer's new segment would
    otherwise close it, or map it twice. Finding a known segment takes no lock
    (``files`` is replaced whole, never changed in place).
    """

    def __init__(self, directory: str, file_size: int, *, writable: bool = True):
        self.directory = directory
        self.file_size = file_size
        self.writable = writable
        self.files: list[MappedFile] = []
        self._closed = False
        self._lock = threading.RLock()
        self.refresh()

    def _names_on_disk(self) -> list[int]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        starts = []
        for name in names:
            if len(name) == FILE_NAME_DIGITS and name.isdigit():
                starts.append(int(name))
        starts.sort()
        return starts

    def refresh(self) -> None:
        """Map segments another process created (or drop ones it deleted)."""
        with self._lock:
            self._refresh()

    def _refresh(self) -> None:
        if self._closed:
            raise StoreClosedError(f"segment queue {self.directory} is closed")
        starts = self._names_on_disk()
        known = {f.start_offset: f for f in self.files}
        files = []
        for start in starts:
            if start % self.file_size:
                raise CorruptRecordError(
                    f"segment name is not a multiple of the file size {self.file_size}",
                    file=os.path.join(self.directory, segment_name(start)))
            f = known.pop(start, None)
            if f is None:
                f = MappedFile(os.path.join(self.directory, segment_name(start)), start,
                               self.file_size, create=False, writable=self.writable)
            files.append(f)
        for stale in known.values():
            stale.close()
        for a, b in zip(files, files[1:]):
            if b.start_offset != a.end_offset:
                raise CorruptRecordError(
                    f"segments are not contiguous: {segment_name(a.start_offset)} is followed "
                    f"by {segment_name(b.start_offset)}", file=self.directory)
        self.files = files

    @property
    def min_offset(self) -> int:
        return self.files[0].start_offset if self.files else 0

    @property
    def last(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    def find(self, offset: int, *, refresh: bool = True) -> MappedFile | None:
        """Return the segment holding ``offset``, mapping new ones if needed."""
        files = self.files
        if files:
            first = files[0].start_offset
            idx = (offset - first) // self.file_size
            if 0 <= idx < len(files):
                return files[idx]
        if refresh and not self._closed:
            self.refresh()
            files = self.files
            if files:
                idx = (offset - files[0].start_offset) // self.file_size
                if 0 <= idx < len(files):
                    return files[idx]
        return None

    def get_or_create(self, offset: int) -> MappedFile:
        """Return the segment holding ``offset``, creating it (and any before it)."""
        f = self.find(offset)
        if f is not None:
            return f
        with self._lock:
            f = self.find(offset)
            if f is not None:
                return f
            os.makedirs(self.directory, exist_ok=True)
            start = offset - offset % self.file_size
            if self.files and start < self.files[0].start_offset:
                raise CorruptRecordError(
                    f"offset {offset} lies before the first segment", file=self.directory)
            files = list(self.files)
            first_new = files[-1].end_offset if files else start
            for s in range(first_new, start + 1, self.file_size):
                path = os.path.join(self.directory, segment_name(s))
                files.append(MappedFile(path, s, self.file_size, create=True, writable=True))
            self.files = files
            return files[-1]

    def segments_from(self, offset: int) -> Iterator[MappedFile]:
        for f in self.files:
            if f.end_offset > offset:
                yield f

    def delete_first(self) -> None:
        """Delete the oldest segment (expired data)."""
        with self._lock:
            self.files[0].destroy()
            self.files = self.files[1:]

    def delete_from(self, offset: int) -> None:
        """Delete every segment that starts at or after ``offset``."""
        with self._lock:
            keep = []
            for f in self.files:
                if f.start_offset >= offset:
                    f.destroy()
                else:
                    keep.append(f)
            self.files = keep

    def flush(self, start: int, end: int) -> None:
        """Force bytes [start, end) of the queue to disk."""
        for f in self.files:
            if f.end_offset <= start or f.start_offset >= end:
                continue
            f.flush(max(start, f.start_offset) - f.start_offset,
                    min(end, f.end_offset) - f.start_offset)

    def close(self) -> None:
        with self._lock:
            for f in self.files:
                f.close()
            self.files = []
            self._closed = True

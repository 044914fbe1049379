"""Memory-mapped, preallocated segment files and the queue of them.

A segment is named by the 20-digit offset of its first byte and preallocated
to its full size with ``ftruncate`` under a hidden temporary name, then
linked into place: a segment appears whole or not at all, so one of another
size is damage (or another geometry), never padded or cut to fit. Several
processes map the same files; a reader learns of a segment another process
created with :meth:`MappedFileQueue.refresh`.

A store into a mapped page whose block the file system cannot allocate kills
the process (SIGBUS), so every write through a mapping lands in blocks
reserved beforehand, in chunks ahead of the write position (see
:meth:`MappedFile.reserve`); the rest of a segment stays sparse.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import mmap
import os
import threading
from collections.abc import Iterator

from rocketspark.errors import (
    CorruptRecordError,
    DiskFullError,
    SegmentSizeError,
    StoreClosedError,
)

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
        "and retry",
        file=path,
        needed=needed,
    )


# Chunk sizes of the reservation ahead of the write position (MappedFile.reserve).
# A write through a mapping must never meet a block the file system cannot
# allocate (SIGBUS kills the process), yet a RocketMQ broker creates its
# segments sparse (setLength) and nobody expects a store to take its whole
# geometry up front: with conf/broker.conf's 1 GiB CommitLog segments, 6 MB
# ConsumeQueue files and 420 MB index files, reserving whole files would take
# ~1.4 GiB of disk at a store's first put. So every writer reserves blocks
# (posix_fallocate) ahead of where it writes, a chunk at a time: one int
# comparison per write, one fallocate per chunk (~16 MiB of appends). The mark
# of what is reserved lives in memory, per process: reserving a range twice is
# a cheap no-op, so processes need no coordination.
COMMIT_LOG_CHUNK = 16 << 20
CONSUME_QUEUE_CHUNK = 1 << 20  # 52,428 entries; 6 MB files reserved whole would cost 6 MB a queue
INDEX_CHUNK = 4 << 20  # of the index file's entry area (its slot table is reserved whole)


def reserve_blocks(fd: int, size: int, path: str, *, fresh: bool, start: int = 0) -> None:
    """Allocate every block of bytes [start, size) of ``fd``; DiskFullError when there is no room.

    ``fresh``: the range holds nothing yet, so where the file system has no
    ``fallocate`` zeros are written over all of it; otherwise only over its
    holes (found with SEEK_HOLE), which nobody may write meanwhile (callers
    hold the store's write lock, or its lock exclusively).
    Never changes a byte of data. The caller undoes a creation that fails.
    """
    if size <= start:
        return
    try:
        os.posix_fallocate(fd, start, size - start)
        return
    except OSError as exc:
        if exc.errno in _NO_SPACE:
            raise disk_full(path, size - start, exc) from None
        if exc.errno not in _NO_FALLOCATE:
            raise
    try:
        if fresh:
            _write_zeros(fd, start, size)
            return
        pos = start
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
            raise disk_full(path, size - start, exc) from None
        raise


def reserve_ahead(fd: int, path: str, mark: int, end: int, ahead: int) -> int:
    """Reserve bytes [mark, ahead) of ``fd``, or at least [mark, end); return the new mark.

    A full disk may still hold the blocks a write up to ``end`` needs (another
    process reserved them, and fallocate allocates all or fails): then only
    those are taken. DiskFullError when even they cannot be.
    """
    try:
        reserve_blocks(fd, ahead, path, fresh=False, start=mark)
        return ahead
    except DiskFullError:
        if ahead <= end:
            raise
    reserve_blocks(fd, end, path, fresh=False, start=mark)
    return end


def data_end(fd: int, size: int) -> int:
    """Return the end of the last range of ``fd`` holding data (0: all a hole).

    Found with SEEK_DATA / SEEK_HOLE, without reading; where the file system
    cannot tell, ``size``. Blocks reserved but never written may count as
    data or as a hole, depending on the file system.
    """
    pos = end = 0
    while pos < size:
        try:
            lo = os.lseek(fd, pos, os.SEEK_DATA)
            end = pos = min(os.lseek(fd, lo, os.SEEK_HOLE), size)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                return end
            return size
    return end


def _write_zeros(fd: int, start: int, end: int) -> None:
    zeros = _ZEROS
    pos = start
    while pos < end:
        pos += os.pwrite(fd, zeros[: min(len(zeros), end - pos)], pos)


def segment_name(start_offset: int) -> str:
    """Return the file name of the segment starting at ``start_offset``."""
    return f"{start_offset:0{FILE_NAME_DIGITS}d}"


def is_temporary_name(name: str) -> bool:
    """Is ``name`` a file being made (:func:`create_segment`, IndexFile.create)?"""
    return name.startswith(".") and name.endswith(".tmp")


def fsync_directory(directory: str) -> None:
    """Make a new name in ``directory`` survive a crash of the machine."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp: str, path: str) -> None:
    """Give the finished temporary file its real name; FileExistsError if taken."""
    try:
        os.link(tmp, path)  # atomic and exclusive
    except FileExistsError:
        raise
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
            raise
        # No hard links on this file system; writers are serialised by the store lock.
        if os.path.exists(path):
            raise FileExistsError(errno.EEXIST, "file exists", path) from e
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def create_segment(path: str, size: int, reserve: int = 0) -> None:
    """Make the file ``path`` of ``size`` bytes; it appears complete or not at all.

    Its first ``reserve`` bytes get their blocks before it appears
    (DiskFullError, and no file, when they cannot).

    It is sized under a hidden temporary name (``.NAME.PID.THREAD.tmp``, which
    no listing of segments matches) and published, so a process killed
    midway leaves no short segment. A file another process made at ``path``
    meanwhile is kept.
    """
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            os.ftruncate(fd, size)
            reserve_blocks(fd, min(reserve, size), path, fresh=True)
        finally:
            os.close(fd)
        try:
            publish(tmp, path)
        except FileExistsError:
            return
        fsync_directory(directory)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


class MappedFile:
    """One segment: a file of fixed size mapped into memory."""

    __slots__ = (
        "path",
        "start_offset",
        "size",
        "_fd",
        "mm",
        "writable",
        "reserved",
        "chunk",
        "_data",
    )

    def __init__(
        self,
        path: str,
        start_offset: int,
        size: int,
        *,
        create: bool,
        writable: bool,
        chunk: int = 0,
    ):
        self.path = path
        self.start_offset = start_offset
        self.size = size
        self.writable = writable
        # Bytes [0, reserved) have their blocks (known to this process); see reserve.
        self.reserved = 0
        self.chunk = min(chunk, size) if chunk > 0 else size
        self._data = (0, 0)  # a range [lo, hi) of file positions known to hold data
        if create and not os.path.exists(path):
            create_segment(path, size, self.chunk)
            self.reserved = self.chunk
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        try:
            # Nothing but an append changes a segment: one of another size is
            # reported, never grown or cut to fit.
            actual = os.fstat(fd).st_size
            if actual != size:
                raise SegmentSizeError(
                    f"segment {path} is {actual} bytes, expected {size} (the store's "
                    f"segment size): it is {'truncated' if actual < size else 'too long'}",
                    file=path,
                    expected=size,
                    actual=actual,
                )
            access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
            self.mm = mmap.mmap(fd, size, access=access)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    @property
    def end_offset(self) -> int:
        return self.start_offset + self.size

    def fileno(self) -> int:
        """The segment's open file descriptor (for SEEK_DATA / SEEK_HOLE scans)."""
        return self._fd

    def data_limit(self, pos: int, need: int = 1) -> int:
        """Return how far from file position ``pos`` the file holds data (``pos``: a hole).

        Readers read no further: a hole reads as zeros (nothing written), and
        reading one through a mapping allocates a page on tmpfs, which kills
        the process when it is full. A range already seen costs no syscall
        when it holds ``need`` bytes from ``pos``; otherwise the file is asked
        again, since writers reserve further blocks as they go (a range seen
        earlier may end inside the record or entry a reader wants next).
        """
        lo, hi = self._data
        if lo <= pos and pos + need <= hi:
            return hi
        try:
            lo = os.lseek(self._fd, pos, os.SEEK_DATA)
            if lo != pos:
                return pos
            hi = os.lseek(self._fd, pos, os.SEEK_HOLE)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # a hole up to the end
                return pos
            return self.size  # the file system cannot tell
        hi = min(hi, self.size)
        self._data = (lo, hi)
        return hi

    def reserve(self, end: int) -> None:
        """Make sure bytes up to ``end`` (file position) have their blocks; DiskFullError if not.

        Every write through the mapping calls this first (holding the store's
        write lock) unless ``end <= reserved``, the hot path's one comparison.
        Past the mark it reserves a chunk: up to ``max(end, mark) + chunk``,
        capped at the file's size, so a read at the write's end (the next
        record's header) never meets a hole either. The mark starts at 0 in a
        process that opened the file: its first reservation re-covers the
        written part, which costs the file system a walk of allocated blocks.
        """
        if end <= self.reserved:
            return
        self.reserved = reserve_ahead(
            self._fd,
            self.path,
            self.reserved,
            end,
            min(self.size, max(end, self.reserved) + self.chunk),
        )

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

    def release(self) -> None:
        """Close the file but leave the mapping to the last reference: a segment dropped
        while readers may use it (deleted by retention here or in another process).

        A reader that found this segment just before (a server's pull, an index
        lookup) may still take views of it, and views already taken (a reply being
        written from them) stay valid: the file is unlinked, never truncated, so
        its pages read as they were until the mapping goes, with the last
        reference to this object or to a view of it (closing it here would fail
        the reader that has not taken its view yet, "mmap closed or invalid").
        """
        if self._fd < 0:
            return
        os.close(self._fd)
        self._fd = -1

    def destroy(self) -> None:
        """Delete the segment's file (see :meth:`release` for its mapping)."""
        self.release()
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

    def __init__(self, directory: str, file_size: int, *, writable: bool = True, chunk: int = 0):
        self.directory = directory
        self.file_size = file_size
        self.writable = writable
        self.chunk = chunk  # of the reservation ahead of writes (MappedFile.reserve); 0: whole
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
                    file=os.path.join(self.directory, segment_name(start)),
                )
            f = known.pop(start, None)
            if f is None:
                f = MappedFile(
                    os.path.join(self.directory, segment_name(start)),
                    start,
                    self.file_size,
                    create=False,
                    writable=self.writable,
                    chunk=self.chunk,
                )
            files.append(f)
        for stale in known.values():
            stale.release()
        for a, b in itertools.pairwise(files):
            if b.start_offset != a.end_offset:
                raise CorruptRecordError(
                    f"segments are not contiguous: {segment_name(a.start_offset)} is followed "
                    f"by {segment_name(b.start_offset)}",
                    file=self.directory,
                )
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
                    f"offset {offset} lies before the first segment", file=self.directory
                )
            files = list(self.files)
            first_new = files[-1].end_offset if files else start
            for s in range(first_new, start + 1, self.file_size):
                path = os.path.join(self.directory, segment_name(s))
                files.append(
                    MappedFile(
                        path, s, self.file_size, create=True, writable=True, chunk=self.chunk
                    )
                )
            self.files = files
            return files[-1]

    def reserve(self, start: int, end: int) -> None:
        """Create the segments of queue offsets [start, end) and reserve their blocks.

        DiskFullError, before any byte is written, when the disk cannot hold them.
        """
        pos = start
        while pos < end:
            f = self.get_or_create(pos)
            stop = min(end, f.end_offset)
            if stop - f.start_offset > f.reserved:
                f.reserve(stop - f.start_offset)
            pos = stop

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
            f.flush(
                max(start, f.start_offset) - f.start_offset, min(end, f.end_offset) - f.start_offset
            )

    def close(self) -> None:
        with self._lock:
            for f in self.files:
                f.close()
            self.files = []
            self._closed = True

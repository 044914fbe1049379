"""Refuse writes before the store's disk fills up (RocketMQ's disk-usage guard).

A store writes its files through memory mappings; every write first makes
sure its blocks are reserved, a chunk ahead of the write position
(``MappedFile.reserve``, see ``mapped_file.COMMIT_LOG_CHUNK``), so no write
through a mapping meets a missing block and a reservation that fails refuses
the put before any byte of it is written. Puts are also refused, with
:class:`DiskFullError` and before any byte of them is written, when

* the file system holding the store is used past ``diskSpaceWarningLevelRatio``
  percent (RocketMQ's broker marks its store not writeable there and answers
  puts with SERVICE_NOT_AVAILABLE), or
* a put starts index files and the space left would not hold their first
  blocks (they are created after its CommitLog write).

Usage is what ``df`` shows as Use%: used / (used + available to unprivileged
users), so the blocks a file system keeps for root do not count as free.
The usage is read (``statvfs``, ~1 µs) at most every :data:`CHECK_INTERVAL`
seconds while writes are accepted, at every put while they are refused (so
writes resume as soon as space is freed), and always before files are created.
"""

from __future__ import annotations

import logging
import os
import time

from rocketspark.errors import DiskFullError
from rocketspark.store.mapped_file import data_end, reserve_blocks
from rocketspark.store.store_state import STATE_FILE

log = logging.getLogger(__name__)

CHECK_INTERVAL = 0.1  # seconds between statvfs calls while the disk has room


def disk_usage(path: str) -> tuple[float, int]:
    """Return (used fraction as df shows it, bytes free to unprivileged writers) of ``path``."""
    st = os.statvfs(path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    free = st.f_bavail * st.f_frsize
    total = used + free
    return (used / total if total > 0 else 1.0), free


class DiskGuard:
    """The disk-usage guard of one store directory (see the module docstring)."""

    def __init__(
        self, root: str, warning_level_ratio: int, clean_forcibly_ratio: int, max_used_ratio: int
    ):
        self.root = root
        self.refuse_above = warning_level_ratio / 100.0
        # The two clean thresholds only warn: an embedded store has no clean
        # service that would delete expired files by itself.
        self.warn_above = min(clean_forcibly_ratio, max_used_ratio) / 100.0
        self._next_check = 0.0  # monotonic time of the next statvfs; 0: at the next put
        self._warned = False

    def check(self) -> None:
        """Raise DiskFullError when the disk is used past diskSpaceWarningLevelRatio."""
        if time.monotonic() >= self._next_check:
            self._check_now()

    def _check_now(self) -> int:
        try:
            ratio, free = disk_usage(self.root)
        except OSError:  # not knowing is no reason to refuse; creating files still checks
            self._next_check = time.monotonic() + CHECK_INTERVAL
            return 1 << 62
        if ratio > self.refuse_above:
            self._next_check = 0.0
            raise DiskFullError(
                f"store {self.root}: its disk is {ratio:.1%} used, more than "
                f"diskSpaceWarningLevelRatio={self.refuse_above * 100:.0f}%; puts are "
                f"refused until space is freed ({free} bytes free)",
                file=self.root,
            )
        if ratio > self.warn_above and not self._warned:
            log.warning(
                "store %s: disk %.1f%% used; puts are refused above %.0f%% "
                "(diskSpaceWarningLevelRatio): free space or delete expired files "
                "(rocketspark store clean)",
                self.root,
                ratio * 100,
                self.refuse_above * 100,
            )
        self._warned = ratio > self.warn_above
        self._next_check = time.monotonic() + CHECK_INTERVAL
        return free

    def require(self, needed: int, what: str) -> None:
        """Raise DiskFullError unless ``needed`` bytes (new files: ``what``) fit now."""
        free = self._check_now()
        if free < needed:
            self._next_check = 0.0
            raise DiskFullError(
                f"store {self.root}: {what} need {needed} bytes but the disk has {free} "
                "bytes free; puts are refused until space is freed",
                file=self.root,
                needed=needed,
            )


def _mapped_files(root: str) -> list[str]:
    """The files of a store that are written through mappings."""
    paths = [os.path.join(root, name) for name in (STATE_FILE, "checkpoint")]
    for sub, depth in (("commitlog", 0), ("index", 0), ("consumequeue", 2)):
        dirs = [os.path.join(root, sub)]
        for _ in range(depth):
            dirs = [
                os.path.join(d, n) for d in dirs if os.path.isdir(d) for n in sorted(os.listdir(d))
            ]
        for d in dirs:
            if os.path.isdir(d):
                paths += [
                    os.path.join(d, n) for n in sorted(os.listdir(d)) if not n.startswith(".")
                ]
    return paths


def reserve_sparse_files(root: str, segments: list[str] | None = None) -> DiskFullError | None:
    """Reserve the holes inside the written data of every mapped file of the store at ``root``.

    Stores written by older rocketspark versions or by a RocketMQ broker may
    hold holes among their data (only pages never written, e.g. index slots),
    where a write through the mapping (recovery, the next put) would die of
    SIGBUS on a full disk. Holes past a file's last data are left alone: the
    store reads none of them (scans skip holes) and writers reserve blocks
    ahead of themselves. ``segments``: the CommitLog, ConsumeQueue and index
    files, when a listing of them is at hand. Call holding the store's lock
    exclusively (holes may be filled with zeros, see ``reserve_blocks``).
    Returns None when every file is reserved, else the DiskFullError that
    writes must be refused with (the store still serves reads). On tmpfs even
    reading a hole through a mapping allocates memory, so there it raises.
    """
    failed: list[DiskFullError] = []
    paths = (
        _mapped_files(root)
        if segments is None
        else [os.path.join(root, name) for name in (STATE_FILE, "checkpoint")] + segments
    )
    for path in paths:
        try:
            fd = os.open(path, os.O_RDWR)
        except (FileNotFoundError, IsADirectoryError):
            continue
        try:
            st = os.fstat(fd)
            end = data_end(fd, st.st_size)
            try:
                first_hole = os.lseek(fd, 0, os.SEEK_HOLE)
            except OSError:
                first_hole = 0  # the file system cannot tell: reserve
            if first_hole >= end:
                continue  # no hole among the data (the common case: nothing to do)
            reserve_blocks(fd, end, path, fresh=False)
            # Reserving blocks changes no byte, but ext4 stamps the file's mtime all the
            # same, and segments expire by mtime (fileReservedTime, `store clean`).
            if os.fstat(fd).st_mtime_ns != st.st_mtime_ns:
                os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
        except DiskFullError as exc:
            failed.append(exc)
        finally:
            os.close(fd)
    if not failed:
        return None
    needed = sum(e.needed or 0 for e in failed)
    where = f"{len(failed)} of its files are sparse (the first: {failed[0].file})"
    if _holes_take_memory(root):
        raise DiskFullError(
            f"store {root} cannot be opened while its tmpfs is full: {where}, and on tmpfs "
            f"even reading a hole takes memory; free up to {needed} bytes and retry",
            file=failed[0].file,
            needed=needed,
        )
    return DiskFullError(
        f"store {root} was opened while its disk was full and {where}: writes are "
        f"refused; free up to {needed} bytes and open the store again",
        file=failed[0].file,
        needed=needed,
    )


def _holes_take_memory(path: str) -> bool:
    """Is ``path`` on a memory file system, where a mapping's read of a hole allocates?"""
    path = os.path.realpath(path)
    best, fstype = "", ""
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mnt = fields[1].replace("\\040", " ")
                inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= len(best):
                    best, fstype = mnt, fields[2]
    except OSError:
        return False
    return fstype in ("tmpfs", "ramfs", "hugetlbfs")

"""What lets several processes open one store: the lock file and the shared state.

``<root>/lock`` is RocketMQ's lock file. A RocketMQ broker holds an exclusive
POSIX lock on its first byte while it runs; every rocketspark process holds a
*shared* lock there, so a broker and rocketspark never open a store at once,
while any number of rocketspark processes (a Spark driver and its workers) do.
The first process to open takes the lock exclusively, recovers the store, then
downgrades to shared; the last to close upgrades again and shuts down cleanly.

``<root>/rocketspark.state`` (4 KiB, ours, ignored by RocketMQ) is mapped by
every process and says where the CommitLog's committed data ends::

    state := MAGIC:8 "RSPKSTAT" FORMAT_VERSION:i32 RESERVED:i32
             COMMIT_POS:c64      end of committed records: the next write goes here
             PENDING_END:c64     end of the region a writer is filling (> COMMIT_POS while
                                 it writes)
             DISPATCHED_POS:c64  ConsumeQueues and index are built up to here
             FLUSHED_POS:c64     CommitLog, ConsumeQueues and index are on disk up to here
             WRITE_SEQ:i64       incremented by every commit (wakes long polls in other processes)
             SYNCED_POS:c64      the CommitLog alone is on disk up to here (SYNC_FLUSH group commit)
             INTENT:4 x i64      a schedule step about to deliver [FROM, TO) of a delay level,
                                 its put starting at COMMIT_BEFORE; zero when none is under way
             HOLDERS:c64         open instances that must close() for their exit to be clean
             DAMAGE_POS:c64      where damage followed by valid records begins (0: none)
             DAMAGE_RESUME:c64   the first valid record after it
             DAMAGE_FOLLOWING:c64  how many valid records follow it
    c64    := CHECK:16 VALUE:48  CHECK = low 16 bits of CRC-32 of the 6 VALUE bytes

Each checked field carries its own check, stored with its value in one
aligned 8-byte write: a writer killed at any instant leaves every field whole,
and concurrent writers of different fields (a flusher, an appender) never
race on a shared checksum. A field whose check fails (a flipped bit, a torn
page) makes the whole file untrusted: recovery then finds the end of the data
from the CommitLog alone (see ``recovery.Recovery.recover``). Positions are only
ever hints; the CommitLog is the truth.

Appends are serialised by ``flock`` on ``<root>/rocketspark.write.lock``. A
writer that dies holding it leaves PENDING_END > COMMIT_POS; the next writer
wipes that region before writing.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import struct
import threading
import time
import zlib

from rocketspark.errors import StoreLockedError
from rocketspark.store.mapped_file import reserve_blocks

STATE_FILE = "rocketspark.state"
WRITE_LOCK_FILE = "rocketspark.write.lock"
FLUSH_LOCK_FILE = "rocketspark.flush.lock"
LOCK_FILE = "lock"
ABORT_FILE = "abort"
STATE_MAGIC = b"RSPKSTAT"
STATE_FORMAT_VERSION = 2  # 2: checked positions (1 had plain i64 ones)
STATE_SIZE = 4096
STATE_HEADER = struct.Struct(">8sii")
_I64 = struct.Struct(">q")
COMMIT_POS_OFFSET = STATE_HEADER.size
PENDING_END_OFFSET = COMMIT_POS_OFFSET + 8
DISPATCHED_POS_OFFSET = PENDING_END_OFFSET + 8
FLUSHED_POS_OFFSET = DISPATCHED_POS_OFFSET + 8
WRITE_SEQ_OFFSET = FLUSHED_POS_OFFSET + 8
SYNCED_POS_OFFSET = WRITE_SEQ_OFFSET + 8
INTENT_OFFSET = SYNCED_POS_OFFSET + 8
INTENT = struct.Struct(">qqqq")  # kind/level, from, to, CommitLog position before the put
HOLDERS_OFFSET = INTENT_OFFSET + INTENT.size
DAMAGE_POS_OFFSET = HOLDERS_OFFSET + 8
DAMAGE_RESUME_OFFSET = DAMAGE_POS_OFFSET + 8
DAMAGE_FOLLOWING_OFFSET = DAMAGE_RESUME_OFFSET + 8
CHECKED_FIELDS = {
    "COMMIT_POS": COMMIT_POS_OFFSET,
    "PENDING_END": PENDING_END_OFFSET,
    "DISPATCHED_POS": DISPATCHED_POS_OFFSET,
    "FLUSHED_POS": FLUSHED_POS_OFFSET,
    "SYNCED_POS": SYNCED_POS_OFFSET,
    "HOLDERS": HOLDERS_OFFSET,
    "DAMAGE_POS": DAMAGE_POS_OFFSET,
    "DAMAGE_RESUME": DAMAGE_RESUME_OFFSET,
    "DAMAGE_FOLLOWING": DAMAGE_FOLLOWING_OFFSET,
}
VALUE_MASK = (1 << 48) - 1
_crc32 = zlib.crc32


def check_ok(word: bytes) -> bool:
    """Does the checked field ``word`` (8 bytes) carry the check of its value?"""
    return (zlib.crc32(word[2:8]) & 0xFFFF) == int.from_bytes(word[:2], "big")


OPEN_WAIT_SECONDS = 120.0


def _checked_field(off: int) -> property:
    """A position of the state file, stored with its check (see StoreState._set)."""
    return property(lambda s: s._get(off), lambda s, v: s._set(off, v))


def _plain_field(off: int) -> property:
    return property(lambda s: s._get_plain(off), lambda s, v: s._set_plain(off, v))


class StoreState:
    """The mapped state file shared by every process that has the store open."""

    def __init__(self, root: str):
        self.root = root
        self.path = os.path.join(root, STATE_FILE)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            self.existed = size >= STATE_SIZE
            if not self.existed:
                try:
                    os.ftruncate(fd, STATE_SIZE)
                    reserve_blocks(fd, STATE_SIZE, self.path, fresh=size == 0)
                except BaseException:
                    if size == 0:
                        os.unlink(self.path)
                    raise
            self._mm = mmap.mmap(fd, STATE_SIZE)
        finally:
            os.close(fd)
        magic, version, _ = STATE_HEADER.unpack_from(self._mm, 0)
        self.valid = magic == STATE_MAGIC
        self.format_version = version if self.valid else None

    def check_format(self, first: bool) -> None:
        """Refuse (StoreLockedError) a store open in a process of another state format
        (``first``: this process is the first opener), or written by a newer rocketspark."""
        version = self.format_version
        if not first and version not in (None, STATE_FORMAT_VERSION):
            raise StoreLockedError(
                f"store {self.root} is open in a process using state format "
                f"{version}; this rocketspark uses {STATE_FORMAT_VERSION}"
            )
        # a valid state file always has a version (None only when invalid)
        if first and self.valid and version > STATE_FORMAT_VERSION:  # type: ignore[operator]
            raise StoreLockedError(
                f"store {self.root} was written by a newer rocketspark (state format "
                f"{version} > {STATE_FORMAT_VERSION})"
            )

    def damaged_fields(self) -> list[str]:
        """Return the checked fields whose check fails (all of them for a format-1 file)."""
        if not self.valid or self.format_version != STATE_FORMAT_VERSION:
            return list(CHECKED_FIELDS)
        mm = self._mm
        return [name for name, off in CHECKED_FIELDS.items() if not check_ok(mm[off : off + 8])]

    def legacy_positions(self) -> tuple[int, int, int, int]:
        """COMMIT_POS, PENDING_END, DISPATCHED_POS, FLUSHED_POS of a format-1 file."""
        return tuple(
            _I64.unpack_from(self._mm, off)[0]
            for off in (
                COMMIT_POS_OFFSET,
                PENDING_END_OFFSET,
                DISPATCHED_POS_OFFSET,
                FLUSHED_POS_OFFSET,
            )
        )

    def initialise(self) -> None:
        """Stamp the header and zero every field, checks included (first opener only)."""
        self._mm[COMMIT_POS_OFFSET:STATE_SIZE] = bytes(STATE_SIZE - COMMIT_POS_OFFSET)
        for off in CHECKED_FIELDS.values():
            self._set(off, 0)
        STATE_HEADER.pack_into(self._mm, 0, STATE_MAGIC, STATE_FORMAT_VERSION, 0)
        self.valid = True
        self.format_version = STATE_FORMAT_VERSION

    def stamp(self) -> None:
        """Write the current header over an untrusted file whose fields were all rewritten."""
        STATE_HEADER.pack_into(self._mm, 0, STATE_MAGIC, STATE_FORMAT_VERSION, 0)
        self.valid = True
        self.format_version = STATE_FORMAT_VERSION

    def _get(self, off: int) -> int:
        return _I64.unpack_from(self._mm, off)[0] & VALUE_MASK

    def _set(self, off: int, value: int) -> None:
        # One 8-byte slice copy: an aligned store no kill can tear (pack_into writes
        # byte by byte), so a value and its check always land together.
        raw = value.to_bytes(6, "big")
        self._mm[off : off + 8] = (_crc32(raw) & 0xFFFF).to_bytes(2, "big") + raw

    def _get_plain(self, off: int) -> int:
        return _I64.unpack_from(self._mm, off)[0]

    def _set_plain(self, off: int, value: int) -> None:
        self._mm[off : off + 8] = _I64.pack(value)

    commit_pos = _checked_field(COMMIT_POS_OFFSET)
    pending_end = _checked_field(PENDING_END_OFFSET)
    dispatched_pos = _checked_field(DISPATCHED_POS_OFFSET)
    flushed_pos = _checked_field(FLUSHED_POS_OFFSET)
    write_seq = _plain_field(WRITE_SEQ_OFFSET)
    synced_pos = _checked_field(SYNCED_POS_OFFSET)
    holders = _checked_field(HOLDERS_OFFSET)
    damage_pos = _checked_field(DAMAGE_POS_OFFSET)
    damage_resume = _checked_field(DAMAGE_RESUME_OFFSET)
    damage_following = _checked_field(DAMAGE_FOLLOWING_OFFSET)

    def intent(self) -> tuple[int, int, int, int]:
        return INTENT.unpack_from(self._mm, INTENT_OFFSET)

    def set_intent(self, level: int, start: int, end: int, commit_before: int) -> None:
        INTENT.pack_into(self._mm, INTENT_OFFSET, level, start, end, commit_before)

    def clear_intent(self) -> None:
        INTENT.pack_into(self._mm, INTENT_OFFSET, 0, 0, 0, 0)

    def flush(self) -> None:
        self._mm.flush()

    def close(self) -> None:
        self._mm.close()


class _ProcessLock:
    """The POSIX lock on ``<root>/lock`` held once per process, shared by instances.

    POSIX locks belong to the process and vanish when *any* descriptor of the
    file is closed, so each process keeps exactly one descriptor per store.
    They are found by the lock file's identity (device, inode), not its path:
    a store deleted and created again at the same path is another store.
    """

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        st = os.fstat(self.fd)
        self.key = (st.st_dev, st.st_ino)
        self.refs = 0
        self.mode = 0


def _file_key(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


_NO_FILE = (-1, -1)  # no file has this key
_process_locks: dict[tuple[int, int], _ProcessLock] = {}
_process_locks_guard = threading.Lock()


def _lockf(fd: int, mode: int) -> bool:
    try:
        fcntl.lockf(fd, mode | fcntl.LOCK_NB, 1, 0)
        return True
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


class StoreLock:
    """This instance's hold on the store directory (see the module docstring)."""

    def __init__(self, root: str):
        self.root = root
        self._path = os.path.join(root, LOCK_FILE)
        self._key: tuple[int, int] = _NO_FILE  # the lock file's (device, inode) once held
        self._held = False
        self.first = False

    def acquire(self, timeout: float = OPEN_WAIT_SECONDS) -> bool:
        """Take the store; return True when this is the first opener (must recover).

        The first opener keeps the lock exclusive until :meth:`downgrade`.
        """
        with _process_locks_guard:
            known = _file_key(self._path)
            pl = None if known is None else _process_locks.get(known)
            if pl is None:
                pl = _ProcessLock(self._path)
                _process_locks[pl.key] = pl
            self._key = pl.key
            if pl.refs > 0:
                pl.refs += 1
                self._held = True
                self.first = False
                return False
            deadline = time.monotonic() + timeout
            while True:
                if _lockf(pl.fd, fcntl.LOCK_EX):
                    pl.refs, pl.mode = 1, fcntl.LOCK_EX
                    self._held = True
                    self.first = True
                    return True
                if _lockf(pl.fd, fcntl.LOCK_SH):
                    pl.refs, pl.mode = 1, fcntl.LOCK_SH
                    self._held = True
                    self.first = False
                    return False
                if time.monotonic() > deadline:
                    raise StoreLockedError(
                        f"store {self.root} is locked exclusively by another program "
                        f"(a RocketMQ broker, or a rocketspark process recovering it) "
                        f"for more than {timeout:.0f}s"
                    )
                time.sleep(0.01)

    def replaced(self) -> bool:
        """Is the store this instance holds gone from its path (deleted, or another there)?

        The held descriptor keeps the lock file's inode alive, so a new file at
        the path can never have its identity.
        """
        return self._held and _file_key(self._path) != self._key

    def downgrade(self) -> None:
        pl = _process_locks[self._key]
        if pl.mode == fcntl.LOCK_EX:
            fcntl.lockf(pl.fd, fcntl.LOCK_SH, 1, 0)
            pl.mode = fcntl.LOCK_SH

    def release(self) -> bool:
        """Let go; return True when this was the last holder anywhere (shut down cleanly).

        When True, the lock is held exclusively until :meth:`release_final`.
        """
        if not self._held:
            return False
        self._held = False
        with _process_locks_guard:
            pl = _process_locks[self._key]
            pl.refs -= 1
            if pl.refs > 0:
                return False
            if _lockf(pl.fd, fcntl.LOCK_EX):
                pl.mode = fcntl.LOCK_EX
                return True
            self._drop(pl)
            return False

    def release_final(self) -> None:
        with _process_locks_guard:
            pl = _process_locks.get(self._key)
            if pl is not None and pl.refs == 0:
                self._drop(pl)

    def _drop(self, pl: _ProcessLock) -> None:
        try:
            fcntl.lockf(pl.fd, fcntl.LOCK_UN, 1, 0)
        finally:
            os.close(pl.fd)
            del _process_locks[self._key]


class WriteLock:
    """An inter-process lock (flock on a file of its own) plus a thread lock.

    ``<root>/rocketspark.write.lock`` serialises appends; ``<root>/rocketspark.flush.lock``
    serialises the periodic flush of CommitLog, ConsumeQueues, index and checkpoint.
    """

    def __init__(self, root: str, name: str = WRITE_LOCK_FILE):
        self.path = os.path.join(root, name)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self._thread_lock = threading.Lock()

    def __enter__(self) -> WriteLock:
        self.acquire()
        return self

    def acquire(self, timeout: float | None = None) -> bool:
        """Take the lock; with ``timeout`` (seconds) give up and return False after it."""
        if not self._thread_lock.acquire(timeout=-1 if timeout is None else timeout):
            return False
        try:
            if timeout is None:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
                return True
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return True
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        self._thread_lock.release()
                        return False
                    time.sleep(0.0002)
        except BaseException:
            self._thread_lock.release()
            raise

    def release(self) -> None:
        self.__exit__()

    def __exit__(self, *exc: object) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

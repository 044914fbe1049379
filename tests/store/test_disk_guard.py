"""A full disk: refused puts (DiskFullError), never SIGBUS, nothing acknowledged lost.

The end-to-end tests mount a 12 MiB tmpfs (root only; skipped otherwise) and
fill it with a filler file; writers and readers run in child processes so
that a SIGBUS shows as their exit status.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from collections import Counter

import pytest

import rocketspark.store.commit_log as commit_log
import rocketspark.store.disk_guard as disk_guard
from rocketspark.errors import DiskFullError
from rocketspark.store import Message, MessageStore
from rocketspark.store.checkpoint import StoreCheckpoint
from rocketspark.store.index_file import IndexFile
from rocketspark.store.mapped_file import (
    MappedFileQueue,
    data_end,
    reserve_blocks,
)
from rocketspark.store.metadata import write_json
from rocketspark.store.store_check import check_store
from tests.store.helpers.full_disk import TOPIC, bodies_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DISK_SIZE = 12 << 20
SIZES = dict(
    mappedFileSizeCommitLog=256 * 1024,
    mappedFileSizeConsumeQueue=20 * 512,
    maxHashSlotNum=64,
    maxIndexNum=512,
)


@pytest.fixture(params=["tmpfs"])
def small_disk(request, tmp_path):
    """A small file system (tmpfs, or ext4 on a loop device) under tmp_path, unmounted after."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system (a disk to fill) needs root")
    if request.param == "tmpfs":
        cmd = ["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE}", "tmpfs", str(mnt)]
    else:
        image = tmp_path / "ext4.img"
        with open(image, "wb") as f:
            f.truncate(DISK_SIZE + (4 << 20))  # + the journal and metadata
        made = subprocess.run(
            ["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], capture_output=True, text=True
        )
        if made.returncode:
            pytest.skip(f"cannot make an ext4 file system: {made.stderr.strip()}")
        cmd = ["mount", "-o", "loop", str(image), str(mnt)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a {request.param} to fill: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], check=False).returncode:
            subprocess.run(["umount", "-l", str(mnt)], check=False)


def free_bytes(path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(mnt, leave: int) -> str:
    """Write a filler file leaving about ``leave`` bytes free; return its path."""
    path = os.path.join(mnt, "filler")
    want = free_bytes(mnt) - leave
    chunk = b"\xa5" * (64 * 1024)
    with open(path, "ab", buffering=0) as f:  # unbuffered: no ENOSPC left for close()
        try:
            while want > 0:
                want -= f.write(chunk[:want])
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return path


def child(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-X", "faulthandler", "-m", "tests.store.helpers.full_disk", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def lines(path) -> list[str]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.strip() for line in f if line.strip()]


def mapped_files(store_dir) -> list[str]:
    out = [os.path.join(store_dir, n) for n in ("checkpoint", "rocketspark.state")]
    for sub in ("commitlog", "index", "consumequeue"):
        for dirpath, _, names in os.walk(os.path.join(store_dir, sub)):
            out += [os.path.join(dirpath, n) for n in names]
    return out


def assert_nothing_sparse_or_empty(store_dir) -> None:
    """No mapped file is empty or has a hole among its data (only past its last data)."""
    for path in mapped_files(store_dir):
        st = os.stat(path)
        assert st.st_size > 0, f"{path} is empty"
        fd = os.open(path, os.O_RDWR)
        try:
            # A block missing among the data: fallocate would allocate it.
            end = data_end(fd, st.st_size)
            os.posix_fallocate(fd, 0, max(end, 1))
            after = os.fstat(fd).st_blocks
        finally:
            os.close(fd)
        assert after == st.st_blocks, f"{path} has holes among its data (which ends at {end})"


# --- end to end: writers fill the disk, a reader reopens it, space is freed --------------


@pytest.mark.parametrize(
    "small_disk,flush,ratio,mode",
    [
        ("tmpfs", "SYNC", 90, "close"),
        ("tmpfs", "ASYNC", 90, "kill"),
        ("tmpfs", "ASYNC", 100, "close"),
        ("tmpfs", "SYNC", 100, "kill"),
        ("ext4", "ASYNC", 100, "kill"),
        ("ext4", "SYNC", 90, "close"),
    ],
    indirect=["small_disk"],
)
def test_writer_meets_a_full_disk_with_disk_full_error_and_loses_nothing(
    small_disk, tmp_path, flush, ratio, mode
):
    store_dir = str(small_disk / "store")
    acks, seen = str(tmp_path / "acks"), str(tmp_path / "seen")
    config = dict(SIZES, flushDiskType=f"{flush}_FLUSH", diskSpaceWarningLevelRatio=ratio)
    # With the 90% guard the disk stops taking puts while 1.2 MiB are still free;
    # at 100 only when the next segment does not fit.
    filler = fill(small_disk, (3 << 20) if ratio == 90 else (3 << 19))

    w = child("write", store_dir, acks, json.dumps(config), mode)
    expected_rc = -signal.SIGKILL if mode == "kill" else 0
    assert w.returncode == expected_rc, (w.returncode, w.stdout, w.stderr)
    assert w.stdout.startswith("failed: DiskFullError"), w.stdout + w.stderr
    acked = lines(acks)
    assert len(acked) > 100

    # Reopened while the disk is still full (recovery too, after the kill): reads work.
    r = child("read", store_dir, seen, json.dumps(config))
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    read_back = Counter(lines(seen))
    assert not [b for b, c in read_back.items() if c > 1]
    assert not [a for a in acked if a not in read_back]
    if ratio == 90:
        assert r.stdout.startswith("put: DiskFullError"), r.stdout
    else:  # a small put may still fit in the current segment
        assert r.stdout.startswith(("put: DiskFullError", "put: ok")), r.stdout

    # Space freed: writes resume, in the same queues, after what was acknowledged.
    os.unlink(filler)
    with MessageStore.open(store_dir, **config) as store:
        store.put_batch([Message(TOPIC, f"later{i}".encode(), tags="t") for i in range(40)])
        for i in range(10):
            store.put(Message(TOPIC, f"single{i}".encode(), tags="t"))
        after = Counter(bodies_of(store))
    assert not [b for b, c in after.items() if c > 1]
    assert not [a for a in acked if a not in after]
    assert sum(1 for b in after if b.startswith(("later", "single"))) == 50
    report = check_store(store_dir)
    assert report.ok, report.render()
    assert_nothing_sparse_or_empty(store_dir)


def _make_sparse(path: str) -> None:
    """Rewrite ``path`` with its all-zero pages left as holes (an older store's file)."""
    with open(path, "rb") as f:
        data = f.read()
    os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        page = 4096
        for at in range(0, len(data), page):
            chunk = data[at : at + page]
            if chunk.count(0) != len(chunk):
                os.pwrite(fd, chunk, at)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    "small_disk,ratio,hole_in_data",
    [
        ("ext4", 90, True),
        ("ext4", 100, False),
        ("tmpfs", 100, True),
        ("tmpfs", 100, False),
    ],
    indirect=["small_disk"],
)
def test_sparse_store_opens_on_a_full_disk_and_serves_reads(
    small_disk, tmp_path, ratio, hole_in_data
):
    """A store left sparse (an older version's, a broker's): reads work, writes are refused,
    no SIGBUS, and once space is freed writes resume.

    Holes past the written data are never read. A hole among the data (a page
    of zeros inside a record): on tmpfs a mapping's read of it allocates
    memory, so there opening is refused until space is freed.
    """
    store_dir = str(small_disk / "store")
    config = dict(SIZES, flushDiskType="SYNC_FLUSH", diskSpaceWarningLevelRatio=ratio)
    with MessageStore.open(store_dir, **config) as store:
        store.create_topic(TOPIC, queues=2)
        store.create_topic("other", queues=1)
        for i in range(30):
            store.put(Message(TOPIC, f"old{i}".encode(), keys=[f"k{i}"], tags="t"))
            if hole_in_data and i == 10:
                store.put(Message("other", bytes(3 * 4096)))
    for path in mapped_files(store_dir):
        _make_sparse(path)
    filler = fill(small_disk, 0)

    seen = str(tmp_path / "seen")
    r = child("read", store_dir, seen, json.dumps(config))
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    if hole_in_data and not (tmp_path / "ext4.img").exists():  # tmpfs
        assert r.stdout.startswith("open: DiskFullError"), r.stdout
    else:
        assert sorted(lines(seen)) == sorted(f"old{i}" for i in range(30))
        # Refused, unless the put fits in blocks the file already has (no holes among
        # the data, the disk guard off): writing there needs no space.
        assert r.stdout.startswith("put: DiskFullError") or (
            not hole_in_data and ratio == 100 and r.stdout.startswith("put: ok")
        ), r.stdout
    after = ["after"] if r.stdout.startswith("put: ok") else []
    if not hole_in_data:  # the check reads no hole either (a child: SIGBUS shows)
        checked = subprocess.run(
            [
                sys.executable,
                "-X",
                "faulthandler",
                "-c",
                "import sys; from rocketspark.store.store_check import "
                "check_store; r = check_store(sys.argv[1]); print(r.render()); "
                "sys.exit(0 if r.ok else 1)",
                store_dir,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert checked.returncode == 0, (checked.returncode, checked.stdout, checked.stderr)

    os.unlink(filler)
    with MessageStore.open(store_dir, **config) as store:  # reserves the holes now
        store.put(Message(TOPIC, b"new", tags="t"))
        assert sorted(bodies_of(store)) == sorted([f"old{i}" for i in range(30)] + ["new"] + after)
    assert_nothing_sparse_or_empty(store_dir)
    report = check_store(store_dir)
    assert report.ok, report.render()


# --- creating files on a full disk --------------------------------------------------------


def test_creating_mapped_files_on_a_full_disk_leaves_nothing(small_disk):
    fill(small_disk, 64 * 1024)
    segs = small_disk / "segs"
    q = MappedFileQueue(str(segs), 1 << 20)
    with pytest.raises(DiskFullError) as err:
        q.get_or_create(0)
    assert err.value.file == str(segs / f"{0:020d}") and err.value.needed == 1 << 20
    assert err.value.retriable and err.value.errno == errno.ENOSPC
    assert os.listdir(segs) == []
    assert q.files == []

    index = small_disk / "index"
    index.mkdir()
    with pytest.raises(DiskFullError, match="20240101000000000"):
        IndexFile.create(str(index / "20240101000000000"), hash_slot_num=50_000, index_num=50_000)
    assert os.listdir(index) == []

    fill(small_disk, 0)
    with pytest.raises(DiskFullError, match="checkpoint"):
        StoreCheckpoint(str(small_disk / "checkpoint"))
    assert not os.path.exists(small_disk / "checkpoint")


def test_metadata_write_on_a_full_disk_keeps_the_old_file(small_disk):
    path = str(small_disk / "config" / "topics.json")
    write_json(path, {"a": 1})
    fill(small_disk, 0)
    with pytest.raises(DiskFullError, match="topics.json"):
        write_json(path, {"a": 2, "pad": "x" * 100_000})
    with open(path) as f:
        assert json.load(f) == {"a": 1}
    assert sorted(os.listdir(small_disk / "config")) == ["topics.json"]


# --- without a small disk ---------------------------------------------------------------


def test_store_files_have_no_hole_among_their_data(tmp_path):
    with MessageStore.open(tmp_path / "s", **SIZES) as store:
        store.create_topic(TOPIC, queues=4)
        store.put_batch([Message(TOPIC, b"x" * 500, keys=[f"k{i}"]) for i in range(2000)])
        store.put(Message(TOPIC, b"y"))
    assert_nothing_sparse_or_empty(tmp_path / "s")


def test_reserving_without_fallocate_writes_zeros_into_holes_only(tmp_path, monkeypatch):
    def no_fallocate(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(os, "posix_fallocate", no_fallocate)
    path = str(tmp_path / "f")
    q = MappedFileQueue(str(tmp_path / "segs"), 1 << 20)
    seg = q.get_or_create(0)
    st = os.stat(seg.path)
    assert st.st_size == 1 << 20 and st.st_blocks * 512 >= st.st_size
    q.close()
    # An existing sparse file with data: the holes are filled, the data kept.
    with open(path, "wb") as f:
        f.seek(300_000)
        f.write(b"data")
        f.truncate(1 << 20)
    fd = os.open(path, os.O_RDWR)
    try:
        reserve_blocks(fd, 1 << 20, path, fresh=False)
    finally:
        os.close(fd)
    st = os.stat(path)
    assert st.st_blocks * 512 >= st.st_size
    with open(path, "rb") as f:
        data = f.read()
    assert data[300_000:300_004] == b"data" and data.count(0) == len(data) - 4


def test_disk_guard_refuses_past_the_ratio_and_resumes(tmp_path, monkeypatch):
    usage = [0.5]
    monkeypatch.setattr(disk_guard, "disk_usage", lambda path: (usage[0], 1 << 40))
    with MessageStore.open(tmp_path / "s", **SIZES) as store:
        store.create_topic(TOPIC, queues=1)
        first = store.put(Message(TOPIC, b"a"))
        end = store.state.commit_pos
        usage[0] = 0.91
        store._guard._next_check = 0.0  # as if CHECK_INTERVAL had passed
        for put in (
            lambda: store.put(Message(TOPIC, b"b")),
            lambda: store.put_batch([Message(TOPIC, b"c")] * 20),
            lambda: store.put_batch([Message(TOPIC, b"d", delay_level=1)]),
        ):
            with pytest.raises(DiskFullError, match="diskSpaceWarningLevelRatio=90%"):
                put()
        assert store.state.commit_pos == store.state.pending_end == end
        usage[0] = 0.89  # space freed: the very next put goes through
        second = store.put(Message(TOPIC, b"e"))
        assert second.queue_offset == first.queue_offset + 1  # no offset was lost
        assert [m.body for m in store.pull(TOPIC, 0, 0).messages] == [b"a", b"e"]


# --- blocks reserved a chunk ahead of the writes -------------------------------------------


def real_bytes(root) -> int:
    """Blocks in use under ``root`` (du, not the apparent size)."""
    total = 0
    for dirpath, _, names in os.walk(root):
        for n in names:
            total += os.lstat(os.path.join(dirpath, n)).st_blocks * 512
    return total


def test_new_default_geometry_store_takes_little_disk(tmp_path):
    """1 GiB segments, 6 MB queues, 420 MB index files: a few chunks in use, not ~1.4 GiB."""
    with MessageStore.open(tmp_path / "s") as store:
        store.create_topic(TOPIC, queues=4)
        for i in range(1000):
            store.put(Message(TOPIC, f"m{i}".encode(), keys=[f"k{i}"], tags="t"))
        assert len(bodies_of(store)) == 1000
    used = real_bytes(tmp_path / "s")
    assert used < 64 << 20, used  # CommitLog chunk 16 MiB + slot table 20 MB + small ones


def test_write_crossing_a_chunk_on_a_full_disk_is_refused_whole(small_disk, monkeypatch):
    """The reservation past a chunk fails: DiskFullError, nothing written, offsets kept."""
    monkeypatch.setattr(commit_log, "COMMIT_LOG_CHUNK", 1 << 20)  # the disk is 12 MiB
    store_dir = str(small_disk / "store")
    config = dict(
        SIZES,
        mappedFileSizeCommitLog=4 << 20,
        flushDiskType="ASYNC_FLUSH",
        diskSpaceWarningLevelRatio=100,
    )
    with MessageStore.open(store_dir, **config) as store:
        store.create_topic(TOPIC, queues=1)
        first = store.put(Message(TOPIC, b"a", keys=["ka"]))
        seg = store.commit_log.files.files[0]
        assert seg.reserved < seg.size  # sparse past the first chunk
        commit = store.state.commit_pos
        fill(small_disk, 0)
        big = b"x" * (256 * 1024)
        with pytest.raises(DiskFullError):
            # the records pass the reserved chunk (2 MiB free at most after the filler)
            store.put_batch([Message(TOPIC, big) for _ in range(seg.reserved // len(big) + 1)])
        assert store.state.commit_pos == store.state.pending_end == commit
        with pytest.raises(DiskFullError):
            store.put_columns([big] * (seg.reserved // len(big) + 1), topic=TOPIC)
        assert store.state.commit_pos == commit
        assert len(store.commit_log.files.files) == 1
        # Within the reserved chunk, puts still go through; the offsets were given back.
        second = store.put(Message(TOPIC, b"b"))
        assert second.queue_offset == first.queue_offset + 1
        assert [m.body for m in store.pull(TOPIC, 0, 0).messages] == [b"a", b"b"]
    # A new process knows nothing reserved: it takes the blocks the last one reserved.
    with MessageStore.open(store_dir, **config) as store:
        store.put(Message(TOPIC, b"c", keys=["kc"]))
        assert [m.body for m in store.pull(TOPIC, 0, 0).messages] == [b"a", b"b", b"c"]
    report = check_store(store_dir)
    assert report.ok, report.render()


# --- the guard on its own ------------------------------------------------------------------


def test_the_guard_refuses_past_the_warning_ratio_and_rechecks_at_every_refused_put(
    tmp_path, monkeypatch
):
    usage = [(0.5, 1 << 30)]
    calls = []

    def fake(path):
        calls.append(path)
        return usage[0]

    monkeypatch.setattr(disk_guard, "disk_usage", fake)
    guard = disk_guard.DiskGuard(str(tmp_path), 90, 95, 95)
    guard.check()
    guard.check()  # within CHECK_INTERVAL: no second statvfs
    assert calls == [str(tmp_path)]
    usage[0] = (0.95, 1 << 20)
    with pytest.raises(DiskFullError, match="diskSpaceWarningLevelRatio=90%") as info:
        guard.require(1, "a new segment")  # require always asks the disk
    assert len(calls) == 2
    assert info.value.file == str(tmp_path)
    with pytest.raises(DiskFullError):
        guard.check()  # refused: asks again at once
    usage[0] = (0.5, 1 << 30)
    guard.check()


def test_the_guard_refuses_new_files_the_free_space_cannot_hold(tmp_path, monkeypatch):
    monkeypatch.setattr(disk_guard, "disk_usage", lambda path: (0.2, 4096))
    guard = disk_guard.DiskGuard(str(tmp_path), 90, 85, 75)
    guard.require(4096, "index files")
    with pytest.raises(DiskFullError, match="index files need 8192 bytes") as info:
        guard.require(8192, "index files")
    assert info.value.needed == 8192 and info.value.retriable


def test_disk_usage_is_a_fraction_and_free_bytes(tmp_path):
    ratio, free = disk_guard.disk_usage(str(tmp_path))
    assert 0.0 <= ratio <= 1.0 and free >= 0


def test_reserve_sparse_files_fills_holes_among_the_data_only(tmp_path):
    root = tmp_path / "s"
    (root / "commitlog").mkdir(parents=True)
    seg = root / "commitlog" / f"{0:020d}"
    with open(seg, "wb") as f:
        f.seek(600_000)
        f.write(b"data")
        f.truncate(1 << 20)
    assert disk_guard.reserve_sparse_files(str(root)) is None
    with open(seg, "rb") as f:
        data = f.read()
    assert len(data) == 1 << 20 and data[600_000:600_004] == b"data"
    assert data.count(0) == len(data) - 4
    fd = os.open(seg, os.O_RDONLY)
    try:
        end = data_end(fd, 1 << 20)
        assert os.lseek(fd, 0, os.SEEK_HOLE) >= end  # no hole left among the data
    finally:
        os.close(fd)

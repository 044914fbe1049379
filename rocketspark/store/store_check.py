"""A read-only check of a store directory (``rocketspark store check``).

Walks every CommitLog record (magic, sizes, PHYSICALOFFSET, body CRC), and
past bad bytes on to the next record that verifies: damage followed by valid
records is reported with how many follow (the store then opens read-only),
bad bytes with nothing valid after them as a torn tail (opening discards it).
Then every ConsumeQueue entry (does it point at a record of its own topic,
queue and offset, with the same size and tags code? is there a hole, an empty
entry before written ones?), and the checks of ``rocketspark.state``, as the
next open will find them. Nothing is locked or written,
so it can run beside writers, and on a directory a RocketMQ broker wrote.
Segment sizes are the store's geometry (``layout``): recorded, else read off
the files themselves; a file of another size is a problem.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rocketspark.errors import CorruptRecordError, RocketSparkError
from rocketspark.message.java_hash import tags_code
from rocketspark.message.model import SCHEDULE_TOPIC, transaction_type
from rocketspark.message.record import RECORD_INVALID, check_record
from rocketspark.store import layout
from rocketspark.store.commit_log_scan import find_valid_record, scan_files
from rocketspark.store.consume_queue import CQ_ENTRY_DTYPE, CQ_STORE_UNIT_SIZE
from rocketspark.store.mapped_file import FILE_NAME_DIGITS, MappedFileQueue, data_end
from rocketspark.store.store_state import (
    CHECKED_FIELDS,
    COMMIT_POS_OFFSET,
    PENDING_END_OFFSET,
    STATE_FILE,
    STATE_FORMAT_VERSION,
    STATE_HEADER,
    STATE_MAGIC,
    STATE_SIZE,
    VALUE_MASK,
    check_ok,
)

MAX_LISTED = 20


@dataclass
class CheckReport:
    """What ``check_store`` found."""

    path: str
    segments: int = 0
    records: int = 0
    bytes_used: int = 0
    queues: int = 0
    queue_entries: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, text: str) -> None:
        if len(self.problems) < MAX_LISTED:
            self.problems.append(text)
        elif len(self.problems) == MAX_LISTED:
            self.problems.append("... more problems not listed")

    def render(self) -> str:
        lines = [
            f"store {self.path}",
            f"  CommitLog: {self.segments} segment(s), {self.records} record(s), "
            f"{self.bytes_used} bytes",
            f"  ConsumeQueues: {self.queues} queue(s), {self.queue_entries} entr(y/ies)",
        ]
        lines += [f"  note: {n}" for n in self.notes]
        if self.ok:
            lines.append("OK: every record and ConsumeQueue entry checks out")
        else:
            lines.append(f"PROBLEMS ({len(self.problems)}):")
            lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


def _has_segments(directory: str) -> bool:
    try:
        return any(len(n) == FILE_NAME_DIGITS and n.isdigit() for n in os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return False


def check_store(
    path: str, *, progress: Callable[[int, str, str], Any] | None = None
) -> CheckReport:
    """Verify the store at ``path`` without changing it.

    A directory that is not a store, and files that are not the size of the
    store's geometry (recorded, or read off its files), are problems.
    ``progress(total, what, unit)`` makes a bar (``update(done)``, ``close()``) for
    each of the two scans: the CommitLog in bytes, then the ConsumeQueue entries
    (the total is the CommitLog's record count, an estimate).
    """
    report = CheckReport(os.path.abspath(path))
    root = report.path
    try:
        kind = layout.directory_kind(root)
    except RocketSparkError as exc:
        report.problem(str(exc))
        return report
    if kind == "foreign":
        report.problem(layout.describe_foreign(root))
        return report
    if kind != "store":
        report.problem(
            f"{root} is not a store: it is "
            f"{'an empty directory' if kind == 'empty' else 'not there'}"
        )
        return report
    try:
        geometry = layout.read_geometry(root, for_check=True)
    except RocketSparkError as exc:
        report.problem(f"the store's geometry cannot be read: {exc}")
        return report
    if geometry.sources["max_index_num"].startswith(layout.UNKNOWN_INDEX):
        report.notes.append(
            "index files checked only for having one size: their "
            f"maxHashSlotNum/maxIndexNum are {geometry.sources['max_index_num']}"
        )
    wrong = layout.wrong_size_files(root, geometry)
    for err in wrong:
        report.problem(str(err))
    bad_dirs = {os.path.dirname(err.file or "") for err in wrong}
    cl_dir = os.path.join(path, "commitlog")
    if os.path.abspath(cl_dir) in bad_dirs:
        report.notes.append(
            "CommitLog and ConsumeQueues not scanned: a CommitLog segment has the wrong size"
        )
        return report
    seg_size = geometry.values["mapped_file_size_commit_log"]
    cq_size = geometry.values["mapped_file_size_consume_queue"]
    # (topic, queue) -> highest queue offset + 1 of dispatchable records
    expected: dict[tuple[str, int], int] = defaultdict(int)
    if not _has_segments(cl_dir):
        report.notes.append("no CommitLog segments")
        commit_end = 0
        files = None
    else:
        try:
            files = MappedFileQueue(cl_dir, seg_size, writable=False)
        except CorruptRecordError as exc:
            report.problem(str(exc))
            return report
        report.segments = len(files.files)
        last = files.files[-1]  # where its data ends: the bar's total, without reading
        total = last.start_offset + data_end(last.fileno(), last.size) - files.min_offset
        bar = progress(total, "CommitLog", "B") if progress else None
        commit_end = _scan_commit_log(
            files, seg_size, report, expected, bar, _unfinished_append(path, files)
        )
        if bar is not None:
            bar.close()
        report.bytes_used = commit_end - files.min_offset
    _check_state(path, commit_end, report)
    bar = progress(report.records, "ConsumeQueues", "entries") if progress else None
    try:
        _check_queues(path, files, commit_end, report, expected, cq_size, bad_dirs, bar)
    finally:
        if bar is not None:
            bar.update(report.queue_entries)
            bar.close()
        if files is not None:
            files.close()
    return report


def _unfinished_append(path: str, files: MappedFileQueue) -> tuple[int, int] | None:
    """[COMMIT_POS, PENDING_END) of a trusted state when a writer died inside that append
    and nothing verifies past it: the next open discards the region whatever it holds."""
    try:
        with open(os.path.join(path, STATE_FILE), "rb") as fh:
            raw = fh.read(STATE_SIZE)
    except FileNotFoundError:
        return None
    if (
        len(raw) < STATE_SIZE
        or STATE_HEADER.unpack_from(raw, 0)[:2] != (STATE_MAGIC, STATE_FORMAT_VERSION)
        or not all(check_ok(raw[off : off + 8]) for off in CHECKED_FIELDS.values())
    ):
        return None
    commit, pending = (
        int.from_bytes(raw[off : off + 8], "big") & VALUE_MASK
        for off in (COMMIT_POS_OFFSET, PENDING_END_OFFSET)
    )
    if commit >= pending or find_valid_record(files, pending) is not None:
        return None
    return commit, pending


def _scan_commit_log(
    files: MappedFileQueue,
    seg_size: int,
    report: CheckReport,
    expected: dict[tuple[str, int], int],
    bar: Any,
    unfinished: tuple[int, int] | None = None,
) -> int:
    """Verify every record (up to an ``unfinished`` append); return the end of the last
    valid one."""
    pos = files.min_offset
    end = pos
    damages: list[tuple[int, str, int, int]] = []  # (offset, reason, records before, resume)
    while True:
        stop = pos
        reason = ""
        for at, check in scan_files(files, pos):
            if unfinished is not None and at >= unfinished[0]:
                stop = at
                break
            if check.size <= 0:
                stop = at
                reason = check.reason if check.size == RECORD_INVALID else "zero bytes"
                break
            report.records += 1
            if transaction_type(check.sys_flag) in (0, 0x8):
                key = (check.topic, check.queue_id)
                expected[key] = max(expected[key], check.queue_offset + 1)
            end = stop = at + check.size
            if bar is not None and report.records % 1024 == 0:
                bar.update(end - files.min_offset)
        if unfinished is not None and stop >= unfinished[0]:
            report.problem(
                f"unfinished append at CommitLog [{unfinished[0]}, {unfinished[1]}): a "
                "writer died inside it, before it was acknowledged (opening the store "
                "discards it)"
            )
            break
        resume = find_valid_record(files, stop)
        if resume is None:
            if reason != "zero bytes":
                f = files.find(stop, refresh=False)
                report.problem(
                    f"torn tail at CommitLog offset {stop} (file "
                    f"{os.path.basename(f.path) if f else '?'}): {reason}; no valid record "
                    "follows (opening the store discards it)"
                )
            break
        damages.append((stop, reason, report.records, resume))
        pos = resume
    for offset, reason, before, resume in damages:
        f = files.find(offset, refresh=False)
        report.problem(
            f"CommitLog damaged at offset {offset} (file "
            f"{os.path.basename(f.path) if f else '?'}): {reason}; "
            f"{report.records - before} valid record(s) follow from offset {resume} (the "
            "store opens read-only until `rocketspark store recover --truncate-at "
            f"{offset}` discards them, or the bytes are restored)"
        )
    if bar is not None:
        bar.update(end - files.min_offset)
    return end


def _check_state(path: str, commit_end: int, report: CheckReport) -> None:
    """Report ``rocketspark.state`` fields whose checks fail, as the next open will."""
    try:
        with open(os.path.join(path, STATE_FILE), "rb") as fh:
            raw = fh.read(STATE_SIZE)
    except FileNotFoundError:
        return
    if len(raw) < STATE_SIZE:
        report.problem(
            f"{STATE_FILE} is {len(raw)} bytes, expected {STATE_SIZE} (the next "
            "open rebuilds it from the CommitLog)"
        )
        return
    magic, version, _ = STATE_HEADER.unpack_from(raw, 0)
    if magic != STATE_MAGIC:
        report.problem(
            f"{STATE_FILE} has no valid header (the next open rebuilds it from the CommitLog)"
        )
        return
    if version != STATE_FORMAT_VERSION:
        report.notes.append(
            f"{STATE_FILE} has format {version}; the next open verifies the "
            f"CommitLog and rewrites it in format {STATE_FORMAT_VERSION}"
        )
        return
    bad = [name for name, off in CHECKED_FIELDS.items() if not check_ok(raw[off : off + 8])]
    if bad:
        report.problem(
            f"{STATE_FILE}: {', '.join(bad)} "
            f"{'fails its check' if len(bad) == 1 else 'fail their checks'} (the "
            "next open does not trust the file and rebuilds it from the CommitLog)"
        )
        return
    commit = int.from_bytes(raw[COMMIT_POS_OFFSET : COMMIT_POS_OFFSET + 8], "big") & VALUE_MASK
    if commit < commit_end:
        report.notes.append(
            f"records end at CommitLog offset {commit_end}, past "
            f"{STATE_FILE}'s COMMIT_POS {commit} (another program appended "
            "them; the next open dispatches them)"
        )


def _check_queues(
    path: str,
    files: MappedFileQueue | None,
    commit_end: int,
    report: CheckReport,
    expected: dict[tuple[str, int], int],
    size: int,
    bad_dirs: set[str],
    bar: Any = None,
) -> None:
    import numpy as np

    base = os.path.join(path, "consumequeue")
    seen: set[tuple[str, int]] = set()
    if os.path.isdir(base):
        for topic in sorted(os.listdir(base)):
            for qid in sorted(os.listdir(os.path.join(base, topic))):
                if not qid.isdigit():
                    continue
                qdir = os.path.join(base, topic, qid)
                key = (topic, int(qid))
                if os.path.abspath(qdir) in bad_dirs:
                    seen.add(key)  # a file of the wrong size is reported already
                    continue
                if not _has_segments(qdir):
                    continue
                seen.add(key)
                report.queues += 1
                q = MappedFileQueue(qdir, size, writable=False)
                try:
                    n = _check_queue(topic, int(qid), q, files, commit_end, report, np, bar)
                finally:
                    q.close()
                want = expected.get(key, 0)
                if want > n:
                    report.problem(
                        f"ConsumeQueue {topic}/{qid} has {n} entries but the "
                        f"CommitLog holds records up to offset {want - 1} "
                        "(`rocketspark store recover` rebuilds them)"
                    )
    for key, want in sorted(expected.items()):
        if key not in seen and want:
            report.problem(
                f"ConsumeQueue {key[0]}/{key[1]} is missing; the CommitLog holds "
                f"{want} of its records (`rocketspark store recover` rebuilds it)"
            )


def _check_queue(
    topic: str,
    qid: int,
    q: MappedFileQueue,
    files: MappedFileQueue | None,
    commit_end: int,
    report: CheckReport,
    np: Any,
    bar: Any = None,
) -> int:
    """Check every written entry; return one past the last written one."""
    n = q.min_offset // CQ_STORE_UNIT_SIZE
    hole = None  # the first empty entry, while no written one was seen after it
    holes_reported = False
    last = n
    for f in q.files:
        # Only what holds data: holes are empty entries, and reading one through
        # the mapping allocates a page on tmpfs (SIGBUS when it is full).
        per_file = f.size // CQ_STORE_UNIT_SIZE
        count = min(per_file, data_end(f.fileno(), f.size) // CQ_STORE_UNIT_SIZE)
        entries = np.frombuffer(f.mm, dtype=CQ_ENTRY_DTYPE, count=count)
        for off, size, code in zip(
            entries["offset"].tolist(),
            entries["size"].tolist(),
            entries["tags"].tolist(),
            strict=True,
        ):
            if size == 0:
                if hole is None:
                    hole = n
                n += 1
                continue
            if hole is not None and not holes_reported:
                report.problem(
                    f"ConsumeQueue {topic}/{qid}: entry {hole} is empty but entry "
                    f"{n} after it is written: a hole, which hides every later "
                    "entry from readers (`rocketspark store recover` rebuilds "
                    "the queue from the CommitLog)"
                )
                holes_reported = True
            hole = None
            report.queue_entries += 1
            if bar is not None and report.queue_entries % 4096 == 0:
                bar.update(report.queue_entries)
            where = f"ConsumeQueue {topic}/{qid} entry {n}"
            if files is None or off + size > commit_end:
                report.problem(
                    f"{where} points past the CommitLog end ({off} + {size} > {commit_end})"
                )
            else:
                seg = files.find(off, refresh=False)
                if seg is None:
                    if off >= files.min_offset:
                        report.problem(f"{where}: no CommitLog segment holds offset {off}")
                else:
                    c = check_record(seg.mm, off - seg.start_offset, off, verify_crc=False)
                    if c.size != size:
                        report.problem(
                            f"{where}: record at {off} has size {c.size}, entry "
                            f"says {size} {c.reason}".rstrip()
                        )
                    elif (c.topic, c.queue_id, c.queue_offset) != (topic, qid, n):
                        report.problem(
                            f"{where}: record at {off} belongs to {c.topic}/"
                            f"{c.queue_id} offset {c.queue_offset}"
                        )
                    elif topic != SCHEDULE_TOPIC and code != tags_code(c.tags):
                        report.problem(f"{where}: tags code {code} does not match tags {c.tags!r}")
            n += 1
            last = n
        del entries
        if count < per_file:  # the holes: empty entries
            if hole is None:
                hole = n
            n += per_file - count
    return last

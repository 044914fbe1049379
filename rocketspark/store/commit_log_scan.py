"""Finding and walking records in CommitLog segments, without the CommitLog's state.

Recovery, the store check and the CommitLog's own scan/survey read segments with
these: the byte ranges a sparse segment really holds (:func:`data_ranges`), the
first record at or after a position that verifies (:func:`find_valid_record`,
found by the message magic codes' common prefix :data:`MAGIC_PREFIX`), and a
walk over consecutive records (:func:`scan_files`, :func:`survey_records`).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator

from rocketspark.message.record import (
    INT,
    LONG,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    PHYSICAL_OFFSET_OFFSET,
    RECORD_BLANK,
    RECORD_END,
    RECORD_INVALID,
    RecordCheck,
    check_record,
)
from rocketspark.store.mapped_file import MappedFile, MappedFileQueue

__all__ = [
    "MAGIC_PREFIX",
    "data_ranges",
    "find_valid_record",
    "is_message_magic",
    "scan_files",
    "survey_records",
]


def is_message_magic(magic: int) -> bool:
    return magic in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2)


# The first three bytes of both message magic codes (big-endian 0xDAA320A7 / AB).
MAGIC_PREFIX = INT.pack(MESSAGE_MAGIC_CODE)[:3]
_MAGIC_LAST = (INT.pack(MESSAGE_MAGIC_CODE)[3], INT.pack(MESSAGE_MAGIC_CODE_V2)[3])


def data_ranges(f: MappedFile, start: int) -> Iterator[tuple[int, int]]:
    """Yield the [lo, hi) byte ranges of segment ``f`` from ``start`` that hold data.

    Holes of a sparse file (never written, so all zeros) are skipped with
    SEEK_DATA / SEEK_HOLE; where the file system cannot tell, the whole rest.
    """
    fd = f.fileno()
    pos = start
    while pos < f.size:
        try:
            lo = os.lseek(fd, pos, os.SEEK_DATA)
            hi = min(os.lseek(fd, lo, os.SEEK_HOLE), f.size)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nothing but a hole up to the end
                return
            yield pos, f.size
            return
        if lo >= f.size:
            return
        yield lo, hi
        pos = hi


def find_valid_record(files: MappedFileQueue, pos: int, limit: int | None = None) -> int | None:
    """Return the offset of the first record at or after ``pos`` that verifies.

    A record verifies when its magic code is a message's, its fields add up
    to TOTALSIZE, its PHYSICALOFFSET is its own position and its body CRC
    matches. Candidates are found by their magic code, so bodies that
    happen to hold it cost a check each; holes are skipped unread.
    """
    for f in files.segments_from(pos):
        if limit is not None and f.start_offset >= limit:
            return None
        rel_start = max(pos, f.start_offset) - f.start_offset
        mm = f.mm
        for lo, hi in data_ranges(f, rel_start):
            if limit is not None:
                hi = min(hi, limit - f.start_offset)
                if hi <= lo:
                    return None
            at = max(lo, rel_start) + 4  # the magic code follows TOTALSIZE
            while True:
                hit = mm.find(MAGIC_PREFIX, at, hi)
                if hit < 0:
                    break
                at = hit + 1
                rec = hit - 4
                if (
                    hit + 4 > f.size
                    or mm[hit + 3] not in _MAGIC_LAST
                    or rec + PHYSICAL_OFFSET_OFFSET + 8 > f.size
                ):
                    continue
                phy = f.start_offset + rec
                if LONG.unpack_from(mm, rec + PHYSICAL_OFFSET_OFFSET)[0] != phy:
                    continue
                if check_record(mm, rec, phy, verify_crc=True).size > 0:
                    return phy
    return None


def survey_records(files: MappedFileQueue, pos: int) -> tuple[int, int, int]:
    """Count the records that verify from ``pos`` on (see CommitLog.survey)."""
    first = -1
    count = 0
    end = pos
    at: int | None = find_valid_record(files, pos)
    while at is not None:
        if first < 0:
            first = at
        stop = at
        for p, check in scan_files(files, at):
            if check.size <= 0:
                stop = p
                break
            count += 1
            end = stop = p + check.size
        at = find_valid_record(files, stop + 1) if stop >= at else None
    return first, count, end


def scan_files(
    files: MappedFileQueue, start: int, *, verify_crc: bool = True, refresh: bool = False
) -> Iterator[tuple[int, RecordCheck]]:
    """CommitLog.scan over a queue of segments (``refresh``: map segments other
    processes made meanwhile)."""
    pos = start
    while True:
        f = files.find(pos, refresh=refresh)
        if f is None or f.data_limit(pos - f.start_offset) <= pos - f.start_offset:
            # No segment, or a hole (never written: the end, and unread, see data_limit).
            yield pos, RecordCheck(RECORD_END)
            return
        check = check_record(f.mm, pos - f.start_offset, pos, verify_crc=verify_crc)
        if check.size == RECORD_BLANK:
            pos = f.end_offset
            continue
        yield pos, check
        if check.size in (RECORD_END, RECORD_INVALID):
            return
        pos += check.size

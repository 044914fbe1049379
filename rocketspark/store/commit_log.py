"""The CommitLog: every message of every topic, appended to mapped segments.

Records are encoded as ``rocketspark.message.record`` describes. When a record (plus the
8-byte minimum blank) does not fit in what is left of a segment, the writer
puts ``[remaining:i32][BLANK_MAGIC_CODE:i32]`` there and starts the next
segment with the record.

Callers hold the store's write lock around :meth:`CommitLog.append`; readers
never lock and only reach records through ConsumeQueue entries, which are
written after the records they point to.
"""

# Over the ~700-line guide on purpose: most of this module is the hot append path
# (append, append_columns and its small-batch branch, about 370 lines), written for
# speed with numpy headers for a whole batch, bound locals and one bytes.join per
# segment; splitting it would only scatter that one loop. Segment scanning lives in
# commit_log_scan.py.

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from rocketspark.errors import CorruptRecordError, MessageTooLargeError
from rocketspark.message.byte_gather import Pieces, fixed_width, interleave, interleave_rows
from rocketspark.message.model import MessageExt, SysFlag
from rocketspark.message.record import (
    BLANK,
    BLANK_MAGIC_CODE,
    END_FILE_MIN_BLANK_LENGTH,
    HEADER_V4,
    HEADER_V4_DTYPE,
    HEADERS,
    INT,
    LONG,
    QUEUE_OFFSET_OFFSET,
    STORE_TIMESTAMP_OFFSET_V4,
    SYS_FLAG_OFFSET,
    HostAddress,
    RecordCheck,
    decode_record,
    header_mismatch,
)
from rocketspark.store.commit_log_scan import (
    data_ranges,
    find_valid_record,
    scan_files,
    survey_records,
)
from rocketspark.store.mapped_file import COMMIT_LOG_CHUNK, MappedFile, MappedFileQueue


@dataclass(slots=True)
class PreparedRecord:
    """A message encoded as far as it can be before the write lock is taken.

    ``tail`` holds BODY, TOPICLENGTH, TOPIC, PROPERTIESLENGTH, PROPERTIES: the
    bytes after BODYLENGTH, which do not depend on the record's position.
    """

    topic: str
    queue_id: int
    body_len: int
    tail: bytes
    crc: int
    flag: int
    sys_flag: int
    born_timestamp: int
    born_host: HostAddress
    reconsume_times: int
    prepared_offset: int
    magic: int
    tags_code: int
    uniq_key: str | None
    keys: tuple[str, ...]
    dispatch: bool  # goes into a ConsumeQueue (not a PREPARED / ROLLBACK record)
    delay_ms: int = 0  # SCHEDULE_TOPIC_XXXX: tags code = store time + delay


@dataclass(frozen=True, slots=True)
class Appended:
    """Where a record landed."""

    physical_offset: int
    size: int
    queue_offset: int


# Batches up to this many records are appended with ``struct`` rather than numpy.
SMALL_BATCH = 8
# From this many records a batch's bytes are gathered (byte_gather) rather than joined.
GATHER_MIN = 2048
WARM_AHEAD = 8 << 20  # bytes prefilled past an append's end (CommitLog.warm)
WARM_STEP = 256 << 10  # bytes prefilled by one call between appends (warm_ahead)


def _rest_list(rests: Pieces | tuple[Pieces, ...]) -> list[bytes]:
    parts = [p.to_list() for p in (rests if isinstance(rests, tuple) else (rests,))]
    return [b"".join(row) for row in zip(*parts, strict=True)]


def _column_getter(n: int) -> Callable[[np.ndarray | int], list[int]]:
    def col(value: np.ndarray | int) -> list[int]:
        return value.tolist() if isinstance(value, np.ndarray) else [int(value)] * n

    return col


@dataclass(slots=True)
class ColumnBatch:
    """Messages of one put_batch, column by column, encoded before the lock is taken.

    Every record has IPv4 born and store hosts, is dispatched to a
    ConsumeQueue and is not transactional: the common put, which the CommitLog
    appends without a per-record ``struct`` call. ``rests`` hold TOPICLENGTH,
    TOPIC, PROPERTIESLENGTH and PROPERTIES of each record. Scalars stand for
    a value every record shares.
    """

    topics: list[str] | str
    queue_ids: np.ndarray  # int32
    bodies: list[bytes] | Pieces
    rests: list[bytes] | Pieces | tuple[Pieces, ...]  # a tuple: pieces joined per record
    crcs: np.ndarray  # int64
    magics: np.ndarray | int
    tags_codes: np.ndarray  # int64
    born_host: HostAddress
    born_ts: np.ndarray | int
    flags: np.ndarray | int = 0
    reconsume: np.ndarray | int = 0
    sys_flags: np.ndarray | int = 0  # only TRANSACTION_COMMIT (or 0): all IPv4, uncompressed
    prepared: np.ndarray | int = 0  # PREPARED TRANSACTION OFFSET
    born_ips: np.ndarray | None = None  # per record (uint32 values), else born_host's
    born_ports: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.bodies)

    def topic_of(self, i: int) -> str:
        return self.topics if isinstance(self.topics, str) else self.topics[i]


@dataclass(slots=True)
class Placement:
    """Where the records of a ColumnBatch landed."""

    phys: np.ndarray  # int64 CommitLog offsets
    sizes: np.ndarray  # int64 record sizes
    queue_offsets: np.ndarray  # int64
    groups: list[tuple[str, int, np.ndarray]]  # (topic, queue id, record indexes in order)
    end: int


class CommitLog:
    """The CommitLog of one store directory."""

    def __init__(
        self,
        root: str,
        segment_size: int,
        store_host: HostAddress,
        *,
        writable: bool = True,
        warm: bool = True,
    ):
        self.directory = os.path.join(root, "commitlog")
        self.segment_size = segment_size
        self.store_host = store_host
        self.header = HEADERS[(False, store_host.is_v6)]
        self.files = MappedFileQueue(
            self.directory, segment_size, writable=writable, chunk=COMMIT_LOG_CHUNK
        )
        self._warm_end = 0  # prefilled with zeros up to here (by this process)
        self._warm = warm
        self._warm_file: MappedFile | None = None  # the segment prefilled last
        # bytes an append prefills past its end (0: the writer calls warm_ahead between
        # appends instead, see MessageStore.warm_between_puts)
        self.ahead = WARM_AHEAD

    @property
    def min_offset(self) -> int:
        """The first offset still on disk (another process may have deleted old segments)."""
        files = self.files.files
        if files and not os.path.exists(files[0].path):
            self.files.refresh()
        return self.files.min_offset

    def max_record_size(self) -> int:
        return self.segment_size - END_FILE_MIN_BLANK_LENGTH

    # -- writing -----------------------------------------------------------------

    def append(
        self,
        start: int,
        records: Sequence[PreparedRecord],
        store_timestamp: int,
        next_queue_offset: Callable[[str, int, int], int],
        set_pending_end: Callable[[int], None],
    ) -> tuple[list[Appended], int]:
        """Write ``records`` from CommitLog offset ``start``; return placements and end.

        ``next_queue_offset(topic, queue_id, count)`` reserves ``count`` queue
        offsets and returns the first. ``set_pending_end`` is told the end of
        the region before any byte of it is written.
        """
        seg_size = self.segment_size
        pos = start
        seg_start = pos - pos % seg_size
        seg_end = seg_start + seg_size
        chunk_start = pos
        chunks: list[bytes] = []
        writes: list[tuple[int, list[bytes]]] = []
        placed: list[Appended] = []
        store_ip = self.store_host.ip
        store_port = self.store_host.port
        headers = HEADERS
        store_v6 = self.store_host.is_v6
        blank = BLANK.pack
        for r in records:
            total = headers[(r.born_host.is_v6, store_v6)].size + len(r.tail)
            if total + END_FILE_MIN_BLANK_LENGTH > seg_size:
                raise MessageTooLargeError(
                    f"a record of {total} bytes does not fit in a CommitLog segment of "
                    f"{seg_size} bytes (mappedFileSizeCommitLog)"
                )
        for r in records:
            header = headers[(r.born_host.is_v6, store_v6)]
            total = header.size + len(r.tail)
            if total + END_FILE_MIN_BLANK_LENGTH > seg_end - pos:
                chunks.append(blank(seg_end - pos, BLANK_MAGIC_CODE))
                writes.append((chunk_start, chunks))
                chunks = []
                pos = chunk_start = seg_end
                seg_end += seg_size
            qo = next_queue_offset(r.topic, r.queue_id, 1) if r.dispatch else 0
            chunks.append(
                header.pack(
                    total,
                    r.magic,
                    r.crc,
                    r.queue_id,
                    r.flag,
                    qo,
                    pos,
                    r.sys_flag,
                    r.born_timestamp,
                    r.born_host.ip,
                    r.born_host.port,
                    store_timestamp,
                    store_ip,
                    store_port,
                    r.reconsume_times,
                    r.prepared_offset,
                    r.body_len,
                )
            )
            chunks.append(r.tail)
            placed.append(Appended(pos, total, qo))
            pos += total
        if chunks:
            writes.append((chunk_start, chunks))
        set_pending_end(pos)
        self.warm(start, pos)
        self.write(writes)
        return placed, pos

    def warm(self, start: int, end: int) -> None:
        """Prefill [start, end) and :attr:`ahead` bytes past it with zeros (see prefill).

        Called by the writer holding the write lock, before it copies an append
        into [start, end): nothing at or past ``start`` (the CommitLog's end) is
        data yet. RocketMQ warms its mapped files ahead for the same reason.
        """
        if end <= self._warm_end or not self._warm:
            return
        self._prefill(max(start, self._warm_end), end, end + self.ahead)

    def needs_warming(self, end: int) -> bool:
        """Whether less than WARM_AHEAD - WARM_STEP bytes past ``end`` are prefilled, short
        of where a prefill stops (the end or the reserved blocks of the segment holding
        ``end - 1``, when it is the one prefilled last): past that, nothing to do."""
        if not self._warm or end <= 0:
            return False
        target = end + WARM_AHEAD - WARM_STEP
        f = self._warm_file
        if f is not None and f.start_offset < end <= f.end_offset:
            target = min(target, f.end_offset, f.start_offset + f.reserved)
        return self._warm_end < target

    def warm_ahead(self, end: int) -> None:
        """Between appends, ``end`` the CommitLog's end (the write lock held): prefill
        up to WARM_AHEAD bytes past it, at most WARM_STEP at a time, in its segment;
        nothing while more than WARM_AHEAD - WARM_STEP are (the prefills come in steps
        of WARM_STEP, not one after each small put)."""
        if not self.needs_warming(end):
            return
        pos = max(end, self._warm_end)
        self._prefill(pos, end, min(end + WARM_AHEAD, pos + WARM_STEP))

    def _prefill(self, pos: int, end: int, target: int) -> None:
        """Prefill [pos, target), past the CommitLog's end ``end``; segments past the one
        holding ``end - 1`` are prefilled only as far as [pos, end) reaches into them."""
        f = None
        while pos < target:
            if pos < end or f is None:  # segments in order, as the write creates them
                f = self.files.get_or_create(min(pos, end - 1))
            # Never past the reserved blocks: write(2) there could meet a full disk.
            stop = min(target, f.end_offset, f.start_offset + f.reserved)
            if stop <= pos:
                break
            f.prefill(pos - f.start_offset, stop - f.start_offset)
            pos = stop
        self._warm_end = pos
        self._warm_file = f

    def write(self, writes: list[tuple[int, list[Any]]]) -> None:
        """Copy each (CommitLog offset, byte pieces) into its segment, pieces joined once."""
        for at, parts in writes:
            data = b"".join(parts)
            f = self.files.get_or_create(at)
            off = at - f.start_offset
            f.mm[off : off + len(data)] = data

    def append_columns(
        self,
        start: int,
        batch: ColumnBatch,
        store_timestamp: int,
        next_queue_offset: Callable[[str, int, int], int],
        set_pending_end: Callable[[int], None],
    ) -> Placement:
        """Write a ColumnBatch from CommitLog offset ``start`` (the vectorised append).

        Sizes are checked before any queue offset is reserved or byte written.
        Headers are built for the whole batch in one numpy array; each segment's
        bytes are then one ``bytes.join`` of header slices, bodies and rests.
        """
        n = len(batch)
        if n <= SMALL_BATCH:
            if isinstance(batch.bodies, Pieces):
                batch.bodies = batch.bodies.to_list()
            if not isinstance(batch.rests, list):
                batch.rests = _rest_list(batch.rests)
            return self._append_columns_small(
                start, batch, store_timestamp, next_queue_offset, set_pending_end
            )
        seg_size = self.segment_size
        header_size = HEADER_V4.size
        # Pieces (the segmented copy) for big batches or when the caller gave them;
        # below GATHER_MIN records a bytes.join of the objects is cheaper.
        gather = (
            n >= GATHER_MIN
            or not isinstance(batch.bodies, list)
            or not isinstance(batch.rests, list)
        )
        if gather:
            body_p = (
                batch.bodies if isinstance(batch.bodies, Pieces) else Pieces.of_list(batch.bodies)
            )
            rest_ps = (
                list(batch.rests)
                if isinstance(batch.rests, tuple)
                else [
                    batch.rests if isinstance(batch.rests, Pieces) else Pieces.of_list(batch.rests)
                ]
            )
            body_len = body_p.lengths
            totals = header_size + body_len + sum(p.lengths for p in rest_ps)
        else:
            # Not gathered: both are lists of bytes.
            body_len = np.fromiter(map(len, cast("list[bytes]", batch.bodies)), np.int64, count=n)
            rest_len = np.fromiter(map(len, cast("list[bytes]", batch.rests)), np.int64, count=n)
            totals = header_size + body_len + rest_len
        biggest = int(totals.max())
        if biggest + END_FILE_MIN_BLANK_LENGTH > seg_size:
            raise MessageTooLargeError(
                f"a record of {biggest} bytes does not fit in a CommitLog segment of "
                f"{seg_size} bytes (mappedFileSizeCommitLog)"
            )
        # Queue offsets: each (topic, queue) gets a consecutive run, in batch order.
        if isinstance(batch.topics, str):
            # Queue ids are small non-negative ints: bincount groups them in O(n).
            keys = batch.queue_ids.astype(np.int64)
            per_queue = np.bincount(keys)
            uniq = np.flatnonzero(per_queue)
            remap = np.cumsum(per_queue > 0) - 1
            inverse = remap[keys]
            counts = per_queue[uniq]
            group_names = [(batch.topics, int(q)) for q in uniq]
        else:
            ids: dict[tuple[str, int], int] = {}
            inverse = np.fromiter(
                (
                    ids.setdefault(k, len(ids))
                    for k in zip(batch.topics, batch.queue_ids.tolist(), strict=True)
                ),
                dtype=np.int64,
                count=n,
            )
            counts = np.bincount(inverse, minlength=len(ids))
            group_names = list(ids)
        order = np.argsort(inverse, kind="stable")
        bounds = np.concatenate(([0], np.cumsum(counts)))
        queue_offsets = np.empty(n, dtype=np.int64)
        groups = []
        for g, (topic, qid) in enumerate(group_names):
            idx = order[bounds[g] : bounds[g + 1]]
            base = next_queue_offset(topic, qid, len(idx))
            queue_offsets[idx] = base + np.arange(len(idx), dtype=np.int64)
            groups.append((topic, qid, idx))
        # Positions, rolling to the next segment (after a blank filler) as needed.
        phys = np.empty(n, dtype=np.int64)
        chunks: list[tuple[int, int, int, int]] = []  # (at, first, stop, blank length)
        pos = start
        i = 0
        while i < n:
            seg_end = (pos // seg_size + 1) * seg_size
            ends = pos + np.cumsum(totals[i:])
            k = int(np.searchsorted(ends, seg_end - END_FILE_MIN_BLANK_LENGTH, side="right"))
            phys[i : i + k] = ends[:k] - totals[i : i + k]
            stop = int(ends[k - 1]) if k else pos
            if i + k < n:
                chunks.append((pos, i, i + k, seg_end - stop))
                pos = seg_end
            else:
                chunks.append((pos, i, i + k, 0))
                pos = stop
            i += k
        hdr = np.empty(n, dtype=HEADER_V4_DTYPE)
        hdr["total"] = totals
        hdr["magic"] = batch.magics
        hdr["crc"] = batch.crcs
        hdr["queue_id"] = batch.queue_ids
        hdr["flag"] = batch.flags
        hdr["queue_offset"] = queue_offsets
        hdr["phy"] = phys
        hdr["sys_flag"] = batch.sys_flags
        hdr["born_ts"] = batch.born_ts
        hdr["born_ip"] = (
            int.from_bytes(batch.born_host.ip, "big") if batch.born_ips is None else batch.born_ips
        )
        hdr["born_port"] = batch.born_host.port if batch.born_ports is None else batch.born_ports
        hdr["store_ts"] = store_timestamp
        hdr["store_ip"] = int.from_bytes(self.store_host.ip, "big")
        hdr["store_port"] = self.store_host.port
        hdr["reconsume"] = batch.reconsume
        hdr["prepared"] = batch.prepared
        hdr["body_len"] = body_len
        set_pending_end(pos)
        self.warm(start, pos)
        if gather:
            head_p = Pieces.fixed(hdr, header_size, n)
            columns = [head_p, body_p, *rest_ps]
            # Records of one size (bodies of one length, a properties template):
            # rows of a byte matrix, copied column by column into the mapping.
            widths = [fixed_width(p) for p in columns]
            rows = None if None in widths else cast("list[int]", widths)
            for at, first, stop, blank in chunks:
                f = self.files.get_or_create(at)
                off = at - f.start_offset
                if stop > first:
                    part = [p.take(first, stop) for p in columns]
                    if rows is not None:
                        size = (stop - first) * sum(rows)
                        region = np.frombuffer(f.mm, dtype=np.uint8, count=size, offset=off)
                        interleave_rows(part, rows, region)
                        del region
                        off += size
                    else:
                        data = interleave(part)
                        f.mm[off : off + data.size] = data
                        off += data.size
                        del data
                if blank:
                    f.mm[off : off + BLANK.size] = BLANK.pack(blank, BLANK_MAGIC_CODE)
            return Placement(phys, totals, queue_offsets, groups, pos)
        heads = memoryview(hdr.tobytes())
        bodies, rests = cast("list[bytes]", batch.bodies), cast("list[bytes]", batch.rests)
        for at, first, stop, blank in chunks:
            parts: list[bytes | memoryview] = [b""] * (3 * (stop - first))
            parts[0::3] = [
                heads[j : j + header_size]
                for j in range(first * header_size, stop * header_size, header_size)
            ]
            parts[1::3] = bodies[first:stop]
            parts[2::3] = rests[first:stop]
            if blank:
                parts.append(BLANK.pack(blank, BLANK_MAGIC_CODE))
            data = b"".join(parts)
            f = self.files.get_or_create(at)
            off = at - f.start_offset
            f.mm[off : off + len(data)] = data
        return Placement(phys, totals, queue_offsets, groups, pos)

    def _append_columns_small(
        self,
        start: int,
        batch: ColumnBatch,
        store_timestamp: int,
        next_queue_offset: Callable[[str, int, int], int],
        set_pending_end: Callable[[int], None],
    ) -> Placement:
        """append_columns for a few records: plain ``struct`` beats numpy's per-call cost."""
        n = len(batch)
        seg_size = self.segment_size
        pack = HEADER_V4.pack
        header_size = HEADER_V4.size
        # append_columns made both lists of bytes.
        bodies, rests = cast("list[bytes]", batch.bodies), cast("list[bytes]", batch.rests)
        totals = [header_size + len(bodies[i]) + len(rests[i]) for i in range(n)]
        biggest = max(totals)
        if biggest + END_FILE_MIN_BLANK_LENGTH > seg_size:
            raise MessageTooLargeError(
                f"a record of {biggest} bytes does not fit in a CommitLog segment of "
                f"{seg_size} bytes (mappedFileSizeCommitLog)"
            )
        qids = batch.queue_ids.tolist()
        keys = [(batch.topic_of(i), qids[i]) for i in range(n)]
        order: dict[tuple[str, int], list[int]] = {}
        for i, k in enumerate(keys):
            order.setdefault(k, []).append(i)
        qoffs = [0] * n
        for (topic, qid), idx in order.items():
            base = next_queue_offset(topic, qid, len(idx))
            for j, i in enumerate(idx):
                qoffs[i] = base + j
        col = _column_getter(n)
        magics, crcs = col(batch.magics), col(batch.crcs)
        flags, born_ts, reconsume = col(batch.flags), col(batch.born_ts), col(batch.reconsume)
        sys_flags, prepared = col(batch.sys_flags), col(batch.prepared)
        born_ips = (
            [batch.born_host.ip] * n
            if batch.born_ips is None
            else [int(v).to_bytes(4, "big") for v in batch.born_ips.tolist()]
        )
        born_ports = col(batch.born_host.port if batch.born_ports is None else batch.born_ports)
        store_ip, store_port = self.store_host.ip, self.store_host.port
        writes: list[tuple[int, list[bytes]]] = []
        chunk: list[bytes] = []
        chunk_start = pos = start
        phys = [0] * n
        for i in range(n):
            total = totals[i]
            seg_end = (pos // seg_size + 1) * seg_size
            if total + END_FILE_MIN_BLANK_LENGTH > seg_end - pos:
                chunk.append(BLANK.pack(seg_end - pos, BLANK_MAGIC_CODE))
                writes.append((chunk_start, chunk))
                chunk = []
                chunk_start = pos = seg_end
            phys[i] = pos
            chunk.append(
                pack(
                    total,
                    magics[i],
                    crcs[i],
                    qids[i],
                    flags[i],
                    qoffs[i],
                    pos,
                    sys_flags[i],
                    born_ts[i],
                    born_ips[i],
                    born_ports[i],
                    store_timestamp,
                    store_ip,
                    store_port,
                    reconsume[i],
                    prepared[i],
                    len(bodies[i]),
                )
            )
            chunk.append(bodies[i])
            chunk.append(rests[i])
            pos += total
        writes.append((chunk_start, chunk))
        set_pending_end(pos)
        self.warm(start, pos)
        self.write(writes)
        groups = [(t, q, np.asarray(idx, dtype=np.int64)) for (t, q), idx in order.items()]
        return Placement(
            np.asarray(phys, dtype=np.int64),
            np.asarray(totals, dtype=np.int64),
            np.asarray(qoffs, dtype=np.int64),
            groups,
            pos,
        )

    def wipe(self, start: int, end: int) -> None:
        """Zero [start, end): the leftovers of a writer that died mid-append.

        Holes are skipped: they read as zeros already, and a store into one
        would need a block the disk may not have (recovery on a full disk).
        """
        pos = start
        while pos < end:
            f = self.files.find(pos)
            if f is None:
                break
            stop = min(end, f.end_offset)
            for lo, hi in data_ranges(f, pos - f.start_offset):
                hi = min(hi, stop - f.start_offset)
                if hi <= lo:
                    break
                f.mm[lo:hi] = bytes(hi - lo)
            pos = stop

    # -- reading -----------------------------------------------------------------

    def segment(self, offset: int) -> MappedFile:
        f = self.files.find(offset)
        if f is None:
            raise CorruptRecordError(
                "no CommitLog segment holds this offset", file=self.directory, offset=offset
            )
        return f

    def read(self, offset: int, *, verify_crc: bool = False) -> MessageExt:
        """Decode the record at CommitLog ``offset``."""
        f = self.segment(offset)
        return decode_record(
            f.mm,
            offset - f.start_offset,
            file=f.path,
            base_offset=f.start_offset,
            verify_crc=verify_crc,
        )

    def read_reached(
        self,
        offset: int,
        *,
        verify_crc: bool,
        size: int | None = None,
        topic: str | None = None,
        queue_id: int | None = None,
        queue_offset: int | None = None,
    ) -> MessageExt:
        """Decode the record at ``offset`` that a ConsumeQueue entry (or the index) led to.

        Raises CorruptRecordError naming the file, offset and field when its header
        disagrees with what led there (see ``header_mismatch``), or, with
        ``verify_crc``, when its body does not match BODYCRC.
        """
        f = self.segment(offset)
        msg = decode_record(
            f.mm,
            offset - f.start_offset,
            file=f.path,
            base_offset=f.start_offset,
            verify_crc=verify_crc,
        )
        what = header_mismatch(
            msg, offset, size=size, topic=topic, queue_id=queue_id, queue_offset=queue_offset
        )
        if what is not None:
            raise CorruptRecordError(f"record header damaged: {what}", file=f.path, offset=offset)
        return msg

    def record_batches(
        self,
        topic: str,
        broker_name: str,
        phy_offsets: np.ndarray,
        sizes: np.ndarray,
        *,
        queue_id: int,
        queue_offsets: np.ndarray,
        check_crc: bool = True,
        columns: tuple[str, ...] | None = None,
    ) -> list[Any]:
        """Return the records at ``phy_offsets`` (ascending, all of ``topic``) as Arrow
        record batches (``rocketspark.message.arrow``), one per segment touched, of
        ``columns`` only when given.

        ``sizes`` and ``queue_offsets`` are those of the ConsumeQueue entries that
        point at the records, in queue ``queue_id``. Raises CorruptRecordError naming
        the file, offset and field when a record's header disagrees with its entry
        and, with ``check_crc``, when a body does not match its BODYCRC.
        """
        from rocketspark.message.arrow import records_to_batch  # pyarrow only when read

        phy = np.asarray(phy_offsets, dtype=np.int64)
        size = np.asarray(sizes, dtype=np.int64)
        qoff = np.asarray(queue_offsets, dtype=np.int64)
        if len(phy) == 0:
            return []
        seg_idx = phy // self.segment_size
        cuts = np.flatnonzero(np.diff(seg_idx)) + 1
        bounds = [0, *cuts.tolist(), len(phy)]
        out = []
        for a, b in zip(bounds, bounds[1:], strict=False):
            f = self.segment(int(phy[a]))
            rel = phy[a:b] - f.start_offset
            past = np.flatnonzero(rel + size[a:b] > f.size)
            if len(past) or int(rel[0]) < 0:
                raise CorruptRecordError(
                    "ConsumeQueue entry points past its CommitLog segment",
                    file=f.path,
                    offset=int(phy[a + past[0]] if len(past) else phy[a]),
                )
            out.append(
                records_to_batch(
                    f.mm,
                    rel,
                    size[a:b],
                    topic=topic,
                    broker_name=broker_name,
                    queue_id=queue_id,
                    queue_offsets=qoff[a:b],
                    commitlog_offsets=phy[a:b],
                    check_crc=check_crc,
                    file=f.path,
                    columns=columns,
                )
            )
        return out

    def store_timestamp(self, offset: int) -> int:
        """Return STORETIMESTAMP of the record at ``offset`` without decoding it."""
        f = self.segment(offset)
        pos = offset - f.start_offset
        sys_flag = INT.unpack_from(f.mm, pos + SYS_FLAG_OFFSET)[0]
        at = pos + STORE_TIMESTAMP_OFFSET_V4 + (12 if sys_flag & SysFlag.BORNHOST_V6 else 0)
        return LONG.unpack_from(f.mm, at)[0]

    def scan(self, start: int, *, verify_crc: bool = True) -> Iterator[tuple[int, RecordCheck]]:
        """Yield (offset, check) for each record from ``start`` until the data ends.

        Stops after yielding the first RECORD_END or RECORD_INVALID check.
        Blank fillers are followed to the next segment.
        """
        return scan_files(self.files, start, verify_crc=verify_crc, refresh=True)

    def next_valid(self, pos: int, limit: int | None = None) -> int | None:
        """Return the offset of the first record at or after ``pos`` (and before
        ``limit``) that verifies (see :func:`find_valid_record`), or None."""
        return find_valid_record(self.files, pos, limit)

    def survey(self, pos: int) -> tuple[int, int, int]:
        """Count the records that verify from ``pos`` to the end of the log.

        Steps over damage (searching for the next record that verifies) as often
        as needed. Returns (first valid offset or -1, records counted, end of the
        last one).
        """
        return survey_records(self.files, pos)

    def set_queue_offset(self, offset: int, queue_offset: int) -> None:
        """Rewrite QUEUEOFFSET of the record at ``offset`` (a ConsumeQueue rebuilt
        around a hole numbers its records again; BODYCRC does not cover the field)."""
        f = self.segment(offset)
        LONG.pack_into(f.mm, offset - f.start_offset + QUEUE_OFFSET_OFFSET, queue_offset)

    def zero_from(self, offset: int) -> None:
        """Zero every byte from ``offset`` to the end of its segment and delete the
        segments after it (``store recover --truncate-at``); holes are skipped."""
        f = self.files.find(offset)
        if f is not None:
            zeros = bytes(1 << 20)
            for lo, hi in data_ranges(f, offset - f.start_offset):
                for at in range(lo, hi, len(zeros)):
                    f.mm[at : min(hi, at + len(zeros))] = zeros[: min(hi, at + len(zeros)) - at]
            f.flush(offset - f.start_offset, f.size)
        seg = self.segment_size
        self.files.delete_from(offset - offset % seg + seg)

    def first_nonzero_tail(self, end: int, window: int) -> int:
        """Return the end of non-zero garbage after ``end`` within its segment.

        Garbage ends where ``window`` zero bytes in a row begin (or the segment ends).
        """
        f = self.files.find(end)
        if f is None:
            return end
        data = np.frombuffer(f.mm, dtype=np.uint8)
        pos = end - f.start_offset
        last_nonzero = pos
        step = 1 << 20
        # Holes are zeros, never read (on tmpfs a read of one allocates a page).
        for lo, hi in data_ranges(f, pos):
            if lo - last_nonzero >= window:
                break
            pos = max(pos, lo)
            while pos < hi:
                chunk = data[pos : min(hi, pos + step)]
                nz = np.flatnonzero(chunk)
                if len(nz):
                    last_nonzero = pos + int(nz[-1]) + 1
                elif pos - last_nonzero >= window:
                    break
                pos += len(chunk)
            else:
                continue
            break
        del data
        return f.start_offset + last_nonzero

    def flush(self, start: int, end: int) -> None:
        self.files.flush(start, end)

    def close(self) -> None:
        self.files.close()

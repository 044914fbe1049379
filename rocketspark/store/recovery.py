"""Recovery: bring a store to a consistent state when its first process opens it.

RocketMQ's DefaultMessageStore.recover (CommitLog.recoverNormally /
recoverAbnormally and the ConsumeQueue checks). The CommitLog is the truth;
the state file only says where to start looking. Records the scan meets are
dispatched again through the dispatcher (the ``redispatch`` callable), so a
recovered ConsumeQueue holds what a live append would have written. The
ConsumeQueue rebuild (``Recovery.rebuild_queues``) also serves a writer's
catch-up after another writer died between its append and its dispatch.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from rocketspark.errors import ConfigError, StoreDamagedError
from rocketspark.message.model import TRANS_HALF_TOPIC, SysFlag, transaction_type
from rocketspark.message.names import validate_topic
from rocketspark.message.record import RECORD_INVALID, RecordCheck, check_record
from rocketspark.store.checkpoint import StoreCheckpoint
from rocketspark.store.commit_log import CommitLog
from rocketspark.store.commit_log_scan import MAGIC_PREFIX, data_ranges
from rocketspark.store.config import MessageStoreConfig
from rocketspark.store.consume_queue import CQ_ENTRY_DTYPE, ConsumeQueue, ConsumeQueues
from rocketspark.store.index_service import IndexService
from rocketspark.store.store_state import ABORT_FILE, StoreState
from rocketspark.store.topic_config import TopicConfigTable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DamageReport:
    """Damage in the CommitLog with valid records after it (the store is read-only)."""

    file: str
    offset: int
    resume: int  # the first valid record after the damage
    following: int  # how many valid records follow it

    def describe(self) -> str:
        return (
            f"the CommitLog is damaged at offset {self.offset} (file {self.file}), and "
            f"{self.following} valid record(s) follow from offset {self.resume}; writes "
            f"are refused until `rocketspark store recover --truncate-at {self.offset}` "
            "discards everything from the damage on (or the bytes are restored)"
        )


@dataclass
class RecoveryReport:
    """What opening the store found and repaired.

    ``abnormal_exit``: the last run did not end cleanly: the abort file was
    left by a holder that had to close() and did not, by a writer killed
    inside an append, a dispatch or a schedule step, or the state file could
    not be trusted (a process opened with ``exit_without_close`` that ended
    with nothing unfinished is not one). ``scanned_from``: where the CommitLog
    scan started (None: only the recorded end was verified); ``commit_end``:
    where the data ends now (the damage offset when ``damage`` is set);
    ``state_damaged``: the state fields whose checks failed.
    """

    abnormal_exit: bool
    scanned_from: int | None = None
    commit_end: int = 0
    reason: str = ""
    discarded_bytes: int = 0
    truncated_queue_entries: int = 0
    state_damaged: list[str] = dataclasses.field(default_factory=list)
    damage: DamageReport | None = None
    truncated_valid_records: int = 0
    # (topic, queue id, first entry rebuilt, entries it has now)
    repaired_queues: list[tuple[str, int, int, int]] = dataclasses.field(default_factory=list)


class Redispatch(Protocol):
    """Dispatch the records of CommitLog [start, end) again (``end`` None: to the end of
    the valid data); returns where the scan stopped and why. From ``index_from``, when
    before ``start``, records are only indexed again."""

    def __call__(
        self, start: int, end: int | None, *, index_from: int | None = None
    ) -> tuple[int, str]: ...


class Recovery:
    """Recovery of one store: the CommitLog scan, truncation and ConsumeQueue repair.

    ``redispatch`` dispatches scanned records (ConsumeQueue and index entries
    a record lacks); ``queue_code`` is the ConsumeQueue tags code of a scanned
    record; ``gaps`` (queue -> first missing entry) is shared with the
    dispatch, which notes the queues it met entries missing in, for
    ``rebuild_queues`` to rebuild and forget.
    """

    def __init__(
        self,
        *,
        root: str,
        config: MessageStoreConfig,
        state: StoreState,
        commit_log: CommitLog,
        checkpoint: StoreCheckpoint,
        index: IndexService,
        queues: ConsumeQueues,
        topics: TopicConfigTable,
        redispatch: Redispatch,
        queue_code: Callable[[RecordCheck], int],
        gaps: dict[tuple[str, int], int],
    ):
        self.root = root
        self.config = config
        self.state = state
        self.commit_log = commit_log
        self.checkpoint = checkpoint
        self.index = index
        self.queues = queues
        self.topics = topics
        self.redispatch = redispatch
        self.queue_code = queue_code
        self.gaps = gaps

    def recover(self, truncate_at: int | None = None, *, full: bool = False) -> RecoveryReport:
        """Bring the store to a consistent state (first opener only, lock held exclusively).

        The CommitLog is the truth, whoever wrote it (rocketspark or a RocketMQ
        broker); ``rocketspark.state`` only says where to start looking:

        - a trusted state (format 2, every field's check passes) starts at
          min(FLUSHED_POS, DISPATCHED_POS, COMMIT_POS): for a clean store, its
          end, so opening verifies a few bytes, not the whole log;
        - an untrusted one (damaged, format 1, or none: a broker's store)
          starts at a segment whose first record verifies (_safe_scan_start),
          and is rebuilt from what the log holds.

        The scan goes on while records verify (magic code, sizes,
        PHYSICALOFFSET, body CRC), across end-of-segment blanks, and dispatches
        what ConsumeQueues and index lack, records past COMMIT_POS (a broker's
        appends) included. Where verified data ends, the rest of the log is
        searched for records that verify:

        - none: the end is a torn tail; its bytes are zeroed, queue and index
          entries past it dropped;
        - with a trusted state (or a format-1 one whose COMMIT_POS a record
          ends at) saying a writer died inside an append
          (COMMIT_POS < PENDING_END) and no record verifying at or past
          PENDING_END: the whole append goes, as a live writer catching up
          would wipe it, so an append of several records is all or nothing
          (the exactly-once sink's commit relies on it);
        - otherwise the store is damaged: nothing is cut or zeroed. Reads
          work: records before the damage, and those after it that
          ConsumeQueues already point at (a read of a damaged record raises
          CorruptRecordError). Records after the damage that no queue points at
          stay unread, and every write raises StoreDamagedError (naming file,
          offset and how many valid records follow) until an open with
          ``truncate_at`` equal to the damage offset discards them all.

        ConsumeQueues are then checked for holes (an empty entry with written
        ones after it) and rebuilt from the CommitLog where they disagree
        (rebuild_queues). With ``full``, the scan starts at the first segment.
        """
        state = self.state
        abort_path = os.path.join(self.root, ABORT_FILE)
        abort = os.path.exists(abort_path)
        # A format-1 file (no checks, written by an older rocketspark) is not damaged:
        # its positions serve as a scan start once the CommitLog confirms it.
        legacy = state.existed and state.valid and state.format_version == 1
        damaged = state.damaged_fields() if state.existed and state.valid and not legacy else []
        trusted = state.valid and not damaged and not legacy
        report = RecoveryReport(abnormal_exit=abort)
        log_files = self.commit_log.files
        if not state.valid:
            state.initialise()  # a new store, or a broker's: nothing in the file to keep
        if damaged:
            report.state_damaged = damaged
            log.warning(
                "store %s: %s fails its checks (%s); finding the end of the data "
                "from the CommitLog",
                self.root,
                state.path,
                ", ".join(damaged),
            )
        if trusted:
            commit, pending = state.commit_pos, state.pending_end
            # Processes that may exit without close() (Spark's workers) and left
            # nothing unfinished did not crash; one that had to close() and did not did.
            report.abnormal_exit = abort and (
                state.holders > 0
                or pending != commit
                or state.dispatched_pos != commit
                or state.intent()[0] != 0
            )
            start = min(state.flushed_pos, state.dispatched_pos, commit)
            if start < log_files.min_offset:  # segments expired (a broker deleted them)
                start = log_files.min_offset
            # (Damage found last time starts where the last valid record ended; a torn
            # record at COMMIT_POS, as a writer killed inside an append leaves it,
            # starts where a verified record ends.)
            if (
                not (state.damage_following and start == state.damage_pos)
                and not self._is_boundary(start)
                and not self._ends_a_record(start)
            ):
                log.warning(
                    "store %s: position %d of %s is not a record boundary of the "
                    "CommitLog; scanning from a segment start",
                    self.root,
                    start,
                    state.path,
                )
                trusted = False
                start = self._safe_scan_start(abort)
        else:
            commit = pending = -1
            start = None
            if legacy:
                commit_v1, pending_v1, dispatched_v1, flushed_v1 = state.legacy_positions()
                start = self._confirmed_start(min(commit_v1, dispatched_v1, flushed_v1))
                if start is not None and self._ends_a_record(commit_v1):
                    # A writer of that rocketspark killed inside an append: all or
                    # nothing, as it recovered (the unfinished-append rule below).
                    commit, pending = commit_v1, pending_v1
            elif damaged and "FLUSHED_POS" not in damaged:
                # FLUSHED_POS <= DISPATCHED_POS: all before it was dispatched and flushed.
                start = self._confirmed_start(state.flushed_pos)
            if start is None:
                start = self._safe_scan_start(abort)
        if full:
            start = log_files.min_offset
        flushed_before = state.flushed_pos if trusted else start
        report.scanned_from = start
        # An orderly end: every position equal, no holder died. Nothing past the
        # end was dispatched, no index update was cut short.
        quick = (
            trusted
            and not full
            and not report.abnormal_exit
            and start == commit == pending == state.dispatched_pos
        )
        if not quick:
            self.index.repair_tail()  # a writer killed inside an index update
        self.gaps.clear()
        end, reason = self.redispatch(start, None)
        if quick and end == commit and self._ends_a_record(end):
            # An orderly end, and a record ends there (zeros inside a record look the
            # same): what follows was never written. Searching it would cost the
            # pages of WARM_AHEAD on every open.
            after = None
        else:
            quick = quick and end != commit
            after = self.commit_log.next_valid(end)
        seg_start = self._segment_end(start) - self.config.mapped_file_size_commit_log
        if (
            after is not None
            and start != seg_start
            and not self._is_record(start)
            and not self._ends_a_record(start)
        ):
            # Zeros at a position the state gave could be zeros inside a record:
            # damage is only ever judged by a scan from a known record boundary.
            start = report.scanned_from = max(seg_start, log_files.min_offset)
            end, reason = self.redispatch(start, None)
            after = self.commit_log.next_valid(end)
        report.reason = reason
        damage: tuple[int, int, int] | None = None  # (resume, following, end of valid data)
        cut = end
        if (
            commit < pending
            and commit <= end <= pending
            and (self.commit_log.next_valid(pending) is None)
        ):
            # A writer was killed inside an append: what it had copied was never
            # acknowledged (COMMIT_POS had not moved). A record verifying past
            # PENDING_END means the state is older than the log (an OS crash lost
            # its page): then this rule does not apply.
            if end > commit or (after is not None and after < pending):
                log.warning(
                    "store %s: discarding an unfinished append at CommitLog [%d, %d)",
                    self.root,
                    commit,
                    pending,
                )
                report.reason = "unfinished append"
            cut = commit
            garbage_end = max(
                pending,
                self.commit_log.first_nonzero_tail(end, self.config.max_message_size + 65536),
            )
        elif after is None and quick and end == commit:
            garbage_end = end
        elif after is None:
            garbage_end = self.commit_log.first_nonzero_tail(
                end, self.config.max_message_size + 65536
            )
            if trusted:
                garbage_end = max(garbage_end, min(pending, self._segment_end(end)))
        else:
            resume, following, valid_end = self.commit_log.survey(after)
            damage = (resume, following, valid_end)
        if damage is not None and truncate_at is not None and truncate_at == end:
            log.warning(
                "store %s: truncating the CommitLog at %d as asked: %d valid "
                "record(s) after it are discarded",
                self.root,
                end,
                damage[1],
            )
            report.truncated_valid_records = damage[1]
            self.commit_log.zero_from(end)
            damage = None
            garbage_end = end
        elif truncate_at is not None:
            where = (
                f"the damage is at offset {end}"
                if damage is not None
                else "the store is not damaged"
            )
            raise ConfigError(f"truncate_at {truncate_at}: {where}; nothing was truncated")
        report.commit_end = cut
        if damage is not None:
            resume, following, valid_end = damage
            f = self.commit_log.files.find(end)
            report.damage = DamageReport(
                f.path if f else self.commit_log.directory, end, resume, following
            )
            log.error("store %s: %s", self.root, report.damage.describe())
            state.damage_pos, state.damage_resume = end, resume
            state.damage_following = following
            # Readers may reach records up to the last valid one; the next first
            # opener scans from the damage again (DISPATCHED_POS stays before it).
            state.commit_pos = state.pending_end = max(valid_end, end)
            state.dispatched_pos = end
            state.flushed_pos = min(flushed_before, end)
            state.synced_pos = min(state.synced_pos if trusted else end, end)
        else:
            if garbage_end > cut:
                report.discarded_bytes = garbage_end - cut
                self.commit_log.wipe(cut, garbage_end)
            if not (quick and cut == commit):  # else nothing lies past the end
                self.commit_log.files.delete_from(self._segment_end(cut))
                report.truncated_queue_entries = self.queues.truncate(cut)
                rebuild = self.index.truncate(cut)
                if rebuild is not None and rebuild < cut:
                    self.redispatch(cut, None, index_from=rebuild)
            state.commit_pos = state.dispatched_pos = state.pending_end = cut
            state.flushed_pos = min(flushed_before, cut)
            state.synced_pos = min(state.synced_pos if trusted else cut, cut)
            state.damage_pos = state.damage_resume = state.damage_following = 0
        if not trusted:
            state.stamp()  # every checked field is written: the file is trusted again
        state.holders = 0
        clean = quick and end == commit
        if clean and damage is None:
            report.scanned_from = None  # verified the end only: nothing re-read
        if damage is None and (not clean or self.gaps):
            # After an orderly end no queue can have a hole (a refused put gives its
            # offsets back; the abort file may still be there, as Spark's workers leave
            # it), and walking every queue costs a store of many queues more than the
            # rest of the open together: only a crash or an older rocketspark's store
            # (a format-1 state, never clean here) needs the walk.
            report.repaired_queues = self._repair_queues(cut, full=not clean)
        elif self.gaps:
            # A rebuild would drop the entries of records past the damage: queues
            # are repaired once the damage is resolved.
            log.warning(
                "store %s: ConsumeQueues %s lack entries; rebuilt once the damage is resolved",
                self.root,
                sorted(self.gaps),
            )
            self.gaps.clear()
        with open(abort_path, "wb"):
            pass
        return report

    def _segment_end(self, pos: int) -> int:
        seg = self.config.mapped_file_size_commit_log
        return pos - pos % seg + seg

    def _ends_a_record(self, pos: int) -> bool:
        """Does a record that verifies end exactly at ``pos`` (or a segment start there)?

        Looks back for the last record before ``pos`` by its magic code (a few
        hundred bytes, usually), checking PHYSICALOFFSET and CRC.
        """
        f = self.commit_log.files.find(pos)
        if f is None:
            f = self.commit_log.files.find(pos - 1)
            if f is None or f.end_offset != pos:
                return pos == self.commit_log.files.min_offset
        rel = pos - f.start_offset
        if rel == 0:
            return True
        low = max(0, rel - self.config.max_message_size - 65536)
        mm = f.mm
        hi = rel
        while True:
            hit = mm.rfind(MAGIC_PREFIX, low, hi)
            if hit < 4:
                return False
            hi = hit + 2  # the next search ends before this hit
            check = check_record(mm, hit - 4, f.start_offset + hit - 4)
            if check.size > 0:
                return hit - 4 + check.size == rel

    def _is_record(self, pos: int) -> bool:
        """Does a record that verifies start at ``pos``?"""
        f = self.commit_log.files.find(pos)
        return f is not None and check_record(f.mm, pos - f.start_offset, pos).size > 0

    def _is_boundary(self, pos: int) -> bool:
        """Can a scan start at ``pos``: a segment start, a record, a blank or the zeros
        past the end (a trusted state's position only: zeros mid-record look the same)."""
        f = self.commit_log.files.find(pos)
        if f is None or pos == f.start_offset:
            return True
        check = check_record(f.mm, pos - f.start_offset, pos, verify_crc=True)
        return check.size != RECORD_INVALID

    def adopt_unlisted_topics(self) -> None:
        """List topics that have ConsumeQueues but no entry in topics.json.

        A store written by RocketMQ's store module alone (or whose topics.json
        was lost) still has its queues on disk; a user expects to read them.
        Each such topic gets as many queues as its highest queue directory + 1.
        """
        base = os.path.join(self.root, "consumequeue")
        if not os.path.isdir(base):
            return
        for topic in sorted(os.listdir(base)):
            if self.topics.get(topic) is not None:
                continue
            try:
                validate_topic(topic, on_disk=True)
            except ConfigError:
                log.warning(
                    "store %s: ignoring ConsumeQueue directory %r (not a topic name)",
                    self.root,
                    topic,
                )
                continue
            qids = [int(q) for q in os.listdir(os.path.join(base, topic)) if q.isdigit()]
            if qids:
                n = max(qids) + 1
                self.topics.create(topic, n, n, perm=6, order=False, on_disk=True)
                log.info(
                    "store %s: adopted topic %r with %d queue(s) found on disk", self.root, topic, n
                )

    def _confirmed_start(self, start: int) -> int | None:
        """``start`` (a position of a state file not trusted as a whole) if the CommitLog
        confirms it as a place to scan from: a record starts or ends there."""
        if start < self.commit_log.files.min_offset or not (
            self._is_record(start) or self._ends_a_record(start)
        ):
            return None
        log.info(
            "store %s: scanning from %d, where %s says the data was dispatched",
            self.root,
            start,
            self.state.path,
        )
        return start

    def _safe_scan_start(self, abnormal: bool) -> int:
        """Where to scan from without a trusted state (damaged, or a RocketMQ broker's store).

        A scan starts only at a segment whose first record verifies (magic
        code, PHYSICALOFFSET, CRC): a broker's preallocated, all-zero next
        segment is never one. After a clean shutdown, the third segment from
        the end (as RocketMQ's normal recovery); after an abnormal exit, the
        newest whose first record was stored before the checkpoint's time (by
        then, everything before it was flushed and dispatched), else the first.
        """
        files = self.commit_log.files.files
        if not files:
            return 0
        starts = []
        for f in files:
            check = check_record(f.mm, 0, f.start_offset, verify_crc=True)
            if check.size > 0:
                starts.append((f.start_offset, check.store_timestamp))
        if not starts:
            return files[0].start_offset
        if not abnormal:
            return starts[max(0, len(starts) - 3)][0]
        safe = self.checkpoint.min_timestamp
        for offset, first_ts in reversed(starts):
            if safe and first_ts <= safe:
                return offset
        return starts[0][0]

    def _repair_queues(self, upto: int, *, full: bool) -> list[tuple[str, int, int, int]]:
        """Find ConsumeQueue holes and rebuild those queues from the CommitLog.

        A hole (an empty entry with written entries after it) hides every
        later entry from readers. A first open after processes that ended
        without close() checks each queue's last file (the one max_offset
        reads anyway); one after a crash, an older rocketspark or anything
        the scan repaired checks every file (a clean shutdown: none). Holes
        in the half-message queue are only reported: its offsets identify
        transactions.
        """
        base = os.path.join(self.root, "consumequeue")
        for topic in sorted(os.listdir(base)) if os.path.isdir(base) else []:
            tdir = os.path.join(base, topic)
            if not os.path.isdir(tdir):
                continue
            for qid in sorted(os.listdir(tdir)):
                if not qid.isdigit():
                    continue
                hole = _find_hole(self.queues.queue(topic, int(qid)), full)
                if hole is None:
                    continue
                if topic == TRANS_HALF_TOPIC:
                    log.error(
                        "store %s: ConsumeQueue %s/%s has a hole at entry %d; half "
                        "messages are named by their offsets, so it is left as is",
                        self.root,
                        topic,
                        qid,
                        hole,
                    )
                    continue
                key = (topic, int(qid))
                self.gaps[key] = min(hole, self.gaps.get(key, hole))
        return self.rebuild_queues(upto)

    def rebuild_queues(self, upto: int) -> list[tuple[str, int, int, int]]:
        """Rebuild the queues in ``_gaps`` from the CommitLog, from their first missing entry.

        The queue's records after its last good entry, in CommitLog order
        (verified, up to ``upto``), become its entries from there. A record
        numbered after a hole gets its entry's offset written into its
        QUEUEOFFSET (BODYCRC does not cover it), so that a record's
        QUEUEOFFSET is its entry again, as consumers expect (RocketMQ's
        clients commit offsets by it). Entries once behind a hole thus move
        down: an acknowledged put's queue offset changes, its message stays.
        Returns (topic, queue id, first entry rebuilt, entries now) per queue.
        """
        done = []
        gaps = dict(self.gaps)
        self.gaps.clear()
        starts = {}
        for key, first in gaps.items():
            prev = self.queues.queue(*key).entry(first - 1) if first > 0 else None
            starts[key] = prev[0] + prev[1] if prev is not None else self.commit_log.min_offset
        # A process killed half way leaves entries dropped and records renumbered
        # with no hole left to find: DISPATCHED_POS goes back to where the scans
        # start, so the next sync or open redispatches from there, meets the
        # records not yet renumbered as a gap and rebuilds again.
        state = self.state
        dispatched = state.dispatched_pos
        if starts and min(starts.values()) < dispatched:
            state.dispatched_pos = min(starts.values())
        for (topic, qid), first in sorted(gaps.items()):
            q = self.queues.queue(topic, qid)
            phy = starts[(topic, qid)]
            q.truncate_to(first)
            q.zero_from(first, _written_end(q))
            n = first
            for pos, check in self.commit_log.scan(phy, verify_crc=True):
                if pos >= upto or check.size <= 0:
                    break
                if (
                    (check.topic, check.queue_id) != (topic, qid)
                    or check.queue_offset < first
                    or transaction_type(check.sys_flag) not in (0, SysFlag.TRANSACTION_COMMIT)
                ):
                    continue
                if check.queue_offset != n:
                    self.commit_log.set_queue_offset(pos, n)
                q.put(n, [pos], [check.size], [self.queue_code(check)])
                n += 1
            self.commit_log.flush(phy, upto)
            self.queues.mark_dirty((topic, qid), first)
            log.warning(
                "store %s: ConsumeQueue %s/%d rebuilt from the CommitLog from entry "
                "%d; it has %d entries",
                self.root,
                topic,
                qid,
                first,
                n,
            )
            done.append((topic, qid, first, n))
        state.dispatched_pos = dispatched
        return done

    def damage_error(self) -> StoreDamagedError:
        """The error a write meets while the CommitLog is damaged (see recover)."""
        state = self.state
        pos = state.damage_pos
        f = self.commit_log.files.find(pos)
        report = DamageReport(
            f.path if f else self.commit_log.directory,
            pos,
            state.damage_resume,
            state.damage_following,
        )
        return StoreDamagedError(
            f"store {self.root}: {report.describe()}",
            file=report.file,
            offset=pos,
            resume=report.resume,
            following=report.following,
        )


def _find_hole(q: ConsumeQueue, full: bool) -> int | None:
    """The first empty entry of ``q`` with a written entry after it (its last file only
    unless ``full``), or None. Zeros before the queue's first entry are no hole (a
    queue may start at any offset, see the dispatch of scanned records)."""
    all_files = q.files.files
    files = all_files if full else all_files[-1:]
    pending = None
    for f in files:
        # Only as far as the file holds data: the never-written rest is a hole of
        # the sparse file (reading it would fault in every page for nothing).
        stop = max((hi for _lo, hi in data_ranges(f, 0)), default=0)
        count = min(q.entries_per_file, -(-stop // CQ_ENTRY_DTYPE.itemsize))
        sizes = np.frombuffer(f.mm, dtype=CQ_ENTRY_DTYPE, count=count)["size"]
        written = np.flatnonzero(sizes)
        base = f.start_offset // CQ_ENTRY_DTYPE.itemsize
        if pending is not None and len(written):
            return pending
        lead = int(written[0]) if f is all_files[0] and len(written) else 0
        zeros = np.flatnonzero(sizes[lead:] == 0)
        if len(zeros):
            z = lead + int(zeros[0])
        elif count < q.entries_per_file:
            z = count
        else:
            continue  # a full file
        if len(written) and int(written[-1]) > z:
            return base + z
        if pending is None:
            pending = base + z
    return None


def _written_end(q: ConsumeQueue) -> int:
    """One past the last written entry of ``q``, holes or not."""
    for f in reversed(q.files.files):
        sizes = np.frombuffer(f.mm, dtype=CQ_ENTRY_DTYPE, count=q.entries_per_file)["size"]
        written = np.flatnonzero(sizes)
        if len(written):
            return f.start_offset // CQ_ENTRY_DTYPE.itemsize + int(written[-1]) + 1
    return 0

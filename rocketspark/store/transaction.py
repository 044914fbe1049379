"""Transactional (half) messages: prepare, commit, rollback and the check.

As in RocketMQ: a prepared message is stored in ``RMQ_SYS_TRANS_HALF_TOPIC``
queue 0 with REAL_TOPIC / REAL_QID / ``__transactionId__``, invisible to
consumers of its topic. Commit writes the message again to its real topic
(SYSFLAG COMMIT, PREPARED TRANSACTION OFFSET = the half record's offset) and an
op record to ``RMQ_SYS_TRANS_OP_HALF_TOPIC``; rollback writes only the op
record. An op record has tag ``d`` and a body listing the half queue offsets it
resolves, comma-separated (RocketMQ 5 batches them the same way).

Resolution is exactly-once: it runs under the store's write lock after reading
every op record written so far, so resolving a half message twice (a retried
Spark commit, two processes racing) writes nothing the second time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from rocketspark.errors import ConfigError, OffsetOutOfRangeError, TransactionError
from rocketspark.message.byte_gather import decimal_list
from rocketspark.message.model import (
    FIRST_HALF_ERROR,
    PROPERTY_FIRST_HALF,
    PROPERTY_MOVED_TO,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_RESOLUTION,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    TRANS_OP_REMOVE_TAG,
    TRANSACTION_TYPE_MASK,
    Message,
    MessageExt,
    SysFlag,
    TransactionState,
    answer_state,
    check_extra_properties,
)
from rocketspark.message.properties import committed_properties, half_properties, properties_text
from rocketspark.store.half_commit import final_columns
from rocketspark.store.half_resolution import (
    OFFSET_SEPARATOR,
    HalfState,
    ResolutionTable,
    op_offsets,
    sorted_unique,
)

if TYPE_CHECKING:
    from rocketspark.message.columns import Columns
    from rocketspark.message.record import HostAddress
    from rocketspark.message.results import PutResult, PutResults
    from rocketspark.store.appender import Appender
    from rocketspark.store.commit_log import CommitLog, PreparedRecord
    from rocketspark.store.consume_queue import ConsumeQueue, ConsumeQueues
    from rocketspark.store.encoder import Encoder
    from rocketspark.store.metadata import ConsumerOffsetTable
    from rocketspark.store.topic_config import TopicConfigTable

log = logging.getLogger(__name__)

# Our op records also say how they resolved the halves (PROPERTY_RESOLUTION, message
# model; RocketMQ ignores the property; its own op records lack it, and then the
# direction is unknown).
RESOLUTION_COMMIT = "commit"
RESOLUTION_ROLLBACK = "rollback"
# A check's put-back closes the old copies of UNKNOWN halves with an op record of
# this resolution; PROPERTY_MOVED_TO holds the first new copy's half queue offset
# (the copies follow in the order of the op's offsets). Ours: RocketMQ reads the
# op as "removed".
RESOLUTION_PUT_BACK = "putback"
# PROPERTY_FIRST_HALF (message.py), on a put-back copy: the queue offset of the half its
# producer was given. Ours, not RocketMQ's TRAN_PREPARED_QUEUE_OFFSET: a broker reads
# that one (with a check immunity time) as "done when that offset has an op record",
# which ours has.
FEW_RESOLVED = 64  # resolved halves in one end() that are looked for among put-back copies
CHECK_GROUP = "CID_RMQ_SYS_TRANS"  # RocketMQ's consumer group for the half queue
DEFAULT_PRODUCER_GROUP = "rocketspark"
OP_CHUNK = 16384  # half offsets per op record (RocketMQ 5 also batches them)
PROGRESS_LAG = 1 << 20  # resolved halves kept above the check progress (_advance_progress)


HalfStatus = Literal["open", "committed", "rolled_back", "resolved"]
# What a check does with a half answered UNKNOWN: store it again with its check count
# raised (RocketMQ's check), or leave it where it is (a producer asking about its own).
UnknownHalves = Literal["put_back", "keep"]
_STATUS: dict[int, HalfStatus] = {
    HalfState.OPEN: "open",
    HalfState.COMMITTED: "committed",
    HalfState.ROLLED_BACK: "rolled_back",
    HalfState.RESOLVED: "resolved",
}


class TransactionService:
    """Half messages of one open store, given the store's parts it needs.

    RocketMQ's TransactionalMessageBridge: records are encoded by ``encoder``
    and appended through ``appender`` (its write lock serialises resolutions
    across processes), halves and ops are read through ``queues`` and
    ``commit_log``, and the check progress is kept in ``offsets`` under
    CHECK_GROUP. ``born_host`` is this process's host (the committed records'
    BORNHOST); ``timeout_ms`` and ``max_checks`` are the store's
    transactionTimeOut and transactionCheckMax.
    """

    def __init__(
        self,
        *,
        appender: Appender,
        encoder: Encoder,
        queues: ConsumeQueues,
        commit_log: CommitLog,
        topics: TopicConfigTable,
        offsets: ConsumerOffsetTable,
        clock: Callable[[], int],
        born_host: HostAddress,
        timeout_ms: int,
        max_checks: int,
    ):
        self.appender = appender
        self.encoder = encoder
        self.queues = queues
        self.commit_log = commit_log
        self.topics = topics
        self.offsets = offsets
        self.clock = clock
        self.born_host = born_host
        self.timeout_ms = timeout_ms
        self.max_checks = max_checks
        # One byte per half queue offset, its HalfState. A dict would cost ~100 bytes a half.
        self._resolved = ResolutionTable()
        # Next op queue offset to read: starts where the persisted progress says every
        # earlier op only resolves halves below the half progress (both in
        # consumerOffset.json under CHECK_GROUP, as RocketMQ's check service keeps them).
        self._op_read: int | None = None
        self._op_spans: list[tuple[int, int]] = []  # (op offset, largest half it resolves)
        self._moved: dict[int, int] = {}  # a put-back half -> its copy (MOVED halves)

    # -- prepare ---------------------------------------------------------------------

    def prepare(
        self,
        messages: Sequence[Message],
        *,
        producer_group: str,
        extra_properties: dict[str, str] | None = None,
    ) -> list[PutResult]:
        """Store ``messages`` as half messages; they stay invisible until committed."""
        encoder = self.encoder
        check_extra_properties(extra_properties)
        encoder.ensure_system_topic(TRANS_HALF_TOPIC, 1)
        encoder.ensure_system_topic(TRANS_OP_HALF_TOPIC, 1)
        now = self.clock()
        ids = encoder.ids.next_ids(len(messages), now)
        prepared = []
        for msg, uid in zip(messages, ids, strict=True):
            if msg.delay_level:
                raise TransactionError("transactional messages cannot have a delay level")
            if PROPERTY_FIRST_HALF in msg.properties:
                raise ConfigError(f"message {FIRST_HALF_ERROR}")
            rec = encoder.message(msg, now, uid)  # validates, picks the real queue
            props = msg.all_properties()
            props.setdefault(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, uid)
            # The properties a commit drops come last: a committed record's
            # properties are then a prefix of its half's (see end()).
            props = half_properties(
                props,
                producer_group=producer_group,
                real_topic=rec.topic,
                real_queue_id=rec.queue_id,
                extra=extra_properties,
            )
            prepared.append(
                encoder.record(
                    TRANS_HALF_TOPIC,
                    0,
                    msg.body,
                    props,
                    now,
                    flag=msg.flag,
                    born_timestamp=msg.born_timestamp or now,
                    reconsume_times=msg.reconsume_times,
                )
            )
        return self.appender.append_records(prepared, now)

    def prepare_columns(
        self,
        cols: Columns,
        *,
        producer_group: str,
        extra_properties: Mapping[str, str] | None = None,
    ) -> PutResults:
        """Store the rows of ``cols`` as half messages (the columnar prepare)."""
        encoder = self.encoder
        encoder.ensure_system_topic(TRANS_HALF_TOPIC, 1)
        encoder.ensure_system_topic(TRANS_OP_HALF_TOPIC, 1)
        check_extra_properties(extra_properties)
        extra = properties_text(extra_properties or {})
        if not encoder.columnar:
            return self.prepare(  # type: ignore[return-value]
                cols.messages(),
                producer_group=producer_group,
                extra_properties=dict(extra_properties or {}),
            )
        now = self.clock()
        encoded = encoder.columns(cols, now, (producer_group, extra))
        return self.appender.append_columns(encoded, now)

    # -- commit / rollback -----------------------------------------------------------------

    def end(self, half_offsets: Iterable[int], commit: bool) -> Sequence[PutResult]:
        """Commit (or roll back) the half messages at these half-queue offsets.

        Already resolved the same way: skipped (idempotent). Resolved the other
        way: TransactionError, and nothing is written. Returns the committed
        records' results.
        """
        wanted = sorted_unique(
            half_offsets
            if isinstance(half_offsets, np.ndarray)
            else np.fromiter((int(o) for o in half_offsets), dtype=np.int64)
        )
        if not len(wanted):
            return []
        now = self.clock()
        appender = self.appender
        with appender.locked() as append:
            self._read_ops()
            states = self._resolved.get_many(wanted)
            put_back = (states == HalfState.MOVED.value) | (states == HalfState.RESOLVED.value)
            if bool(put_back.any()):
                # Halves a check put back: the transaction lives on in the copy.
                wanted = sorted_unique(self._live(wanted, states))
                states = self._resolved.get_many(wanted)
            other = HalfState.ROLLED_BACK if commit else HalfState.COMMITTED
            clash = np.flatnonzero(states == other.value)
            if len(clash):
                off = int(wanted[clash[0]])
                raise TransactionError(
                    f"half message at offset {off} was already "
                    f"{'committed' if not commit else 'rolled back'}; cannot "
                    f"{'commit' if commit else 'roll back'} it"
                )
            todo = wanted[states == HalfState.OPEN.value]
            if not len(todo):
                return []
            half_cq = self.queues.queue(TRANS_HALF_TOPIC, 0)
            entries = _read_entries(half_cq, todo)
            how = RESOLUTION_COMMIT if commit else RESOLUTION_ROLLBACK
            ops = [
                self._op_record(todo[i : i + OP_CHUNK], how, now)
                for i in range(0, len(todo), OP_CHUNK)
            ]
            finals: Sequence[PutResult] = []
            if commit:
                # Final records and op records go in ONE append: a crash between them
                # would leave committed copies whose halves still look open, which a
                # recovering sink would commit again (test_crash saw exactly that when
                # they were two appends). One append is all or nothing (_recover).
                batch = (
                    final_columns(entries, self.commit_log, self.encoder.topic_info, self.born_host)
                    if self.encoder.columnar
                    else None
                )
                if batch is not None:
                    columns, uniq_prefix, uniq_start, uniq_given, keyed, keys, hashes = batch
                    finals, op_results = append.columns(
                        columns,
                        now,
                        uniq_prefix,
                        uniq_start,
                        uniq_given,
                        keyed,
                        keys,
                        then=ops,
                        uniq_hashes=hashes,
                    )
                else:
                    prepared = [
                        self._final_record(self.commit_log.read(int(phy)), now)
                        for phy in entries["offset"].tolist()
                    ]
                    results = append.records(prepared + ops, now)
                    finals, op_results = results[: len(prepared)], results[len(prepared) :]
            else:
                op_results = append.records(ops, now)
            self._resolved.set_many(todo, HalfState.COMMITTED if commit else HalfState.ROLLED_BACK)
            self._note_ops(op_results, todo)
            self._op_read = self.queues.queue(TRANS_OP_HALF_TOPIC, 0).max_offset()
            half_end = half_cq.max_offset()
        if half_end - self._resolved.floor > PROGRESS_LAG:
            self._advance_progress(half_end - PROGRESS_LAG)
        appender.after(op_results)
        return appender.after(finals) if len(finals) else finals

    def _op_record(
        self, half_offsets: np.ndarray, resolution: str, now: int, **more: str
    ) -> PreparedRecord:
        return self.encoder.record(
            TRANS_OP_HALF_TOPIC,
            0,
            decimal_list(half_offsets, OFFSET_SEPARATOR.encode()),
            {PROPERTY_TAGS: TRANS_OP_REMOVE_TAG, PROPERTY_RESOLUTION: resolution, **more},
            now,
        )

    def _final_record(self, half: MessageExt, now: int) -> PreparedRecord:
        topic, qid, props = committed_properties(half.properties)
        if topic is None:
            raise TransactionError(
                f"half message at commit log offset {half.commitlog_offset} has no REAL_TOPIC"
            )
        sys_flag = (half.sys_flag & ~TRANSACTION_TYPE_MASK) | SysFlag.TRANSACTION_COMMIT
        return self.encoder.record(
            topic,
            int(qid),
            half.body,
            props,
            now,
            sys_flag=sys_flag,
            flag=half.flag,
            born_timestamp=half.born_timestamp,
            reconsume_times=half.reconsume_times,
            prepared_offset=half.commitlog_offset,
            born_host=half.born_host,
        )

    def _start(self) -> int:
        if self._op_read is None:
            offsets = self.offsets
            self._resolved.floor = offsets.query(CHECK_GROUP, TRANS_HALF_TOPIC, 0) or 0
            self._op_read = offsets.query(CHECK_GROUP, TRANS_OP_HALF_TOPIC, 0) or 0
        return self._op_read

    def _advance_progress(self, upto: int) -> None:
        """Move the check progress over the resolved halves at its front, up to ``upto``.

        Without this, only open_transactions() and the check step move it, and
        every process that opens the store reads each op record written since
        (a batch df.write commits without either). Halves below the progress
        read "resolved" rather than how, so it stays PROGRESS_LAG halves behind.
        """
        floor = self._resolved.floor
        if upto <= floor:
            return
        states = self._resolved.get_many(np.arange(floor, upto, dtype=np.int64))
        still_open = np.flatnonzero(states == HalfState.OPEN.value)
        progress = floor + int(still_open[0]) if len(still_open) else upto
        if progress > floor:
            self._commit_progress(progress)

    def _commit_progress(self, progress: int) -> None:
        """Record that every half below ``progress`` is resolved (and which ops to skip)."""
        op_progress = self._start()
        for op_offset, max_half in self._op_spans:
            if max_half >= progress:
                op_progress = op_offset
                break
        self._op_spans = [sp for sp in self._op_spans if sp[0] >= op_progress]
        self._resolved.floor = max(self._resolved.floor, progress)
        self.offsets.commit_many(
            CHECK_GROUP, {(TRANS_HALF_TOPIC, 0): progress, (TRANS_OP_HALF_TOPIC, 0): op_progress}
        )

    def _note_ops(self, op_results: Sequence[PutResult], todo: np.ndarray) -> None:
        """Remember ops this process wrote (they are not read back)."""
        for k, r in enumerate(op_results):
            last = min((k + 1) * OP_CHUNK, len(todo)) - 1
            self._op_spans.append((r.queue_offset, int(todo[last])))

    def _read_ops(self) -> None:
        """Learn every op record written since the last look (by any process)."""
        if not self._has_topic(TRANS_OP_HALF_TOPIC):
            return
        self._start()
        assert self._op_read is not None
        cq = self.queues.queue(TRANS_OP_HALF_TOPIC, 0)
        end = cq.max_offset()
        while self._op_read < end:
            entries = cq.read(self._op_read, min(end - self._op_read, 4096))
            if not len(entries):
                break
            for k, phy in enumerate(entries["offset"].tolist()):
                op = self.commit_log.read(int(phy))
                if op.tags != TRANS_OP_REMOVE_TAG:
                    continue
                how = op.properties.get(PROPERTY_RESOLUTION)
                done = op_offsets(op.body)
                moved_to = op.properties.get(PROPERTY_MOVED_TO, "")
                if how == RESOLUTION_PUT_BACK and moved_to.isdigit():
                    self._note_moves(np.sort(done), int(moved_to))
                else:
                    self._resolved.set_open(
                        done,
                        HalfState.RESOLVED
                        if how is None
                        else HalfState.COMMITTED
                        if how == RESOLUTION_COMMIT
                        else HalfState.ROLLED_BACK,
                    )
                if len(done):
                    self._op_spans.append((self._op_read + k, int(done.max())))
            self._op_read += len(entries)

    def status(self, half_offset: int) -> HalfStatus:
        """Return "committed", "rolled_back", "resolved" (by a RocketMQ op) or "open"."""
        with self.appender.write_lock:
            self._read_ops()
            offsets = np.asarray([half_offset], dtype=np.int64)
            states = self._resolved.get_many(offsets)
            # A put-back half: its live copy says.
            if states[0] in (HalfState.MOVED, HalfState.RESOLVED):
                state = self._resolved.get(int(self._live(offsets, states)[0]))
            else:
                state = int(states[0])
            return _STATUS[state]

    def _has_topic(self, topic: str) -> bool:
        return self.topics.get(topic) is not None

    def _scan(self) -> tuple[ConsumeQueue, int, int, np.ndarray]:
        """Catch up with every op written so far; return the half queue, the check
        progress, the half queue's end and the open halves between them, ascending."""
        with self.appender.locked():
            self._read_ops()
        half_cq = self.queues.queue(TRANS_HALF_TOPIC, 0)
        start = self.offsets.query(CHECK_GROUP, TRANS_HALF_TOPIC, 0) or 0
        end = half_cq.max_offset()
        offsets = np.arange(start, max(start, end), dtype=np.int64)
        offsets = offsets[self._resolved.get_many(offsets) == HalfState.OPEN.value]
        return half_cq, start, end, offsets

    def open_halves(
        self, producer_group: str | None = None, exclude: np.ndarray | None = None
    ) -> list[MessageExt]:
        """Return the half messages not yet committed or rolled back, oldest first.

        With ``producer_group``, only that group's; halves at the offsets in
        ``exclude`` are skipped without being read. Scans from where the check
        step last got to, and moves that mark past every resolved half.
        """
        if not self._has_topic(TRANS_HALF_TOPIC):
            return []
        half_cq, start, end, offsets = self._scan()
        if end <= start:
            return []
        # Everything below the first open half is resolved: later scans (and the
        # check step) start there.
        progress = int(offsets[0]) if len(offsets) else end
        if progress > start:
            self._commit_progress(progress)
        if exclude is not None and len(exclude):
            offsets = offsets[~np.isin(offsets, exclude)]
        out = []
        for off in offsets.tolist():
            entry = half_cq.entry(off)
            if entry is None:
                break
            half = self.commit_log.read(entry[0])
            if (
                producer_group is None
                or half.properties.get(PROPERTY_PRODUCER_GROUP) == producer_group
            ):
                out.append(half)
        return out

    # -- check -------------------------------------------------------------------------

    def check(
        self,
        callback: Callable[[MessageExt], TransactionState | str | bool | None],
        *,
        now_ms: int | None = None,
        timeout_ms: int | None = None,
        max_checks: int | None = None,
        producer_group: str | None = None,
        immediately: bool = False,
        unknown: UnknownHalves = "put_back",
        in_flight: np.ndarray | None = None,
    ) -> dict[str, int]:
        """Resolve open half messages through ``callback``: RocketMQ's check-back.

        ``callback(half_message)`` answers COMMIT / ROLLBACK / UNKNOWN (or True /
        False / None) for each half left open longer than ``timeout_ms``
        (transactionTimeOut), oldest first. UNKNOWN puts the half back with
        TRANSACTION_CHECK_TIMES raised; after ``max_checks`` (transactionCheckMax,
        15) it is rolled back unasked ("discarded"). Returns counts by outcome.

        A producer deciding its own halves (the exactly-once sink over its
        ledger) narrows the check: ``producer_group`` asks about that group's
        halves only, ``immediately`` about every open half now whatever its age,
        and ``unknown="keep"`` leaves a half answered UNKNOWN where it is (no
        copy, no check count, so it is never discarded). Halves at the offsets
        in ``in_flight`` (ones the caller knows to be undecided, e.g. the batch
        it is committing) are left open without being read or asked.

        The check progress moves over every half below the first one the check
        leaves open; with ``unknown="keep"`` (as open_halves) only over those
        resolved before it ran, so the halves it resolves keep their exact
        status (not "resolved") until a later step moves past them.
        """
        if unknown not in ("put_back", "keep"):
            raise ConfigError(f"unknown must be 'put_back' or 'keep', got {unknown!r}")
        now = self.clock() if now_ms is None else now_ms
        timeout = self.timeout_ms if timeout_ms is None else timeout_ms
        limit = self.max_checks if max_checks is None else max_checks
        counts = {"commit": 0, "rollback": 0, "unknown": 0, "discarded": 0}
        if not self._has_topic(TRANS_HALF_TOPIC):
            return counts
        half_cq, start, end, offsets = self._scan()
        keep = unknown == "keep"
        first_open = int(offsets[0]) if len(offsets) else end
        if keep and first_open > start:
            self._commit_progress(first_open)
        # The new check progress: the first half this check leaves open, or where it
        # stopped reading (every half below it is then resolved).
        progress = end
        if in_flight is not None and len(in_flight) and len(offsets):
            flying = np.isin(offsets, in_flight)
            if bool(flying.any()):
                progress = int(offsets[np.argmax(flying)])
                offsets = offsets[~flying]
        to_commit: list[int] = []
        to_rollback: list[int] = []
        put_back: list[MessageExt] = []
        for off in offsets.tolist():
            if self._resolved.get(off) != HalfState.OPEN:
                continue  # resolved by the callback meanwhile (through this process)
            entry = half_cq.entry(off)
            if entry is None:
                progress = min(progress, off)
                break
            half = self.commit_log.read(entry[0])
            if not immediately and half.store_timestamp + timeout > now:
                progress = min(progress, off)
                break  # later halves are younger still
            if (
                producer_group is not None
                and half.properties.get(PROPERTY_PRODUCER_GROUP) != producer_group
            ):
                progress = min(progress, off)
                continue
            checks = int(half.properties.get(PROPERTY_TRANSACTION_CHECK_TIMES, "0") or 0)
            if unknown == "put_back" and checks >= limit:
                to_rollback.append(off)
                counts["discarded"] += 1
                log.warning("half message %s checked %d times; rolled back", half.msg_id, checks)
                continue
            answer = answer_state(callback(half))
            if answer is TransactionState.COMMIT:
                to_commit.append(off)
                counts["commit"] += 1
            elif answer is TransactionState.ROLLBACK:
                to_rollback.append(off)
                counts["rollback"] += 1
            else:
                counts["unknown"] += 1
                if keep:
                    progress = min(progress, off)
                else:
                    put_back.append(half)
        if to_commit:
            self.end(to_commit, True)
        if to_rollback:
            self.end(to_rollback, False)
        if put_back:
            self._put_back(put_back)
        if not keep and progress > start:
            self._commit_progress(progress)
        return counts

    def _put_back(self, halves: list[MessageExt]) -> None:
        """Store UNKNOWN halves again with the check count raised, then close the old ones.

        Under the write lock, halves another process resolved since the check
        read them (a producer's commit while the callback ran) are left alone;
        the new copies and the op record closing the old ones are one append,
        so a crash leaves both copies or neither (never two open copies). Each
        copy carries its first half's offset (RS_FIRST_HALF), and the old
        copies read "moved": a producer's commit or rollback of the half it
        was given goes to the live copy.
        """
        now = self.clock()
        prepared = {}
        for h in halves:
            props = dict(h.properties)
            props[PROPERTY_TRANSACTION_CHECK_TIMES] = str(
                int(props.get(PROPERTY_TRANSACTION_CHECK_TIMES, "0") or 0) + 1
            )
            props.setdefault(PROPERTY_FIRST_HALF, str(h.queue_offset))
            prepared[h.queue_offset] = self.encoder.record(
                TRANS_HALF_TOPIC,
                0,
                h.body,
                props,
                now,
                flag=h.flag,
                born_timestamp=h.born_timestamp,
                reconsume_times=h.reconsume_times,
            )
        with self.appender.locked() as append:
            self._read_ops()
            old = np.asarray(sorted(prepared), dtype=np.int64)
            old = old[self._resolved.get_many(old) == HalfState.OPEN.value]
            if not len(old):
                return
            first_new = append.next_queue_offset(TRANS_HALF_TOPIC, 0)
            op = self._op_record(
                old, RESOLUTION_PUT_BACK, now, **{PROPERTY_MOVED_TO: str(first_new)}
            )
            results = append.records([prepared[o] for o in old.tolist()] + [op], now)
            results, op_results = results[:-1], results[-1:]
            assert results[0].queue_offset == first_new, (results[0], first_new)
            self._note_moves(old, first_new)
            self._note_ops(op_results, old)
            self._op_read = self.queues.queue(TRANS_OP_HALF_TOPIC, 0).max_offset()
        self.appender.after(results)

    def _note_moves(self, old: np.ndarray, first_new: int) -> None:
        self._resolved.set_many(old, HalfState.MOVED)
        for k, o in enumerate(old.tolist()):
            self._moved[o] = first_new + k

    def _live(self, offsets: np.ndarray, states: np.ndarray) -> np.ndarray:
        """``offsets`` with each put-back half replaced by its live copy.

        Moved halves this process knows follow their copies. Halves read
        "resolved" (below the check progress, where no state is kept) go to an
        open copy that names them as its first half, if one exists: found by
        reading the open halves, so only for a producer's few offsets (up to
        FEW_RESOLVED), not for a sink batch's thousands.
        """
        out = offsets.copy()
        for i in np.flatnonzero(states == HalfState.MOVED.value).tolist():
            o = int(out[i])
            while self._resolved.get(o) == HalfState.MOVED and o in self._moved:
                o = self._moved[o]
            out[i] = o
        gone = np.flatnonzero(states == HalfState.RESOLVED.value)
        if 0 < len(gone) <= FEW_RESOLVED:
            copies = self._open_copies()
            for i in gone.tolist():
                out[i] = copies.get(int(out[i]), int(out[i]))
        return out

    def _open_copies(self) -> dict[int, int]:
        """First half offset -> the open put-back copy naming it (read from the store)."""
        half_cq = self.queues.queue(TRANS_HALF_TOPIC, 0)
        start = self._resolved.floor
        offsets = np.arange(start, half_cq.max_offset(), dtype=np.int64)
        copies = {}
        for off in offsets[self._resolved.get_many(offsets) == HalfState.OPEN.value].tolist():
            entry = half_cq.entry(off)
            if entry is None:
                break
            origin = self.commit_log.read(entry[0]).properties.get(PROPERTY_FIRST_HALF)
            if origin is not None and origin.isdigit():
                copies[int(origin)] = off
        return copies


def _read_entries(cq: Any, offsets: np.ndarray) -> np.ndarray:
    """ConsumeQueue entries of ascending ``offsets``, one read per consecutive run."""
    breaks = np.flatnonzero(np.diff(offsets) != 1) + 1
    parts = []
    for run in np.split(offsets, breaks):
        first, count = int(run[0]), len(run)
        got = cq.read(first, count)
        if len(got) < count:
            raise OffsetOutOfRangeError(
                f"no half message at offset {first + len(got)} of {TRANS_HALF_TOPIC}"
            )
        parts.append(got)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)

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

import enum
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from rocketspark.errors import OffsetOutOfRangeError, TransactionError
from rocketspark.store.message import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    TRANS_OP_REMOVE_TAG,
    Message,
    MessageExt,
    SysFlag,
    transaction_type,
)

if TYPE_CHECKING:
    from rocketspark.store.commit_log import PreparedRecord
    from rocketspark.store.message_store import MessageStore, PutResult

log = logging.getLogger(__name__)

OFFSET_SEPARATOR = ","
# Our op records also say how they resolved the halves (RocketMQ ignores the property;
# its own op records lack it, and then the direction is unknown).
PROPERTY_RESOLUTION = "RS_RESOLUTION"
RESOLUTION_COMMIT = "commit"
RESOLUTION_ROLLBACK = "rollback"
CHECK_GROUP = "CID_RMQ_SYS_TRANS"  # RocketMQ's consumer group for the half queue
DEFAULT_PRODUCER_GROUP = "rocketspark"
OP_CHUNK = 16384  # half offsets per op record (RocketMQ 5 also batches them)


class TransactionState(enum.Enum):
    """What the check callback answers (LocalTransactionState)."""

    COMMIT = "COMMIT_MESSAGE"
    ROLLBACK = "ROLLBACK_MESSAGE"
    UNKNOWN = "UNKNOW"


class TransactionService:
    """Half messages of one open store."""

    def __init__(self, store: MessageStore):
        self.store = store
        # half queue offset -> True committed, False rolled back, None resolved (by a
        # RocketMQ op record that does not say how)
        self._resolved: dict[int, bool | None] = {}
        self._op_read = 0  # next op queue offset to read

    # -- prepare ---------------------------------------------------------------------

    def prepare(self, messages: Sequence[Message], *, producer_group: str,
                extra_properties: dict[str, str] | None = None) -> list[PutResult]:
        """Store ``messages`` as half messages; they stay invisible until committed."""
        store = self.store
        store._check_open()
        store._ensure_system_topic(TRANS_HALF_TOPIC, 1)
        store._ensure_system_topic(TRANS_OP_HALF_TOPIC, 1)
        now = store.clock()
        ids = store._ids.next_ids(len(messages), now)
        prepared = []
        for msg, uid in zip(messages, ids):
            if msg.delay_level:
                raise TransactionError("transactional messages cannot have a delay level")
            rec = store._prepare(msg, now, uid)  # validates, picks the real queue
            props = msg.all_properties()
            props.setdefault(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, uid)
            props[PROPERTY_TRANSACTION_PREPARED] = "true"
            props[PROPERTY_PRODUCER_GROUP] = producer_group
            props[PROPERTY_TRANSACTION_ID] = props[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX]
            props[PROPERTY_REAL_TOPIC] = rec.topic
            props[PROPERTY_REAL_QUEUE_ID] = str(rec.queue_id)
            if extra_properties:
                props.update(extra_properties)
            prepared.append(store._prepare_raw(
                TRANS_HALF_TOPIC, 0, msg.body, props, now, flag=msg.flag,
                born_timestamp=msg.born_timestamp or now, reconsume_times=msg.reconsume_times))
        return store._append(prepared, now)

    # -- commit / rollback -----------------------------------------------------------------

    def end(self, half_offsets: Iterable[int], commit: bool) -> list[PutResult]:
        """Commit (or roll back) the half messages at these half-queue offsets.

        Already resolved the same way: skipped (idempotent). Resolved the other
        way: TransactionError, and nothing is written.
        """
        store = self.store
        store._check_open()
        wanted = sorted(set(int(o) for o in half_offsets))
        if not wanted:
            return []
        now = store.clock()
        with store._write_lock:
            store._sync_with_writers()
            self._read_ops()
            todo = []
            for off in wanted:
                if off not in self._resolved:
                    todo.append(off)
                    continue
                done = self._resolved[off]
                if done is not None and done != commit:
                    raise TransactionError(
                        f"half message at offset {off} was already "
                        f"{'committed' if done else 'rolled back'}; cannot "
                        f"{'commit' if commit else 'roll back'} it")
            if not todo:
                return []
            half_cq = store._cq(TRANS_HALF_TOPIC, 0)
            prepared: list[PreparedRecord] = []
            if commit:
                for off in todo:
                    entry = half_cq.entry(off)
                    if entry is None:
                        raise OffsetOutOfRangeError(
                            f"no half message at offset {off} of {TRANS_HALF_TOPIC}")
                    prepared.append(self._final_record(store.commit_log.read(entry[0]), now))
            else:
                for off in todo:
                    if half_cq.entry(off) is None:
                        raise OffsetOutOfRangeError(
                            f"no half message at offset {off} of {TRANS_HALF_TOPIC}")
            # One op record per OP_CHUNK offsets keeps each body far below maxMessageSize.
            ops = [self._op_record(todo[i:i + OP_CHUNK], commit, now)
                   for i in range(0, len(todo), OP_CHUNK)]
            results = store._append_locked(prepared + ops, now)
            for off in todo:
                self._resolved[off] = commit
            self._op_read = store._cq(TRANS_OP_HALF_TOPIC, 0).max_offset()
        return list(store._after_append(results))[:-len(ops)]

    def _op_record(self, half_offsets: list[int], commit: bool, now: int) -> PreparedRecord:
        return self.store._prepare_raw(
            TRANS_OP_HALF_TOPIC, 0, OFFSET_SEPARATOR.join(map(str, half_offsets)).encode(),
            {PROPERTY_TAGS: TRANS_OP_REMOVE_TAG,
             PROPERTY_RESOLUTION: RESOLUTION_COMMIT if commit else RESOLUTION_ROLLBACK}, now)

    def _final_record(self, half: MessageExt, now: int) -> PreparedRecord:
        store = self.store
        props = dict(half.properties)
        topic = props.pop(PROPERTY_REAL_TOPIC, None)
        qid = props.pop(PROPERTY_REAL_QUEUE_ID, "0")
        props.pop(PROPERTY_TRANSACTION_PREPARED, None)
        if topic is None:
            raise TransactionError(
                f"half message at commit log offset {half.commitlog_offset} has no REAL_TOPIC")
        sys_flag = (half.sys_flag & ~0xC) | SysFlag.TRANSACTION_COMMIT
        return store._prepare_raw(
            topic, int(qid), half.body, props, now, sys_flag=sys_flag, flag=half.flag,
            born_timestamp=half.born_timestamp, reconsume_times=half.reconsume_times,
            prepared_offset=half.commitlog_offset)

    def _read_ops(self) -> None:
        """Learn every op record written since the last look (by any process)."""
        store = self.store
        if not store.has_topic(TRANS_OP_HALF_TOPIC):
            return
        cq = store._cq(TRANS_OP_HALF_TOPIC, 0)
        end = cq.max_offset()
        while self._op_read < end:
            entries = cq.read(self._op_read, min(end - self._op_read, 4096))
            if not len(entries):
                break
            for phy in entries["offset"].tolist():
                op = store.commit_log.read(int(phy))
                if op.tags != TRANS_OP_REMOVE_TAG:
                    continue
                how = op.properties.get(PROPERTY_RESOLUTION)
                committed = None if how is None else how == RESOLUTION_COMMIT
                for part in op.body.decode("ascii", "replace").split(OFFSET_SEPARATOR):
                    part = part.strip()
                    if part.isdigit():
                        self._resolved.setdefault(int(part), committed)
            self._op_read += len(entries)

    def status(self, half_offset: int) -> str:
        """Return "committed", "rolled_back", "resolved" (by a RocketMQ op) or "open"."""
        with self.store._write_lock:
            self._read_ops()
            if half_offset not in self._resolved:
                return "open"
            done = self._resolved[half_offset]
            return "resolved" if done is None else "committed" if done else "rolled_back"

    def open_halves(self, producer_group: str | None = None) -> list[MessageExt]:
        """Return the half messages not yet committed or rolled back, oldest first.

        With ``producer_group``, only that group's. Scans from where the check
        step last got to.
        """
        store = self.store
        if not store.has_topic(TRANS_HALF_TOPIC):
            return []
        with store._write_lock:
            store._sync_with_writers()
            self._read_ops()
        half_cq = store._cq(TRANS_HALF_TOPIC, 0)
        start = store.offsets.query(CHECK_GROUP, TRANS_HALF_TOPIC, 0) or 0
        end = half_cq.max_offset()
        resolved = self._resolved
        out = []
        first_open = None
        for off in range(start, end):
            if off in resolved:
                continue
            entry = half_cq.entry(off)
            if entry is None:
                end = off
                break
            if first_open is None:
                first_open = off
            half = store.commit_log.read(entry[0])
            if producer_group is None or half.properties.get(
                    PROPERTY_PRODUCER_GROUP) == producer_group:
                out.append(half)
        # Everything below the first open half is resolved: later scans (and the
        # check step) start there.
        progress = end if first_open is None else first_open
        if progress > start:
            store.offsets.commit(CHECK_GROUP, TRANS_HALF_TOPIC, 0, progress)
        return out

    # -- check -------------------------------------------------------------------------

    def check(self, callback: Callable[[MessageExt], TransactionState | str | bool],
              *, now_ms: int | None = None, timeout_ms: int | None = None,
              max_checks: int | None = None) -> dict[str, int]:
        """Resolve half messages left open longer than ``timeout_ms`` through ``callback``.

        ``callback(half_message)`` answers COMMIT / ROLLBACK / UNKNOWN (or True /
        False / None). UNKNOWN puts the half back with TRANSACTION_CHECK_TIMES
        raised; after ``max_checks`` (transactionCheckMax, 15) it is rolled back.
        Returns counts by outcome.
        """
        store = self.store
        cfg = store.config
        now = store.clock() if now_ms is None else now_ms
        timeout = cfg.transaction_timeout if timeout_ms is None else timeout_ms
        limit = cfg.transaction_check_max if max_checks is None else max_checks
        counts = {"commit": 0, "rollback": 0, "unknown": 0, "discarded": 0}
        if not store.has_topic(TRANS_HALF_TOPIC):
            return counts
        half_cq = store._cq(TRANS_HALF_TOPIC, 0)
        with store._write_lock:
            store._sync_with_writers()
            self._read_ops()
        start = store.offsets.query(CHECK_GROUP, TRANS_HALF_TOPIC, 0) or 0
        end = half_cq.max_offset()
        progress = start
        to_commit: list[int] = []
        to_rollback: list[int] = []
        put_back: list[MessageExt] = []
        for off in range(start, end):
            if off in self._resolved:
                if progress == off:
                    progress = off + 1
                continue
            entry = half_cq.entry(off)
            if entry is None:
                break
            half = store.commit_log.read(entry[0])
            if half.store_timestamp + timeout > now:
                break  # later halves are younger still
            checks = int(half.properties.get(PROPERTY_TRANSACTION_CHECK_TIMES, "0") or 0)
            if checks >= limit:
                to_rollback.append(off)
                counts["discarded"] += 1
                log.warning("half message %s checked %d times; rolled back", half.msg_id, checks)
            else:
                answer = _state(callback(half))
                if answer is TransactionState.COMMIT:
                    to_commit.append(off)
                    counts["commit"] += 1
                elif answer is TransactionState.ROLLBACK:
                    to_rollback.append(off)
                    counts["rollback"] += 1
                else:
                    put_back.append(half)
                    counts["unknown"] += 1
            progress = off + 1
        if to_commit:
            self.end(to_commit, True)
        if to_rollback:
            self.end(to_rollback, False)
        if put_back:
            self._put_back(put_back)
        if progress > start:
            store.offsets.commit(CHECK_GROUP, TRANS_HALF_TOPIC, 0, progress)
        return counts

    def _put_back(self, halves: list[MessageExt]) -> None:
        """Store UNKNOWN halves again with the check count raised, then close the old ones."""
        store = self.store
        now = store.clock()
        old_offsets = [h.queue_offset for h in halves]
        prepared = []
        for h in halves:
            props = dict(h.properties)
            props[PROPERTY_TRANSACTION_CHECK_TIMES] = str(
                int(props.get(PROPERTY_TRANSACTION_CHECK_TIMES, "0") or 0) + 1)
            prepared.append(store._prepare_raw(
                TRANS_HALF_TOPIC, 0, h.body, props, now, flag=h.flag,
                born_timestamp=h.born_timestamp, reconsume_times=h.reconsume_times))
        with store._write_lock:
            store._sync_with_writers()
            results = store._append_locked(prepared, now)
            # The old copies are closed by an op record so they are not checked again;
            # their resolution follows the new copies.
            store._append_locked([self._op_record(old_offsets, False, now)], now)
            for off in old_offsets:
                self._resolved[off] = False
            self._op_read = store._cq(TRANS_OP_HALF_TOPIC, 0).max_offset()
        store._after_append(results)


def _state(answer: TransactionState | str | bool | None) -> TransactionState:
    if isinstance(answer, TransactionState):
        return answer
    if answer is True:
        return TransactionState.COMMIT
    if answer is False:
        return TransactionState.ROLLBACK
    if answer is None:
        return TransactionState.UNKNOWN
    text = str(answer).upper()
    if text.startswith("COMMIT"):
        return TransactionState.COMMIT
    if text.startswith("ROLLBACK"):
        return TransactionState.ROLLBACK
    return TransactionState.UNKNOWN



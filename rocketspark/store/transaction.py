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
from typing import TYPE_CHECKING, Any

import numpy as np

from rocketspark.errors import ConfigError, OffsetOutOfRangeError, TransactionError
from rocketspark.message.byte_gather import Pieces, byte_rows, decimal_list, gather_items
from rocketspark.message.java_hash import java_hash_many, java_hash_rows, java_string_hash
from rocketspark.message.model import (
    FIRST_HALF_ERROR,
    PROPERTY_FIRST_HALF,
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
    check_extra_properties,
)

if TYPE_CHECKING:
    from rocketspark.message.record import HostAddress
    from rocketspark.store.commit_log import PreparedRecord
    from rocketspark.store.message_store import MessageStore, PutResult

log = logging.getLogger(__name__)

OFFSET_SEPARATOR = ","
# Our op records also say how they resolved the halves (RocketMQ ignores the property;
# its own op records lack it, and then the direction is unknown).
PROPERTY_RESOLUTION = "RS_RESOLUTION"
RESOLUTION_COMMIT = "commit"
RESOLUTION_ROLLBACK = "rollback"
# A check's put-back closes the old copies of UNKNOWN halves with an op record of
# this resolution; PROPERTY_MOVED_TO holds the first new copy's half queue offset
# (the copies follow in the order of the op's offsets). Ours: RocketMQ reads the
# op as "removed".
RESOLUTION_PUT_BACK = "putback"
PROPERTY_MOVED_TO = "RS_MOVED_TO"
# PROPERTY_FIRST_HALF (message.py), on a put-back copy: the queue offset of the half its
# producer was given. Ours, not RocketMQ's TRAN_PREPARED_QUEUE_OFFSET: a broker reads
# that one (with a check immunity time) as "done when that offset has an op record",
# which ours has.
FEW_RESOLVED = 64  # resolved halves in one end() that are looked for among put-back copies
CHECK_GROUP = "CID_RMQ_SYS_TRANS"  # RocketMQ's consumer group for the half queue
DEFAULT_PRODUCER_GROUP = "rocketspark"
OP_CHUNK = 16384  # half offsets per op record (RocketMQ 5 also batches them)
PROGRESS_LAG = 1 << 20  # resolved halves kept above the check progress (_advance_progress)


class TransactionState(enum.Enum):
    """What the check callback answers (LocalTransactionState)."""

    COMMIT = "COMMIT_MESSAGE"
    ROLLBACK = "ROLLBACK_MESSAGE"
    UNKNOWN = "UNKNOW"


class TransactionService:
    """Half messages of one open store."""

    def __init__(self, store: MessageStore):
        self.store = store
        # One byte per half queue offset: OPEN, COMMITTED, ROLLED_BACK, MOVED (put back
        # by a check), or RESOLVED (by a RocketMQ op record that does not say how). A
        # dict would cost ~100 bytes a half.
        self._resolved = _ResolutionTable()
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
        store = self.store
        store._check_open()
        check_extra_properties(extra_properties)
        store._ensure_system_topic(TRANS_HALF_TOPIC, 1)
        store._ensure_system_topic(TRANS_OP_HALF_TOPIC, 1)
        now = store.clock()
        ids = store._ids.next_ids(len(messages), now)
        prepared = []
        for msg, uid in zip(messages, ids):
            if msg.delay_level:
                raise TransactionError("transactional messages cannot have a delay level")
            if PROPERTY_FIRST_HALF in msg.properties:
                raise ConfigError(f"message {FIRST_HALF_ERROR}")
            rec = store._prepare(msg, now, uid)  # validates, picks the real queue
            props = msg.all_properties()
            props.setdefault(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, uid)
            # The three properties a commit drops come last: a committed record's
            # properties are then a prefix of its half's (see end()).
            props[PROPERTY_PRODUCER_GROUP] = producer_group
            props[PROPERTY_TRANSACTION_ID] = props[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX]
            if extra_properties:
                props.update(extra_properties)
            props[PROPERTY_TRANSACTION_PREPARED] = "true"
            props[PROPERTY_REAL_TOPIC] = rec.topic
            props[PROPERTY_REAL_QUEUE_ID] = str(rec.queue_id)
            prepared.append(
                store._prepare_raw(
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
        return store._append(prepared, now)

    # -- commit / rollback -----------------------------------------------------------------

    def end(self, half_offsets: Iterable[int], commit: bool) -> Sequence[PutResult]:
        """Commit (or roll back) the half messages at these half-queue offsets.

        Already resolved the same way: skipped (idempotent). Resolved the other
        way: TransactionError, and nothing is written. Returns the committed
        records' results.
        """
        store = self.store
        store._check_open()
        wanted = _sorted_unique(
            half_offsets
            if isinstance(half_offsets, np.ndarray)
            else np.fromiter((int(o) for o in half_offsets), dtype=np.int64)
        )
        if not len(wanted):
            return []
        now = store.clock()
        with store._write_lock:
            store._sync_with_writers()
            self._read_ops()
            states = self._resolved.get_many(wanted)
            if bool(((states == MOVED) | (states == RESOLVED)).any()):
                # Halves a check put back: the transaction lives on in the copy.
                wanted = _sorted_unique(self._live(wanted, states))
                states = self._resolved.get_many(wanted)
            other = ROLLED_BACK if commit else COMMITTED
            clash = np.flatnonzero(states == other)
            if len(clash):
                off = int(wanted[clash[0]])
                raise TransactionError(
                    f"half message at offset {off} was already "
                    f"{'committed' if not commit else 'rolled back'}; cannot "
                    f"{'commit' if commit else 'roll back'} it"
                )
            todo = wanted[states == OPEN]
            if not len(todo):
                return []
            half_cq = store._cq(TRANS_HALF_TOPIC, 0)
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
                batch = self._final_columns(entries) if store._columnar else None
                if batch is not None:
                    columns, *index_info = batch
                    finals, op_results = store._append_columns_then_locked(
                        columns, ops, now, *index_info
                    )
                else:
                    prepared = [
                        self._final_record(store.commit_log.read(int(phy)), now)
                        for phy in entries["offset"].tolist()
                    ]
                    results = store._append_locked(prepared + ops, now)
                    finals, op_results = results[: len(prepared)], results[len(prepared) :]
            else:
                op_results = store._append_locked(ops, now)
            self._resolved.set_many(todo, COMMITTED if commit else ROLLED_BACK)
            self._note_ops(op_results, todo)
            self._op_read = store._cq(TRANS_OP_HALF_TOPIC, 0).max_offset()
            half_end = half_cq.max_offset()
        if half_end - self._resolved.floor > PROGRESS_LAG:
            self._advance_progress(half_end - PROGRESS_LAG)
        store._after_append(op_results)
        return store._after_append(finals) if len(finals) else finals

    def _final_columns(self, entries: np.ndarray) -> tuple[Any, ...] | None:
        """The committed records of halves, as a ColumnBatch (None: not our layout).

        A half whose properties end with TRAN_MSG, REAL_TOPIC, REAL_QID (as both
        prepare paths write them) commits to a record whose properties are the
        prefix before them: its bytes are gathered from the half's (byte_gather),
        never decoded and re-encoded. Returns (batch, uniq prefix, uniq start,
        UNIQ_KEYs by record, keyed records, their KEYS, index hashes of UNIQ_KEY).
        """
        from rocketspark.store.commit_log import ColumnBatch

        store = self.store
        n = len(entries)
        phys = entries["offset"].astype(np.int64)
        seg_idx = phys // store.commit_log.segment_size
        # Each run of halves in one segment, without a gap over 1 MiB between them, is
        # copied out as one region (halves far apart are not copied with all between).
        gaps = phys[1:] - (phys[:-1] + entries["size"][:-1].astype(np.int64))
        cuts = np.flatnonzero((np.diff(seg_idx) != 0) | (gaps > _REGION_GAP)) + 1
        bounds = [0, *cuts.tolist(), n]
        parts = []
        for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
            f = store.commit_log.segment(int(phys[a]))
            rel = phys[a:b] - f.start_offset
            if f.size <= _MAX_VIEW:
                # The mapped segment itself (no copy of the region: a fresh 130 MB copy
                # costs ~0.3 s in page faults here). Views are gone when end() returns;
                # a segment closed meanwhile is unmapped when they go (MappedFile.close).
                src: Any = f.mm
            else:  # byte_gather's views reach 2 GiB: copy the region out
                lo = int(rel.min())
                src = f.mm[lo : int((rel + entries["size"][a:b]).max())]
                rel = rel - lo
            part = _parse_halves(src, rel, k, a, entries["size"][a:b].astype(np.int64))
            if part is None:
                return None  # v2 records, IPv6 hosts, compressed or foreign halves
            parts.append(part)
        cat: dict[str, Any] = {}
        for key, first in parts[0].items():
            if isinstance(first, np.ndarray):
                cat[key] = first if len(parts) == 1 else np.concatenate([p[key] for p in parts])
            elif isinstance(first, list):
                cat[key] = [x for p in parts for x in p[key]]
            elif isinstance(first, dict):
                cat[key] = {i: v for p in parts for i, v in p[key].items()}
        srcs = [p["src"] for p in parts]
        topic_ids: dict[str, int] = {}
        tid_parts = []
        for p in parts:
            remap = np.asarray(
                [topic_ids.setdefault(t, len(topic_ids)) for t in p["topic_names"]], dtype=np.int64
            )
            tid_parts.append(remap[p["topic"]])
        names = list(topic_ids)
        tid = tid_parts[0] if len(tid_parts) == 1 else np.concatenate(tid_parts)
        infos = [store._topic_info(t) for t in names]
        hdr = cat["hdr"]
        seg = cat["seg"]
        plen = cat["prefix_len"]
        rests = (
            Pieces(
                [i[1] for i in infos],
                np.zeros(n, dtype=np.int64),
                np.asarray([len(i[1]) for i in infos], dtype=np.int64)[tid],
                tid if len(infos) > 1 else 0,
            ),
            Pieces.fixed(plen.astype(">u2"), 2, n),
            Pieces(srcs, cat["props_start"], plen, seg if len(srcs) > 1 else 0),
        )
        bodies = Pieces(
            srcs, cat["body_start"], hdr["body_len"].astype(np.int64), seg if len(srcs) > 1 else 0
        )
        topics: list[str] | str = names[0] if len(names) == 1 else [names[t] for t in tid.tolist()]
        magics = (
            infos[0][2]
            if len(infos) == 1
            else np.asarray([i[2] for i in infos], dtype=np.int32)[tid]
        )
        batch = ColumnBatch(
            topics=topics,
            queue_ids=cat["qid"].astype(np.int32),
            bodies=bodies,
            rests=rests,
            crcs=hdr["crc"].astype(np.int64),
            magics=magics,
            tags_codes=entries["tags"].astype(np.int64),
            born_host=store.born_host,
            born_ts=hdr["born_ts"].astype(np.int64),
            flags=hdr["flag"].astype(np.int64),
            reconsume=hdr["reconsume"].astype(np.int64),
            sys_flags=(hdr["sys_flag"].astype(np.int64) & ~0xC) | 0x8,  # TRANSACTION_COMMIT
            prepared=phys,
            born_ips=hdr["born_ip"].astype(np.int64),
            born_ports=hdr["born_port"].astype(np.int64),
        )
        # UNIQ_KEY hashes (topic#UNIQ_KEY) for the index: hashCode of "topic#" carried on
        # over the 32 ASCII characters of the key, in uint32 (Java's int overflow).
        uniq = cat["uniq"]
        fast = cat["uniq_ok"]
        topic_hash = np.asarray(
            [java_string_hash(t + "#") & 0xFFFFFFFF for t in names], dtype=np.uint32
        )
        hashes = java_hash_rows(topic_hash[tid], uniq)
        slow = np.flatnonzero(~fast)
        if len(slow):
            hashes[slow] = java_hash_many(
                [f"{names[int(tid[i])]}#{cat['uniq_text'][int(i)]}" for i in slow]
            ).view(np.uint32)
        uniq_given = _UniqAt(uniq, fast, cat["uniq_text"])
        keyed = cat["keyed"]
        key_strings = cat["key_strings"]
        return batch, "", 0, uniq_given, keyed, key_strings, hashes.view(np.int32)

    def _op_record(
        self, half_offsets: np.ndarray, resolution: str, now: int, **more: str
    ) -> PreparedRecord:
        return self.store._prepare_raw(
            TRANS_OP_HALF_TOPIC,
            0,
            decimal_list(half_offsets, OFFSET_SEPARATOR.encode()),
            {PROPERTY_TAGS: TRANS_OP_REMOVE_TAG, PROPERTY_RESOLUTION: resolution, **more},
            now,
        )

    def _final_record(self, half: MessageExt, now: int) -> PreparedRecord:
        store = self.store
        props = dict(half.properties)
        topic = props.pop(PROPERTY_REAL_TOPIC, None)
        qid = props.pop(PROPERTY_REAL_QUEUE_ID, "0")
        props.pop(PROPERTY_TRANSACTION_PREPARED, None)
        props.pop(PROPERTY_FIRST_HALF, None)  # bookkeeping of the half queue only
        if topic is None:
            raise TransactionError(
                f"half message at commit log offset {half.commitlog_offset} has no REAL_TOPIC"
            )
        sys_flag = (half.sys_flag & ~0xC) | SysFlag.TRANSACTION_COMMIT
        return store._prepare_raw(
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
            born_host=_parse_host(half.born_host),
        )

    def _start(self) -> int:
        if self._op_read is None:
            offsets = self.store.offsets
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
        still_open = np.flatnonzero(states == OPEN)
        progress = floor + int(still_open[0]) if len(still_open) else upto
        if progress > floor:
            self._commit_progress(progress)

    def _commit_progress(self, progress: int) -> None:
        """Record that every half below ``progress`` is resolved (and which ops to skip)."""
        store = self.store
        op_progress = self._start()
        for op_offset, max_half in self._op_spans:
            if max_half >= progress:
                op_progress = op_offset
                break
        self._op_spans = [sp for sp in self._op_spans if sp[0] >= op_progress]
        self._resolved.floor = max(self._resolved.floor, progress)
        store.offsets.commit_many(
            CHECK_GROUP, {(TRANS_HALF_TOPIC, 0): progress, (TRANS_OP_HALF_TOPIC, 0): op_progress}
        )

    def _note_ops(self, op_results: Sequence[PutResult], todo: np.ndarray) -> None:
        """Remember ops this process wrote (they are not read back)."""
        for k, r in enumerate(op_results):
            last = min((k + 1) * OP_CHUNK, len(todo)) - 1
            self._op_spans.append((r.queue_offset, int(todo[last])))

    def _read_ops(self) -> None:
        """Learn every op record written since the last look (by any process)."""
        store = self.store
        if not store.has_topic(TRANS_OP_HALF_TOPIC):
            return
        self._start()
        assert self._op_read is not None
        cq = store._cq(TRANS_OP_HALF_TOPIC, 0)
        end = cq.max_offset()
        while self._op_read < end:
            entries = cq.read(self._op_read, min(end - self._op_read, 4096))
            if not len(entries):
                break
            for k, phy in enumerate(entries["offset"].tolist()):
                op = store.commit_log.read(int(phy))
                if op.tags != TRANS_OP_REMOVE_TAG:
                    continue
                how = op.properties.get(PROPERTY_RESOLUTION)
                done = _op_offsets(op.body)
                moved_to = op.properties.get(PROPERTY_MOVED_TO, "")
                if how == RESOLUTION_PUT_BACK and moved_to.isdigit():
                    self._note_moves(np.sort(done), int(moved_to))
                else:
                    self._resolved.set_open(
                        done,
                        RESOLVED
                        if how is None
                        else COMMITTED
                        if how == RESOLUTION_COMMIT
                        else ROLLED_BACK,
                    )
                if len(done):
                    self._op_spans.append((self._op_read + k, int(done.max())))
            self._op_read += len(entries)

    def status(self, half_offset: int) -> str:
        """Return "committed", "rolled_back", "resolved" (by a RocketMQ op) or "open"."""
        with self.store._write_lock:
            self._read_ops()
            offsets = np.asarray([half_offset], dtype=np.int64)
            states = self._resolved.get_many(offsets)
            if states[0] in (MOVED, RESOLVED):  # a put-back half: its live copy says
                state = self._resolved.get(int(self._live(offsets, states)[0]))
            else:
                state = int(states[0])
            return {
                OPEN: "open",
                COMMITTED: "committed",
                ROLLED_BACK: "rolled_back",
                RESOLVED: "resolved",
            }[state]

    def open_halves(
        self, producer_group: str | None = None, exclude: np.ndarray | None = None
    ) -> list[MessageExt]:
        """Return the half messages not yet committed or rolled back, oldest first.

        With ``producer_group``, only that group's; halves at the offsets in
        ``exclude`` are skipped without being read. Scans from where the check
        step last got to, and moves that mark past every resolved half.
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
        if end <= start:
            return []
        offsets = np.arange(start, end, dtype=np.int64)
        offsets = offsets[self._resolved.get_many(offsets) == OPEN]
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
            half = store.commit_log.read(entry[0])
            if (
                producer_group is None
                or half.properties.get(PROPERTY_PRODUCER_GROUP) == producer_group
            ):
                out.append(half)
        return out

    # -- check -------------------------------------------------------------------------

    def check(
        self,
        callback: Callable[[MessageExt], TransactionState | str | bool],
        *,
        now_ms: int | None = None,
        timeout_ms: int | None = None,
        max_checks: int | None = None,
    ) -> dict[str, int]:
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
            if self._resolved.get(off) != OPEN:
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
        store = self.store
        now = store.clock()
        prepared = {}
        for h in halves:
            props = dict(h.properties)
            props[PROPERTY_TRANSACTION_CHECK_TIMES] = str(
                int(props.get(PROPERTY_TRANSACTION_CHECK_TIMES, "0") or 0) + 1
            )
            props.setdefault(PROPERTY_FIRST_HALF, str(h.queue_offset))
            prepared[h.queue_offset] = store._prepare_raw(
                TRANS_HALF_TOPIC,
                0,
                h.body,
                props,
                now,
                flag=h.flag,
                born_timestamp=h.born_timestamp,
                reconsume_times=h.reconsume_times,
            )
        with store._write_lock:
            store._sync_with_writers()
            self._read_ops()
            old = np.asarray(sorted(prepared), dtype=np.int64)
            old = old[self._resolved.get_many(old) == OPEN]
            if not len(old):
                return
            first_new = store._next_queue_offset(TRANS_HALF_TOPIC, 0)
            op = self._op_record(
                old, RESOLUTION_PUT_BACK, now, **{PROPERTY_MOVED_TO: str(first_new)}
            )
            results = store._append_locked([prepared[o] for o in old.tolist()] + [op], now)
            results, op_results = results[:-1], results[-1:]
            assert results[0].queue_offset == first_new, (results[0], first_new)
            self._note_moves(old, first_new)
            self._note_ops(op_results, old)
            self._op_read = store._cq(TRANS_OP_HALF_TOPIC, 0).max_offset()
        store._after_append(results)

    def _note_moves(self, old: np.ndarray, first_new: int) -> None:
        self._resolved.set_many(old, MOVED)
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
        for i in np.flatnonzero(states == MOVED).tolist():
            o = int(out[i])
            while self._resolved.get(o) == MOVED and o in self._moved:
                o = self._moved[o]
            out[i] = o
        gone = np.flatnonzero(states == RESOLVED)
        if 0 < len(gone) <= FEW_RESOLVED:
            copies = self._open_copies()
            for i in gone.tolist():
                out[i] = copies.get(int(out[i]), int(out[i]))
        return out

    def _open_copies(self) -> dict[int, int]:
        """First half offset -> the open put-back copy naming it (read from the store)."""
        store = self.store
        half_cq = store._cq(TRANS_HALF_TOPIC, 0)
        start = self._resolved.floor
        offsets = np.arange(start, half_cq.max_offset(), dtype=np.int64)
        copies = {}
        for off in offsets[self._resolved.get_many(offsets) == OPEN].tolist():
            entry = half_cq.entry(off)
            if entry is None:
                break
            origin = store.commit_log.read(entry[0]).properties.get(PROPERTY_FIRST_HALF)
            if origin is not None and origin.isdigit():
                copies[int(origin)] = off
        return copies


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


OPEN, COMMITTED, ROLLED_BACK, RESOLVED, MOVED = 0, 1, 2, 3, 4
_FINAL_MARKER = b"TRAN_MSG\x01true\x02REAL_TOPIC\x01"
_QID_SEP = b"\x02REAL_QID\x01"
_UNIQ_HEAD = b"UNIQ_KEY\x01"
_TXN_HEAD = b"__transactionId__\x01"
UNIQ_HEX_LEN = 32  # the UNIQ_KEYs we (and RocketMQ's clients) generate
_ROWS = 16384  # rows per block of a 2-D byte comparison
_REGION_GAP = 1 << 20
_MAX_VIEW = (1 << 31) - 1  # segments up to this size are gathered from in place


def _rows_equal(
    buf: np.ndarray, at: np.ndarray, template: bytes, mask: np.ndarray | None = None
) -> np.ndarray:
    """Per row: do the bytes at ``at`` equal ``template`` (where ``mask`` is True)?"""
    width = len(template)
    t = np.frombuffer(template, dtype=np.uint8)
    out = np.zeros(len(at), dtype=bool)
    if len(buf) < width:
        return out
    inside = (at >= 0) & (at + width <= len(buf))
    safe = np.where(inside, at, 0)
    win = byte_rows(buf, width)
    for c in range(0, len(at), _ROWS):
        block = win[safe[c : c + _ROWS]] == t
        if mask is not None:
            block |= ~mask
        out[c : c + _ROWS] = block.all(axis=1)
    return out & inside


def _differs_rows(rows: np.ndarray, other: np.ndarray) -> bool:
    """Does any row of the 2-D byte array ``rows`` differ from ``other``'s (one row: from it)?

    Compared a block of rows at a time (numpy compares uint8 rows 3-6x faster
    than raw void items of 10-70 bytes, which it takes one by one).
    """
    for c in range(0, len(rows), _ROWS):
        part = other if len(other) == 1 else other[c : c + _ROWS]
        if bool((rows[c : c + _ROWS] != part).any()):
            return True
    return False


def _learn_uniq_template(p: bytes) -> tuple[bytes, np.ndarray, int, int] | None:
    """From one committed prefix, the fixed tail our prepare paths give every half.

    ``UNIQ_KEY=<32>`` ``PGROUP=<group>`` ``__transactionId__=<same 32>`` then the
    caller's extra properties, up to the end of the prefix. Returns (template,
    mask of its fixed bytes, position of each 32-character slot), or None.
    """
    j = p.rfind(b"\x02" + _TXN_HEAD)
    if j < 0:
        return None
    u_end = j + 1 + len(_TXN_HEAD) + UNIQ_HEX_LEN
    uniq = p[j + 1 + len(_TXN_HEAD) : u_end]
    if len(uniq) != UNIQ_HEX_LEN or p[u_end : u_end + 1] != b"\x02" or b"\x02" in uniq:
        return None
    extra = p[u_end + 1 :]
    k = p.rfind(b"\x02PGROUP\x01", 0, j)
    if k < 0:
        return None
    group = p[k + 8 : j]
    if b"\x02" in group or p[k - UNIQ_HEX_LEN - len(_UNIQ_HEAD) : k] != _UNIQ_HEAD + uniq:
        return None
    slot = b"\x00" * UNIQ_HEX_LEN
    template = b"".join(
        (_UNIQ_HEAD, slot, b"\x02PGROUP\x01", group, b"\x02", _TXN_HEAD, slot, b"\x02", extra)
    )
    first = len(_UNIQ_HEAD)
    second = first + UNIQ_HEX_LEN + 8 + len(group) + 1 + len(_TXN_HEAD)
    mask = np.ones(len(template), dtype=bool)
    mask[first : first + UNIQ_HEX_LEN] = False
    mask[second : second + UNIQ_HEX_LEN] = False
    return template, mask, first, second


def _property(p: bytes, name: bytes) -> str | None:
    """The value of property ``name`` in encoded properties ``p`` (None: absent)."""
    lead = b"\x02" + p
    at = lead.find(b"\x02" + name + b"\x01")
    if at < 0:
        return None
    at += len(name) + 2
    end = lead.find(b"\x02", at)
    return lead[at : end if end >= 0 else len(lead)].decode("utf-8")


def _parse_halves(
    src: bytes, rel: np.ndarray, seg_no: int, base: int, sizes: np.ndarray
) -> dict[str, Any] | None:
    """Where each half's committed record comes from (None: not our layout).

    Halves of a few layouts (a sink's batch) are checked and read layout by
    layout (:func:`_parse_layouts`); anything else half by half
    (:func:`_parse_each`).
    """
    parsed = _parse_layouts(src, rel, seg_no, base, sizes)
    if parsed is None:
        parsed = _parse_each(src, rel, seg_no, base)
        if parsed is not None:
            del parsed["head_end"], parsed["qid_digits"]  # the layout parser's own
    return parsed


_MAX_LAYOUTS = 16  # record sizes in one region the layout parser takes on


def _parse_layouts(
    src: bytes, rel: np.ndarray, seg_no: int, base: int, sizes: np.ndarray
) -> dict[str, Any] | None:
    """:func:`_parse_each`'s result for halves of a few layouts, one per record size; or None.

    A sink's halves come from a few prepare calls, each writing one layout:
    the same properties but the UNIQ_KEY, the transaction id (the same 32
    characters) and the REAL_QID digits, whose count makes the sizes differ.
    The first half of each size is parsed by :func:`_parse_each`, which gives
    the layout; every other half of that size must have the same BODYLENGTH
    and, after the body, the same bytes but in those slots: compared as one
    raw item a half per byte range (a memcmp each). Then its UNIQ_KEY and
    REAL_QID are read from the slots. Any half that does not hold sends the
    region to :func:`_parse_each`.
    """
    from rocketspark.message.record import HEADER_V4, HEADER_V4_DTYPE, MESSAGE_MAGIC_CODE

    m = len(rel)
    if m < 2 or len(sizes) != m:
        return None
    buf = np.frombuffer(src, dtype=np.uint8)
    if int(rel.min()) < 0 or int((rel + sizes).max()) > len(buf):
        return None
    kinds, which = np.unique(sizes, return_inverse=True)
    if len(kinds) > _MAX_LAYOUTS:
        return None
    hdr = gather_items(buf, rel, HEADER_V4_DTYPE)
    if (
        np.any(hdr["magic"] != MESSAGE_MAGIC_CODE)
        or np.any(hdr["sys_flag"] & 0x31)
        or np.any(hdr["total"] != sizes)
    ):
        return None  # the slots are found from each record's end: TOTALSIZE must agree
    body_len = hdr["body_len"].astype(np.int64)
    qid = np.empty(m, dtype=np.int64)
    uniq = np.empty((m, UNIQ_HEX_LEN), dtype=np.uint8)
    topic = np.empty(m, dtype=np.int64)
    prefix_len = np.empty(m, dtype=np.int64)
    props_start = np.empty(m, dtype=np.int64)
    names: list[str] = []
    keyed = np.zeros(m, dtype=bool)
    key_of: list[str] = [""] * len(kinds)
    for g in range(len(kinds)):
        rows = np.flatnonzero(which == g) if len(kinds) > 1 else np.arange(m)
        i0 = int(rows[0])
        first = _parse_each(src, rel[i0 : i0 + 1], seg_no, base + i0)
        if first is None or not first["uniq_ok"][0]:
            return None
        r0, size = int(rel[i0]), int(kinds[g])
        body_end = HEADER_V4.size + int(body_len[i0])
        lead = int(first["props_start"][0] + first["prefix_len"][0]) - r0
        head_end = int(first["head_end"][0]) - r0
        learned = _learn_uniq_template(src[int(first["props_start"][0]) : r0 + lead])
        if learned is None:
            return None
        template, _mask, u_first, u_second = learned
        if head_end != lead - len(template):
            return None
        digits = int(first["qid_digits"][0])
        u1, u2 = head_end + u_first, head_end + u_second
        q1 = size - 1 - digits
        slots = sorted([(u1, u1 + UNIQ_HEX_LEN), (u2, u2 + UNIQ_HEX_LEN), (q1, q1 + digits)])
        if slots[0][0] < body_end or slots[-1][1] > size:
            return None
        if bool((body_len[rows] != body_len[i0]).any()):
            return None
        at_rows = rel[rows]
        at = body_end
        for lo, hi in [*slots, (size, size)]:
            if lo < at:
                return None  # overlapping slots: not the layout we write
            at = hi
        u1, u2, q1 = u1 - body_end, u2 - body_end, q1 - body_end
        width = size - body_end
        scale = 10 ** np.arange(digits - 1, -1, -1, dtype=np.int64)
        like = None
        for c in range(0, len(rows), _ROWS):
            # Every byte after the body, a block of halves at a time: one pass over
            # them (a gather per byte range was a pass each), into a block that
            # stays in cache (a whole-batch copy costs its page faults).
            tail = gather_items(buf, at_rows[c : c + _ROWS] + body_end, np.dtype((np.void, width)))
            tail = tail.view(np.uint8).reshape(-1, width)
            block = tail[:, u1 : u1 + UNIQ_HEX_LEN]
            if _differs_rows(block, tail[:, u2 : u2 + UNIQ_HEX_LEN]) or bool(
                ((block >= 128) | (block == 2)).any()
            ):
                return None
            qd = tail[:, q1 : q1 + digits].astype(np.int64) - 48
            if bool(((qd < 0) | (qd > 9)).any()):
                return None
            part = rows[c : c + _ROWS]
            qid[part] = qd @ scale
            uniq[part] = block
            for lo in (u1, u2, q1):  # every byte but the slots: as in the first half
                tail[:, lo : lo + (digits if lo == q1 else UNIQ_HEX_LEN)] = 0
            if like is None:
                like = tail[:1].copy()
            if _differs_rows(tail, like):
                return None
        name = first["topic_names"][0]
        if name not in names:
            names.append(name)
        topic[rows] = names.index(name)
        prefix_len[rows] = first["prefix_len"][0]
        props_start[rows] = at_rows + (int(first["props_start"][0]) - r0)
        if first["keyed"]:
            keyed[rows] = True
            key_of[g] = first["key_strings"][0]
    hits = np.flatnonzero(keyed)
    return {
        "src": src,
        "hdr": hdr,
        "seg": np.full(m, seg_no, dtype=np.int64),
        "body_start": rel + HEADER_V4.size,
        "props_start": props_start,
        "prefix_len": prefix_len,
        "qid": qid,
        "topic": topic,
        "topic_names": names,
        "uniq": uniq,
        "uniq_ok": np.ones(m, dtype=bool),
        "uniq_text": {},
        "keyed": (hits + base).tolist(),
        "key_strings": [key_of[g] for g in which[hits].tolist()],
    }


def _parse_each(src: bytes, rel: np.ndarray, seg_no: int, base: int) -> dict[str, Any] | None:
    """Find, in numpy, where each half's committed record comes from (None: not ours).

    ``src`` holds the halves' bytes, ``rel`` their offsets in it. Per half:
    the body, the properties prefix to keep (everything before TRAN_MSG),
    REAL_TOPIC and REAL_QID, and its 32-character UNIQ_KEY when it sits in
    the fixed tail both prepare paths write. Only halves with KEYS (or an
    unusual layout) are looked at one by one.
    """
    from rocketspark.message.record import HEADER_V4, HEADER_V4_DTYPE, MESSAGE_MAGIC_CODE

    buf = np.frombuffer(src, dtype=np.uint8)
    m = len(rel)
    header = HEADER_V4.size
    hdr = gather_items(buf, rel, HEADER_V4_DTYPE)
    if np.any(hdr["magic"] != MESSAGE_MAGIC_CODE) or np.any(hdr["sys_flag"] & 0x31):
        return None  # v2 records, IPv6 hosts or compressed bodies: the record path
    body_start = rel + header
    body_end = body_start + hdr["body_len"].astype(np.int64)
    if np.any(body_end + 3 > len(buf)):
        return None
    plen_at = body_end + 1 + buf[body_end].astype(np.int64)
    props_start = plen_at + 2
    props_end = props_start + ((buf[plen_at].astype(np.int64) << 8) | buf[plen_at + 1])
    if np.any(props_end > len(buf)) or np.any(props_end <= props_start):
        return None
    last = props_end - 1
    if np.any(buf[last] != 2):
        return None
    # REAL_QID: the digits before the last \x02, read backwards.
    digits = np.zeros(m, dtype=np.int64)
    qid = np.zeros(m, dtype=np.int64)
    going = np.ones(m, dtype=bool)
    scale = 1
    for j in range(1, 7):
        at = last - j
        c = buf[np.maximum(at, 0)].astype(np.int64)
        dig = going & (at >= props_start) & (c >= 48) & (c <= 57)
        qid += np.where(dig, (c - 48) * scale, 0)
        digits += dig
        going = dig
        scale *= 10
    if np.any(digits == 0) or np.any(going):
        return None
    topic_end = last - digits - len(_QID_SEP)
    if not _rows_equal(buf, topic_end, _QID_SEP).all():
        return None
    # REAL_TOPIC: learn each distinct topic from its first half, compare the rest.
    topic = np.full(m, -1, dtype=np.int64)
    lead = np.zeros(m, dtype=np.int64)
    names: list[str] = []
    todo = np.arange(m)
    while len(todo):
        i0 = int(todo[0])
        cut = src.rfind(_FINAL_MARKER, int(props_start[i0]), int(topic_end[i0]))
        if cut < 0:
            return None
        real = src[cut + len(_FINAL_MARKER) : int(topic_end[i0])]
        template = _FINAL_MARKER + real
        at = topic_end[todo] - len(template)
        ok = (at >= props_start[todo]) & _rows_equal(buf, at, template)
        if not ok[0]:
            return None
        try:
            names.append(real.decode("utf-8"))
        except UnicodeDecodeError:
            return None
        topic[todo[ok]] = len(names) - 1
        lead[todo[ok]] = at[ok]
        todo = todo[~ok]
    prefix_len = lead - props_start
    if np.any((prefix_len > 0) & (buf[np.maximum(lead - 1, 0)] != 2)):
        return None  # the prefix would not end on a whole property
    # UNIQ_KEY: the fixed tail of the prefix, learned from one half and compared.
    uniq = np.zeros((m, UNIQ_HEX_LEN), dtype=np.uint8)
    uniq_ok = np.zeros(m, dtype=bool)
    head_end = lead.copy()  # where the properties before UNIQ_KEY end
    todo = np.arange(m)
    tries = 0
    while len(todo) and tries < 8:
        tries += 1
        i0 = int(todo[0])
        learned = _learn_uniq_template(src[int(props_start[i0]) : int(lead[i0])])
        if learned is None:
            todo = todo[1:]
            continue
        template, mask, first, second = learned
        at = lead[todo] - len(template)
        ok = (at >= props_start[todo]) & _rows_equal(buf, at, template, mask)
        ok &= (at == props_start[todo]) | (buf[np.maximum(at - 1, 0)] == 2)
        rows, at = todo[ok], at[ok]
        win = byte_rows(buf, UNIQ_HEX_LEN)
        one = win[at + first]
        good = (
            (one == win[at + second]).all(axis=1) & (one < 128).all(axis=1) & (one != 2).all(axis=1)
        )
        uniq[rows[good]] = one[good]
        uniq_ok[rows[good]] = True
        head_end[rows[good]] = at[good]
        todo = todo[~uniq_ok[todo]]
        if len(todo) and todo[0] == i0:
            todo = todo[1:]  # its own template failed it: one by one
    # One by one: halves with properties before UNIQ_KEY (user properties, tags,
    # keys) for their KEYS, and halves whose UNIQ_KEY the template did not cover.
    uniq_text: dict[int, str] = {}
    keyed: list[int] = []
    key_strings: list[str] = []
    for i in np.flatnonzero((head_end > props_start) | ~uniq_ok).tolist():
        p = src[int(props_start[i]) : int(head_end[i])]
        if not uniq_ok[i]:
            uniq_text[base + i] = _property(p, b"UNIQ_KEY") or ""
        keys = _property(p, b"KEYS")
        if keys:
            keyed.append(base + i)
            key_strings.append(keys)
    return {
        "src": src,
        "hdr": hdr,
        "seg": np.full(m, seg_no, dtype=np.int64),
        "body_start": body_start,
        "props_start": props_start,
        "prefix_len": prefix_len,
        "qid": qid,
        "topic": topic,
        "topic_names": names,
        "uniq": uniq,
        "uniq_ok": uniq_ok,
        "uniq_text": uniq_text,
        "keyed": keyed,
        "key_strings": key_strings,
        "head_end": head_end,
        "qid_digits": digits,
    }


class _UniqAt:
    """UNIQ_KEY of each committed record, decoded only when a PutResult asks."""

    def __init__(self, uniq: np.ndarray, ok: np.ndarray, text: dict[int, str]):
        self._uniq, self._ok, self._text = uniq, ok, text

    def get(self, i: int, default: str | None = None) -> str | None:
        if self._ok[i]:
            return self._uniq[i].tobytes().decode("ascii")
        return self._text.get(i, default)

    def __bool__(self) -> bool:
        return True


class _ResolutionTable:
    """How each half queue offset was resolved, one byte per offset.

    Offsets below ``floor`` (the persisted check progress) are resolved even
    when this process never read the op that says how.
    """

    def __init__(self) -> None:
        self._b = np.zeros(0, dtype=np.uint8)
        self.floor = 0

    def _grow(self, upto: int) -> None:
        if upto > len(self._b):
            bigger = np.zeros(max(upto, 2 * len(self._b), 1024), dtype=np.uint8)
            bigger[: len(self._b)] = self._b
            self._b = bigger

    def get(self, off: int) -> int:
        state = int(self._b[off]) if 0 <= off < len(self._b) else OPEN
        return RESOLVED if state == OPEN and off < self.floor else state

    def get_many(self, offs: np.ndarray) -> np.ndarray:
        out = np.zeros(len(offs), dtype=np.uint8)
        inside = offs < len(self._b)
        out[inside] = self._b[offs[inside]]
        out[(out == OPEN) & (offs < self.floor)] = RESOLVED
        return out

    def set_many(self, offs: np.ndarray, state: int) -> None:
        if len(offs):
            self._grow(int(offs.max()) + 1)
            self._b[offs] = state

    def set_open(self, offs: np.ndarray, state: int) -> None:
        """Set ``state`` where nothing is recorded yet (the first op record wins)."""
        if len(offs):
            a = np.asarray(offs, dtype=np.int64)
            self._grow(int(a.max()) + 1)
            a = a[self._b[a] == OPEN]
            self._b[a] = state


def _op_offsets(body: bytes) -> np.ndarray:
    """The half queue offsets an op record's body lists ("12,13,14").

    Parsed in numpy; a body with anything but digits and separators (RocketMQ
    writes none) is parsed leniently, item by item, skipping what is not a number.
    """
    text = body.strip()
    if not text:
        return np.empty(0, dtype=np.int64)
    if (
        text.replace(b",", b"").isdigit()
        and b",," not in text
        and text[:1] != b","
        and text[-1:] != b","
    ):
        # digits between single separators: numpy's text parser (~12 ns an offset)
        return np.fromstring(text.decode("ascii"), dtype=np.int64, sep=",")
    return np.array(
        [
            int(p)
            for p in body.decode("ascii", "replace").split(OFFSET_SEPARATOR)
            if p.strip().isdigit()
        ],
        dtype=np.int64,
    )


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """np.unique for int arrays, without its hash table (slow at 500k values here)."""
    values = np.asarray(values, dtype=np.int64)
    if len(values) < 2 or bool(np.all(values[1:] > values[:-1])):
        return values  # already ascending: the sink's runs are
    values = np.sort(values)
    keep = np.ones(len(values), dtype=bool)
    keep[1:] = values[1:] != values[:-1]
    return values[keep]


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


def _parse_host(text: str) -> HostAddress:
    from rocketspark.message.record import HostAddress

    host, _, port = text.rpartition(":")
    return HostAddress.parse(host.strip("[]"), int(port))

"""The dispatcher: CommitLog records -> ConsumeQueue entries and index entries.

RocketMQ's CommitLogDispatcher (DispatchRequest -> ConsumeQueue + IndexService).
One path for every way a record reaches the queues: a live append (records,
columns, a single put), the catch-up after another writer died before it
dispatched (``Appender.sync``) and recovery's scan. The
ConsumeQueue tags code has one rule (:func:`queue_tags_code`), so live and
rebuilt queues hold the same bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from rocketspark.message.java_hash import (
    hex_suffixed_hash,
    java_hash_hex_suffixed,
    java_hash_many,
    java_string_hash,
    tags_code,
)
from rocketspark.message.model import (
    PROPERTY_DELAY_TIME_LEVEL,
    SCHEDULE_TOPIC,
    TRANS_HALF_TOPIC,
    SysFlag,
    transaction_type,
)
from rocketspark.message.record import RECORD_INVALID, RecordCheck
from rocketspark.store.commit_log import (
    SMALL_BATCH,
    Appended,
    ColumnBatch,
    CommitLog,
    Placement,
    PreparedRecord,
)
from rocketspark.store.consume_queue import ConsumeQueues
from rocketspark.store.index_service import IndexService

log = logging.getLogger(__name__)


def queue_tags_code(topic: str, tags: int, delay_ms: int, store_ts: int) -> int:
    """Return the ConsumeQueue tags code of a record.

    For SCHEDULE_TOPIC_XXXX with a delay level, the delivery time (store
    time + the level's delay, ``delay_ms`` > 0); otherwise ``tags``, the tags
    hashCode. RocketMQ's ``CommitLog.checkMessageAndReturnSize`` rule.
    """
    return store_ts + delay_ms if delay_ms and topic == SCHEDULE_TOPIC else tags


class Dispatcher:
    """CommitLog records -> ConsumeQueue and index entries; live, catch-up and recovery alike.

    ``queues`` opens the ConsumeQueues, says whether a record's queue may exist
    and keeps which queues hold entries not yet flushed.
    ``gaps`` (queue -> first missing entry) collects the queues a scan found
    entries missing in, for recovery to rebuild.
    """

    def __init__(
        self,
        *,
        root: str,
        commit_log: CommitLog,
        index: IndexService,
        queues: ConsumeQueues,
        delay_ms: Sequence[int],
    ):
        self.root = root
        self.commit_log = commit_log
        self.index = index
        self.queues = queues
        self.queue = queues.queue
        self.delay_ms = list(delay_ms)
        self.gaps: dict[tuple[str, int], int] = {}
        self._uniq_hash_cache: list[object] = [None, 0]

    # -- live appends ------------------------------------------------------------

    def records(
        self, prepared: Sequence[PreparedRecord], placed: Sequence[Appended], store_ts: int
    ) -> None:
        """Dispatch records appended at ``placed`` (one entry per record of ``prepared``)."""
        groups: dict[tuple[str, int], tuple[int, list[int], list[int], list[int]]] = {}
        index_topics: list[str] = []
        index_uniq: list[str | None] = []
        index_keys: list[tuple[str, ...]] = []
        index_phy: list[int] = []
        code_of = queue_tags_code
        for r, a in zip(prepared, placed, strict=False):
            if r.dispatch:
                key = (r.topic, r.queue_id)
                g = groups.get(key)
                if g is None:
                    g = groups[key] = (a.queue_offset, [], [], [])
                g[1].append(a.physical_offset)
                g[2].append(a.size)
                g[3].append(code_of(r.topic, r.tags_code, r.delay_ms, store_ts))
            if transaction_type(r.sys_flag) != SysFlag.TRANSACTION_ROLLBACK and (
                r.uniq_key or r.keys
            ):
                index_topics.append(r.topic)
                index_uniq.append(r.uniq_key)
                index_keys.append(r.keys)
                index_phy.append(a.physical_offset)
        for key, (first, offs, sizes, tags) in groups.items():
            self.queue(*key).put(first, offs, sizes, tags)
            self.queues.mark_dirty(key, first)
        if index_phy:
            self.index.build_index_batch(
                index_topics, index_uniq, index_keys, index_phy, [store_ts] * len(index_phy)
            )

    def one(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        pos: int,
        size: int,
        code: int,
        store_ts: int,
        uniq_prefix: str,
        counter: int,
        own_uniq: str | None,
        keys: Sequence[str],
    ) -> None:
        """Dispatch the one record of a single put (no delay; generated or own UNIQ_KEY)."""
        # Hot path: every single put. Plain ints, no numpy.
        self.queue(topic, queue_id).put(queue_offset, (pos,), (size,), (code,))
        self.queues.mark_dirty((topic, queue_id), queue_offset)
        hashes = [
            hex_suffixed_hash(self.uniq_hash_base(topic, uniq_prefix), counter)
            if own_uniq is None
            else java_string_hash(f"{topic}#{own_uniq}")
        ]
        hashes += [java_string_hash(f"{topic}#{k}") for k in keys]
        self.index.put_hashes(hashes, [pos] * len(hashes), [store_ts] * len(hashes))

    def columns(
        self,
        batch: ColumnBatch,
        placed: Placement,
        store_ts: int,
        uniq_prefix: str,
        uniq_start: int,
        uniq_given: Mapping[int, str],
        keyed: list[int],
        key_strings: list[str],
        uniq_hashes: np.ndarray | None = None,
    ) -> None:
        """Dispatch a columnar append: one ConsumeQueue write per queue, then the index."""
        for topic, qid, idx in placed.groups:
            first = int(placed.queue_offsets[idx[0]])
            self.queue(topic, qid).put(
                first, placed.phys[idx], placed.sizes[idx], batch.tags_codes[idx]
            )
            self.queues.mark_dirty((topic, qid), first)
        self.index_columns(
            batch,
            placed,
            store_ts,
            uniq_prefix,
            uniq_start,
            uniq_given,
            keyed,
            key_strings,
            uniq_hashes,
        )

    def index_columns(
        self,
        batch: ColumnBatch,
        placed: Placement,
        store_ts: int,
        uniq_prefix: str,
        uniq_start: int,
        uniq_given: Mapping[int, str],
        keyed: list[int],
        key_strings: list[str],
        uniq_hashes: np.ndarray | None = None,
    ) -> None:
        """Index topic#UNIQ_KEY then topic#key of each record, in record order.

        ``uniq_hashes``: the topic#UNIQ_KEY hashCodes, when the caller has them.
        """
        n = len(batch)
        if uniq_hashes is not None:
            hashes = uniq_hashes
        elif n <= SMALL_BATCH and not keyed and not uniq_given:
            hashes_small = []
            for i in range(n):
                base = self.uniq_hash_base(batch.topic_of(i), uniq_prefix)
                hashes_small.append(hex_suffixed_hash(base, uniq_start + i))
            self.index.put_hashes(hashes_small, placed.phys.tolist(), [store_ts] * n)
            return
        else:
            counters = uniq_start + np.arange(n, dtype=np.int64)
            if isinstance(batch.topics, str):
                hashes = java_hash_hex_suffixed(f"{batch.topics}#{uniq_prefix}", counters)
            else:
                hashes = np.empty(n, dtype=np.int32)
                topics_arr = np.asarray(batch.topics, dtype=object)
                for t in set(batch.topics):
                    sel = np.flatnonzero(topics_arr == t)
                    hashes[sel] = java_hash_hex_suffixed(f"{t}#{uniq_prefix}", counters[sel])
        owners = np.arange(n, dtype=np.int64)
        if uniq_given and uniq_hashes is None:
            at = np.fromiter(uniq_given, dtype=np.int64, count=len(uniq_given))
            hashes[at] = java_hash_many(
                [f"{batch.topic_of(int(i))}#{uniq_given[int(i)]}" for i in at]
            )
        if keyed:
            strings: list[str] = []
            owner_list: list[int] = []
            for i, joined in zip(keyed, key_strings, strict=False):
                prefix = batch.topic_of(i) + "#"
                parts = [prefix + k for k in joined.split(" ") if k]
                strings.extend(parts)
                owner_list.extend([i] * len(parts))
            key_owner = np.asarray(owner_list, dtype=np.int64)
            # Each record's UNIQ_KEY entry comes before its key entries.
            owners = np.concatenate((owners, key_owner))
            order = np.argsort(
                owners * 2
                + np.concatenate(
                    (np.zeros(n, dtype=np.int64), np.ones(len(key_owner), dtype=np.int64))
                ),
                kind="stable",
            )
            hashes = np.concatenate((hashes, java_hash_many(strings)))[order]
            owners = owners[order]
        self.index.put_hashes(
            hashes, placed.phys[owners], np.full(len(owners), store_ts, dtype=np.int64)
        )

    def uniq_hash_base(self, topic: str, uniq_prefix: str) -> int:
        """hashCode of ``topic#<uniq_prefix>``, cached: it changes once a millisecond."""
        key = (topic, uniq_prefix)
        cached = self._uniq_hash_cache
        if cached[0] != key:
            cached[:] = [key, java_string_hash(f"{topic}#{uniq_prefix}") & 0xFFFFFFFF]
        return cached[1]  # type: ignore[return-value]

    # -- records read back from the CommitLog (catch-up, recovery) ------------------

    def level_delay(self, check: RecordCheck) -> int:
        """The delay of a scanned SCHEDULE_TOPIC_XXXX record's level (0: none).

        As RocketMQ: a level above the last counts as the last; no level, a
        level below 1 or one that is not a number: no delay (the tags code).
        """
        if check.topic != SCHEDULE_TOPIC:
            return 0
        text = (check.properties or {}).get(PROPERTY_DELAY_TIME_LEVEL)
        try:
            level = int(text) if text is not None else 0
        except ValueError:
            return 0
        if level <= 0:
            return 0
        return self.delay_ms[min(level, len(self.delay_ms)) - 1]

    def queue_code(self, check: RecordCheck) -> int:
        """The ConsumeQueue tags code of a scanned record (see :func:`queue_tags_code`)."""
        return queue_tags_code(
            check.topic, tags_code(check.tags), self.level_delay(check), check.store_timestamp
        )

    def scan(
        self,
        start: int,
        end: int | None,
        *,
        index_from: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> tuple[int, str]:
        """Rebuild ConsumeQueue and index entries from CommitLog records in [start, end).

        With ``end`` None, goes on until the data ends (recovery) and returns
        where the last valid record ends and why the scan stopped. From
        ``index_from`` (when before ``start``) records are only indexed again.
        """
        scan_from = start if index_from is None else min(start, index_from)
        pos = scan_from
        reason = ""
        for pos, check in self.commit_log.scan(scan_from, verify_crc=True):
            if end is not None and pos >= end:
                break
            if check.size <= 0:
                if check.size == RECORD_INVALID:
                    reason = check.reason
                break
            if progress is not None:
                progress(pos)
            self.scanned(pos, check, queues=pos >= start, reindex_from=index_from)
        else:  # pragma: no cover - scan always ends with an END/INVALID check
            pass
        return pos, reason

    def scanned(
        self,
        pos: int,
        check: RecordCheck,
        *,
        queues: bool = True,
        reindex_from: int | None = None,
    ) -> None:
        """Dispatch the verified record at CommitLog ``pos`` what its queue and index lack.

        ``queues`` False: index it only.
        """
        tran = transaction_type(check.sys_flag)
        key = (check.topic, check.queue_id)
        if queues and key not in self.queues and not self.queues.may_have(*key):
            # QUEUEID is outside every check (BODYCRC covers the body only): a flipped
            # bit there must not make a queue the topic does not have.
            log.error(
                "store %s: the record at CommitLog %d names queue %d of %r, which "
                "the topic does not have; not dispatched",
                self.root,
                pos,
                check.queue_id,
                check.topic,
            )
            queues = False
        if queues and tran in (0, SysFlag.TRANSACTION_COMMIT):
            q = self.queue(*key)
            have = q.max_offset()
            if key in self.gaps:
                pass  # rebuilt from its first missing entry (recovery's queue rebuild)
            elif (
                check.queue_offset > have
                and check.topic != TRANS_HALF_TOPIC
                and have > 0
                and q.entry(have - 1) is not None
            ):
                # Entries missing before this record: a hole (a put refused after it
                # took its queue offset), or entries lost. Never written at its own
                # offset: an empty entry would hide it and every later one. (A queue
                # with no entry yet starts at the record's offset, as RocketMQ's does:
                # the records before it may have expired.)
                log.warning(
                    "ConsumeQueue %s/%d: entries %d to %d missing before the record "
                    "at CommitLog %d; rebuilding the queue",
                    check.topic,
                    check.queue_id,
                    have,
                    check.queue_offset - 1,
                    pos,
                )
                self.gaps[key] = have
            elif check.queue_offset >= have:
                q.put(check.queue_offset, [pos], [check.size], [self.queue_code(check)])
                self.queues.mark_dirty(key, check.queue_offset)
        if tran != SysFlag.TRANSACTION_ROLLBACK and (check.uniq_key or check.keys):
            keys = tuple(k for k in (check.keys or "").split(" ") if k)
            self.index.build_index_batch(
                [check.topic],
                [check.uniq_key],
                [keys],
                [pos],
                [check.store_timestamp],
                reindex_from=reindex_from,
            )

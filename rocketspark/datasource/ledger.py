"""The exactly-once sink's ledger and commit protocol, over a :class:`~rocketspark.client.Client`.

Per streaming query ("sink id"):

1. Every task writes its rows as half messages (invisible to consumers) tagged
   with the sink id (RS_SINK), and reports the half-queue offset runs it wrote
   and the streaming query's id (Spark's, kept in the checkpoint): a
   :class:`SinkCommit`.
2. :func:`commit_batch` on the driver: if the ledger says this batch id, or a
   later one, is committed already by the same query, the batch is a replay
   after a restart and its halves are rolled back. Otherwise the ledger
   records the batch as pending with its runs, the halves are committed, and
   the ledger records the batch as committed. A query id other than the
   ledger's means the checkpoint was replaced (deleted, or a new query at the
   same location): its batch ids start again, so the ledger's are not compared.
3. :func:`abort_batch` rolls the halves back.
4. Before each commit (or abort), a pending batch left by a crash between 2's
   steps is committed (:func:`finish_pending`), and every other open half of
   this sink is decided by :func:`sink_answer`: Spark runs one micro-batch at a
   time, so nothing else of the sink can be in flight.

**One answer for open halves.** A half of this sink is answered from the
ledger: COMMIT if its batch is the one the ledger has pending (it was decided
before a crash), UNKNOWN while it is in flight (the batch being committed),
ROLLBACK otherwise (a failed task attempt, a batch never committed, a killed
run). The client runs that function: the embedded backend now, over the
group's open halves; a cluster's broker through its CHECK_TRANSACTION_STATE
check-backs, for halves older than its transaction timeout. Nothing here lists
open halves itself.

**Where the ledger lives: behind the Client** (``client.sink_ledger()``). The
embedded backend keeps it in the store, as before: ``config/rocketsparkSinks.json``
written as RocketMQ writes its config JSON (tmp, fsync, rename, under a file
lock), with the batch jobs' files beside it, so the sink's speed and files do
not change. A remote backend keeps it where every process of a job reaches it
on a cluster: a ledger topic of the same RocketMQ, one message per ``begin``
and ``finish`` keyed by the sink id (sent SYNC, read newest first through
QUERY_MESSAGE by key). A batch job's gate becomes a "job ended" record in that
topic, which a task looks for before each chunk; a chunk that races the end
is left to the broker's check-back, whose answer for a half of an ended job
that no commit covers is ROLLBACK. It is not a file under the query's
checkpointLocation: that needs an object-store client, and a batch write has
no checkpoint.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from pyspark.sql.datasource import WriterCommitMessage

from rocketspark.client import Answer, Client, Halves, MessageExt, TransactionState
from rocketspark.message.model import PROPERTY_FIRST_HALF, PROPERTY_SINK_ID, PROPERTY_WRITER_ID
from rocketspark.message.results import offset_runs

if TYPE_CHECKING:  # pragma: no cover
    from rocketspark.datasource.sink import SinkPlan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SinkCommit(WriterCommitMessage):
    """What one task wrote: half-queue offset runs [start, end), the message count and
    the streaming query's id (None: a batch write)."""

    runs: tuple[tuple[int, int], ...]
    count: int
    query: str | None = None
    # A cluster's: what ending the halves needs (per broker), and the task attempt's
    # writer id, which its halves carry (RS_WRITER) for the brokers' check-backs.
    halves: tuple[Halves, ...] = ()
    writer: str = ""


def default_producer_group(sink_id: str) -> str:
    """The producer group of a sink's transactions unless the producerGroup option says."""
    return f"rocketspark-sink-{sink_id}"


def _offsets(messages: Sequence[WriterCommitMessage | None]) -> np.ndarray:
    return _run_offsets(_runs(messages))


def _run_offsets(runs: Sequence[tuple[int, int]]) -> np.ndarray:
    if not runs:
        return np.empty(0, dtype=np.int64)
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in runs])


def _runs(messages: Sequence[WriterCommitMessage | None]) -> list[tuple[int, int]]:
    return [r for m in messages if isinstance(m, SinkCommit) for r in m.runs]


def _query(messages: Sequence[WriterCommitMessage | None]) -> str | None:
    return next((m.query for m in messages if isinstance(m, SinkCommit) and m.query), None)


def _first_half(half: MessageExt) -> int:
    """The half-queue offset the sink was given for ``half`` (a check may have put it
    back as a copy, which names its first half)."""
    first = half.properties.get(PROPERTY_FIRST_HALF)
    return int(first) if first is not None and first.isdigit() else half.queue_offset


def sink_answer(sink_id: str, pending: Sequence[tuple[int, int]], in_flight: np.ndarray) -> Answer:
    """The sink's answer for one of its open halves: COMMIT if the ledger has its batch
    pending, UNKNOWN while it is in flight (or not this sink's), ROLLBACK otherwise.

    ``pending``: the ledger's pending runs; ``in_flight``: the half-queue
    offsets of the batch being committed or aborted.
    """
    runs = sorted(pending)
    starts = [a for a, _ in runs]
    flying: list[np.ndarray] = []  # sorted when first asked: a commit mostly asks nothing

    def answer(half: MessageExt) -> TransactionState:
        if half.properties.get(PROPERTY_SINK_ID) != sink_id:
            return TransactionState.UNKNOWN  # another sink's, sharing the producer group
        off = _first_half(half)
        i = bisect_right(starts, off) - 1
        if i >= 0 and off < runs[i][1]:
            return TransactionState.COMMIT
        if not flying:
            flying.append(np.sort(in_flight))
        j = int(np.searchsorted(flying[0], off))
        if j < len(flying[0]) and flying[0][j] == off:
            return TransactionState.UNKNOWN
        return TransactionState.ROLLBACK

    return answer


def finish_pending(plan: SinkPlan) -> np.ndarray:
    """Commit a batch the ledger shows half-committed (a crash inside ``commit``).

    Returns the half-queue offsets it committed (none: nothing was pending).
    Its halves are never rolled back before this runs (``roll_back_orphans``
    comes after it), so they are still open or already committed.
    """
    client = plan.client.connect()
    ledger = client.sink_ledger()
    _, pending = ledger.get(plan.sink_id)
    if pending is None:
        return np.empty(0, dtype=np.int64)
    batch_id, runs = pending
    offsets = _run_offsets(runs)
    log.warning(
        "sink %s: finishing the commit of batch %d (%d messages) left by a crash",
        plan.sink_id,
        batch_id,
        len(offsets),
    )
    if len(offsets):
        client.end_transactions(_offset_halves(plan, offsets), commit=True)
    ledger.finish(plan.sink_id, batch_id, ledger.pending_query(plan.sink_id))
    return offsets


def roll_back_orphans(plan: SinkPlan, keep: np.ndarray) -> int:
    """Decide this sink's open halves other than ``keep`` by :func:`sink_answer`.

    Called when a batch commits or aborts: Spark runs one micro-batch at a
    time, so any other open half of this sink comes from a task attempt that
    failed, a batch that was never committed, or a run that was killed.
    Returns how many were rolled back.
    """
    client = plan.client.connect()
    _, pending = client.sink_ledger().get(plan.sink_id)
    answer = sink_answer(plan.sink_id, pending[1] if pending else (), keep)
    counts = client.check_transactions(plan.producer_group, answer, in_flight=keep)
    if counts["rollback"]:
        log.warning(
            "sink %s: rolled back %d half messages that no batch committed",
            plan.sink_id,
            counts["rollback"],
        )
    return counts["rollback"]


def roll_back_abandoned_batch_writes(
    client: Client, older_than_ms: int, *, producer_groups: Sequence[str] = ()
) -> int:
    """Roll back the open halves of batch ``df.write`` jobs older than ``older_than_ms``.

    A job whose driver died before its commit leaves its halves open (and
    invisible) for good: no later job has its sink id. Streams' halves are not
    touched (their next commit resolves them), nor other producers' (a half
    is a batch write's when its RS_SINK says ``batch-...`` and its PGROUP is
    that sink's default group, or one of ``producer_groups``: give the
    producerGroup options of batch writes that set one). A job still running
    whose halves are older than the limit fails at its commit ("already
    rolled back"), so give a limit longer than any batch write runs. Jobs
    older than the limit are ended first (``SinkLedger.end_stale_jobs``), so
    no task of those jobs writes after the halves are looked for.
    Returns how many halves were rolled back.
    """
    cutoff = client.now_ms() - older_than_ms
    client.sink_ledger().end_stale_jobs(cutoff)
    groups = frozenset(producer_groups)

    def answer(h: MessageExt) -> TransactionState:
        sink = h.properties.get(PROPERTY_SINK_ID, "")
        group = h.properties.get("PGROUP")
        if (
            sink.startswith("batch-")
            and h.store_timestamp < cutoff
            and (group == default_producer_group(sink) or group in groups)
        ):
            return TransactionState.ROLLBACK
        return TransactionState.UNKNOWN

    stale = client.check_transactions(None, answer)["rollback"]
    if stale:
        log.warning("rolled back %d half messages of batch writes that never committed", stale)
    return stale


def commit_batch(plan: SinkPlan, messages: Sequence[Any], batch_id: int) -> bool:
    """Commit one batch's halves unless the ledger has it; False for a replay."""
    if plan.client.kind == "cluster":
        return _commit_on_cluster(plan, messages, batch_id)
    client = plan.client.connect()
    finish_pending(plan)
    offsets = _offsets(messages)
    roll_back_orphans(plan, offsets)
    ledger = client.sink_ledger()
    committed, _ = ledger.get(plan.sink_id)
    query, known = _query(messages), ledger.query(plan.sink_id)
    if query is not None and known is not None and query != known and committed >= 0:
        log.warning(
            "sink %s: query %s commits its batch %d where query %s committed up to "
            "batch %d: a new checkpoint, whose batch ids start again",
            plan.sink_id,
            query,
            batch_id,
            known,
            committed,
        )
        committed = -1
    if batch_id <= committed:
        log.warning(
            "sink %s: batch %d was committed before (a replay after a restart); "
            "discarding its %d new half messages",
            plan.sink_id,
            batch_id,
            len(offsets),
        )
        client.end_transactions(_offset_halves(plan, offsets), commit=False)
        return False
    if len(offsets):  # an empty batch has nothing to finish after a crash
        ledger.begin(plan.sink_id, batch_id, _runs(messages), query)
        client.end_transactions(_offset_halves(plan, offsets), commit=True)
    ledger.finish(plan.sink_id, batch_id, query)
    return True


def commit_job(plan: SinkPlan, messages: Sequence[Any]) -> None:
    """Commit a batch write's halves (no ledger entry: its sink id is the job's own, so
    its other open halves are failed task attempts', rolled back first)."""
    if plan.client.kind == "cluster":
        _commit_on_cluster(plan, messages, 0, once=False)
        return
    offsets = _offsets(messages)
    roll_back_orphans(plan, offsets)
    plan.client.connect().end_transactions(_offset_halves(plan, offsets), commit=True)


def abort_batch(plan: SinkPlan, messages: Sequence[Any]) -> None:
    """Roll back a batch's halves and the sink's other open ones (not a pending batch's).

    A pending batch (its commit was cut short) is committed first: Spark may
    call abort after a commit that failed half way, or abort a replay of a
    batch whose earlier commit a crash interrupted; its halves were decided.
    """
    if plan.client.kind == "cluster":
        _abort_on_cluster(plan, messages)
        return
    client = plan.client.connect()
    done = finish_pending(plan)
    offsets = _offsets(messages)
    if len(done):
        offsets = offsets[~np.isin(offsets, done)]
    client.end_transactions(_offset_halves(plan, offsets), commit=False)
    roll_back_orphans(plan, np.empty(0, dtype=np.int64))


def _offset_halves(plan: SinkPlan, offsets: np.ndarray) -> list[Halves]:
    """An embedded store's halves at these half-queue offsets (its one half queue)."""
    if not len(offsets):
        return []
    return [Halves("", plan.producer_group, offset_runs(offsets.tolist()))]


# -- on a cluster ------------------------------------------------------------------------
#
# A cluster's halves are decided by the brokers' check-backs, answered from the ledger
# (``client/remote_ledger.py``) by :func:`cluster_answer`, in whichever process of the
# job the broker asks: halves name their writer (the task attempt, RS_WRITER), and a
# batch's finish record lists the writers it accepted. The driver ends the halves of
# the batch it commits itself (every answer awaited) between ``begin`` and ``finish``;
# a crash in between is finished by the next commit, which records the batch as
# committed and leaves its halves that were not ended to the check-backs. A broker
# asks about a half until transactionCheckMax checks (15 by default, every
# transactionCheckInterval): a query killed inside a commit must run again (or any
# process of the sink answer) before then, or the brokers discard the rest of that
# batch's halves, as they would a Java producer's.

# A writer's half born this long before a finish (the brokers' clock) that the finish
# did not accept is an orphan; later ones may be the next batch's.
ORPHAN_MARGIN_MS = 10_000


def cluster_answer(ledger: Any) -> Answer:
    """The answer to a broker's check-back from the cluster ledger: COMMIT if a
    committed batch accepted the half's writer, UNKNOWN while a batch is being
    committed or the half may belong to the next one, ROLLBACK for a writer no
    batch accepted that was born before the last finish (a failed task attempt,
    an aborted or replayed batch)."""
    from rocketspark.client.remote_ledger import accepted, finished_at

    def answer(half: MessageExt) -> TransactionState:
        sink = half.properties.get(PROPERTY_SINK_ID)
        writer = half.properties.get(PROPERTY_WRITER_ID)
        if not sink or not writer:
            return TransactionState.UNKNOWN  # not a sink's half
        entry = ledger.entry(sink)
        if accepted(entry, writer):
            return TransactionState.COMMIT
        pending = entry["pending"]
        if pending is not None and writer in pending["writers"]:
            return TransactionState.UNKNOWN  # being ended by the driver now
        done = finished_at(entry)
        if done and (sink.startswith("batch-") or half.born_timestamp < done - ORPHAN_MARGIN_MS):
            # (a batch job's sink id is its own: after its one finish, no batch of it
            # can commit a writer, however late the half was born)
            return TransactionState.ROLLBACK
        return TransactionState.UNKNOWN

    return answer


def register_answer(client: Client, producer_group: str) -> None:
    """Answer the check-backs of ``producer_group``'s halves in this process (calling it
    again replaces the answer with the same one; only a new group is a heartbeat).

    Only registered (``Client.register_answer``), not run over the open halves now as
    ``check_transactions`` does: every write task calls this, and the driver ends its
    batch's halves itself.
    """
    # A method of the Client protocol rather than a test of the backend here: both
    # backends answer it (an embedded client as a documented no-op: no broker asks it
    # back), so the Spark side needs neither a cast nor a branch on the kind.
    client.register_answer(producer_group, cluster_answer(client.sink_ledger()))


def _cluster_halves(messages: Sequence[Any]) -> list[Halves]:
    return [h for m in messages if isinstance(m, SinkCommit) for h in m.halves]


def _writers(messages: Sequence[Any]) -> list[str]:
    return [m.writer for m in messages if isinstance(m, SinkCommit) and m.writer]


def _finish_pending_on_cluster(plan: SinkPlan) -> int:
    """Record a batch left pending by a crash as committed; return the committed id."""
    ledger: Any = plan.client.connect().sink_ledger()
    committed, pending = ledger.get(plan.sink_id)
    if pending is None:
        return committed
    log.warning(
        "sink %s: finishing the commit of batch %d left by a crash (the brokers' "
        "check-backs commit its halves that were not ended)",
        plan.sink_id,
        pending[0],
    )
    ledger.finish(plan.sink_id, pending[0], ledger.pending_query(plan.sink_id))
    return int(pending[0])


def _commit_on_cluster(
    plan: SinkPlan, messages: Sequence[Any], batch_id: int, *, once: bool = True
) -> bool:
    """Commit a batch (``once``: unless the ledger has it) or a batch job's halves."""
    client = plan.client.connect()
    ledger: Any = client.sink_ledger()
    register_answer(client, plan.producer_group)
    committed = _finish_pending_on_cluster(plan)
    query, known = _query(messages), ledger.query(plan.sink_id)
    if query is not None and known is not None and query != known and committed >= 0:
        log.warning(
            "sink %s: query %s commits its batch %d where query %s committed up to "
            "batch %d: a new checkpoint, whose batch ids start again",
            plan.sink_id,
            query,
            batch_id,
            known,
            committed,
        )
        committed = -1
    halves = _cluster_halves(messages)
    if once and batch_id <= committed:
        log.warning(
            "sink %s: batch %d was committed before (a replay after a restart); "
            "discarding its %d new half messages",
            plan.sink_id,
            batch_id,
            sum(len(h) for h in halves),
        )
        client.end_transactions(halves, commit=False)
        return False
    writers = _writers(messages)
    ledger.begin(plan.sink_id, batch_id, [], query, writers)
    client.end_transactions(halves, commit=True)
    ledger.finish(plan.sink_id, batch_id, query, writers)
    return True


def _abort_on_cluster(plan: SinkPlan, messages: Sequence[Any]) -> None:
    _finish_pending_on_cluster(plan)
    plan.client.connect().end_transactions(_cluster_halves(messages), commit=False)

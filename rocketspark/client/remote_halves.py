"""A cluster's open half messages, read as a broker's transaction check reads them, and
decided now (``RemoteClient.check_transactions``).

A broker keeps its transactions in two system topics of one queue (0) each
(RocketMQ's ``TransactionalMessageBridge``):

- ``RMQ_SYS_TRANS_HALF_TOPIC``: the halves as prepared, each with PGROUP (its
  producer group), REAL_TOPIC / REAL_QID (where a commit puts it) and UNIQ_KEY.
  Before a check-back the broker stores the half again (``putBackHalfMsgQueue``:
  a copy at a new offset, its check count raised) and asks about the copy, so
  one transaction (one UNIQ_KEY) may have several copies: it is open while no
  op names any of them, and its newest copy stands for it.
- ``RMQ_SYS_TRANS_OP_HALF_TOPIC``: op messages, tag ``d``, whose body lists the
  half-queue offsets committed or rolled back, each followed by a comma
  ("12,13,14,"; ``TransactionalOpBatchService`` batches them every
  transactionOpBatchInterval, so an END shows there a moment late).

The broker's check (``TransactionalMessageServiceImpl.check``) keeps its progress
as the offsets of the consumer group ``CID_RMQ_SYS_TRANS`` in both queues: every
half below the half queue's progress is ended, put back as a newer copy or
discarded, and every op below the op queue's progress names only such halves.
So a transaction is open when it has a copy at or past the half progress and no op
from the op progress on names one of its copies there.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from rocketspark.client.api import Answer, MessageQueue
from rocketspark.client.remote_pull import RangeReader
from rocketspark.errors import UnknownTopicError
from rocketspark.message import arrow
from rocketspark.message.model import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    TRANS_OP_REMOVE_TAG,
    MessageExt,
    TransactionState,
)
from rocketspark.message.names import SubscriptionExpression
from rocketspark.message.record import decode_record
from rocketspark.message.results import Halves, offset_runs

if TYPE_CHECKING:  # pragma: no cover
    from rocketspark.client.remote import RemoteClient

__all__ = ["CHECK_GROUP", "EndedHalves", "check", "open_halves"]

CHECK_GROUP = "CID_RMQ_SYS_TRANS"  # the broker's check progress (MixAll.CID_SYS_RMQ_TRANS)
HALF_QUEUE = 0  # the one queue of each transaction topic (its op queue has the same id)
OP_SEPARATOR = b","
# How long this client takes a half it ended for ended, whatever the op queue says yet
# (it lags by transactionOpBatchInterval, 3 s by default, more under load).
ENDED_MEMORY_SECONDS = 60.0


class EndedHalves:
    """The halves this client ended lately, by (broker, half-queue offset)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ended: deque[tuple[float, Sequence[Halves]]] = deque()

    def note(self, halves: Sequence[Halves]) -> None:
        now = time.monotonic()
        with self._lock:
            self._ended.append((now, halves))
            self._forget(now)

    def recent(self) -> set[tuple[str, int]]:
        with self._lock:
            self._forget(time.monotonic())
            noted = [hs for _, hs in self._ended]
        return {(h.broker, o) for hs in noted for h in hs for o in h.offsets().tolist()}

    def _forget(self, now: float) -> None:
        while self._ended and self._ended[0][0] < now - ENDED_MEMORY_SECONDS:
            self._ended.popleft()


def open_halves(
    client: RemoteClient, producer_group: str | None = None
) -> list[tuple[str, MessageExt]]:
    """(broker, half) for every open half (of ``producer_group``) on the cluster's masters.

    Each half is the newest copy of its transaction, as stored in the half topic
    (its topic RMQ_SYS_TRANS_HALF_TOPIC, its queue offset the half queue's); by
    broker name, then half-queue offset.
    """
    try:
        route = client.remoting.route(TRANS_HALF_TOPIC, refresh=True)
    except UnknownTopicError:
        return []  # no broker of the cluster has stored a half yet
    return [
        (broker, half)
        for broker in sorted(route.masters())
        for half in _broker_halves(client, broker)
        if producer_group in (None, half.properties.get(PROPERTY_PRODUCER_GROUP))
    ]


def _broker_halves(client: RemoteClient, broker: str) -> list[MessageExt]:
    half_mq = MessageQueue(TRANS_HALF_TOPIC, broker, HALF_QUEUE)
    op_mq = MessageQueue(TRANS_OP_HALF_TOPIC, broker, HALF_QUEUE)
    # The op progress first: the broker moves the half progress before the op progress,
    # so the ops read from here name every ended half past the half progress read next.
    op_start = _progress(client, op_mq)
    half_start = _progress(client, half_mq)
    halves = list(_records(client, half_mq, half_start))
    ended: set[int] = set()
    for op in _records(client, op_mq, op_start):  # (read after the halves: none is missed)
        if op.tags == TRANS_OP_REMOVE_TAG:
            ended.update(int(p) for p in op.body.split(OP_SEPARATOR) if p.strip().isdigit())
    newest: dict[str, MessageExt] = {}
    closed: set[str] = set()
    for half in halves:
        key = half.uniq_key or f"@{half.queue_offset}"
        newest[key] = half  # a later copy replaces an earlier one
        # An END of any copy decided the transaction (a check-back's copy is stored
        # when the op of an END is not shown yet); a copy the broker made for a check
        # immunity time names its first half's offset.
        first = half.properties.get(PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET, "")
        if half.queue_offset in ended or (first.isdigit() and int(first) in ended):
            closed.add(key)
    return sorted((h for k, h in newest.items() if k not in closed), key=lambda h: h.queue_offset)


def _progress(client: RemoteClient, mq: MessageQueue) -> int:
    """Where the broker's check goes on in ``mq`` (the queue's start if it never ran)."""
    low = client.remoting.min_offset(mq)
    done = client.remoting.query_consumer_offset(CHECK_GROUP, mq)
    return low if done is None else max(done, low)


def _records(client: RemoteClient, mq: MessageQueue, start: int) -> Iterator[MessageExt]:
    """The records of ``mq`` from ``start`` to its end now, decoded, in queue order."""
    end = client.remoting.max_offset(mq)
    if start >= end:
        return
    reader = RangeReader(client, mq, start, end, SubscriptionExpression("*"))
    for block in reader.blocks():
        starts, _ = arrow.record_positions(block, what=f"pull answer of {mq}")
        for s in starts.tolist():
            yield decode_record(block, s)


def check(
    client: RemoteClient,
    producer_group: str | None,
    answer: Answer,
    *,
    in_flight: Iterable[int] = (),
    ended: EndedHalves,
) -> dict[str, int]:
    """Ask ``answer`` about every open half of ``producer_group`` (None: of every group)
    on the cluster now, and end each as it answers.

    Halves at a half-queue offset in ``in_flight`` (on any broker) and halves this
    client ended lately (``ended``: the op queue may not show it yet) are not asked.
    COMMIT commits a half (END_TRANSACTION, every answer awaited), unless its committed
    copy exists already (an END the op queue does not show yet, or one of an older copy
    of the half): that half is rolled back, which only closes it, and is not counted.
    ROLLBACK rolls a half back, UNKNOWN leaves it open. If ``answer`` raises, nothing is
    ended. Returns how many halves were committed, rolled back and left open.
    """
    flying = set(in_flight)
    skip = ended.recent()
    found = open_halves(client, producer_group)
    decided: list[tuple[str, MessageExt, TransactionState]] = []
    counts = {"commit": 0, "rollback": 0, "unknown": 0}
    for broker, half in found:
        if half.queue_offset in flying or (broker, half.queue_offset) in skip:
            continue
        state = _state(answer(half))
        decided.append((broker, half, state))
    commit: list[tuple[str, MessageExt]] = []
    rollback: list[tuple[str, MessageExt]] = []
    for broker, half, state in decided:
        if state is TransactionState.COMMIT:
            topic = half.properties.get(PROPERTY_REAL_TOPIC, "")
            address = client.remoting.broker_master(broker)
            if client.producer.committed_copy(address, topic, half.uniq_key or ""):
                rollback.append((broker, half))
                continue
            commit.append((broker, half))
            counts["commit"] += 1
        elif state is TransactionState.ROLLBACK:
            rollback.append((broker, half))
            counts["rollback"] += 1
        else:
            counts["unknown"] += 1
    for chosen, how in ((commit, True), (rollback, False)):
        halves = _halves(chosen)
        if halves:
            client.producer.end_halves(halves, commit=how)
            ended.note(halves)
    return counts


def _state(answer: object) -> TransactionState:
    """The TransactionState of an answer (as the embedded check takes: True / False too)."""
    if answer is TransactionState.COMMIT or answer is True:
        return TransactionState.COMMIT
    if answer is TransactionState.ROLLBACK or answer is False:
        return TransactionState.ROLLBACK
    return TransactionState.UNKNOWN


def _halves(chosen: list[tuple[str, MessageExt]]) -> list[Halves]:
    """What END_TRANSACTION needs for these halves: one Halves per broker and group."""
    by: dict[tuple[str, str], list[MessageExt]] = {}
    for broker, half in chosen:
        group = half.properties.get(PROPERTY_PRODUCER_GROUP, "")
        by.setdefault((broker, group), []).append(half)
    return [
        Halves(
            broker,
            group,
            offset_runs(h.queue_offset for h in hs),
            tuple(h.commitlog_offset for h in hs),
            tuple(h.uniq_key or "" for h in hs),
            tuple(h.properties.get(PROPERTY_REAL_TOPIC, "") for h in hs),
        )
        for (broker, group), hs in by.items()
    ]

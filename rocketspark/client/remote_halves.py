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
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Literal

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
    answer_state,
)
from rocketspark.message.names import SubscriptionExpression
from rocketspark.message.record import decode_record
from rocketspark.message.results import Halves, offset_runs

if TYPE_CHECKING:  # pragma: no cover
    from rocketspark.client.remote import RemoteClient
    from rocketspark.client.remote_producer import Producer

__all__ = [
    "CHECK_GROUP",
    "EndedTransactions",
    "TransactionKey",
    "check",
    "end_answered",
    "open_halves",
    "transaction_key",
]

CHECK_GROUP = "CID_RMQ_SYS_TRANS"  # the broker's check progress (MixAll.CID_SYS_RMQ_TRANS)
HALF_QUEUE = 0  # the one queue of each transaction topic (its op queue has the same id)
OP_SEPARATOR = b","
# How long this client takes a transaction it ended for ended, whatever the op queue says
# yet (it lags by transactionOpBatchInterval, 3 s by default, more under load).
ENDED_MEMORY_SECONDS = 60.0


# A transaction as this client remembers it: (broker name, UNIQ_KEY); a half without a
# UNIQ_KEY is named by "@" and its half-queue offset.
TransactionKey = tuple[str, str]


def transaction_key(broker: str, uniq: str | None, offset: int) -> TransactionKey:
    """The key of the transaction of a half: its broker's name and its UNIQ_KEY."""
    return (broker, uniq or f"@{offset}")


class EndedTransactions:
    """The transactions this client is ending or ended lately, by (broker, UNIQ_KEY).

    A broker stores a new copy of a half (a new half-queue offset, the same UNIQ_KEY)
    before each check-back, also of a half whose END it has not read yet, and commits
    a transaction again on a second COMMIT (a duplicate). So every END this client
    sends (``Producer.end_halves``, ``Producer.on_check``, :func:`check`) first
    claims its transaction here, under one lock: a transaction claimed by another
    thread, or ended within ``memory`` seconds, is not ended again by this process,
    whichever copy is asked about; only a COMMIT may follow a ROLLBACK (that stores
    nothing, and a half whose check-back copy was rolled back may still be committed
    by its first offset). A claim is settled when the END is sent (one-way) or
    answered, and released when it failed or decided nothing (UNKNOWN).

    Ended transactions are kept in two generations of ``memory`` seconds each, so one
    is remembered for ``memory`` to twice that; later a committed copy is found by
    its UNIQ_KEY (``Producer.committed_copy``), whose index has caught up by then.
    """

    def __init__(
        self, memory: float = ENDED_MEMORY_SECONDS, clock: Callable[[], float] = time.monotonic
    ):
        self._memory = memory
        self._clock = clock
        self._lock = threading.Lock()
        self._ending: set[TransactionKey] = set()
        # ended transactions -> whether committed (True) or rolled back (False)
        self._recent: dict[TransactionKey, bool] = {}
        self._older: dict[TransactionKey, bool] = {}
        self._since = clock()  # when the recent generation began

    def claim(self, keys: Iterable[TransactionKey], *, commit: bool = False) -> list[bool]:
        """Claim each transaction for an END; False for one being ended or ended lately
        (with ``commit``: one rolled back lately may be claimed, to be committed)."""
        with self._lock:
            self._age()
            out = []
            for key in keys:
                ended = self._ended(key)
                free = key not in self._ending and (ended is None or (commit and not ended))
                if free:
                    self._ending.add(key)
                out.append(free)
            return out

    def state(self, key: TransactionKey) -> Literal["open", "ending", "ended"]:
        """Whether this client is ending the transaction now, ended it lately, or neither."""
        with self._lock:
            self._age()
            if key in self._ending:
                return "ending"
            return "open" if self._ended(key) is None else "ended"

    def settle(self, keys: Iterable[TransactionKey], *, committed: bool) -> None:
        """The claimed transactions are ended (their END sent or answered)."""
        with self._lock:
            self._age()
            for key in keys:
                self._ending.discard(key)
                self._recent[key] = committed

    def release(self, keys: Iterable[TransactionKey]) -> None:
        """The claimed transactions are not ended (an END failed, or was not sent)."""
        with self._lock:
            self._ending.difference_update(keys)

    def _ended(self, key: TransactionKey) -> bool | None:
        got = self._recent.get(key)
        return self._older.get(key) if got is None else got

    def _age(self) -> None:
        now = self._clock()
        if now - self._since >= self._memory:
            self._older = self._recent if now - self._since < 2 * self._memory else {}
            self._recent = {}
            self._since = now


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
) -> dict[str, int]:
    """Ask ``answer`` about every open half of ``producer_group`` (None: of every group)
    on the cluster now, and end each as it answers (see :func:`end_answered`)."""
    found = open_halves(client, producer_group)
    return end_answered(client.producer, found, answer, in_flight=in_flight)


def end_answered(
    producer: Producer,
    found: Sequence[tuple[str, MessageExt]],
    answer: Answer,
    *,
    in_flight: Iterable[int] = (),
) -> dict[str, int]:
    """Ask ``answer`` about each (broker, half) found open, then end the halves as
    answered (``Producer.end_halves``, every answer awaited).

    Halves at a half-queue offset in ``in_flight`` (on any broker), and halves of a
    transaction this client is ending or ended lately (the op queue may not show it
    yet, and a check-back's copy of it has a new offset), are not asked. COMMIT
    commits a half, unless its committed copy exists already: then it is rolled back,
    which only closes it, and is not counted. ROLLBACK rolls a half back, UNKNOWN
    leaves it open (an answer is read by ``answer_state``: True / False too). If
    ``answer`` raises, nothing is ended. Returns how many halves were committed,
    rolled back and left open.
    """
    flying = set(in_flight)
    ended = producer.ended
    decided: list[tuple[str, MessageExt, TransactionState]] = []
    for broker, half in found:
        key = transaction_key(broker, half.uniq_key, half.queue_offset)
        if half.queue_offset in flying or ended.state(key) != "open":
            continue
        decided.append((broker, half, answer_state(answer(half))))
    commit = [(b, h) for b, h, state in decided if state is TransactionState.COMMIT]
    rollback = [(b, h) for b, h, state in decided if state is TransactionState.ROLLBACK]
    return {
        "commit": producer.end_halves(_halves(commit), commit=True, guard=True),
        "rollback": producer.end_halves(_halves(rollback), commit=False),
        "unknown": len(decided) - len(commit) - len(rollback),
    }


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

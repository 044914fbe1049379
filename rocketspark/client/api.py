"""The one interface the Spark side sees: a :class:`Client` of one RocketMQ, and a
picklable :class:`ClientRef` that says how to reach it.

A client is an embedded store directory today (``client/embedded.py``) and a
cluster reached through its NameServers later (``client/remote.py``); the data
source and the dead-letter code are written against this module only. Every
method names a RocketMQ operation (the remote backend's request code is given
where it is not obvious), so both backends answer alike:

- **Offsets are the next to read.** ``max_offset`` is the offset the next
  message of the queue gets, ``committed_offset`` the next one the group
  consumes, as in RocketMQ's ConsumeQueue and consumerOffset.json.
- **Half messages are decided by an answer.** A producer that cannot say what
  became of its halves (its process died between prepare and end) is asked:
  a broker sends CHECK_TRANSACTION_STATE for every half older than its
  transaction timeout, and the producer answers COMMIT, ROLLBACK or UNKNOWN.
  :meth:`Client.check_transactions` takes that answer as a function and runs
  it over the group's open halves at once (a cluster's are read from each
  master's half and op topics, which show an END a moment late); a remote
  backend also registers it for the brokers' check-backs.
- **A lock is held by this client**, not by a thread or a process: it
  serialises two clients' work on one thing (a table, a replay), and is given
  back when the block ends or the client's process dies.

Values the Spark side needs (messages, queues, results) are re-exported here,
so ``datasource/`` and ``deadletter.py`` import ``rocketspark.client`` and
``rocketspark.message`` only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from rocketspark.message.model import (
    Message,
    MessageExt,
    MessageQueue,
    TopicInfo,
    TransactionState,
)
from rocketspark.message.names import SubscriptionExpression, validate_group
from rocketspark.message.results import Halves, PutResult
from rocketspark.message.schema import ARROW_SCHEMA

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

__all__ = [
    "ARROW_SCHEMA",
    "Answer",
    "Client",
    "ClientRef",
    "Halves",
    "JobWrites",
    "Message",
    "MessageExt",
    "MessageQueue",
    "PutResult",
    "SinkLedger",
    "SubscriptionExpression",
    "TopicInfo",
    "TransactionState",
    "validate_group",
]

# What a producer answers for one of its half messages (LocalTransactionState). Every
# backend reads the answer with ``message.model.answer_state``: True is COMMIT, False
# ROLLBACK, None UNKNOWN, as the embedded store's check has always taken them.
Answer = Callable[[MessageExt], TransactionState | bool | str | None]


@dataclass(frozen=True, slots=True)
class ClientRef:
    """What crosses a pickle to an executor: how to connect, never an open store or socket.

    ``kind`` "embedded": ``address`` is an absolute store directory and
    ``options`` its broker.conf overrides (sorted pairs, so equal references
    hash alike and share one open client per process). ``kind`` "cluster":
    ``address`` is the NameServers ("host:port;host:port"), ``options`` the
    remote client's settings (``client/remote.py``), ``credentials`` an ACL
    account's keys.
    """

    kind: Literal["embedded", "cluster"]
    address: str
    options: tuple[tuple[str, str], ...] = ()
    # (access key, secret key) of an ACL account: pickled to the executors with the
    # plan (as Spark's own options are), never shown by repr.
    credentials: tuple[str, str] | None = field(default=None, repr=False)

    @classmethod
    def embedded(cls, path: str | None, overrides: Mapping[str, str] | None = None) -> ClientRef:
        """The reference to the store at ``path`` (default: conf/broker.conf's storePathRootDir).

        Raises ConfigError for a bad override, before anything is opened.
        """
        from rocketspark.client.embedded import resolve

        return resolve(path, overrides or {})

    @classmethod
    def cluster(
        cls,
        namesrv: str,
        settings: Mapping[str, str] | None = None,
        *,
        access_key: str | None = None,
        secret_key: str | None = None,
    ) -> ClientRef:
        """The reference to the cluster whose NameServers are ``namesrv`` ("host:port;...").

        ``settings`` are the remote client's (timeoutMs, pullBatchSize, ...);
        credentials come from the keys given, else from ROCKETMQ_ACCESS_KEY /
        ROCKETMQ_SECRET_KEY. Raises ConfigError naming the option at fault.
        """
        from rocketspark.client.remote import resolve

        return resolve(namesrv, settings or {}, access_key, secret_key)

    def require(self) -> ClientRef:
        """The reference, checked to name something to connect to (before planning).

        Raises StorePathError for a directory that holds no store: a typo must
        neither leave an empty store behind nor read as "no such topic".
        """
        if self.kind == "embedded":
            from rocketspark.client.embedded import require

            require(self)
        return self

    def connect(self) -> Client:
        """Return this process's client for the reference (connected on first use)."""
        from rocketspark.client import connect

        return connect(self)


class JobWrites(Protocol):
    """A task's side of a batch job's gate (see :meth:`SinkLedger.job_writes`)."""

    def writing(self) -> AbstractContextManager[None]:
        """Hold the gate open for one chunk of halves; SinkJobEndedError once the job ended."""
        ...

    def close(self) -> None: ...


class SinkLedger(Protocol):
    """What each exactly-once sink has committed, kept where every process of a job reaches it.

    Per sink id: ``committed``, the highest Spark batch id whose halves are
    committed (-1: none), ``pending``, a batch being committed (its id and
    half-queue offset runs ``[start, end)``), and ``query``, the streaming
    query that committed last. ``begin`` is durable before the halves are
    committed and ``finish`` after, so a crash in between is finished by the
    next commit rather than guessed at.

    Batch jobs: a job is started when Spark plans the write; each chunk of
    halves a task writes is written through the job's gate, which is shut for
    good when the job commits or aborts, so no half of a job appears after
    its end looked for them.
    """

    def get(self, sink_id: str) -> tuple[int, tuple[int, list[tuple[int, int]]] | None]:
        """Return (last committed batch id or -1, pending (batch id, runs) or None)."""
        ...

    def query(self, sink_id: str) -> str | None: ...

    def pending_query(self, sink_id: str) -> str | None: ...

    def begin(
        self, sink_id: str, batch_id: int, runs: list[tuple[int, int]], query: str | None = None
    ) -> None: ...

    def finish(self, sink_id: str, batch_id: int, query: str | None = None) -> None: ...

    def start_job(self, job: str) -> None:
        """Open the gate of a new batch job (on the driver, when Spark plans the write)."""
        ...

    def job_writes(self, job: str) -> JobWrites:
        """A task's handle on the job's gate."""
        ...

    def ending_job(self, job: str) -> AbstractContextManager[None]:
        """Shut the job's gate, waiting for chunks under way; the block sees every half
        the job will ever have. The gate stays shut even if the block raises."""
        ...

    def end_stale_jobs(self, cutoff_ms: int) -> None:
        """Shut the gates of jobs started before ``cutoff_ms`` (their driver never ended them)."""
        ...


class Client(Protocol):
    """One RocketMQ: an embedded store directory or a cluster. Offsets are the next to read.

    Topics and queues span every broker the client reaches; a MessageQueue
    names its broker, and a position is per MessageQueue.
    """

    ref: ClientRef

    @property
    def where(self) -> str:
        """What the client reaches, for messages: ``store /path`` or ``cluster ns:9876``."""
        ...

    @property
    def auto_create_topics(self) -> bool:
        """Whether a put to an unknown topic creates it (autoCreateTopicEnable)."""
        ...

    def now_ms(self) -> int:
        """The time the client stamps messages with (ms since the epoch)."""
        ...

    # -- topics and queues ---------------------------------------------------------------

    def topics(self) -> list[TopicInfo]: ...

    def has_topic(self, name: str) -> bool: ...

    def topic(self, name: str) -> TopicInfo:
        """Return the topic's config; UnknownTopicError if there is none."""
        ...

    def create_topic(self, name: str, *, queues: int) -> TopicInfo: ...

    def queues(self, topic: str) -> list[MessageQueue]:
        """Return the topic's readable queues on every broker (UnknownTopicError)."""
        ...

    # -- positions -----------------------------------------------------------------------

    def min_offset(self, mq: MessageQueue) -> int:
        """The first offset of the queue still stored."""
        ...

    def max_offset(self, mq: MessageQueue) -> int:
        """The offset the queue's next message gets: one past its last."""
        ...

    def offset_for_timestamp(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """The first offset stored at or after ``timestamp_ms`` (max_offset: none)."""
        ...

    def committed_offset(self, group: str, mq: MessageQueue) -> int | None:
        """The next offset ``group`` consumes from the queue (None: never committed)."""
        ...

    def commit_offsets(self, group: str, offsets: Mapping[MessageQueue, int]) -> None:
        """Record, per queue, the next offset ``group`` consumes."""
        ...

    # -- reading -------------------------------------------------------------------------

    def read_batches(
        self,
        mq: MessageQueue,
        start: int,
        end: int,
        *,
        expression: str = "*",
        check_crc: bool | None = None,
        columns: tuple[str, ...] | None = None,
    ) -> tuple[list[pa.RecordBatch], int]:
        """Arrow record batches (``message.arrow``'s schema) of offsets [start, end).

        Returns the batches and the offset to read next (at most ``end``; less
        than ``start`` never; equal to ``start`` when nothing is there). Rows
        the tag ``expression`` drops leave gaps in queueOffset. ``columns``:
        only these columns of the schema, in this order (``message.arrow.row_schema``);
        what none of them needs is not decoded (the tag filter works without tags).
        """
        ...

    def get_message(self, msg_id: str) -> MessageExt:
        """The stored message an offset msgId names (broker host and commitLog offset).

        Raises OffsetOutOfRangeError or CorruptRecordError when it names no
        message the client reaches.
        """
        ...

    def message_id_at(self, commitlog_offset: int) -> str:
        """The msgId of the record at a commitLog offset, for rows that name a message
        by offset alone (ambiguous across brokers: a client of several raises ConfigError)."""
        ...

    def query_by_key(self, topic: str, key: str, *, max_num: int = 64) -> list[MessageExt]:
        """Messages of ``topic`` whose KEYS or UNIQ_KEY hold ``key``, newest first."""
        ...

    # -- writing -------------------------------------------------------------------------

    def put_batch(self, messages: Sequence[Message]) -> Sequence[PutResult]: ...

    def put_columns(self, bodies: Sequence[Any], **columns: Any) -> Sequence[PutResult]:
        """Put one message per body; columns as ``MessageStore.put_columns`` takes them."""
        ...

    # -- transactions ----------------------------------------------------------------------

    def prepare_batch(
        self, messages: Sequence[Message], *, producer_group: str
    ) -> Sequence[PutResult]:
        """Store half messages, invisible until ended; a result's queue_offset names one."""
        ...

    def prepare_columns(
        self,
        bodies: Sequence[Any],
        *,
        producer_group: str,
        extra_properties: Mapping[str, str] | None = None,
        **columns: Any,
    ) -> Sequence[PutResult]:
        """prepare_batch for columns (as put_columns): one run of half-queue offsets."""
        ...

    def halves(self, results: Sequence[PutResult], *, producer_group: str) -> list[Halves]:
        """What ending the halves of these prepare results needs: one Halves per broker."""
        ...

    def end_transactions(self, halves: Sequence[Halves], *, commit: bool) -> None:
        """Commit (or roll back) these halves (END_TRANSACTION).

        Embedded: idempotent; a half ended the other way raises TransactionError
        and nothing is written. Cluster: every broker's answer is awaited; a
        half committed twice would be stored twice, so callers end a half once.
        """
        ...

    def check_transactions(
        self,
        producer_group: str | None,
        answer: Answer,
        *,
        in_flight: Iterable[int] = (),
    ) -> dict[str, int]:
        """Let ``answer`` decide the open halves of ``producer_group`` (None: every group).

        COMMIT commits a half, ROLLBACK rolls it back, UNKNOWN leaves it open.
        This is the broker's check-back (CHECK_TRANSACTION_STATE), run now over
        every open half of the group; a remote backend also registers ``answer``
        for the halves the brokers check later (those older than their
        transaction timeout). ``in_flight`` names halves (by half-queue offset)
        the caller knows to be undecided: a backend may leave them without
        asking. Returns counts by answer.
        """
        ...

    def register_answer(self, producer_group: str | None, answer: Answer) -> None:
        """Answer the check-backs of ``producer_group``'s halves (None: of every group) with
        ``answer``, from now on; nothing is asked now.

        Cluster: the brokers' CHECK_TRANSACTION_STATE for halves older than their
        transaction timeout reach this process (registered as a producer of the group).
        Embedded: nothing; a store has no broker to ask back, and its halves are
        decided by :meth:`check_transactions` alone.
        """
        ...

    # -- retries and dead letters ----------------------------------------------------------

    def ensure_group(self, group: str) -> None:
        """Create the consumer group with the defaults if it does not exist."""
        ...

    def send_back(
        self,
        group: str,
        msg_ids: Sequence[str],
        *,
        properties: Sequence[Mapping[str, str]] = (),
    ) -> int:
        """Send messages ``group`` failed to consume to its retry (or dead-letter) topic.

        As CONSUMER_SEND_MSG_BACK: the retry waits a delay level growing with
        the message's reconsume times; past the group's retryMaxTimes it goes
        to %DLQ%group. ``properties`` (one mapping per message) are added.
        The embedded backend sends all in one append (all or none after a
        crash). Returns how many were sent.
        """
        ...

    # -- housekeeping ----------------------------------------------------------------------

    def lock(self, name: str) -> AbstractContextManager[None]:
        """Hold the exclusive lock ``name`` for the block; held by this client (see module)."""
        ...

    def sink_ledger(self) -> SinkLedger:
        """The exactly-once sinks' ledger of this RocketMQ (see ``datasource/ledger.py``)."""
        ...

    def tick(self) -> int:
        """Deliver the delayed messages that are due (embedded); a broker does it itself."""
        ...

    def close(self) -> None: ...

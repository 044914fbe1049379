"""The embedded backend: a :class:`Client` over a store directory, one open store per process.

Spark runs the source's planning in one driver-side Python process and every
``read``/``write`` in Python workers, which it reuses across tasks. Opening a
store maps files and reads its config JSON, so each process keeps the clients
it connected until it exits instead of opening one per task. What crosses a
pickle is a :class:`ClientRef` (the directory and overrides), never a store.

Everything here is built from ``MessageStore``'s public methods; the files this
backend adds to a store (the sink ledger's jobs, the locks) live in its
``config/`` directory, next to RocketMQ's own JSON.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from rocketspark.client.api import (
    Answer,
    ClientRef,
    MessageQueue,
    PutResult,
    TopicInfo,
)
from rocketspark.errors import ConfigError, SinkJobEndedError, StorePathError
from rocketspark.message.model import Message, MessageExt
from rocketspark.message.results import Halves, offset_runs
from rocketspark.store import MessageStore, MessageStoreConfig
from rocketspark.store.config import canonical_key
from rocketspark.store.layout import describe_foreign, directory_kind

log = logging.getLogger(__name__)
_lock = threading.Lock()
_open: dict[ClientRef, EmbeddedClient] = {}
_pid = os.getpid()

# Under the store's config directory: one file per exactly-once batch job not yet ended.
JOB_DIR = "rocketsparkSinkJobs"

__all__ = ["EmbeddedClient", "canonical_key", "close_all", "connect", "require", "resolve"]


def resolve(path: str | None, overrides: Mapping[str, str]) -> ClientRef:
    """The reference to the store at ``path`` (default: conf/broker.conf's storePathRootDir).

    Raises ConfigError for a bad override, before anything is opened.
    """
    kw = dict(overrides)
    if path:
        given = [k for k in kw if canonical_key(k) == "storePathRootDir"]
        if given:
            raise ConfigError(
                f"the store directory is given twice: as store and as "
                f"{given[0]}; give only one of them"
            )
        kw["storePathRootDir"] = path
    config = MessageStoreConfig.load(None, **kw)
    kw.pop("storePathRootDir", None)
    return ClientRef(
        "embedded", os.path.abspath(config.store_path_root_dir), tuple(sorted(kw.items()))
    )


def require(ref: ClientRef) -> None:
    """Raise StorePathError unless ``ref`` names an existing store.

    A typo in the option must not leave an empty store behind, nor read as
    "no such topic"; a directory that is not a store gets no store files.
    """
    kind = directory_kind(ref.address)
    if kind == "foreign":
        raise StorePathError(f"option store: {describe_foreign(ref.address)}", path=ref.address)
    if kind != "store":
        raise StorePathError(
            f"option store: there is no store at {ref.address} (create one "
            "first: MessageStore.open(path).create_topic(...), or "
            "`rocketspark --store DIR topic create NAME`)",
            path=ref.address,
        )


def connect(ref: ClientRef) -> EmbeddedClient:
    """Return this process's client for ``ref`` (its store opened on first use)."""
    global _pid
    with _lock:
        if os.getpid() != _pid:  # a forked child must not share its parent's mappings
            _open.clear()
            _pid = os.getpid()
        client = _open.get(ref)
        if client is not None and client.store.replaced():
            # Deleted (and maybe created again) under a running application: what
            # the old instance wrote would go to files no longer in the directory.
            _open.pop(ref)
            log.warning(
                "store %s was deleted or replaced while open in this process; opening it again",
                ref.address,
            )
            client.close()
            client = None
        # A store closed behind the cache's back is opened again.
        if client is None or client.store.closed:
            require(ref)
            # A geometry option that differs from the store's is refused naming the
            # option the user wrote, not a keyword argument. Spark's Python workers
            # end without close() (os._exit, or killed by the daemon): their exit is
            # clean unless they left a write unfinished.
            config = MessageStoreConfig.load(
                None, storePathRootDir=ref.address, **dict(ref.options)
            )
            explicit = {canonical_key(k) or k: f"option rocketmq.{k}" for k, _ in ref.options}
            store = MessageStore(config, create=False, explicit=explicit, exit_without_close=True)
            client = EmbeddedClient(store, ref)
            _open[ref] = client
        return client


def close_all() -> None:
    """Close every store this process opened (at exit, and in tests)."""
    with _lock:
        clients = list(_open.values())
        _open.clear()
    for c in clients:
        c.close()


atexit.register(close_all)


class EmbeddedClient:
    """A :class:`~rocketspark.client.api.Client` over one open :class:`MessageStore`.

    The store has one broker (its brokerName); a MessageQueue's broker labels
    rows and offsets and is not looked up.
    """

    def __init__(self, store: MessageStore, ref: ClientRef | None = None):
        self.store = store
        self.ref = ref if ref is not None else ClientRef("embedded", store.root)

    @property
    def where(self) -> str:
        return f"store {self.store.root}"

    @property
    def broker_name(self) -> str:
        return self.store.config.broker_name

    @property
    def auto_create_topics(self) -> bool:
        return bool(self.store.config.auto_create_topic_enable)

    def now_ms(self) -> int:
        return self.store.clock()

    # -- topics and queues ---------------------------------------------------------------

    def topics(self) -> list[TopicInfo]:
        return self.store.list_topics()

    def has_topic(self, name: str) -> bool:
        return self.store.has_topic(name)

    def topic(self, name: str) -> TopicInfo:
        return self.store.topic(name)

    def create_topic(self, name: str, *, queues: int) -> TopicInfo:
        return self.store.create_topic(name, queues=queues)

    def queues(self, topic: str) -> list[MessageQueue]:
        broker = self.broker_name
        n = self.store.topic(topic).read_queue_nums
        return [MessageQueue(topic, broker, q) for q in range(n)]

    # -- positions -----------------------------------------------------------------------

    def min_offset(self, mq: MessageQueue) -> int:
        return self.store.min_offset(mq.topic, mq.queue_id)

    def max_offset(self, mq: MessageQueue) -> int:
        return self.store.max_offset(mq.topic, mq.queue_id)

    def offset_for_timestamp(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return self.store.offset_for_timestamp(mq.topic, mq.queue_id, timestamp_ms)

    def committed_offset(self, group: str, mq: MessageQueue) -> int | None:
        return self.store.committed_offset(group, mq.topic, mq.queue_id)

    def commit_offsets(self, group: str, offsets: Mapping[MessageQueue, int]) -> None:
        self.store.commit_offsets(group, {(mq.topic, mq.queue_id): o for mq, o in offsets.items()})

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
    ) -> tuple[list[Any], int]:
        return self.store.read_batches(
            mq.topic,
            mq.queue_id,
            start,
            end,
            expression,
            broker_name=mq.broker,
            check_crc=check_crc,
            columns=columns,
        )

    def get_message(self, msg_id: str) -> MessageExt:
        from rocketspark.message.record import parse_message_id

        _, offset = parse_message_id(msg_id)
        msg = self.store.get_message(offset)
        if msg.msg_id != msg_id.upper():  # the host part names another broker
            raise ConfigError(
                f"msgId {msg_id} names no message of {self.where}: the record at its "
                f"offset {offset} is {msg.msg_id}"
            )
        return msg

    def message_id_at(self, commitlog_offset: int) -> str:
        return self.store.get_message(commitlog_offset).msg_id

    def query_by_key(self, topic: str, key: str, *, max_num: int = 64) -> list[MessageExt]:
        return self.store.query_by_key(topic, key, max_num=max_num)

    # -- writing -------------------------------------------------------------------------

    def put_batch(self, messages: Sequence[Message]) -> Sequence[PutResult]:
        return self.store.put_batch(messages)

    def put_columns(self, bodies: Sequence[Any], **columns: Any) -> Sequence[PutResult]:
        return self.store.put_columns(bodies, **columns)

    # -- transactions ----------------------------------------------------------------------

    def prepare_batch(
        self, messages: Sequence[Message], *, producer_group: str
    ) -> Sequence[PutResult]:
        return self.store.prepare_batch(messages, producer_group=producer_group)

    def prepare_columns(
        self,
        bodies: Sequence[Any],
        *,
        producer_group: str,
        extra_properties: Mapping[str, str] | None = None,
        **columns: Any,
    ) -> Sequence[PutResult]:
        return self.store.prepare_columns(
            bodies,
            producer_group=producer_group,
            extra_properties=None if extra_properties is None else dict(extra_properties),
            **columns,
        )

    def halves(self, results: Sequence[PutResult], *, producer_group: str) -> list[Halves]:
        offsets = [r.queue_offset for r in results]
        return [Halves(self.broker_name, producer_group, offset_runs(offsets))] if offsets else []

    def end_transactions(self, halves: Sequence[Halves], *, commit: bool) -> None:
        offsets = [o for h in halves for o in h.offsets().tolist()]
        if commit:
            self.store.commit_transaction(offsets)
        else:
            self.store.rollback_transaction(offsets)

    def check_transactions(
        self,
        producer_group: str | None,
        answer: Answer,
        *,
        in_flight: Iterable[int] = (),
    ) -> dict[str, int]:
        """Run ``answer`` now over every open half of the group (not only old ones).

        The store's transaction check (the path a broker's CHECK_TRANSACTION_STATE
        takes), run immediately over the group's halves; an UNKNOWN answer leaves
        a half where it is (the check would otherwise put it back as a new copy,
        moving other producers' halves under them). The halves in ``in_flight``
        are not read.
        """
        counts = self.store.check_transactions(
            answer,
            producer_group=producer_group,
            immediately=True,
            unknown="keep",
            in_flight=in_flight,
        )
        return {
            "commit": counts["commit"],
            "rollback": counts["rollback"],
            "unknown": counts["unknown"],
        }

    def register_answer(self, producer_group: str | None, answer: Answer) -> None:
        """Nothing: no broker asks an embedded store's producer back (see ``Client``)."""

    # -- retries and dead letters ----------------------------------------------------------

    def ensure_group(self, group: str) -> None:
        self.store.groups.get_or_create(group)

    def send_back(
        self,
        group: str,
        msg_ids: Sequence[str],
        *,
        properties: Sequence[Mapping[str, str]] = (),
    ) -> int:
        messages = [self.get_message(m) for m in msg_ids]
        return len(
            self.store.send_back_batch(
                group, messages, properties=list(properties) if properties else None
            )
        )

    # -- housekeeping ----------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, name: str) -> Iterator[None]:
        """An exclusive flock on ``config/<name>.lock`` of the store, held for the block."""
        directory = os.path.join(self.store.root, "config")
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, f"{name}.lock"), "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def sink_ledger(self) -> EmbeddedSinkLedger:
        return EmbeddedSinkLedger(self.store)

    def tick(self) -> int:
        return self.store.run_schedule()

    def close(self) -> None:
        self.store.close()


class EmbeddedSinkLedger:
    """The sink ledger in the store: ``config/rocketsparkSinks.json`` (the store's
    SinkLedgerTable: written as RocketMQ writes its config JSON, fsynced, under a
    file lock) and one job file per batch job in ``config/rocketsparkSinkJobs/``.

    A job file is created when Spark plans the write; a task writes each chunk
    of halves under a shared ``flock`` of it, and only while it exists; the
    job's end takes the lock exclusively (waiting for chunks under way) and
    deletes the file, so a task Spark has not stopped yet writes nothing more.
    """

    def __init__(self, store: MessageStore):
        self._table = store.sink_ledger
        self.get = self._table.get
        self.query = self._table.query
        self.pending_query = self._table.pending_query
        self.begin = self._table.begin
        self.finish = self._table.finish
        self._dir = os.path.join(store.root, "config", JOB_DIR)

    def _job_path(self, job: str) -> str:
        return os.path.join(self._dir, f"{job}.lock")

    def start_job(self, job: str) -> None:
        path = self._job_path(job)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))

    def job_writes(self, job: str) -> _JobWrites:
        return _JobWrites(self._job_path(job), job)

    @contextlib.contextmanager
    def ending_job(self, job: str) -> Iterator[None]:
        path = self._job_path(job)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # the job has ended already: nothing to wait for
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        finally:
            os.close(fd)  # releases the lock

    def end_stale_jobs(self, cutoff_ms: int) -> None:
        try:
            names = os.listdir(self._dir)
        except FileNotFoundError:
            return
        for name in names:
            path = os.path.join(self._dir, name)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:  # its job ended meanwhile
                continue
            try:
                if os.fstat(fd).st_mtime * 1000 >= cutoff_ms:
                    continue
                fcntl.flock(fd, fcntl.LOCK_EX)  # a chunk under way is written before the scan
                log.warning(
                    "batch write job %s was never committed or aborted; ending it",
                    name.removesuffix(".lock"),
                )
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            finally:
                os.close(fd)


class _JobWrites:
    """A task's side of its job file: each chunk of halves is written under a shared
    flock of it, and only if the job has not ended (the file is still there)."""

    def __init__(self, path: str, job: str):
        self.path = path
        self.job = job
        self._fd: int | None = None

    def _ended(self) -> SinkJobEndedError:
        return SinkJobEndedError(
            f"batch write job {self.job} was committed or aborted before this task finished "
            f"writing (no job file {self.path}); it writes nothing more"
        )

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                raise self._ended() from None
        fcntl.flock(self._fd, fcntl.LOCK_SH)
        try:
            # Checked under the lock: the job's end deletes the file under its exclusive
            # lock, so either this chunk is written before the end looks for open
            # halves, or the file is gone here.
            try:
                alive = os.stat(self.path).st_ino == os.fstat(self._fd).st_ino
            except FileNotFoundError:
                alive = False
            if not alive:
                raise self._ended()
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

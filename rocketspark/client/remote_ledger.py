"""The exactly-once sinks' ledger on a cluster: records in a topic of the same RocketMQ.

Every process of a job reaches the cluster, and nothing else: so the ledger
is a topic of it, ``LEDGER_TOPIC``. Each change of a sink's entry (the
driver's ``begin`` and ``finish`` of a batch) is sent as one message holding
the whole entry as JSON, with the sink id as its key; the newest (highest
``seq``) is the entry. It is read back by key (QUERY_MESSAGE on every master,
the brokers' index), so no consumer group or offset is involved, and sent
with the sink id as sharding key, so one sink's records stay in one queue.

An entry holds, besides what the embedded ledger holds (``committed``,
``pending``, ``query``):

- ``accepted``: the writer ids (one per task attempt whose halves a batch
  committed) of the last ``KEEP_BATCHES`` batches. A broker's check-back
  for a half names its writer (RS_WRITER): COMMIT if its writer was
  accepted.
- ``finished_at``: the broker's store time of the last ``finish`` record.
  Spark runs one micro-batch at a time, so a half stored before the last
  finish whose writer was not accepted belongs to no batch that will
  commit: ROLLBACK.

A batch job (``df.write``) has no gate here: a task chunk written after its
job ended is a half no finish accepted, which the check-back answer rolls back
(a batch job's sink id is its own: no later batch of it can accept it).

Records expire with the topic's CommitLog (72 h by default); every finish
writes the whole entry again, so a sink that commits at least that often
keeps its entry. A sink idle for longer starts again from "nothing
committed", which a streaming query's own checkpoint makes harmless (its
next batch id is past anything the lost entry said).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from rocketspark.errors import CorruptRecordError, UnknownTopicError
from rocketspark.message import arrow
from rocketspark.message.model import Message
from rocketspark.message.record import decode_record

if TYPE_CHECKING:  # pragma: no cover
    from rocketspark.client.remote import RemoteClient

__all__ = ["LEDGER_TOPIC", "RemoteSinkLedger", "SinkEntry", "accepted", "finished_at"]

LEDGER_TOPIC = "rocketspark_sink_ledger"
KEEP_BATCHES = 32  # batches whose accepted writers an entry keeps
CACHE_SECONDS = 1.0  # how long a read entry answers check-backs before it is read again
QUERY_MAX = 32  # newest records of a key read per broker

SinkEntry = dict[str, Any]


def _empty(sink_id: str) -> SinkEntry:
    return {
        "sink": sink_id,
        "seq": 0,
        "committed": -1,
        "query": None,
        "pending": None,
        "accepted": {},
        "finished_at": 0,
        "stored_at": 0,
    }


def finished_at(entry: SinkEntry) -> int:
    """The broker's store time of the entry's last finish record (0: none)."""
    at = entry.get("finished_at")
    if at is None:  # this record is the finish: its own store time
        at = entry.get("stored_at", 0)
    return int(at or 0)


def accepted(entry: SinkEntry, writer: str) -> bool:
    """Whether a committed batch of the entry accepted the halves of ``writer``."""
    return any(writer in ws for ws in entry["accepted"].values())


class RemoteSinkLedger:
    """The :class:`~rocketspark.client.api.SinkLedger` of a cluster (see the module)."""

    def __init__(self, client: RemoteClient):
        self.client = client
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, SinkEntry]] = {}
        self._topic_ready = False

    # -- reading ---------------------------------------------------------------------------

    def entry(self, sink_id: str, *, fresh: bool = False) -> SinkEntry:
        """The newest entry of ``sink_id`` (cached for CACHE_SECONDS unless ``fresh``)."""
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(sink_id)
        if cached is not None and not fresh and now - cached[0] < CACHE_SECONDS:
            return cached[1]
        entry = self._read(sink_id)
        with self._lock:
            old = self._cache.get(sink_id)
            # A record this process wrote may not be in the brokers' index yet.
            if old is None or old[1]["seq"] <= entry["seq"]:
                self._cache[sink_id] = (now, entry)
            else:
                entry = old[1]
        return entry

    def _read(self, sink_id: str) -> SinkEntry:
        rc = self.client.remoting
        try:
            masters = rc.route(LEDGER_TOPIC).masters()
        except UnknownTopicError:
            return _empty(sink_id)
        best = _empty(sink_id)
        now = self.client.now_ms()
        for addr in masters.values():
            body = rc.query_message(addr, LEDGER_TOPIC, sink_id, QUERY_MAX, 0, now + 60_000)
            if body is None:
                continue
            starts, _ = arrow.record_positions(body, what=f"sink ledger records of {addr}")
            for s in starts.tolist():
                msg = decode_record(body, s)
                if msg.topic != LEDGER_TOPIC:
                    continue
                try:
                    entry = json.loads(msg.body)
                except ValueError as e:
                    raise CorruptRecordError(
                        f"sink ledger record {msg.msg_id} of sink {sink_id!r} is not JSON: {e}"
                    ) from None
                if entry.get("sink") != sink_id:
                    continue  # another key in the same index slot
                entry["stored_at"] = msg.store_timestamp
                if entry["seq"] > best["seq"]:
                    best = entry
        return best

    def get(self, sink_id: str) -> tuple[int, tuple[int, list[tuple[int, int]]] | None]:
        e = self.entry(sink_id, fresh=True)
        pending = e["pending"]
        return e["committed"], None if pending is None else (pending["batch"], [])

    def query(self, sink_id: str) -> str | None:
        return self.entry(sink_id, fresh=True)["query"]

    def pending_query(self, sink_id: str) -> str | None:
        pending = self.entry(sink_id, fresh=True)["pending"]
        return None if pending is None else pending.get("query")

    # -- writing ---------------------------------------------------------------------------

    def _write(self, entry: SinkEntry) -> SinkEntry:
        if not self._topic_ready:
            if not self.client.has_topic(LEDGER_TOPIC):
                self.client.create_topic(LEDGER_TOPIC, queues=1)
            self._topic_ready = True
        entry = dict(entry, seq=entry["seq"] + 1)
        entry.pop("stored_at", None)
        body = json.dumps(entry, sort_keys=True).encode()
        (result,) = self.client.put_batch(
            [Message(LEDGER_TOPIC, body, keys=(entry["sink"],), sharding_key=entry["sink"])]
        )
        # The broker's clock, as the halves' store times are (a send's answer has none).
        entry["stored_at"] = self.client.get_message(result.msg_id).store_timestamp
        with self._lock:
            self._cache[entry["sink"]] = (time.monotonic(), entry)
        return entry

    def begin(
        self,
        sink_id: str,
        batch_id: int,
        runs: list[tuple[int, int]],
        query: str | None = None,
        writers: Sequence[str] = (),
    ) -> None:
        """Record ``batch_id`` as being committed with the halves of ``writers``."""
        e = self.entry(sink_id, fresh=True)
        pending = {"batch": batch_id, "query": query, "writers": sorted(writers)}
        self._write(dict(e, pending=pending, finished_at=finished_at(e)))

    def finish(
        self,
        sink_id: str,
        batch_id: int,
        query: str | None = None,
        writers: Sequence[str] = (),
    ) -> None:
        """Record ``batch_id`` as committed: its writers accepted, the pending batch gone."""
        e = self.entry(sink_id, fresh=True)
        accepted = dict(e["accepted"])
        pending = e["pending"]
        done = set(writers)
        if pending is not None and pending["batch"] == batch_id:
            done.update(pending["writers"])
        accepted[str(batch_id)] = sorted(done)
        keep = sorted(accepted, key=int)[-KEEP_BATCHES:]
        entry = dict(
            e,
            committed=batch_id,
            query=query,
            pending=None,
            accepted={k: accepted[k] for k in keep},
            finished_at=None,  # the store time of this very record: see answer()
        )
        self._write(entry)

    # -- batch jobs: no gate on a cluster (see the module) -----------------------------------

    def start_job(self, job: str) -> None:
        return None

    def job_writes(self, job: str) -> _NoGate:
        return _NoGate()

    @contextlib.contextmanager
    def ending_job(self, job: str) -> Iterator[None]:
        yield

    def end_stale_jobs(self, cutoff_ms: int) -> None:
        return None


class _NoGate:
    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        yield

    def close(self) -> None:
        return None

"""The exactly-once sink's commit and abort against a real store, driven as Spark drives them.

Spark's side is played by hand (no SparkSession): tasks are ``write_task``
calls, the driver's commit and abort are the writers' methods, and a driver
killed inside a commit is a child process that SIGKILLs itself there.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, StructField, StructType

from rocketspark.datasource.options import parse_options
from rocketspark.datasource.sink import (
    RocketMQBatchWriter,
    RocketMQStreamWriter,
    SinkCommit,
    SinkPlan,
    write_task,
)
from rocketspark.datasource.stores import StoreRef
from rocketspark.store import Message, MessageStore
from rocketspark.store.transaction import TransactionService


def _plan(path: str, sink_id: str = "s1") -> SinkPlan:
    return SinkPlan(StoreRef.resolve(path, {}), ("body",), "out", True, sink_id,
                    f"rocketspark-sink-{sink_id}")


def _task(plan: SinkPlan, bodies: list[str], query: str | None = None) -> SinkCommit:
    out = write_task(plan, iter([pa.record_batch({"body": pa.array(bodies, pa.string())})]))
    return SinkCommit(out.runs, out.count, query)  # as a stream's task reports it


def _bodies(path: str) -> list[str]:
    with MessageStore.open(path) as s:
        return sorted(m.body.decode() for q in range(s.topic("out").read_queue_nums)
                      for m in s.pull("out", q, 0, 100_000).messages)


def _open_halves(path: str) -> int:
    with MessageStore.open(path) as s:
        return len(s.open_transactions())


def _die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


def _commit_killed_after_ledger_begin(path: str) -> None:
    TransactionService.end = _die  # the halves are never committed: the ledger says pending
    plan = _plan(path)
    RocketMQStreamWriter(plan).commit([_task(plan, ["a", "b", "c"], "q1")], 0)


@pytest.fixture
def out_store(store_path):
    with MessageStore.open(store_path) as s:
        s.create_topic("out", queues=2)
    return store_path


def _crash_in_commit(path: str) -> None:
    child = multiprocessing.get_context("spawn").Process(
        target=_commit_killed_after_ledger_begin, args=(path,))
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL
    with MessageStore.open(path) as s:
        committed, pending = s.sink_ledger.get("s1")
    assert committed == -1 and pending is not None and pending[0] == 0


def test_abort_after_a_crash_in_commit_commits_the_pending_batch_first(out_store):
    _crash_in_commit(out_store)
    plan = _plan(out_store)
    writer = RocketMQStreamWriter(plan)
    # The restarted query replays batch 0; a task fails, so Spark aborts it.
    writer.abort([_task(plan, ["a"], "q1"), None], 0)
    assert _bodies(out_store) == ["a", "b", "c"]  # the pending batch's halves, once
    assert _open_halves(out_store) == 0
    # The replay that succeeds is recognised as one; the query goes on.
    writer.commit([_task(plan, ["a", "b", "c"], "q1")], 0)
    writer.commit([_task(plan, ["d"], "q1")], 1)
    assert _bodies(out_store) == ["a", "b", "c", "d"]
    with MessageStore.open(out_store) as s:
        assert s.sink_ledger.get("s1") == (1, None)
        assert s.open_transactions() == []


def test_abort_of_a_commit_that_failed_half_way_keeps_what_was_committed(out_store):
    # Spark calls abort with the same messages when commit raises; the ledger already
    # has the batch pending, so its halves were decided: they are committed, not
    # rolled back (which would raise "already committed").
    _crash_in_commit(out_store)
    plan = _plan(out_store)
    with MessageStore.open(out_store) as s:
        _, (batch, runs) = s.sink_ledger.get("s1")
    RocketMQStreamWriter(plan).abort([SinkCommit(tuple(runs), 3, "q1")], batch)
    assert _bodies(out_store) == ["a", "b", "c"]
    assert _open_halves(out_store) == 0


def test_an_empty_batch_is_committed_without_a_pending_entry(out_store):
    plan = _plan(out_store)
    writer = RocketMQStreamWriter(plan)
    writer.commit([SinkCommit((), 0, "q1"), SinkCommit((), 0, "q1")], 0)
    with MessageStore.open(out_store) as s:
        assert s.sink_ledger.get("s1") == (0, None)
        # A pending empty batch (as a crash left them before) is finished, not a failure.
        s.sink_ledger.begin("s1", 1, [], "q1")
    writer.commit([_task(plan, ["x"], "q1")], 2)
    assert _bodies(out_store) == ["x"]
    with MessageStore.open(out_store) as s:
        assert s.sink_ledger.get("s1") == (2, None)


def test_a_new_query_at_the_same_sink_id_starts_its_batch_ids_again(out_store):
    plan = _plan(out_store)
    writer = RocketMQStreamWriter(plan)
    for batch, body in enumerate(["a", "b", "c"]):
        writer.commit([_task(plan, [body], "old")], batch)
    # The checkpoint was deleted: a new query id, batch ids from 0 again.
    writer.commit([_task(plan, ["n0"], "new")], 0)
    writer.commit([_task(plan, ["n1"], "new")], 1)
    writer.commit([_task(plan, ["n1-again"], "new")], 1)  # a replay of the new query's batch
    assert _bodies(out_store) == ["a", "b", "c", "n0", "n1"]
    with MessageStore.open(out_store) as s:
        assert s.sink_ledger.get("s1") == (1, None)
        assert s.sink_ledger.query("s1") == "new"
        assert s.open_transactions() == []


def test_a_batch_write_rolls_back_its_failed_task_attempts(out_store):
    plan = _plan(out_store, "batch-job1")
    failed = write_task(plan, iter([pa.record_batch({"body": pa.array(["lost"])})]))
    good = [write_task(plan, iter([pa.record_batch({"body": pa.array([b])})]))
            for b in ("r1", "r2")]
    other_job = _plan(out_store, "batch-job2")
    running = write_task(other_job, iter([pa.record_batch({"body": pa.array(["other"])})]))
    RocketMQBatchWriter(plan).commit(good)
    assert _bodies(out_store) == ["r1", "r2"]
    with MessageStore.open(out_store) as s:
        still_open = s.open_transactions()
    # Only the other job's half is still open: it commits on its own.
    assert [h.body for h in still_open] == [b"other"]
    RocketMQBatchWriter(other_job).commit([running])
    assert _bodies(out_store) == ["other", "r1", "r2"]
    assert failed.count == 1 and _open_halves(out_store) == 0


def test_each_batch_write_plans_a_sink_id_of_its_own(out_store):
    options = parse_options({"store": out_store, "topic": "out",
                             "deliveryGuarantee": "exactly_once"}, "write")
    schema = StructType([StructField("body", BinaryType())])
    ids = {SinkPlan.create(options, schema, streaming=False).sink_id for _ in range(3)}
    assert len(ids) == 3 and all(i.startswith("batch-") for i in ids)


def test_abandoned_batch_writes_are_rolled_back_by_age(out_store):
    from rocketspark.datasource.sink import roll_back_abandoned_batch_writes

    killed_job = _plan(out_store, "batch-dead")
    write_task(killed_job, iter([pa.record_batch({"body": pa.array(["orphan"])})]))
    stream = _plan(out_store)
    pending = _task(stream, ["s"], "q1")
    with MessageStore.open(out_store) as s:
        assert roll_back_abandoned_batch_writes(s, 3_600_000) == 0  # not old enough
        assert len(s.open_transactions()) == 2
        now = s.clock
        # another producer's half that carries a batch write's RS_SINK (copied along
        # with a message's properties) is not that write's
        s.prepare(Message("out", b"copied", properties={"RS_SINK": "batch-dead"}),
                  producer_group="someone")
        s.clock = lambda: now() + 7_200_000  # two hours later
        assert roll_back_abandoned_batch_writes(s, 3_600_000) == 1
        assert sorted(h.body for h in s.open_transactions()) == [b"copied", b"s"]
        assert roll_back_abandoned_batch_writes(s, 0, producer_groups=["someone"]) == 1
        assert [h.body for h in s.open_transactions()] == [b"s"]  # the stream's: untouched
    RocketMQStreamWriter(stream).commit([pending], 0)
    assert _bodies(out_store) == ["s"]



def test_a_checkpoint_location_names_one_sink_however_it_is_spelled(tmp_path, monkeypatch):
    from rocketspark.datasource.stores import location_key as _location_key

    monkeypatch.chdir(tmp_path)
    local = {_location_key(w) for w in ("/data/chk", "/data/chk/", "file:///data/chk",
                                         "file:/data/chk")}
    assert local == {"/data/chk"}
    assert _location_key("chk") == str(tmp_path / "chk")
    # A URI is not a path under the planning process's working directory.
    assert _location_key("s3://bucket/chk/") == "s3://bucket/chk"
    assert _location_key("dbfs:/chk") == "dbfs:/chk"


@pytest.mark.parametrize("exactly_once", [True, False])
@pytest.mark.parametrize("bad", ["", None])
def test_a_block_with_an_empty_or_null_body_writes_nothing(out_store, exactly_once, bad):
    """RocketMQ's producer refuses empty bodies (its consumers stop at one): the sink
    refuses the block, even when the bad row comes chunks after good ones."""
    from rocketspark.datasource.sink import WRITE_CHUNK
    from rocketspark.errors import ConfigError

    plan = dataclasses.replace(_plan(out_store), exactly_once=exactly_once)
    bodies = ["ok"] * (WRITE_CHUNK + 5) + [bad]
    for kind in (pa.string(), pa.binary()):
        block = pa.record_batch({"body": pa.array(bodies, kind)})
        with pytest.raises(ConfigError, match=f"row {WRITE_CHUNK + 5} of the batch has a"):
            write_task(plan, iter([block]))
    with pytest.raises(ConfigError, match="row 1 of the batch has a"):
        write_task(plan, iter([("x",), (bad,)]))  # rows, as a Python writer gets them
    assert _bodies(out_store) == [] and _open_halves(out_store) == 0

"""The exactly-once sink's commit and abort against a real RocketMQ, driven as Spark drives them.

Spark's side is played by hand (no SparkSession): tasks are ``write_task``
calls, the driver's commit and abort are the writers' methods, and a driver
killed inside a commit is a child process that SIGKILLs itself there.

Each test runs on every backend (the ``backend`` fixture), on a topic and sink
ids of its own; the tests marked ``embedded_only`` move the store's clock.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import threading

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import BinaryType, StructField, StructType

from rocketspark.client import ClientRef, Message, close_all
from rocketspark.datasource.ledger import register_answer
from rocketspark.datasource.options import parse_options
from rocketspark.datasource.sink import (
    RocketMQBatchWriter,
    RocketMQStreamWriter,
    SinkCommit,
    SinkPlan,
    write_task,
)
from rocketspark.errors import SinkJobEndedError


def _plan(backend, out: str, sink_id: str) -> SinkPlan:
    return _plan_at(backend.ref, out, sink_id)


def _plan_at(ref: ClientRef, out: str, sink_id: str) -> SinkPlan:
    plan = SinkPlan(ref, ("body",), out, True, sink_id, f"rocketspark-sink-{sink_id}")
    if ref.kind == "cluster":  # as SinkPlan.create does in the driver
        register_answer(ref.connect(), plan.producer_group)
    return plan


def _task(plan: SinkPlan, bodies: list[str], query: str | None = None) -> SinkCommit:
    out = write_task(plan, iter([pa.record_batch({"body": pa.array(bodies, pa.string())})]))
    return dataclasses.replace(out, query=query)  # as a stream's task reports it


def _die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


def _commit_killed_after_ledger_begin(ref: ClientRef, out: str, sink_id: str) -> None:
    # the halves are never committed: the ledger says pending
    type(ref.connect()).end_transactions = _die
    plan = _plan_at(ref, out, sink_id)
    RocketMQStreamWriter(plan).commit([_task(plan, ["a", "b", "c"], "q1")], 0)


@pytest.fixture
def out(backend):
    """This test's topic (2 queues)."""
    return backend.fresh_topic("out", queues=2)


@pytest.fixture
def s1(backend):
    """This test's stream sink id."""
    return backend.fresh_name("s1")


# -- for the embedded_only tests: a store with the topic "out" -----------------------------


@pytest.fixture
def out_store(store_path):
    from rocketspark.store import MessageStore

    with MessageStore.open(store_path) as s:
        s.create_topic("out", queues=2)
    return store_path


def _bodies(path: str) -> list[str]:
    from rocketspark.store import MessageStore

    with MessageStore.open(path) as s:
        return sorted(
            m.body.decode()
            for q in range(s.topic("out").read_queue_nums)
            for m in s.pull("out", q, 0, 100_000).messages
        )


def _open_halves(path: str) -> int:
    from rocketspark.store import MessageStore

    with MessageStore.open(path) as s:
        return len(s.open_transactions())


def _job_files(path: str) -> list[str]:
    directory = os.path.join(path, "config", "rocketsparkSinkJobs")
    return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


def _crash_in_commit(backend, out: str, sink_id: str) -> None:
    child = multiprocessing.get_context("spawn").Process(
        target=_commit_killed_after_ledger_begin, args=(backend.ref, out, sink_id)
    )
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL
    committed, pending = backend.client.sink_ledger().get(sink_id)
    assert committed == -1 and pending is not None and pending[0] == 0


def test_abort_after_a_crash_in_commit_commits_the_pending_batch_first(backend, out, s1):
    _crash_in_commit(backend, out, s1)
    plan = _plan(backend, out, s1)
    writer = RocketMQStreamWriter(plan)
    # The restarted query replays batch 0; a task fails, so Spark aborts it.
    writer.abort([_task(plan, ["a"], "q1"), None], 0)
    # (a cluster's brokers commit the pending batch's halves by their check-backs)
    assert len(backend.settled_halves(out)) == 0
    assert backend.bodies(out) == ["a", "b", "c"]  # the pending batch's halves, once
    # The replay that succeeds is recognised as one; the query goes on.
    writer.commit([_task(plan, ["a", "b", "c"], "q1")], 0)
    writer.commit([_task(plan, ["d"], "q1")], 1)
    assert backend.bodies(out) == ["a", "b", "c", "d"]
    assert backend.client.sink_ledger().get(s1) == (1, None)
    assert backend.settled_halves(out) == []


def test_abort_of_a_commit_that_failed_half_way_keeps_what_was_committed(backend, out, s1):
    # Spark calls abort with the same messages when commit raises; the ledger already
    # has the batch pending, so its halves were decided: they are committed, not
    # rolled back (which would raise "already committed").
    _crash_in_commit(backend, out, s1)
    plan = _plan(backend, out, s1)
    _, (batch, runs) = backend.client.sink_ledger().get(s1)
    RocketMQStreamWriter(plan).abort([SinkCommit(tuple(runs), 3, "q1")], batch)
    assert len(backend.settled_halves(out)) == 0
    assert backend.bodies(out) == ["a", "b", "c"]


def test_an_empty_batch_is_committed_without_a_pending_entry(backend, out, s1):
    plan = _plan(backend, out, s1)
    writer = RocketMQStreamWriter(plan)
    writer.commit([SinkCommit((), 0, "q1"), SinkCommit((), 0, "q1")], 0)
    ledger = backend.client.sink_ledger()
    assert ledger.get(s1) == (0, None)
    # A pending empty batch (as a crash left them before) is finished, not a failure.
    ledger.begin(s1, 1, [], "q1")
    writer.commit([_task(plan, ["x"], "q1")], 2)
    assert backend.bodies(out) == ["x"]
    assert backend.client.sink_ledger().get(s1) == (2, None)


def test_a_new_query_at_the_same_sink_id_starts_its_batch_ids_again(backend, out, s1):
    plan = _plan(backend, out, s1)
    writer = RocketMQStreamWriter(plan)
    for batch, body in enumerate(["a", "b", "c"]):
        writer.commit([_task(plan, [body], "old")], batch)
    # The checkpoint was deleted: a new query id, batch ids from 0 again.
    writer.commit([_task(plan, ["n0"], "new")], 0)
    writer.commit([_task(plan, ["n1"], "new")], 1)
    writer.commit([_task(plan, ["n1-again"], "new")], 1)  # a replay of the new query's batch
    assert backend.bodies(out) == ["a", "b", "c", "n0", "n1"]
    ledger = backend.client.sink_ledger()
    assert ledger.get(s1) == (1, None)
    assert ledger.query(s1) == "new"
    assert backend.settled_halves(out) == []


def test_a_batch_write_rolls_back_its_failed_task_attempts(backend, out):
    plan = _plan(backend, out, backend.fresh_name("batch-job1"))
    failed = write_task(plan, iter([pa.record_batch({"body": pa.array(["lost"])})]))
    good = [
        write_task(plan, iter([pa.record_batch({"body": pa.array([b])})])) for b in ("r1", "r2")
    ]
    other_job = _plan(backend, out, backend.fresh_name("batch-job2"))
    running = write_task(other_job, iter([pa.record_batch({"body": pa.array(["other"])})]))
    RocketMQBatchWriter(plan).commit(good)
    assert backend.bodies(out) == ["r1", "r2"]
    still_open = backend.settled_halves(out, count=1)
    # Only the other job's half is still open: it commits on its own.
    assert [h.body for h in still_open] == [b"other"]
    RocketMQBatchWriter(other_job).commit([running])
    assert backend.bodies(out) == ["other", "r1", "r2"]
    assert failed.count == 1 and len(backend.settled_halves(out)) == 0


def test_each_batch_write_plans_a_sink_id_of_its_own(backend, out):
    options = parse_options(
        {**backend.options, "topic": out, "deliveryGuarantee": "exactly_once"}, "write"
    )
    schema = StructType([StructField("body", BinaryType())])
    ids = {SinkPlan.create(options, schema, streaming=False).sink_id for _ in range(3)}
    assert len(ids) == 3 and all(i.startswith("batch-") for i in ids)


@pytest.mark.embedded_only
def test_abandoned_batch_writes_are_rolled_back_by_age(out_store):
    """Embedded only: the store's clock is moved two hours on."""
    from rocketspark.client.embedded import EmbeddedClient
    from rocketspark.datasource.ledger import roll_back_abandoned_batch_writes
    from rocketspark.store import MessageStore

    ref = ClientRef.embedded(out_store)
    killed_job = _plan_at(ref, "out", "batch-dead")
    write_task(killed_job, iter([pa.record_batch({"body": pa.array(["orphan"])})]))
    stream = _plan_at(ref, "out", "s1")
    pending = _task(stream, ["s"], "q1")
    with MessageStore.open(out_store) as s:
        assert roll_back_abandoned_batch_writes(EmbeddedClient(s), 3_600_000) == 0  # not old enough
        assert len(s.open_transactions()) == 2
        now = s.clock
        # another producer's half that carries a batch write's RS_SINK (copied along
        # with a message's properties) is not that write's
        s.prepare(
            Message("out", b"copied", properties={"RS_SINK": "batch-dead"}),
            producer_group="someone",
        )
        s.clock = lambda: now() + 7_200_000  # two hours later
        assert roll_back_abandoned_batch_writes(EmbeddedClient(s), 3_600_000) == 1
        assert sorted(h.body for h in s.open_transactions()) == [b"copied", b"s"]
        assert (
            roll_back_abandoned_batch_writes(EmbeddedClient(s), 0, producer_groups=["someone"]) == 1
        )
        assert [h.body for h in s.open_transactions()] == [b"s"]  # the stream's: untouched
    RocketMQStreamWriter(stream).commit([pending], 0)
    assert _bodies(out_store) == ["s"]


def test_a_checkpoint_location_names_one_sink_however_it_is_spelled(tmp_path, monkeypatch):
    from rocketspark.datasource.locations import location_key as _location_key

    monkeypatch.chdir(tmp_path)
    local = {
        _location_key(w) for w in ("/data/chk", "/data/chk/", "file:///data/chk", "file:/data/chk")
    }
    assert local == {"/data/chk"}
    assert _location_key("chk") == str(tmp_path / "chk")
    # A URI is not a path under the planning process's working directory.
    assert _location_key("s3://bucket/chk/") == "s3://bucket/chk"
    assert _location_key("dbfs:/chk") == "dbfs:/chk"


@pytest.mark.parametrize("exactly_once", [True, False])
@pytest.mark.parametrize("bad", ["", None])
def test_a_block_with_an_empty_or_null_body_writes_nothing(backend, out, s1, exactly_once, bad):
    """RocketMQ's producer refuses empty bodies (its consumers stop at one): the sink
    refuses the block, even when the bad row comes chunks after good ones."""
    from rocketspark.datasource.sink import WRITE_CHUNK
    from rocketspark.errors import ConfigError

    plan = dataclasses.replace(_plan(backend, out, s1), exactly_once=exactly_once)
    bodies = ["ok"] * (WRITE_CHUNK + 5) + [bad]
    for kind in (pa.string(), pa.binary()):
        block = pa.record_batch({"body": pa.array(bodies, kind)})
        with pytest.raises(ConfigError, match=f"row {WRITE_CHUNK + 5} of the batch has a"):
            write_task(plan, iter([block]))
    with pytest.raises(ConfigError, match="row 1 of the batch has a"):
        write_task(plan, iter([("x",), (bad,)]))  # rows, as a Python writer gets them
    assert backend.bodies(out) == [] and len(backend.settled_halves(out)) == 0


# -- a batch write's job ends for its late tasks too -------------------------------------
#
# The gate of a batch job (a task that writes after its job ended gets SinkJobEndedError,
# the abort waits for a chunk under way) is the embedded store's: a cluster's batch jobs
# have none (client/remote_ledger.py), their late chunks are left to the check-backs.

NO_GATE = pytest.mark.embedded_only(
    "a batch job's gate is the embedded store's: a cluster's batch jobs have none "
    "(client/remote_ledger.py)"
)


def _batch_plan(where: dict[str, str], out: str, **options: str) -> SinkPlan:
    opts = parse_options(
        {**where, "topic": out, "deliveryGuarantee": "exactly_once", **options}, "write"
    )
    return SinkPlan.create(opts, StructType([StructField("body", BinaryType())]), streaming=False)


def _batch(*bodies: str) -> pa.RecordBatch:
    return pa.record_batch({"body": pa.array(list(bodies), pa.string())})


@NO_GATE
def test_a_task_still_writing_when_its_job_is_aborted_writes_nothing_more(backend, out):
    plan = _batch_plan(backend.options, out)
    writer = RocketMQBatchWriter(plan)

    def late_input():
        yield _batch("a1", "a2")
        # Spark aborts the job (another task failed) while this one is still running.
        writer.abort([None, None])
        yield _batch("late")

    with pytest.raises(SinkJobEndedError, match="was committed or aborted"):
        write_task(plan, late_input())
    # A task that starts after the abort writes nothing either.
    with pytest.raises(SinkJobEndedError):
        write_task(plan, iter([_batch("later")]))
    assert len(backend.settled_halves(out)) == 0 and backend.bodies(out) == []
    assert backend.open_jobs(plan.job) == []


@NO_GATE
def test_a_speculative_attempt_after_the_commit_writes_nothing(backend, out):
    plan = _batch_plan(backend.options, out)
    good = write_task(plan, iter([_batch("r1")]))
    assert backend.open_jobs(plan.job) == [plan.job]
    RocketMQBatchWriter(plan).commit([good])
    assert backend.open_jobs(plan.job) == []
    with pytest.raises(SinkJobEndedError):
        write_task(plan, iter([_batch("r1-again")]))
    assert backend.bodies(out) == ["r1"] and len(backend.settled_halves(out)) == 0


@NO_GATE
@pytest.mark.parametrize("txn", [False, True])
def test_the_abort_waits_for_a_chunk_a_task_is_writing(backend, out, monkeypatch, txn):
    options = {"txnAppId": "app", "txnVersion": "3"} if txn else {}
    plan = _batch_plan(backend.options, out, **options)
    inside, go_on = threading.Event(), threading.Event()
    client_class = type(backend.client)
    real = client_class.prepare_columns

    def slow_prepare(self, *args, **kwargs):
        inside.set()
        assert go_on.wait(60)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(client_class, "prepare_columns", slow_prepare)
    results: dict[str, object] = {}
    task = threading.Thread(
        target=lambda: results.setdefault("task", write_task(plan, iter([_batch("x", "y")])))
    )
    task.start()
    assert inside.wait(60)
    aborted = threading.Event()

    def abort() -> None:
        RocketMQBatchWriter(plan).abort([None])
        aborted.set()

    driver = threading.Thread(target=abort)
    driver.start()
    assert not aborted.wait(0.5)  # it waits for the chunk under way
    go_on.set()
    task.join(60)
    driver.join(60)
    assert aborted.is_set() and results["task"].count == 2
    assert len(backend.settled_halves(out)) == 0 and backend.bodies(out) == []


def _write_then_die(ref: ClientRef, out: str, job: str, sink_id: str) -> None:
    client_class = type(ref.connect())
    real = client_class.prepare_columns

    def prepare_then_die(self, *args, **kwargs):
        real(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)  # while holding the job's gate

    client_class.prepare_columns = prepare_then_die
    plan = dataclasses.replace(_plan_at(ref, out, sink_id), job=job)
    write_task(plan, iter([_batch("killed")]))


@NO_GATE
def test_a_task_killed_in_the_middle_of_a_chunk_does_not_hold_up_the_abort(backend, out):
    plan = _batch_plan(backend.options, out)
    child = multiprocessing.get_context("spawn").Process(
        target=_write_then_die, args=(plan.client, out, plan.job, plan.sink_id)
    )
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL
    assert len(backend.settled_halves(out, count=1)) == 1
    RocketMQBatchWriter(plan).abort([None])
    assert len(backend.settled_halves(out)) == 0 and backend.bodies(out) == []


@pytest.mark.embedded_only
def test_abandoned_jobs_are_ended_before_their_halves_are_rolled_back(out_store):
    """Embedded only: the store's clock is moved two hours on, a job file's mtime with it."""
    from rocketspark.client.embedded import EmbeddedClient
    from rocketspark.datasource.ledger import roll_back_abandoned_batch_writes
    from rocketspark.store import MessageStore

    plan = _batch_plan({"store": out_store}, "out")  # its driver dies: no commit, no abort
    write_task(plan, iter([_batch("orphan")]))
    live = _batch_plan({"store": out_store}, "out")
    with MessageStore.open(out_store) as s:
        assert roll_back_abandoned_batch_writes(EmbeddedClient(s), 3_600_000) == 0
        assert len(_job_files(out_store)) == 2
        now = s.clock
        s.clock = lambda: now() + 7_200_000
        os.utime(
            os.path.join(out_store, "config", "rocketsparkSinkJobs", f"{live.job}.lock"),
            (now() / 1000 + 7_200, now() / 1000 + 7_200),
        )  # created "just now"
        assert roll_back_abandoned_batch_writes(EmbeddedClient(s), 3_600_000) == 1
    assert _job_files(out_store) == [f"{live.job}.lock"]
    with pytest.raises(SinkJobEndedError):  # a task of it that was still running
        write_task(plan, iter([_batch("late")]))
    RocketMQBatchWriter(live).commit([write_task(live, iter([_batch("live")]))])
    assert _bodies(out_store) == ["live"] and _open_halves(out_store) == 0


@NO_GATE
@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(chunks=st.lists(st.integers(1, 3), min_size=1, max_size=4), data=st.data())
def test_no_half_of_an_ended_batch_job_stays_open(backend, chunks, data):
    """Tasks of chunks[i] input batches each; the job ends (commit of the tasks done
    by then, or abort) before some chunk of some task: every later chunk is refused."""
    # drawn first: an example cut short in a draw must not leave a job started
    commit = data.draw(st.booleans(), "commit")
    end_at = data.draw(st.integers(0, sum(chunks)), "end before chunk")
    out = backend.fresh_topic("out", queues=2)  # one per example
    plan = _batch_plan(backend.options, out)
    writer = RocketMQBatchWriter(plan)
    done: list[SinkCommit] = []
    ended = False
    n = 0
    expected: list[str] = []
    late_tasks = 0

    def task_input(t: int, k: int):
        nonlocal n, ended
        for j in range(k):
            if n == end_at:
                (writer.commit if commit else writer.abort)(list(done))
                ended = True
            n += 1
            yield _batch(f"t{t}-{j}")

    for t, k in enumerate(chunks):
        try:
            done.append(write_task(plan, task_input(t, k)))
            if not ended:
                expected.extend(f"t{t}-{j}" for j in range(k))
        except SinkJobEndedError:
            late_tasks += 1
    if not ended:
        (writer.commit if commit else writer.abort)(list(done))
    assert late_tasks == sum(1 for t in range(len(chunks)) if sum(chunks[: t + 1]) > end_at)
    assert backend.bodies(out) == (sorted(expected) if commit else [])
    assert len(backend.settled_halves(out)) == 0
    assert backend.open_jobs(plan.job) == []
    close_all()

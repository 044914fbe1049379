"""Retries, dead letters as Delta tables, and replay, on a real SparkSession with Delta.

The tests run on every backend (``tests/helpers/backends.py``): they seed and
verify through the backend's client, on topics and groups of their own, and
reach it with the backend's keyword arguments (``backend.api``).
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from rocketspark.client import Message, TransactionState, close_all
from rocketspark.deadletter import RetryPipeline, materialize, replay
from rocketspark.errors import ConfigError
from tests.helpers.backends import FAST, PARAMS, make_backend

pytestmark = pytest.mark.spark

# (FAST: every delay level one second, so 16 retries take seconds, not hours)


@pytest.fixture(params=PARAMS)
def backend(request, tmp_path):
    yield make_backend(request, tmp_path, FAST)
    close_all()


@pytest.fixture(scope="module", params=PARAMS)
def dlq_world(request, spark, tmp_path_factory):
    """A pipeline that fails two of twenty messages every time, run until both are dead."""
    root = tmp_path_factory.mktemp("dlq")
    backend = make_backend(request, root, FAST)
    client = backend.client
    orders, etl = backend.fresh_topic("orders", queues=2), backend.fresh_name("etl")
    # the bad ones as an exactly-once batch write's committed copies would be
    written = {
        "RS_SINK": "batch-0123456789abcdef",
        "PGROUP": "rocketspark-sink-batch-0123456789abcdef",
        "__transactionId__": "x",
        "RS_FIRST_HALF": "7",
    }
    client.put_batch(
        [
            Message(
                orders,
                f"order-{i}" + ("-bad" if i in (3, 11) else ""),
                keys=[f"o-{i}"],
                tags="new",
                properties=written if i in (3, 11) else {},
            )
            for i in range(20)
        ]
    )
    processed: list[str] = []

    # failed rows named as pipelines written before msgIds did (by commitLogOffset) on
    # the embedded store; on a cluster, where an offset names no message, by msgId
    key, kind = ("commitLogOffset", "long") if backend.name == "embedded" else ("msgId", "string")

    def process(batch_df, batch_id):
        rows = batch_df.select(key, "body", "topic").collect()
        good = [r for r in rows if not r.body.endswith(b"-bad")]
        processed.extend(r.body.decode() for r in good)
        bad = [(r[key], "boom: " + r.body.decode()) for r in rows if r.body.endswith(b"-bad")]
        if not bad:
            return None
        return batch_df.sparkSession.createDataFrame(bad, f"{key} {kind}, reason string")

    pipe = RetryPipeline(
        spark,
        topic=orders,
        group=etl,
        process=process,
        checkpoint=str(root / "chk"),
        **backend.api,
    )
    q = pipe.start(processing_time="300 milliseconds")
    deadline = time.time() + 240
    try:
        while time.time() < deadline:
            if _dead_letters(backend, etl) >= 2:
                break
            assert q.exception() is None
            time.sleep(0.5)
    finally:
        q.stop()
    tables = {"retry": str(root / "retry_table"), "dlq": str(root / "dlq_table")}
    for query in materialize(
        spark,
        group=etl,
        retry_table=tables["retry"],
        dlq_table=tables["dlq"],
        checkpoint=str(root / "mchk"),
        available_now=True,
        **backend.api,
    ):
        query.awaitTermination(180)
        assert query.exception() is None
    yield SimpleNamespace(
        backend=backend, orders=orders, group=etl, tables=tables, processed=processed
    )
    close_all()


def _dead_letters(backend, group: str) -> int:
    """How many messages %DLQ%group holds."""
    client, dlq = backend.client, f"%DLQ%{group}"
    return sum(client.max_offset(mq) for mq in client.queues(dlq)) if client.has_topic(dlq) else 0


def _stored(backend, topic: str) -> int:
    """How many messages ``topic`` holds (its queues' max offsets)."""
    return sum(backend.client.max_offset(mq) for mq in backend.queues(topic))


def test_failing_messages_retry_16_times_then_land_once_in_the_dlq_table(spark, dlq_world):
    tables, processed = dlq_world.tables, dlq_world.processed
    assert sorted(processed) == sorted(f"order-{i}" for i in range(20) if i not in (3, 11))
    dlq = spark.read.format("delta").load(tables["dlq"])
    rows = dlq.collect()
    assert sorted(r.body.decode() for r in rows) == ["order-11-bad", "order-3-bad"]
    for r in rows:
        assert r.reconsumeTimes == 16 and r.originTopic == dlq_world.orders
        assert r.reason == "boom: " + r.body.decode()
        assert r.keys in (["o-3"], ["o-11"]) and r.replayedAt is None
        assert r.firstFailureAt is not None and r.deadAt >= r.firstFailureAt
    retry = spark.read.format("delta").load(tables["retry"])
    per_msg = {r.originMsgId: r["count"] for r in retry.groupBy("originMsgId").count().collect()}
    assert sorted(per_msg.values()) == [16, 16]
    assert sorted(r.reconsumeTimes for r in retry.where("body LIKE '%3-bad'").collect()) == list(
        range(1, 17)
    )
    assert set(per_msg) == {r.originMsgId for r in rows}
    assert "day" in dlq.columns and dlq.select("day").distinct().count() >= 1


def test_dlq_table_reads_with_an_independent_delta_reader(dlq_world):
    import deltalake

    tables = dlq_world.tables
    t = deltalake.DeltaTable(tables["dlq"]).to_pyarrow_table()
    assert sorted(b.decode() for b in t.column("body").to_pylist()) == [
        "order-11-bad",
        "order-3-bad",
    ]
    assert deltalake.DeltaTable(tables["retry"]).to_pyarrow_table().num_rows == 32


def test_replay_sends_dead_letters_back_once(spark, dlq_world):
    backend, orders, tables = dlq_world.backend, dlq_world.orders, dlq_world.tables
    before = _stored(backend, orders)
    assert (
        replay(
            spark,
            dlq_table=tables["dlq"],
            condition="reason LIKE 'boom%order-3%'",
            **backend.api,
        )
        == 1
    )
    assert (
        replay(spark, dlq_table=tables["dlq"], condition="reason LIKE 'boom%'", **backend.api) == 1
    )  # only order-11 is left
    assert (
        replay(spark, dlq_table=tables["dlq"], condition="true", **backend.api) == 0
    )  # nothing twice without force
    new = [m for m in backend.messages(orders) if m.properties.get("RS_REPLAY") == "true"]
    assert _stored(backend, orders) == before + 2
    assert backend.settled_halves(orders) == []
    assert sorted(m.body.decode() for m in new) == ["order-11-bad", "order-3-bad"]
    assert all(m.reconsume_times == 0 and m.keys in (["o-3"], ["o-11"]) for m in new)
    # the replay's own transaction, not the earlier write's: an abandoned-write clean-up
    # (by RS_SINK) never takes a replay's halves for that write's
    assert all(
        "RS_SINK" not in m.properties
        and "RS_FIRST_HALF" not in m.properties
        and m.properties["PGROUP"].startswith("rocketspark-replay-")
        for m in new
    )
    stamped = spark.read.format("delta").load(tables["dlq"]).where("replayedAt IS NOT NULL")
    assert stamped.count() == 2 and stamped.select("replayId").distinct().count() == 2
    assert (
        replay(
            spark,
            dlq_table=tables["dlq"],
            condition="msgId IS NOT NULL",
            force=True,
            **backend.api,
        )
        == 2
    )


def test_bad_replay_input_is_a_clear_error(spark, dlq_world, tmp_path):
    backend, tables = dlq_world.backend, dlq_world.tables
    with pytest.raises(ConfigError, match="does not work on the dead-letter table"):
        replay(spark, dlq_table=tables["dlq"], condition="no_such_column = 1", **backend.api)
    with pytest.raises(ConfigError, match="no dead-letter table at"):
        replay(spark, dlq_table=str(tmp_path / "nothing"), **backend.api)
    not_delta = tmp_path / "parquet"
    spark.range(3).write.parquet(str(not_delta))
    with pytest.raises(ConfigError, match="is not a Delta table"):
        materialize(
            spark,
            group=dlq_world.group,
            retry_table=str(not_delta),
            dlq_table=str(tmp_path / "d2"),
            checkpoint=str(tmp_path / "c"),
            **backend.api,
        )


@pytest.mark.slow
@pytest.mark.not_on_serve(
    "three minutes of kills, run on the embedded store and the cluster; on serve, "
    "dlq_world's pipeline covers the retries (sent back, then dead after 16)"
)
def test_retry_pipeline_killed_at_random_moments_reaches_the_same_state(backend, tmp_path):
    import os
    import random
    import signal
    import subprocess
    import sys

    chk = str(tmp_path / "chk")
    in_, done = backend.fresh_topic("in", queues=2), backend.fresh_topic("done", queues=1)
    g = backend.fresh_name("g")
    backend.client.put_batch(
        [Message(in_, f"m{i}" + ("-bad" if i in (4, 9) else "")) for i in range(30)]
    )
    ref = backend.ref
    spec = json.dumps(
        {
            "options": backend.options,
            "api": backend.api,
            "ref": [ref.kind, ref.address, ref.options],
            "in": in_,
            "done": done,
            "group": g,
        }
    )
    script = os.path.join(os.path.dirname(__file__), "helpers", "retry_pipeline.py")
    rng = random.Random(5)
    for _ in range(3):
        p = subprocess.Popen(
            [sys.executable, script, spec, chk],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        time.sleep(rng.uniform(12, 25))  # Spark starts in ~10 s; kill mid-way
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    p = subprocess.run(
        [sys.executable, script, spec, chk], capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    written = backend.bodies(done)
    dead = backend.rows(f"%DLQ%{g}")
    retries = backend.rows(f"%RETRY%{g}")
    assert backend.settled_halves(in_, done) == []
    assert written == sorted(f"m{i}" for i in range(30) if i not in (4, 9))
    assert sorted(m["body"].decode() for m in dead) == ["m4-bad", "m9-bad"]
    per_message: dict[str, list[int]] = {}
    for m in retries:
        per_message.setdefault(m["body"].decode(), []).append(m["reconsumeTimes"])
    assert {k: sorted(v) for k, v in per_message.items()} == {
        "m4-bad": list(range(1, 17)),
        "m9-bad": list(range(1, 17)),
    }


def test_an_interrupted_replay_is_finished_or_undone_by_the_next(spark, dlq_world):
    """Halves left by a replay that died before its MERGE are rolled back; after it, committed."""
    from rocketspark.deadletter import PROPERTY_REPLAY_ID, _replay_group

    backend, orders, tables = dlq_world.backend, dlq_world.orders, dlq_world.tables
    client = backend.client
    group = _replay_group(tables["dlq"])

    def prepare(body: bytes, producer_group: str, replay_id: str):
        (half,) = client.prepare_batch(
            [Message(orders, body, properties={PROPERTY_REPLAY_ID: replay_id})],
            producer_group=producer_group,
        )
        return half

    # died before the MERGE: an id the table never saw
    prepare(b"lost replay", group, "never-merged")
    # died after the MERGE: the id of a replay the table recorded
    recorded = (
        spark.read.format("delta")
        .load(tables["dlq"])
        .where("replayId IS NOT NULL")
        .select("replayId")
        .first()
        .replayId
    )
    prepare(b"recorded replay", group, recorded)
    # another table's replay, between its prepare and its MERGE: not this one's to undo
    other = prepare(b"other table", _replay_group(tables["dlq"] + "-other"), "in-flight")
    replay(spark, dlq_table=tables["dlq"], condition="false", **backend.api)
    # lost: rolled back (neither stored nor open); kept: committed; other: still open
    stored = _bodies_once(backend, orders, "recorded replay")
    assert "lost replay" not in stored and "recorded replay" in stored
    assert [h.body for h in backend.settled_halves(orders, count=1)] == [b"other table"]
    other_group = _replay_group(tables["dlq"] + "-other")
    client.end_transactions(client.halves([other], producer_group=other_group), commit=False)
    assert backend.settled_halves(orders) == []


def _bodies_once(backend, topic: str, body: str) -> list[str]:
    """The bodies of ``topic`` once ``body`` is among them or ``settle`` seconds have
    passed (a broker answers END_TRANSACTION before its ConsumeQueue has the copy)."""
    deadline = time.monotonic() + backend.settle
    while True:
        stored = backend.bodies(topic)
        if body in stored or time.monotonic() >= deadline:
            return stored
        time.sleep(0.2)


def test_materialize_with_a_new_checkpoint_adds_no_row_twice(spark, dlq_world, tmp_path):
    backend, tables = dlq_world.backend, dlq_world.tables
    counts = {k: spark.read.format("delta").load(t).count() for k, t in tables.items()}
    for query in materialize(
        spark,
        group=dlq_world.group,
        retry_table=tables["retry"],
        dlq_table=tables["dlq"],
        checkpoint=str(tmp_path / "new-chk"),
        available_now=True,
        **backend.api,
    ):
        query.awaitTermination(180)
        assert query.exception() is None
    assert {k: spark.read.format("delta").load(t).count() for k, t in tables.items()} == counts


def test_replay_sends_a_dead_letter_once_even_if_its_table_has_it_twice(spark, dlq_world, tmp_path):
    backend, orders, tables = dlq_world.backend, dlq_world.orders, dlq_world.tables
    twice = str(tmp_path / "dlq-twice")
    dlq = spark.read.format("delta").load(tables["dlq"]).where("body LIKE '%3-bad'")
    dlq.unionAll(dlq).write.format("delta").partitionBy("day").save(twice)
    before = _stored(backend, orders)
    assert replay(spark, dlq_table=twice, force=True, **backend.api) == 1
    assert _stored(backend, orders) == before + 1
    assert backend.settled_halves(orders) == []
    m = backend.messages(orders)
    replayed = [x for x in m if x.properties.get("RS_REPLAY") == "true"][-1]
    # a new incident if it fails again: the old failure is not carried over
    assert "RS_FAILURE_REASON" not in replayed.properties
    assert "RS_FIRST_FAILURE_MS" not in replayed.properties


def _offsets_row(offset, reason="boom"):
    from collections import namedtuple

    return namedtuple("Row", "commitLogOffset reason")(offset, reason)


@pytest.mark.embedded_only("rows named by commitLogOffset: an offset names no message on a cluster")
def test_send_back_checks_what_process_returned(backend, tmp_path):
    orders, payroll = (
        backend.fresh_topic("orders", queues=1),
        backend.fresh_topic("payroll", queues=1),
    )
    (mine,) = backend.client.put_batch([Message(orders, b"order")])
    (foreign,) = backend.client.put_batch([Message(payroll, b"salary")])
    pipe = RetryPipeline(
        None,
        topic=orders,
        group=backend.fresh_name("etl"),
        process=lambda df, i: None,
        checkpoint=str(tmp_path / "chk"),
        **backend.api,
    )
    with pytest.raises(ConfigError, match=f"a message of topic '{payroll}'"):
        pipe.send_back([_offsets_row(foreign.commitlog_offset)], 0, "q1")
    with pytest.raises(ConfigError, match="commitLogOffset 7, which is not a message"):
        pipe.send_back([_offsets_row(7)], 0, "q1")
    # the same row twice (a join gone wrong) is sent back once
    assert pipe.send_back([_offsets_row(mine.commitlog_offset)] * 2, 0, "q1") == 1
    assert pipe.send_back([_offsets_row(mine.commitlog_offset)], 0, "q1") == 0  # replayed
    # a new checkpoint at the same location: a new query id, batch ids from 0 again
    assert pipe.send_back([_offsets_row(mine.commitlog_offset)], 0, "q2") == 1


def test_a_merge_that_met_a_concurrent_write_is_run_again(monkeypatch):
    """Besides materialize() and replay() taking turns (_table_lock), a MERGE refused by
    Delta's conflict check (another writer of the table) is run again: both MERGEs are
    idempotent. Any other error, or conflicts past MERGE_ATTEMPTS, still raise."""
    from delta.exceptions import ConcurrentAppendException

    from rocketspark import deadletter

    monkeypatch.setattr(deadletter.time, "sleep", lambda s: None)
    calls = []

    def merge(conflicts):
        def run():
            calls.append(1)
            if len(calls) <= conflicts:
                raise ConcurrentAppendException(message="a concurrent MERGE added data")

        return run

    deadletter._retry_conflicts(merge(2), "test")
    assert len(calls) == 3
    calls.clear()
    with pytest.raises(ConcurrentAppendException):
        deadletter._retry_conflicts(merge(99), "test")
    assert len(calls) == deadletter.MERGE_ATTEMPTS
    calls.clear()
    with pytest.raises(ZeroDivisionError):
        deadletter._retry_conflicts(lambda: calls.append(1) or 1 / 0, "test")
    assert len(calls) == 1


def test_failed_rows_are_named_by_msg_id(backend, tmp_path):
    """process() names failed rows by msgId (host and commitLog offset of one broker's
    message); a msgId of no message here is refused like a bad commitLogOffset."""
    from collections import namedtuple

    row = namedtuple("Row", "msgId reason")
    orders = backend.fresh_topic("orders", queues=1)
    (mine,) = backend.client.put_batch([Message(orders, b"order")])
    pipe = RetryPipeline(
        None,
        topic=orders,
        group=backend.fresh_name("etl"),
        process=lambda df, i: None,
        checkpoint=str(tmp_path / "chk"),
        **backend.api,
    )
    elsewhere = mine.msg_id[:-16] + "%016X" % (mine.commitlog_offset + 10_000)
    with pytest.raises(ConfigError, match=f"msgId {elsewhere}, which is not a message"):
        pipe.send_back([row(elsewhere, "boom")], 0, "q1")
    assert pipe.send_back([row(mine.msg_id, "boom")] * 2, 0, "q1") == 1
    # it waits in the schedule topic's queue of its delay level (3: queue 2)
    (sent,) = [
        backend.client.get_message(r["msgId"])
        for r in backend.rows("SCHEDULE_TOPIC_XXXX")
        if r["queueId"] == 2 and dict(r["properties"]).get("ORIGIN_MESSAGE_ID") == mine.msg_id
    ]
    assert sent.properties["ORIGIN_MESSAGE_ID"] == mine.msg_id
    assert sent.properties["RS_FAILURE_REASON"] == "boom"


def test_a_failed_row_that_names_no_message_is_refused():
    from types import SimpleNamespace

    from rocketspark.deadletter import _failed_row_id

    row = SimpleNamespace(asDict=lambda: {"reason": "x"})
    with pytest.raises(ConfigError, match="names no message"):
        _failed_row_id(row)
    assert _failed_row_id(SimpleNamespace(asDict=lambda: {"msgId": "AB", "reason": "x"})) == (
        "msgId",
        "AB",
    )


def test_a_replays_check_back_answer_waits_for_its_own_replay_and_rereads_the_table():
    """The answer registered for the brokers' check-backs: UNKNOWN for this process's
    replay between prepare and commit (not ROLLBACK: its MERGE may be running), COMMIT
    once its MERGE ran or the table recorded it since, ROLLBACK for a lost one."""
    from types import SimpleNamespace

    from rocketspark.deadletter import PROPERTY_REPLAY_ID, _ReplayAnswer

    table = {"old"}
    reads: list[float] = []
    now = [100.0]

    def read() -> set[str]:
        reads.append(now[0])
        return set(table)

    answer = _ReplayAnswer(read, clock=lambda: now[0])

    def half(replay_id: str):
        return SimpleNamespace(properties={PROPERTY_REPLAY_ID: replay_id})

    assert answer(half("old")) is TransactionState.COMMIT
    assert answer(half("lost")) is TransactionState.ROLLBACK
    assert answer(half("lost")) is TransactionState.ROLLBACK
    assert reads == [100.0]  # one read for a pass over many halves
    answer.replaying.add("mine")
    assert answer(half("mine")) is TransactionState.UNKNOWN
    answer.recorded.add("mine")  # its MERGE ran
    answer.replaying.discard("mine")
    assert answer(half("mine")) is TransactionState.COMMIT
    table.add("theirs")  # another process's replay recorded since the last read
    now[0] += _ReplayAnswer.REREAD_SECONDS
    assert answer(half("theirs")) is TransactionState.COMMIT
    assert reads == [100.0, 100.0 + _ReplayAnswer.REREAD_SECONDS]

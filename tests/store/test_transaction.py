"""Transactional half messages: prepare, commit, rollback, check."""

from __future__ import annotations

import pytest

from rocketspark.errors import TransactionError
from rocketspark.message.model import TRANS_HALF_TOPIC
from rocketspark.store import Message, MessageStore, PullStatus, SysFlag

SMALL = dict(mappedFileSizeCommitLog=1 << 20, maxHashSlotNum=64, maxIndexNum=4096)


@pytest.fixture
def store(tmp_path, clock):
    with MessageStore.open(tmp_path / "s", clock=clock, **SMALL) as s:
        s.create_topic("out", queues=1)
        yield s


def test_prepared_is_invisible_until_commit(store):
    half = store.prepare(Message("out", b"tx", tags="T", keys=["k"]), producer_group="pg")
    assert half.topic == TRANS_HALF_TOPIC
    assert store.pull("out", 0, 0).status is PullStatus.NO_NEW_MSG
    assert store.transaction_status(half) == "open"
    (final,) = store.commit_transaction(half)
    res = store.pull("out", 0, 0)
    (m,) = res.messages
    assert m.body == b"tx" and m.tags == "T" and m.keys == ["k"]
    assert m.sys_flag & 0xC == SysFlag.TRANSACTION_COMMIT
    assert m.prepared_transaction_offset == half.commitlog_offset
    assert "REAL_TOPIC" not in m.properties and "TRAN_MSG" not in m.properties
    assert m.properties["PGROUP"] == "pg"
    assert store.transaction_status(half) == "committed"
    assert store.commit_transaction(half) == []  # idempotent
    assert store.max_offset("out", 0) == 1
    with pytest.raises(TransactionError, match="already committed"):
        store.rollback_transaction(half)


def test_rollback_discards(store):
    half = store.prepare(Message("out", b"no"))
    store.rollback_transaction(half)
    store.rollback_transaction(half)
    assert store.max_offset("out", 0) == 0
    assert store.transaction_status(half) == "rolled_back"
    with pytest.raises(TransactionError):
        store.commit_transaction(half)


def test_resolution_is_seen_by_another_store_instance(tmp_path, clock):
    with MessageStore.open(tmp_path / "s", clock=clock, **SMALL) as a:
        a.create_topic("out", queues=1)
        half = a.prepare(Message("out", b"x"))
        with MessageStore.open(tmp_path / "s", clock=clock, **SMALL) as b:
            b.commit_transaction(half.queue_offset)
        assert a.commit_transaction(half) == []
        assert a.max_offset("out", 0) == 1


def test_check_resolves_old_halves_through_the_callback(store, clock):
    keep = store.prepare(Message("out", b"keep", properties={"batch": "1"}))
    drop = store.prepare(Message("out", b"drop", properties={"batch": "2"}))
    unsure = store.prepare(Message("out", b"unsure", properties={"batch": "3"}))
    asked = []

    def callback(half):
        asked.append(half.body)
        return {"1": "COMMIT", "2": "ROLLBACK", "3": None}[half.properties["batch"]]

    assert store.check_transactions(callback) == {
        "commit": 0,
        "rollback": 0,
        "unknown": 0,
        "discarded": 0,
    }
    clock.advance(6001)
    counts = store.check_transactions(callback)
    assert counts == {"commit": 1, "rollback": 1, "unknown": 1, "discarded": 0}
    assert [m.body for m in store.pull("out", 0, 0).messages] == [b"keep"]
    assert store.transaction_status(keep) == "committed"
    assert store.transaction_status(drop) == "rolled_back"
    # The unknown one comes back with its check count raised, 15 times at most.
    for _ in range(20):
        clock.advance(6001)
        store.check_transactions(callback)
    assert asked.count(b"unsure") == 15
    assert [m.body for m in store.pull("out", 0, 0).messages] == [b"keep"]
    del unsure


def _five_resolved_batches(s):
    """Five batches of 100 halves of "out", committed and rolled back in turn."""
    import numpy as np

    batches = []
    for b in range(5):
        hs = s.prepare_columns([b"x%d" % i for i in range(100)], topic="out", producer_group="pg")
        s.commit_transaction(hs) if b % 2 == 0 else s.rollback_transaction(hs)
        batches.append(np.asarray(hs.queue_offsets))
    return batches


def test_a_new_process_skips_ops_of_halves_below_the_check_progress(tmp_path):
    """The op queue is not re-read from its start by every new process (a long-lived
    exactly-once sink commits thousands of batches)."""

    path = tmp_path / "s"
    with MessageStore.open(path) as s:
        s.create_topic("out", queues=1)
        batches = _five_resolved_batches(s)
        live = s.prepare_columns([b"y"], topic="out", producer_group="pg")
        assert [h.queue_offset for h in s.open_transactions()] == [500]
        assert s.max_offset("out", 0) == 300
    with MessageStore.open(path) as s:  # a new opener: starts at the persisted progress
        tx = s._transactions
        assert tx._start() == 5 and tx._resolved.floor == 500
        tx._read_ops()
        assert s.transaction_status(int(batches[0][0])) == "resolved"
        assert s.transaction_status(int(live.queue_offsets[0])) == "open"
        s.commit_transaction(batches[0])  # again: below the progress, nothing is written
        assert s.max_offset("out", 0) == 300
        s.commit_transaction(live)
        assert s.max_offset("out", 0) == 301 and s.open_transactions() == []


@pytest.mark.parametrize("mode", ["before-ops", "after-ops"])
def test_a_commit_killed_midway_leaves_nothing_and_can_be_redone(tmp_path, mode):
    """Final records and the op record are one append: a SIGKILL inside it keeps neither."""
    import os
    import signal
    import subprocess
    import sys

    from tests.store.helpers.killed_commit import SMALL as KC_SMALL

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    count = 40  # above the small-batch size: the sliced (columnar) commit runs
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.store.helpers.killed_commit",
            str(tmp_path / "s"),
            str(count),
            mode,
        ],
        cwd=root,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    halves = [int(x) for x in proc.stdout.decode().split(",")]
    assert len(halves) == count
    with MessageStore.open(tmp_path / "s", **KC_SMALL) as s:
        assert s.max_offset("out", 0) + s.max_offset("out", 1) == 0
        assert s.query_by_key("out", "k1") == []
        assert {s.transaction_status(h) for h in halves} == {"open"}
        rep = s.recovery_report
        assert rep.abnormal_exit and rep.reason == "unfinished append"
        assert rep.discarded_bytes > 0
        s.commit_transaction(halves)
    with MessageStore.open(tmp_path / "s", **KC_SMALL) as s:
        bodies = sorted(m.body for q in (0, 1) for m in s.pull("out", q, 0, max_msgs=100).messages)
        assert bodies == sorted(b"row-%d" % i for i in range(count))
        assert len(s.query_by_key("out", "k1")) == 1
        assert {s.transaction_status(h) for h in halves} == {"committed"}


def test_op_record_bodies_are_parsed_strictly_when_clean_and_leniently_otherwise():
    from rocketspark.store.half_resolution import op_offsets as _op_offsets

    assert _op_offsets(b"1,2,30").tolist() == [1, 2, 30]
    assert _op_offsets(b",".join(b"%d" % i for i in range(100_000))).tolist() == list(
        range(100_000)
    )
    assert _op_offsets(b"").tolist() == []
    # RocketMQ never writes these; what is not a number is skipped, as before
    assert _op_offsets(b"1, 2,x,3").tolist() == [1, 2, 3]
    assert _op_offsets(b"5,,6").tolist() == [5, 6]
    assert _op_offsets(b"7,").tolist() == [7]


def test_commits_move_the_check_progress_once_far_enough_behind(tmp_path, monkeypatch):
    """Batch commits alone (no open_transactions, no check) keep a new opener's op
    reading bounded; the last PROGRESS_LAG halves keep their exact status."""
    from rocketspark.store import transaction
    from rocketspark.store.transaction import CHECK_GROUP

    monkeypatch.setattr(transaction, "PROGRESS_LAG", 150)
    path = tmp_path / "s"
    with MessageStore.open(path, **SMALL) as s:
        s.create_topic("out", queues=1)
        batches = _five_resolved_batches(s)
        assert s.offsets.query(CHECK_GROUP, TRANS_HALF_TOPIC, 0) == 350  # 500 - 150
    with MessageStore.open(path, **SMALL) as s:
        tx = s._transactions
        assert tx._resolved.floor == 0 and tx._start() > 0  # ops of halves < 350 skipped
        assert s.transaction_status(int(batches[0][0])) == "resolved"
        assert s.transaction_status(int(batches[3][-1])) == "rolled_back"
        assert s.transaction_status(int(batches[4][0])) == "committed"
        assert s.max_offset("out", 0) == 300


def test_a_message_that_fits_but_not_as_a_half_says_why(store):
    """The half's own properties (~200 bytes) can push a message near the 32767-byte
    properties limit over it: the error names the real topic and what was added."""
    from rocketspark.errors import PropertiesTooLargeError

    store.create_topic("t", queues=1)
    near = {"p": "v" * 32700}
    store.put(Message("t", b"fits", properties=near))
    for attempt in (
        lambda: store.prepare(Message("t", b"x", properties=near)),
        lambda: store.prepare_columns(
            [b"x"] * 100, topic="t", producer_group="g", properties=[near] * 100
        ),
    ):
        with pytest.raises(
            PropertiesTooLargeError, match="topic 't' take .* bytes as a transactional half message"
        ):
            attempt()
    assert store.open_transactions() == []


def test_a_half_committed_while_its_check_runs_is_not_put_back(tmp_path):
    """The check's callback said UNKNOWN while the producer (here another instance, as
    another process) committed: putting the half back would leave an open copy of a
    committed transaction, which the next check commits again."""
    root = str(tmp_path / "s")
    with MessageStore.open(root) as checker, MessageStore.open(root) as producer:
        checker.create_topic("t", queues=1)
        half = producer.prepare(Message("t", b"pay-once"), producer_group="pg")

        def unknown_while_committed(msg):
            producer.commit_transaction(half)
            return None

        assert checker.check_transactions(unknown_while_committed, timeout_ms=0)["unknown"] == 1
        assert checker.open_transactions() == []
        checker.check_transactions(lambda m: True, timeout_ms=0)
        assert [m.body for m in checker.pull("t", 0, 0).messages] == [b"pay-once"]


def test_putting_halves_back_is_one_append(store, monkeypatch):
    """The new copies and the op record closing the old ones are appended together: a
    crash between two appends left two open copies, both committed later."""
    halves = store.prepare_batch([Message("out", b"a"), Message("out", b"b")])
    appends = []
    append = store.appender.locked()  # the Append every locked append goes through
    real = append.records
    monkeypatch.setattr(
        append,
        "records",
        lambda prepared, now: appends.append(len(prepared)) or real(prepared, now),
    )
    assert store.check_transactions(lambda m: None, timeout_ms=0)["unknown"] == 2
    assert appends == [3]  # two new halves and one op record
    assert [h.body for h in store.open_transactions()] == [b"a", b"b"]
    assert all(store.transaction_status(h) == "open" for h in halves)  # in their copies


@pytest.mark.parametrize("where", ["same instance", "another process"])
def test_the_producer_resolves_a_half_a_check_put_back_by_the_offset_it_was_given(tmp_path, where):
    """As in RocketMQ, where a producer ends its transaction by its half's offsets:
    after checks answered UNKNOWN (twice: a copy of a copy), committing or rolling
    back the original half resolves the live copy, once, and no later check sees it."""
    root = str(tmp_path / "s")
    with MessageStore.open(root) as s:
        s.create_topic("t", queues=1)
        keep, drop = s.prepare_batch([Message("t", b"keep"), Message("t", b"drop")])
        for _ in range(2):
            assert s.check_transactions(lambda m: None, timeout_ms=0)["unknown"] == 2
        if where == "another process":
            s.close()
            s = MessageStore.open(root)
        assert s.transaction_status(keep) == "open"
        assert len(s.commit_transaction(keep)) == 1
        s.rollback_transaction(drop)
        assert s.commit_transaction(keep) == []  # idempotent
        if where == "same instance":
            with pytest.raises(TransactionError, match="already rolled back"):
                s.commit_transaction(drop)
        else:  # below the check progress a half reads "resolved", not how: a no-op
            assert s.commit_transaction(drop) == []
        assert (s.transaction_status(keep), s.transaction_status(drop)) in [
            ("committed", "rolled_back"),
            ("resolved", "resolved"),
        ]
        assert s.open_transactions() == []
        assert s.check_transactions(lambda m: True, timeout_ms=0)["commit"] == 0
        assert [m.body for m in s.pull("t", 0, 0).messages] == [b"keep"]
        s.close()


def test_a_copied_first_half_property_cannot_redirect_a_commit(tmp_path, monkeypatch):
    """RS_FIRST_HALF is how a put-back copy names the half its producer was given. A
    committed copy no longer carries it, and a prepare refuses it: a message that
    copied it (from a committed copy, by a pipeline passing properties on) turned a
    retried commit of an old half, below the check progress, into a commit of that
    unrelated message."""
    from rocketspark.errors import ConfigError
    from rocketspark.store import transaction

    monkeypatch.setattr(transaction, "PROGRESS_LAG", 150)
    path = tmp_path / "s"
    with MessageStore.open(path, **SMALL) as s:
        s.create_topic("out", queues=1)
        half = s.prepare(Message("out", b"checked"))
        assert s.check_transactions(lambda m: None, timeout_ms=0)["unknown"] == 1
        s.commit_transaction(half)
        committed = s.pull("out", 0, 0).messages
        assert [m.body for m in committed] == [b"checked"]
        assert "RS_FIRST_HALF" not in committed[0].properties
        copied = {"RS_FIRST_HALF": str(half.queue_offset)}
        for attempt in (
            lambda: s.prepare(Message("out", b"other", properties=copied)),
            lambda: s.prepare_batch([Message("out", b"other")], properties=copied),
            lambda: s.prepare_columns(
                [b"other"] * 100, topic="out", producer_group="pg", properties=[copied] * 100
            ),
            lambda: s.prepare_columns(
                [b"other"], topic="out", producer_group="pg", properties=[copied]
            ),
        ):
            with pytest.raises(ConfigError, match="RS_FIRST_HALF"):
                attempt()
        _five_resolved_batches(s)
        s.prepare(Message("out", b"other", properties={"copied": copied["RS_FIRST_HALF"]}))
    with MessageStore.open(path, **SMALL) as s:
        assert s.transaction_status(half) == "resolved"  # below the check progress
        assert s.commit_transaction(half) == []  # a retried commit: nothing to do
        assert [m.body for m in s.open_transactions()] == [b"other"]


# --- the check as a producer runs it over its own halves (the exactly-once sink) --------


def test_check_immediately_asks_about_young_halves_too(store):
    young = store.prepare(Message("out", b"young"))
    assert store.check_transactions(lambda m: True) == {
        "commit": 0,
        "rollback": 0,
        "unknown": 0,
        "discarded": 0,
    }
    counts = store.check_transactions(lambda m: True, immediately=True)
    assert counts == {"commit": 1, "rollback": 0, "unknown": 0, "discarded": 0}
    assert store.transaction_status(young) == "committed"


def test_check_of_one_producer_group_leaves_the_others_unread(store):
    mine = store.prepare(Message("out", b"mine"), producer_group="pg")
    theirs = store.prepare(Message("out", b"theirs"), producer_group="other")
    asked = []

    def rollback(half):
        asked.append(half.body)
        return "ROLLBACK"

    counts = store.check_transactions(rollback, producer_group="pg", immediately=True)
    assert counts["rollback"] == 1 and asked == [b"mine"]
    assert store.transaction_status(mine) == "rolled_back"
    assert store.transaction_status(theirs) == "open"
    assert [h.body for h in store.open_transactions()] == [b"theirs"]


def test_check_keeping_unknown_halves_leaves_them_where_they_are(store, clock):
    halves = store.prepare_batch([Message("out", b"a"), Message("out", b"b")])
    for _ in range(20):  # never put back, so never discarded after transactionCheckMax
        clock.advance(6001)
        counts = store.check_transactions(lambda m: None, unknown="keep")
        assert counts == {"commit": 0, "rollback": 0, "unknown": 2, "discarded": 0}
    open_ = store.open_transactions()
    assert [h.queue_offset for h in open_] == [h.queue_offset for h in halves]
    assert all("TRANSACTION_CHECK_TIMES" not in h.properties for h in open_)
    assert store.max_offset(TRANS_HALF_TOPIC, 0) == 2  # no copies
    store.commit_transaction(halves)
    assert [m.body for m in store.pull("out", 0, 0).messages] == [b"a", b"b"]


def test_check_skips_in_flight_halves_unread_and_asks_about_the_rest(store):
    batch = store.prepare_columns([b"x%d" % i for i in range(5)], topic="out", producer_group="pg")
    orphan = store.prepare(Message("out", b"orphan"), producer_group="pg")
    asked = []

    def answer(half):
        asked.append(half.queue_offset)
        return False

    counts = store.check_transactions(
        answer, producer_group="pg", immediately=True, unknown="keep", in_flight=batch
    )
    assert counts == {"commit": 0, "rollback": 1, "unknown": 0, "discarded": 0}
    assert asked == [orphan.queue_offset]
    assert store.transaction_status(orphan) == "rolled_back"
    assert {store.transaction_status(int(o)) for o in batch.queue_offsets} == {"open"}
    store.commit_transaction(batch)
    assert store.max_offset("out", 0) == 5


def test_a_narrowed_check_moves_the_check_progress_no_further_than_it_should(tmp_path):
    """A check of one producer group stops the check progress at the first half of
    another group; one that keeps UNKNOWN halves (a producer's own, as
    open_transactions) moves it only over halves resolved before it ran, so the
    halves it resolves keep their exact status."""
    from rocketspark.store.transaction import CHECK_GROUP

    def progress(s):
        return s.offsets.query(CHECK_GROUP, TRANS_HALF_TOPIC, 0)

    path = tmp_path / "s"
    with MessageStore.open(path, **SMALL) as s:
        s.create_topic("out", queues=1)
        first = s.prepare(Message("out", b"first"), producer_group="pg")
        theirs = s.prepare(Message("out", b"theirs"), producer_group="other")
        later = s.prepare(Message("out", b"later"), producer_group="pg")
        s.check_transactions(lambda m: True, producer_group="pg", timeout_ms=0)
        assert progress(s) == theirs.queue_offset
        kept = s.prepare(Message("out", b"kept"), producer_group="pg")
        s.check_transactions(
            lambda m: None if m.body == b"kept" else True, immediately=True, unknown="keep"
        )
        assert progress(s) == theirs.queue_offset  # it was open when the check began
        assert s.transaction_status(theirs) == "committed"
        s.check_transactions(lambda m: None, immediately=True, unknown="keep")
        assert progress(s) == kept.queue_offset
    with MessageStore.open(path, **SMALL) as s:
        assert [h.body for h in s.open_transactions()] == [b"kept"]
        assert {s.transaction_status(h) for h in (first, theirs, later)} == {"resolved"}
        assert s.transaction_status(kept) == "open"


def test_check_refuses_an_unknown_way_of_keeping_halves(store):
    from rocketspark.errors import ConfigError

    store.prepare(Message("out", b"x"))
    with pytest.raises(ConfigError, match="unknown must be"):
        store.check_transactions(lambda m: None, unknown="drop")  # type: ignore[arg-type]

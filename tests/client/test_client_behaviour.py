"""One behaviour suite for every Client backend (the ``client`` fixture's parameters).

Only ``rocketspark.client`` is used inside the tests, so a backend joins by
adding an entry to ``tests/helpers/backends.py``'s BACKENDS (which the data
source's end-to-end tests share): "embedded", a store of the test's own; "cluster",
a real RocketMQ; "serve", the remote client against our own server.
"""

from __future__ import annotations

import pickle
import threading
import time
import uuid

import pytest

from rocketspark.client import (
    Message,
    MessageQueue,
    TransactionState,
    close_all,
    connect,
)
from rocketspark.errors import (
    ConfigError,
    InvalidMessageError,
    OffsetOutOfRangeError,
    SinkJobEndedError,
    TransactionError,
    UnknownTopicError,
)
from tests.helpers.backends import FAST, PARAMS, make_backend


@pytest.fixture(params=PARAMS)
def client(request, tmp_path):
    # FAST: a retry is due a second after it is sent back
    yield make_backend(request, tmp_path, FAST).client
    close_all()


def _fresh(prefix: str) -> str:
    """A name no other test uses: a cluster is shared across tests."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _put(client, topic: str, n: int, **kw):
    return client.put_batch([Message(topic, f"{topic}-{i}".encode(), **kw) for i in range(n)])


# -- references ------------------------------------------------------------------------


def test_a_reference_pickles_and_connects_to_one_client_per_process(client):
    ref = client.ref
    again = pickle.loads(pickle.dumps(ref))
    assert again == ref and hash(again) == hash(ref)
    assert again.connect() is client and connect(again) is client


@pytest.mark.embedded_only
def test_a_directory_without_a_store_is_refused_and_left_alone(tmp_path):
    from rocketspark.errors import StorePathError

    with pytest.raises(StorePathError, match="no store"):
        connect(str(tmp_path / "nothing"))
    assert not (tmp_path / "nothing").exists()


# -- topics and queues -----------------------------------------------------------------


def test_topics_and_their_queues(client):
    orders = _fresh("orders")
    nope = _fresh("nope")
    info = client.create_topic(orders, queues=3)
    assert info.name == orders and info.read_queue_nums == 3
    assert client.has_topic(orders) and not client.has_topic(nope)
    assert orders in {t.name for t in client.topics()}
    assert client.topic(orders).write_queue_nums == 3
    queues = client.queues(orders)
    assert len(queues) == 3 and queues == sorted(queues)  # by broker, then queue id
    for broker in {q.broker for q in queues}:  # each broker's queues are 0, 1, ...
        ids = [q.queue_id for q in queues if q.broker == broker]
        assert ids == list(range(len(ids)))
    assert all(isinstance(q, MessageQueue) and q.topic == orders for q in queues)
    with pytest.raises(UnknownTopicError):
        client.topic(nope)
    with pytest.raises(UnknownTopicError):
        client.queues(nope)


# -- positions -------------------------------------------------------------------------


def test_offsets_are_the_next_to_read(client):
    orders = _fresh("orders")
    client.create_topic(orders, queues=1)
    (mq,) = client.queues(orders)
    assert (client.min_offset(mq), client.max_offset(mq)) == (0, 0)
    before = client.now_ms()
    _put(client, orders, 5)
    assert (client.min_offset(mq), client.max_offset(mq)) == (0, 5)
    assert client.offset_for_timestamp(mq, before - 60_000) == 0
    assert client.offset_for_timestamp(mq, client.now_ms() + 60_000) == 5


def test_group_offsets_are_committed_per_queue(client):
    orders = _fresh("orders")
    g = _fresh("g")
    other = _fresh("other")
    client.create_topic(orders, queues=2)
    q0, q1 = client.queues(orders)
    _put(client, orders, 4)
    assert client.committed_offset(g, q0) is None
    client.commit_offsets(g, {q0: 2, q1: 1})
    assert (client.committed_offset(g, q0), client.committed_offset(g, q1)) == (2, 1)
    assert client.committed_offset(other, q0) is None


# -- reading ---------------------------------------------------------------------------


def test_arrow_reads_have_the_row_schema_and_filter_by_tag(client):
    from rocketspark.client import ARROW_SCHEMA

    orders = _fresh("orders")
    client.create_topic(orders, queues=1)
    (mq,) = client.queues(orders)
    client.put_batch(
        [Message(orders, f"m{i}".encode(), tags="a" if i % 2 else "b") for i in range(6)]
    )
    batches, nxt = client.read_batches(mq, 0, 6)
    assert nxt == 6 and all(b.schema == ARROW_SCHEMA for b in batches)
    rows = [r for b in batches for r in b.to_pylist()]
    assert [r["body"] for r in rows] == [f"m{i}".encode() for i in range(6)]
    assert {r["brokerName"] for r in rows} == {mq.broker}
    batches, nxt = client.read_batches(mq, 1, 5, expression="a")
    assert nxt == 5
    assert [r["queueOffset"] for b in batches for r in b.to_pylist()] == [1, 3]
    _, nxt = client.read_batches(mq, 6, 10)
    assert nxt == 6  # nothing there yet


def test_arrow_reads_of_some_columns_filter_by_tag_without_the_tags_column(client):
    orders = _fresh("orders")
    client.create_topic(orders, queues=1)
    (mq,) = client.queues(orders)
    client.put_batch(
        [
            Message(orders, f"m{i}".encode(), tags="a" if i % 2 else "b", properties={"p": "v"})
            for i in range(6)
        ]
    )
    full, _ = client.read_batches(mq, 0, 6, expression="a")
    some, nxt = client.read_batches(mq, 0, 6, expression="a", columns=("body", "queueOffset"))
    assert nxt == 6 and all(b.schema.names == ["body", "queueOffset"] for b in some)
    assert [r for b in some for r in b.to_pylist()] == [
        {"body": r["body"], "queueOffset": r["queueOffset"]} for b in full for r in b.to_pylist()
    ]
    assert [r["queueOffset"] for b in some for r in b.to_pylist()] == [1, 3, 5]
    (props,) = {tuple(r["properties"]) for b in full for r in b.to_pylist()}
    assert props == (("p", "v"),)  # the broker's own properties are left out on every backend
    some, _ = client.read_batches(mq, 0, 6, columns=("properties", "tags"))
    assert [r for b in some for r in b.to_pylist()] == [
        {"properties": [("p", "v")], "tags": "a" if i % 2 else "b"} for i in range(6)
    ]


def test_a_message_is_found_by_msg_id_and_by_key(client):
    orders = _fresh("orders")
    client.create_topic(orders, queues=2)
    results = client.put_batch(
        [Message(orders, b"x", keys=["k1"]), Message(orders, b"y", keys=["k2"])]
    )
    got = client.get_message(results[1].msg_id)
    assert (got.body, got.msg_id, got.topic) == (b"y", results[1].msg_id, orders)
    if client.ref.kind == "embedded":
        assert client.message_id_at(results[0].commitlog_offset) == results[0].msg_id
    else:  # each broker has a CommitLog: an offset alone names no message
        with pytest.raises(ConfigError, match="msgId"):
            client.message_id_at(results[0].commitlog_offset)
    assert [m.body for m in client.query_by_key(orders, "k1")] == [b"x"]
    with pytest.raises((OffsetOutOfRangeError, ConfigError)):
        client.get_message(results[1].msg_id[:-16] + "00000000FFFFFFFF")


# -- writing ---------------------------------------------------------------------------


def test_columns_and_messages_land_alike(client):
    orders = _fresh("orders")
    client.create_topic(orders, queues=1)
    (mq,) = client.queues(orders)
    rs = client.put_columns([b"a", b"b"], topic=orders, tags=["t", None], keys=["k", None])
    assert [r.queue_offset for r in rs] == [0, 1]
    rs = client.put_batch([Message(orders, b"c", tags="t")])
    assert rs[0].queue_offset == 2
    rows = [r for b in client.read_batches(mq, 0, 3)[0] for r in b.to_pylist()]
    assert [(r["body"], r["tags"]) for r in rows] == [(b"a", "t"), (b"b", None), (b"c", "t")]


def test_columns_land_as_their_messages_would_over_several_queues(client):
    orders = _fresh("orders")
    client.create_topic(orders, queues=4)
    n = 2600  # more than a batch request's messages on some queue
    keys = [" k1  k2 ", ["a", "b"], ("c",), "", None, [], "k"]
    tags = ["t", None, "", "u"]
    bodies = [f"m{i}".encode() for i in range(n)]
    rs = client.put_columns(
        bodies,
        topic=orders,
        tags=[tags[i % 4] for i in range(n)],
        keys=[keys[i % 7] for i in range(n)],
    )
    assert len(rs) == n
    rows = {}
    for mq in client.queues(orders):
        got = [
            r for b in client.read_batches(mq, 0, client.max_offset(mq))[0] for r in b.to_pylist()
        ]
        offsets = [r["queueOffset"] for r in got]
        assert offsets == sorted(offsets)
        bodies_in_queue = [int(r["body"][1:]) for r in got]
        assert bodies_in_queue == sorted(bodies_in_queue)  # a queue keeps the order given
        rows.update({r["body"]: r for r in got})
    assert len(rows) == n
    want_keys = [["k1", "k2"], ["a", "b"], ["c"], [], [], [], ["k"]]
    for i, r in enumerate(rs):
        row = rows[bodies[i]]
        assert (row["queueId"], row["queueOffset"], row["msgId"], row["uniqKey"]) == (
            r.queue_id,
            r.queue_offset,
            r.msg_id,
            r.uniq_key,
        )
        assert row["tags"] == (tags[i % 4] or None)
        assert (row["keys"] or []) == want_keys[i % 7]
    assert len({r.uniq_key for r in rs}) == n
    assert rs[-1] == list(rs)[-1] == rs[n - 1] and rs[:2] + [] == list(rs)[:2]
    assert len(rs + rs[:1]) == n + 1 and len([] + rs) == n
    with pytest.raises(InvalidMessageError, match="empty"):
        client.put_columns([b"a", b""], topic=orders)
    with pytest.raises(InvalidMessageError, match="key"):
        client.put_columns([b"a", b"b"], topic=orders, keys=["k", ["x y"]])


# -- transactions ----------------------------------------------------------------------


def test_halves_are_invisible_until_ended(client):
    orders = _fresh("orders")
    pg = _fresh("pg")
    client.create_topic(orders, queues=1)
    (mq,) = client.queues(orders)
    halves = client.prepare_columns(
        [b"h1", b"h2", b"h3"],
        producer_group=pg,
        extra_properties={"RS_SINK": "s"},
        topic=orders,
    )
    offsets = [h.queue_offset for h in halves]
    if client.ref.kind == "embedded":  # (a broker's half queue has other producers' too)
        assert offsets == list(range(offsets[0], offsets[0] + 3))
    assert client.max_offset(mq) == 0
    first = client.halves(halves[:2], producer_group=pg)
    rest = client.halves(halves[2:], producer_group=pg)
    client.end_transactions(first, commit=True)
    client.end_transactions(rest, commit=False)
    assert _max_offset_reaches(client, mq, 2)
    (single,) = client.prepare_batch([Message(orders, b"one")], producer_group=pg)
    client.end_transactions(client.halves([single], producer_group=pg), commit=True)
    assert _max_offset_reaches(client, mq, 3)


def _max_offset_reaches(client, mq, want: int) -> bool:
    """Whether the max offset is ``want`` (on a cluster, within 10 s: a broker answers
    END_TRANSACTION before its ConsumeQueue has the committed copy)."""
    deadline = time.monotonic() + (10 if client.ref.kind == "cluster" else 0)
    while True:
        got = client.max_offset(mq)
        if got == want or got > want or time.monotonic() >= deadline:
            return got == want
        time.sleep(0.1)


@pytest.mark.embedded_only(
    "a broker ends a half again when asked (a second commit stores it twice), so ending is "
    "not idempotent on a cluster"
)
def test_ending_a_half_again_is_idempotent_and_the_other_way_refused(client):
    orders = _fresh("orders")
    pg = _fresh("pg")
    client.create_topic(orders, queues=1)
    (mq,) = client.queues(orders)
    halves = client.prepare_columns([b"h1", b"h2"], producer_group=pg, topic=orders)
    first = client.halves(halves[:1], producer_group=pg)
    rest = client.halves(halves[1:], producer_group=pg)
    client.end_transactions(first, commit=True)
    client.end_transactions(first, commit=True)  # idempotent
    client.end_transactions(rest, commit=False)
    assert client.max_offset(mq) == 1
    with pytest.raises(TransactionError):
        client.end_transactions(rest, commit=True)


def test_open_halves_are_decided_by_the_answer(client):
    orders = _fresh("orders")
    other_group = _fresh("other")
    pg = _fresh("pg")
    client.create_topic(orders, queues=1)
    (mq,) = client.queues(orders)
    halves = client.prepare_batch(
        [Message(orders, f"h{i}".encode()) for i in range(4)], producer_group=pg
    )
    (other,) = client.prepare_batch([Message(orders, b"theirs")], producer_group=other_group)
    offsets = [h.queue_offset for h in halves]
    verdict = {
        b"h0": TransactionState.COMMIT,
        b"h1": TransactionState.ROLLBACK,
        b"h2": TransactionState.UNKNOWN,
    }
    asked = []

    def answer(half):
        asked.append(half.body)
        return verdict[half.body]

    counts = client.check_transactions(pg, answer, in_flight=[offsets[3]])
    assert counts["commit"] == 1 and counts["rollback"] == 1
    assert sorted(asked) == [b"h0", b"h1", b"h2"]  # not the in-flight one, not theirs
    assert _max_offset_reaches(client, mq, 1)
    # UNKNOWN and in-flight halves stay open where they were: still ended by offset
    open_ = client.halves(halves[2:], producer_group=pg)
    client.end_transactions(open_ + client.halves([other], producer_group=other_group), commit=True)
    assert _max_offset_reaches(client, mq, 4)
    rows = [r["body"] for b in client.read_batches(mq, 0, 10)[0] for r in b.to_pylist()]
    assert sorted(rows) == [b"h0", b"h2", b"h3", b"theirs"]
    # every group's on a store of the test's own; a cluster is shared: these groups'
    groups = [None] if client.ref.kind == "embedded" else [pg, other_group]
    for group in groups:
        assert client.check_transactions(group, answer) == {
            "commit": 0,
            "rollback": 0,
            "unknown": 0,
        }


def test_true_and_false_answers_commit_and_roll_back_on_every_backend(client):
    orders = _fresh("orders")
    pg = _fresh("pg")
    client.create_topic(orders, queues=1)
    (mq,) = client.queues(orders)
    client.prepare_batch(
        [Message(orders, body) for body in (b"yes", b"no", b"later")], producer_group=pg
    )
    verdict = {b"yes": True, b"no": False, b"later": None}
    # (the answer is registered for the brokers' check-backs too: the same reading)
    counts = client.check_transactions(pg, lambda half: verdict[half.body])
    assert counts == {"commit": 1, "rollback": 1, "unknown": 1}
    assert _max_offset_reaches(client, mq, 1)
    rows = [r["body"] for b in client.read_batches(mq, 0, 10)[0] for r in b.to_pylist()]
    assert rows == [b"yes"]
    client.register_answer(pg, lambda half: False)  # every backend takes it
    assert client.check_transactions(pg, lambda half: False)["rollback"] == 1


# -- retries and dead letters ------------------------------------------------------------


def test_a_message_sent_back_comes_back_in_the_retry_topic_when_due(client):
    orders = _fresh("orders")
    g = _fresh("g")
    client.create_topic(orders, queues=1)
    client.ensure_group(g)
    (r,) = _put(client, orders, 1)
    assert client.send_back(g, [r.msg_id], properties=[{"WHY": "boom"}]) == 1
    assert client.has_topic(f"%RETRY%{g}")
    (retry,) = client.queues(f"%RETRY%{g}")
    deadline = time.time() + 10
    while client.max_offset(retry) == 0 and time.time() < deadline:
        client.tick()
        time.sleep(0.2)
    rows = [x for b in client.read_batches(retry, 0, 1)[0] for x in b.to_pylist()]
    assert [x["body"] for x in rows] == [f"{orders}-0".encode()]
    props = dict(rows[0]["properties"])
    assert props["WHY"] == "boom" and props["RETRY_TOPIC"] == orders
    assert rows[0]["reconsumeTimes"] == 1


# -- housekeeping ----------------------------------------------------------------------


def test_a_lock_is_exclusive_while_held(client):
    name = _fresh("t")
    order = []
    held = threading.Event()

    def other():
        held.wait(10)
        with client.lock(name):
            order.append("other")

    t = threading.Thread(target=other)
    t.start()
    with client.lock(name):
        held.set()
        time.sleep(0.3)
        order.append("first")
    t.join(10)
    assert order == ["first", "other"]


@pytest.mark.embedded_only(
    "a cluster's ledger records writers, not half offsets, and has no job gates: "
    "tests/cluster has its test"
)
def test_the_sink_ledger_records_batches_and_ends_jobs(client):
    sink, j1, j2 = _fresh("s"), _fresh("j1"), _fresh("j2")
    ledger = client.sink_ledger()
    assert ledger.get(sink) == (-1, None) and ledger.query(sink) is None
    ledger.begin(sink, 0, [(3, 5)], "q")
    assert ledger.get(sink) == (-1, (0, [(3, 5)])) and ledger.pending_query(sink) == "q"
    ledger.finish(sink, 0, "q")
    assert client.sink_ledger().get(sink) == (0, None) and ledger.query(sink) == "q"
    ledger.start_job(j1)
    writes = ledger.job_writes(j1)
    with writes.writing():
        pass
    with ledger.ending_job(j1):
        pass
    with pytest.raises(SinkJobEndedError), writes.writing():
        pass
    writes.close()
    ledger.start_job(j2)
    ledger.end_stale_jobs(client.now_ms() + 60_000)
    with pytest.raises(SinkJobEndedError), ledger.job_writes(j2).writing():
        pass

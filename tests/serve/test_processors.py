"""The NameServer and broker requests over a store: our remoting client against ``serve``.

Each test serves a store made in ``tmp_path`` on free ports and talks to it with
RemotingClient (requests one by one) and RemoteClient (the ``nameServer``
backend of the Client interface).
"""

from __future__ import annotations

import mmap
import multiprocessing
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from rocketspark.client import ClientRef
from rocketspark.client.remote import RemoteClient
from rocketspark.errors import RemotingFrameError
from rocketspark.message.model import Message, MessageQueue
from rocketspark.message.names import SubscriptionExpression
from rocketspark.message.record import decode_record
from rocketspark.message.results import PutResult, PutStatus
from rocketspark.remoting import headers as h
from rocketspark.remoting.client import RemotingClient
from rocketspark.remoting.codes import PullSysFlag, RequestCode, ResponseCode
from rocketspark.remoting.command import RemotingCommand
from rocketspark.remoting.connection import Connection
from rocketspark.remoting.processors import Served, serve
from rocketspark.remoting.processors.send import _put_code
from rocketspark.remoting.processors.transaction import check_message
from rocketspark.remoting.server import Reply
from rocketspark.store.message_store import MessageStore


def _topic(prefix: str = "serve") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def broker_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def store(tmp_path: Path, broker_port: int):
    # msgIds name the store host brokerIP1:listenPort: the broker port, as serve runs it
    with MessageStore.open(str(tmp_path / "store"), listenPort=broker_port) as s:
        yield s


@pytest.fixture
def served(store: MessageStore, broker_port: int):
    with serve(store, namesrv_port=0, broker_port=broker_port) as srv:
        yield srv


@pytest.fixture
def remoting(served: Served):
    client = RemotingClient(served.namesrv_address, timeout=10)
    yield client
    client.close()


@pytest.fixture
def remote(served: Served):
    client = RemoteClient(ClientRef("cluster", served.namesrv_address))
    yield client
    client.close()


def _records(body: bytes | memoryview | None) -> list:
    out = []
    data = bytes(body or b"")
    pos = 0
    while pos < len(data):
        msg = decode_record(data, pos)
        out.append(msg)
        pos += msg.store_size
    return out


def _pull_request(
    topic: str,
    queue_id: int,
    offset: int,
    *,
    max_nums: int = 32,
    suspend_ms: int = 0,
    expression: str = "*",
) -> RemotingCommand:
    flag = PullSysFlag.SUBSCRIPTION | (PullSysFlag.SUSPEND if suspend_ms else 0)
    header = h.PullMessageRequestHeader(
        consumer_group="g",
        topic=topic,
        queue_id=queue_id,
        queue_offset=offset,
        max_msg_nums=max_nums,
        sys_flag=flag,
        commit_offset=0,
        suspend_timeout_millis=suspend_ms,
        subscription=expression,
        sub_version=0,
        expression_type="TAG",
    )
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, header.to_ext_fields())


def test_routes_name_the_broker_port(store: MessageStore, remoting: RemotingClient, served: Served):
    topic = _topic()
    store.create_topic(topic, 3)
    route = remoting.route(topic)
    assert [q.broker_name for q in route.queue_datas] == [store.config.broker_name]
    assert route.queue_datas[0].read_queues == 3
    assert route.masters() == {store.config.broker_name: served.broker_address}
    assert served.broker_address != served.namesrv_address
    assert topic in remoting.topic_list()
    assert remoting.brokers() == {store.config.broker_name: {0: served.broker_address}}
    assert not remoting.has_topic(_topic("missing"))


def test_create_send_pull_offsets(remote: RemoteClient, store: MessageStore) -> None:
    topic = _topic()
    info = remote.create_topic(topic, queues=2)
    assert info.read_queue_nums == 2
    assert store.topic(topic).read_queue_nums == 2
    mqs = remote.queues(topic)
    assert [mq.queue_id for mq in mqs] == [0, 1]
    msgs = [
        Message(topic, f"body-{i}".encode(), tags="TagA", keys=(f"k{i}",), queue_id=0)
        for i in range(5)
    ]
    results = remote.put_batch(msgs)
    assert [r.queue_offset for r in results] == [0, 1, 2, 3, 4]
    mq = mqs[0]
    assert (remote.min_offset(mq), remote.max_offset(mq)) == (0, 5)
    # What the server stored is what the embedded store reads.
    pulled = store.pull(topic, 0, 0, 10)
    assert [m.body for m in pulled.messages] == [f"body-{i}".encode() for i in range(5)]
    assert [m.tags for m in pulled.messages] == ["TagA"] * 5
    assert [list(m.keys) for m in pulled.messages] == [[f"k{i}"] for i in range(5)]
    # And the remote read gives the same rows.
    batches, next_offset = remote.read_batches(mq, 0, 5)
    assert next_offset == 5
    rows = [r for b in batches for r in b.to_pylist()]
    assert [bytes(r["body"]) for r in rows] == [f"body-{i}".encode() for i in range(5)]
    # Consumer offsets.
    group = _topic("group")
    assert remote.committed_offset(group, mq) is None
    remote.commit_offsets(group, {mq: 3})
    assert remote.committed_offset(group, mq) == 3
    assert store.committed_offset(group, topic, 0) == 3
    # By time.
    assert remote.offset_for_timestamp(mq, 0) == 0
    assert remote.offset_for_timestamp(mq, int(time.time() * 1000) + 60_000) == 5


def test_send_single_v1_and_v2(remoting: RemotingClient, store: MessageStore) -> None:
    topic = _topic()
    store.create_topic(topic, 1)
    mq = MessageQueue(topic, store.config.broker_name, 0)
    answer = remoting.send(
        mq,
        b"hello",
        producer_group="pg",
        properties="TAGS\x01t1\x02KEYS\x01a b\x02UNIQ_KEY\x01ABCDEF0123\x02",
        born_timestamp=123,
    )
    assert answer.queue_offset == 0
    msg = store.pull(topic, 0, 0, 1).messages[0]
    assert (msg.body, msg.tags, list(msg.keys), msg.uniq_key) == (
        b"hello",
        "t1",
        ["a", "b"],
        "ABCDEF0123",
    )
    assert msg.born_timestamp == 123
    assert answer.offset_msg_id == msg.msg_id


def test_pull_answers_statuses(remoting: RemotingClient, store: MessageStore, served: Served):
    topic = _topic()
    store.create_topic(topic, 1)
    with Connection(served.broker_address) as conn:
        empty = conn.invoke(_pull_request(topic, 0, 0), 5)
        assert empty.code == ResponseCode.PULL_NOT_FOUND
        assert empty.ext_fields["nextBeginOffset"] == "0"
        store.put_batch([Message(topic, b"x%d" % i, tags="A" if i % 2 else "B") for i in range(6)])
        found = conn.invoke(_pull_request(topic, 0, 1, max_nums=2), 5)
        assert found.code == ResponseCode.SUCCESS
        assert [m.body for m in _records(found.body)] == [b"x1", b"x2"]
        assert found.ext_fields["nextBeginOffset"] == "3"
        assert (found.ext_fields["minOffset"], found.ext_fields["maxOffset"]) == ("0", "6")
        tagged = conn.invoke(_pull_request(topic, 0, 0, expression="A"), 5)
        assert [m.body for m in _records(tagged.body)] == [b"x1", b"x3", b"x5"]
        at_end = conn.invoke(_pull_request(topic, 0, 6), 5)
        assert at_end.code == ResponseCode.PULL_NOT_FOUND
        beyond = conn.invoke(_pull_request(topic, 0, 60), 5)
        assert beyond.code == ResponseCode.PULL_OFFSET_MOVED
        assert beyond.ext_fields["nextBeginOffset"] == "6"
        unmatched = conn.invoke(_pull_request(topic, 0, 4, expression="Z"), 5)
        assert unmatched.code == ResponseCode.PULL_RETRY_IMMEDIATELY
        assert unmatched.ext_fields["nextBeginOffset"] == "6"
        missing = conn.invoke(_pull_request(_topic("missing"), 0, 0), 5)
        assert missing.code == ResponseCode.TOPIC_NOT_EXIST


def test_send_to_missing_topic(remoting: RemotingClient, store: MessageStore) -> None:
    mq = MessageQueue(_topic("missing"), store.config.broker_name, 0)
    from rocketspark.errors import RemotingCommandError

    with Connection(remoting.broker_master(store.config.broker_name)) as conn:
        header = h.SendMessageRequestHeader(
            producer_group="pg", topic=mq.topic, queue_id=0, born_timestamp=1
        ).to_v2()
        r = conn.invoke(
            RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header.to_ext_fields(), body=b"x"),
            5,
        )
        assert r.code == ResponseCode.TOPIC_NOT_EXIST
    assert RemotingCommandError  # the client raises it for such answers


def test_long_poll_woken_by_a_put(store: MessageStore, served: Served) -> None:
    topic = _topic()
    store.create_topic(topic, 2)
    with Connection(served.broker_address) as conn:
        held = conn.invoke_async(_pull_request(topic, 0, 0, suspend_ms=10_000), 15)
        other = conn.invoke_async(_pull_request(topic, 1, 0, suspend_ms=300), 15)
        deadline = time.monotonic() + 5
        while served.broker.holds.held < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert not held.done()
        started = time.monotonic()
        store.put(Message(topic, b"wake", queue_id=0))
        answer = held.result(5)
        woke = time.monotonic() - started
        assert answer.code == ResponseCode.SUCCESS
        assert [m.body for m in _records(answer.body)] == [b"wake"]
        assert woke < 1.0, woke
        # The pull of the other queue was not woken by it: it times out empty.
        timed_out = other.result(5)
        assert timed_out.code == ResponseCode.PULL_NOT_FOUND
    assert served.broker.holds.held == 0


def _put_from_another_process(root: str, topic: str) -> None:
    with MessageStore.open(root) as s:
        s.put(Message(topic, b"from afar", queue_id=0))


def test_long_poll_woken_by_another_process(store: MessageStore, served: Served) -> None:
    topic = _topic()
    store.create_topic(topic, 1)
    with Connection(served.broker_address) as conn:
        held = conn.invoke_async(_pull_request(topic, 0, 0, suspend_ms=20_000), 30)
        deadline = time.monotonic() + 5
        while served.broker.holds.held < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        ctx = multiprocessing.get_context("spawn")
        p = ctx.Process(target=_put_from_another_process, args=(store.root, topic))
        p.start()
        p.join(60)
        assert p.exitcode == 0
        answer = held.result(5)
        assert answer.code == ResponseCode.SUCCESS
        assert [m.body for m in _records(answer.body)] == [b"from afar"]


def test_held_pull_of_a_closed_connection_is_dropped(store: MessageStore, served: Served) -> None:
    topic = _topic()
    store.create_topic(topic, 1)
    conn = Connection(served.broker_address)
    conn.invoke_async(_pull_request(topic, 0, 0, suspend_ms=20_000), 30)
    deadline = time.monotonic() + 5
    while served.broker.holds.held < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    conn.close()
    store.put(Message(topic, b"nobody", queue_id=0))
    deadline = time.monotonic() + 5
    while served.broker.holds.held and time.monotonic() < deadline:
        time.sleep(0.005)
    assert served.broker.holds.held == 0
    with Connection(served.broker_address) as again:
        assert again.invoke(_pull_request(topic, 0, 0), 5).code == ResponseCode.SUCCESS


def test_remote_reader_waits_for_new_messages(remote: RemoteClient, store: MessageStore) -> None:
    topic = _topic()
    remote.create_topic(topic, queues=1)
    (mq,) = remote.queues(topic)
    got: list = []

    def read() -> None:
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            batches, _ = remote.read_batches(mq, 0, remote.max_offset(mq))
            got.extend(r for b in batches for r in b.to_pylist())
            time.sleep(0.01)

    t = threading.Thread(target=read)
    t.start()
    time.sleep(0.05)
    store.put(Message(topic, b"later", queue_id=0))
    t.join(15)
    assert [bytes(r["body"]) for r in got] == [b"later"]


def test_heartbeat_and_consumer_list(remoting: RemotingClient, served: Served) -> None:
    import json

    body = json.dumps(
        {
            "clientID": "10.0.0.1@1",
            "consumerDataSet": [{"groupName": "cg1", "subscriptionDataSet": []}],
            "producerDataSet": [{"groupName": "pg1"}],
        }
    ).encode()
    with Connection(served.broker_address) as conn:
        r = conn.invoke(RemotingCommand.request(RequestCode.HEART_BEAT, body=body), 5)
        assert r.code == ResponseCode.SUCCESS
        ask = h.GetConsumerListByGroupRequestHeader(consumer_group="cg1")
        r = conn.invoke(
            RemotingCommand.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, ask.to_ext_fields()), 5
        )
        assert json.loads(bytes(r.body or b""))["consumerIdList"] == ["10.0.0.1@1"]
    # Gone with its connection.
    deadline = time.monotonic() + 5
    while served.broker_server.channels and time.monotonic() < deadline:
        time.sleep(0.01)
    with Connection(served.broker_address) as conn:
        r = conn.invoke(
            RemotingCommand.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, ask.to_ext_fields()), 5
        )
        assert r.code == ResponseCode.SYSTEM_ERROR


def test_one_port_serves_both(store: MessageStore) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with serve(store, namesrv_port=port, broker_port=port) as srv:
        assert srv.namesrv_address == srv.broker_address
        client = RemoteClient(ClientRef("cluster", srv.namesrv_address))
        try:
            topic = _topic()
            client.create_topic(topic, queues=1)
            client.put_batch([Message(topic, b"one")])
            (mq,) = client.queues(topic)
            assert client.max_offset(mq) == 1
        finally:
            client.close()


def test_long_poll_wake_up_latency(store: MessageStore, served: Served) -> None:
    """A held pull answers soon after a put reaches its queue (the goal: p99 under 5 ms;
    asserted loosely here, as tests share the machine)."""
    topic = _topic()
    store.create_topic(topic, 1)
    waits = []
    with Connection(served.broker_address) as conn:
        for i in range(100):
            future = conn.invoke_async(_pull_request(topic, 0, i, suspend_ms=10_000), 15)
            deadline = time.monotonic() + 5
            while served.broker.holds.held < 1 and time.monotonic() < deadline:
                time.sleep(0.0005)
            store.put(Message(topic, b"x", queue_id=0))
            put_done = time.monotonic()
            assert future.result(5).code == ResponseCode.SUCCESS
            waits.append(time.monotonic() - put_done)
    waits.sort()
    p99 = waits[98]
    assert p99 < 0.05, f"p50 {waits[50] * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms"


def test_delayed_message_delivered_by_the_server(tmp_path: Path) -> None:
    fast = " ".join(["1s"] * 18)
    with MessageStore.open(str(tmp_path / "delayed"), messageDelayLevel=fast) as store:
        with serve(store, namesrv_port=0, broker_port=0) as srv:
            topic = _topic()
            store.create_topic(topic, 1)
            client = RemotingClient(srv.namesrv_address, timeout=10)
            try:
                mq = MessageQueue(topic, store.config.broker_name, 0)
                sent = time.monotonic()
                client.send(
                    mq,
                    b"later",
                    producer_group="pg",
                    properties="DELAY\x012\x02TAGS\x01d\x02",
                    born_timestamp=int(time.time() * 1000),
                )
                assert store.max_offset(topic, 0) == 0  # not yet
                with Connection(srv.broker_address) as conn:
                    answer = conn.invoke(_pull_request(topic, 0, 0, suspend_ms=10_000), 15)
                waited = time.monotonic() - sent
                assert answer.code == ResponseCode.SUCCESS
                (msg,) = _records(answer.body)
                assert (msg.body, msg.tags) == (b"later", "d")
                assert 0.8 < waited < 5, waited
            finally:
                client.close()


def test_remote_prepare_commit_and_rollback(remote: RemoteClient, store: MessageStore) -> None:
    topic = _topic()
    remote.create_topic(topic, queues=1)
    group = _topic("txgroup")
    committed = remote.prepare_batch(
        [Message(topic, b"c%d" % i, queue_id=0) for i in range(3)], producer_group=group
    )
    rolled = remote.prepare_batch([Message(topic, b"r", queue_id=0)], producer_group=group)
    assert store.max_offset(topic, 0) == 0
    assert len(store.open_transactions(group)) == 4
    remote.end_transactions(remote.halves(committed, producer_group=group), commit=True)
    remote.end_transactions(remote.halves(rolled, producer_group=group), commit=False)
    deadline = time.monotonic() + 10
    while store.open_transactions(group) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert store.open_transactions(group) == []
    assert [m.body for m in store.pull(topic, 0, 0, 10).messages] == [b"c0", b"c1", b"c2"]


def test_remote_lock_is_exclusive(served: Served) -> None:
    first = RemoteClient(ClientRef("cluster", served.namesrv_address))
    second = RemoteClient(ClientRef("cluster", served.namesrv_address))
    order: list[str] = []
    try:
        with first.lock("job"):
            t = threading.Thread(target=lambda: _hold(second, order))
            t.start()
            time.sleep(0.5)
            order.append("first done")
        t.join(10)
        assert order == ["first done", "second held"]
    finally:
        first.close()
        second.close()


def _hold(client: RemoteClient, order: list[str]) -> None:
    with client.lock("job"):
        order.append("second held")


def test_read_raw_views_the_mapped_segment(store: MessageStore) -> None:
    topic = _topic()
    store.create_topic(topic, 2)
    other = _topic()
    store.create_topic(other, 1)
    store.put_batch([Message(topic, b"a%d" % i, tags="A", queue_id=0) for i in range(3)])
    store.put(Message(other, b"between", queue_id=0))
    store.put_batch([Message(topic, b"b%d" % i, tags="B", queue_id=0) for i in range(3)])
    read = store.read_raw(topic, 0, 0, 32, 1 << 20)
    # Two runs of adjacent records (the other topic's record lies between them).
    assert len(read.parts) == 2 and read.count == 6
    assert all(isinstance(p.obj, mmap.mmap) for p in read.parts)  # views, not copies
    assert [m.body for m in _records(b"".join(read.parts))] == [
        b"a0",
        b"a1",
        b"a2",
        b"b0",
        b"b1",
        b"b2",
    ]
    assert (read.next_offset, read.min_offset, read.max_offset) == (6, 0, 6)
    tagged = store.read_raw(topic, 0, 0, 32, 1 << 20, SubscriptionExpression("B").codes)
    assert [m.body for m in _records(b"".join(tagged.parts))] == [b"b0", b"b1", b"b2"]
    one_size = store.pull(topic, 0, 0, 1).messages[0].store_size
    capped = store.read_raw(topic, 0, 1, 32, one_size * 2)
    assert (capped.count, capped.next_offset) == (2, 3)
    assert store.read_raw(topic, 0, 6, 32, 1 << 20).status.name == "NO_NEW_MSG"
    assert store.read_raw(topic, 1, 0, 32, 1 << 20).status.name == "NO_NEW_MSG"


def test_messages_by_id_and_key(remote: RemoteClient, store: MessageStore) -> None:
    topic = _topic()
    remote.create_topic(topic, queues=1)
    (result,) = remote.put_batch([Message(topic, b"find me", keys=("needle",))])
    msg = remote.get_message(result.msg_id)
    assert (msg.body, list(msg.keys)) == (b"find me", ["needle"])
    found = remote.query_by_key(topic, "needle")
    assert [m.body for m in found] == [b"find me"]
    assert remote.query_by_key(topic, "nothing") == []


def test_a_put_whose_sync_flush_timed_out_is_answered_flush_disk_timeout():
    def result(status: PutStatus) -> PutResult:
        return PutResult(status, "t", 0, 0, 0, "id", "uniq", 0, 0, "broker-a")

    assert _put_code([result(PutStatus.PUT_OK)] * 2) == ResponseCode.SUCCESS
    flushed_late = [result(PutStatus.PUT_OK), result(PutStatus.FLUSH_DISK_TIMEOUT)]
    assert _put_code(flushed_late) == ResponseCode.FLUSH_DISK_TIMEOUT


@pytest.mark.parametrize("topic_length", [12, 127])
def test_a_check_back_carries_the_real_topic_and_queue(store: MessageStore, topic_length: int):
    """The record a check-back sends is the half's with REAL_TOPIC and REAL_QID as its topic
    and queue (RocketMQ's sendCheckMessage), every other field as stored."""
    topic = ("t" + uuid.uuid4().hex * 10)[:topic_length]
    store.create_topic(topic, 4)
    store.prepare(Message(topic, b"half body", tags="A", keys=("k1",), queue_id=3))
    (half,) = store.open_transactions()
    assert half.topic != topic and half.queue_id != 3
    record = store.record_view(half.commitlog_offset, half.store_size)
    sent = decode_record(check_message(record, half))
    assert (sent.topic, sent.queue_id) == (topic, 3)
    assert sent.properties == half.properties  # REAL_TOPIC / REAL_QID stay, as RocketMQ's do
    assert sent.store_size == len(check_message(record, half))
    for field in ("body", "queue_offset", "commitlog_offset", "msg_id", "born_timestamp"):
        assert getattr(sent, field) == getattr(half, field), field
    assert (sent.sys_flag, sent.flag, sent.body_crc) == (half.sys_flag, half.flag, half.body_crc)


def _wakeups(thread_name: str) -> int:
    """How many times a thread of this process has been run (Linux schedstat)."""
    (thread,) = [t for t in threading.enumerate() if t.name == thread_name]
    stat = Path(f"/proc/self/task/{thread.native_id}/schedstat")
    if not stat.exists():
        pytest.skip("needs /proc/<pid>/task/<tid>/schedstat")
    return int(stat.read_text().split()[2])


def test_the_hold_service_sleeps_while_nothing_is_held(store: MessageStore, served: Served):
    topic = _topic()
    store.create_topic(topic, 1)
    with Connection(served.broker_address) as conn:
        assert conn.invoke(_pull_request(topic, 0, 0, suspend_ms=100), 5).code == (
            ResponseCode.PULL_NOT_FOUND
        )
    assert served.broker.holds.held == 0
    time.sleep(0.1)
    before = _wakeups("rocketspark-serve-pull-hold")
    time.sleep(2.5)
    assert _wakeups("rocketspark-serve-pull-hold") - before <= 1


def test_a_held_pull_with_an_earlier_deadline_is_answered_at_it(
    store: MessageStore, served: Served
) -> None:
    topic = _topic()
    store.create_topic(topic, 2)
    with Connection(served.broker_address) as conn:
        late = conn.invoke_async(_pull_request(topic, 0, 0, suspend_ms=20_000), 30)
        deadline = time.monotonic() + 5
        while served.broker.holds.held < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        started = time.monotonic()
        early = conn.invoke_async(_pull_request(topic, 1, 0, suspend_ms=200), 30)
        assert early.result(5).code == ResponseCode.PULL_NOT_FOUND
        assert 0.15 < time.monotonic() - started < 1.5
        assert not late.done()
        store.put(Message(topic, b"late", queue_id=0))
        assert late.result(5).code == ResponseCode.SUCCESS


def test_end_transaction_does_not_wait_behind_sends(store: MessageStore, served: Served) -> None:
    """END_TRANSACTION has its own work queue: a commit is served while sends are stuck."""
    topic = _topic()
    store.create_topic(topic, 1)
    half = store.prepare(Message(topic, b"half"), producer_group="pg")
    sends = served.broker_server.work_queue("send", threads=1, capacity=10_000)
    release = threading.Event()
    assert sends.try_submit(release.wait, 30)  # the send thread is busy until released
    try:
        header = h.EndTransactionRequestHeader(
            producer_group="pg",
            tran_state_table_offset=half.queue_offset,
            commit_log_offset=half.commitlog_offset,
            commit_or_rollback=8,  # TRANSACTION_COMMIT
            msg_id=half.msg_id,
        )
        with Connection(served.broker_address) as conn:
            end = conn.invoke(
                RemotingCommand.request(RequestCode.END_TRANSACTION, header.to_ext_fields()), 5
            )
            assert end.code == ResponseCode.SUCCESS
            assert [m.body for m in store.pull(topic, 0, 0, 10).messages] == [b"half"]
            send = conn.invoke_async(
                RemotingCommand.request(
                    RequestCode.SEND_MESSAGE_V2,
                    h.SendMessageRequestHeader(
                        producer_group="pg", topic=topic, queue_id=0, born_timestamp=1
                    )
                    .to_v2()
                    .to_ext_fields(),
                    body=b"after",
                ),
                15,
            )
            time.sleep(0.1)
            assert not send.done()  # behind the stuck one
            release.set()
            assert send.result(10).code == ResponseCode.SUCCESS
    finally:
        release.set()


def test_pipelined_sends_of_a_connection_are_stored_in_order(
    store: MessageStore, served: Served
) -> None:
    topic = _topic()
    store.create_topic(topic, 1)
    header = (
        h.SendMessageRequestHeader(producer_group="pg", topic=topic, queue_id=0, born_timestamp=1)
        .to_v2()
        .to_ext_fields()
    )
    with Connection(served.broker_address) as conn:
        futures = [
            conn.invoke_async(
                RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header, body=b"%d" % i), 30
            )
            for i in range(300)
        ]
        assert all(f.result(30).code == ResponseCode.SUCCESS for f in futures)
    stored = store.pull(topic, 0, 0, 1000).messages
    assert [m.body for m in stored] == [b"%d" % i for i in range(300)]


def test_a_group_made_at_once_by_many_pulls(store: MessageStore, served: Served) -> None:
    """Pull threads that all see a group's retry topic missing make it once, and every
    pull is answered as for an existing topic."""
    group = f"race-{uuid.uuid4().hex[:8]}"
    retry = f"%RETRY%{group}"
    barrier = threading.Barrier(12)
    codes: list[int] = []

    def pull() -> None:
        with Connection(served.broker_address) as conn:
            barrier.wait(10)
            codes.append(conn.invoke(_pull_request(retry, 0, 0), 10).code)

    threads = [threading.Thread(target=pull) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert codes == [ResponseCode.PULL_NOT_FOUND] * 12
    assert store.topic(retry).read_queue_nums == 1
    assert store.groups.get(group) is not None


def test_a_retry_topic_made_meanwhile_is_not_changed(
    store: MessageStore, served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group's retry topic is made only if absent, decided under the table's locks: one
    made by another thread between the check and the making keeps its queues."""
    group = f"race-{uuid.uuid4().hex[:8]}"
    retry = f"%RETRY%{group}"
    store.create_topic(retry, 3)  # by mqadmin, say, just after the check below
    monkeypatch.setattr(store, "has_topic", lambda topic: False)  # the check, made before
    served.broker.clients.ensure_group(group)
    monkeypatch.undo()
    assert store.topic(retry).read_queue_nums == 3


@pytest.fixture
def small_segments(tmp_path: Path):
    """A store of 8 KiB CommitLog segments holding 60 records over several, served."""
    with MessageStore.open(str(tmp_path / "small"), mappedFileSizeCommitLog=8192) as s:
        s.create_topic("t", 1)
        for i in range(60):
            s.put(Message("t", b"x" * 200 + b"%03d" % i))
        s.flush()
        with serve(s, namesrv_port=0, broker_port=0) as srv:
            yield s, srv


def _deleted_segments_mapped(store: MessageStore) -> list[str]:
    directory = str(Path(store.root) / "commitlog")
    with open("/proc/self/maps") as maps:
        return [line for line in maps if directory in line and "(deleted)" in line]


def test_a_reply_outlives_the_deletion_of_its_segments(small_segments) -> None:
    """Views of a reply still being written stay valid when retention deletes their
    segment: the file is unlinked, not truncated, and unmapped when the views go."""
    store, served = small_segments
    reply = served.broker.pulls.pull(_pull_request("t", 0, 0, max_nums=5), None)  # type: ignore[arg-type]
    assert isinstance(reply, Reply)
    assert store.delete_expired(reserved_hours=0)["commitlog"] >= 1
    assert _deleted_segments_mapped(store)  # held by the reply's views
    sent = b"".join(bytes(p) for p in reply.parts)  # the reply, written now
    assert [m.body[-3:] for m in _records(sent)] == [b"%03d" % i for i in range(5)]
    del reply
    assert not _deleted_segments_mapped(store)  # gone with the last view


def test_a_pull_that_found_its_segment_before_retention_deleted_it(small_segments) -> None:
    """A pull that found its segment just before retention deleted it still reads it."""
    store, served = small_segments
    commit_log = store.commit_log
    find = commit_log.segment

    def found_then_deleted(phy: int):
        del commit_log.segment  # once
        f = find(phy)
        assert store.delete_expired(reserved_hours=0)["commitlog"] >= 1
        return f

    commit_log.segment = found_then_deleted  # type: ignore[method-assign]
    with Connection(served.broker_address) as conn:
        r = conn.invoke(_pull_request("t", 0, 0, max_nums=5), 5)
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert [m.body[-3:] for m in _records(r.body)] == [b"%03d" % i for i in range(5)]


def test_a_pull_whose_segment_retention_deleted_is_told_the_offset_moved(small_segments) -> None:
    """A pull that read the queue's min offset before retention deleted the segment, and
    looked for the segment after, is answered PULL_OFFSET_MOVED to the new min offset."""
    store, served = small_segments
    commit_log = store.commit_log
    find = commit_log.segment

    def deleted_then_found(phy: int):
        del commit_log.segment  # once
        assert store.delete_expired(reserved_hours=0)["commitlog"] >= 1
        return find(phy)

    commit_log.segment = deleted_then_found  # type: ignore[method-assign]
    with Connection(served.broker_address) as conn:
        r = conn.invoke(_pull_request("t", 0, 0, max_nums=5), 5)
    assert r.code == ResponseCode.PULL_OFFSET_MOVED, r.remark
    assert int(r.ext_fields["nextBeginOffset"]) == store.min_offset("t", 0) > 0


_KILLED_CLIENT = """
import socket, sys, time
frames = open(sys.argv[2], "rb").read()
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
sock.sendall(frames)
sock.recv(65536)  # the first answer has begun
print("pulling", flush=True)
time.sleep(60)
"""


def test_a_client_killed_mid_pull_troubles_nobody(
    store: MessageStore, served: Served, tmp_path: Path
) -> None:
    """A client process SIGKILLed while the broker writes it 8 pull answers of ~4 MiB:
    its connection goes, its unsent answers with it, and the next client is served."""
    import signal
    import subprocess
    import sys

    topic = _topic()
    store.create_topic(topic, 1)
    store.put_columns([b"x" * 4000] * 1024, topic=topic, queue_ids=[0] * 1024)
    frames = tmp_path / "pulls.bin"
    frames.write_bytes(
        b"".join(
            _pull_request(topic, 0, 0, max_nums=1024).with_opaque(i + 1).to_bytes()
            for i in range(8)  # 32 MiB: under the backlog cap, the kill ends it
        )
    )
    before = len(served.broker_server.channels)
    port = int(served.broker_address.rsplit(":", 1)[1])
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_CLIENT, str(port), str(frames)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "pulling"
        time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    store.put(Message(topic, b"after", queue_id=0))
    with Connection(served.broker_address) as again:
        answer = again.invoke(_pull_request(topic, 0, 1024), 10)
        assert answer.code == ResponseCode.SUCCESS
        assert [r.body for r in _records(answer.body)] == [b"after"]
    deadline = time.monotonic() + 10  # both connections gone: the killed one's and again's
    while len(served.broker_server.channels) > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(served.broker_server.channels) == before


@pytest.mark.parametrize("opaque", [0, 7, 2**31 - 1, -(2**31)])
def test_a_found_pull_is_answered_with_the_bytes_of_the_generic_encoding(
    store: MessageStore, served: Served, opaque: int
) -> None:
    """A found pull's answer has a header formatted from a template: the same bytes as
    the response ok() makes, encoded."""
    topic = _topic()
    store.create_topic(topic, 1)
    store.put_batch([Message(topic, b"m%d" % i) for i in range(40)])
    request = _pull_request(topic, 0, 3, max_nums=32).with_opaque(opaque)
    reply = served.broker.pulls.pull(request, None)  # type: ignore[arg-type]
    assert isinstance(reply, Reply) and reply.head is not None
    body = b"".join(bytes(p) for p in reply.parts)
    header = h.PullMessageResponseHeader(
        suggest_which_broker_id=0, next_begin_offset=35, min_offset=0, max_offset=40
    )
    expected = RemotingCommand.response_to(
        request, ResponseCode.SUCCESS, None, header.to_ext_fields(), body=body
    )
    assert reply.head + body == expected.to_bytes()
    assert [m.body for m in _records(body)] == [b"m%d" % i for i in range(3, 35)]


def test_a_pull_header_missing_a_field_is_answered_as_the_header_parse_says(
    served: Served,
) -> None:
    request = _pull_request(_topic(), 0, 0)
    fields = dict(request.ext_fields)
    del fields["subVersion"]
    with pytest.raises(RemotingFrameError) as parse:
        h.PullMessageRequestHeader.from_ext_fields(fields)
    with Connection(served.broker_address) as conn:
        r = conn.invoke(RemotingCommand.request(RequestCode.PULL_MESSAGE, fields), 5)
        bad = conn.invoke(
            RemotingCommand.request(RequestCode.PULL_MESSAGE, {**fields, "subVersion": "x"}), 5
        )
    assert r.code == ResponseCode.SYSTEM_ERROR
    assert r.remark == f"{type(parse.value).__name__}: {parse.value}"
    assert bad.code == ResponseCode.SYSTEM_ERROR and "'subVersion'" in (bad.remark or "")


def test_held_pulls_of_a_connection_go_when_it_closes(store: MessageStore, served: Served):
    """Without a put: the hold service does not keep them (polling) until their deadline."""
    topic = _topic()
    store.create_topic(topic, 2)
    conn = Connection(served.broker_address)
    for queue_id in (0, 1):
        conn.invoke_async(_pull_request(topic, queue_id, 0, suspend_ms=20_000), 30)
    deadline = time.monotonic() + 5
    while served.broker.holds.held < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert served.broker.holds.held == 2
    conn.close()
    deadline = time.monotonic() + 5
    while served.broker.holds.held and time.monotonic() < deadline:
        time.sleep(0.005)
    assert served.broker.holds.held == 0


def test_read_raw_answers_adjacent_records_as_one_view(tmp_path: Path) -> None:
    """Records that follow each other in one segment are one view; gaps, a segment's end
    and the byte limit cut them, and every answer holds the records of the range."""
    with MessageStore.open(str(tmp_path / "s"), mappedFileSizeCommitLog=8192) as s:
        s.create_topic("t", 2)
        for i in range(0, 60, 6):  # runs of 3 records of a queue, the other's between
            s.put_batch(
                [Message("t", b"x" * 200 + b"%03d" % (i + k), queue_id=0) for k in range(3)]
            )
            s.put_batch([Message("t", b"y%d" % (i + k), queue_id=1) for k in range(3)])
        bodies = [m.body for m in s.pull("t", 0, 0, 100).messages]
        size = s.pull("t", 0, 0, 1).messages[0].store_size
        for offset in range(30):
            for max_msgs in (1, 2, 3, 5, 32):
                for max_bytes in (1, size, 2 * size + 1, 1 << 20):
                    read = s.read_raw("t", 0, offset, max_msgs, max_bytes)
                    n = min(max_msgs, max(1, max_bytes // size), 30 - offset)
                    got = [m.body for m in _records(b"".join(read.parts))]
                    assert got == bodies[offset : offset + n], (offset, max_msgs, max_bytes)
                    assert (read.count, read.size, read.next_offset) == (n, n * size, offset + n)
                    assert all(isinstance(p.obj, mmap.mmap) for p in read.parts)
        one_run = s.read_raw("t", 0, 0, 3, 1 << 20)
        assert len(one_run.parts) == 1
        assert len(s.read_raw("t", 0, 0, 6, 1 << 20).parts) == 2  # the other queue between
        segments = {
            s.commit_log.segment(m.commitlog_offset).start_offset
            for m in s.pull("t", 0, 0, 30).messages
        }
        assert len(segments) > 1


def test_a_pull_of_an_unknown_topic_is_answered_topic_not_exist_first(served: Served) -> None:
    """Before the expression's type or text is looked at, and nothing is committed."""
    missing = _topic("missing")
    plain = _pull_request(missing, 0, 0)
    committing = dict(plain.ext_fields, sysFlag=str(PullSysFlag.COMMIT_OFFSET), commitOffset="3")
    with Connection(served.broker_address) as conn:
        for fields in (
            plain.ext_fields,
            committing,
            dict(plain.ext_fields, expressionType="SQL92", subscription="a > 1"),
            dict(plain.ext_fields, subscription="||"),
        ):
            r = conn.invoke(RemotingCommand.request(RequestCode.PULL_MESSAGE, fields), 5)
            assert (r.code, r.remark) == (
                ResponseCode.TOPIC_NOT_EXIST,
                f"topic[{missing}] not exist, apply first please!",
            )

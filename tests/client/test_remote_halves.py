"""Ending a cluster's halves once per transaction: ``end_halves``, ``on_check`` and
``end_answered`` (``check_transactions``) share one claim per (broker, UNIQ_KEY).

A fake broker connection records each END_TRANSACTION; QUERY_MESSAGE finds no committed
copy (a broker's index is built a moment late), so only the claims stand between a
check-back's copy of a half (a new half-queue offset, the same UNIQ_KEY) and a second
COMMIT.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest

from rocketspark.client.remote_halves import EndedTransactions, end_answered
from rocketspark.client.remote_producer import Producer
from rocketspark.errors import RemotingCommandError
from rocketspark.message.model import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    HostAddress,
    MessageExt,
    SysFlag,
    TransactionState,
    answer_state,
)
from rocketspark.message.properties import encode_properties
from rocketspark.message.record import encode_record
from rocketspark.message.results import Halves
from rocketspark.remoting import headers as hdr
from rocketspark.remoting.codes import RequestCode, ResponseCode
from rocketspark.remoting.command import RemotingCommand

BROKER = "broker-a"
ADDRESS = "127.0.0.1:10911"
GROUP = "pg"
TOPIC = "orders"
COMMIT, ROLLBACK = int(SysFlag.TRANSACTION_COMMIT), int(SysFlag.TRANSACTION_ROLLBACK)


class FakeConnection:
    """A broker connection: each END is recorded, answered SUCCESS (or as ``answers`` says)."""

    def __init__(self, address: str):
        self.address = address
        self.ends: list[hdr.EndTransactionRequestHeader] = []
        self.answers: list[Future[RemotingCommand]] = []  # handed out first, when given

    def invoke_async(self, request: RemotingCommand, timeout: float) -> Future[RemotingCommand]:
        self.ends.append(hdr.EndTransactionRequestHeader.from_ext_fields(request.ext_fields))
        if self.answers:
            return self.answers.pop(0)
        return _answered(request, ResponseCode.SUCCESS)

    def invoke_oneway(self, request: RemotingCommand) -> None:
        self.ends.append(hdr.EndTransactionRequestHeader.from_ext_fields(request.ext_fields))


class FakeRemoting:
    """What a Producer asks of its RemotingClient to end halves and answer check-backs."""

    timeout = 1.0

    def __init__(self) -> None:
        self.conn = FakeConnection(ADDRESS)
        self.handlers: dict[int, object] = {}
        self.committed: set[str] = set()  # UNIQ_KEYs whose committed copy QUERY_MESSAGE finds

    def register_handler(self, code: int, handler: object) -> None:
        self.handlers[code] = handler

    def broker_master(self, name: str) -> str:
        assert name == BROKER
        return ADDRESS

    def connection(self, address: str) -> FakeConnection:
        return self.conn

    def command(self, code: int, header: hdr.Header) -> RemotingCommand:
        return RemotingCommand.request(code, header.to_ext_fields())

    def cached_routes(self) -> list:
        return []

    def brokers(self) -> dict[str, dict[int, str]]:
        return {BROKER: {0: ADDRESS}}

    def query_message(self, address, topic, key, *args, unique=False):
        if key not in self.committed:
            return None
        return _record(TOPIC, 0, key, sys_flag=0)


def _answered(request: RemotingCommand, code: int) -> Future[RemotingCommand]:
    f: Future[RemotingCommand] = Future()
    f.set_result(RemotingCommand.response_to(request, code))
    return f


def _record(topic: str, offset: int, uniq: str, *, sys_flag: int) -> bytes:
    props = {PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: uniq, PROPERTY_PRODUCER_GROUP: GROUP}
    host = HostAddress.parse("127.0.0.1", 10911)
    return encode_record(
        topic=topic,
        queue_id=0,
        body=b"x",
        properties=encode_properties(props),
        queue_offset=offset,
        physical_offset=1000 + offset,
        born_timestamp=1,
        born_host=host,
        store_timestamp=1,
        store_host=host,
        sys_flag=sys_flag,
    )


def _half(offset: int, uniq: str) -> MessageExt:
    """A half as the half topic stores it (a check-back's copy: a new offset, same UNIQ_KEY)."""
    props = {
        PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: uniq,
        PROPERTY_PRODUCER_GROUP: GROUP,
        "REAL_TOPIC": TOPIC,
    }
    host = HostAddress.parse("127.0.0.1", 10911)
    return MessageExt(
        topic="RMQ_SYS_TRANS_HALF_TOPIC",
        queue_id=0,
        queue_offset=offset,
        commitlog_offset=1000 + offset,
        msg_id="",
        body=b"x",
        properties=props,
        born_timestamp=1,
        store_timestamp=1,
        born_host=host,
        store_host=host,
        reconsume_times=0,
        sys_flag=int(SysFlag.TRANSACTION_PREPARED),
        flag=0,
        body_crc=0,
        store_size=0,
    )


def _halves(offset: int, uniq: str) -> list[Halves]:
    return [Halves(BROKER, GROUP, ((offset, offset + 1),), (1000 + offset,), (uniq,), (TOPIC,))]


def _check_back(producer: Producer, conn: FakeConnection, offset: int, uniq: str) -> None:
    """The broker asks about the half copy at ``offset`` (CHECK_TRANSACTION_STATE)."""
    head = hdr.CheckTransactionStateRequestHeader(
        topic=TOPIC,
        tran_state_table_offset=offset,
        commit_log_offset=1000 + offset,
        msg_id=uniq,
        transaction_id=uniq,
        broker_name=BROKER,
    )
    body = _record(TOPIC, offset, uniq, sys_flag=int(SysFlag.TRANSACTION_PREPARED))
    request = RemotingCommand.request(
        RequestCode.CHECK_TRANSACTION_STATE, head.to_ext_fields(), body=body
    )
    assert producer.on_check(request, conn) is None  # (the answer is an END, one-way)


@pytest.fixture
def remoting() -> FakeRemoting:
    return FakeRemoting()


@pytest.fixture
def asked() -> list[int]:
    """The half-queue offsets the answer was asked about."""
    return []


@pytest.fixture
def commit(asked):
    """An answer of COMMIT for every half, noting what it is asked about."""

    def answer(half: MessageExt) -> TransactionState:
        asked.append(half.queue_offset)
        return TransactionState.COMMIT

    return answer


@pytest.fixture
def producer(remoting: FakeRemoting, commit) -> Producer:
    p = Producer(remoting, "ns:9876", lambda: 1_000)  # type: ignore[arg-type]
    p.register_answer(None, commit)
    return p


def _flags(remoting: FakeRemoting) -> list[tuple[int, int]]:
    """(half-queue offset, END flag) of every END sent."""
    return [(e.tran_state_table_offset, e.commit_or_rollback) for e in remoting.conn.ends]


def test_a_copy_of_an_ended_half_is_not_asked_nor_committed_again_by_the_check(
    remoting, producer, commit, asked
):
    assert producer.end_halves(_halves(5, "U1"), commit=True) == 1
    # the broker's check stored a copy at offset 9 before its op queue showed the END
    counts = end_answered(producer, [(BROKER, _half(9, "U1"))], commit)
    assert counts == {"commit": 0, "rollback": 0, "unknown": 0}
    assert asked == []
    assert _flags(remoting) == [(5, COMMIT)]


def test_a_check_back_of_a_copy_of_an_ended_half_only_closes_the_copy(remoting, producer, asked):
    producer.end_halves(_halves(5, "U1"), commit=True)
    _check_back(producer, remoting.conn, 9, "U1")
    assert asked == []  # not asked: the transaction is ended
    assert _flags(remoting) == [(5, COMMIT), (9, ROLLBACK)]
    assert remoting.conn.ends[1].from_transaction_check


def test_a_half_a_check_back_committed_is_not_committed_again_by_end_halves(
    remoting, producer, commit, asked
):
    _check_back(producer, remoting.conn, 9, "U1")
    assert asked == [9]
    assert producer.end_halves(_halves(5, "U1"), commit=True) == 0
    assert end_answered(producer, [(BROKER, _half(12, "U1"))], commit)["commit"] == 0
    assert _flags(remoting) == [(9, COMMIT)]


def test_a_check_back_while_end_halves_awaits_its_answer_gets_no_reply(remoting, producer, asked):
    pending: Future[RemotingCommand] = Future()
    remoting.conn.answers.append(pending)
    ended = threading.Thread(
        target=producer.end_halves, args=(_halves(5, "U1"),), kwargs={"commit": True}
    )
    ended.start()
    while not remoting.conn.ends:  # the END is sent, its answer not read yet
        ended.join(0.01)
    _check_back(producer, remoting.conn, 9, "U1")
    assert asked == [] and _flags(remoting) == [(5, COMMIT)]  # the broker asks again later
    pending.set_result(RemotingCommand(code=ResponseCode.SUCCESS))
    ended.join(5)
    _check_back(producer, remoting.conn, 10, "U1")
    assert asked == [] and _flags(remoting) == [(5, COMMIT), (10, ROLLBACK)]


def test_an_end_that_failed_leaves_its_transaction_to_be_ended_again(remoting, producer):
    failed: Future[RemotingCommand] = Future()
    failed.set_result(RemotingCommand(code=ResponseCode.SYSTEM_ERROR, remark="disk full"))
    remoting.conn.answers.append(failed)
    with pytest.raises(RemotingCommandError, match="disk full"):
        producer.end_halves(_halves(5, "U1"), commit=True)
    assert producer.end_halves(_halves(5, "U1"), commit=True) == 1
    assert _flags(remoting) == [(5, COMMIT), (5, COMMIT)]


def test_an_unknown_answer_leaves_the_transaction_open_for_the_next_answer(
    remoting, producer, commit
):
    producer.register_answer(None, lambda half: TransactionState.UNKNOWN)
    _check_back(producer, remoting.conn, 9, "U1")
    assert _flags(remoting) == [(9, 0)]
    assert end_answered(producer, [(BROKER, _half(12, "U1"))], commit)["commit"] == 1
    assert _flags(remoting) == [(9, 0), (12, COMMIT)]


def test_a_commit_whose_committed_copy_exists_only_closes_the_half(remoting, producer, commit):
    remoting.committed.add("U1")  # a commit of another process, indexed already
    assert end_answered(producer, [(BROKER, _half(9, "U1"))], commit)["commit"] == 0
    _check_back(producer, remoting.conn, 12, "U1")  # (ended by this process now)
    _check_back(producer, remoting.conn, 20, "U2")
    remoting.committed.add("U3")
    _check_back(producer, remoting.conn, 30, "U3")
    assert _flags(remoting) == [(9, ROLLBACK), (12, ROLLBACK), (20, COMMIT), (30, ROLLBACK)]


def test_halves_of_other_brokers_and_transactions_are_claimed_apart():
    ended = EndedTransactions()
    assert ended.claim([("a", "U1"), ("b", "U1"), ("a", "U2")]) == [True, True, True]
    assert ended.claim([("a", "U1")]) == [False]
    ended.settle([("a", "U1")], committed=True)
    ended.release([("b", "U1")])
    assert [ended.state(k) for k in [("a", "U1"), ("b", "U1"), ("a", "U2")]] == [
        "ended",
        "open",
        "ending",
    ]


def test_ended_transactions_are_forgotten_after_one_to_two_memories():
    now = [0.0]
    ended = EndedTransactions(memory=60.0, clock=lambda: now[0])
    ended.claim([("a", "U1")])
    ended.settle([("a", "U1")], committed=True)
    now[0] = 100.0
    assert ended.state(("a", "U1")) == "ended"
    now[0] = 200.0
    assert ended.state(("a", "U1")) == "open"


# -- one reading of an answer ---------------------------------------------------------------


ANSWERS = [
    (TransactionState.COMMIT, TransactionState.COMMIT),
    (TransactionState.ROLLBACK, TransactionState.ROLLBACK),
    (TransactionState.UNKNOWN, TransactionState.UNKNOWN),
    (True, TransactionState.COMMIT),
    (False, TransactionState.ROLLBACK),
    (None, TransactionState.UNKNOWN),
    ("COMMIT_MESSAGE", TransactionState.COMMIT),
    ("rollback", TransactionState.ROLLBACK),
    ("UNKNOW", TransactionState.UNKNOWN),
]
FLAG = {TransactionState.COMMIT: COMMIT, TransactionState.ROLLBACK: ROLLBACK}


@pytest.mark.parametrize(("answer", "state"), ANSWERS)
def test_an_answer_means_the_same_to_the_check_and_to_a_check_back(remoting, answer, state):
    assert answer_state(answer) is state
    producer = Producer(remoting, "ns:9876", lambda: 1_000)  # type: ignore[arg-type]
    producer.register_answer(None, lambda half: answer)
    _check_back(producer, remoting.conn, 9, "U1")
    counts = end_answered(producer, [(BROKER, _half(12, "U2"))], lambda half: answer)
    assert _flags(remoting)[0] == (9, FLAG.get(state, 0))
    assert _flags(remoting)[1:] == ([(12, FLAG[state])] if state in FLAG else [])
    name = {TransactionState.COMMIT: "commit", TransactionState.ROLLBACK: "rollback"}
    assert counts[name.get(state, "unknown")] == 1


def test_a_half_whose_check_back_copy_was_rolled_back_is_still_committed(remoting, producer):
    # (a replay's answer says ROLLBACK until its table records it; then it commits)
    producer.register_answer(None, lambda half: TransactionState.ROLLBACK)
    _check_back(producer, remoting.conn, 9, "U1")
    assert producer.end_halves(_halves(5, "U1"), commit=True) == 1
    _check_back(producer, remoting.conn, 12, "U1")
    assert _flags(remoting) == [(9, ROLLBACK), (5, COMMIT), (12, ROLLBACK)]

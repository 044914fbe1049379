"""Cluster sends against a fake remoting client: retries, failures part way, and results.

The fake stands for ``RemotingClient``'s send side: a topic's writable queues over
brokers ``a`` and ``b``, a queue's offsets counted as the broker would, and scripted
faults (a broker group without a master, an unreachable broker, a lane that cannot be
made). What a put stored is checked against the producer's ``written``.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future

import pytest

from rocketspark.client.remote_producer import Producer, SentResults, _Request
from rocketspark.errors import (
    NoMasterError,
    RemotingConnectError,
    RemotingError,
    UnknownTopicError,
)
from rocketspark.message.columns import Columns
from rocketspark.message.model import Message, MessageQueue
from rocketspark.remoting.client import SendAnswer
from rocketspark.remoting.fault import LatencyFaults

TOPIC = "t"
QUEUES = [MessageQueue(TOPIC, b, q) for b in ("a", "b") for q in range(2)]


class FakeRoute:
    def write_queues(self) -> list[MessageQueue]:
        return list(QUEUES)


class FakeRemoting:
    """The part of RemotingClient a Producer sends through."""

    def __init__(self) -> None:
        self.faults = LatencyFaults()
        self.route_ = FakeRoute()
        self.masterless: set[str] = set()  # broker groups whose master lookup fails
        self.start_errors: dict[str, Exception] = {}  # broker -> raised by send_async
        self.answer_errors: dict[str, Exception] = {}  # broker -> the answer's failure
        self.offsets: dict[MessageQueue, int] = {}
        self.starts: list[MessageQueue] = []  # each request started, in order
        self.attempts: list[MessageQueue] = []  # each request tried, started or not

    def register_handler(self, code, handler) -> None:
        pass

    def route(self, topic: str, *, refresh: bool = False) -> FakeRoute:
        if topic != TOPIC:
            raise UnknownTopicError(f"topic {topic!r} does not exist")
        return self.route_

    def send_async(self, mq: MessageQueue, body: bytes, *, batch: bool = False, **_kw):
        self.attempts.append(mq)
        if mq.broker in self.masterless:
            raise NoMasterError(f"broker {mq.broker!r} of topic {mq.topic!r} has no master")
        if mq.broker in self.start_errors:
            raise self.start_errors[mq.broker]
        self.starts.append(mq)
        n = _entries(body) if batch else 1
        future: Future = Future()
        if mq.broker in self.answer_errors:
            future.set_exception(self.answer_errors[mq.broker])
        else:
            at = self.offsets.get(mq, 0)
            self.offsets[mq] = at + n
            future.set_result((at, n))
        return future, f"addr-{mq.broker}", 0.0

    def send_answer(self, mq: MessageQueue, future: Future, addr: str, at: float) -> SendAnswer:
        offset, n = future.result()
        ids = ",".join(f"7F00000100002A9F{(offset + k) * 100:016X}" for k in range(n))
        return SendAnswer(mq, offset, ids, None, addr)


def _entries(body: bytes) -> int:
    """How many messages a SEND_BATCH_MESSAGE body holds (TOTALSIZE first in each)."""
    n = at = 0
    while at < len(body):
        at += int.from_bytes(body[at : at + 4], "big")
        n += 1
    return n


def _producer() -> tuple[Producer, FakeRemoting]:
    remoting = FakeRemoting()
    producer = Producer(remoting, "fake:9876", lambda: 1_700_000_000_000)  # type: ignore[arg-type]
    producer._round_robin[TOPIC] = 0  # round-robin from the first queue
    return producer, remoting


def _notes(e: BaseException) -> str:
    return "\n".join(getattr(e, "__notes__", ()))


def test_a_send_whose_broker_has_no_master_is_retried_on_another_broker():
    producer, remoting = _producer()
    remoting.masterless.add("a")
    (result,) = producer.send([Message(TOPIC, b"x")])
    assert result.broker == "b"
    assert producer.written == {MessageQueue(TOPIC, "b", result.queue_id): 1}


def test_a_batch_whose_broker_has_no_master_goes_to_another_broker():
    producer, remoting = _producer()
    remoting.masterless.add("a")
    results = producer.send_columns(Columns.of_keywords([b"x"] * 40, {"topic": TOPIC}))
    assert {r.broker for r in results} == {"b"}
    assert sum(producer.written.values()) == 40
    assert all(mq.broker == "b" for mq in producer.written)


def test_a_pinned_queue_without_master_fails_after_the_others_are_stored():
    producer, remoting = _producer()
    remoting.masterless.add("b")
    messages = [Message(TOPIC, b"x", queue_id=i % 4) for i in range(40)]
    with pytest.raises(NoMasterError, match="has no master") as info:
        producer.send(messages)
    # the requests to broker a were awaited: their rows are written
    assert producer.written == {QUEUES[0]: 10, QUEUES[1]: 10}
    notes = _notes(info.value)
    assert "stored by the brokers before the failure: 20 rows" in notes
    assert "t/a/0 offsets [0, 10)" in notes and "t/a/1 offsets [0, 10)" in notes
    assert "later failure of the same put: NoMasterError" in notes  # queue b/1's


def test_every_failure_of_a_put_is_raised_or_noted():
    producer, remoting = _producer()
    remoting.answer_errors["a"] = RemotingError("broker a refused")  # not retriable
    remoting.start_errors["b"] = UnknownTopicError("the route of t went away")
    with pytest.raises(RemotingError, match="broker a refused") as info:
        producer.send([Message(TOPIC, b"x", queue_id=i % 4) for i in range(8)])
    notes = _notes(info.value)
    assert "UnknownTopicError: the route of t went away" in notes
    assert "stored by the brokers before the failure: 0 rows (none)" in notes
    assert producer.written == {}


def test_a_request_holding_a_pinned_row_stays_on_its_queue():
    producer, remoting = _producer()
    remoting.answer_errors["a"] = RemotingConnectError("a is down", address="addr-a")
    # the second row goes round-robin to queue a/0 too: one batch with the pinned row
    with pytest.raises(RemotingConnectError):
        producer.send([Message(TOPIC, b"x", queue_id=0), Message(TOPIC, b"y")])
    assert remoting.starts == [QUEUES[0]]  # not sent again to broker b
    assert producer.written == {}


def test_requests_in_flight_are_awaited_when_a_lane_cannot_be_made():
    producer, remoting = _producer()

    def request(mq: MessageQueue) -> _Request:
        return _Request(mq, [0], b"x", "UNIQ_KEY\x01u\x02", 0, 0, None, False, True)

    def lanes() -> Iterator[list[_Request]]:
        yield [request(QUEUES[0]), request(QUEUES[0])]
        yield [request(QUEUES[1])]
        raise ValueError("the third queue's rows cannot be encoded")

    with pytest.raises(ValueError, match="cannot be encoded") as info:
        producer._send_lanes(lanes())
    # the two started requests were answered; no request started after the failure
    assert remoting.starts == [QUEUES[0], QUEUES[1]]
    assert producer.written == {QUEUES[0]: 1, QUEUES[1]: 1}
    assert "2 rows (t/a/0 offsets [0, 1); t/a/1 offsets [0, 1))" in _notes(info.value)


def test_a_retry_that_cannot_start_counts_as_a_failed_attempt():
    producer, remoting = _producer()
    remoting.answer_errors["a"] = RemotingConnectError("a is down", address="addr-a")
    remoting.masterless.add("b")
    with pytest.raises((RemotingConnectError, NoMasterError)):
        producer.send([Message(TOPIC, b"x")])
    # a/0 failed; the first retry went to broker b (no master), the second to a again
    assert len(remoting.attempts) == 1 + 2  # SEND_RETRIES
    assert remoting.attempts[0] == QUEUES[0] and remoting.attempts[1].broker == "b"


def test_columnar_results_are_a_sequence_equal_to_a_list():
    producer, _ = _producer()
    results = producer.send_columns(Columns.of_keywords([b"x", b"yy", b"z"], {"topic": TOPIC}))
    assert isinstance(results, SentResults)
    as_list = list(results)
    assert results == as_list and as_list == results and not results != as_list
    assert results == tuple(as_list) and results == results
    assert results != as_list[:2] and results != [*as_list[:2], as_list[0]]
    assert results != "abc" and results != 3
    assert len(results) == 3 and results[-1] == as_list[2]
    assert results[1:] == as_list[1:] and results.index(as_list[1]) == 1
    assert results + [] == as_list and [] + results == as_list
    assert as_list[0] in results and list(reversed(results)) == as_list[::-1]
    with pytest.raises(TypeError):
        hash(results)

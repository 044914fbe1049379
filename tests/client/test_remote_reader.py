"""The cluster client's range reader and its pieces, against scripted pull answers.

A real broker answers at most 32 messages (or 256 KiB) a pull, steps over messages a
tag filter drops, and may answer PULL_OFFSET_MOVED; the reader keeps several pulls in
flight and must still return each offset of the range once, in order. Here a fake
broker answers from a list of records, cutting answers short as a broker does; the
real brokers are in ``tests/cluster``.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from rocketspark.client.api import ClientRef
from rocketspark.client.remote import resolve
from rocketspark.client.remote_pull import RangeReader, read_ahead
from rocketspark.errors import ConfigError, OffsetOutOfRangeError
from rocketspark.message import arrow
from rocketspark.message.model import HostAddress, MessageQueue
from rocketspark.message.names import SubscriptionExpression
from rocketspark.message.properties import encode_properties
from rocketspark.message.record import encode_record
from rocketspark.message.results import PullStatus
from rocketspark.remoting.client import PullAnswer, parse_namesrv
from rocketspark.remoting.fault import LatencyFaults, not_available_ms
from rocketspark.remoting.route import TopicRoute

MQ = MessageQueue("orders", "broker-a", 1)
HOST = HostAddress.parse("127.0.0.1", 10911)


def _record(offset: int, tags: str | None = None) -> bytes:
    props = {"TAGS": tags} if tags else {}
    props["UNIQ_KEY"] = f"{offset:032X}"
    return encode_record(
        topic=MQ.topic,
        queue_id=MQ.queue_id,
        body=f"m{offset}".encode(),
        properties=encode_properties(props),
        queue_offset=offset,
        physical_offset=1000 + offset * 200,
        born_timestamp=1,
        born_host=HOST,
        store_timestamp=2,
        store_host=HOST,
    )


class FakeBroker:
    """Answers pulls of offsets [0, size): at most ``cap`` records, the tag filter
    stepping over records (and answering NO_MATCHED_MSG when a whole answer is
    filtered away), OFFSET_MOVED below ``low``."""

    def __init__(self, size: int, cap: int, tags: dict[int, str] | None = None, low: int = 0):
        self.size, self.cap, self.low = size, cap, low
        self.tags = tags or {}
        self.asked: list[int] = []

    def answer(self, offset: int, n: int, expression: str) -> PullAnswer:
        self.asked.append(offset)
        if offset < self.low:
            return PullAnswer(PullStatus.OFFSET_ILLEGAL, self.low, self.low, self.size, 0, None)
        if offset >= self.size:
            return PullAnswer(PullStatus.NO_NEW_MSG, offset, self.low, self.size, 0, None)
        want = None if expression == "*" else {t.strip() for t in expression.split("||")}
        scanned = range(offset, min(self.size, offset + min(n, self.cap)))
        kept = [o for o in scanned if want is None or self.tags.get(o) in want]
        nxt = scanned[-1] + 1
        if not kept:
            return PullAnswer(PullStatus.NO_MATCHED_MSG, nxt, self.low, self.size, 0, None)
        body = b"".join(_record(o, self.tags.get(o)) for o in kept)
        return PullAnswer(PullStatus.FOUND, nxt, self.low, self.size, 0, body)


def _reader(broker: FakeBroker, start: int, end: int, expression: str = "*", pipeline: int = 4):
    def pull_async(mq, offset, n, *, group, expression, address):
        f: Future = Future()
        f.set_result(broker.answer(offset, n, expression))
        return f

    def pull_many(mq, asks, *, group, expression, address):
        return [
            pull_async(mq, o, n, group=group, expression=expression, address=address)
            for o, n in asks
        ]

    rc = SimpleNamespace(
        pull_async=pull_async,
        pull_many=pull_many,
        pull_answer=lambda mq, answer, address: answer,
        read_address=lambda mq: "127.0.0.1:10911",
    )
    client = SimpleNamespace(remoting=rc, pull_batch=32, pipeline=pipeline, group="g")
    return RangeReader(client, MQ, start, end, SubscriptionExpression(expression))


def _offsets(reader: RangeReader) -> list[int]:
    out: list[int] = []
    for block in reader.blocks():
        batch = arrow.records_body_to_batch(
            block, topic=MQ.topic, broker_name=MQ.broker, queue_id=MQ.queue_id
        )
        out += batch.column("queueOffset").to_pylist()
    return out


@pytest.mark.parametrize("cap", [32, 20, 7, 1])
def test_a_range_comes_back_whole_and_once_however_short_the_answers(cap):
    broker = FakeBroker(500, cap)
    reader = _reader(broker, 10, 400)
    assert _offsets(reader) == list(range(10, 400))
    assert reader.position == 400


def test_a_range_past_the_queue_end_stops_at_the_end():
    reader = _reader(FakeBroker(100, 32), 50, 300)
    assert _offsets(reader) == list(range(50, 100))
    assert reader.position == 100


def test_filtered_stretches_are_stepped_over():
    tags = {o: ("paid" if o % 50 == 0 else "other") for o in range(300)}
    reader = _reader(FakeBroker(300, 32, tags), 0, 300, expression="paid")
    assert _offsets(reader) == list(range(0, 300, 50))
    assert reader.position == 300


def test_an_offset_the_broker_no_longer_has_is_out_of_range():
    reader = _reader(FakeBroker(100, 32, low=40), 0, 100)
    with pytest.raises(OffsetOutOfRangeError, match="outside \\[40, 100\\]"):
        _offsets(reader)


def test_records_of_a_body_are_found_and_checked():
    body = _record(3) + _record(4, "t")
    starts, sizes = arrow.record_positions(body)
    assert starts.tolist() == [0, len(_record(3))] and sizes.sum() == len(body)
    with pytest.raises(Exception, match="record 1"):
        arrow.record_positions(body[:-5])


def test_routes_list_readable_and_writable_queues_by_broker():
    route = TopicRoute.parse(
        "orders",
        b'{"queueDatas":[{"brokerName":"b","readQueueNums":2,"writeQueueNums":1,"perm":6},'
        b'{"brokerName":"a","readQueueNums":1,"writeQueueNums":1,"perm":4}],'
        b'"brokerDatas":[{"cluster":"c","brokerName":"a","brokerAddrs":{0:"h:1"}},'
        b'{"cluster":"c","brokerName":"b","brokerAddrs":{"0":"h:2","1":"h:3"}}]}',
    )
    assert [str(q) for q in route.read_queues()] == ["orders/a/0", "orders/b/0", "orders/b/1"]
    assert [str(q) for q in route.write_queues()] == ["orders/b/0"]  # a is read-only
    assert route.broker("b").address(1) == "h:3" and route.broker("b").address(7) == "h:2"


def test_a_slow_or_failed_broker_is_avoided_for_a_while():
    now = [0.0]
    faults = LatencyFaults(clock=lambda: now[0])
    queues = [MessageQueue("t", b, i) for b in ("a", "b") for i in range(2)]
    assert not_available_ms(40) == 0 and not_available_ms(600) == 2000
    faults.record("a", 10, failed=True)
    assert {faults.select(queues, i).broker for i in range(4)} == {"b"}
    now[0] = 31.0  # an isolated broker is back after 30 s
    assert {faults.select(queues, i).broker for i in range(4)} == {"a", "b"}
    assert faults.select(queues, 0, avoid="a").broker == "b"  # a retry avoids the last


def test_name_servers_and_settings_are_checked_naming_the_option():
    assert parse_namesrv("h1:9876; h2:9876") == ["h1:9876", "h2:9876"]
    with pytest.raises(ConfigError, match="nameServer: 'h1' is not host:port"):
        parse_namesrv("h1;h2:1")
    with pytest.raises(ConfigError, match="pullBatchSize"):
        resolve("h:1", {"pullBatchSize": "0"}, None, None)
    with pytest.raises(ConfigError, match="secretKey is missing"):
        resolve("h:1", {}, "ak", None)
    ref = resolve("h:1", {}, "ak", "very-secret")
    assert isinstance(ref, ClientRef) and "very-secret" not in repr(ref)


def test_blocks_read_ahead_come_in_order_with_the_readers_error_and_stop_when_closed():
    reader = _reader(FakeBroker(500, 7), 10, 400)
    out = []
    for block in read_ahead(reader.blocks()):
        batch = arrow.records_body_to_batch(
            block, topic=MQ.topic, broker_name=MQ.broker, queue_id=MQ.queue_id
        )
        out += batch.column("queueOffset").to_pylist()
    assert out == list(range(10, 400)) and reader.position == 400

    with pytest.raises(OffsetOutOfRangeError):
        list(read_ahead(_reader(FakeBroker(100, 32, low=40), 0, 100).blocks()))

    closed = threading.Event()

    def endless():
        try:
            while True:
                yield b"x"
        finally:
            closed.set()

    items = read_ahead(endless())
    assert next(items) == b"x"
    items.close()
    assert closed.wait(5)

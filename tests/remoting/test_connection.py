"""Connection and Connections against a scripted server on 127.0.0.1."""

from __future__ import annotations

import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from rocketspark.errors import (
    BrokerBusyError,
    ConfigError,
    RemotingCommandError,
    RemotingConnectError,
    RemotingError,
    RemotingTimeoutError,
)
from rocketspark.remoting.codes import (
    MQ_VERSION,
    LanguageCode,
    RequestCode,
    ResponseCode,
    RpcFlag,
    SerializeType,
)
from rocketspark.remoting.command import MAX_FRAME_SIZE, RemotingCommand
from rocketspark.remoting.connection import (
    Connection,
    Connections,
    check_response,
    split_address,
)
from tests.remoting.fake_server import FakeServer, echo

WAIT = 5.0


def request(body: bytes = b"", code: int = RequestCode.GET_MAX_OFFSET, **ext: str):
    return RemotingCommand.request(code, ext, body=body or None)


@pytest.fixture
def server():
    with FakeServer() as s:
        yield s


@pytest.fixture
def conn(server):
    with Connection(server.address, connect_timeout=2.0) as c:
        yield c


def test_invoke_returns_the_response_to_its_request(server, conn):
    response = conn.invoke(request(b"ping", topic="t", queueId="1"), timeout=WAIT)
    assert response.is_response and response.code == ResponseCode.SUCCESS
    assert bytes(response.body) == b"ping"
    assert dict(response.ext_fields) == {"topic": "t", "queueId": "1"}
    (seen,) = server.wait_for(1)
    assert seen.opaque == response.opaque and not seen.is_response and not seen.is_oneway
    assert seen.language == LanguageCode.PYTHON and seen.version == MQ_VERSION
    assert conn.connected and conn.in_flight == 0


@pytest.mark.parametrize("st_", [SerializeType.JSON, SerializeType.ROCKETMQ])
def test_both_serialize_types(server, conn, st_):
    cmd = RemotingCommand.request(RequestCode.PULL_MESSAGE, {"a": "ü"}, serialize_type=st_)
    response = conn.invoke(cmd, timeout=WAIT)
    assert response.serialize_type == st_ and dict(response.ext_fields) == {"a": "ü"}


def test_opaques_are_fresh_for_every_request(server, conn):
    for _ in range(5):
        conn.invoke(request(), timeout=WAIT)
    opaques = [cmd.opaque for cmd in server.wait_for(5)]
    assert len(set(opaques)) == 5


def test_responses_are_matched_by_opaque_out_of_order(server, conn):
    held: list[RemotingCommand] = []

    def reverse(req: RemotingCommand, s: FakeServer) -> None:
        held.append(req)
        if len(held) == 10:
            for r in reversed(held):
                echo(r, s)

    server.script = reverse
    futures = [conn.invoke_async(request(b"%d" % i), timeout=WAIT) for i in range(10)]
    assert conn.in_flight == 10 or len(held) == 10
    for i, future in enumerate(futures):
        assert bytes(future.result(WAIT).body) == b"%d" % i
    assert conn.in_flight == 0


def test_concurrent_invokes_from_threads(server, conn):
    def work(thread: int) -> None:
        for i in range(40):
            body = f"{thread}-{i}".encode()
            assert bytes(conn.invoke(request(body), timeout=WAIT).body) == body

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(8)))
    assert server.accepted == 1 and len(server.wait_for(320)) == 320


def test_large_bodies_both_ways(server, conn):
    body = bytes(range(256)) * (16 * 1024)  # 4 MiB
    response = conn.invoke(request(body), timeout=30)
    assert isinstance(response.body, memoryview) and response.body == body


def test_timeout_names_the_address_and_the_request(server, conn):
    server.script = lambda req, s: None  # never answers
    started = time.monotonic()
    with pytest.raises(RemotingTimeoutError) as caught:
        conn.invoke(request(code=RequestCode.PULL_MESSAGE), timeout=0.3)
    assert 0.25 < time.monotonic() - started < 3
    error = caught.value
    assert server.address in str(error) and "PULL_MESSAGE" in str(error)
    assert error.address == server.address and error.retriable
    assert conn.in_flight == 0 and conn.connected  # the connection stays usable


def test_async_requests_time_out_on_their_own(server, conn):
    server.script = lambda req, s: None
    future = conn.invoke_async(request(code=RequestCode.QUERY_CONSUMER_OFFSET), timeout=0.2)
    error = future.exception(WAIT)
    assert isinstance(error, RemotingTimeoutError) and "QUERY_CONSUMER_OFFSET" in str(error)
    assert conn.in_flight == 0


def test_a_late_response_is_dropped_and_the_connection_goes_on(server, conn):
    late: list[RemotingCommand] = []
    server.script = lambda req, s: late.append(req) if req.ext_fields.get("late") else echo(req, s)
    with pytest.raises(RemotingTimeoutError):
        conn.invoke(request(late="1"), timeout=0.2)
    echo(late[0], server)
    assert bytes(conn.invoke(request(b"after"), timeout=WAIT).body) == b"after"


def encoded(body: bytes, **ext: str):
    """An encoder of a request frame for ``invoke_awaited``: the opaque it is given."""
    cmd = RemotingCommand.request(RequestCode.GET_MAX_OFFSET, ext, body=body or None)
    return lambda opaque: replace(cmd, opaque=opaque).encode()


def test_an_awaited_request_is_answered_on_the_callers_thread(server, conn):
    answer = conn.invoke_awaited(RequestCode.GET_MAX_OFFSET, encoded(b"mine"), WAIT)
    assert bytes(answer.result().body) == b"mine"
    assert bytes(answer.result().body) == b"mine"  # read again: at once, the same
    assert conn.in_flight == 0


def test_an_awaited_request_times_out_in_its_callers_wait(server, conn):
    server.script = lambda req, s: None
    answer = conn.invoke_awaited(RequestCode.GET_MAX_OFFSET, encoded(b""), 0.2)
    started = time.monotonic()
    with pytest.raises(RemotingTimeoutError, match="GET_MAX_OFFSET"):
        answer.result()
    assert 0.15 < time.monotonic() - started < 3 and conn.in_flight == 0


def test_an_awaited_request_fails_when_the_connection_drops(server, conn):
    server.script = lambda req, s: None
    answer = conn.invoke_awaited(RequestCode.GET_MAX_OFFSET, encoded(b""), WAIT)
    server.wait_for(1)
    server.drop()
    with pytest.raises(RemotingConnectError, match="lost before GET_MAX_OFFSET"):
        answer.result()


def test_a_cancelled_awaited_request_drops_its_response(server, conn):
    held: list[RemotingCommand] = []
    server.script = lambda req, s: held.append(req)
    answer = conn.invoke_awaited(RequestCode.GET_MAX_OFFSET, encoded(b"gone"), WAIT)
    server.wait_for(1)
    answer.cancel()
    assert conn.in_flight == 0
    echo(held[0], server)  # a late response: dropped, the connection goes on
    server.script = echo
    assert bytes(conn.invoke(request(b"after"), timeout=WAIT).body) == b"after"


def test_oneway_expects_no_response(server, conn):
    conn.invoke_oneway(request(b"{}", code=RequestCode.HEART_BEAT))
    (seen,) = server.wait_for(1)
    assert seen.is_oneway and seen.code == RequestCode.HEART_BEAT and conn.in_flight == 0


def test_server_requests_go_to_handlers_and_are_answered_with_their_opaque(server, conn):
    calls = []

    def check_state(req: RemotingCommand, via: Connection) -> RemotingCommand:
        assert via is conn
        calls.append(threading.current_thread().name)
        return RemotingCommand(ResponseCode.SUCCESS, ext_fields={"seen": req.ext_fields["msgId"]})

    conn.register_handler(RequestCode.CHECK_TRANSACTION_STATE, check_state)
    conn.connect()
    server.wait_accepted()
    check = RemotingCommand(
        RequestCode.CHECK_TRANSACTION_STATE, opaque=77, ext_fields={"msgId": "M1"}, language=0
    )
    server.reply(check)
    answer = server.wait_for(1)[0]
    assert answer.is_response and answer.opaque == 77 and answer.code == ResponseCode.SUCCESS
    assert dict(answer.ext_fields) == {"seen": "M1"}
    assert calls[0].startswith("rocketspark-remoting-handler")  # not the reader thread


def test_unknown_server_requests_are_answered_not_supported(server, conn):
    conn.connect()
    server.wait_accepted()
    server.reply(RemotingCommand(RequestCode.GET_CONSUMER_RUNNING_INFO, opaque=5))
    answer = server.wait_for(1)[0]
    assert answer.opaque == 5 and answer.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert "not supported" in answer.remark


def test_a_failing_handler_answers_system_error_and_a_oneway_request_nothing(server, conn):
    seen = threading.Event()

    def boom(req: RemotingCommand, via: Connection) -> RemotingCommand:
        seen.set()
        raise RuntimeError("no such group")

    conn.register_handler(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, boom)
    conn.connect()
    server.wait_accepted()
    server.reply(
        RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, opaque=6, flag=RpcFlag.ONEWAY)
    )
    assert seen.wait(WAIT)
    server.reply(RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, opaque=7))
    answer = server.wait_for(1)[0]
    assert answer.opaque == 7 and answer.code == ResponseCode.SYSTEM_ERROR
    assert "no such group" in answer.remark
    time.sleep(0.2)
    assert len(server.requests) == 1  # nothing answered the one-way request


def test_a_slow_handler_does_not_hold_up_responses(server, conn):
    release = threading.Event()
    conn.register_handler(
        RequestCode.CHECK_TRANSACTION_STATE, lambda req, via: None if release.wait(WAIT) else None
    )
    conn.connect()
    server.wait_accepted()
    server.reply(RemotingCommand(RequestCode.CHECK_TRANSACTION_STATE, opaque=1))
    try:
        assert bytes(conn.invoke(request(b"meanwhile"), timeout=WAIT).body) == b"meanwhile"
    finally:
        release.set()


def test_a_dropped_connection_fails_pending_requests_and_reconnects(server, conn):
    server.script = lambda req, s: None
    futures = [conn.invoke_async(request(), timeout=WAIT) for _ in range(3)]
    server.wait_for(3)
    server.drop()
    for future in futures:
        error = future.exception(WAIT)
        assert isinstance(error, RemotingConnectError) and error.retriable
        assert server.address in str(error) and "GET_MAX_OFFSET" in str(error)
        assert error.address == server.address
    server.script = echo
    assert bytes(conn.invoke(request(b"again"), timeout=WAIT).body) == b"again"
    assert server.accepted == 2


@pytest.mark.parametrize(
    "garbage, message",
    [
        (struct.pack(">i", MAX_FRAME_SIZE), "beyond the limit"),
        (struct.pack(">i", -7), "too small"),
        (struct.pack(">ii", 6, 7 << 24 | 2) + b"{}", "unknown serialize type 7"),
        (struct.pack(">ii", 5, 0 << 24 | 1) + b"{", "does not parse"),
    ],
    ids=["oversized", "negative", "serialize-type", "json"],
)
def test_a_malformed_frame_closes_the_connection_with_a_clear_error(server, conn, garbage, message):
    server.script = lambda req, s: s.send_raw(garbage)
    with pytest.raises(RemotingConnectError, match=message) as caught:
        conn.invoke(request(), timeout=WAIT)
    assert server.address in str(caught.value)
    server.script = echo
    assert bytes(conn.invoke(request(b"fine"), timeout=WAIT).body) == b"fine"


def test_a_frame_cut_short_fails_the_request(server, conn):
    frame = RemotingCommand(ResponseCode.SUCCESS, flag=1, body=b"x" * 100).to_bytes()

    def cut(req: RemotingCommand, s: FakeServer) -> None:
        s.send_raw(frame[:50])
        s.drop()

    server.script = cut
    with pytest.raises(RemotingConnectError, match="end of stream inside a frame"):
        conn.invoke(request(), timeout=WAIT)


def test_connect_failures_name_the_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    with Connection(f"127.0.0.1:{port}", connect_timeout=1.0) as conn:
        with pytest.raises(RemotingConnectError, match=f"127.0.0.1:{port}") as caught:
            conn.invoke(request(), timeout=WAIT)
        assert caught.value.retriable and not conn.connected
        with pytest.raises(RemotingConnectError):
            conn.invoke_oneway(request())


def test_close_fails_pending_requests_and_refuses_more(server):
    server.script = lambda req, s: None
    conn = Connection(server.address)
    future = conn.invoke_async(request(), timeout=WAIT)
    server.wait_for(1)
    conn.close()
    assert isinstance(future.exception(WAIT), RemotingConnectError)
    with pytest.raises(RemotingError, match="closed"):
        conn.invoke(request(), timeout=WAIT)
    conn.close()


def test_a_response_is_not_a_request(conn):
    with pytest.raises(ValueError, match="response"):
        conn.invoke(RemotingCommand(0, flag=RpcFlag.RESPONSE), timeout=WAIT)


def test_connections_keep_one_per_address(server):
    with FakeServer() as other, Connections(connect_timeout=2.0) as conns:
        a = conns.get(server.address)
        assert conns.get(server.address) is a and conns.get(other.address) is not a
        assert bytes(conns.invoke(other.address, request(b"o"), timeout=WAIT).body) == b"o"
        conns.register_handler(RequestCode.CHECK_TRANSACTION_STATE, lambda req, via: None)
        conns.get(server.address).invoke(request(), timeout=WAIT)
        server.reply(RemotingCommand(RequestCode.GET_CONSUMER_RUNNING_INFO, opaque=3))
        assert server.wait_for(2)[1].code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        conns.close(server.address)
        assert conns.get(server.address) is not a
    with pytest.raises(RemotingError, match="closed"):
        conns.get(server.address)


def test_check_response():
    ok = RemotingCommand(ResponseCode.SUCCESS, flag=1)
    assert check_response(ok) is ok
    missing = RemotingCommand(ResponseCode.QUERY_NOT_FOUND, flag=1)
    assert check_response(missing, expected=(0, ResponseCode.QUERY_NOT_FOUND)) is missing
    with pytest.raises(BrokerBusyError) as busy:
        check_response(
            RemotingCommand(ResponseCode.SYSTEM_BUSY, flag=1, remark="[PC_SYNCHRONIZED]"),
            request_code=RequestCode.SEND_MESSAGE_V2,
            address="b:10911",
        )
    assert busy.value.retriable and busy.value.code == 2
    assert (
        str(busy.value) == "SEND_MESSAGE_V2 to b:10911 answered SYSTEM_BUSY (2): [PC_SYNCHRONIZED]"
    )
    with pytest.raises(RemotingCommandError) as failed:
        check_response(RemotingCommand(ResponseCode.TOPIC_NOT_EXIST, flag=1, remark="no t"))
    assert failed.value.code == 17 and failed.value.remark == "no t"
    assert not failed.value.retriable


def test_split_address():
    assert split_address("10.0.0.1:9876") == ("10.0.0.1", 9876)
    assert split_address("[::1]:10911") == ("::1", 10911)
    for bad in ("host", ":9876", "h:x", "h:0", "h:70000"):
        with pytest.raises(ConfigError, match="host:port"):
            split_address(bad)


def test_the_connect_timeout_bounds_connecting():
    # A listener that never accepts, with its accept queue full: SYNs go unanswered.
    with socket.create_server(("127.0.0.1", 0), backlog=0) as listener:
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        fillers = []
        try:
            for _ in range(3):
                filler = socket.socket()
                filler.settimeout(0.2)
                fillers.append(filler)
                try:
                    filler.connect(listener.getsockname())
                except OSError:
                    break  # the queue is full
            started = time.monotonic()
            with Connection(address, connect_timeout=0.5) as conn:
                with pytest.raises(RemotingConnectError, match=f"{address} within 0.5 s"):
                    conn.connect()
            assert 0.4 < time.monotonic() - started < 3
        finally:
            for filler in fillers:
                filler.close()


def test_pipelined_answers_of_every_size_come_back_whole_across_receive_chunks(server, conn):
    # sizes around the reader's 256 KiB chunks: small answers several to a read, a frame
    # split over a chunk's end, frames bigger than a chunk
    sizes = [0, 1, 5, 100, 6_400, 200_000, 70_000, 262_100, 262_144, 300_000, 3, 700_000]
    sizes += [(i * 7919) % 90_000 for i in range(60)]
    bodies = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    futures = [conn.invoke_async(request(body, seq=str(i)), WAIT) for i, body in enumerate(bodies)]
    for i, (body, future) in enumerate(zip(bodies, futures, strict=True)):
        response = future.result(WAIT)
        assert response.ext_fields["seq"] == str(i)
        assert (bytes(response.body) if response.body is not None else b"") == body


def test_requests_given_encoded_go_out_together_and_are_answered_each(server, conn):
    def encode(i):
        return lambda opaque: [
            request(f"body-{i}".encode(), seq=str(i)).with_opaque(opaque).to_bytes()
        ]

    futures = conn.invoke_async_encoded(
        RequestCode.GET_MAX_OFFSET, [encode(i) for i in range(5)], WAIT
    )
    answers = [f.result(WAIT) for f in futures]
    assert [a.ext_fields["seq"] for a in answers] == [str(i) for i in range(5)]
    assert [bytes(a.body) for a in answers] == [f"body-{i}".encode() for i in range(5)]


def test_more_requests_given_encoded_than_one_sendmsg_takes_all_go_out(server, conn):
    # a burst of 1500 frames of two buffers each: beyond the kernel's iovec limit (1024)
    def encode(i):
        return lambda opaque: [
            bytes(b) for b in request(f"b{i}".encode(), seq=str(i)).with_opaque(opaque).encode()
        ]

    futures = conn.invoke_async_encoded(
        RequestCode.GET_MAX_OFFSET, [encode(i) for i in range(1500)], WAIT
    )
    answers = [f.result(WAIT) for f in futures]
    assert [a.ext_fields["seq"] for a in answers] == [str(i) for i in range(1500)]

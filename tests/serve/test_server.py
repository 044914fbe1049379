"""RemotingServer, the transport: frames, dispatch by code, back-pressure, faults.

Driven by our own Connection (the client side of the protocol) and raw sockets
for what no well-behaved client sends.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from rocketspark.errors import RemotingConnectError
from rocketspark.remoting.codes import RequestCode, ResponseCode
from rocketspark.remoting.command import MAX_FRAME_SIZE, RemotingCommand
from rocketspark.remoting.connection import Connection
from rocketspark.remoting.server import BUSY_REMARK, Channel, RemotingServer, Reply

ECHO = 9001
SLOW = 9002
ONEWAY = 9003
PARTS = 9004
LATER = 9005
ASK_CLIENT = 9006


def echo(request: RemotingCommand, channel: Channel) -> RemotingCommand:
    return RemotingCommand.response_to(
        request,
        ResponseCode.SUCCESS,
        ext_fields={"n": request.ext_fields.get("n", "")},
        body=bytes(request.body or b""),
    )


@pytest.fixture
def server():
    srv = RemotingServer(port=0, name="test")
    srv.register(ECHO, echo)
    with srv:
        yield srv


def _raw(server: RemotingServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=5)


def _ping(server: RemotingServer) -> None:
    with Connection(server.address) as conn:
        r = conn.invoke(RemotingCommand.request(ECHO, {"n": "ping"}, body=b"x"), 5)
        assert (r.code, r.ext_fields["n"], bytes(r.body or b"")) == (0, "ping", b"x")


def test_binds_loopback_by_default() -> None:
    with RemotingServer(port=0) as srv:
        assert srv.host == "127.0.0.1"
        assert srv.address == f"127.0.0.1:{srv.port}"


def test_request_response_by_opaque_many_in_flight(server: RemotingServer) -> None:
    with Connection(server.address) as conn:
        futures = [
            conn.invoke_async(RemotingCommand.request(ECHO, {"n": str(i)}, body=b"b" * i), 5)
            for i in range(200)
        ]
        for i, f in enumerate(futures):
            r = f.result(10)
            assert r.ext_fields["n"] == str(i)
            assert bytes(r.body or b"") == b"b" * i


def test_concurrent_clients(server: RemotingServer) -> None:
    def one(k: int) -> None:
        with Connection(server.address) as conn:
            for i in range(50):
                r = conn.invoke(RemotingCommand.request(ECHO, {"n": f"{k}-{i}"}), 5)
                assert r.ext_fields["n"] == f"{k}-{i}"

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(8)))


def test_big_body_round_trip(server: RemotingServer) -> None:
    body = bytes(range(256)) * 20_000  # 5 MB: bigger than a reader chunk
    with Connection(server.address) as conn:
        r = conn.invoke(RemotingCommand.request(ECHO, {"n": "big"}, body=body), 10)
        assert bytes(r.body or b"") == body


def test_rocketmq_serialized_request_answered_in_kind(server: RemotingServer) -> None:
    from rocketspark.remoting.codes import SerializeType

    with Connection(server.address) as conn:
        req = RemotingCommand.request(ECHO, {"n": "bin"}, serialize_type=SerializeType.ROCKETMQ)
        r = conn.invoke(req, 5)
        assert r.serialize_type == SerializeType.ROCKETMQ
        assert r.ext_fields["n"] == "bin"


def test_unknown_code_not_supported(server: RemotingServer) -> None:
    with Connection(server.address) as conn:
        r = conn.invoke(RemotingCommand.request(RequestCode.GET_KV_CONFIG), 5)
        assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert "not supported" in (r.remark or "")


def test_processor_failure_is_system_error(server: RemotingServer) -> None:
    def boom(request: RemotingCommand, channel: Channel) -> RemotingCommand:
        raise ValueError("no such thing")

    server.register(SLOW, boom)
    with Connection(server.address) as conn:
        r = conn.invoke(RemotingCommand.request(SLOW), 5)
        assert r.code == ResponseCode.SYSTEM_ERROR
        assert "no such thing" in (r.remark or "")


def test_oneway_gets_no_answer(server: RemotingServer) -> None:
    seen = threading.Event()

    def record(request: RemotingCommand, channel: Channel) -> RemotingCommand:
        seen.set()
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    server.register(ONEWAY, record)
    with _raw(server) as sock:
        req = RemotingCommand.request(ONEWAY, oneway=True).with_opaque(7)
        sock.sendall(req.to_bytes())
        assert seen.wait(5)
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(1)  # nothing comes
        # The connection still serves two-way requests.
        sock.settimeout(5)
        sock.sendall(RemotingCommand.request(ECHO, {"n": "after"}).with_opaque(8).to_bytes())
        answer = _read_frame(sock)
        assert answer.opaque == 8 and answer.ext_fields["n"] == "after"


def test_reply_parts_are_sent_as_one_body(server: RemotingServer) -> None:
    segment = bytearray(b"0123456789" * 1000)
    view = memoryview(segment)

    def parts(request: RemotingCommand, channel: Channel) -> Reply:
        return Reply(
            RemotingCommand.response_to(request, ResponseCode.SUCCESS, ext_fields={"k": "v"}),
            [view[10:20], b"", view[500:1500], b"tail"],
        )

    server.register(PARTS, parts)
    with Connection(server.address) as conn:
        r = conn.invoke(RemotingCommand.request(PARTS), 5)
        assert r.ext_fields == {"k": "v"}
        assert bytes(r.body or b"") == bytes(segment[10:20] + segment[500:1500]) + b"tail"


def test_processor_may_answer_later(server: RemotingServer) -> None:
    parked: list[tuple[RemotingCommand, Channel]] = []

    def later(request: RemotingCommand, channel: Channel) -> None:
        parked.append((request, channel))

    server.register(LATER, later)
    with Connection(server.address) as conn:
        future = conn.invoke_async(RemotingCommand.request(LATER), 5)
        deadline = time.monotonic() + 5
        while not parked and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not future.done()
        request, channel = parked[0]
        channel.respond(request, RemotingCommand.response_to(request, ResponseCode.SUCCESS, "late"))
        assert future.result(5).remark == "late"


def test_server_invokes_the_client(server: RemotingServer) -> None:
    answers: list[RemotingCommand] = []

    def ask(request: RemotingCommand, channel: Channel) -> RemotingCommand:
        # From a processor thread: the reader stays free to read the client's answer.
        check = RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, {"q": "1"})
        answers.append(channel.invoke(check, 5))
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    def client_handler(request: RemotingCommand, conn: Connection) -> RemotingCommand:
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, "checked")

    server.register(ASK_CLIENT, ask)
    with Connection(
        server.address, handlers={RequestCode.CHECK_TRANSACTION_STATE: client_handler}
    ) as conn:
        assert conn.invoke(RemotingCommand.request(ASK_CLIENT), 10).code == 0
    assert answers[0].remark == "checked"


def test_system_busy_when_the_queue_is_full() -> None:
    release = threading.Event()
    started = threading.Semaphore(0)

    def slow(request: RemotingCommand, channel: Channel) -> RemotingCommand:
        started.release()
        release.wait(10)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    with RemotingServer(port=0) as srv:
        srv.register(SLOW, slow, srv.work_queue("slow", threads=1, capacity=2))
        srv.register(ECHO, echo)
        with Connection(srv.address) as conn:
            held = [conn.invoke_async(RemotingCommand.request(SLOW), 10) for _ in range(2)]
            assert started.acquire(timeout=5)
            busy = conn.invoke(RemotingCommand.request(SLOW), 5)
            assert busy.code == ResponseCode.SYSTEM_BUSY
            assert busy.remark == BUSY_REMARK
            # Other queues are not affected.
            assert conn.invoke(RemotingCommand.request(ECHO), 5).code == 0
            release.set()
            assert [f.result(10).code for f in held] == [0, 0]
            assert conn.invoke(RemotingCommand.request(SLOW), 5).code == 0


def _read_frame(sock: socket.socket) -> RemotingCommand:
    def exactly(n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            assert chunk, "connection closed"
            out += chunk
        return out

    prefix = exactly(4)
    (length,) = struct.unpack(">i", prefix)
    return RemotingCommand.decode(prefix + exactly(length))


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # LENGTH far beyond the limit
        struct.pack(">i", 2) + b"ab",  # LENGTH too small for a header length
        struct.pack(">ii", 12, 50) + b"x" * 8,  # header length beyond the frame
        struct.pack(">ii", 12, 8) + b"{not json",  # a JSON header that does not parse
        struct.pack(">ii", 12, (7 << 24) | 8) + b"x" * 8,  # unknown serialize type
    ],
    ids=["http", "short", "header-beyond", "bad-json", "serialize-type"],
)
def test_garbage_drops_only_that_connection(server: RemotingServer, garbage: bytes) -> None:
    with Connection(server.address) as bystander:
        assert bystander.invoke(RemotingCommand.request(ECHO), 5).code == 0
        with _raw(server) as sock:
            sock.sendall(garbage)
            assert _closed_by_peer(sock)
        assert bystander.invoke(RemotingCommand.request(ECHO), 5).code == 0
    _ping(server)


def test_oversize_frame_is_refused_before_it_is_read(server: RemotingServer) -> None:
    with _raw(server) as sock:
        # Only the prefix: the server must not wait for (or allocate) 16 MiB.
        sock.sendall(struct.pack(">ii", MAX_FRAME_SIZE, 20))
        assert _closed_by_peer(sock)
    _ping(server)


def _raw_ping(server: RemotingServer) -> None:
    with _raw(server) as sock:
        sock.sendall(RemotingCommand.request(ECHO, {"n": "raw"}).with_opaque(3).to_bytes())
        answer = _read_frame(sock)
        assert (answer.opaque, answer.ext_fields["n"]) == (3, "raw")


def test_client_gone_mid_frame(server: RemotingServer) -> None:
    # Raw sockets only: a Connection closed while its reader thread is in recv can leave
    # the descriptor busy for a socket made next (a client-side race), which would keep a
    # raw socket of this test open after its close.
    frame = RemotingCommand.request(ECHO, {"n": "cut"}, body=b"z" * 10_000).to_bytes()
    for cut in (2, 6, 100, len(frame) - 1):
        with _raw(server) as sock:
            sock.sendall(frame[:cut])
        _raw_ping(server)
    deadline = time.monotonic() + 5
    while len(server.channels) > 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.channels == []


def test_stop_closes_connections() -> None:
    srv = RemotingServer(port=0).start()
    srv.register(ECHO, echo)
    conn = Connection(srv.address)
    assert conn.invoke(RemotingCommand.request(ECHO), 5).code == 0
    srv.stop()
    srv.stop()
    with pytest.raises(RemotingConnectError):
        conn.invoke(RemotingCommand.request(ECHO), 5)
    conn.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", srv.port), timeout=1).close()


def test_a_client_that_does_not_read_stalls_nobody() -> None:
    big = memoryview(bytearray(1 << 20))

    def large(request: RemotingCommand, channel: Channel) -> Reply:
        return Reply(RemotingCommand.response_to(request, ResponseCode.SUCCESS), [big])

    with RemotingServer(port=0) as srv:
        one = srv.work_queue("one", threads=1, capacity=1000)
        srv.register(PARTS, large, one)
        srv.register(ECHO, echo, one)  # the same single worker
        with _raw(srv) as slow:
            for i in range(40):  # 40 MiB of answers it never reads
                slow.sendall(RemotingCommand.request(PARTS).with_opaque(i + 1).to_bytes())
            time.sleep(0.5)
            started = time.monotonic()
            with Connection(srv.address) as conn:
                assert conn.invoke(RemotingCommand.request(ECHO, {"n": "x"}), 10).code == 0
            assert time.monotonic() - started < 5
            # The slow client still gets every answer, in order, once it reads.
            slow.settimeout(30)
            for i in range(40):
                answer = _read_frame(slow)
                assert (answer.opaque, len(answer.body or b"")) == (i + 1, 1 << 20)


def _server_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("rocketspark-serve-")}


def test_stop_under_a_stream_of_connects(caplog: pytest.LogCaptureFixture) -> None:
    """stop() while clients keep connecting: no error, and no thread of the server left."""
    failures: list[threading.ExceptHookArgs] = []
    previous_hook = threading.excepthook
    threading.excepthook = failures.append
    before = _server_threads()
    try:
        for _ in range(10):
            srv = RemotingServer(port=0).start()
            srv.register(ECHO, echo)
            done = threading.Event()

            def connect(srv: RemotingServer = srv, done: threading.Event = done) -> None:
                ping = RemotingCommand.request(ECHO, {"n": "s"}).with_opaque(1).to_bytes()
                while not done.is_set():
                    try:
                        with socket.create_connection(("127.0.0.1", srv.port), timeout=0.2) as s:
                            s.sendall(ping)
                    except OSError:
                        pass  # refused or reset: the server is stopping

            connectors = [threading.Thread(target=connect) for _ in range(4)]
            for t in connectors:
                t.start()
            time.sleep(0.05)
            srv.stop()
            done.set()
            for t in connectors:
                t.join(10)
            assert _server_threads() - before == set()
    finally:
        threading.excepthook = previous_hook
    assert failures == []
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_a_client_that_stops_reading_is_dropped_past_the_backlog_cap(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client that sends pulls and never reads their answers: once what waits for it
    passes max_backlog, its connection is dropped (logged once); others are served."""
    segment = memoryview(bytearray(b"m" * (1 << 20)))  # a mapped CommitLog segment's stand-in

    def pull(request: RemotingCommand, channel: Channel) -> Reply:
        return Reply(RemotingCommand.response_to(request, ResponseCode.SUCCESS), [segment])

    with RemotingServer(port=0, max_backlog=4 << 20) as srv:
        srv.register(PARTS, pull)
        srv.register(ECHO, echo)
        with Connection(srv.address) as bystander:
            assert bystander.invoke(RemotingCommand.request(ECHO), 5).code == 0
            others = set(srv.channels)
            with _raw(srv) as slow:
                slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
                for i in range(64):  # 64 MiB of answers it never reads
                    try:
                        slow.sendall(RemotingCommand.request(PARTS).with_opaque(i + 1).to_bytes())
                    except OSError:
                        break  # dropped already
                deadline = time.monotonic() + 10
                while len(srv.channels) == len(others) and time.monotonic() < deadline:
                    time.sleep(0.01)  # accepted yet?
                while set(srv.channels) != others and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert set(srv.channels) == others
            assert bystander.invoke(RemotingCommand.request(ECHO, {"n": "y"}), 5).code == 0
    dropped = [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING and "does not read its responses" in r.getMessage()
    ]
    assert len(dropped) == 1
    assert "4194304 bytes a client may leave unread" in dropped[0].getMessage()
    writers = [t for t in threading.enumerate() if t.name.startswith("rocketspark-serve-writer")]
    assert writers == []


def test_an_inline_processor_runs_on_the_reader_without_a_queue_slot() -> None:
    """``inline``: served on the connection's reader thread, so a full queue does not
    answer it SYSTEM_BUSY; its own Reply may carry a head the processor formatted."""
    release = threading.Event()
    started = threading.Semaphore(0)
    threads: list[str] = []

    def slow(request: RemotingCommand, channel: Channel) -> RemotingCommand:
        started.release()
        release.wait(10)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    def inline(request: RemotingCommand, channel: Channel) -> Reply:
        threads.append(threading.current_thread().name)
        head = RemotingCommand.response_to(request, ResponseCode.SUCCESS, "formatted")
        frame = b"".join(replace(head, flag=1, body=b"ab").encode())
        return Reply(RemotingCommand(0), [frame[-2:]], frame[:-2])

    with RemotingServer(port=0, name="inline") as srv:
        queue = srv.work_queue("one", threads=1, capacity=1)
        srv.register(SLOW, slow, queue)
        srv.register(PARTS, inline, queue, inline=True)
        with Connection(srv.address) as conn:
            held = conn.invoke_async(RemotingCommand.request(SLOW), 10)
            assert started.acquire(timeout=5)
            assert conn.invoke(RemotingCommand.request(SLOW), 5).code == ResponseCode.SYSTEM_BUSY
            r = conn.invoke(RemotingCommand.request(PARTS), 5)
            assert (r.code, r.remark, bytes(r.body or b"")) == (0, "formatted", b"ab")
            release.set()
            assert held.result(10).code == 0
    assert len(threads) == 1 and threads[0].startswith("rocketspark-serve-inline-127.0.0.1:")

"""One TCP connection to a RocketMQ NameServer or broker, shared by many threads.

A :class:`Connection` writes requests from any thread (one lock around each
frame's ``sendmsg``) and reads every frame on one reader thread, which
matches a response to its request by ``opaque`` and completes that request's
``Future``: many requests can be in flight at once (pipelined pulls). The
server's own requests (CHECK_TRANSACTION_STATE, NOTIFY_CONSUMER_IDS_CHANGED,
GET_CONSUMER_RUNNING_INFO) go to handlers registered by request code, run on a
small thread pool so a slow handler never holds up responses.

A connection opens on first use. When it dies (the peer closes it, a send or
read fails, a frame is malformed or beyond 16 MiB) every request in flight on
it fails with RemotingConnectError naming the address, and the next call
connects again. A request unanswered in time fails with RemotingTimeoutError
naming the address and the request. :class:`Connections` keeps one connection
per address.

The reader cuts frames with ``frames.read_commands`` (the server's reader
does too): each frame's body is a view of a 256 KiB receive chunk, or of a
chunk of its own size when it is bigger, so a body is copied once at most
(its first bytes), and a pull answer of a few MiB never.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Executor, Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass, replace

from rocketspark.errors import (
    BrokerBusyError,
    ConfigError,
    RemotingCommandError,
    RemotingConnectError,
    RemotingError,
    RemotingFrameError,
    RemotingTimeoutError,
)
from rocketspark.remoting.codes import ResponseCode, RpcFlag, request_name, response_name
from rocketspark.remoting.command import (
    IOV_MAX,
    Body,
    RemotingCommand,
    drop_sent,
)
from rocketspark.remoting.frames import read_commands

__all__ = [
    "AwaitedResponse",
    "Connection",
    "Connections",
    "Handler",
    "check_response",
    "split_address",
]

log = logging.getLogger(__name__)

# Serves a request the server sent on a connection (which says where it came from and can
# send requests of its own, e.g. END_TRANSACTION after CHECK_TRANSACTION_STATE); returns
# the response, or None to send none.
Handler = Callable[[RemotingCommand, "Connection"], RemotingCommand | None]

DEFAULT_CONNECT_TIMEOUT = 3.0  # seconds
DEFAULT_SEND_TIMEOUT = 30.0  # seconds without progress before a send gives the connection up
HANDLER_THREADS = 4

# A weak reference to a connection's expiry method: called, the method or None.
_ExpireRef = Callable[[], Callable[[int], None] | None]


def split_address(address: str) -> tuple[str, int]:
    """Split ``"host:port"`` (or ``"[v6]:port"``) into host and port; raises ConfigError."""
    host, sep, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"a RocketMQ address is host:port, got {address!r}")
    return host, int(port)


def check_response(
    response: RemotingCommand,
    *,
    expected: Collection[int] = (ResponseCode.SUCCESS,),
    request_code: int | None = None,
    address: str | None = None,
) -> RemotingCommand:
    """Return ``response`` if its code is one of ``expected``; raise otherwise.

    Raises BrokerBusyError (retriable) for SYSTEM_BUSY, RemotingCommandError
    with ``code`` and ``remark`` for any other unexpected code. ``request_code``
    and ``address`` only make the message say what was asked of whom.
    """
    if response.code in expected:
        return response
    what = request_name(request_code) if request_code is not None else "request"
    where = f" to {address}" if address else ""
    message = f"{what}{where} answered {response_name(response.code)} ({response.code})"
    if response.remark:
        message += f": {response.remark}"
    kind = BrokerBusyError if response.code == ResponseCode.SYSTEM_BUSY else RemotingCommandError
    raise kind(message, code=response.code, remark=response.remark)


class AwaitedResponse:
    """The answer to a request its caller waits for on its own thread (:meth:`result`,
    soon): cheaper than a Future (one lock; no condition, callbacks or timer thread), as
    the caller's wait enforces the timeout. Made by :meth:`Connection.invoke_awaited`."""

    __slots__ = ("_done", "_response", "_error", "_expire", "_opaque", "_timeout")

    def __init__(self, expire: Callable[[int], None], opaque: int, timeout: float):
        self._done = threading.Lock()
        self._done.acquire()  # released once, by whoever completes it
        self._response: RemotingCommand | None = None
        self._error: BaseException | None = None
        self._expire = expire
        self._opaque = opaque
        self._timeout = timeout

    def set_result(self, response: RemotingCommand) -> None:
        self._response = response
        self._done.release()

    def set_exception(self, error: BaseException) -> None:
        self._error = error
        self._done.release()

    def result(self) -> RemotingCommand:
        """The response; raises RemotingTimeoutError when none came within the timeout,
        RemotingConnectError when the connection died first."""
        try:
            answered = self._done.acquire(timeout=max(self._timeout, 0.0))
        except BaseException:  # interrupted (Ctrl-C): give the request up, as cancel() does
            self._expire(self._opaque)
            raise
        if not answered:
            self._expire(self._opaque)  # fails it, unless a response won the race
            self._done.acquire()
        self._done.release()  # open for good: another result() returns at once
        if self._error is not None:
            raise self._error
        assert self._response is not None
        return self._response

    def cancel(self) -> bool:
        """Give the request up: its response, if one comes, is dropped."""
        self._expire(self._opaque)
        return True


@dataclass(slots=True)
class _Pending:
    # Each is completed once: by whoever pops it from the pending table (under the lock).
    future: Future[RemotingCommand] | AwaitedResponse
    sock: socket.socket
    code: int
    timeout: float


class Connection:
    """One TCP connection to ``address`` (``"host:port"``); thread-safe, connects lazily.

    ``connect_timeout`` bounds making the connection, ``send_timeout`` a send
    that makes no progress (the connection is then given up). ``handlers``
    serve the server's requests by request code; ``executor`` runs them (by
    default a pool of this connection's own).
    """

    def __init__(
        self,
        address: str,
        *,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        send_timeout: float = DEFAULT_SEND_TIMEOUT,
        handlers: Mapping[int, Handler] | None = None,
        executor: Executor | None = None,
    ):
        self._host, self._port = split_address(address)
        self._address = address
        self._connect_timeout = connect_timeout
        self._send_timeout = send_timeout
        self._handlers: dict[int, Handler] = dict(handlers or {})
        self._executor = executor
        self._own_executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()  # the socket, the pending table, the executor
        self._connect_lock = threading.Lock()  # one connect at a time, outside _lock
        self._write_lock = threading.Lock()  # one frame at a time on the socket
        self._sock: socket.socket | None = None
        self._pending: dict[int, _Pending] = {}
        self._opaques = itertools.count(1)
        self._closed = False
        self._expire_ref: _ExpireRef = weakref.WeakMethod(self._expire)

    @property
    def address(self) -> str:
        """The ``host:port`` this connection talks to."""
        return self._address

    @property
    def connected(self) -> bool:
        """Whether a socket is open now (a closed or dead connection reconnects on use)."""
        return self._sock is not None

    @property
    def in_flight(self) -> int:
        """How many requests await their response."""
        return len(self._pending)

    def register_handler(self, code: int, handler: Handler) -> None:
        """Serve the server's requests of ``code`` with ``handler`` (replacing any other)."""
        self._handlers[code] = handler

    def connect(self) -> None:
        """Open the connection now if it is not open; raises RemotingConnectError."""
        self._socket()

    def invoke(self, request: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send ``request`` and return its response, waiting at most ``timeout`` seconds.

        Any response code is returned (see :func:`check_response`). Raises
        RemotingTimeoutError when no response came in time,
        RemotingConnectError when the connection cannot be made or dies first,
        RemotingFrameError when ``request`` cannot be encoded.
        """
        if request.is_response:
            raise ValueError(f"{request!r} is a response, not a request")
        opaque = self._next_opaque()
        cmd = replace(request, opaque=opaque, flag=request.flag & ~RpcFlag.ONEWAY)
        return self._send_awaited(cmd.code, opaque, cmd.encode(), timeout).result()

    def invoke_async(self, request: RemotingCommand, timeout: float) -> Future[RemotingCommand]:
        """Send ``request`` and return a Future of its response, failed after ``timeout`` s.

        The Future fails with RemotingTimeoutError or RemotingConnectError as
        :meth:`invoke` raises them; its callbacks run on the reader thread and
        must be quick. Raises RemotingConnectError at once when no connection
        can be made.
        """
        return self._start(request, timeout)[1]

    def invoke_async_encoded(
        self, code: int, encodes: Sequence[Callable[[int], list[Body]]], timeout: float
    ) -> list[Future[RemotingCommand]]:
        """:meth:`invoke_async` of requests of ``code`` given encoded, sent together (one
        ``sendmsg``): ``encode(opaque)`` returns a request's frame as buffers (a request's
        flag, not one-way). For requests sent many times with a few numbers changed
        (pulls), whose frames are a template's."""
        opaques = [self._next_opaque() for _ in encodes]
        buffers = [
            b for encode, opaque in zip(encodes, opaques, strict=True) for b in encode(opaque)
        ]
        return self._send_requests(code, opaques, buffers, timeout)

    def invoke_awaited(
        self, code: int, encode: Callable[[int], list[Body]], timeout: float
    ) -> AwaitedResponse:
        """One request of ``code`` given encoded (see :meth:`invoke_async_encoded`), whose
        :meth:`AwaitedResponse.result` the caller reads on its own thread (or cancels) soon: its
        wait, not a timer, enforces ``timeout``. For synchronous sends."""
        opaque = self._next_opaque()
        return self._send_awaited(code, opaque, encode(opaque), timeout)

    def invoke_oneway(self, request: RemotingCommand) -> None:
        """Send ``request`` marked one-way: the server sends no response.

        Raises RemotingConnectError when the connection cannot be made or the
        send fails.
        """
        cmd = replace(request, opaque=self._next_opaque(), flag=request.flag | RpcFlag.ONEWAY)
        buffers = cmd.encode()
        self._send(self._socket(), buffers)

    def close(self) -> None:
        """Close the connection: requests in flight fail with RemotingConnectError.

        Later calls raise RemotingError. Closing twice is harmless.
        """
        with self._lock:
            self._closed = True
            sock = self._sock
            executor, self._own_executor = self._own_executor, None
        if sock is not None:
            self._drop(sock, "closed by the client")
        if executor is not None:
            executor.shutdown(wait=False)

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "connected" if self._sock else "idle"
        return f"Connection({self._address!r}, {state}, in_flight={len(self._pending)})"

    # --- requests ----------------------------------------------------------------------

    def _next_opaque(self) -> int:
        return next(self._opaques) & 0x7FFFFFFF

    def _start(
        self, request: RemotingCommand, timeout: float
    ) -> tuple[int, Future[RemotingCommand]]:
        if request.is_response:
            raise ValueError(f"{request!r} is a response, not a request")
        opaque = self._next_opaque()
        cmd = replace(request, opaque=opaque, flag=request.flag & ~RpcFlag.ONEWAY)
        return opaque, self._send_requests(cmd.code, [opaque], cmd.encode(), timeout)[0]

    def _send_requests(
        self, code: int, opaques: list[int], buffers: list[Body], timeout: float
    ) -> list[Future[RemotingCommand]]:
        futures: list[Future[RemotingCommand]] = [Future() for _ in opaques]
        while True:
            sock = self._socket()
            with self._lock:
                if self._sock is sock:  # not dropped meanwhile: its drop will fail these
                    for opaque, future in zip(opaques, futures, strict=True):
                        self._pending[opaque] = _Pending(future, sock, code, timeout)
                    break
        try:
            self._send(sock, buffers)
        except RemotingConnectError:
            return futures  # _drop failed them with the reason
        deadline = time.monotonic() + timeout
        for opaque in opaques:
            _DEADLINES.add(deadline, self._expire_ref, opaque)
        return futures

    def _send_awaited(
        self, code: int, opaque: int, buffers: list[Body], timeout: float
    ) -> AwaitedResponse:
        answer = AwaitedResponse(self._expire, opaque, timeout)
        while True:
            sock = self._socket()
            with self._lock:
                if self._sock is sock:  # not dropped meanwhile: its drop will fail it
                    self._pending[opaque] = _Pending(answer, sock, code, timeout)
                    break
        try:
            self._send(sock, buffers)
        except RemotingConnectError:
            pass  # _drop failed it with the reason
        return answer

    def _socket(self) -> socket.socket:
        """The open socket, connecting first if there is none.

        Connecting holds ``_connect_lock`` only, so responses on other sockets and
        expiries go on meanwhile.
        """
        sock = self._sock
        if sock is not None and not self._closed:
            return sock
        with self._connect_lock:
            with self._lock:
                if self._closed:
                    raise RemotingError(f"the connection to {self._address} was closed")
                if self._sock is not None:
                    return self._sock
            try:
                sock = socket.create_connection((self._host, self._port), self._connect_timeout)
            except OSError as e:
                raise RemotingConnectError(
                    f"cannot connect to {self._address} within {self._connect_timeout:g} s: {e}",
                    address=self._address,
                ) from e
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(self._send_timeout)  # the reader waits through idle timeouts
            with self._lock:
                if self._closed:
                    sock.close()
                    raise RemotingError(f"the connection to {self._address} was closed")
                self._sock = sock
        reader = threading.Thread(
            target=self._read_loop,
            args=(sock,),
            name=f"rocketspark-remoting-{self._address}",
            daemon=True,
        )
        reader.start()
        return sock

    def _send(self, sock: socket.socket, buffers: list[Body]) -> None:
        try:
            with self._write_lock:
                _send_all(sock, buffers)
        except OSError as e:
            reason = f"send failed: {e}"
            self._drop(sock, reason)
            raise RemotingConnectError(
                f"connection to {self._address} lost: {reason}", address=self._address
            ) from e

    def _expire(self, opaque: int) -> None:
        with self._lock:
            pending = self._pending.pop(opaque, None)
        if pending is not None:
            _fail(
                pending.future,
                RemotingTimeoutError(
                    f"{request_name(pending.code)} to {self._address} got no response within "
                    f"{pending.timeout:g} s (opaque {opaque})",
                    address=self._address,
                ),
            )

    def _drop(self, sock: socket.socket, reason: str, *, by_reader: bool = False) -> None:
        """Forget ``sock`` and fail every request in flight on it.

        Only its reader thread closes the socket (``by_reader``), once its ``recv`` has
        returned: others shut it down, which wakes the reader. A socket closed while its
        reader waits in ``recv`` frees the descriptor, which the next socket this process
        opens may get, and the reader would then read that socket's bytes."""
        with self._lock:
            if self._sock is sock:
                self._sock = None
            lost = [o for o, p in self._pending.items() if p.sock is sock]
            failed = [self._pending.pop(o) for o in lost]
        try:
            sock.shutdown(socket.SHUT_RDWR)  # wakes the reader
        except OSError:
            pass
        if by_reader:
            with self._write_lock:  # no writer is inside sendmsg on this descriptor
                sock.close()
        for pending in failed:
            _fail(
                pending.future,
                RemotingConnectError(
                    f"connection to {self._address} lost before {request_name(pending.code)} "
                    f"was answered: {reason}",
                    address=self._address,
                ),
            )

    # --- the reader --------------------------------------------------------------------

    def _read_loop(self, sock: socket.socket) -> None:
        reason = "closed by the server"
        try:
            read_commands(
                sock.recv_into,
                lambda: self._sock is sock,
                on_response=self._complete,
                on_request=lambda request: self._serve_later(request, sock),
            )
        except RemotingFrameError as e:
            reason = f"malformed frame: {e}"
            log.warning("closing the connection to %s: %s", self._address, reason)
        except OSError as e:
            reason = f"read failed: {e}"
        except Exception as e:  # a bug must not leave the requests in flight hanging
            reason = f"reader failed: {e!r}"
            log.exception("closing the connection to %s", self._address)
        finally:
            self._drop(sock, reason, by_reader=True)

    def _complete(self, response: RemotingCommand) -> None:
        with self._lock:
            pending = self._pending.pop(response.opaque, None)
        if pending is None:
            log.debug("%s: a response to opaque %d came late", self._address, response.opaque)
            return
        try:
            pending.future.set_result(response)
        except InvalidStateError:
            pass  # the caller cancelled it

    # --- the server's requests ---------------------------------------------------------

    def _serve_later(self, request: RemotingCommand, sock: socket.socket) -> None:
        with self._lock:
            executor = self._executor or self._own_executor
            if executor is None:
                executor = self._own_executor = ThreadPoolExecutor(
                    HANDLER_THREADS,
                    thread_name_prefix=f"rocketspark-remoting-handler-{self._address}",
                )
        try:
            executor.submit(self._serve, request, sock)
        except RuntimeError:  # shut down: the connection is closing
            pass

    def _serve(self, request: RemotingCommand, sock: socket.socket) -> None:
        handler = self._handlers.get(request.code)
        response: RemotingCommand | None
        if handler is None:
            response = RemotingCommand.response_to(
                request,
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                f" request type {request.code} not supported",
            )
        else:
            try:
                response = handler(request, self)
                if response is not None and not isinstance(response, RemotingCommand):
                    raise TypeError(f"the handler returned {type(response).__name__}")
            except Exception as e:
                log.exception("%s: the handler of %s failed", self._address, request.code_name)
                response = RemotingCommand.response_to(
                    request, ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}"
                )
        if response is None or request.is_oneway:
            return
        response = replace(
            response,
            opaque=request.opaque,
            flag=(response.flag | RpcFlag.RESPONSE) & ~RpcFlag.ONEWAY,
        )
        try:
            self._send(sock, response.encode())
        except RemotingError as e:
            log.warning("%s: cannot answer %s: %s", self._address, request.code_name, e)


def _send_all(sock: socket.socket, buffers: list[Body]) -> None:
    views = [memoryview(b).cast("B") for b in buffers]
    while views:
        drop_sent(views, sock.sendmsg(views[:IOV_MAX]))  # more buffers a call: EMSGSIZE


def _fail(future: Future[RemotingCommand] | AwaitedResponse, error: BaseException) -> None:
    try:
        future.set_exception(error)
    except InvalidStateError:
        pass  # answered or cancelled meanwhile


class _Deadlines:
    """One daemon thread that expires requests whose time is up (a heap of deadlines)."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _ExpireRef, int]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, deadline: float, expire: _ExpireRef, opaque: int) -> None:
        with self._cond:
            entry = (deadline, next(self._seq), expire, opaque)
            heapq.heappush(self._heap, entry)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="rocketspark-remoting-deadlines", daemon=True
                )
                self._thread.start()
            elif self._heap[0] is entry:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                _, _, ref, opaque = heapq.heappop(self._heap)
            expire = ref()
            if expire is not None:
                expire(opaque)


_DEADLINES = _Deadlines()


class Connections:
    """One :class:`Connection` per address, made on first use; thread-safe.

    Handlers registered here serve the server requests of every connection,
    on one shared pool.
    """

    def __init__(
        self,
        *,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        send_timeout: float = DEFAULT_SEND_TIMEOUT,
    ):
        self._connect_timeout = connect_timeout
        self._send_timeout = send_timeout
        self._lock = threading.Lock()
        self._by_address: dict[str, Connection] = {}
        self._handlers: dict[int, Handler] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False

    def get(self, address: str) -> Connection:
        """Return the connection to ``address`` (not yet connected if new)."""
        with self._lock:
            if self._closed:
                raise RemotingError("the connections were closed")
            conn = self._by_address.get(address)
            if conn is None:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(
                        HANDLER_THREADS, thread_name_prefix="rocketspark-remoting-handler"
                    )
                conn = Connection(
                    address,
                    connect_timeout=self._connect_timeout,
                    send_timeout=self._send_timeout,
                    handlers=self._handlers,
                    executor=self._executor,
                )
                self._by_address[address] = conn
            return conn

    def invoke(self, address: str, request: RemotingCommand, timeout: float) -> RemotingCommand:
        """``get(address).invoke(request, timeout)``."""
        return self.get(address).invoke(request, timeout)

    def register_handler(self, code: int, handler: Handler) -> None:
        """Serve the server's requests of ``code`` on every connection, present and future."""
        with self._lock:
            self._handlers[code] = handler
            for conn in self._by_address.values():
                conn.register_handler(code, handler)

    def close(self, address: str) -> None:
        """Close and forget the connection to ``address``, if any."""
        with self._lock:
            conn = self._by_address.pop(address, None)
        if conn is not None:
            conn.close()

    def close_all(self) -> None:
        """Close every connection; later calls to :meth:`get` raise RemotingError."""
        with self._lock:
            self._closed = True
            conns = list(self._by_address.values())
            self._by_address.clear()
            executor, self._executor = self._executor, None
        for conn in conns:
            conn.close()
        if executor is not None:
            executor.shutdown(wait=False)

    def __enter__(self) -> Connections:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_all()

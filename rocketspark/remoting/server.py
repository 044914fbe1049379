"""The server side of RocketMQ's remoting protocol: accept, cut frames, dispatch by code.

Transport only (Apache RocketMQ's ``NettyRemotingServer`` + ``NettyRemotingAbstract``):
what a request means is a processor's business (``processors.py``). One
:class:`RemotingServer` listens on one port (127.0.0.1 unless told otherwise);
every accepted connection gets a reader thread that cuts frames with
``frames.read_commands`` (the client's reader does too) and hands each
request to the processor registered for its code, on that processor's
executor:

- each group of codes runs on its own bounded :class:`WorkQueue` (RocketMQ's
  send, pull, query... thread pools with their queue capacities); when the
  queue is full the request is answered SYSTEM_BUSY at once
  (``[OVERLOAD]system busy, start flow control for a while``), as RocketMQ does;
- a code registered ``inline`` is served on the reader thread itself, without a
  hand-off to a queue (pulls: a processor that never waits);
- a code no processor serves is answered REQUEST_CODE_NOT_SUPPORTED;
- with ``access`` (the ACL), each request is checked first: one it refuses is
  answered with what the check returned (NO_PERMISSION) and never dispatched;
- a one-way request is never answered;
- a processor that returns None for a two-way request has taken it over and
  answers later with :meth:`Channel.respond` (a pull parked until messages come);
- a processor may answer with a :class:`Reply`: a command whose body is a list of
  buffers (views of mapped CommitLog segments) written with one ``sendmsg``,
  never copied into one bytes object.

A frame beyond 16 MiB, a malformed frame or a peer that disconnects mid-frame
ends that connection only (logged), nobody else notices. Writes never wait for
a client: what its socket does not take at once waits in that connection's
backlog, sent by a writer thread of its own as the client reads. A client that
makes no progress for the send timeout, or lets more than ``max_backlog`` bytes
of responses pile up, is dropped (logged once) and stalls no other connection. The server can send
requests of its own to a connected client (:meth:`Channel.invoke`: the
transaction check-back), whose responses the reader matches by opaque.
"""

from __future__ import annotations

import collections
import ipaddress
import itertools
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from rocketspark.errors import RemotingConnectError, RemotingFrameError, RemotingTimeoutError
from rocketspark.remoting.codes import ResponseCode, RpcFlag
from rocketspark.remoting.command import (
    IOV_MAX,
    LENGTH,
    MAX_FRAME_SIZE,
    Body,
    RemotingCommand,
    drop_sent,
)
from rocketspark.remoting.frames import read_commands

__all__ = [
    "BUSY_REMARK",
    "Access",
    "Channel",
    "Processor",
    "RemotingServer",
    "Reply",
    "WorkQueue",
    "is_wildcard",
]

log = logging.getLogger(__name__)

BUSY_REMARK = "[OVERLOAD]system busy, start flow control for a while"
DEFAULT_SEND_TIMEOUT = 30.0  # seconds a write may make no progress before the peer is dropped
DEFAULT_MAX_BACKLOG = 64 * 1024 * 1024  # bytes of responses a client may leave unread
_PREFIX_SIZE = LENGTH.size
_ACCEPT_POLL = 0.2  # seconds between checks of the stop flag while accepting


def is_wildcard(host: str) -> bool:
    """Whether binding ``host`` binds every address of the machine ("", 0.0.0.0, ::)."""
    try:
        return host == "" or ipaddress.ip_address(host).is_unspecified
    except ValueError:  # a name
        return False


@dataclass(frozen=True, slots=True)
class Reply:
    """A response whose body is several buffers, sent in order without joining them.

    ``command`` carries the header (its own body, if any, is ignored); ``parts``
    are bytes or memoryviews, e.g. views of mapped CommitLog segments. ``head``,
    when given, is the frame's start (length, marker, header) as the processor
    formatted it for its request (the request's opaque and serialize type, the
    response flag; the length counting ``parts``): sent as it is, ``command`` not
    encoded (a pull's answer, whose header only changes in a few numbers).
    """

    command: RemotingCommand
    parts: Sequence[Body]
    head: bytes | None = None


# Serves one request that came on ``channel``: a response, a Reply, or None (one-way, or
# taken over: the processor answers later with ``channel.respond``).
Processor = Callable[[RemotingCommand, "Channel"], RemotingCommand | Reply | None]
# Checks a request before its processor sees it: None (serve it) or the answer that
# refuses it (the ACL's NO_PERMISSION), sent instead; a refused request touches nothing.
Access = Callable[[RemotingCommand, "Channel"], RemotingCommand | None]


class WorkQueue:
    """A thread pool that holds at most ``capacity`` tasks waiting or running.

    :meth:`try_submit` returns False instead of queueing beyond that: the server
    then answers SYSTEM_BUSY (RocketMQ's bounded ``LinkedBlockingQueue`` and
    its ``RejectedExecutionException``).
    """

    def __init__(self, name: str, threads: int, capacity: int):
        if threads <= 0 or capacity < threads:
            raise ValueError(f"work queue {name}: {threads} threads, capacity {capacity}")
        self.name = name
        self._slots = threading.BoundedSemaphore(capacity)
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=f"rocketspark-serve-{name}")

    def try_submit(self, fn: Callable[..., Any], *args: Any) -> bool:
        """Run ``fn(*args)`` on the pool; False (nothing run) when the queue is full or shut."""
        if not self._slots.acquire(blocking=False):
            return False
        try:
            self._pool.submit(self._run, fn, args)
        except RuntimeError:  # shut down
            self._slots.release()
            return False
        return True

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        finally:
            self._slots.release()

    def shutdown(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=True)


class Channel:
    """One accepted connection: where its requests came from, and how to answer them.

    Thread-safe. ``attributes`` is free for processors (the client id a
    heartbeat named, the producer groups it serves...).
    """

    def __init__(self, server: RemotingServer, sock: socket.socket, address: str):
        self.server = server
        self.address = address  # the peer's "host:port"
        self.attributes: dict[str, Any] = {}
        self._sock = sock
        self._write_lock = threading.Lock()
        self._writer: threading.Thread | None = None
        # Frames waiting for the writer thread, with their sizes (None: no writer; send
        # writes itself), and the bytes of them not sent yet (the one being sent included).
        self._backlog: collections.deque[tuple[list[memoryview], int]] | None = None
        self._backlog_bytes = 0
        self._overflowed = False
        self._lock = threading.Lock()
        self._pending: dict[int, Future[RemotingCommand]] = {}
        self._opaques = itertools.count(1)
        self._closed = False
        self._close_callbacks: list[Callable[[Channel], None]] = []

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"Channel({self.address}, {'closed' if self._closed else 'open'})"

    def on_close(self, callback: Callable[[Channel], None]) -> None:
        """Call ``callback(self)`` once when the connection ends (at once if it has)."""
        with self._lock:
            if not self._closed:
                self._close_callbacks.append(callback)
                return
        callback(self)

    # -- answering ----------------------------------------------------------------------

    def respond(self, request: RemotingCommand, response: RemotingCommand | Reply) -> bool:
        """Send ``response`` to ``request`` (its opaque, the response bit); False when the
        request was one-way or the connection is gone (the answer is then dropped)."""
        if request.is_oneway:
            return False
        if isinstance(response, Reply):
            if response.head is not None:
                return self.send([response.head, *response.parts])
            cmd, parts = response.command, list(response.parts)
        else:
            cmd, parts = response, []
        cmd = replace(
            cmd,
            opaque=request.opaque,
            flag=(cmd.flag | RpcFlag.RESPONSE) & ~RpcFlag.ONEWAY,
            serialize_type=request.serialize_type,
        )
        try:
            buffers = _frame(cmd, parts)
        except RemotingFrameError as e:
            log.warning("%s: cannot answer %s: %s", self.address, request.code_name, e)
            buffers = _frame(
                RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR, str(e)), []
            )
        return self.send(buffers)

    def send(self, buffers: list[Body]) -> bool:
        """Write one frame's buffers; False (and the connection dropped) when it fails.

        Never waits for a slow client: what the socket does not take at once is left
        to this connection's writer thread, which sends it (and every frame after
        it, in order) as the client reads, and drops the connection after
        ``send_timeout`` without progress. A frame that would take the backlog
        beyond the server's ``max_backlog`` bytes drops the connection instead.
        """
        if self._closed:
            return False
        try:
            with self._write_lock:
                if self._backlog is not None:  # the writer is behind: after what it has
                    views = [memoryview(b).cast("B") for b in buffers]
                    size = sum(map(len, views))
                    if self._backlog_bytes + size <= self.server.max_backlog:
                        self._backlog.append((views, size))
                        self._backlog_bytes += size
                        return True
                    if self._overflowed:
                        return False
                    self._overflowed = True
                    waiting = self._backlog_bytes
                else:
                    rest = _send_now(self._sock, buffers)
                    if not rest:
                        return True
                    size = sum(map(len, rest))
                    self._backlog = collections.deque([(rest, size)])
                    self._backlog_bytes = size
                    self._writer = threading.Thread(
                        target=self._write_backlog,
                        name=f"rocketspark-serve-writer-{self.address}",
                        daemon=True,
                    )
                    self._writer.start()
                    return True
        except OSError as e:
            self.close(f"write failed: {e}")
            return False
        reason = (
            f"it does not read its responses: {waiting} bytes wait to be sent, another "
            f"{size} would pass the {self.server.max_backlog} bytes a client may leave unread"
        )
        log.warning(
            "%s: dropping the connection from %s: %s", self.server.name, self.address, reason
        )
        self.close(reason)
        return False

    def _write_backlog(self) -> None:
        """Send the frames the socket did not take at once, in order, waiting for the client
        (the socket's timeout); ends when the backlog is empty."""
        sock = self._sock
        while True:
            with self._write_lock:
                backlog = self._backlog
                if not backlog or self._closed:
                    self._backlog = None
                    self._backlog_bytes = 0
                    return
                views, size = backlog.popleft()
            try:
                # Outside the lock: others append meanwhile. Only this thread writes now
                # (the backlog is not None), and _release waits for the lock it takes.
                _send_views(sock, views)
            except OSError as e:
                with self._write_lock:
                    self._backlog = None
                    self._backlog_bytes = 0
                self.close(f"write failed: {e}")
                return
            with self._write_lock:
                self._backlog_bytes -= size

    # -- the server's own requests ------------------------------------------------------

    def invoke_async(self, request: RemotingCommand) -> Future[RemotingCommand]:
        """Send ``request`` to the client; the Future gets its response (RemotingConnectError
        when the connection ends first). The caller bounds the wait."""
        opaque = next(self._opaques) & 0x7FFFFFFF
        future: Future[RemotingCommand] = Future()
        cmd = replace(request, opaque=opaque, flag=request.flag & ~RpcFlag.ONEWAY)
        with self._lock:
            if self._closed:
                future.set_exception(self._lost(cmd))
                return future
            self._pending[opaque] = future
        if not self.send(cmd.encode()):
            with self._lock:
                self._pending.pop(opaque, None)
            if not future.done():
                future.set_exception(self._lost(cmd))
        return future

    def invoke(self, request: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send ``request`` to the client and wait for its response; RemotingTimeoutError
        after ``timeout`` seconds, RemotingConnectError when the connection ends."""
        future = self.invoke_async(request)
        try:
            return future.result(timeout)
        except TimeoutError:
            raise RemotingTimeoutError(
                f"{request.code_name} to client {self.address} got no response within "
                f"{timeout:g} s",
                address=self.address,
            ) from None

    def invoke_oneway(self, request: RemotingCommand) -> bool:
        """Send ``request`` to the client marked one-way; False when the connection is gone."""
        opaque = next(self._opaques) & 0x7FFFFFFF
        return self.send(
            replace(request, opaque=opaque, flag=request.flag | RpcFlag.ONEWAY).encode()
        )

    def _lost(self, cmd: RemotingCommand) -> RemotingConnectError:
        return RemotingConnectError(
            f"connection to client {self.address} lost before {cmd.code_name} was answered",
            address=self.address,
        )

    def _complete(self, response: RemotingCommand) -> None:
        with self._lock:
            future = self._pending.pop(response.opaque, None)
        if future is None:
            log.debug("%s: a response to opaque %d came late", self.address, response.opaque)
        elif not future.done():
            future.set_result(response)

    # -- ending -------------------------------------------------------------------------

    def close(self, reason: str = "closed by the server") -> None:
        """End the connection: pending server requests fail; close callbacks run once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending = list(self._pending.values())
            self._pending.clear()
            callbacks, self._close_callbacks = self._close_callbacks, []
        log.debug("connection from %s ends: %s", self.address, reason)
        # Shut down, not closed: the reader closes the socket once it is out of recv (see
        # _release). A descriptor closed under a thread blocked on it can be reused by a
        # new socket meanwhile, and that thread would then read another connection.
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the reader
        except OSError:
            pass
        for future in pending:
            if not future.done():
                future.set_exception(
                    RemotingConnectError(
                        f"connection to client {self.address} lost: {reason}", address=self.address
                    )
                )
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("%s: a close callback failed", self.address)
        self.server._forget(self)

    def _release(self) -> None:
        """Close the socket: called by the reader when it has stopped reading, after
        close() shut the socket down. No write is in progress then: the writer thread,
        failing on the shut socket, has ended, and the write lock is held."""
        with self._write_lock:  # send() makes and starts the writer under it
            writer = self._writer
        if writer is not None and writer is not threading.current_thread():
            writer.join()
        with self._write_lock:
            self._sock.close()


class RemotingServer:
    """Accept connections on ``host:port`` and serve their requests with processors.

    ``port`` 0 picks a free port (see :attr:`port` once started). ``access``, when
    given, checks every request with a processor before it is queued. Register
    processors before :meth:`start`; :meth:`stop` closes the listening socket,
    every connection and every work queue. ``send_timeout`` (seconds without
    progress) and ``max_backlog`` (bytes of responses left unread) bound what a
    client that stops reading costs: past either, its connection is dropped.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        name: str = "remoting",
        send_timeout: float = DEFAULT_SEND_TIMEOUT,
        max_backlog: int = DEFAULT_MAX_BACKLOG,
        default_threads: int = 4,
        default_capacity: int = 10_000,
        access: Access | None = None,
    ):
        self.host = host
        self._access = access
        self.name = name
        self._requested_port = port
        self._send_timeout = send_timeout
        if max_backlog <= 0:
            raise ValueError(f"max_backlog must be positive, got {max_backlog}")
        self.max_backlog = max_backlog
        self._default = (default_threads, default_capacity)
        self._queues: dict[str, WorkQueue] = {}
        self._processors: dict[int, tuple[Processor, WorkQueue]] = {}
        self._inline: set[int] = set()  # codes served on the reader thread (register)
        self._channels: set[Channel] = set()
        self._readers: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._stopping = threading.Event()
        self.port = 0

    @property
    def address(self) -> str:
        """``host:port`` of the listening socket (after :meth:`start`)."""
        return f"{self.host}:{self.port}"

    @property
    def channels(self) -> list[Channel]:
        """The connections open now."""
        with self._lock:
            return list(self._channels)

    def work_queue(self, name: str, *, threads: int, capacity: int) -> WorkQueue:
        """Return the work queue ``name``, made with ``threads`` and ``capacity`` if new."""
        with self._lock:
            queue = self._queues.get(name)
            if queue is None:
                queue = self._queues[name] = WorkQueue(name, threads, capacity)
            return queue

    def register(
        self,
        codes: int | Iterable[int],
        processor: Processor,
        queue: WorkQueue | None = None,
        *,
        inline: bool = False,
    ) -> None:
        """Serve requests of ``codes`` with ``processor`` on ``queue`` (default: a shared one).

        ``inline``: run it on the connection's reader thread instead, without the hand-off
        to a queue's thread, for a processor that never waits (on a lock another client
        may hold, on a socket: :meth:`Channel.send` never waits), such as a pull.
        """
        if queue is None:
            threads, capacity = self._default
            queue = self.work_queue("default", threads=threads, capacity=capacity)
        for code in [codes] if isinstance(codes, int) else codes:
            self._processors[int(code)] = (processor, queue)
            if inline:
                self._inline.add(int(code))
            else:
                self._inline.discard(int(code))

    def register_all(self, table: Mapping[int, tuple[Processor, WorkQueue]]) -> None:
        """:meth:`register` each ``code: (processor, queue)`` of ``table``."""
        for code, (processor, queue) in table.items():
            self.register(code, processor, queue)

    # -- running ------------------------------------------------------------------------

    def start(self) -> RemotingServer:
        """Bind, listen and start accepting; returns self. Raises OSError if the port is taken."""
        listener = socket.create_server((self.host, self._requested_port), backlog=128)
        listener.settimeout(_ACCEPT_POLL)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._acceptor = threading.Thread(
            target=self._accept_loop, name=f"rocketspark-serve-{self.name}-accept", daemon=True
        )
        self._acceptor.start()
        log.info("%s listening on %s", self.name, self.address)
        return self

    def stop(self) -> None:
        """Stop accepting, close every connection, shut the work queues down (waiting for
        the tasks running). Stopping twice is harmless."""
        with self._lock:
            if self._stopping.is_set():
                return
            self._stopping.set()
        # In order: stop accepting, wait for the acceptor to leave accept(), then close the
        # listener. A descriptor closed under a thread polling it may be reused by a socket
        # opened meanwhile, which that thread would then accept from.
        listener = self._listener
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)  # wakes accept() at once (Linux)
            except OSError:
                pass  # elsewhere it returns within _ACCEPT_POLL
        if self._acceptor is not None:
            self._acceptor.join()
        if listener is not None:
            listener.close()
        for channel in self.channels:
            channel.close("server stopping")
        with self._lock:
            readers = list(self._readers)
        for reader in readers:
            reader.join(5.0)
        with self._lock:
            queues = list(self._queues.values())
        for queue in queues:
            queue.shutdown(wait=True)

    def __enter__(self) -> RemotingServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _forget(self, channel: Channel) -> None:
        with self._lock:
            self._channels.discard(channel)

    def _accept_loop(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self._stopping.is_set():
            try:
                sock, peer = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stopping.is_set():
                    return
                log.exception("%s: accept failed", self.name)
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(self._send_timeout)
            channel = Channel(self, sock, f"{peer[0]}:{peer[1]}")
            with self._lock:
                if self._stopping.is_set():
                    sock.close()
                    return
                self._channels.add(channel)
            reader = threading.Thread(
                target=self._read_loop,
                args=(channel, sock),
                name=f"rocketspark-serve-{self.name}-{channel.address}",
                daemon=True,
            )
            with self._lock:
                self._readers.add(reader)
            reader.start()

    # -- reading ------------------------------------------------------------------------

    def _read_loop(self, channel: Channel, sock: socket.socket) -> None:
        reason = "closed by the client"
        try:
            read_commands(
                sock.recv_into,
                lambda: not channel.closed,
                on_response=channel._complete,
                on_request=lambda request: self._dispatch(request, channel),
            )
        except RemotingFrameError as e:
            reason = f"malformed frame: {e}"
            log.warning("%s: dropping the connection from %s: %s", self.name, channel.address, e)
        except OSError as e:
            reason = f"read failed: {e}"
            if not channel.closed:
                log.info("%s: connection from %s: %s", self.name, channel.address, reason)
        except Exception as e:  # a bug must not leave the connection half alive
            reason = f"reader failed: {e!r}"
            log.exception("%s: dropping the connection from %s", self.name, channel.address)
        finally:
            channel.close(reason)
            channel._release()
            with self._lock:
                self._readers.discard(threading.current_thread())

    def _dispatch(self, request: RemotingCommand, channel: Channel) -> None:
        entry = self._processors.get(request.code)
        if entry is None:
            channel.respond(
                request,
                RemotingCommand.response_to(
                    request,
                    ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                    f" request type {request.code} not supported",
                ),
            )
            return
        processor, queue = entry
        if self._access is not None:  # here, on the reader: a refused request takes no slot
            refused = self._access(request, channel)
            if refused is not None:
                channel.respond(request, refused)
                return
        if request.code in self._inline:
            self._serve(processor, request, channel)
            return
        if not queue.try_submit(self._serve, processor, request, channel):
            log.warning(
                "%s: %s queue full, %s from %s answered SYSTEM_BUSY",
                self.name,
                queue.name,
                request.code_name,
                channel.address,
            )
            channel.respond(
                request,
                RemotingCommand.response_to(request, ResponseCode.SYSTEM_BUSY, BUSY_REMARK),
            )

    def _serve(self, processor: Processor, request: RemotingCommand, channel: Channel) -> None:
        # Served even when the connection has gone since: a client's last one-way
        # requests (the offsets a consumer commits as it shuts down) still count.
        response: RemotingCommand | Reply | None
        try:
            response = processor(request, channel)
        except Exception as e:
            log.exception("%s: the processor of %s failed", self.name, request.code_name)
            response = RemotingCommand.response_to(
                request, ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}"
            )
        if response is not None:
            channel.respond(request, response)


def _frame(cmd: RemotingCommand, parts: list[Body]) -> list[Body]:
    """The frame of ``cmd`` with ``parts`` as its body (``cmd.body`` when there are none)."""
    if not parts:
        return cmd.encode()
    head = cmd.encode() if cmd.body is None else replace(cmd, body=None).encode()
    (length,) = LENGTH.unpack_from(head[0])
    extra = sum(len(p) for p in parts)
    if _PREFIX_SIZE + length + extra > MAX_FRAME_SIZE:
        raise RemotingFrameError(
            f"response {cmd.code_name} would be {_PREFIX_SIZE + length + extra} bytes, more "
            f"than the {MAX_FRAME_SIZE} a frame may be"
        )
    first = bytearray(head[0])
    LENGTH.pack_into(first, 0, length + extra)
    return [first, *(p for p in parts if len(p))]


def _send_now(sock: socket.socket, buffers: list[Body]) -> list[memoryview]:
    """Send what the socket takes without waiting; return the views of what it did not."""
    # os.writev on the descriptor, not sock.sendmsg: a socket with a timeout polls for
    # room (up to the timeout) before it sends, whatever the flags; its descriptor is
    # non-blocking (the timeout is emulated), so writev takes what fits and returns.
    views = [memoryview(b).cast("B") for b in buffers]
    fd = sock.fileno()
    while views:
        try:
            sent = os.writev(fd, views[:IOV_MAX])
        except BlockingIOError:
            return views
        drop_sent(views, sent)
    return views


def _send_views(sock: socket.socket, views: list[memoryview]) -> None:
    """Send every view, waiting for the socket (its timeout bounds a wait without progress)."""
    while views:
        drop_sent(views, sock.sendmsg(views[:IOV_MAX]))

"""A scripted remoting server on 127.0.0.1 for the connection tests.

Each request the server reads is handed to ``script(request, server)`` on the
connection's thread; the script answers with ``server.reply(...)`` (at once, later,
or never) or does anything else a test needs: send raw bytes, send its own
requests, drop the connection. Frames are read and written with the package's
codec, which ``test_command.py`` and ``test_java_frames.py`` hold to RocketMQ's.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

from rocketspark.remoting.codes import ResponseCode
from rocketspark.remoting.command import RemotingCommand, decode_payload, frame_length

Script = Callable[[RemotingCommand, "FakeServer"], None]


def echo(request: RemotingCommand, server: FakeServer) -> None:
    """Answer SUCCESS with the request's ext fields and body."""
    if not request.is_oneway:
        server.reply(
            RemotingCommand.response_to(
                request,
                ResponseCode.SUCCESS,
                ext_fields=request.ext_fields,
                body=bytes(request.body) if request.body is not None else None,
            )
        )


class FakeServer:
    """Accepts connections one after another; the current one is ``self.conn``."""

    def __init__(self, script: Script = echo):
        self.script = script
        self.requests: list[RemotingCommand] = []  # every frame read, responses included
        self.received = threading.Condition()
        self.accepted = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.conn: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._write = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self.received:
                self.conn = conn
                self._conns.append(conn)
                self.accepted += 1
                self.received.notify_all()
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            while True:
                prefix = _recv(conn, 4)
                if prefix is None:
                    return
                payload = _recv(conn, frame_length(prefix))
                if payload is None:
                    return
                cmd = decode_payload(payload)
                with self.received:
                    self.requests.append(cmd)
                    self.received.notify_all()
                self.script(cmd, self)
        except OSError:
            return

    def wait_for(self, count: int, timeout: float = 5.0) -> list[RemotingCommand]:
        """Wait until ``count`` frames were read; return them."""
        with self.received:
            assert self.received.wait_for(lambda: len(self.requests) >= count, timeout), (
                f"{len(self.requests)} of {count} frames arrived"
            )
            return list(self.requests)

    def wait_accepted(self, count: int = 1, timeout: float = 5.0) -> None:
        """Wait until ``count`` connections were accepted (the last one is ``self.conn``)."""
        with self.received:
            assert self.received.wait_for(lambda: self.accepted >= count, timeout)

    def reply(self, cmd: RemotingCommand) -> None:
        """Send ``cmd`` (a response, or a request of the server's own) to the current client."""
        self.send_raw(cmd.to_bytes())

    def send_raw(self, data: bytes) -> None:
        assert self.conn is not None
        with self._write:
            self.conn.sendall(data)

    def drop(self) -> None:
        """Close the current client connection."""
        if self.conn is not None:
            try:
                self.conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.conn.close()

    def close(self) -> None:
        self._closed = True
        self.drop()
        for conn in self._conns:
            conn.close()
        self._listener.close()

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _recv(conn: socket.socket, size: int) -> bytearray | None:
    buf = bytearray(size)
    view = memoryview(buf)
    pos = 0
    while pos < size:
        n = conn.recv_into(view[pos:])
        if n == 0:
            return None
        pos += n
    return buf

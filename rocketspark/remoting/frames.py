"""Cut RocketMQ remoting frames out of a byte stream: the reader of both ends.

A stream is frames back to back (the grammar is in ``command.py``)::

    stream := frame*
    frame  := LENGTH:i32 PAYLOAD      LENGTH = len(PAYLOAD); 4 + LENGTH <= 16 MiB

:func:`read_commands` receives into chunks of 256 KiB (``recv_into``: as many
small frames as have arrived, a call), decodes each frame's payload as a view
of its chunk and hands the command to the reader's owner. A chunk is never
written again where a frame was cut from it, as commands keep views of it (a
request's body while a processor runs, a response's body while a caller reads
it). A frame that does not fit what is left of a chunk starts a chunk of its
own size, so a body is copied once at most (its first bytes), and a pull answer
of a few MiB never.
"""

from __future__ import annotations

from collections.abc import Callable

from rocketspark.remoting.command import LENGTH, RemotingCommand, decode_payload, frame_length

__all__ = ["CHUNK_SIZE", "read_commands"]

CHUNK_SIZE = 256 * 1024  # the receive buffer (a bigger frame gets one of its size)
MIN_ROOM = 16 * 1024  # less room left in a chunk than this: the next frame starts a new one
_PREFIX_SIZE = LENGTH.size


def read_commands(
    recv_into: Callable[[memoryview], int],
    still_open: Callable[[], bool],
    *,
    on_response: Callable[[RemotingCommand], object],
    on_request: Callable[[RemotingCommand], object],
) -> None:
    """Read the commands of the stream ``recv_into`` reads until it ends (then return),
    handing each, in order, to ``on_response`` or ``on_request`` on this thread.

    ``recv_into(into)`` receives at least one byte into ``into`` and returns how
    many, 0 at the end of the stream (``socket.recv_into``); a ``TimeoutError``
    from it is idleness, not an error, unless ``still_open()`` says the
    connection is gone (ConnectionAbortedError). Raises ConnectionResetError
    when the stream ends inside a frame, RemotingFrameError for a frame beyond
    the limit or malformed (before its payload is read, for a length beyond the
    limit), and whatever ``recv_into`` or a handler raises.
    """
    # Hot path (every response a client reads, every request a server reads): bound
    # locals, one recv_into per call for as many frames as have arrived, the handlers
    # called from the loop (a generator's resume per frame measured slower).
    decode, length_of, next_chunk = decode_payload, frame_length, _next_chunk
    prefix = _PREFIX_SIZE
    buf = bytearray(CHUNK_SIZE)
    view = memoryview(buf)
    start = end = 0  # buf[start:end]: received, not yet decoded
    while True:
        if end - start < prefix:
            if len(buf) - start < MIN_ROOM:
                buf, view, start, end = next_chunk(view, start, end, CHUNK_SIZE)
            while end - start < prefix:
                try:
                    n = recv_into(view[end:])
                except TimeoutError:
                    if not still_open():
                        raise ConnectionAbortedError("connection closed") from None
                    continue
                if n == 0:
                    if end == start:
                        return
                    raise ConnectionResetError(
                        f"end of stream inside a frame ({end - start} bytes)"
                    )
                end += n
        size = prefix + length_of(view[start : start + prefix])
        stop = start + size
        if stop > len(buf):
            buf, view, start, end = next_chunk(view, start, end, max(CHUNK_SIZE, size))
            stop = size
        while end < stop:
            try:
                n = recv_into(view[end:])
            except TimeoutError:
                if not still_open():
                    raise ConnectionAbortedError("connection closed") from None
                continue
            if n == 0:
                raise ConnectionResetError(
                    f"end of stream inside a frame ({end - start}/{stop - start} bytes)"
                )
            end += n
        cmd = decode(view[start + prefix : stop])
        start = stop
        if cmd.is_response:
            on_response(cmd)
        else:
            on_request(cmd)


def _next_chunk(
    view: memoryview, start: int, end: int, size: int
) -> tuple[bytearray, memoryview, int, int]:
    """A new chunk of ``size`` bytes holding ``view[start:end]`` (a frame's first bytes)."""
    buf = bytearray(size)
    buf[: end - start] = view[start:end]
    return buf, memoryview(buf), 0, end - start

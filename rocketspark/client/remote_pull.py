"""The consumer side of the cluster backend: a queue's offset range pulled, pipelined.

A PULL_MESSAGE answer holds at most ``maxTransferCountOnMessageInMemory`` (32 by
default) records; offsets in a queue are contiguous, so the next request need not
wait for the last answer: :class:`RangeReader` keeps up to ``pullPipeline`` requests
in flight (topped up several at a time, in one send) and hands out the answers'
records, in offset order, as buffers for ``message.arrow``; :func:`read_ahead` lets
it pull on while the caller turns the last buffer into Arrow.
"""

from __future__ import annotations

import queue
import struct
import threading
from collections import deque
from collections.abc import Generator, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

import numpy as np

from rocketspark.errors import OffsetOutOfRangeError
from rocketspark.message import arrow
from rocketspark.message.byte_gather import gather_items
from rocketspark.message.model import MessageQueue
from rocketspark.message.names import SubscriptionExpression
from rocketspark.message.results import PullStatus
from rocketspark.remoting.client import PullAnswer
from rocketspark.remoting.command import RemotingCommand

__all__ = ["ARROW_BLOCK_BYTES", "RangeReader", "read_ahead"]

ARROW_BLOCK_BYTES = 8 * 1024 * 1024  # pulled record bytes turned into one Arrow batch at most


class RangeReader:
    """Pulls ``[start, end)`` of one queue, several requests in flight, in offset order.

    Each request asks for ``pull_batch`` messages from the offset after the
    previous request's; answers are taken in request order. An answer that
    ends early (the broker's byte limit, a filter) leaves a gap that a request
    from the answer's ``nextBeginOffset`` fills before later answers are used;
    records of an answer that lie before the position reached are dropped.
    """

    def __init__(
        self,
        client: Any,
        mq: MessageQueue,
        start: int,
        end: int,
        sub: SubscriptionExpression,
    ):
        self.client = client
        self.rc = client.remoting
        self.mq = mq
        self.position = start
        self.end = end
        self.expression = sub.text if not sub.matches_all else "*"

    def _request(self, offset: int, address: str) -> Future[RemotingCommand]:
        n = min(self.client.pull_batch, self.end - offset)
        return self.rc.pull_async(
            self.mq, offset, n, group=self.client.group, expression=self.expression, address=address
        )

    def blocks(self) -> Generator[bytes | memoryview, None, None]:
        """Yield buffers of back-to-back records, in queue order, up to ~ARROW_BLOCK_BYTES."""
        if self.position >= self.end:
            return
        address = self.rc.read_address(self.mq)
        pipeline, batch, group = self.client.pipeline, self.client.pull_batch, self.client.group
        inflight: deque[tuple[int, Future[RemotingCommand]]] = deque()
        ask = self.position
        parts: list[memoryview] = []
        size = 0
        try:
            while self.position < self.end:
                if len(inflight) <= pipeline // 2 and ask < self.end:
                    # topped up in bursts: the pulls go out in one send, and their
                    # answers tend to come back in one read
                    asks: list[tuple[int, int]] = []
                    while len(inflight) + len(asks) < pipeline and ask < self.end:
                        asks.append((ask, min(batch, self.end - ask)))
                        ask += batch
                    futures = self.rc.pull_many(
                        self.mq, asks, group=group, expression=self.expression, address=address
                    )
                    inflight.extend(zip([o for o, _ in asks], futures, strict=True))
                if not inflight:
                    ask = self.position
                    continue
                offset, future = inflight.popleft()
                if offset > self.position:  # a gap: pull it before this answer is used
                    inflight.appendleft((offset, future))
                    inflight.appendleft((self.position, self._request(self.position, address)))
                    continue
                answer = self.rc.pull_answer(self.mq, future.result(), address)
                before = self.position
                got = self._take(answer, offset)
                if got is None or (offset == before and self.position == before):
                    break  # nothing more at the position now
                if len(got):
                    parts.append(got)
                    size += len(got)
                    if size >= ARROW_BLOCK_BYTES:
                        yield _join(parts)
                        parts, size = [], 0
            if parts:
                yield _join(parts)
        finally:
            for _, f in inflight:
                f.cancel()

    def _take(self, answer: PullAnswer, offset: int) -> memoryview | None:
        """The records of ``answer`` in [position, end); advance the position. None: the
        queue has nothing at the position (its end, for now)."""
        mq = self.mq
        if answer.status is PullStatus.OFFSET_ILLEGAL:
            raise OffsetOutOfRangeError(
                f"offset {self.position} of {mq} is outside [{answer.min_offset}, "
                f"{answer.max_offset}] on the broker"
            )
        if answer.status is PullStatus.NO_NEW_MSG:
            if offset == self.position:
                return None
            return memoryview(b"")
        if answer.status is PullStatus.NO_MATCHED_MSG or answer.body is None:
            self.position = max(self.position, min(answer.next_begin_offset, self.end))
            return memoryview(b"")
        body = memoryview(answer.body)
        nxt = min(answer.next_begin_offset, self.end)
        if answer.next_begin_offset <= self.end and len(body) >= _QOFF.itemsize:
            # The common answer: its records run from the position (or later, a filter
            # stepping over some) to nextBeginOffset, within the range: all of it is
            # taken as it is; its records are found and checked once per Arrow block.
            (first,) = _FIRST_QOFF.unpack_from(body, _QOFF_AT)
            if self.position <= first < nxt:
                self.position = nxt
                return body
        starts, _ = arrow.record_positions(body, what=f"pull answer of {mq}")
        hdr = gather_items(np.frombuffer(body, dtype=np.uint8), starts, _QOFF)
        qoff = hdr["queue_offset"]
        keep = np.flatnonzero((qoff >= self.position) & (qoff < self.end))
        if len(keep) == 0:
            self.position = max(self.position, nxt)
            return memoryview(b"")
        a, b = int(keep[0]), int(keep[-1])
        stop = int(starts[b + 1]) if b + 1 < len(starts) else len(body)
        self.position = max(self.position, nxt, int(qoff[b]) + 1)
        return body[int(starts[a]) : stop]


_QOFF_AT = 20  # a record's QUEUEOFFSET field
_QOFF = np.dtype(
    {"names": ["queue_offset"], "formats": [">i8"], "offsets": [_QOFF_AT], "itemsize": 28}
)
_FIRST_QOFF = struct.Struct(">q")


def _join(parts: list[memoryview]) -> bytes | memoryview:
    if len(parts) > 1:
        return b"".join(parts)
    part = parts[0]
    # A small answer is a view of the connection's receive chunk: copied, so that its
    # batch does not keep the whole chunk alive.
    whole = part.obj
    if isinstance(whole, bytes | bytearray) and len(part) * 2 < len(whole):
        return bytes(part)
    return part


T = TypeVar("T")


def read_ahead(items: Iterator[T], depth: int = 1) -> Generator[T, None, None]:
    """Yield the items of ``items``, which a thread of their own makes up to ``depth`` ahead.

    A range reader's pulls go on while the caller turns its last block into Arrow
    (otherwise the pipeline stands still meanwhile). An error of ``items`` is raised
    here; closing this generator stops the thread (and closes ``items``).
    """
    box: queue.Queue[tuple[bool, Any]] = queue.Queue(depth)
    stop = threading.Event()

    def put(entry: tuple[bool, Any]) -> bool:
        while not stop.is_set():
            try:
                box.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in items:
                if not put((True, item)):
                    return
            put((False, None))
        except BaseException as e:
            put((False, e))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=run, name="rocketspark-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            more, item = box.get()
            if not more:
                if item is not None:
                    raise item
                return
            yield item
    finally:
        stop.set()
        thread.join()

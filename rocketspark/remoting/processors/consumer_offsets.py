"""Consumer offsets (RocketMQ's ``ConsumerManageProcessor``): QUERY_CONSUMER_OFFSET and
UPDATE_CONSUMER_OFFSET over the store's committed offsets.

Commits (these, and those riding on pulls) are deferred: kept in memory by the store's
offset table and written to consumerOffset.json every :data:`FLUSH_SECONDS` and when the
broker stops, as RocketMQ's broker persists its ConsumerOffsetManager every
flushConsumerOffsetInterval (5 s). A Java consumer commits every 5 s and with nearly every
pull, and each write of the file is a crash-safe replace with two fsyncs: writing it per
commit made offsets the cost of a pull. What that trades, as on a RocketMQ broker: a
server killed (SIGKILL, power loss) loses the commits of the last interval at most, and
its consumers consume those messages again; SIGTERM loses none. Other processes on the
store directory (embedded readers, the CLI) read the file, so they see the server's
commits up to one interval late; their own commits are written at once, and a flush
merges into the file's latest content under its inter-process lock, so it keeps theirs.
"""

from __future__ import annotations

import logging
import threading

from rocketspark.errors import (
    OffsetOutOfRangeError,
    RocketSparkError,
    StoreClosedError,
    UnknownTopicError,
)
from rocketspark.remoting import headers as h
from rocketspark.remoting.codes import ResponseCode
from rocketspark.remoting.command import RemotingCommand
from rocketspark.remoting.processors.common import answer, ok, queue_offset
from rocketspark.remoting.server import Channel
from rocketspark.store.message_store import MessageStore

log = logging.getLogger(__name__)

FLUSH_SECONDS = 5.0  # RocketMQ's flushConsumerOffsetInterval


class ConsumerOffsetProcessor:
    """A group's committed offset of a queue, read and written; the thread that writes
    the deferred commits every ``flush_seconds``."""

    def __init__(self, store: MessageStore, *, flush_seconds: float = FLUSH_SECONDS):
        self.store = store
        self.flush_seconds = flush_seconds
        self._stopping = threading.Event()
        self._flusher: threading.Thread | None = None

    def start(self) -> None:
        self._flusher = threading.Thread(
            target=self._flush_periodically, name="rocketspark-serve-offsets", daemon=True
        )
        self._flusher.start()

    def stop(self) -> None:
        """Stop the thread and write what it has not written yet."""
        self._stopping.set()
        if self._flusher is not None:
            self._flusher.join()
        self.flush()

    def flush(self) -> None:
        try:
            self.store.flush_offsets()
        except StoreClosedError:
            pass  # closing wrote them
        except Exception:
            log.exception("consumer offsets were not written; trying again")

    def _flush_periodically(self) -> None:
        while not self._stopping.wait(self.flush_seconds):
            self.flush()

    def query_consumer_offset(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        header = h.QueryConsumerOffsetRequestHeader.from_ext_fields(request.ext_fields)
        try:
            offset = self.store.committed_offset(
                header.consumer_group, header.topic, header.queue_id
            )
        except (UnknownTopicError, OffsetOutOfRangeError):
            offset = None
        if offset is not None and offset >= 0:
            return ok(request, h.QueryConsumerOffsetResponseHeader(offset=offset))
        if header.set_zero_if_not_found is False:
            return answer(
                request,
                ResponseCode.QUERY_NOT_FOUND,
                "Not found, do not set to zero, maybe this group boot first",
            )
        # A group that never committed starts at 0 while the queue still holds its first
        # message (RocketMQ: min offset 0 and that message in memory).
        lo = queue_offset(self.store.min_offset, header.topic, header.queue_id)
        hi = queue_offset(self.store.max_offset, header.topic, header.queue_id)
        if lo <= 0 < hi:
            return ok(request, h.QueryConsumerOffsetResponseHeader(offset=0))
        return answer(
            request,
            ResponseCode.QUERY_NOT_FOUND,
            "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first",
        )

    def update_consumer_offset(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        header = h.UpdateConsumerOffsetRequestHeader.from_ext_fields(request.ext_fields)
        try:
            self.store.commit_offset(
                header.consumer_group,
                header.topic,
                header.queue_id,
                header.commit_offset,
                deferred=True,
            )
        except UnknownTopicError as e:
            return answer(request, ResponseCode.TOPIC_NOT_EXIST, str(e))
        except (OffsetOutOfRangeError, RocketSparkError) as e:
            return answer(request, ResponseCode.SYSTEM_ERROR, str(e))
        return ok(request)

"""Deleting expired files: RocketMQ's CleanCommitLogService and CleanConsumeQueueService.

Embedded stores have no daemon: MessageStore.delete_expired (or ``rocketspark
store clean``) runs :meth:`CleanService.delete_expired` from a job.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rocketspark.store.appender import Appender
    from rocketspark.store.commit_log import CommitLog
    from rocketspark.store.consume_queue import ConsumeQueues
    from rocketspark.store.index_service import IndexService
    from rocketspark.store.store_state import StoreState

log = logging.getLogger(__name__)


class CleanService:
    """Deletes a store's expired files when asked (fileReservedTime: ``reserved_hours``)."""

    def __init__(
        self,
        *,
        appender: Appender,
        state: StoreState,
        commit_log: CommitLog,
        queues: ConsumeQueues,
        index: IndexService,
        root: str,
        reserved_hours: float,
    ):
        self.appender = appender
        self.state = state
        self.commit_log = commit_log
        self.queues = queues
        self.index = index
        self.root = root
        self.reserved_hours = reserved_hours

    def delete_expired(
        self, now_ms: int | None = None, reserved_hours: float | None = None
    ) -> dict[str, int]:
        """Delete CommitLog segments older than ``reserved_hours`` (default: the store's
        fileReservedTime), and what pointed into them.

        As RocketMQ's clean services do: only whole segments from the front, by
        their file's last modification time, never the segment being written or
        one holding bytes not yet flushed and dispatched; then ConsumeQueue files
        and index files that only point below the new CommitLog start. Queues'
        min offsets move up; a reader asking for older offsets meets data loss
        (OffsetOutOfRangeError, or the data source's failOnDataLoss).
        Returns how many files of each kind were deleted.
        """
        if reserved_hours is None:
            reserved_hours = self.reserved_hours
        # File ages are wall-clock times (mtime), whatever clock stamps messages.
        now = time.time() * 1000 if now_ms is None else now_ms
        cutoff = now - reserved_hours * 3_600_000
        done = {"commitlog": 0, "consumequeue": 0, "index": 0}
        appender, state = self.appender, self.state
        with appender.write_lock:
            appender.sync()
            safe_end = min(state.commit_pos, state.dispatched_pos, state.flushed_pos)
            files = self.commit_log.files
            files.refresh()
            while len(files.files) > 1:
                f = files.files[0]
                if f.end_offset > safe_end or os.stat(f.path).st_mtime * 1000 > cutoff:
                    break
                files.delete_first()
                done["commitlog"] += 1
            # Queues and index are trimmed even when no segment went this time: a
            # clean cut short after deleting segments left them pointing below.
            new_min = files.min_offset
            done["consumequeue"] = self.queues.delete_below(new_min)
            done["index"] = self.index.delete_below(new_min)
        log.info("store %s: deleted %s; CommitLog now starts at %d", self.root, done, new_min)
        return done

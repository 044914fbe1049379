"""Delay levels: SCHEDULE_TOPIC_XXXX and the step that delivers what is due.

A message put with delay level L is stored in ``SCHEDULE_TOPIC_XXXX`` queue
L - 1, keeping its destination in REAL_TOPIC / REAL_QID; its ConsumeQueue tags
code holds the delivery time. :meth:`ScheduleService.run` delivers every
message that is due to its real topic and records progress per level in
``config/delayOffset.json``, as RocketMQ's ScheduleMessageService does.

There may be no long-lived daemon in embedded use, so any open store can run
the step, and it must be idempotent and crash-safe: it runs under the store's
write lock, and before it delivers a range of a level it records the range and
the CommitLog position in the shared state (the *intent*). If the process dies
between the put and the progress write, the next step finds the intent, looks
at the record at that position and knows whether the range was delivered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from rocketspark.message.model import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    SCHEDULE_TOPIC,
    MessageExt,
)
from rocketspark.message.record import RECORD_END, RECORD_INVALID

if TYPE_CHECKING:
    from rocketspark.store.appender import Append, Appender
    from rocketspark.store.commit_log import CommitLog, PreparedRecord
    from rocketspark.store.consume_queue import ConsumeQueues
    from rocketspark.store.encoder import Encoder
    from rocketspark.store.metadata import DelayOffsetTable
    from rocketspark.store.topic_config import TopicConfigTable

log = logging.getLogger(__name__)

MAX_DELIVER_PER_LEVEL = 10_000


class ScheduleService:
    """Delivers due messages of SCHEDULE_TOPIC_XXXX for one open store.

    ``levels`` is how many delay levels the store has (messageDelayLevel).
    """

    def __init__(
        self,
        *,
        appender: Appender,
        encoder: Encoder,
        queues: ConsumeQueues,
        commit_log: CommitLog,
        topics: TopicConfigTable,
        delay_offsets: DelayOffsetTable,
        clock: Callable[[], int],
        levels: int,
    ):
        self.appender = appender
        self.encoder = encoder
        self.queues = queues
        self.commit_log = commit_log
        self.topics = topics
        self.delay_offsets = delay_offsets
        self.clock = clock
        self.levels = levels

    def _has_topic(self, topic: str) -> bool:
        return self.topics.get(topic) is not None

    def run(
        self, now_ms: int | None = None, *, limit_per_level: int = MAX_DELIVER_PER_LEVEL
    ) -> int:
        """Deliver what is due at ``now_ms`` (the store clock by default); return the count."""
        now = self.clock() if now_ms is None else now_ms
        if not self._has_topic(SCHEDULE_TOPIC):
            return 0
        delivered = 0
        results = []
        with self.appender.locked() as append:
            self._resolve_intent(append)
            for level in range(1, self.levels + 1):
                results += self._deliver_level(append, level, now, limit_per_level)
            delivered = len(results)
        self.appender.after(results)
        return delivered

    def start_offset(self, level: int) -> int:
        """The first entry of a level's queue not yet delivered."""
        cq = self.queues.queue(SCHEDULE_TOPIC, level - 1)
        done = self.delay_offsets.get(level)
        low = cq.min_offset(self.commit_log.min_offset)
        return low if done is None or done < low else done

    def pending(self) -> Iterator[MessageExt]:
        """Yield the delayed messages not yet delivered, level by level."""
        if not self._has_topic(SCHEDULE_TOPIC):
            return
        for level in range(1, self.levels + 1):
            if not self.queues.holds_messages(
                SCHEDULE_TOPIC, level - 1, self.commit_log.min_offset
            ):
                continue
            cq = self.queues.queue(SCHEDULE_TOPIC, level - 1)
            start, end = self.start_offset(level), cq.max_offset()
            while start < end:
                entries = cq.read(start, min(end - start, 4096))
                if not len(entries):
                    break
                for phy in entries["offset"].tolist():
                    yield self.commit_log.read(int(phy))
                start += len(entries)

    def _deliver_level(self, append: Append, level: int, now: int, limit: int) -> list:
        cq = self.queues.queue(SCHEDULE_TOPIC, level - 1)
        start = self.start_offset(level)
        entries = cq.read(start, limit)
        if not len(entries):
            return []
        # Entries of one level are in delivery order (same delay, rising store time):
        # deliver the due prefix.
        due = 0
        for deliver_at in entries["tags"].tolist():
            if deliver_at > now:
                break
            due += 1
        if not due:
            return []
        prepared: list[PreparedRecord] = []
        for phy in entries["offset"][:due].tolist():
            rec = self._rebuild(self.commit_log.read(int(phy)), now)
            if rec is not None:
                prepared.append(rec)
        state = append.state
        state.set_intent(level, start, start + due, state.commit_pos)
        results = append.records(prepared, now) if prepared else []
        self.delay_offsets.set(level, start + due)
        state.clear_intent()
        return results

    def _rebuild(self, msg: MessageExt, now: int) -> PreparedRecord | None:
        props = dict(msg.properties)
        topic = props.get(PROPERTY_REAL_TOPIC)
        try:
            queue_id = int(props.get(PROPERTY_REAL_QUEUE_ID, "0"))
        except ValueError:
            queue_id = 0
        if not topic:
            log.error(
                "scheduled message at offset %d has no REAL_TOPIC; dropped", msg.commitlog_offset
            )
            return None
        if not self._has_topic(topic):
            log.error(
                "scheduled message at offset %d is due for topic %r, which no longer "
                "exists; dropped",
                msg.commitlog_offset,
                topic,
            )
            return None
        props.pop(PROPERTY_DELAY_TIME_LEVEL, None)
        return self.encoder.record(
            topic,
            queue_id,
            msg.body,
            props,
            now,
            sys_flag=msg.sys_flag,
            flag=msg.flag,
            born_timestamp=msg.born_timestamp,
            born_host=msg.born_host,
            reconsume_times=msg.reconsume_times,
        )

    def _resolve_intent(self, append: Append) -> None:
        """Finish the bookkeeping of a step that died between its put and its progress write."""
        state = append.state
        level, start, end, commit_before = state.intent()
        if level == 0:
            return
        delivered = False
        if state.commit_pos > commit_before:
            for pos, check in self.commit_log.scan(commit_before, verify_crc=False):
                if check.size not in (RECORD_END, RECORD_INVALID):
                    # The step's put is one append: it landed if the record where it
                    # would start is the delivery of the first message the step kept.
                    first = self._first_kept(level, start, end)
                    delivered = first is not None and _delivers(self.commit_log.read(pos), first)
                break
        if delivered:
            self.delay_offsets.set(level, end)
        log.warning(
            "schedule step of level %d [%d, %d) was interrupted; %s",
            level,
            start,
            end,
            "it had delivered, progress recorded"
            if delivered
            else "nothing was delivered, it will run again",
        )
        state.clear_intent()

    def _first_kept(self, level: int, start: int, end: int) -> MessageExt | None:
        """The first message of a level's entries [start, end) a step would deliver.

        A step drops messages without REAL_TOPIC or whose topic is gone (as
        :meth:`_rebuild` does); topics created or deleted since the step make
        this guess wrong, and the step then runs again (duplicates, never loss).
        """
        entries = self.queues.queue(SCHEDULE_TOPIC, level - 1).read(start, end - start)
        for phy in entries["offset"].tolist():
            msg = self.commit_log.read(int(phy))
            topic = msg.properties.get(PROPERTY_REAL_TOPIC)
            if topic and self._has_topic(topic):
                return msg
        return None


def _delivers(record: MessageExt, scheduled: MessageExt) -> bool:
    """Is ``record`` the delivery of ``scheduled`` (same id, topic, body, birth)?

    More than the UNIQ_KEY, which a producer may set: another writer's record
    right where the step's put would start must not pass for it.
    """
    return (
        record.uniq_key is not None
        and record.uniq_key == scheduled.uniq_key
        and record.topic == scheduled.properties.get(PROPERTY_REAL_TOPIC)
        and record.born_timestamp == scheduled.born_timestamp
        and record.body == scheduled.body
    )

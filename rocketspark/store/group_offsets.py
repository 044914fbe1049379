"""Consumer groups' offsets checked and compared with the queues: RocketMQ's
ConsumerOffsetManager's checks and its lag (the table itself is in metadata.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from rocketspark.errors import OffsetOutOfRangeError
from rocketspark.message.model import TopicInfo
from rocketspark.message.names import validate_group
from rocketspark.store.consume_queue import check_queue

if TYPE_CHECKING:
    from rocketspark.store.commit_log import CommitLog
    from rocketspark.store.consume_queue import ConsumeQueues
    from rocketspark.store.metadata import ConsumerOffsetTable
    from rocketspark.store.topic_config import TopicConfigTable


class GroupOffsets:
    """The consumer groups' committed offsets of one store, checked against its queues."""

    def __init__(
        self,
        root: str,
        offsets: ConsumerOffsetTable,
        topics: TopicConfigTable,
        queues: ConsumeQueues,
        commit_log: CommitLog,
    ):
        self.root = root
        self.offsets = offsets
        self.topics = topics
        self.queues = queues
        self.commit_log = commit_log

    def commit(
        self, group: str, topic: str, queue_id: int, offset: int, *, deferred: bool = False
    ) -> None:
        """Record that ``group`` will next consume ``offset`` of an existing queue
        (``deferred``: see ConsumerOffsetTable)."""
        validate_group(group)
        if offset < 0:
            raise OffsetOutOfRangeError(f"offset to commit must be >= 0, got {offset}")
        self.queues.existing(topic, queue_id)
        self.offsets.commit_many(group, {(topic, queue_id): offset}, deferred=deferred)

    def commit_many(self, group: str, offsets: Mapping[tuple[str, int], int]) -> None:
        """Record several ``(topic, queue_id) -> next offset`` of ``group`` in one write,
        once every one names a queue of an existing topic and a non-negative offset."""
        if not offsets:
            return
        validate_group(group)
        infos: dict[str, TopicInfo] = {}
        for (topic, queue_id), offset in offsets.items():
            if offset < 0:
                raise OffsetOutOfRangeError(
                    f"offset to commit for {topic}/{queue_id} must be >= 0, got {offset}"
                )
            info = infos.get(topic) or infos.setdefault(
                topic, self.topics.require(topic, self.root)
            )
            check_queue(info.name, queue_id, info.read_queue_nums, info.write_queue_nums)
        self.offsets.commit_many(group, offsets)

    def lag(self, group: str, topic: str | None) -> dict[tuple[str, int], int]:
        """Per (topic, queue), how many messages ``group`` has yet to consume.

        Queues the group never committed count from their min offset. Without
        ``topic``, topics the group committed that no longer exist are left out
        (a consumerOffset.json can outlive a topic, as a broker's does).
        """
        offsets, queues = self.offsets, self.queues
        names = (
            [topic]
            if topic is not None
            else sorted(
                {t for t, _q in offsets.offsets_of_group(group) if self.topics.get(t) is not None}
            )
        )
        out: dict[tuple[str, int], int] = {}
        for t in names:
            info = self.topics.require(t, self.root)
            for q in range(info.read_queue_nums):
                hi = queues.existing(t, q).max_offset()
                done = offsets.query(group, t, q)
                if done is None:
                    done = queues.existing(t, q).min_offset(self.commit_log.min_offset)
                out[(t, q)] = max(0, hi - done)
        return out

"""Consumer groups' offsets checked and compared with the queues: RocketMQ's
ConsumerOffsetManager's checks and its lag (the table itself is in metadata.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from rocketspark.errors import OffsetOutOfRangeError
from rocketspark.message.model import TopicInfo
from rocketspark.store.consume_queue import check_queue

if TYPE_CHECKING:
    from rocketspark.store.commit_log import CommitLog
    from rocketspark.store.consume_queue import ConsumeQueues
    from rocketspark.store.metadata import ConsumerOffsetTable
    from rocketspark.store.topic_config import TopicConfigTable


def check_commits(
    offsets: Mapping[tuple[str, int], int], topic_info: Callable[[str], TopicInfo]
) -> None:
    """Raise unless every ``(topic, queue_id) -> offset`` names a queue of an existing
    topic (``topic_info`` raises for an absent one) and a non-negative offset."""
    infos: dict[str, TopicInfo] = {}
    for (topic, queue_id), offset in offsets.items():
        if offset < 0:
            raise OffsetOutOfRangeError(
                f"offset to commit for {topic}/{queue_id} must be >= 0, got {offset}"
            )
        info = infos.get(topic) or infos.setdefault(topic, topic_info(topic))
        check_queue(info.name, queue_id, info.read_queue_nums, info.write_queue_nums)


def lag(
    group: str,
    topic: str | None,
    *,
    offsets: ConsumerOffsetTable,
    topics: TopicConfigTable,
    queues: ConsumeQueues,
    commit_log: CommitLog,
    topic_info: Callable[[str], TopicInfo],
) -> dict[tuple[str, int], int]:
    """Per (topic, queue), how many messages ``group`` has yet to consume.

    Queues the group never committed count from their min offset. Without
    ``topic``, topics the group committed that no longer exist are left out
    (a consumerOffset.json can outlive a topic, as a broker's does).
    """
    names = (
        [topic]
        if topic is not None
        else sorted({t for t, _q in offsets.offsets_of_group(group) if topics.get(t) is not None})
    )
    out: dict[tuple[str, int], int] = {}
    for t in names:
        info = topic_info(t)
        for q in range(info.read_queue_nums):
            hi = queues.existing(t, q).max_offset()
            done = offsets.query(group, t, q)
            if done is None:
                done = queues.existing(t, q).min_offset(commit_log.min_offset)
            out[(t, q)] = max(0, hi - done)
    return out

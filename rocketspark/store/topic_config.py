"""topics.json under ``<storePathRootDir>/config/``: RocketMQ's TopicConfigManager.

    topics.json             {"dataVersion": DV, "topicConfigTable": {topic: TopicConfig}}
    TopicConfig             {"order": false, "perm": 6, "readQueueNums": 4,
                             "topicFilterType": "SINGLE_TAG", "topicName": topic,
                             "topicSysFlag": 0, "writeQueueNums": 4, ...}

Each topic's queue counts, permission and flags, the :class:`TopicInfo` read from
them, and the check that refuses to shrink a topic whose dropped queues still
hold (or await) messages. Persistence, locking and ``dataVersion`` are the shared
:class:`~rocketspark.store.metadata.JsonTable`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from rocketspark.errors import TopicShrinkError, UnknownTopicError
from rocketspark.message.model import (
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    MessageExt,
    TopicInfo,
)
from rocketspark.message.names import validate_topic
from rocketspark.store.metadata import JsonTable, as_dict, new_data_version

__all__ = [
    "PERM_INHERIT",
    "PERM_READ",
    "PERM_WRITE",
    "TOPICS_FILE",
    "TopicConfigTable",
    "unknown_topic",
]

TOPICS_FILE = "topics.json"

PERM_READ = 0x4
PERM_WRITE = 0x2
PERM_INHERIT = 0x1


def unknown_topic(topic: str, root: str, hint: str = "") -> UnknownTopicError:
    """The error for a topic that topics.json of the store at ``root`` does not list
    (``hint``: what to do about it, appended)."""
    message = f"topic {topic!r} does not exist in store {root}"
    return UnknownTopicError(f"{message}; {hint}" if hint else message)


class TopicConfigTable(JsonTable):
    """topics.json: each topic's queue counts, permission and flags."""

    file_name = TOPICS_FILE
    versioned = True

    def _empty(self) -> dict[str, Any]:
        return {"dataVersion": new_data_version(), "topicConfigTable": {}}

    def _decode(self, obj: Any) -> dict[str, Any]:
        data = as_dict(obj, TOPICS_FILE)
        table = data["topicConfigTable"] = as_dict(data.get("topicConfigTable"), "topicConfigTable")
        for name, cfg in table.items():
            as_dict(cfg, f"topic {name}")
        return data

    def get(self, topic: str) -> dict[str, Any] | None:
        """Return a copy of the topic's TopicConfig, or None if there is no such topic."""
        cfg = self._current()["topicConfigTable"].get(topic)
        return dict(cfg) if cfg is not None else None

    def names(self) -> list[str]:
        """Return the names of all topics, in file order."""
        return list(self._current()["topicConfigTable"])

    def info(self, topic: str) -> TopicInfo | None:
        """Return the topic's queue counts, permission and order flag, or None if there
        is no such topic."""
        cfg = self.get(topic)
        if cfg is None:
            return None
        return TopicInfo(
            cfg["topicName"],
            int(cfg["readQueueNums"]),
            int(cfg["writeQueueNums"]),
            int(cfg.get("perm", 6)),
            bool(cfg.get("order", False)),
        )

    def require(self, topic: str, root: str) -> TopicInfo:
        """Return the topic's TopicInfo; raise UnknownTopicError (naming the store at
        ``root``) if there is no such topic."""
        info = self.info(topic)
        if info is None:
            raise unknown_topic(topic, root)
        return info

    def create(
        self,
        topic: str,
        read_queues: int,
        write_queues: int,
        *,
        perm: int = 6,
        order: bool = False,
        on_disk: bool = False,
        if_absent: bool = False,
    ) -> None:
        """Create the topic, or change its queue counts, permission and order flag.

        ``perm`` is PERM_READ | PERM_WRITE | PERM_INHERIT bits. Other fields of
        an existing topic (topicSysFlag, attributes, ...) are kept. Nothing is
        written when nothing changes. ``if_absent``: an existing topic is left as
        it is, decided under the table's locks (a topic another thread or process
        makes meanwhile is not changed). Raises InvalidNameError for a topic name
        RocketMQ would refuse (``on_disk``: see ``validate_topic``).
        """
        validate_topic(topic, on_disk=on_disk)
        wanted = {
            "order": order,
            "perm": perm,
            "readQueueNums": read_queues,
            "topicName": topic,
            "writeQueueNums": write_queues,
        }
        existing = self.get(topic)
        if existing is not None and (
            if_absent or all(existing.get(k) == v for k, v in wanted.items())
        ):
            return

        def change(data: dict[str, Any]) -> bool:
            table = data["topicConfigTable"]
            old = table.get(topic)
            if old is not None and (if_absent or all(old.get(k) == v for k, v in wanted.items())):
                return False
            # New entries take fastjson's (alphabetical) field order.
            cfg = (
                old
                if old is not None
                else {
                    "attributes": {},
                    "order": False,
                    "perm": PERM_READ | PERM_WRITE,
                    "readQueueNums": 0,
                    "topicFilterType": "SINGLE_TAG",
                    "topicName": topic,
                    "topicSysFlag": 0,
                    "writeQueueNums": 0,
                }
            )
            cfg.update(wanted)
            table[topic] = cfg
            return True

        self._modify(change)

    def check_shrink(
        self,
        topic: str,
        queues: int,
        *,
        holds_messages: Callable[[int], bool],
        pending: Callable[[], Iterable[MessageExt]],
    ) -> None:
        """Refuse (TopicShrinkError) to give ``topic`` ``queues`` queues if that would hide
        messages: those of the queues dropped (they stay on disk, unread), and delayed or
        half messages bound for them (delivered, they would be in a queue no consumer reads).

        ``holds_messages(queue_id)``: does the queue hold messages; ``pending()``: the
        messages still to be delivered, their destination in REAL_TOPIC / REAL_QID.
        """
        existing = self.get(topic)
        if existing is None:
            return
        current = max(int(existing.get("readQueueNums", 0)), int(existing.get("writeQueueNums", 0)))
        holding = [q for q in range(queues, current) if holds_messages(q)]
        if queues < current:
            awaited = set()
            for message in pending():
                props = message.properties
                if props.get(PROPERTY_REAL_TOPIC) == topic:
                    q = props.get(PROPERTY_REAL_QUEUE_ID, "0")
                    if q.isdigit() and int(q) >= queues:
                        awaited.add(int(q))
            holding = sorted(set(holding) | awaited)
        if holding:
            raise TopicShrinkError(
                f"topic {topic!r} has {current} queues; {queues} would hide the messages of "
                f"queue(s) {', '.join(map(str, holding))}, which hold messages (or "
                "delayed or half messages are bound for). Pass "
                "force=True (rocketspark topic create --force) to shrink it anyway"
            )

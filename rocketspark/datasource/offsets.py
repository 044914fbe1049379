"""Streaming offsets: per MessageQueue, the ConsumeQueue offset to read next.

The JSON form Spark checkpoints is ``{"topic": {"brokerName": {"queueId": next}}}``
with keys sorted, so the same position always serialises the same way. In
``startingOffsets`` / ``endingOffsets`` an offset of -2 means the queue's
earliest and -1 its latest, as in Kafka's connector.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rocketspark.message.model import MessageQueue

EARLIEST = -2
LATEST = -1


Positions = dict[MessageQueue, int]


def to_json(positions: Mapping[MessageQueue, int]) -> dict[str, dict[str, dict[str, int]]]:
    """Return positions as the nested dict Spark stores (sorted keys)."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for mq in sorted(positions):
        out.setdefault(mq.topic, {}).setdefault(mq.broker, {})[str(mq.queue_id)] = int(
            positions[mq]
        )
    return out


def from_json(data: Mapping[str, Mapping[str, Mapping[str, int]]]) -> Positions:
    """Return positions from the nested dict form."""
    out: Positions = {}
    for topic, brokers in data.items():
        for broker, queues in brokers.items():
            for qid, off in queues.items():
                out[MessageQueue(topic, broker, int(qid))] = int(off)
    return out


def queues_of(positions: Iterable[MessageQueue], topic: str) -> list[MessageQueue]:
    return sorted(mq for mq in positions if mq.topic == topic)

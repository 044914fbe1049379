"""Queue locks of orderly consumers (RocketMQ's ``RebalanceLockManager``, served by
LOCK_BATCH_MQ and UNLOCK_BATCH_MQ)."""

from __future__ import annotations

import threading
import time
from typing import Any

from rocketspark.message.fastjson import loads_lenient
from rocketspark.remoting.command import RemotingCommand
from rocketspark.remoting.processors.common import ok, to_json
from rocketspark.remoting.server import Channel

MQ = tuple[str, str, int]  # topic, broker name, queue id


def _mq_json(mq: MQ) -> dict[str, Any]:
    return {"brokerName": mq[1], "queueId": mq[2], "topic": mq[0]}


def _lock_body(request: RemotingCommand) -> tuple[str, str, list[MQ]]:
    """LockBatchRequestBody / UnlockBatchRequestBody: group, client id, queues."""
    data = loads_lenient(bytes(request.body or b"{}").decode("utf-8"))
    mqs = [
        (str(q["topic"]), str(q["brokerName"]), int(q["queueId"])) for q in data.get("mqSet") or ()
    ]
    return str(data.get("consumerGroup") or ""), str(data.get("clientId") or ""), mqs


class QueueLocks:
    """Which client of a group holds each queue (RocketMQ's RebalanceLockManager): a lock
    lapses 60 s after its holder last locked it."""

    EXPIRY_SECONDS = 60.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple[str, MQ], tuple[str, float]] = {}

    def lock(self, group: str, client: str, mqs: list[MQ]) -> list[MQ]:
        now = time.monotonic()
        out = []
        with self._lock:
            for mq in mqs:
                holder = self._held.get((group, mq))
                if holder is None or holder[0] == client or now - holder[1] > self.EXPIRY_SECONDS:
                    self._held[(group, mq)] = (client, now)
                    out.append(mq)
        return out

    def held(self, group: str) -> list[MQ]:
        """The queues of ``group`` some client holds now."""
        now = time.monotonic()
        with self._lock:
            return sorted(
                mq
                for (g, mq), (_, at) in self._held.items()
                if g == group and now - at <= self.EXPIRY_SECONDS
            )

    def unlock(self, group: str, client: str, mqs: list[MQ]) -> None:
        with self._lock:
            for mq in mqs:
                holder = self._held.get((group, mq))
                if holder is not None and holder[0] == client:
                    del self._held[(group, mq)]


class QueueLockProcessor:
    """LOCK_BATCH_MQ and UNLOCK_BATCH_MQ over one :class:`QueueLocks`."""

    def __init__(self) -> None:
        self.locks = QueueLocks()

    def lock_queues(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        """LOCK_BATCH_MQ: lock queues for a client of a group (orderly consumers); answers
        the queues it holds now (RocketMQ's RebalanceLockManager, 60 s without renewal)."""
        group, client, mqs = _lock_body(request)
        held = self.locks.lock(group, client, mqs)
        return ok(request, body=to_json({"lockOKMQSet": [_mq_json(mq) for mq in held]}))

    def unlock_queues(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        """UNLOCK_BATCH_MQ: give queue locks of a client of a group up."""
        group, client, mqs = _lock_body(request)
        self.locks.unlock(group, client, mqs)
        return ok(request)

"""Latency fault tolerance: a broker that failed or answered slowly is avoided for a while.

As RocketMQ's ``MQFaultStrategy`` with ``sendLatencyFaultEnable``: after each
send the producer records the broker's latency; a latency at or above one of
``LATENCY_MAX`` makes the broker unavailable for the matching
``NOT_AVAILABLE_MS`` (a send that failed counts as 10 s, an isolation: the
broker is out for 30 s, and unreachable if it could not be connected). Queue
selection prefers available brokers, then reachable ones, then any queue, and
a retry avoids the broker that just failed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rocketspark.message.model import MessageQueue

__all__ = ["LATENCY_MAX", "NOT_AVAILABLE_MS", "LatencyFaults"]

LATENCY_MAX = (50, 100, 550, 1800, 3000, 5000, 15000)
NOT_AVAILABLE_MS = (0, 0, 2000, 5000, 6000, 10000, 30000)
# A failed send is recorded as this latency: the broker is out for 30 s.
ISOLATION_LATENCY_MS = 10_000


def not_available_ms(latency_ms: float) -> int:
    """How long a broker that answered in ``latency_ms`` is avoided."""
    for limit, wait in zip(reversed(LATENCY_MAX), reversed(NOT_AVAILABLE_MS), strict=True):
        if latency_ms >= limit:
            return wait
    return 0


@dataclass
class _Fault:
    latency_ms: float
    available_at: float  # monotonic seconds
    reachable: bool


class LatencyFaults:
    """Per broker name: when it is available again, and whether it could be reached."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._faults: dict[str, _Fault] = {}
        self._lock = threading.Lock()

    def record(
        self, broker: str, latency_ms: float, *, failed: bool = False, reachable: bool = True
    ) -> None:
        """Record a send's outcome: its latency, or that it failed (isolation)."""
        wait = not_available_ms(ISOLATION_LATENCY_MS if failed else latency_ms)
        with self._lock:
            self._faults[broker] = _Fault(latency_ms, self._clock() + wait / 1000.0, reachable)

    def available(self, broker: str) -> bool:
        f = self._faults.get(broker)
        return f is None or self._clock() >= f.available_at

    def reachable(self, broker: str) -> bool:
        f = self._faults.get(broker)
        return f is None or f.reachable

    def select(
        self, queues: Sequence[MessageQueue], start: int, avoid: str | None = None
    ) -> MessageQueue:
        """The queue a send goes to: round-robin from ``start`` over available brokers other
        than ``avoid``, then reachable ones, then any (RocketMQ's selectOneMessageQueue)."""
        n = len(queues)
        for ok in (self.available, self.reachable):
            for i in range(n):
                mq = queues[(start + i) % n]
                if mq.broker != avoid and ok(mq.broker):
                    return mq
        for i in range(n):
            mq = queues[(start + i) % n]
            if mq.broker != avoid:
                return mq
        return queues[start % n]

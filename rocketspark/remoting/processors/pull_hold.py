"""Long polling (RocketMQ's ``PullRequestHoldService``): pulls that found nothing,
parked until a put reaches their queue or their suspend timeout passes."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rocketspark.errors import RocketSparkError
from rocketspark.remoting.command import RemotingCommand
from rocketspark.remoting.server import Channel
from rocketspark.store.message_store import MessageStore

HOLD_CHECK_SECONDS = 0.001  # how often held pulls look for another process's puts


@dataclass(slots=True)
class _Held:
    request: RemotingCommand
    channel: Channel
    offset: int
    deadline: float


class PullHoldService:
    """Pulls that found nothing, parked until their queue moves or their time is up.

    One thread. With nothing held it sleeps until a pull is parked. With pulls
    held it waits on the store's arrivals condition (puts of this process notify
    it) at most :data:`HOLD_CHECK_SECONDS`, and looks at the store's write
    sequence (bumped by every put, in any process): another process's put wakes
    nothing here, so while pulls are held that sequence is polled, and a put of
    a Spark sink writing the directory reaches a held pull within about a
    millisecond. When either says something was put, each held queue's max
    offset is read and the pulls behind it run again (``wake(request,
    channel)``). Pulls past their deadline run again too, and answer
    PULL_NOT_FOUND; the held pulls are looked at only then (the earliest
    deadline is kept), not at every poll.
    """

    def __init__(self, store: MessageStore, wake: Callable[[RemotingCommand, Channel], None]):
        self.store = store
        self._wake = wake
        self._lock = threading.Lock()
        self._held: dict[tuple[str, int], list[_Held]] = {}
        self._added = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_due = math.inf  # the earliest deadline of a held pull
        # The key of a channel's attributes set once its close drops its held pulls here.
        self._attribute = f"pull-hold-{id(self)}"

    @property
    def held(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._held.values())

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="rocketspark-serve-pull-hold", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._added.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            self._held.clear()

    def hold(
        self,
        request: RemotingCommand,
        channel: Channel,
        topic: str,
        queue_id: int,
        offset: int,
        timeout_ms: int,
    ) -> None:
        held = _Held(request, channel, offset, time.monotonic() + timeout_ms / 1000.0)
        with self._lock:
            self._held.setdefault((topic, queue_id), []).append(held)
            if held.deadline < self._next_due:
                self._next_due = held.deadline
        self._added.set()
        # Once per connection: when it ends, its held pulls go at once (not at their
        # deadline, polling the store until then). After the append: a connection
        # closed already calls back at once.
        token = object()
        if channel.attributes.setdefault(self._attribute, token) is token:
            channel.on_close(self._forget)
        # A put between the pull's read and now would have been missed: look once more.
        try:
            moved = self.store.max_offset(topic, queue_id) > offset
        except RocketSparkError:
            moved = True
        if moved:
            self._release((topic, queue_id), lambda h: h is held)

    def _forget(self, channel: Channel) -> None:
        """Drop the held pulls of ``channel``, whose connection ended (nobody to answer)."""
        with self._lock:
            for key in [
                k for k, entries in self._held.items() if any(e.channel is channel for e in entries)
            ]:
                rest = [e for e in self._held[key] if e.channel is not channel]
                if rest:
                    self._held[key] = rest
                else:
                    del self._held[key]

    def _release(self, key: tuple[str, int], which: Callable[[_Held], bool]) -> None:
        with self._lock:
            entries = self._held.get(key)
            if not entries:
                return
            out = [e for e in entries if which(e)]
            if not out:
                return
            rest = [e for e in entries if not which(e)]
            if rest:
                self._held[key] = rest
            else:
                del self._held[key]
        for e in out:
            if not e.channel.closed:
                self._wake(e.request, e.channel)

    def _run(self) -> None:
        arrivals = self.store.reader.arrivals
        state = self.store.state
        seq = None
        while not self._stopping.is_set():
            with self._lock:
                empty = not self._held
            if empty:
                # Nothing held: sleep until a pull is parked (hold) or the service stops.
                self._added.wait()
                self._added.clear()
                seq = None
                continue
            with arrivals:
                notified = arrivals.wait(HOLD_CHECK_SECONDS)
            if self._stopping.is_set():
                return
            try:
                now_seq = state.write_seq
            except (ValueError, RocketSparkError):  # the store closed under us
                return
            now = time.monotonic()
            put = notified or now_seq != seq
            seq = now_seq
            if not put and now < self._next_due:
                continue  # nothing was put, no deadline passed
            with self._lock:
                keys = list(self._held)
            for key in keys:
                end: int | None = -1  # -1: not looked at (nothing was put)
                if put:
                    try:
                        end = self.store.max_offset(*key)
                    except RocketSparkError:
                        end = None  # the topic went: answer them all
                self._release(key, _due(end, now))
            with self._lock:  # a pull held since the sweep is counted too
                self._next_due = min(
                    (e.deadline for entries in self._held.values() for e in entries),
                    default=math.inf,
                )


def _due(end: int | None, now: float) -> Callable[[_Held], bool]:
    """Which held pulls to run again: those behind ``end`` (the queue's new max offset;
    None: all, -1: none), past their deadline, or whose connection is gone."""

    def due(e: _Held) -> bool:
        return end is None or e.offset < end or e.deadline <= now or e.channel.closed

    return due

"""What a put or a pull answers: the values both backends (an embedded store, a
broker over the wire) return.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rocketspark.message.model import HostAddress, MessageExt
from rocketspark.message.record import message_id

__all__ = [
    "Halves",
    "PullResult",
    "PullStatus",
    "PutResult",
    "PutResults",
    "PutStatus",
    "no_results",
    "offset_runs",
]


class PutStatus(enum.Enum):
    """RocketMQ's PutMessageStatus, as far as an embedded store can reach it."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"


class PullStatus(enum.Enum):
    """The client-side PullStatus."""

    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


@dataclass(frozen=True, slots=True)
class PutResult:
    """Where a put message landed."""

    status: PutStatus
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    msg_id: str
    uniq_key: str
    store_timestamp: int
    store_size: int
    broker: str = ""  # the broker that stored it ("": the embedded store's)


class SameForEach(Mapping[int, str]):
    """``value`` for each index 0 .. n-1: the UNIQ_KEY every record of a batch was given
    (a Java producer's batch), without a dict of n items."""

    __slots__ = ("_n", "_value")

    def __init__(self, n: int, value: str):
        self._n, self._value = n, value

    def __getitem__(self, i: int) -> str:
        if not (isinstance(i, int) and 0 <= i < self._n):
            raise KeyError(i)
        return self._value

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self._n))


class PutResults(Sequence[PutResult]):
    """The results of a columnar put_batch: built lazily, one PutResult per index.

    A batch of a million messages should not pay for a million result objects
    that its caller may never look at; the columns are kept as numpy arrays
    (``commitlog_offsets``, ``queue_offsets``, ``queue_ids``) for callers that
    want them whole.
    """

    __slots__ = (
        "status",
        "topics",
        "queue_ids",
        "queue_offsets",
        "commitlog_offsets",
        "store_sizes",
        "store_timestamp",
        "_host_hex",
        "_uniq_prefix",
        "_uniq_start",
        "_uniq_given",
    )

    def __init__(
        self,
        status: PutStatus,
        topics: list[str] | str,
        queue_ids: np.ndarray,
        queue_offsets: np.ndarray,
        commitlog_offsets: np.ndarray,
        store_sizes: np.ndarray,
        store_timestamp: int,
        store_host: HostAddress,
        uniq_prefix: str,
        uniq_start: int,
        uniq_given: Mapping[int, str],
    ):
        self.status = status
        self.topics = topics
        self.queue_ids = queue_ids
        self.queue_offsets = queue_offsets
        self.commitlog_offsets = commitlog_offsets
        self.store_sizes = store_sizes
        self.store_timestamp = store_timestamp
        self._host_hex = message_id(store_host, 0)[:-16]
        self._uniq_prefix = uniq_prefix
        self._uniq_start = uniq_start
        self._uniq_given = uniq_given

    def __len__(self) -> int:
        return len(self.commitlog_offsets)

    def _one(self, i: int) -> PutResult:
        phy = int(self.commitlog_offsets[i])
        uniq = self._uniq_given.get(i)
        if uniq is None:
            uniq = f"{self._uniq_prefix}{(self._uniq_start + i) & 0xFFFF:04X}"
        topic = self.topics if isinstance(self.topics, str) else self.topics[i]
        return PutResult(
            self.status,
            topic,
            int(self.queue_ids[i]),
            int(self.queue_offsets[i]),
            phy,
            f"{self._host_hex}{phy:016X}",
            uniq,
            self.store_timestamp,
            int(self.store_sizes[i]),
        )

    def joined_msg_ids(self) -> str:
        """Return the message ids of the results (``PutResult.msg_id``), in order, joined
        by commas (a batch send's answer)."""
        # Hot path: every batch send's answer; numpy formats the offsets, not Python.
        n = len(self)
        host = self._host_hex.encode("ascii")
        at = len(host)
        out = np.empty((n, at + 17), dtype=np.uint8)
        out[:, :at] = np.frombuffer(host, dtype=np.uint8)
        digits = np.asarray(self.commitlog_offsets, dtype=">u8").view(np.uint8).reshape(n, 8)
        out[:, at : at + 16] = _HEX_PAIR16[digits].view(np.uint8)  # a 2-byte item each
        out[:, -1] = ord(",")
        return out.tobytes()[:-1].decode("ascii")

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._one(j) for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"put result index {i} out of range for {len(self)} results")
        return self._one(i)

    def __iter__(self):
        return (self._one(i) for i in range(len(self)))

    def __add__(self, other: Iterable[PutResult]) -> list[PutResult]:
        return list(self) + list(other)

    def __radd__(self, other: Iterable[PutResult]) -> list[PutResult]:
        return list(other) + list(self)

    def __repr__(self) -> str:
        return f"PutResults({len(self)} messages, {self.status.name})"


# Each byte value's two upper-case hex digits (ASCII) as one 2-byte item, for
# joined_msg_ids (a gather of 2-byte items is faster than of rows of a (256, 2) table).
_HEX_PAIR16 = np.frombuffer(bytes(range(256)).hex().upper().encode("ascii"), dtype=np.uint16)


@dataclass(frozen=True, slots=True)
class PullResult:
    """What a pull found; ``next_offset`` is the offset to pull from next."""

    status: PullStatus
    messages: list[MessageExt]
    next_offset: int
    min_offset: int
    max_offset: int


def no_results(host: HostAddress) -> PutResults:
    """The PutResults of an empty put (``host``: the store's)."""
    empty = np.empty(0, dtype=np.int64)
    return PutResults(PutStatus.PUT_OK, [], empty, empty, empty, empty, 0, host, "", 0, {})


def offset_runs(offsets: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Offsets in order as runs [start, end) of consecutive ones."""
    runs: list[list[int]] = []
    for o in offsets:
        if runs and runs[-1][1] == o:
            runs[-1][1] = o + 1
        else:
            runs.append([o, o + 1])
    return tuple((a, b) for a, b in runs)


@dataclass(frozen=True, slots=True)
class Halves:
    """The half messages of one prepare call on one broker: what ending them needs.

    ``runs`` are half-queue offset runs [start, end), in prepare order (an embedded
    store's halves of one call are consecutive). A broker's END_TRANSACTION also names
    each half by its CommitLog offset and transaction id: ``commitlog_offsets`` and
    ``transaction_ids``, one per half in run order, empty for an embedded store.
    """

    broker: str
    producer_group: str
    runs: tuple[tuple[int, int], ...]
    commitlog_offsets: tuple[int, ...] = ()
    transaction_ids: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()  # each half's real topic (a broker's), in run order

    def __len__(self) -> int:
        return sum(end - start for start, end in self.runs)

    def offsets(self) -> np.ndarray:
        """Return the half-queue offsets of the runs, in order (int64)."""
        if not self.runs:
            return np.empty(0, dtype=np.int64)
        return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in self.runs])

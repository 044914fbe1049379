"""How half messages were resolved: the transaction service's bookkeeping.

The state of each half queue offset (one byte each, :class:`ResolutionTable`),
the half offsets an op record's body lists, and the sorting of offsets the
service resolves. Kept apart from the service (transaction.py), which appends
and reads the records these describe.
"""

from __future__ import annotations

import enum
import numbers
from collections.abc import Iterable

import numpy as np

from rocketspark.errors import ConfigError, OffsetOutOfRangeError
from rocketspark.message.model import INT64_MAX, TRANS_HALF_TOPIC
from rocketspark.message.results import PutResult, PutResults

OFFSET_SEPARATOR = ","


class HalfState(enum.IntEnum):
    """Where a half queue offset stands (one byte each in the resolution table).

    Arrays of states are compared with ``.value``: numpy compares a uint8
    array with an int as uint8, but with an IntEnum member as int64 (~7x slower).
    """

    OPEN = 0
    COMMITTED = 1
    ROLLED_BACK = 2
    RESOLVED = 3  # by a RocketMQ op record that does not say how, or below the check progress
    MOVED = 4  # put back by a check: the transaction lives on in a copy


class ResolutionTable:
    """How each half queue offset was resolved, one byte per offset.

    Offsets below ``floor`` (the persisted check progress) are resolved even
    when this process never read the op that says how.
    """

    def __init__(self) -> None:
        self._b = np.zeros(0, dtype=np.uint8)
        self.floor = 0

    def _grow(self, upto: int) -> None:
        if upto > len(self._b):
            bigger = np.zeros(max(upto, 2 * len(self._b), 1024), dtype=np.uint8)
            bigger[: len(self._b)] = self._b
            self._b = bigger

    def get(self, off: int) -> int:
        state = int(self._b[off]) if 0 <= off < len(self._b) else HalfState.OPEN
        return HalfState.RESOLVED if state == HalfState.OPEN and off < self.floor else state

    def get_many(self, offs: np.ndarray) -> np.ndarray:
        out = np.zeros(len(offs), dtype=np.uint8)
        inside = offs < len(self._b)
        out[inside] = self._b[offs[inside]]
        out[(out == HalfState.OPEN.value) & (offs < self.floor)] = HalfState.RESOLVED
        return out

    def set_many(self, offs: np.ndarray, state: int) -> None:
        if len(offs):
            self._grow(int(offs.max()) + 1)
            self._b[offs] = state

    def set_open(self, offs: np.ndarray, state: int) -> None:
        """Set ``state`` where nothing is recorded yet (the first op record wins)."""
        if len(offs):
            a = np.asarray(offs, dtype=np.int64)
            self._grow(int(a.max()) + 1)
            a = a[self._b[a] == HalfState.OPEN.value]
            self._b[a] = state


def op_offsets(body: bytes) -> np.ndarray:
    """The half queue offsets an op record's body lists ("12,13,14").

    Parsed in numpy; a body with anything but digits and separators (RocketMQ
    writes none) is parsed leniently, item by item, skipping what is not a number.
    """
    text = body.strip()
    if not text:
        return np.empty(0, dtype=np.int64)
    if (
        text.replace(b",", b"").isdigit()
        and b",," not in text
        and text[:1] != b","
        and text[-1:] != b","
    ):
        # digits between single separators: numpy's text parser (~12 ns an offset)
        return np.fromstring(text.decode("ascii"), dtype=np.int64, sep=",")
    return np.array(
        [
            int(p)
            for p in body.decode("ascii", "replace").split(OFFSET_SEPARATOR)
            if p.strip().isdigit()
        ],
        dtype=np.int64,
    )


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """np.unique for int arrays, without its hash table (slow at 500k values here)."""
    values = np.asarray(values, dtype=np.int64)
    if len(values) < 2 or bool(np.all(values[1:] > values[:-1])):
        return values  # already ascending: the sink's runs are
    values = np.sort(values)
    keep = np.ones(len(values), dtype=bool)
    keep[1:] = values[1:] != values[:-1]
    return values[keep]


def half_offsets(half: object) -> list[int] | np.ndarray:
    """Half-queue offsets of PutResults, ints or an integer array; anything else (a
    bool, a float that would be truncated, a negative number) is refused by name."""
    if isinstance(half, np.ndarray):
        if half.dtype.kind not in "iu":
            raise ConfigError(
                f"half message offsets must be integers, got an array of {half.dtype}"
            )
        half = half.astype(np.int64, copy=False)
        if len(half) and int(half.min()) < 0:  # (a uint64 beyond int64 wraps negative)
            raise OffsetOutOfRangeError(
                f"no half message at offset {half.min()} of {TRANS_HALF_TOPIC}"
            )
        return half
    if isinstance(half, PutResults):
        if len(half) and half.topics != TRANS_HALF_TOPIC:
            raise ConfigError(f"these are not half messages (topic {half.topics!r})")
        return half.queue_offsets
    if isinstance(half, (PutResult, numbers.Integral)) or not isinstance(half, Iterable):
        half = [half]
    out = []
    for h in half:
        if isinstance(h, PutResult):
            if h.topic != TRANS_HALF_TOPIC:
                raise ConfigError(f"{h.msg_id} is not a half message (topic {h.topic!r})")
            out.append(h.queue_offset)
        elif h.__class__ is int and 0 <= h <= INT64_MAX:
            out.append(h)
        else:
            if isinstance(h, bool) or not isinstance(h, numbers.Integral):
                raise ConfigError(
                    f"a half message is named by its PutResult or its queue "
                    f"offset (an integer), got {h!r}"
                )
            # typeshed's numbers.Integral declares < and <= only; int compares with it at run time
            if not 0 <= h <= INT64_MAX:  # type: ignore[operator]
                raise OffsetOutOfRangeError(f"no half message at offset {h} of {TRANS_HALF_TOPIC}")
            out.append(int(h))
    return out


def half_offset_array(half: object) -> np.ndarray | None:
    """:func:`half_offsets` as an int64 array; None stays None (no offsets given)."""
    return None if half is None else np.asarray(half_offsets(half), dtype=np.int64)

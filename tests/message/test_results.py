"""The values a put, a pull or a prepare answers."""

from __future__ import annotations

import numpy as np
import pytest

from rocketspark.message.model import HostAddress
from rocketspark.message.results import Halves, PutResult, PutStatus, no_results


def test_no_results_is_an_empty_sequence():
    empty = no_results(HostAddress(bytes([127, 0, 0, 1]), 10911))
    assert len(empty) == 0 and list(empty) == [] and empty[0:5] == []
    assert empty + [] == [] and empty.status is PutStatus.PUT_OK
    with pytest.raises(IndexError):
        empty[0]
    assert PutResult.__slots__  # a frozen value, no per-instance dict


def test_halves_are_runs_of_half_queue_offsets():
    halves = Halves("broker-a", "g", ((3, 6), (10, 11)))
    assert len(halves) == 4
    assert np.array_equal(halves.offsets(), [3, 4, 5, 10])
    assert len(Halves("broker-a", "g", ())) == 0 and Halves("b", "g", ()).offsets().size == 0
    assert halves == Halves("broker-a", "g", ((3, 6), (10, 11)))

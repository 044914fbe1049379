"""The values a put, a pull or a prepare answers."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pytest

from rocketspark.message.model import HostAddress
from rocketspark.message.record import message_id
from rocketspark.message.results import (
    Halves,
    PullResult,
    PullStatus,
    PutResult,
    PutResults,
    PutStatus,
    no_results,
)


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


HOST = HostAddress(bytes([10, 0, 0, 9]), 10911)


def _results(topics="t") -> PutResults:
    return PutResults(
        PutStatus.PUT_OK,
        topics,
        np.array([0, 1, 0], dtype=np.int64),
        np.array([5, 7, 6], dtype=np.int64),
        np.array([0, 120, 250], dtype=np.int64),
        np.array([120, 130, 110], dtype=np.int64),
        1_700_000_000_000,
        HOST,
        "AC11000100002A9F0000000000",
        0xFFFE,
        {1: "GIVEN-UNIQ"},
    )


def test_put_results_are_a_sequence_of_put_results():
    rs = _results()
    assert isinstance(rs, Sequence) and len(rs) == 3
    first = rs[0]
    assert first == PutResult(
        PutStatus.PUT_OK,
        "t",
        0,
        5,
        0,
        message_id(HOST, 0),
        "AC11000100002A9F0000000000FFFE",
        1_700_000_000_000,
        120,
    )
    assert rs[1].uniq_key == "GIVEN-UNIQ"  # a UNIQ_KEY the message carried
    assert rs[2].uniq_key.endswith("0000")  # the counter wraps at 16 bits, as RocketMQ's
    assert rs[-1] == rs[2] and rs[-3] == rs[0]
    assert rs[1:] == [rs[1], rs[2]] and rs[::-1] == [rs[2], rs[1], rs[0]]
    assert list(rs) == [rs[0], rs[1], rs[2]]
    assert [r.msg_id for r in rs] == [message_id(HOST, o) for o in (0, 120, 250)]
    assert rs[2] in rs and rs.index(rs[1]) == 1 and rs.count(rs[0]) == 1
    for i in (3, -4):
        with pytest.raises(IndexError):
            rs[i]
    assert rs + [first] == [rs[0], rs[1], rs[2], first]
    assert [first] + rs == [first, rs[0], rs[1], rs[2]]
    assert repr(rs) == "PutResults(3 messages, PUT_OK)"


def test_put_results_keep_their_columns_whole_and_name_each_rows_topic():
    rs = _results(["a", "b", "a"])
    assert [r.topic for r in rs] == ["a", "b", "a"]
    assert rs.commitlog_offsets.tolist() == [0, 120, 250]
    assert rs.queue_offsets.tolist() == [5, 7, 6] and rs.queue_ids.tolist() == [0, 1, 0]
    assert all(
        type(v) is int for v in dataclasses.astuple(rs[1]) if not isinstance(v, (str, PutStatus))
    )


def test_a_put_result_is_a_frozen_value():
    r = _results()[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.queue_offset = 9  # type: ignore[misc]
    assert r == dataclasses.replace(r) and hash(r) == hash(dataclasses.replace(r))


def test_a_pull_result_carries_its_status_messages_and_offsets():
    res = PullResult(PullStatus.NO_NEW_MSG, [], next_offset=4, min_offset=0, max_offset=4)
    assert res.status is PullStatus.NO_NEW_MSG and res.messages == [] and res.next_offset == 4
    assert res == PullResult(PullStatus.NO_NEW_MSG, [], 4, 0, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.next_offset = 5  # type: ignore[misc]
    assert {s.value for s in PullStatus} == {
        "FOUND",
        "NO_NEW_MSG",
        "NO_MATCHED_MSG",
        "OFFSET_ILLEGAL",
    }
    assert {s.value for s in PutStatus} == {"PUT_OK", "FLUSH_DISK_TIMEOUT"}


def test_joined_msg_ids_are_each_results_msg_id():
    """A batch send's answer: every msgId, comma-separated, formatted with numpy."""
    offsets = np.array([0, 123_456_789, 2**40 + 5, 2**63 - 1], dtype=np.int64)
    host = HostAddress(bytes([10, 0, 0, 7]), 10911)
    results = PutResults(
        PutStatus.PUT_OK, "t", np.zeros(4, np.int32), offsets, offsets, offsets, 0, host, "X", 0, {}
    )
    assert results.joined_msg_ids() == ",".join(r.msg_id for r in results)
    assert results.joined_msg_ids().split(",")[1] == message_id(host, 123_456_789)

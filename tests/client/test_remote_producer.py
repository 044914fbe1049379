"""The cluster producer's columnar encoding: the bytes of the per-message path, without a broker."""

from __future__ import annotations

import pytest

from rocketspark.client.remote_producer import (
    _chunks,
    _encode_for_batch,
    _entries_matrix,
    _matrix_lane,
    _plain_columns,
)
from rocketspark.message.columns import Columns
from rocketspark.message.model import Message, MessageQueue
from rocketspark.message.properties import encode_properties

UNIQ = [f"7F0000010F2A0001{i:012X}{i & 0xFFFF:04X}" for i in range(300)]


def _message_entry(body: bytes, tags: str | None, keys, uniq: str) -> bytes:
    m = Message("t", body, tags=tags, keys=keys)
    props = m.all_properties()
    props["UNIQ_KEY"] = uniq
    return _encode_for_batch(m.body, m.flag, encode_properties(props))


@pytest.mark.parametrize(
    ("tags", "keys"), [(None, None), ("t", None), (None, ["k1", "k2"]), ("tag", "k")]
)
def test_a_matrix_row_is_the_messages_entry(tags, keys):
    n = len(UNIQ)
    bodies = [f"body-{i:05d}".encode() for i in range(n)]
    cols = Columns.of_keywords(bodies, {"topic": "t", "tags": [tags] * n, "keys": [keys] * n})
    plan = _plain_columns(cols)
    assert plan is not None
    topic, tag_items, key_items = plan
    head = (tag_items[0] if tag_items else "") + (key_items[0] if key_items else "")
    matrix = _entries_matrix(bodies, head, UNIQ)
    assert matrix is not None
    for i in range(n):
        assert matrix[i].tobytes() == _message_entry(bodies[i], tags, keys, UNIQ[i])


def test_bodies_of_several_lengths_are_not_a_matrix():
    assert _entries_matrix([b"a", b"bb"], "", UNIQ[:2]) is None


@pytest.mark.parametrize("size", [100, 3000, 70_000])
def test_a_matrix_lane_is_cut_as_chunks_cuts_encoded_rows(size):
    n = 300 if size < 70_000 else 40
    bodies = [bytes([65 + i % 26]) * size for i in range(n)]
    rows = list(range(n))
    matrix = _entries_matrix(bodies, "", UNIQ[:n])
    assert matrix is not None
    encoded = [matrix[i].tobytes() for i in rows]
    mq = MessageQueue("t", "b", 0)
    lane = _matrix_lane(mq, rows, matrix, bodies, 0)
    assert [r.rows for r in lane] == list(_chunks(rows, encoded))
    for r in lane:
        if r.batch:
            assert r.body == b"".join(encoded[i] for i in r.rows)


@pytest.mark.parametrize(
    "columns",
    [
        {"properties": [{"a": "b"}, None]},
        {"queue_ids": [0, None]},
        {"sharding_keys": ["s", None]},
        {"tags": ["é", None]},
        {"tags": ["a\x01", None]},
        {"keys": [["a b"], None]},
        {"keys": [["a", ""], None]},
        {"keys": [5, None]},
        {"topics": ["t", "u"]},
        {"tags": ("t", "t")},
    ],
)
def test_columns_other_than_plain_rows_go_through_messages(columns):
    assert _plain_columns(Columns.of_keywords([b"a", b"b"], {"topic": "t", **columns})) is None


def test_bodies_other_than_bytes_go_through_messages():
    assert _plain_columns(Columns.of_keywords([b"a", "b"], {"topic": "t"})) is None
    assert _plain_columns(Columns.of_keywords([b"a", b""], {"topic": "t"})) is None
    assert _plain_columns(Columns.of_keywords([], {"topic": "t"})) is None


def test_plain_keys_are_joined_as_a_message_joins_them():
    cols = Columns.of_keywords(
        [b"a"] * 5, {"topic": "t", "keys": [" a  b ", ("c", "d"), "", None, []]}
    )
    plan = _plain_columns(cols)
    assert plan is not None
    _, _, key_items = plan
    assert key_items == ["KEYS\x01a b\x02", "KEYS\x01c d\x02", "", "", ""]

"""The PROPERTIES field: its grammar, RocketMQ's bytes, and the layout every put path writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rocketspark.message.model import (
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    SCHEDULE_TOPIC,
    TRANS_HALF_TOPIC,
    Message,
)
from rocketspark.message.properties import (
    HALF_COMMIT_MARKER,
    REAL_QUEUE_ID_SEPARATOR,
    TAGS_PREFIX,
    committed_properties,
    decode_properties,
    encode_properties,
    half_head_text,
    half_properties,
    half_tail_text,
    message_properties,
    prefix,
    properties_text,
)
from rocketspark.message.record import HEADER_V4
from rocketspark.store import MessageStore

GOLDEN = Path(__file__).resolve().parents[1] / "store" / "data" / "rocketmq-5-store"
with open(GOLDEN / "expected.json", encoding="utf-8") as _f:
    GOLDEN_MESSAGES = json.load(_f)["messages"]

UNIQ = "7F000001C35000000000000000000000"

# -- grammar ----------------------------------------------------------------------------

_text = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)))


@given(st.dictionaries(_text.filter(bool), _text, max_size=8))
def test_encode_then_decode_gives_the_properties_back_in_order(props):
    raw = encode_properties(props)
    assert list(decode_properties(raw).items()) == list(props.items())
    assert raw == properties_text(props).encode("utf-8")


def test_properties_tolerate_missing_trailing_separator():
    assert decode_properties(b"a\x01b\x02c\x01d") == {"a": "b", "c": "d"}


def test_decoding_skips_items_without_a_value_and_keeps_the_last_of_a_name():
    assert decode_properties(b"a\x01b\x02junk\x02\x02a\x01c\x02") == {"a": "c"}
    assert decode_properties(b"") == {} and encode_properties({}) == b""


def test_prefixes_are_the_names_from_the_model():
    assert prefix("TAGS") == TAGS_PREFIX == "TAGS\x01"
    assert HALF_COMMIT_MARKER == b"TRAN_MSG\x01true\x02REAL_TOPIC\x01"
    assert REAL_QUEUE_ID_SEPARATOR == b"\x02REAL_QID\x01"
    assert half_head_text("g") == "PGROUP\x01g\x02__transactionId__\x01"
    assert half_tail_text("t", 3) == "TRAN_MSG\x01true\x02REAL_TOPIC\x01t\x02REAL_QID\x013\x02"


# -- RocketMQ's bytes ------------------------------------------------------------------------


@pytest.mark.parametrize("e", GOLDEN_MESSAGES, ids=lambda e: e["note"])
def test_a_brokers_properties_decode_and_encode_back_byte_for_byte(e):
    raw = e["propertiesString"].encode("utf-8")
    assert decode_properties(raw) == e["properties"]
    assert encode_properties(decode_properties(raw)) == raw


# -- our layout -------------------------------------------------------------------------------


def test_the_layout_of_a_known_message():
    """User properties in order, then TAGS, KEYS, UNIQ_KEY."""
    msg = Message("t", b"x", tags="TagA", keys=["k1", "k2"], properties={"color": "red", "n": "1"})
    props = msg.all_properties() | {PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: UNIQ}
    assert encode_properties(props) == (
        b"color\x01red\x02n\x011\x02TAGS\x01TagA\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01"
        + UNIQ.encode()
        + b"\x02"
    )
    delayed = Message("t", b"x", tags="a", delay_level=3).all_properties()
    assert encode_properties(delayed) == b"TAGS\x01a\x02DELAY\x013\x02"


def test_a_half_commits_to_the_prefix_before_the_marker():
    props = message_properties({"color": "red"}, tags="a") | {"UNIQ_KEY": UNIQ}
    half = half_properties(
        props, producer_group="g", real_topic="t", real_queue_id=2, extra={"e": "1"}
    )
    raw = encode_properties(half)
    assert (
        raw
        == (
            f"color\x01red\x02TAGS\x01a\x02UNIQ_KEY\x01{UNIQ}\x02"
            f"{half_head_text('g')}{UNIQ}\x02e\x011\x02{half_tail_text('t', 2)}"
        ).encode()
    )
    topic, queue_id, committed = committed_properties(half)
    assert (topic, queue_id) == ("t", "2")
    assert encode_properties(committed) == raw[: raw.index(HALF_COMMIT_MARKER)]


def _field(store: MessageStore, offset: int) -> bytes:
    """The raw PROPERTIES field of the (IPv4, v1) record at CommitLog ``offset``."""
    f = store.commit_log.segment(offset)
    pos = offset - f.start_offset
    body_len = int.from_bytes(f.mm[pos + HEADER_V4.size - 4 : pos + HEADER_V4.size], "big")
    at = pos + HEADER_V4.size + body_len
    at += 1 + f.mm[at]
    size = int.from_bytes(f.mm[at : at + 2], "big")
    return bytes(f.mm[at + 2 : at + 2 + size])


@pytest.mark.parametrize("path", ["put", "put_batch", "uniform", "put_columns", "delayed"])
def test_every_put_path_writes_the_layout(tmp_path, path):
    msg = Message("t", b"x", tags="TagA", keys=["k1", "k2"], properties={"color": "red"})
    with MessageStore.open(tmp_path) as store:
        store.create_topic("t", queues=2)
        if path == "put":
            results = [store.put(msg)]
        elif path == "put_batch":
            results = list(store.put_batch([msg]))
        elif path == "uniform":
            results = list(store.put_batch([msg] * 100))
        elif path == "put_columns":
            results = list(
                store.put_columns(
                    [b"x"] * 3,
                    topic="t",
                    tags=["TagA"] * 3,
                    keys=[["k1", "k2"]] * 3,
                    properties=[{"color": "red"}] * 3,
                )
            )
        else:
            msg = Message("t", b"x", tags="TagA", keys=["k1", "k2"], delay_level=1, queue_id=1)
            results = [store.put(msg)]
        for r in results:
            props = msg.all_properties() | {PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: r.uniq_key}
            if path == "delayed":
                assert r.topic == SCHEDULE_TOPIC
                props |= {PROPERTY_REAL_TOPIC: "t", PROPERTY_REAL_QUEUE_ID: "1"}
            assert _field(store, r.commitlog_offset) == encode_properties(props)


@pytest.mark.parametrize("columnar", [False, True])
def test_halves_and_their_commits_follow_the_layout(tmp_path, columnar):
    with MessageStore.open(tmp_path) as store:
        store.create_topic("t", queues=1)
        if columnar:
            halves = store.prepare_columns(
                [b"x"] * 2,
                producer_group="g",
                extra_properties={"e": "1"},
                topic="t",
                tags=["a"] * 2,
            )
        else:
            halves = store.prepare_batch(
                [Message("t", b"x", tags="a")] * 2, producer_group="g", properties={"e": "1"}
            )
        committed = store.commit_transaction(halves)
        for half, done in zip(halves, committed, strict=True):
            assert half.topic == TRANS_HALF_TOPIC
            props = message_properties({}, tags="a") | {"UNIQ_KEY": half.uniq_key}
            want = half_properties(
                props, producer_group="g", real_topic="t", real_queue_id=0, extra={"e": "1"}
            )
            raw = _field(store, half.commitlog_offset)
            assert raw == encode_properties(want)
            assert _field(store, done.commitlog_offset) == raw[: raw.index(HALF_COMMIT_MARKER)]
            assert _field(store, done.commitlog_offset) == encode_properties(
                committed_properties(want)[2]
            )

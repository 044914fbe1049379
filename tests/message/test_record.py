"""Golden bytes for the CommitLog record, computed field by field from the spec."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketspark.errors import (
    CorruptRecordError,
    MessageTooLargeError,
    PropertiesTooLargeError,
)
from rocketspark.message.properties import encode_properties
from rocketspark.message.record import (
    RECORD_BLANK,
    RECORD_END,
    RECORD_INVALID,
    HostAddress,
    check_record,
    decode_record,
    encode_record,
    message_id,
    parse_message_id,
    record_length,
)


def be(n: int, width: int) -> bytes:
    return n.to_bytes(width, "big", signed=True)


def golden_record(
    *,
    topic: bytes,
    body: bytes,
    props: bytes,
    queue_id: int,
    flag: int,
    queue_offset: int,
    phy: int,
    sys_flag: int,
    born_ts: int,
    store_ts: int,
    reconsume: int,
    prepared: int,
) -> bytes:
    """The record laid out by hand from spec/rocketmq-store-format.md (v1, IPv4)."""
    parts = [
        b"",  # TOTALSIZE placeholder
        bytes.fromhex("DAA320A7"),
        be(zlib.crc32(body) & 0x7FFFFFFF, 4),
        be(queue_id, 4),
        be(flag, 4),
        be(queue_offset, 8),
        be(phy, 8),
        be(sys_flag, 4),
        be(born_ts, 8),
        bytes([10, 0, 0, 7]) + be(50000, 4),
        be(store_ts, 8),
        bytes([127, 0, 0, 1]) + be(10911, 4),
        be(reconsume, 4),
        be(prepared, 8),
        be(len(body), 4) + body,
        bytes([len(topic)]) + topic,
        be(len(props), 2) + props,
    ]
    rest = b"".join(parts)
    return be(4 + len(rest), 4) + rest


def test_encode_record_matches_hand_layout():
    props = encode_properties({"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "ABC"})
    assert props == b"TAGS\x01TagA\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01ABC\x02"
    got = encode_record(
        topic="orders",
        queue_id=3,
        body=b"hello",
        properties=props,
        queue_offset=42,
        physical_offset=4096,
        born_timestamp=1_700_000_000_000,
        born_host=HostAddress(bytes([10, 0, 0, 7]), 50000),
        store_timestamp=1_700_000_000_123,
        store_host=HostAddress(bytes([127, 0, 0, 1]), 10911),
        flag=9,
        reconsume_times=2,
        prepared_transaction_offset=77,
    )
    want = golden_record(
        topic=b"orders",
        body=b"hello",
        props=props,
        queue_id=3,
        flag=9,
        queue_offset=42,
        phy=4096,
        sys_flag=0,
        born_ts=1_700_000_000_000,
        store_ts=1_700_000_000_123,
        reconsume=2,
        prepared=77,
    )
    assert got == want
    # Fixed overhead 91 bytes for v1 + IPv4 (spec).
    assert len(got) == 91 + len(b"hello") + len(b"orders") + len(props)
    assert record_length(5, 6, len(props)) == len(got)


def test_v2_magic_for_long_topics_and_ipv6_hosts():
    topic = "T" * 200
    rec = encode_record(
        topic=topic,
        queue_id=0,
        body=b"x",
        properties=b"",
        queue_offset=0,
        physical_offset=0,
        born_timestamp=1,
        born_host=HostAddress.parse("::1", 7),
        store_timestamp=2,
        store_host=HostAddress.parse("fe80::2", 8),
    )
    assert rec[4:8] == bytes.fromhex("DAA320AB")
    sys_flag = int.from_bytes(rec[36:40], "big")
    assert sys_flag == 0x10 | 0x20
    # 2-byte topic length right after the body.
    body_len_at = 4 * 5 + 8 + 8 + 4 + 8 + 20 + 8 + 20 + 4 + 8
    assert rec[body_len_at : body_len_at + 4] == be(1, 4)
    assert rec[body_len_at + 5 : body_len_at + 7] == be(200, 2)
    msg = decode_record(rec)
    assert msg.topic == topic
    assert str(msg.born_host) == "[::1]:7"
    assert str(msg.store_host) == "[fe80::2]:8"
    assert len(msg.msg_id) == 56


def test_msg_id_is_store_ip_port_and_offset_in_upper_hex():
    host = HostAddress(bytes([192, 168, 0, 1]), 10911)
    mid = message_id(host, 0x1234)
    assert mid == "C0A80001" + "00002A9F" + "0000000000001234"
    assert parse_message_id(mid) == (host, 0x1234)


def test_decode_round_trip_and_fields():
    props = encode_properties({"TAGS": "TagA", "UNIQ_KEY": "U1"})
    rec = encode_record(
        topic="t",
        queue_id=1,
        body=b"abc",
        properties=props,
        queue_offset=5,
        physical_offset=100,
        born_timestamp=10,
        born_host=HostAddress.parse("10.0.0.7", 50000),
        store_timestamp=20,
        store_host=HostAddress.parse("127.0.0.1", 10911),
    )
    msg = decode_record(b"\x00" * 100 + rec, 100)
    assert (msg.topic, msg.queue_id, msg.queue_offset, msg.commitlog_offset) == ("t", 1, 5, 100)
    assert msg.body == b"abc" and msg.tags == "TagA" and msg.uniq_key == "U1"
    assert str(msg.born_host) == "10.0.0.7:50000" and str(msg.store_host) == "127.0.0.1:10911"
    assert msg.store_size == len(rec)
    assert msg.msg_id == message_id(HostAddress.parse("127.0.0.1", 10911), 100)


def test_size_limits():
    with pytest.raises(PropertiesTooLargeError, match="32767"):
        encode_record(
            topic="t",
            queue_id=0,
            body=b"",
            properties=b"x" * 32768,
            queue_offset=0,
            physical_offset=0,
            born_timestamp=0,
            born_host=HostAddress.parse("::1", 1),
            store_timestamp=0,
            store_host=HostAddress.parse("::1", 1),
        )
    with pytest.raises(MessageTooLargeError, match="maxMessageSize 10"):
        encode_record(
            topic="t",
            queue_id=0,
            body=b"x" * 11,
            properties=b"",
            queue_offset=0,
            physical_offset=0,
            born_timestamp=0,
            born_host=HostAddress.parse("::1", 1),
            store_timestamp=0,
            store_host=HostAddress.parse("::1", 1),
            max_message_size=10,
        )


def _sample() -> bytes:
    return encode_record(
        topic="t",
        queue_id=0,
        body=b"payload",
        properties=b"",
        queue_offset=0,
        physical_offset=0,
        born_timestamp=1,
        born_host=HostAddress.parse("127.0.0.1", 1),
        store_timestamp=2,
        store_host=HostAddress.parse("127.0.0.1", 2),
    )


def test_corrupt_body_is_reported_with_offset():
    rec = bytearray(_sample())
    body_at = 88
    rec[body_at] ^= 0x01
    with pytest.raises(CorruptRecordError, match="CRC") as info:
        decode_record(bytes(rec), base_offset=1000)
    assert info.value.offset == 1000


def test_check_record_classifies_blank_end_invalid():
    blank = be(64, 4) + bytes.fromhex("CBD43194")
    assert check_record(blank + b"\0" * 56, 0, 0).size == RECORD_BLANK
    assert check_record(b"\0" * 64, 0, 0).size == RECORD_END
    rec = _sample()
    assert check_record(rec, 0, 0).size == len(rec)
    assert check_record(rec, 0, 8).size == RECORD_INVALID  # PHYSICALOFFSET disagrees
    assert check_record(rec[:-1], 0, 0).size == RECORD_INVALID


text = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
    max_size=20,
)


@settings(max_examples=200, deadline=None)
@given(
    body=st.binary(max_size=300),
    topic=st.from_regex(r"[%|a-zA-Z0-9_-]{1,200}", fullmatch=True),
    props=st.dictionaries(text.filter(bool), text, max_size=5),
    queue_id=st.integers(0, 2**31 - 1),
    qo=st.integers(0, 2**62),
    phy=st.integers(0, 2**62),
    v6=st.booleans(),
)
def test_any_message_round_trips(body, topic, props, queue_id, qo, phy, v6):
    host = HostAddress.parse("::1" if v6 else "127.0.0.1", 10911)
    rec = encode_record(
        topic=topic,
        queue_id=queue_id,
        body=body,
        properties=encode_properties(props),
        queue_offset=qo,
        physical_offset=phy,
        born_timestamp=5,
        born_host=host,
        store_timestamp=6,
        store_host=host,
    )
    msg = decode_record(rec)
    assert (msg.topic, msg.body, dict(msg.properties)) == (topic, body, props)
    assert (msg.queue_id, msg.queue_offset, msg.commitlog_offset) == (queue_id, qo, phy)
    assert check_record(rec, 0, phy).size == len(rec)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=400), st.integers(0, 50))
def test_random_bytes_only_raise_the_store_error(data, pos):
    try:
        decode_record(data, pos)
    except CorruptRecordError:
        pass
    check_record(data, pos, pos)  # never raises


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 6), st.integers(1, 255))
def test_any_flipped_body_byte_fails_the_crc(at, xor):
    rec = bytearray(_sample())
    rec[88 + at] ^= xor  # the 7-byte body starts right after the 88-byte header
    c = check_record(bytes(rec), 0, 0)
    assert c.size == RECORD_INVALID and "CRC" in c.reason

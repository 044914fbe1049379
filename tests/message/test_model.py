"""RocketMQ's vocabulary: Message and its checks, MessageExt, MessageQueue, TopicInfo,
SysFlag, system and retry / dead-letter topic names."""

from __future__ import annotations

import dataclasses

import pytest

from rocketspark.errors import InvalidMessageError
from rocketspark.message.model import (
    DLQ_GROUP_TOPIC_PREFIX,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    RETRY_GROUP_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    HostAddress,
    Message,
    MessageExt,
    MessageQueue,
    SysFlag,
    TopicInfo,
    TransactionState,
    check_int,
    dlq_topic,
    is_system_topic,
    message_body,
    normalise_keys,
    retry_topic,
    transaction_type,
    user_properties,
)

# --- Message ----------------------------------------------------------------------------


def test_a_message_normalises_its_fields():
    m = Message("t", "héllo", keys="a  b", properties={"p": "v"})
    assert m.body == "héllo".encode() and m.keys == ("a", "b")
    assert dict(m.properties) == {"p": "v"}
    assert Message("t", bytearray(b"x"), keys=["k"]).body == b"x"
    assert Message("t", memoryview(b"xy"), keys=None).keys == ()
    assert Message("t", b"x", keys=iter(["a", "b"])).keys == ("a", "b")
    assert Message("t", b"x", properties=[("a", "1")]).properties == {"a": "1"}
    assert Message("t", b"x", properties=None).properties == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.topic = "other"  # type: ignore[misc]


def test_a_messages_properties_are_a_copy_it_does_not_share():
    props = {"p": "v"}
    m = Message("t", b"x", properties=props)
    props["p"] = "changed"
    assert m.properties == {"p": "v"}
    with pytest.raises(TypeError):
        m.properties["q"] = "w"  # type: ignore[index]


def test_all_properties_add_tags_keys_and_delay_as_stored():
    m = Message("t", b"x", tags="TagA", keys=["k1", "k2"], delay_level=3, properties={"p": "v"})
    props = m.all_properties()
    assert props[PROPERTY_TAGS] == "TagA" and props[PROPERTY_KEYS] == "k1 k2"
    assert props[PROPERTY_DELAY_TIME_LEVEL] == "3" and props["p"] == "v"
    assert Message("t", b"x").all_properties() == {}


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"body": b""}, "body length is zero"),
        ({"body": None}, "body is null"),
        ({"body": 5}, "got int"),
        ({"body": "x\ud800"}, "str body"),
        ({"topic": 5}, "topic must be a string"),
        ({"keys": ["a b"]}, "without spaces"),
        ({"keys": [""]}, "without spaces"),
        ({"keys": 5}, "keys must be a string or an iterable"),
        ({"keys": b"ab"}, "keys must be a string or an iterable"),
        ({"keys": "a\x02"}, "separator"),
        ({"tags": "a\x01b"}, "separator"),
        ({"tags": 5}, "tags 5 must be a string"),
        ({"properties": {"TAGS": "x"}}, "TAGS"),
        ({"properties": {"": "v"}}, "must not be empty"),
        ({"properties": {"p": 5}}, "must be strings"),
        ({"properties": "p=v"}, "mapping or \\(name, value\\) pairs"),
        ({"flag": 1 << 31}, "flag"),
        ({"flag": "1"}, "flag must be an integer"),
        ({"delay_level": -1}, "delay_level"),
        ({"delay_level": True}, "delay_level must be an integer"),
        ({"reconsume_times": -1}, "reconsume_times"),
        ({"born_timestamp": -1}, "born_timestamp"),
        ({"born_timestamp": 2**63}, "born_timestamp"),
        ({"queue_id": "0"}, "queue_id must be an integer"),
        ({"sharding_key": 5}, "sharding_key must be a string"),
    ],
)
def test_a_message_refuses_bad_fields_when_made(fields, match):
    with pytest.raises(InvalidMessageError, match=match):
        Message(**{"topic": "t", "body": b"x", **fields})


def test_the_field_checks_on_their_own():
    assert message_body("ab") == b"ab" and message_body(bytearray(b"c")) == b"c"
    with pytest.raises(InvalidMessageError, match="^row 3: the message body length is zero"):
        message_body(b"", "row 3: ")
    assert check_int("flag", 7, 0, 10) == 7
    with pytest.raises(InvalidMessageError, match=r"flag 11 is outside \[0, 10\]"):
        check_int("flag", 11, 0, 10)
    assert user_properties({"a": "b"}) == {"a": "b"}
    with pytest.raises(InvalidMessageError, match="KEYS"):
        user_properties({"KEYS": "k"})
    assert normalise_keys("a b  c") == ("a", "b", "c") and normalise_keys(None) == ()
    assert normalise_keys(["x"]) == ("x",)


# --- MessageExt, HostAddress --------------------------------------------------------------


def _ext(**properties: str) -> MessageExt:
    host = HostAddress.parse("127.0.0.1", 10911)
    return MessageExt(
        topic="t",
        queue_id=1,
        queue_offset=2,
        commitlog_offset=3,
        msg_id="ID",
        body=b"b",
        properties=properties,
        born_timestamp=4,
        store_timestamp=5,
        born_host=host,
        store_host=host,
        reconsume_times=0,
        sys_flag=0,
        flag=0,
        body_crc=0,
        store_size=100,
    )


def test_message_ext_reads_tags_keys_uniq_key_and_delay_from_its_properties():
    m = _ext(
        **{
            PROPERTY_TAGS: "T",
            PROPERTY_KEYS: "a b",
            PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: "U1",
            PROPERTY_DELAY_TIME_LEVEL: "4",
        }
    )
    assert (m.tags, m.keys, m.uniq_key, m.delay_level) == ("T", ["a", "b"], "U1", 4)
    bare = _ext()
    assert (bare.tags, bare.keys, bare.uniq_key, bare.delay_level) == (None, [], None, 0)
    assert bare.prepared_transaction_offset == 0


def test_host_addresses_are_raw_ip_bytes_and_a_port():
    v4 = HostAddress.parse("10.0.0.7", 10911)
    assert v4.ip == bytes([10, 0, 0, 7]) and not v4.is_v6 and str(v4) == "10.0.0.7:10911"
    v6 = HostAddress.parse("::1", 7)
    assert len(v6.ip) == 16 and v6.is_v6 and str(v6) == "[::1]:7"
    assert HostAddress.parse("localhost", 1).ip == bytes([127, 0, 0, 1])


# --- queues, topics, flags, names ---------------------------------------------------------


def test_message_queues_are_ordered_hashable_values():
    a, b = MessageQueue("t", "broker-a", 1), MessageQueue("t", "broker-a", 0)
    assert sorted([a, b]) == [b, a] and str(a) == "t/broker-a/1"
    assert (
        a == MessageQueue("t", "broker-a", 1) and len({a, b, MessageQueue("t", "broker-a", 1)}) == 2
    )
    assert MessageQueue("s", "z", 9) < MessageQueue("t", "a", 0)


def test_topic_info_holds_queue_counts_and_permission():
    info = TopicInfo("t", read_queue_nums=4, write_queue_nums=2, perm=6, order=False)
    assert (info.read_queue_nums, info.write_queue_nums, info.perm) == (4, 2, 6)
    assert info == TopicInfo("t", 4, 2, 6, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.perm = 2  # type: ignore[misc]


def test_sys_flag_bits_are_rocketmqs_message_sys_flag():
    assert SysFlag.COMPRESSED == 0x1 and SysFlag.MULTI_TAGS == 0x2
    assert SysFlag.TRANSACTION_PREPARED == 0x4 and SysFlag.TRANSACTION_COMMIT == 0x8
    assert SysFlag.TRANSACTION_ROLLBACK == 0xC
    assert SysFlag.BORNHOST_V6 == 0x10 and SysFlag.STOREHOST_V6 == 0x20
    assert SysFlag.NEED_UNWRAP == 0x40 and SysFlag.INNER_BATCH == 0x80
    flags = SysFlag.TRANSACTION_PREPARED | SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6
    assert transaction_type(flags) == SysFlag.TRANSACTION_PREPARED
    assert transaction_type(SysFlag.TRANSACTION_ROLLBACK | SysFlag.MULTI_TAGS) == 0xC
    assert transaction_type(SysFlag.BORNHOST_V6) == 0


def test_retry_and_dead_letter_topics_are_named_after_the_group():
    assert retry_topic("g1") == "%RETRY%g1" == RETRY_GROUP_TOPIC_PREFIX + "g1"
    assert dlq_topic("g1") == "%DLQ%g1" == DLQ_GROUP_TOPIC_PREFIX + "g1"


def test_system_topics_are_rocketmqs_own():
    for name in (SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC, "TBW102", "rmq_sys_x"):
        assert is_system_topic(name), name
    for name in ("orders", retry_topic("g"), dlq_topic("g"), "RMQ_SYS"):
        assert not is_system_topic(name), name
    assert (
        SCHEDULE_TOPIC == "SCHEDULE_TOPIC_XXXX" and TRANS_HALF_TOPIC == "RMQ_SYS_TRANS_HALF_TOPIC"
    )


def test_transaction_states_carry_rocketmqs_wire_names():
    assert [s.value for s in TransactionState] == ["COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW"]

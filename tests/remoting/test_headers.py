"""Headers ↔ ext fields: wire names, Java's value spelling, v1 and v2 send headers.

``test_java_frames.py`` has RocketMQ parse and rewrite every header class here.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketspark.errors import RemotingFrameError
from rocketspark.remoting import headers
from rocketspark.remoting.command import RemotingCommand
from rocketspark.remoting.headers import (
    GetMaxOffsetRequestHeader,
    GetRouteInfoRequestHeader,
    Header,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    SendMessageRequestHeader,
    SendMessageRequestHeaderV2,
    UnregisterClientRequestHeader,
)
from tests.remoting.golden import GOLDEN

HEADER_CLASSES = [
    getattr(headers, name)
    for name in headers.__all__
    if name.endswith("Header") and name != "Header"
]

SEND = SendMessageRequestHeader(
    producer_group="pg",
    topic="TopicTest",
    queue_id=1,
    born_timestamp=1700000000123,
    properties="KEYS\x01k1\x02UNIQ_KEY\x01AB\x02",
    broker_name="broker-a",
)


def test_every_header_is_a_frozen_keyword_dataclass():
    assert len(HEADER_CLASSES) >= 30
    for cls in HEADER_CLASSES:
        assert issubclass(cls, Header) and dataclasses.is_dataclass(cls)
        assert cls.__dataclass_params__.frozen, cls  # type: ignore[attr-defined]


@pytest.mark.parametrize("cls", HEADER_CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_round_trip(cls, data):
    header = data.draw(st.builds(cls))
    ext = header.to_ext_fields()
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in ext.items())
    assert cls.from_ext_fields(ext) == header


def test_send_v2_matches_rocketmqs_frame_letter_for_letter():
    for name in ("send_v2_json", "send_v2_rocketmq"):
        cmd = RemotingCommand.decode(GOLDEN[name])
        assert SEND.to_v2().to_ext_fields() == dict(cmd.ext_fields)
        # and in Java's FastCodesHeader order, so the ROCKETMQ frame is Java's byte for byte
        assert list(SEND.to_v2().to_ext_fields()) == list(cmd.ext_fields)
        assert SendMessageRequestHeaderV2.from_ext_fields(cmd.ext_fields) == SEND.to_v2()


def test_send_v1_and_v2_names():
    v1 = SEND.to_ext_fields()
    assert v1["producerGroup"] == "pg" and v1["bname"] == "broker-a"
    assert v1["unitMode"] == "false" and v1["batch"] == "false"
    assert "maxReconsumeTimes" not in v1  # None is left out
    v2 = SEND.to_v2()
    assert isinstance(v2, SendMessageRequestHeaderV2) and v2.topic == "TopicTest"
    assert "l" not in v2.to_ext_fields()
    assert dataclasses.replace(v2, max_reconsume_times=16).to_ext_fields()["l"] == "16"
    assert v2.to_v1() == SEND and type(v2.to_v1()) is SendMessageRequestHeader
    assert SendMessageRequestHeader.from_ext_fields(v1) == SEND


def test_declared_wire_names():
    assert UnregisterClientRequestHeader(client_id="c").to_ext_fields() == {"clientID": "c"}
    pull = PullMessageRequestHeader(
        consumer_group="g",
        topic="t",
        queue_id=0,
        queue_offset=5,
        max_msg_nums=32,
        sys_flag=7,
        commit_offset=0,
        suspend_timeout_millis=20000,
        sub_version=0,
        broker_name="b",
        proxy_forward_client_id="p",
    ).to_ext_fields()
    assert pull["bname"] == "b" and pull["proxyFrowardClientId"] == "p"
    assert pull["suspendTimeoutMillis"] == "20000" and "subscription" not in pull


def test_booleans_as_java_writes_and_reads_them():
    assert GetRouteInfoRequestHeader(topic="t").to_ext_fields() == {
        "topic": "t",
        "acceptStandardJsonOnly": "true",
    }
    assert GetMaxOffsetRequestHeader(topic="t", queue_id=1).to_ext_fields()["committed"] == "true"
    parse = GetMaxOffsetRequestHeader.from_ext_fields
    assert parse({"topic": "t", "queueId": "1", "committed": "TRUE"}).committed is True
    assert parse({"topic": "t", "queueId": "1", "committed": "yes"}).committed is False
    assert parse({"topic": "t", "queueId": "1"}).committed is True  # the default


def test_parsing_errors_name_the_header_and_field():
    with pytest.raises(RemotingFrameError, match="PullMessageResponseHeader: field 'minOffset'"):
        PullMessageResponseHeader.from_ext_fields(
            {"suggestWhichBrokerId": "0", "nextBeginOffset": "1", "maxOffset": "2"}
        )
    with pytest.raises(RemotingFrameError, match="'nextBeginOffset' is 'x', not a number"):
        PullMessageResponseHeader.from_ext_fields(
            {
                "suggestWhichBrokerId": "0",
                "nextBeginOffset": "x",
                "minOffset": "0",
                "maxOffset": "2",
            }
        )


def test_unknown_keys_are_ignored():
    got = PullMessageResponseHeader.from_ext_fields(
        {
            "suggestWhichBrokerId": "0",
            "nextBeginOffset": "12",
            "minOffset": "0",
            "maxOffset": "12",
            "somethingNew": "1",
        }
    )
    assert got.next_begin_offset == 12 and got.offset_delta is None


def test_a_field_type_outside_the_wire_types_is_refused():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Odd(Header):
        ratio: float

    with pytest.raises(TypeError, match="Odd.ratio"):
        Odd(ratio=1.0).to_ext_fields()

"""Send frames made from a template are the general encoder's bytes, letter for letter."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketspark.errors import RemotingFrameError
from rocketspark.message.model import MessageQueue
from rocketspark.remoting.codes import RequestCode
from rocketspark.remoting.command import MAX_FRAME_SIZE, RemotingCommand
from rocketspark.remoting.headers import SendMessageRequestHeader
from rocketspark.remoting.template import NUMBER_MARKS, SendFrames

TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
INT32 = st.integers(-(1 << 31), (1 << 31) - 1)


def _general(code: int, header: SendMessageRequestHeader, body: bytes, opaque: int) -> list[bytes]:
    cmd = RemotingCommand.request(code, header.to_v2().to_ext_fields(), body=body)
    return [bytes(b) for b in dataclasses.replace(cmd, opaque=opaque).encode()]


@settings(max_examples=300, deadline=None)
@given(
    mq=st.builds(MessageQueue, TEXT, TEXT, st.integers(0, 1 << 20)),
    group=TEXT,
    batch=st.booleans(),
    reconsume=st.none() | st.integers(0, (1 << 31) - 1),
    sys_flag=INT32,
    born=st.integers(0, (1 << 63) - 1),
    flag=INT32,
    properties=TEXT,
    body=st.binary(max_size=64),
    opaque=st.integers(0, (1 << 31) - 1),
)
def test_a_template_frame_is_the_general_encoders(
    mq, group, batch, reconsume, sys_flag, born, flag, properties, body, opaque
):
    code = RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2

    def header(**values) -> SendMessageRequestHeader:
        return SendMessageRequestHeader(
            producer_group=group,
            topic=mq.topic,
            queue_id=mq.queue_id,
            born_timestamp=values.get("born", 0),
            sys_flag=values.get("sys_flag", 0),
            flag=values.get("flag", 0),
            properties=values.get("properties", ""),
            reconsume_times=values.get("reconsume", 0 if reconsume is not None else None),
            max_reconsume_times=None,
            batch=batch,
            broker_name=mq.broker,
        )

    frames = SendFrames.of(code, header().to_v2())
    if frames is None:  # a marker in the topic or group: the general encoder then
        return
    made = frames.frame(body, sys_flag, born, flag, properties, reconsume, opaque)
    want = _general(
        code,
        header(sys_flag=sys_flag, born=born, flag=flag, properties=properties, reconsume=reconsume),
        body,
        opaque,
    )
    assert [bytes(b) for b in made] == want


def test_the_common_send_is_cut_into_its_template():
    header = SendMessageRequestHeader(
        producer_group="rocketspark-producer",
        topic="TopicTest",
        queue_id=3,
        born_timestamp=0,
        properties="",
        reconsume_times=None,
        broker_name="broker-a",
    )
    frames = SendFrames.of(RequestCode.SEND_MESSAGE_V2, header.to_v2())
    assert frames is not None
    made = frames.frame(b"hello", 0, 1700000000123, 0, "TAGS\x01t\x02UNIQ_KEY\x01AB\x02", None, 7)
    want = _general(
        RequestCode.SEND_MESSAGE_V2,
        dataclasses.replace(
            header, born_timestamp=1700000000123, properties="TAGS\x01t\x02UNIQ_KEY\x01AB\x02"
        ),
        b"hello",
        7,
    )
    assert made == want
    assert b'"i":"TAGS\\u0001t\\u0002UNIQ_KEY\\u0001AB\\u0002"' in made[0]


def test_a_header_holding_a_marker_is_left_to_the_general_encoder():
    header = SendMessageRequestHeader(
        producer_group="g",
        topic=f"t{NUMBER_MARKS[1]}",
        queue_id=0,
        born_timestamp=0,
        broker_name="b",
    )
    assert SendFrames.of(RequestCode.SEND_MESSAGE_V2, header.to_v2()) is None


def test_a_template_frame_over_the_limit_is_refused_as_the_general_encoders():
    header = SendMessageRequestHeader(
        producer_group="g",
        topic="t",
        queue_id=0,
        born_timestamp=0,
        reconsume_times=None,
        broker_name="b",
    )
    frames = SendFrames.of(RequestCode.SEND_MESSAGE_V2, header.to_v2())
    assert frames is not None
    body = b"x" * (MAX_FRAME_SIZE - 200)
    with pytest.raises(RemotingFrameError, match="more than the 16777216"):
        frames.frame(body, 0, 0, 0, "p" * 400, None, 1)
    with pytest.raises(RemotingFrameError, match="more than the 16777216"):
        RemotingCommand.request(
            RequestCode.SEND_MESSAGE_V2,
            dataclasses.replace(header, properties="p" * 400).to_v2().to_ext_fields(),
            body=body,
        ).encode()

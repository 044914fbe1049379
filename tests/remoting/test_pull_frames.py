"""Pull frames made from a template are the general encoder's bytes, number for number."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketspark.message.model import MessageQueue
from rocketspark.remoting.client import _pull_header
from rocketspark.remoting.codes import RequestCode
from rocketspark.remoting.command import RemotingCommand
from rocketspark.remoting.template import PullFrames


def _general(header, opaque: int) -> bytes:
    cmd = RemotingCommand.request(RequestCode.PULL_MESSAGE, header.to_ext_fields())
    return dataclasses.replace(cmd, opaque=opaque).to_bytes()


@pytest.mark.parametrize(
    ("topic", "group", "expression"),
    [
        ("orders", "g", "*"),
        ("%d%s 100%", "grüppe ✓", 'a || "b" || c\\d'),
        ("t", "8070605040302010001", "7391846205"),  # a group spelled like a marker number
    ],
)
@settings(max_examples=50, deadline=None)
@given(
    offset=st.integers(0, 2**63 - 1),
    nums=st.integers(1, 2**31 - 1),
    opaque=st.integers(0, 2**31 - 1),
)
def test_a_templated_pull_frame_is_the_general_encoders(
    topic, group, expression, offset, nums, opaque
):
    mq = MessageQueue(topic, "broker-a", 3)
    frames = PullFrames.of(_pull_header(mq, 0, 32, group, expression, 0, None))
    header = _pull_header(mq, offset, nums, group, expression, 0, None)
    if frames is None:  # only when a marker number is spelled in the header
        assert "8070605040302010001" in group or "7391846205" in expression
        return
    assert b"".join(frames.frame(offset, nums, opaque)) == _general(header, opaque)

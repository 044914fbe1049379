"""The frame codec: RocketMQ's golden frames, round trips, and every way a frame can be wrong.

The golden frames (``data/golden_frames.txt``) are RocketMQ 5.3.1's own
``RemotingCommand``'s; ``test_java_frames.py`` regenerates them with the Java
program kept there and checks they are unchanged, and has Java decode ours.
"""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketspark.errors import RemotingFrameError, RocketSparkError
from rocketspark.remoting.codes import (
    MQ_VERSION,
    LanguageCode,
    RequestCode,
    ResponseCode,
    RpcFlag,
    SerializeType,
)
from rocketspark.remoting.command import (
    MAX_FRAME_SIZE,
    RemotingCommand,
    decode_payload,
    frame_length,
)
from tests.remoting.golden import GOLDEN

BOTH = [SerializeType.JSON, SerializeType.ROCKETMQ]


def t(serialize_type: SerializeType) -> str:
    return serialize_type.name.lower()


# --- RocketMQ's frames -----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_frame_decodes_and_encodes_to_the_same_bytes(name):
    frame = GOLDEN[name]
    cmd = RemotingCommand.decode(frame)
    assert cmd.serialize_type == (SerializeType.JSON if name.endswith("json") else 1)
    assert cmd.version == 475
    assert cmd.to_bytes() == frame


@pytest.mark.parametrize("st_", BOTH, ids=t)
def test_golden_route_request(st_):
    cmd = RemotingCommand.decode(GOLDEN[f"route_{t(st_)}"])
    assert (cmd.code, cmd.language, cmd.opaque, cmd.flag) == (105, LanguageCode.JAVA, 7, 0)
    assert dict(cmd.ext_fields) == {"topic": "TopicTest", "acceptStandardJsonOnly": "true"}
    assert cmd.remark is None and cmd.body is None
    assert not cmd.is_response and not cmd.is_oneway
    # Our own request, with the same fields in Java's order, is byte for byte Java's
    ours = RemotingCommand(
        RequestCode.GET_ROUTEINFO_BY_TOPIC,
        language=LanguageCode.JAVA,
        version=475,
        opaque=7,
        ext_fields={"topic": "TopicTest", "acceptStandardJsonOnly": "true"},
        serialize_type=st_,
    )
    assert ours.to_bytes() == GOLDEN[f"route_{t(st_)}"]


@pytest.mark.parametrize("st_", BOTH, ids=t)
def test_golden_send_v2_request_keeps_its_body_as_a_view(st_):
    frame = GOLDEN[f"send_v2_{t(st_)}"]
    cmd = RemotingCommand.decode(frame)
    assert cmd.code == RequestCode.SEND_MESSAGE_V2
    assert isinstance(cmd.body, memoryview)
    assert bytes(cmd.body) == "héllo body".encode()
    assert cmd.body.obj is frame  # a slice of the frame, not a copy
    assert cmd.ext_fields["i"] == "KEYS\x01k1\x02UNIQ_KEY\x01AB\x02"
    assert cmd.ext_fields["n"] == "broker-a"


@pytest.mark.parametrize("st_", BOTH, ids=t)
def test_golden_responses(st_):
    pull = RemotingCommand.decode(GOLDEN[f"pull_answer_{t(st_)}"])
    assert pull.is_response and pull.code == ResponseCode.SUCCESS and pull.opaque == 9
    assert pull.remark is None
    assert dict(pull.ext_fields) == {
        "suggestWhichBrokerId": "0",
        "nextBeginOffset": "12",
        "minOffset": "0",
        "maxOffset": "12",
    }
    assert bytes(pull.body) == b"\x01\x02\x03\x04\x05"
    error = RemotingCommand.decode(GOLDEN[f"error_{t(st_)}"])
    assert error.is_response and error.code == ResponseCode.TOPIC_NOT_EXIST
    assert error.remark == "topic 订单 not exist"
    assert dict(error.ext_fields) == {} and error.body is None
    assert error.code_name == "TOPIC_NOT_EXIST"


def test_golden_oneway_and_the_empty_remark():
    json_cmd = RemotingCommand.decode(GOLDEN["oneway_json"])
    binary = RemotingCommand.decode(GOLDEN["oneway_rocketmq"])
    for cmd in (json_cmd, binary):
        assert cmd.is_oneway and not cmd.is_response and cmd.flag == RpcFlag.ONEWAY
        assert cmd.language == LanguageCode.PYTHON
        assert bytes(cmd.body) == b"{}"
    # Java writes an empty remark as length 0 in a ROCKETMQ header and reads it back as null;
    # a JSON header keeps "".
    assert json_cmd.remark == ""
    assert binary.remark is None


def test_the_frame_layout():
    cmd = RemotingCommand(RequestCode.HEART_BEAT, body=b"xyz", serialize_type=1)
    head, body = cmd.encode()
    assert body == b"xyz"
    length, marker = struct.unpack_from(">ii", head)
    assert length == len(head) - 4 + 3
    assert marker >> 24 == SerializeType.ROCKETMQ and marker & 0xFFFFFF == len(head) - 8
    code, language, version, opaque, flag = struct.unpack_from(">hBhii", head, 8)
    assert (code, language, version, opaque, flag) == (34, 3, MQ_VERSION, 0, 0)


def test_encode_hands_the_body_over_uncopied():
    body = bytearray(b"b" * 1000)
    parts = RemotingCommand(RequestCode.SEND_MESSAGE_V2, body=memoryview(body)).encode()
    assert len(parts) == 2 and parts[1].obj is body  # type: ignore[union-attr]
    assert RemotingCommand(RequestCode.HEART_BEAT, body=b"").encode().__len__() == 1


def test_json_header_is_fastjsons():
    cmd = RemotingCommand(
        RequestCode.PULL_MESSAGE,
        opaque=3,
        remark="r",
        ext_fields={"topic": "订单", "x": 'a"b\\c\n\x01'},
    )
    header = cmd.to_bytes()[8:]
    assert header.decode() == (
        '{"code":11,"extFields":{"topic":"订单","x":"a\\"b\\\\c\\n\\u0001"},"flag":0,'
        '"language":"PYTHON","opaque":3,"remark":"r","serializeTypeCurrentRPC":"JSON",'
        f'"version":{MQ_VERSION}}}'
    )


# --- round trips -----------------------------------------------------------------------

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
i32 = st.integers(-(2**31), 2**31 - 1)
i16 = st.integers(-(2**15), 2**15 - 1)


@st.composite
def commands(draw):
    serialize_type = draw(st.sampled_from(BOTH))
    binary = serialize_type == SerializeType.ROCKETMQ
    remark = draw(st.none() | text)
    if binary and remark == "":
        remark = None  # see test_golden_oneway_and_the_empty_remark
    return RemotingCommand(
        code=draw(i16 if binary else i32),
        language=draw(st.sampled_from(list(LanguageCode))),
        version=draw(i16 if binary else i32),
        opaque=draw(i32),
        flag=draw(i32),
        remark=remark,
        ext_fields=draw(st.dictionaries(text, text, max_size=8)),
        body=draw(st.none() | st.binary(min_size=1, max_size=300)),
        serialize_type=serialize_type,
    )


@settings(max_examples=300, deadline=None)
@given(commands())
def test_decode_encode_round_trip(cmd):
    frame = cmd.to_bytes()
    again = RemotingCommand.decode(frame)
    assert again == cmd
    assert again.to_bytes() == frame
    assert RemotingCommand.decode(bytearray(frame)) == cmd


@settings(max_examples=200, deadline=None)
@given(commands(), st.integers(0, 10_000))
def test_no_prefix_of_a_frame_decodes(cmd, cut):
    frame = cmd.to_bytes()
    cut %= len(frame)
    with pytest.raises(RemotingFrameError):
        RemotingCommand.decode(frame[:cut])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.sampled_from([0, 1, 2, 255]))
def test_garbage_raises_the_frame_error_or_decodes(garbage, kind):
    payload = struct.pack(">I", kind << 24 | len(garbage)) + garbage
    try:
        decode_payload(payload)
    except RemotingFrameError:
        pass  # anything else escaping is a bug


# --- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "length, message",
    [
        (-1, "too small"),
        (3, "too small"),
        (MAX_FRAME_SIZE - 3, "beyond the limit"),
        (2**31 - 1, "beyond the limit"),
    ],
)
def test_frame_length_limits(length, message):
    with pytest.raises(RemotingFrameError, match=message):
        frame_length(struct.pack(">i", length))


def test_frame_length_accepts_up_to_16_mib_with_the_length_field():
    assert frame_length(struct.pack(">i", MAX_FRAME_SIZE - 4)) == MAX_FRAME_SIZE - 4
    assert frame_length(struct.pack(">i", 4)) == 4


def test_a_frame_that_would_be_too_large_is_refused():
    cmd = RemotingCommand(RequestCode.SEND_MESSAGE_V2, body=memoryview(bytearray(MAX_FRAME_SIZE)))
    with pytest.raises(RemotingFrameError, match="more than the 16777216"):
        cmd.encode()


def test_frame_length_disagreeing_with_the_frame():
    frame = GOLDEN["route_json"]
    with pytest.raises(RemotingFrameError, match="LENGTH says"):
        RemotingCommand.decode(frame + b"x")
    with pytest.raises(RemotingFrameError, match="LENGTH says"):
        RemotingCommand.decode(frame[:-1])
    with pytest.raises(RemotingFrameError, match="no LENGTH"):
        RemotingCommand.decode(b"\x00\x00")


def test_header_length_beyond_the_frame():
    payload = struct.pack(">i", 50) + b"{}"
    with pytest.raises(RemotingFrameError, match="header length 50 runs beyond the frame"):
        decode_payload(payload)
    with pytest.raises(RemotingFrameError, match="no header length"):
        decode_payload(b"\x00")


def test_unknown_serialize_type():
    payload = struct.pack(">i", 2 << 24 | 2) + b"{}"
    with pytest.raises(RemotingFrameError, match="unknown serialize type 2"):
        decode_payload(payload)


@pytest.mark.parametrize(
    "header, message",
    [
        (b"{", "does not parse"),
        (b"\xff{}", "does not parse"),
        (b'{"remark":"\xff"}', "does not parse"),
        (b"[1]", "is a list, not an object"),
        (b'{"code":"x"}', "malformed"),
        (b'{"code":true}', "malformed"),
        (b'{"extFields":[1]}', "malformed"),
        (b'{"extFields":{"a":[1]}}', "malformed"),
        (b'{"language":[]}', "malformed"),
    ],
)
def test_malformed_json_header(header, message):
    with pytest.raises(RemotingFrameError, match=message):
        decode_payload(struct.pack(">i", len(header)) + header)


def test_json_header_decode_is_lenient_like_fastjson():
    header = json.dumps(
        {
            "code": "17",
            "language": "NOT_A_LANGUAGE",
            "extFields": {"a": 1, "b": True, "c": None, "d": "x"},
            "unknownField": 1,
        }
    ).encode()
    cmd = decode_payload(struct.pack(">i", len(header)) + header)
    assert cmd.code == 17 and cmd.language == LanguageCode.OTHER
    assert (cmd.version, cmd.opaque, cmd.flag, cmd.remark) == (0, 0, 0, None)
    assert dict(cmd.ext_fields) == {"a": "1", "b": "true", "d": "x"}
    bare = decode_payload(struct.pack(">i", 2) + b"{}")
    assert bare.code == 0 and bare.language == LanguageCode.JAVA and dict(bare.ext_fields) == {}
    numbered = decode_payload(struct.pack(">i", 14) + b'{"language":3}')
    assert numbered.language == LanguageCode.PYTHON
    wide = '{"code":12,"extFields":{"a":"é"}}'.encode("utf-16-le")  # as json.loads reads
    utf16 = decode_payload(struct.pack(">i", len(wide)) + wide)
    assert utf16.code == 12 and dict(utf16.ext_fields) == {"a": "é"}


def binary_payload(header: bytes) -> bytes:
    return struct.pack(">i", 1 << 24 | len(header)) + header


FIXED = struct.pack(">hBhii", 10, 0, 475, 1, 0)


@pytest.mark.parametrize(
    "header, message",
    [
        (FIXED[:5], "truncated"),
        (FIXED, "truncated"),
        (FIXED + struct.pack(">i", 10) + b"abc", "remark length 10 runs beyond"),
        (FIXED + struct.pack(">i", -2) + b"abc", "remark length -2 runs beyond"),
        (FIXED + struct.pack(">ii", 0, 100), "extFields length 100 runs beyond"),
        (FIXED + struct.pack(">ii", 0, -1), "extFields length -1"),
        (FIXED + struct.pack(">iih", 0, 2, -1), "key length -1"),
        (FIXED + struct.pack(">iih", 0, 3, 5) + b"a", "key length 5"),
        (FIXED + struct.pack(">iih", 0, 7, 1) + b"a" + struct.pack(">i", 9), "value length 9"),
        (FIXED + struct.pack(">iih", 0, 6, 1) + b"a" + b"\0\0\0", "truncated"),
        (FIXED + struct.pack(">i", 1) + b"\xff" + struct.pack(">i", 0), "not UTF-8"),
    ],
)
def test_malformed_binary_header(header, message):
    with pytest.raises(RemotingFrameError, match=message):
        decode_payload(binary_payload(header))


def test_binary_header_ignores_trailing_bytes_as_java_does():
    header = FIXED + struct.pack(">ii", 0, 0) + b"junk"
    assert decode_payload(binary_payload(header)).code == 10


def test_fields_that_do_not_fit_a_header_are_refused():
    with pytest.raises(RemotingFrameError, match="i16"):
        RemotingCommand(200050, serialize_type=SerializeType.ROCKETMQ).encode()
    with pytest.raises(RemotingFrameError, match="u8"):
        RemotingCommand(10, language=300, serialize_type=SerializeType.ROCKETMQ).encode()
    with pytest.raises(RemotingFrameError, match="no name"):
        RemotingCommand(10, language=99).encode()
    assert RemotingCommand(200050).encode()  # a JSON header holds any int


def test_frame_errors_belong_to_the_hierarchy():
    assert issubclass(RemotingFrameError, RocketSparkError)
    assert not RemotingFrameError.retriable


# --- the value -------------------------------------------------------------------------


def test_request_and_response_to():
    request = RemotingCommand.request(
        RequestCode.GET_MAX_OFFSET,
        {"topic": "t", "queueId": "0"},
        oneway=True,
        serialize_type=SerializeType.ROCKETMQ,
    )
    assert request.is_oneway and not request.is_response
    assert request.language == LanguageCode.PYTHON and request.version == MQ_VERSION
    request = request.with_opaque(42)
    response = RemotingCommand.response_to(
        request, ResponseCode.SUCCESS, ext_fields={"offset": "9"}
    )
    assert response.is_response and response.opaque == 42
    assert response.serialize_type == SerializeType.ROCKETMQ
    assert response.code_name == "SUCCESS" and request.code_name == "GET_MAX_OFFSET"
    assert RemotingCommand(99999).code_name == "99999"


def test_repr_hides_secrets_and_bodies():
    cmd = RemotingCommand(
        RequestCode.PULL_MESSAGE,
        ext_fields={"AccessKey": "ak", "Signature": "s3cr3t", "SecretKey": "k3y", "topic": "t"},
        body=b"payload-bytes",
    )
    text = repr(cmd)
    assert "s3cr3t" not in text and "k3y" not in text and "payload-bytes" not in text
    assert "'ak'" in text and "'t'" in text and "<13 bytes>" in text and "PULL_MESSAGE" in text


def _dumps_header(cmd: RemotingCommand) -> bytes:
    """The JSON header as json.dumps writes it (fastjson's order), the reference."""
    header: dict[str, object] = {"code": cmd.code}
    if cmd.ext_fields:
        header["extFields"] = dict(cmd.ext_fields)
    header["flag"] = cmd.flag
    header["language"] = LanguageCode(cmd.language).name
    header["opaque"] = cmd.opaque
    if cmd.remark is not None:
        header["remark"] = cmd.remark
    header["serializeTypeCurrentRPC"] = "JSON"
    header["version"] = cmd.version
    return json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


_TEXT = st.text(st.characters(codec="utf-8") | st.sampled_from('"\\\x00\x1f\x7f\u2028/'))


@settings(max_examples=300, deadline=None)
@given(
    fields=st.dictionaries(_TEXT, _TEXT, max_size=5),
    remark=st.none() | _TEXT,
    code=st.integers(-(2**15), 2**15 - 1),
    opaque=st.integers(-(2**31), 2**31 - 1),
)
def test_the_json_header_is_what_json_dumps_writes(
    fields: dict[str, str], remark: str | None, code: int, opaque: int
) -> None:
    """The hand-written JSON header (texts without escapes copied as they are) has the
    bytes json.dumps gives, for any texts: quotes, backslashes, controls, non-ASCII."""
    cmd = RemotingCommand(code=code, ext_fields=fields, remark=remark, opaque=opaque)
    frame = cmd.to_bytes()
    (header_length,) = struct.unpack_from(">i", frame, 4)
    assert frame[8 : 8 + (header_length & 0xFFFFFF)] == _dumps_header(cmd)


def test_a_batch_answer_s_message_ids_are_written_as_they_are() -> None:
    ids = ",".join(f"0A01020300002A9F{i:016X}" for i in range(1024))
    cmd = RemotingCommand(code=0, ext_fields={"msgId": ids, "queueId": "1"}, opaque=7)
    frame = cmd.to_bytes()
    (header_length,) = struct.unpack_from(">i", frame, 4)
    assert frame[8 : 8 + (header_length & 0xFFFFFF)] == _dumps_header(cmd)


@pytest.mark.parametrize(
    "fields",
    [{"n": 5}, {7: "seven"}, {"list": [1, "a"]}, {"f": 1.5, "none": None}],
)
def test_fields_of_other_types_than_text_are_written_as_json_dumps_writes_them(
    fields: dict[str, str],
) -> None:
    cmd = RemotingCommand(code=ResponseCode.SUCCESS, ext_fields=fields, opaque=3)
    frame = cmd.to_bytes()
    (header_length,) = struct.unpack_from(">i", frame, 4)
    assert frame[8 : 8 + (header_length & 0xFFFFFF)] == _dumps_header(cmd)

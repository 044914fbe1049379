"""RemotingCommand: the one message of RocketMQ's TCP protocol, and its frame, byte for byte.

Grammar of one frame (big-endian; Apache RocketMQ ``RemotingCommand.encode`` and
``NettyDecoder``; see spec/rocketmq-remoting.md)::

    frame       := LENGTH:i32 PAYLOAD                 LENGTH = len(PAYLOAD); 4 + LENGTH <= 16 MiB
    PAYLOAD     := MARKER:i32 HEADER BODY             MARKER = SERIALIZE_TYPE << 24 | len(HEADER)
    HEADER      := json | rocketmq                    (SERIALIZE_TYPE 0 | 1)
    json        := UTF-8 JSON object {"code", "extFields", "flag", "language", "opaque",
                   "remark", "serializeTypeCurrentRPC", "version"}   (fastjson: keys sorted,
                   compact, language and serialize type by enum name, null fields left out)
    rocketmq    := CODE:i16 LANGUAGE:u8 VERSION:i16 OPAQUE:i32 FLAG:i32
                   REMARKLENGTH:i32 REMARK EXTLENGTH:i32 (KEYLENGTH:i16 KEY VALUELENGTH:i32 VALUE)*
    BODY        := the rest of PAYLOAD (may be empty)

Strings are UTF-8. A ROCKETMQ header writes a null or empty remark as length 0
and reads length 0 back as null; a JSON header keeps an empty remark. ``flag``
bit 0 marks a response, bit 1 a one-way request; a response carries its
request's ``opaque``.

Decoding takes a ``memoryview`` of the payload and gives the body as a slice of
it (no copy); encoding returns the frame as a list of buffers with the body as
given, for ``socket.sendmsg``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rocketspark.errors import RemotingFrameError
from rocketspark.remoting.codes import (
    MQ_VERSION,
    LanguageCode,
    RpcFlag,
    SerializeType,
    request_name,
    response_name,
)

__all__ = [
    "IOV_MAX",
    "MAX_FRAME_SIZE",
    "Body",
    "RemotingCommand",
    "decode_payload",
    "drop_sent",
    "frame_length",
]

# NettyDecoder's FRAME_MAX_LENGTH: the whole frame, the LENGTH field included.
MAX_FRAME_SIZE = 16 * 1024 * 1024
MAX_HEADER_LENGTH = 0xFFFFFF  # 24 bits of MARKER
# The most buffers one sendmsg / writev takes (the kernel's iovec limit, 1024 on Linux).
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024

LENGTH = struct.Struct(">i")
PREFIX = struct.Struct(
    ">i"  # LENGTH
    "i"  # MARKER: serialize type << 24 | header length
)
MARKER = struct.Struct(">i")
BINARY_FIXED = struct.Struct(
    ">h"  # CODE
    "B"  # LANGUAGE
    "h"  # VERSION
    "i"  # OPAQUE
    "i"  # FLAG
)
INT = struct.Struct(">i")
SHORT = struct.Struct(">h")
PAYLOAD_OFFSET = LENGTH.size
HEADER_OFFSET = MARKER.size  # within the payload

# ext field keys whose values are never shown by repr (ACL signatures and the like).
_SECRET_KEY_PARTS = ("signature", "secret", "password", "token")
_LANGUAGES = frozenset(LanguageCode)

# A body as given to a command (sent without a copy) or as decoded (a view of the frame).
Body = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True, repr=False)
class RemotingCommand:
    """One request or response of the remoting protocol.

    ``ext_fields`` are the header's string fields (a request header's fields, see
    :mod:`rocketspark.remoting.headers`); ``body`` is the payload after the
    header, ``None`` when empty. ``serialize_type`` chooses how :meth:`encode`
    writes the header (a decoded command keeps the type it arrived in).
    ``opaque`` matches a response to its request: the connection sets it.
    """

    code: int
    language: int = LanguageCode.PYTHON
    version: int = MQ_VERSION
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: Mapping[str, str] = field(default_factory=dict)
    body: Body | None = None
    serialize_type: SerializeType = SerializeType.JSON

    def __post_init__(self) -> None:
        if self.body is not None and len(self.body) == 0:
            object.__setattr__(self, "body", None)

    @classmethod
    def request(
        cls,
        code: int,
        ext_fields: Mapping[str, str] | None = None,
        *,
        body: Body | None = None,
        oneway: bool = False,
        serialize_type: SerializeType = SerializeType.JSON,
    ) -> RemotingCommand:
        """Return a request; ``ext_fields`` usually comes from a header's ``to_ext_fields()``."""
        return cls(
            code,
            flag=RpcFlag.ONEWAY if oneway else 0,
            ext_fields=dict(ext_fields or {}),
            body=body,
            serialize_type=serialize_type,
        )

    @classmethod
    def response_to(
        cls,
        request: RemotingCommand,
        code: int,
        remark: str | None = None,
        ext_fields: Mapping[str, str] | None = None,
        *,
        body: Body | None = None,
    ) -> RemotingCommand:
        """Return the response to ``request``: its opaque, the response bit, its serialize type."""
        return cls(
            code,
            opaque=request.opaque,
            flag=RpcFlag.RESPONSE,
            remark=remark,
            ext_fields=dict(ext_fields or {}),
            body=body,
            serialize_type=request.serialize_type,
        )

    @property
    def is_response(self) -> bool:
        """Whether the response bit of ``flag`` is set."""
        return bool(self.flag & RpcFlag.RESPONSE)

    @property
    def is_oneway(self) -> bool:
        """Whether the one-way bit of ``flag`` is set: the sender waits for no response."""
        return bool(self.flag & RpcFlag.ONEWAY)

    @property
    def code_name(self) -> str:
        """RocketMQ's name of ``code``: a request code's, or a response code's for a response."""
        return response_name(self.code) if self.is_response else request_name(self.code)

    def with_opaque(self, opaque: int) -> RemotingCommand:
        """Return this command with ``opaque`` replaced."""
        return dataclasses.replace(self, opaque=opaque)

    def encode(self) -> list[Body]:
        """Return the frame as buffers to send in order: prefix and header, then the body.

        The body is not copied. Raises RemotingFrameError when the frame would
        exceed 16 MiB, or a field does not fit its header (a ROCKETMQ header
        has 16 bits for the code and the version).
        """
        header = _encode_header(self)
        body = self.body
        body_length = len(body) if body is not None else 0
        if len(header) > MAX_HEADER_LENGTH:
            raise RemotingFrameError(
                f"header of {self.code_name} is {len(header)} bytes, "
                f"more than the {MAX_HEADER_LENGTH} a frame can carry"
            )
        length = HEADER_OFFSET + len(header) + body_length
        if PAYLOAD_OFFSET + length > MAX_FRAME_SIZE:
            raise RemotingFrameError(
                f"frame of {self.code_name} would be {PAYLOAD_OFFSET + length} bytes, "
                f"more than the {MAX_FRAME_SIZE} a RocketMQ server accepts"
            )
        head = PREFIX.pack(length, (int(self.serialize_type) << 24) | len(header)) + header
        return [head, body] if body is not None and body_length else [head]

    def to_bytes(self) -> bytes:
        """Return the frame as one bytes object (a copy of the body: for tests and small frames)."""
        return b"".join(self.encode())

    @classmethod
    def decode(cls, frame: Body) -> RemotingCommand:
        """Decode one whole frame, LENGTH field included; the body is a view into ``frame``.

        Raises RemotingFrameError when LENGTH disagrees with the frame's size or
        the payload is malformed (see :func:`decode_payload`).
        """
        view = memoryview(frame).cast("B")
        if len(view) < PAYLOAD_OFFSET:
            raise RemotingFrameError(f"frame of {len(view)} bytes has no LENGTH field")
        length = frame_length(view[:PAYLOAD_OFFSET])
        if length != len(view) - PAYLOAD_OFFSET:
            raise RemotingFrameError(
                f"frame LENGTH says {length} bytes follow, but {len(view) - PAYLOAD_OFFSET} do"
            )
        return decode_payload(view[PAYLOAD_OFFSET:])

    def __repr__(self) -> str:
        kind = "response" if self.is_response else "request"
        fields = ", ".join(
            f"{key}={'***' if _is_secret(key) else repr(value)}"
            for key, value in self.ext_fields.items()
        )
        body = "None" if self.body is None else f"<{len(self.body)} bytes>"
        return (
            f"RemotingCommand({kind} {self.code_name}, code={self.code}, opaque={self.opaque}, "
            f"flag={self.flag}, language={_language_name(self.language)}, "
            f"version={self.version}, remark={self.remark!r}, ext_fields={{{fields}}}, "
            f"body={body}, serialize_type={self.serialize_type.name})"
        )


def _is_secret(key: str) -> bool:
    lowered = key.lower()
    return any(part in lowered for part in _SECRET_KEY_PARTS)


def _language_name(language: int) -> str:
    try:
        return LanguageCode(language).name
    except ValueError:
        return str(language)


def drop_sent(views: list[memoryview], sent: int) -> None:
    """Remove the first ``sent`` bytes from ``views`` (what a sendmsg / writev of frames'
    buffers wrote): whole views dropped, the first one left cut where the write stopped."""
    while sent:
        first = len(views[0])
        if sent >= first:
            sent -= first
            views.pop(0)
        else:
            views[0] = views[0][sent:]
            sent = 0


def frame_length(prefix: Body) -> int:
    """Return the LENGTH a frame starts with (the payload's size), checked against the limits.

    ``prefix`` holds at least the 4 bytes of LENGTH. Raises RemotingFrameError
    for a negative LENGTH, one too short for MARKER, or a frame beyond 16 MiB.
    """
    (length,) = LENGTH.unpack_from(prefix)
    if length < HEADER_OFFSET:
        raise RemotingFrameError(
            f"frame LENGTH {length} is too small: a payload holds at least its {HEADER_OFFSET}-byte"
            " header length"
        )
    if PAYLOAD_OFFSET + length > MAX_FRAME_SIZE:
        raise RemotingFrameError(
            f"frame LENGTH {length} is beyond the limit: a frame is at most {MAX_FRAME_SIZE} bytes"
        )
    return length


def decode_payload(payload: Body) -> RemotingCommand:
    """Decode a frame's payload (everything after LENGTH); the body is a view into ``payload``.

    Raises RemotingFrameError when the header length runs beyond the payload,
    the serialize type is unknown, or the header does not decode.
    """
    view = memoryview(payload).cast("B")
    if len(view) < HEADER_OFFSET:
        raise RemotingFrameError(f"payload of {len(view)} bytes has no header length")
    (marker,) = MARKER.unpack_from(view)
    kind = (marker >> 24) & 0xFF
    header_length = marker & MAX_HEADER_LENGTH
    end = HEADER_OFFSET + header_length
    if end > len(view):
        raise RemotingFrameError(
            f"header length {header_length} runs beyond the frame "
            f"({len(view) - HEADER_OFFSET} bytes after the header length)"
        )
    header = view[HEADER_OFFSET:end]
    body = view[end:] if end < len(view) else None
    if kind == SerializeType.JSON:
        fields = _decode_json_header(header)
        serialize_type = SerializeType.JSON
    elif kind == SerializeType.ROCKETMQ:
        fields = _decode_binary_header(header)
        serialize_type = SerializeType.ROCKETMQ
    else:
        raise RemotingFrameError(
            f"unknown serialize type {kind}: expected 0 (JSON) or 1 (ROCKETMQ)"
        )
    return RemotingCommand(**fields, body=body, serialize_type=serialize_type)


# --- headers ---------------------------------------------------------------------------


def _encode_header(cmd: RemotingCommand) -> bytes:
    if cmd.serialize_type == SerializeType.ROCKETMQ:
        return _encode_binary_header(cmd)
    return _encode_json_header(cmd)


# What JSON escapes in an ASCII text (controls, quote, backslash) mapped to NUL, the rest
# to themselves: one translate finds them.
_ESCAPED_TO_NUL = bytes(0 if b < 0x20 or b in b'"\\' else b for b in range(256))


def _json_text(value: Any) -> str:
    """``value`` as a JSON string, as ``json.dumps(value, ensure_ascii=False)`` writes it.

    An ASCII text with nothing to escape is quoted as it is: found with one
    translate, where json's loop per character costs ~0.1 ms on a batch send's
    answer (1024 message ids in one field).
    """
    if (
        type(value) is str
        and value.isascii()
        and b"\0" not in value.encode("ascii").translate(_ESCAPED_TO_NUL)
    ):
        return f'"{value}"'
    return json.dumps(value, ensure_ascii=False)


def _encode_json_header(cmd: RemotingCommand) -> bytes:
    # fastjson's order: properties sorted by name; null ones and an empty map left out.
    # Written by hand (what json.dumps writes with separators "," and ":"): each text
    # through _json_text. Fields of other types than declared: json.dumps itself.
    try:
        language = LanguageCode(cmd.language).name
    except ValueError:
        raise RemotingFrameError(f"language {cmd.language} has no name for a JSON header") from None
    numbers = (cmd.code, cmd.flag, cmd.opaque, cmd.version)
    ext = cmd.ext_fields
    if not (
        all(isinstance(v, int) and not isinstance(v, bool) for v in numbers)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in ext.items())
        and (cmd.remark is None or isinstance(cmd.remark, str))
    ):
        return _dumps_json_header(cmd, language)  # what json.dumps makes of other types
    text = _json_text
    parts = [f'{{"code":{int(cmd.code)}']
    if ext:
        fields = ",".join(f"{text(k)}:{text(v)}" for k, v in ext.items())
        parts.append(f',"extFields":{{{fields}}}')
    parts.append(f',"flag":{int(cmd.flag)},"language":"{language}","opaque":{int(cmd.opaque)}')
    if cmd.remark is not None:
        parts.append(f',"remark":{text(cmd.remark)}')
    parts.append(f',"serializeTypeCurrentRPC":"JSON","version":{int(cmd.version)}}}')
    return "".join(parts).encode("utf-8")


def _dumps_json_header(cmd: RemotingCommand, language: str) -> bytes:
    header: dict[str, Any] = {"code": cmd.code}
    if cmd.ext_fields:
        header["extFields"] = dict(cmd.ext_fields)
    header["flag"] = cmd.flag
    header["language"] = language
    header["opaque"] = cmd.opaque
    if cmd.remark is not None:
        header["remark"] = cmd.remark
    header["serializeTypeCurrentRPC"] = SerializeType.JSON.name
    header["version"] = cmd.version
    return json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


_JSON_DECODER = json.JSONDecoder()
_STR_ONLY = frozenset((str,))


def _decode_json_header(header: memoryview) -> dict[str, Any]:
    try:
        if len(header) >= 2 and header[0] == 0x7B and header[1]:
            # What json.loads does with bytes starting so ('{', no BOM, not UTF-16/32),
            # without its detection of the encoding: a header every request has.
            obj = _JSON_DECODER.decode(str(header, "utf-8", "surrogatepass"))
        else:
            obj = json.loads(bytes(header))
    except (UnicodeDecodeError, ValueError) as e:
        raise RemotingFrameError(f"JSON header does not parse: {e}") from None
    if not isinstance(obj, dict):
        raise RemotingFrameError(f"JSON header is a {type(obj).__name__}, not an object")
    try:
        ext = obj.get("extFields") or {}
        if not isinstance(ext, dict):
            raise TypeError(f"extFields is a {type(ext).__name__}")
        remark = obj.get("remark")
        return {
            "code": _json_int(obj, "code"),
            "language": _json_language(obj.get("language")),
            "version": _json_int(obj, "version"),
            "opaque": _json_int(obj, "opaque"),
            "flag": _json_int(obj, "flag"),
            "remark": None if remark is None else str(remark),
            # JSON keys are strings; values are too, but for a client that writes them
            # as numbers, booleans or null.
            "ext_fields": ext
            if set(map(type, ext.values())) <= _STR_ONLY
            else {str(key): _json_string(value) for key, value in ext.items() if value is not None},
        }
    except (TypeError, ValueError) as e:
        raise RemotingFrameError(f"JSON header is malformed: {e}") from None


def _json_int(obj: dict[str, Any], key: str) -> int:
    value = obj.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"{key} is {value!r}, not an integer")
    return int(value)


def _json_language(value: Any) -> int:
    # fastjson writes the enum's name; it also reads an ordinal. An unknown name is OTHER.
    if value is None:
        return LanguageCode.JAVA
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        return LanguageCode.__members__.get(value, LanguageCode.OTHER)
    raise TypeError(f"language is {value!r}")


def _json_string(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    raise TypeError(f"an extFields value is {value!r}, not a string")


def _encode_binary_header(cmd: RemotingCommand) -> bytes:
    if not (-0x8000 <= cmd.code <= 0x7FFF and -0x8000 <= cmd.version <= 0x7FFF):
        raise RemotingFrameError(
            f"code {cmd.code} or version {cmd.version} does not fit the ROCKETMQ header's i16"
        )
    if not 0 <= cmd.language <= 0xFF:
        raise RemotingFrameError(f"language {cmd.language} does not fit the ROCKETMQ header's u8")
    out = bytearray(BINARY_FIXED.pack(cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag))
    remark = cmd.remark.encode("utf-8") if cmd.remark else b""
    out += INT.pack(len(remark))
    out += remark
    ext_at = len(out)
    out += b"\0\0\0\0"  # EXTLENGTH, set below
    for key, value in cmd.ext_fields.items():
        k = key.encode("utf-8")
        v = value.encode("utf-8")
        if len(k) > 0x7FFF:
            raise RemotingFrameError(f"ext field key of {len(k)} bytes does not fit an i16 length")
        out += SHORT.pack(len(k))
        out += k
        out += INT.pack(len(v))
        out += v
    INT.pack_into(out, ext_at, len(out) - ext_at - INT.size)
    return bytes(out)


def _decode_binary_header(header: memoryview) -> dict[str, Any]:
    size = len(header)
    try:
        code, language, version, opaque, flag = BINARY_FIXED.unpack_from(header)
        pos = BINARY_FIXED.size
        (remark_length,) = INT.unpack_from(header, pos)
        pos += INT.size
        remark = None
        if remark_length:
            if not 0 < remark_length <= size - pos:
                raise RemotingFrameError(
                    f"ROCKETMQ header: remark length {remark_length} runs beyond the header "
                    f"({size - pos} bytes left)"
                )
            remark = str(header[pos : pos + remark_length], "utf-8")
            pos += remark_length
        (ext_length,) = INT.unpack_from(header, pos)
        pos += INT.size
        if not 0 <= ext_length <= size - pos:
            raise RemotingFrameError(
                f"ROCKETMQ header: extFields length {ext_length} runs beyond the header "
                f"({size - pos} bytes left)"
            )
        ext: dict[str, str] = {}
        end = pos + ext_length
        while pos < end:
            (key_length,) = SHORT.unpack_from(header, pos)
            pos += SHORT.size
            if not 0 <= key_length <= end - pos:
                raise RemotingFrameError(f"ROCKETMQ header: key length {key_length} at {pos - 2}")
            key = str(header[pos : pos + key_length], "utf-8")
            pos += key_length
            (value_length,) = INT.unpack_from(header, pos)
            pos += INT.size
            if not 0 <= value_length <= end - pos:
                raise RemotingFrameError(
                    f"ROCKETMQ header: value length {value_length} of {key!r} at {pos - 4}"
                )
            ext[key] = str(header[pos : pos + value_length], "utf-8")
            pos += value_length
    except struct.error as e:
        raise RemotingFrameError(f"ROCKETMQ header of {size} bytes is truncated: {e}") from None
    except UnicodeDecodeError as e:
        raise RemotingFrameError(f"ROCKETMQ header holds text that is not UTF-8: {e}") from None
    return {
        "code": code,
        "language": LanguageCode(language) if language in _LANGUAGES else language,
        "version": version,
        "opaque": opaque,
        "flag": flag,
        "remark": remark,
        "ext_fields": ext,
    }

"""Frames of a request sent again and again with a few header fields changed, by formatting.

A queue's pulls differ from one another only in ``queueOffset``, ``maxMsgNums``
and ``opaque``; its sends in a few fields more. Encoding each through a header
dataclass, a dict and ``json.dumps`` costs more than the rest of the request:
:class:`FrameTemplate` encodes the request once with the general encoder
(:meth:`RemotingCommand.encode`, JSON header), a marker in each open field, and
turns the markers into ``%`` holes, so every frame it makes is the same bytes
the general encoder writes (the tests compare them). A number's hole writes its
digits, a text's writes it as ``json.dumps`` writes a string (quotes included).
A header that spells a marker anywhere else cannot be cut so: ``of`` returns
None and the caller uses the general encoder.

A signed request (ACL) is never made from a template: its signature covers
every field.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Callable, Mapping, Sequence

from rocketspark.errors import RemotingFrameError
from rocketspark.remoting import headers as h
from rocketspark.remoting.codes import RequestCode, request_name
from rocketspark.remoting.command import MAX_FRAME_SIZE, Body, RemotingCommand

__all__ = ["FrameTemplate", "PullFrames", "SendFrames", "json_string"]

# json.dumps's escaping of a string (ensure_ascii=False), quotes included: the C encoder.
json_string: Callable[[str], str] = json.encoder.encode_basestring

# Markers of open fields, none a part of another's text: numbers, then texts.
NUMBER_MARKS = tuple(8_070_605_040_302_010_001 + i for i in range(8))
TEXT_MARKS = tuple(f"@rocketspark-hole-{i}@" for i in range(8))
_OPAQUE_MARK = 7_391_846_205
_PREFIX = struct.Struct(">ii")  # LENGTH, MARKER (serialize type JSON: 0 << 24)


class FrameTemplate:
    """One request's frames, the ext fields ``open_fields`` and the opaque left as holes."""

    __slots__ = ("_code", "_order", "_text")

    def __init__(self, code: int, text: str, order: tuple[int, ...] | None):
        self._code = code
        self._text = text
        self._order = order  # the values' order in the text, when not as given

    @classmethod
    def of(
        cls, code: int, ext_fields: Mapping[str, str], open_fields: Sequence[str]
    ) -> FrameTemplate | None:
        """The template of request ``code`` with ``ext_fields``, in which each field named
        in ``open_fields`` holds a marker (``NUMBER_MARKS``/``TEXT_MARKS``); None when a marker
        is spelled elsewhere in the header too."""
        cmd = dataclasses.replace(RemotingCommand.request(code, ext_fields), opaque=_OPAQUE_MARK)
        text = bytes(cmd.encode()[0][_PREFIX.size :]).decode("utf-8").replace("%", "%%")
        holes: list[tuple[str, str]] = []
        markers: list[str] = []
        for key in open_fields:
            name, marker = json_string(key), ext_fields[key]
            markers.append(marker)
            if marker in TEXT_MARKS:
                holes.append((f"{name}:{json_string(marker)}", f"{name}:%s"))
            else:
                holes.append((f'{name}:"{marker}"', f'{name}:"%d"'))
        holes.append((f'"opaque":{_OPAQUE_MARK}', '"opaque":%d'))
        markers.append(str(_OPAQUE_MARK))
        if any(text.count(m) != 1 for m in markers):
            return None
        where = [text.find(marked) for marked, _ in holes]
        if min(where) < 0:
            return None
        order = tuple(sorted(range(len(holes)), key=where.__getitem__))
        for marked, hole in holes:
            text = text.replace(marked, hole)
        return cls(code, text, None if order == tuple(range(len(holes))) else order)

    def frame(self, args: tuple[int | str, ...], body: Body = b"") -> list[Body]:
        """The frame with ``args`` in the open fields (in ``open_fields``' order; a text
        already ``json_string``-escaped) and the opaque (last), carrying ``body``."""
        if self._order is not None:
            args = tuple(args[i] for i in self._order)
        header = (self._text % args).encode("utf-8")
        n = len(header)
        if _PREFIX.size + n + len(body) > MAX_FRAME_SIZE:
            raise RemotingFrameError(
                f"frame of {request_name(self._code)} would be {_PREFIX.size + n + len(body)} "
                f"bytes, more than the {MAX_FRAME_SIZE} a RocketMQ server accepts"
            )
        head = _PREFIX.pack(4 + n + len(body), n) + header
        return [head, body] if len(body) else [head]


class PullFrames:
    """The PULL_MESSAGE frames of one queue, group and expression."""

    __slots__ = ("_template",)

    def __init__(self, template: FrameTemplate):
        self._template = template

    @classmethod
    def of(cls, header: h.PullMessageRequestHeader) -> PullFrames | None:
        """``header``'s frames, its queueOffset and maxMsgNums open."""
        probe = dataclasses.replace(
            header, queue_offset=NUMBER_MARKS[0], max_msg_nums=NUMBER_MARKS[1]
        )
        template = FrameTemplate.of(
            RequestCode.PULL_MESSAGE, probe.to_ext_fields(), ("queueOffset", "maxMsgNums")
        )
        return None if template is None else cls(template)

    def frame(self, offset: int, max_nums: int, opaque: int) -> list[Body]:
        """The frame asking for ``max_nums`` messages from ``offset``, as ``opaque``."""
        return self._template.frame((offset, max_nums, opaque))


class SendFrames:
    """The SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE frames of one queue and producer group."""

    __slots__ = ("_template",)

    def __init__(self, template: FrameTemplate):
        self._template = template

    @classmethod
    def of(cls, code: int, header: h.SendMessageRequestHeaderV2) -> SendFrames | None:
        """``header``'s frames (its queue, group and batch flag), sysFlag, bornTimestamp,
        flag and properties open, and reconsumeTimes when ``header`` has one (else left
        out); maxReconsumeTimes as ``header``'s."""
        times = header.reconsume_times is not None
        probe = dataclasses.replace(
            header,
            sys_flag=NUMBER_MARKS[0],
            born_timestamp=NUMBER_MARKS[1],
            flag=NUMBER_MARKS[2],
            properties=TEXT_MARKS[0],
            reconsume_times=NUMBER_MARKS[3] if times else None,
        )
        # SendMessageRequestHeaderV2's letters: f sysFlag, g bornTimestamp, h flag,
        # i properties, j reconsumeTimes
        fields = ("f", "g", "h", "i", "j") if times else ("f", "g", "h", "i")
        template = FrameTemplate.of(code, probe.to_ext_fields(), fields)
        return None if template is None else cls(template)

    def frame(
        self,
        body: Body,
        sys_flag: int,
        born_timestamp: int,
        flag: int,
        properties: str,
        reconsume_times: int | None,
        opaque: int,
    ) -> list[Body]:
        """The frame of a send of ``body`` with these fields, as ``opaque``."""
        props = json_string(properties)
        if reconsume_times is None:
            return self._template.frame((sys_flag, born_timestamp, flag, props, opaque), body)
        args = (sys_flag, born_timestamp, flag, props, reconsume_times, opaque)
        return self._template.frame(args, body)

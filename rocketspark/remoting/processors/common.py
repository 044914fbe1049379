"""What every processor shares: how an answer is made, and how routes name the broker."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rocketspark.errors import OffsetOutOfRangeError, UnknownTopicError
from rocketspark.remoting import headers as h
from rocketspark.remoting.codes import ResponseCode
from rocketspark.remoting.command import RemotingCommand

MASTER_ID = 0
PERM_READ_WRITE = 6


def answer(
    request: RemotingCommand,
    code: int,
    remark: str | None = None,
    header: h.Header | None = None,
    body: bytes | None = None,
) -> RemotingCommand:
    return RemotingCommand.response_to(
        request, code, remark, header.to_ext_fields() if header is not None else None, body=body
    )


def ok(
    request: RemotingCommand, header: h.Header | None = None, body: bytes | None = None
) -> RemotingCommand:
    return answer(request, ResponseCode.SUCCESS, None, header, body)


def to_json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


@dataclass(frozen=True, slots=True)
class BrokerIdentity:
    """How routes name the store's broker."""

    cluster: str
    name: str
    address: str  # the broker port's host:port


def queue_offset(read: Callable[[str, int], int], topic: str, queue_id: int) -> int:
    try:
        return read(topic, queue_id)
    except (UnknownTopicError, OffsetOutOfRangeError):
        return 0  # RocketMQ answers 0 for a queue it does not have

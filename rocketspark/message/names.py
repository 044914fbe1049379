"""Names and expressions a producer or consumer gives: topics, groups, tag filters.

``validate_topic`` / ``validate_group`` apply RocketMQ's ``TopicValidator``
rules. Their charset has no ``/``, ``\\`` or ``.``, which is what keeps every
topic directory (``consumequeue/<topic>/``) inside the store.
:class:`SubscriptionExpression` is a consumer's tag expression.
"""

from __future__ import annotations

import re

from rocketspark.errors import ConfigError, InvalidNameError
from rocketspark.message.java_hash import java_string_hash
from rocketspark.message.model import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
)

__all__ = [
    "GROUP_MAX_LENGTH",
    "RETRY_OR_DLQ_TOPIC_MAX_LENGTH",
    "TOPIC_MAX_LENGTH",
    "SubscriptionExpression",
    "validate_group",
    "validate_topic",
]

TOPIC_MAX_LENGTH = 127
RETRY_OR_DLQ_TOPIC_MAX_LENGTH = 255
# 120 leaves room for the %RETRY% / %DLQ% prefix in the group's own topics.
GROUP_MAX_LENGTH = 120
NAME_CHARSET = "^[%|a-zA-Z0-9_-]+$"
_NAME = re.compile(r"[%|a-zA-Z0-9_-]+")  # used with fullmatch: "$" would accept a final \n


def _validate_name(what: str, name: object, limit: int) -> str:
    if not isinstance(name, str):
        raise InvalidNameError(f"{what} name must be a string, got {name!r}")
    if not name:
        raise InvalidNameError(f"{what} name is empty")
    if not _NAME.fullmatch(name):
        raise InvalidNameError(
            f"{what} name {name!r} contains illegal characters; only {NAME_CHARSET} is allowed"
        )
    if len(name) > limit:
        raise InvalidNameError(
            f"{what} name {name!r} is {len(name)} characters long; at most {limit} are allowed"
        )
    return name


def validate_topic(name: str, *, on_disk: bool = False) -> str:
    """Return ``name`` if RocketMQ accepts it as a topic, else raise InvalidNameError.

    Rules: characters ``^[%|a-zA-Z0-9_-]+$``, at most 127 of them, or 255 for
    ``%RETRY%...`` and ``%DLQ%...`` topics. ``on_disk`` is for topics a
    RocketMQ store already holds (its store module writes longer names with v2
    records): the charset still applies, so no name escapes the store
    directory, and the limit is 255 for every topic.
    """
    is_group_topic = isinstance(name, str) and name.startswith(
        (RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)
    )
    limit = RETRY_OR_DLQ_TOPIC_MAX_LENGTH if is_group_topic or on_disk else TOPIC_MAX_LENGTH
    return _validate_name("topic", name, limit)


def validate_group(name: str) -> str:
    """Return ``name`` if RocketMQ accepts it as a group, else raise InvalidNameError.

    Rules: characters ``^[%|a-zA-Z0-9_-]+$``, at most 120 of them.
    """
    return _validate_name("group", name, GROUP_MAX_LENGTH)


class SubscriptionExpression:
    """A tag expression: ``*`` (or empty) for all, or ``TagA || TagB``."""

    __slots__ = ("text", "tags", "codes")

    def __init__(self, text: str | None):
        self.text = (text or "*").strip()
        if self.text in ("", "*"):
            self.tags: frozenset[str] | None = None
            self.codes: frozenset[int] = frozenset()
            return
        tags = [t.strip() for t in self.text.split("||")]
        tags = [t for t in tags if t]
        if not tags:
            raise ConfigError(f"tag expression {text!r} names no tag; use '*' for all")
        self.tags = frozenset(tags)
        self.codes = frozenset(java_string_hash(t) for t in tags)

    @property
    def matches_all(self) -> bool:
        return self.tags is None

    def matches_code(self, code: int) -> bool:
        return self.tags is None or code in self.codes

    def matches_tags(self, tags: str | None) -> bool:
        return self.tags is None or (tags is not None and tags in self.tags)

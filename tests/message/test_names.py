"""Topic and group name rules (RocketMQ's TopicValidator) and the tag expression."""

from __future__ import annotations

import pytest

from rocketspark.errors import ConfigError, InvalidNameError
from rocketspark.message.names import SubscriptionExpression, validate_group, validate_topic


@pytest.mark.parametrize(
    "name",
    [
        "TopicA-1_x",
        "%RETRY%g",
        "%DLQ%g",
        "a|b",
        "T" * 127,
        "%RETRY%" + "g" * 248,
        "%DLQ%" + "g" * 250,
        "SCHEDULE_TOPIC_XXXX",
        "RMQ_SYS_TRANS_HALF_TOPIC",
    ],
)
def test_legal_topics(name):
    assert validate_topic(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "../x",
        "a/b",
        "a\\b",
        ".",
        "..",
        "a.b",
        "a b",
        "a@b",
        "a\n",
        "\x00",
        "tópico",
        "a:b",
        "*",
    ],
)
def test_illegal_topic_characters(name):
    with pytest.raises(InvalidNameError) as err:
        validate_topic(name)
    assert repr(name) in str(err.value)
    assert "^[%|a-zA-Z0-9_-]+$" in str(err.value)


def test_topic_lengths():
    with pytest.raises(InvalidNameError, match="128 characters long; at most 127"):
        validate_topic("T" * 128)
    with pytest.raises(InvalidNameError, match="256 characters long; at most 255"):
        validate_topic("%RETRY%" + "g" * 249)
    with pytest.raises(InvalidNameError, match="topic name is empty"):
        validate_topic("")
    with pytest.raises(InvalidNameError, match="must be a string"):
        validate_topic(None)  # type: ignore[arg-type]


def test_groups():
    assert validate_group("GroupA_1-x") == "GroupA_1-x"
    assert validate_group("g" * 120) == "g" * 120
    with pytest.raises(InvalidNameError, match="121 characters long; at most 120"):
        validate_group("g" * 121)
    for bad in ("", "../g", "g/h", "g.h", "g@h"):
        with pytest.raises(InvalidNameError, match="group name"):
            validate_group(bad)


def test_invalid_name_is_a_config_error():
    with pytest.raises(ConfigError):
        validate_topic("a/b")


def test_a_tag_expression_matches_all_or_the_tags_it_names():
    for everything in (None, "", " * ", "*"):
        sub = SubscriptionExpression(everything)
        assert sub.matches_all and sub.matches_tags(None) and sub.matches_code(12345)
    sub = SubscriptionExpression(" TagA || TagB ||")
    assert not sub.matches_all and sub.tags == {"TagA", "TagB"}
    assert sub.matches_tags("TagB") and not sub.matches_tags("TagC")
    assert not sub.matches_tags(None)
    assert sub.matches_code(2598919) and not sub.matches_code(0)  # Java "TagA".hashCode()


def test_a_tag_expression_naming_no_tag_is_refused():
    with pytest.raises(ConfigError, match="names no tag"):
        SubscriptionExpression("|| ||")

"""Inputs the first round of put validation let through on some paths.

A false but wrong column entry (0, False, b"") that the uniform columnar
path took for "none" while every other path refuses it; columns that are
not sequences (a generator, one string); and the properties that
``send_back`` adds, which went to disk unchecked.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketspark.errors import (
    ConfigError,
    InvalidMessageError,
    OffsetOutOfRangeError,
    UnknownTopicError,
)
from rocketspark.message.model import SCHEDULE_TOPIC, dlq_topic
from rocketspark.store import Message, MessageStore
from tests.store.test_put_validation import _outcome

FALSE_BUT_WRONG = [0, False, b"", 0.0, bytearray()]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    field=st.sampled_from(["keys", "properties"]),
    value=st.sampled_from(FALSE_BUT_WRONG),
    rows=st.sampled_from([3, 70, 200]),
    every_row=st.booleans(),
)
def test_a_false_but_wrong_column_entry_is_refused_on_every_path(
    tmp_path_factory, field, value, rows, every_row
):
    """Message refuses keys=0 / properties=b""; so do put_batch and put_columns of any
    size (the uniform path from 64 rows included), and nothing is written."""
    root = tmp_path_factory.mktemp("falsy")
    with MessageStore.open(root) as store:
        store.create_topic("t", queues=1)
        with pytest.raises(InvalidMessageError):
            Message("t", b"x", **{field: value})
        column = [value if every_row or i == rows // 2 else None for i in range(rows)]
        assert (
            _outcome(lambda: store.put_columns([b"x"] * rows, topic="t", **{field: column}))
            is InvalidMessageError
        )
        assert (
            _outcome(
                lambda: store.prepare_columns(
                    [b"x"] * rows, producer_group="g", topic="t", **{field: column}
                )
            )
            is InvalidMessageError
        )
        store.encoder.columnar = False  # the per-record path (IPv6 hosts) builds Messages
        assert (
            _outcome(lambda: store.put_columns([b"x"] * rows, topic="t", **{field: column}))
            is InvalidMessageError
        )
        store.encoder.columnar = True
        assert store.put(Message("t", b"after")).queue_offset == 0
        assert [m.body for m in store.pull("t", 0, 0, 1000).messages] == [b"after"]
        assert store.open_transactions() == []
    with MessageStore.open(root) as again:
        assert again.max_offset("t", 0) == 1


@pytest.mark.parametrize("rows", [3, 100])
def test_empty_column_entries_still_take_the_uniform_path_and_are_stored(tmp_path, rows):
    with MessageStore.open(tmp_path) as store:
        store.create_topic("t", queues=1)
        empty = [None, "", [], ()] * rows
        rs = store.put_columns(
            [b"x"] * len(empty), topic="t", keys=empty, properties=[None, {}, [], ()] * rows
        )
        assert len(rs) == len(empty)
        got = store.pull("t", 0, 0, 1000).messages
        assert [m.keys for m in got] == [[]] * len(empty)


@pytest.mark.parametrize("column", ["bodies", "tags", "keys", "topics", "queue_ids"])
@pytest.mark.parametrize("bad", ["text", "generator"])
def test_a_column_that_is_not_a_sequence_is_a_config_error(tmp_path, column, bad):
    """One string would be taken for a column of its characters; a generator has no
    length: both are refused by name, before anything is written."""
    good = {
        "bodies": [b"a", b"b"],
        "tags": ["x", "y"],
        "keys": ["x", "y"],
        "topics": ["t", "t"],
        "queue_ids": [0, 0],
    }

    def columns():
        cols = {"bodies": [b"a", b"b"], "topic": "t"}
        cols[column] = "ab" if bad == "text" else (v for v in good[column])
        return cols.pop("bodies"), cols

    with MessageStore.open(tmp_path) as store:
        store.create_topic("t", queues=1)
        bodies, cols = columns()
        with pytest.raises(ConfigError, match=f"column {column}"):
            store.put_columns(bodies, **cols)
        bodies, cols = columns()
        with pytest.raises(ConfigError, match=f"column {column}"):
            store.prepare_columns(bodies, producer_group="g", **cols)
        assert store.max_offset("t", 0) == 0
        assert store.open_transactions() == []


BAD_SEND_BACK_PROPERTIES = [
    {"p": "a\x01b"},
    {"p\x02": "v"},
    {"p": "v\ud800"},
    {"p\udfff": "v"},
    {"p": 5},
    {5: "v"},
    {"": "v"},
    {"DELAY": "3"},
    "pv",
    7,
]


def _stored_once(tmp_path):
    store = MessageStore.open(tmp_path)
    store.create_topic("t", queues=1)
    store.put(Message("t", b"x"))
    return store, store.pull("t", 0, 0).messages[0]


@pytest.mark.parametrize("props", BAD_SEND_BACK_PROPERTIES)
@pytest.mark.parametrize("delay_level", [0, -1])  # a retry, a dead letter
def test_send_back_checks_the_properties_it_adds_as_a_message_does(tmp_path, props, delay_level):
    """A separator would split the record's properties (a consumer reads other names
    and values), a lone surrogate raised UnicodeEncodeError, a number went to disk
    as its text: each is refused naming the message, and nothing is written."""
    store, m = _stored_once(tmp_path)
    with store:
        target = (dlq_topic("g"), 0) if delay_level < 0 else (SCHEDULE_TOPIC, 2)
        with pytest.raises(InvalidMessageError, match="message 1: "):
            store.send_back_batch(
                "g", [m, m], [delay_level, delay_level], properties=[{"ok": "fine"}, props]
            )
        with pytest.raises(InvalidMessageError):
            store.send_back("g", m, delay_level, properties=props)
        assert not store.has_topic(target[0]) or store.max_offset(*target) == 0
        r = store.send_back("g", m, delay_level, properties={"why": "é", "KEYS": "k1 k2"})
        assert (r.topic, r.queue_offset) == (target[0], 0)
        back = store.get_message(r.commitlog_offset)
        assert back.properties["why"] == "é" and back.keys == ["k1", "k2"]


def test_send_back_refuses_mismatched_columns_and_foreign_messages(tmp_path):
    store, m = _stored_once(tmp_path)
    with store:
        with pytest.raises(ConfigError, match="delay_levels has 1 entries, messages has 2"):
            store.send_back_batch("g", [m, m], [1])
        with pytest.raises(ConfigError, match="properties has 3 entries, messages has 2"):
            store.send_back_batch("g", [m, m], properties=[{}, {}, {}])
        with pytest.raises(InvalidMessageError, match="message 0: expected a MessageExt"):
            store.send_back("g", Message("t", b"x"))
        with pytest.raises(InvalidMessageError, match="max_reconsume_times"):
            store.send_back("g", m, max_reconsume_times="16")
        assert not store.has_topic(SCHEDULE_TOPIC) or store.max_offset(SCHEDULE_TOPIC, 2) == 0


def test_a_retry_pipelines_failure_reason_with_separators_is_stored_readably(tmp_path):
    """The reason is the user's text (an exception message): RocketMQ's property
    separators in it are replaced, not written into the record's properties."""
    from rocketspark.deadletter import RetryPipeline
    from rocketspark.message.model import PROPERTY_FAILURE_REASON

    root = str(tmp_path / "store")
    with MessageStore.open(root) as s:
        s.create_topic("orders", queues=1)
        (mine,) = s.put_batch([Message("orders", b"order")])
    pipe = RetryPipeline(
        None,
        topic="orders",
        group="etl",
        process=lambda df, i: None,
        checkpoint=str(tmp_path / "chk"),
        store=root,
    )
    row = namedtuple("Row", "commitLogOffset reason")(mine.commitlog_offset, "bad\x02EVIL\x01x row")
    assert pipe.send_back([row], 0, "q1") == 1
    with MessageStore.open(root) as s:
        (back,) = s.pull(SCHEDULE_TOPIC, 2, 0).messages
        assert back.properties[PROPERTY_FAILURE_REASON] == "bad\ufffdEVIL\ufffdx row"
        assert "EVIL" not in back.properties


@pytest.mark.parametrize(
    "bad, error",
    [
        (-1, OffsetOutOfRangeError),
        ([-2], OffsetOutOfRangeError),
        (np.array([-1]), OffsetOutOfRangeError),
        ([True], ConfigError),
        ([0.9], ConfigError),
        (1.7, ConfigError),
        ("0", ConfigError),
        (None, ConfigError),
        ([10**30], OffsetOutOfRangeError),
        (np.array([0.9]), ConfigError),
        (np.array([2**64 - 1], dtype=np.uint64), OffsetOutOfRangeError),
    ],
)
@pytest.mark.parametrize("commit", [True, False])
def test_a_half_is_named_by_a_non_negative_integer_offset(tmp_path, bad, error, commit):
    """A negative offset raised IndexError (or named the last half: numpy indexing
    wraps), True committed half 1 and 0.9 half 0: each is refused, nothing resolved."""
    with MessageStore.open(tmp_path) as store:
        store.create_topic("t", queues=1)
        halves = store.prepare_batch([Message("t", b"a"), Message("t", b"b")])
        end = store.commit_transaction if commit else store.rollback_transaction
        with pytest.raises(error):
            end(bad)
        assert [store.transaction_status(h) for h in halves] == ["open", "open"]
        assert store.max_offset("t", 0) == 0
        store.commit_transaction([np.int64(halves[0].queue_offset), halves[1]])
        assert [m.body for m in store.pull("t", 0, 0).messages] == [b"a", b"b"]


@pytest.mark.parametrize(
    "extra, match",
    [
        ([("a", "b")], "must be a mapping"),
        ("ab", "must be a mapping"),
        ({"PGROUP": "other"}, "set by the prepare itself"),
        ({"UNIQ_KEY": "same"}, "set by the prepare itself"),
        ({"REAL_TOPIC": "x"}, "set by the prepare itself"),
        ({"TRAN_MSG": "false"}, "set by the prepare itself"),
    ],
)
@pytest.mark.parametrize("how", ["prepare", "prepare_columns1", "prepare_columns70"])
def test_extra_properties_of_a_prepare_are_a_mapping_of_the_callers_own(
    tmp_path, extra, match, how
):
    """A list raised AttributeError; PGROUP moved every half to another producer group
    (its open_transactions and checks), UNIQ_KEY gave them all one message id."""
    with MessageStore.open(tmp_path) as store:
        store.create_topic("t", queues=1)
        with pytest.raises(ConfigError, match=match):
            if how == "prepare":
                store.prepare(Message("t", b"x"), producer_group="g", properties=extra)
            else:
                n = int(how.removeprefix("prepare_columns"))
                store.prepare_columns(
                    [b"x"] * n, producer_group="g", topic="t", extra_properties=extra
                )
        assert store.open_transactions() == []
        h = store.prepare(Message("t", b"x"), producer_group="g", properties={"mine": "1"})
        assert h.queue_offset == 0 and len(store.open_transactions("g")) == 1


@pytest.mark.parametrize("columnar", [True, False])
@pytest.mark.parametrize("rows", [3, 70])
def test_an_empty_topic_name_is_refused_not_sent_to_the_default_topic(tmp_path, columnar, rows):
    """Only a None entry of ``topics`` takes ``topic``: an empty name went to the
    default topic unasked, where put(Message("", ...)) refuses it."""
    with MessageStore.open(tmp_path) as store:
        store.create_topic("t", queues=1)
        store.create_topic("default", queues=1)
        store.encoder.columnar = columnar
        with pytest.raises(UnknownTopicError, match="topic ''"):
            store.put(Message("", b"x"))
        with pytest.raises(UnknownTopicError, match="topic ''"):
            store.put_batch([Message("", b"x")] * rows)
        for topics in ([""] * rows, ["t"] * (rows - 1) + [""]):
            with pytest.raises(UnknownTopicError, match="topic ''"):
                store.put_columns([b"x"] * rows, topic="default", topics=topics)
        assert store.max_offset("default", 0) == store.max_offset("t", 0) == 0
        store.put_columns([b"x"] * rows, topic="default", topics=[None] * rows)
        assert store.max_offset("default", 0) == rows


@pytest.mark.parametrize("pending", ["delayed", "half"])
def test_a_topic_does_not_shrink_under_a_message_bound_for_a_dropped_queue(
    tmp_path, clock, pending
):
    """A delayed message (or an open half) names its queue; delivered (committed) after
    the shrink it went to a queue the topic no longer has, where no consumer reads it."""
    from rocketspark.errors import TopicShrinkError

    with MessageStore.open(tmp_path, clock=clock) as store:
        store.create_topic("t", queues=4)
        if pending == "delayed":
            store.put(Message("t", b"late", delay_level=1, queue_id=3))
        else:
            half = store.prepare(Message("t", b"half", queue_id=3))
        with pytest.raises(TopicShrinkError, match="queue\\(s\\) 3"):
            store.create_topic("t", queues=2)
        assert store.topic("t").write_queue_nums == 4
        store.create_topic("t", queues=4)  # no shrink: fine
        clock.advance(10_000)
        if pending == "delayed":
            assert store.run_schedule() == 1
        else:
            store.commit_transaction(half)
        assert [m.body for m in store.pull("t", 3, 0).messages] in ([b"late"], [b"half"])
        store.create_topic("t", queues=2, force=True)  # what it hides is asked for


def test_the_sink_refuses_an_empty_topic_name_before_writing():
    """Its rows went to the option topic (an empty name counted as null)."""
    from rocketspark.datasource.sink import check_columns

    with pytest.raises(ConfigError, match="column topic: a row has an empty topic name"):
        check_columns({"body": [b"a", b"b"], "topic": ["t", ""]})
    check_columns({"body": [b"a", b"b"], "topic": ["t", None]})

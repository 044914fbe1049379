"""The encoder: messages and columns into records before the write lock."""

from __future__ import annotations

import dataclasses

import pytest

from rocketspark.errors import InvalidMessageError, UnknownTopicError
from rocketspark.message.byte_gather import Pieces
from rocketspark.message.columns import Columns
from rocketspark.message.model import SCHEDULE_TOPIC, Message
from rocketspark.message.record import (
    MESSAGE_MAGIC_CODE,
    HostAddress,
)
from rocketspark.store.config import MessageStoreConfig
from rocketspark.store.encoder import UNIFORM_MIN, Encoder, TopicWriteInfo
from rocketspark.store.topic_config import TopicConfigTable

NOW = 1_700_000_000_000


@pytest.fixture
def encoder(tmp_path) -> Encoder:
    topics = TopicConfigTable(str(tmp_path / "config"))
    topics.create("t", 4, 4, perm=6, order=False)
    topics.create("x" * 127, 2, 2, perm=6, order=False)
    host = HostAddress.parse("127.0.0.1", 10911)
    enc = Encoder(
        root=str(tmp_path),
        config=MessageStoreConfig(),
        topics=topics,
        store_host=host,
        born_host=HostAddress(host.ip, 4321),
        segment_size=1 << 20,
    )
    enc.ids._prefix = "7F000001" + "0" * 12  # fixed UNIQ_KEYs
    enc.ids._counter = 0
    return enc


def _rest_bytes(rests) -> list[bytes]:
    if isinstance(rests, list):
        return rests
    parts = [p.to_list() for p in (rests if isinstance(rests, tuple) else (rests,))]
    assert all(isinstance(p, Pieces) for p in (rests if isinstance(rests, tuple) else (rests,)))
    return [b"".join(row) for row in zip(*parts, strict=True)]


def test_topic_write_info(encoder):
    short = encoder.topic_info("t")
    assert short == TopicWriteInfo(4, b"\x01t", MESSAGE_MAGIC_CODE)
    longest = encoder.topic_info("x" * 127)
    assert longest == TopicWriteInfo(2, b"\x7f" + b"x" * 127, MESSAGE_MAGIC_CODE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        short.write_queues = 1  # type: ignore[misc]


def test_unknown_topic_refused_unless_auto_created(encoder):
    encoder.config = dataclasses.replace(encoder.config, auto_create_topic_enable=False)
    with pytest.raises(UnknownTopicError):
        encoder.topic_info("nope")
    encoder.config = dataclasses.replace(encoder.config, auto_create_topic_enable=True)
    assert encoder.topic_info("nope").write_queues == encoder.config.default_topic_queue_nums


@pytest.mark.parametrize("keys", [False, True])
@pytest.mark.parametrize("tags", [None, "A", "varied"])
def test_uniform_batch_encodes_what_the_row_loop_encodes(encoder, tags, keys):
    n = UNIFORM_MIN + 36
    bodies = [b"body %d" % i for i in range(n)]
    tag_col = (
        None if tags is None else [tags if tags != "varied" else "ABC"[i % 3] for i in range(n)]
    )
    key_col = [f"k{i} j{i}" if i % 2 else None for i in range(n)] if keys else None
    uniform = encoder.columns(Columns(bodies, "t", None, tag_col, key_col, None, None, None), NOW)
    encoder.ids._counter = 0
    # explicit queue ids (the ones round robin gave) force the row loop
    qids = uniform[0].queue_ids.tolist()
    looped = encoder.columns(Columns(bodies, "t", None, tag_col, key_col, None, qids, None), NOW)
    assert not isinstance(looped[0].rests, (Pieces, tuple))  # the row loop's list
    assert isinstance(uniform[0].rests, (Pieces, tuple))  # the uniform path's pieces
    assert _rest_bytes(uniform[0].rests) == _rest_bytes(looped[0].rests)
    assert uniform[0].tags_codes.tolist() == looped[0].tags_codes.tolist()
    assert uniform[1:] == looped[1:]  # UNIQ_KEY prefix and start, own ids, keyed rows


def test_round_robin_spreads_rows_over_the_write_queues(encoder):
    batch = encoder.columns(Columns([b"a"] * 6, "t", None, None, None, None, None, None), NOW)[0]
    assert batch.queue_ids.tolist() == [0, 1, 2, 3, 0, 1]
    batch = encoder.columns(Columns([b"a"] * 2, "t", None, None, None, None, None, None), NOW)[0]
    assert batch.queue_ids.tolist() == [2, 3]


def test_one_encodes_the_records_bytes(encoder):
    msg = Message("t", b"hello", tags="T", keys=("a", "b"), properties={"p": "v"})
    one = encoder.one(msg, NOW)
    topic, queue_id, body, rest = one[:4]
    uniq = one[12]
    record = encoder.record(
        "t", queue_id, b"hello", {"p": "v", "TAGS": "T", "KEYS": "a b", "UNIQ_KEY": uniq}, NOW
    )
    assert (topic, body) == ("t", b"hello")
    assert record.tail == body + rest


def test_a_delayed_message_goes_to_the_schedule_topic(encoder):
    rec = encoder.message(Message("t", b"x", delay_level=3, queue_id=2), NOW, "U" * 32)
    assert (rec.topic, rec.queue_id) == (SCHEDULE_TOPIC, 2)
    assert rec.delay_ms == encoder.config.delay_levels_ms()[2]
    assert encoder.topics.get(SCHEDULE_TOPIC) is not None  # made on first use
    with pytest.raises(InvalidMessageError, match="delay_level 99"):
        encoder.check_delay_level(99)


def test_a_bad_row_is_refused_before_anything_is_appended(encoder):
    with pytest.raises(InvalidMessageError, match="row 1"):
        encoder.columns(Columns([b"a", b"b"], "t", None, ["ok", 5], None, None, None, None), NOW)

"""The dispatcher: one path from CommitLog records to ConsumeQueue and index entries."""

from __future__ import annotations

import os
import shutil

import pytest

from rocketspark.message.model import SCHEDULE_TOPIC
from rocketspark.message.record import RecordCheck
from rocketspark.store import Message, MessageStore
from rocketspark.store.dispatch import queue_tags_code

SMALL = dict(mappedFileSizeCommitLog=1 << 20, maxHashSlotNum=64, maxIndexNum=4096)


def _queue_files(root, topic: str) -> dict[str, bytes]:
    base = os.path.join(root, "consumequeue", topic)
    out = {}
    for qid in sorted(os.listdir(base)):
        for name in sorted(os.listdir(os.path.join(base, qid))):
            with open(os.path.join(base, qid, name), "rb") as f:
                out[f"{qid}/{name}"] = f.read()
    return out


def _delayed_store(path, clock) -> None:
    with MessageStore.open(path, clock=clock, **SMALL) as s:
        s.create_topic("t", queues=2)
        s.put(Message("t", b"one", delay_level=1, tags="A"))
        clock.advance(7)
        s.put_batch(
            [Message("t", b"%d" % i, delay_level=1 + i % 4, keys=(f"k{i}",)) for i in range(20)]
        )
        clock.advance(3)
        s.put_batch([Message("t", b"plain"), Message("t", b"late", delay_level=18)])
        got = s.pull("t", 0, 0).messages + s.pull("t", 1, 0).messages
        s.send_back("g", got[0])  # a retry goes through SCHEDULE_TOPIC_XXXX too
        s.send_back("g", got[0], delay_level=5)


@pytest.mark.parametrize("how", ["deleted", "full_recovery"])
def test_delayed_queues_rebuilt_by_recovery_are_byte_identical(tmp_path, clock, how):
    path = tmp_path / "s"
    _delayed_store(path, clock)
    live = _queue_files(path, SCHEDULE_TOPIC)
    assert live
    if how == "deleted":
        shutil.rmtree(os.path.join(path, "consumequeue", SCHEDULE_TOPIC))
    else:
        for qid in os.listdir(os.path.join(path, "consumequeue", SCHEDULE_TOPIC)):
            qdir = os.path.join(path, "consumequeue", SCHEDULE_TOPIC, qid)
            for name in os.listdir(qdir):
                file = os.path.join(qdir, name)
                size = os.path.getsize(file)
                with open(file, "r+b") as f:
                    f.write(b"\0" * size)
    with MessageStore.open(path, clock=clock, full_recovery=True, **SMALL) as s:
        assert s.recovery_report is not None
    assert _queue_files(path, SCHEDULE_TOPIC) == live


def test_delivery_times_are_store_time_plus_the_levels_delay(tmp_path, clock):
    with MessageStore.open(tmp_path / "s", clock=clock, **SMALL) as s:
        s.create_topic("t", queues=1)
        r = s.put(Message("t", b"x", delay_level=3))
        entry = s.queues.queue(SCHEDULE_TOPIC, 2).entry(r.queue_offset)
        assert entry is not None
        assert entry[2] == r.store_timestamp + s.config.delay_levels_ms()[2]


def test_queue_tags_code_rule():
    assert queue_tags_code("t", 17, 0, 1000) == 17
    assert queue_tags_code(SCHEDULE_TOPIC, 17, 0, 1000) == 17  # no level: the tags code
    assert queue_tags_code(SCHEDULE_TOPIC, 17, 5000, 1000) == 6000
    assert queue_tags_code("t", 17, 5000, 1000) == 17  # only the schedule topic


def _check(topic: str, delay: str | None) -> RecordCheck:
    props = {} if delay is None else {"DELAY": delay}
    return RecordCheck(
        size=100,
        topic=topic,
        queue_id=0,
        queue_offset=0,
        sys_flag=0,
        store_timestamp=1000,
        tags="T",
        keys=None,
        uniq_key=None,
        properties=props,
    )


def test_scanned_level_as_rocketmq_reads_it(tmp_path, clock):
    with MessageStore.open(tmp_path / "s", clock=clock, **SMALL) as s:
        d = s.dispatcher
        delays = s.config.delay_levels_ms()
        assert d.level_delay(_check(SCHEDULE_TOPIC, "2")) == delays[1]
        assert d.level_delay(_check(SCHEDULE_TOPIC, "99")) == delays[-1]  # capped at the last
        assert d.level_delay(_check(SCHEDULE_TOPIC, "0")) == 0
        assert d.level_delay(_check(SCHEDULE_TOPIC, "x")) == 0
        assert d.level_delay(_check(SCHEDULE_TOPIC, None)) == 0
        assert d.level_delay(_check("t", "2")) == 0
        assert d.queue_code(_check(SCHEDULE_TOPIC, "2")) == 1000 + delays[1]

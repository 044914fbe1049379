"""Delay levels, send-back to %RETRY%group, dead letters, with a fake clock."""

from __future__ import annotations

import pytest

from rocketspark.message.model import SCHEDULE_TOPIC
from rocketspark.store import Message, MessageStore, PullStatus
from rocketspark.store.appender import Append

SMALL = dict(mappedFileSizeCommitLog=1 << 20, maxHashSlotNum=64, maxIndexNum=4096)


@pytest.fixture
def store(tmp_path, clock):
    with MessageStore.open(tmp_path / "s", clock=clock, **SMALL) as s:
        s.create_topic("orders", queues=2)
        yield s


def only(store, topic, queue=0, offset=0):
    res = store.pull(topic, queue, offset, max_msgs=100)
    return res.messages


def test_delayed_message_is_held_then_delivered_once(store, clock):
    r = store.put(Message("orders", b"later", delay_level=2, queue_id=1, tags="T"))
    assert r.topic == SCHEDULE_TOPIC and r.queue_id == 1
    assert store.pull("orders", 1, 0).status is PullStatus.NO_NEW_MSG
    clock.advance(4_999)
    assert store.run_schedule() == 0
    clock.advance(1)
    assert store.run_schedule() == 1
    assert store.run_schedule() == 0  # idempotent
    (m,) = only(store, "orders", 1)
    assert m.body == b"later" and m.tags == "T" and "DELAY" not in m.properties
    assert m.properties["REAL_TOPIC"] == "orders"
    assert store.delay_offsets.get(2) == 1


def test_schedule_progress_survives_reopen(tmp_path, clock):
    with MessageStore.open(tmp_path / "s", clock=clock, **SMALL) as s:
        s.create_topic("t", queues=1)
        s.put_batch([Message("t", b"%d" % i, delay_level=1) for i in range(5)])
        clock.advance(1000)
        assert s.run_schedule() == 5
    with MessageStore.open(tmp_path / "s", clock=clock, **SMALL) as s:
        assert s.run_schedule() == 0
        assert [m.body for m in only(s, "t")] == [b"%d" % i for i in range(5)]


def _schedule_killed_before_its_progress(store) -> None:
    """A schedule step that dies between its put and its progress write."""
    real_set = store.delay_offsets.set
    store.delay_offsets.set = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("killed"))
    try:
        with pytest.raises(RuntimeError):
            store.run_schedule()
    finally:
        store.delay_offsets.set = real_set
    assert store.state.intent()[0] == 1  # the intent is still recorded


def test_interrupted_schedule_step_neither_duplicates_nor_loses(tmp_path, clock):
    """A step that died between its put and its progress write is finished, not redone."""
    with MessageStore.open(tmp_path / "s", clock=clock, **SMALL) as s:
        s.create_topic("t", queues=1)
        s.put_batch([Message("t", b"%d" % i, delay_level=1) for i in range(3)])
        clock.advance(1000)
        _schedule_killed_before_its_progress(s)
        assert s.run_schedule() == 0
        assert [m.body for m in only(s, "t")] == [b"0", b"1", b"2"]
        assert s.delay_offsets.get(1) == 3


def test_retry_path_to_dlq_over_16_reconsumes(store, clock):
    store.put(Message("orders", b"poison", keys=["p-1"], queue_id=0))
    (msg,) = only(store, "orders")
    delays = [10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200]
    retry_offset = 0
    for attempt in range(16):
        r = store.send_back("g1", msg)
        assert r.topic == SCHEDULE_TOPIC and r.queue_id == 3 + attempt - 1
        clock.advance(delays[attempt] * 1000 - 1)
        assert store.run_schedule() == 0
        clock.advance(1)
        assert store.run_schedule() == 1
        (msg,) = only(store, "%RETRY%g1", 0, retry_offset)
        retry_offset += 1
        assert msg.reconsume_times == attempt + 1
        assert msg.properties["RETRY_TOPIC"] == "orders"
        assert msg.body == b"poison" and msg.keys == ["p-1"]
    first_id = only(store, "orders")[0].msg_id
    assert msg.properties["ORIGIN_MESSAGE_ID"] == first_id
    r = store.send_back("g1", msg)  # the 17th failure: dead letter
    assert r.topic == "%DLQ%g1" and r.queue_id == 0
    (dead,) = only(store, "%DLQ%g1")
    assert dead.reconsume_times == 17  # RocketMQ stores reconsumeTimes + 1
    assert dead.properties["ORIGIN_MESSAGE_ID"] == first_id
    assert dead.properties["RETRY_TOPIC"] == "orders"
    assert "DELAY" not in dead.properties
    assert store.topic("%DLQ%g1").read_queue_nums == 1


def test_negative_delay_level_goes_straight_to_dlq(store):
    store.put(Message("orders", b"bad", queue_id=0))
    (msg,) = only(store, "orders")
    r = store.send_back("g2", msg, delay_level=-1)
    assert r.topic == "%DLQ%g2"


def test_group_max_reconsume_times_is_per_group(store):
    store.put(Message("orders", b"x", queue_id=0))
    (msg,) = only(store, "orders")
    r = store.send_back("g3", msg, max_reconsume_times=0)
    assert r.topic == "%DLQ%g3"


def test_interrupted_step_whose_first_message_was_dropped_is_not_redone(tmp_path, clock):
    """The step drops a due message whose topic is gone, so its put starts with the
    second one: recovery must still see that the put landed (else every other
    message of the step is delivered twice)."""
    from tests.store.helpers.admin import delete_topic_as_admin

    with MessageStore.open(tmp_path / "s", clock=clock, **SMALL) as s:
        s.create_topic("gone", queues=1)
        s.create_topic("t", queues=1)
        s.put(Message("gone", b"dropped", delay_level=1))
        s.put_batch([Message("t", b"%d" % i, delay_level=1) for i in range(3)])
        delete_topic_as_admin(s, "gone")
        clock.advance(1000)
        _schedule_killed_before_its_progress(s)
        assert s.run_schedule() == 0
        assert [m.body for m in only(s, "t")] == [b"0", b"1", b"2"]
        assert s.delay_offsets.get(1) == 4


def test_another_writers_record_where_an_interrupted_step_would_start_is_not_its_put(
    tmp_path, clock
):
    """A step died before its put; another writer's message, with the UNIQ_KEY of one
    of the step's messages, lands where the put would have started. Recovery must
    run the step again, not take that record for the delivery and skip the step."""
    with MessageStore.open(tmp_path / "s", clock=clock, **SMALL) as s:
        s.create_topic("t", queues=1)
        s.put_batch(
            [
                Message("t", b"d%d" % i, delay_level=1, properties={"UNIQ_KEY": f"order-{i}"})
                for i in range(3)
            ]
        )
        clock.advance(1000)
        real_append = Append.records
        Append.records = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("killed"))
        with pytest.raises(RuntimeError):
            s.run_schedule()
        Append.records = real_append
        for uniq in ("order-0", "order-2"):  # the step's first id, then a later one
            s.put(Message("t", b"other", properties={"UNIQ_KEY": uniq}))
        assert s.run_schedule() == 3
        assert [m.body for m in only(s, "t")] == [b"other", b"other", b"d0", b"d1", b"d2"]


# --- the service over a store's parts --------------------------------------------------------


def test_a_schedule_service_over_the_stores_parts_delivers_what_is_due_level_by_level(
    tmp_path, clock
):
    from rocketspark.store.schedule import ScheduleService

    with MessageStore.open(tmp_path / "s", clock=clock, **SMALL) as s:
        s.create_topic("t", queues=1)
        s.put_batch([Message("t", b"one-%d" % i, delay_level=1) for i in range(3)])
        s.put_batch([Message("t", b"two-%d" % i, delay_level=2) for i in range(2)])
        service = ScheduleService(
            appender=s.appender,
            encoder=s.encoder,
            queues=s.queues,
            commit_log=s.commit_log,
            topics=s.topics,
            delay_offsets=s.delay_offsets,
            clock=clock,
            levels=len(s.config.delay_levels_ms()),
        )
        assert service.start_offset(1) == 0 and service.start_offset(2) == 0
        assert service.run() == 0  # nothing due yet
        assert service.run(clock.now + 1000, limit_per_level=2) == 2  # level 1 (1s), two at most
        assert service.start_offset(1) == 2 and s.delay_offsets.get(1) == 2
        assert service.run(clock.now + 1000) == 1
        assert [m.body for m in only(s, "t")] == [b"one-0", b"one-1", b"one-2"]
        clock.advance(5000)  # level 2 is 5s
        assert service.run() == 2 and service.run() == 0
        assert service.start_offset(2) == 2
        assert [m.body for m in only(s, "t")][3:] == [b"two-0", b"two-1"]

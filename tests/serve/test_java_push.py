"""RocketMQ's DefaultMQPushConsumer against ``serve``: concurrent and orderly listeners,
rebalance over heartbeats, consumer offsets, send-back to the retry topic and, after
maxReconsumeTimes, to the dead-letter topic; queue locks for the orderly listener.

The consumer is ``tests/serve/java/ServePush.java``, compiled with ``./dev``'s jars by the
``java_program`` fixture of tests/serve/conftest.py (skipped without java or the jars).
"""

from __future__ import annotations

import uuid
from pathlib import Path

from rocketspark.message.model import Message, dlq_topic
from rocketspark.remoting.processors import serve
from rocketspark.store.message_store import MessageStore

FAST = " ".join(["1s"] * 18)


def test_push_concurrently_with_retries_and_dead_letters(java_program, tmp_path: Path) -> None:
    with MessageStore.open(str(tmp_path / "push"), messageDelayLevel=FAST) as store:
        with serve(store, namesrv_port=0, broker_port=0) as srv:
            topic = f"push-{uuid.uuid4().hex[:10]}"
            group = f"pushg-{uuid.uuid4().hex[:8]}"
            store.create_topic(topic, 2)
            keys = [f"ok-{i}" for i in range(10)] + ["fail-0", "fail-1"]
            store.put_batch([Message(topic, k.encode(), keys=(k,)) for k in keys])
            got = java_program(
                "ServePush",
                tmp_path / "home",
                srv.namesrv_address,
                topic,
                group,
                "concurrent",
                10,  # ok keys
                2,  # failing keys
                2,  # maxReconsumeTimes
                90_000,
            )
            ok = {g["key"] for g in got if g["ok"]}
            assert ok == {f"ok-{i}" for i in range(10)}
            failed = [g for g in got if not g["ok"]]
            # Each failing message: delivered, then retried twice, then dead-lettered.
            for key in ("fail-0", "fail-1"):
                times = sorted(g["reconsume"] for g in failed if g["key"] == key)
                assert times == [0, 1, 2], (key, failed)
            dead = store.pull(dlq_topic(group), 0, 0, 10).messages
            assert sorted(m.body for m in dead) == [b"fail-0", b"fail-1"]
            # The group's offsets were committed past what it consumed.
            assert sum(store.committed_offset(group, topic, q) or 0 for q in (0, 1)) == 12


def test_push_orderly(java_program, tmp_path: Path) -> None:
    with MessageStore.open(str(tmp_path / "orderly")) as store:
        with serve(store, namesrv_port=0, broker_port=0) as srv:
            topic = f"order-{uuid.uuid4().hex[:10]}"
            group = f"orderg-{uuid.uuid4().hex[:8]}"
            store.create_topic(topic, 2)
            store.put_batch(
                [
                    Message(topic, b"m", keys=(f"k{q}-{i}",), queue_id=q)
                    for i in range(10)
                    for q in (0, 1)
                ]
            )
            got = java_program(
                "ServePush",
                tmp_path / "home",
                srv.namesrv_address,
                topic,
                group,
                "orderly",
                20,
                0,
                16,
                90_000,
            )
            for q in (0, 1):
                in_queue = [g["offset"] for g in got if g["queue"] == q]
                assert in_queue == list(range(10)), got
            assert srv.broker.locks.held(group) == []  # unlocked as the consumer shut down

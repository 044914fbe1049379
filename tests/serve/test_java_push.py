"""RocketMQ's DefaultMQPushConsumer against ``serve``: concurrent and orderly listeners,
rebalance over heartbeats, consumer offsets, send-back to the retry topic and, after
maxReconsumeTimes, to the dead-letter topic; queue locks for the orderly listener.

The consumer is ``tests/serve/java/ServePush.java``, compiled here with ``./dev``'s jars
(skipped without java or the jars).
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from rocketspark.message.model import Message, dlq_topic
from rocketspark.remoting.processors import serve
from rocketspark.store.message_store import MessageStore
from tests.helpers import jvm
from tests.helpers.rocketmq import parse_lines

JAVA = Path(__file__).resolve().parent / "java"
FAST = " ".join(["1s"] * 18)


@pytest.fixture(scope="module")
def push_classes(rocketmq_java, tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("serve-java")
    jvm.javac(sorted(JAVA.glob("*.java")), rocketmq_java.rocketmq_classpath, out)
    return f"{out}:{rocketmq_java.rocketmq_classpath}"


def _push(classpath: str, home: Path, namesrv: str, *args: object) -> list[dict]:
    cmd = [
        "java",
        "-Xmx256m",
        *jvm.FLAGS,
        *jvm.QUIET,
        f"-Duser.home={home}",
        f"-Drocketmq.client.logRoot={home}",
        "-cp",
        classpath,
        "ServePush",
        namesrv,
        *map(str, args),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return parse_lines(proc.stdout)


def test_push_concurrently_with_retries_and_dead_letters(push_classes: str, tmp_path: Path) -> None:
    with MessageStore.open(str(tmp_path / "push"), messageDelayLevel=FAST) as store:
        with serve(store, namesrv_port=0, broker_port=0) as srv:
            topic = f"push-{uuid.uuid4().hex[:10]}"
            group = f"pushg-{uuid.uuid4().hex[:8]}"
            store.create_topic(topic, 2)
            keys = [f"ok-{i}" for i in range(10)] + ["fail-0", "fail-1"]
            store.put_batch([Message(topic, k.encode(), keys=(k,)) for k in keys])
            got = _push(
                push_classes,
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


def test_push_orderly(push_classes: str, tmp_path: Path) -> None:
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
            got = _push(
                push_classes,
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

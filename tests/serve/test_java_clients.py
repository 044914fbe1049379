"""RocketMQ's own Java client against ``serve``: DefaultMQProducer in, DefaultLitePullConsumer
and DefaultMQPullConsumer out, over a store in ``tmp_path``.

Uses ``tests/helpers/java/RocketClient.java`` (its ``send``, ``produce``, ``consume`` and
``pull`` modes) with the jars of ``./dev`` (skipped without java or the jars); the fixtures
are tests/serve/conftest.py's.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from pathlib import Path

from rocketspark.remoting.processors import Served, serve
from rocketspark.store.message_store import MessageStore
from tests.helpers.rocketmq import body


def _topic() -> str:
    return f"java-{uuid.uuid4().hex[:10]}"


def test_java_producer_then_lite_pull_consumer(
    java_client, served: Served, store: MessageStore, tmp_path: Path
) -> None:
    topic = _topic()
    store.create_topic(topic, 4)
    sent = java_client(served.namesrv_address, tmp_path / "home", "send", topic, 40, "k", 100, 2)
    assert len(sent) == 40
    assert {s.get("status") for s in sent} == {"SEND_OK"}, sent[:3]
    # Every queue's offsets are dense, and the store holds what was sent.
    by_queue: dict[int, list[int]] = {}
    for s in sent:
        by_queue.setdefault(s["queue"], []).append(s["offset"])
    for q, offsets in by_queue.items():
        assert sorted(offsets) == list(range(len(offsets)))
        stored = store.pull(topic, q, 0, 100).messages
        assert {m.keys[0] for m in stored} == {s["key"] for s in sent if s["queue"] == q}
        for m in stored:
            assert m.body == body(m.keys[0], 100)
            assert m.tags == "broker"
    offset_ids = {m.msg_id for q in by_queue for m in store.pull(topic, q, 0, 100).messages}
    assert {s["offsetMsgId"] for s in sent} == offset_ids

    group = f"lite-{uuid.uuid4().hex[:8]}"
    got = java_client(served.namesrv_address, tmp_path / "home", "consume", topic, group, 40)
    assert len(got) == 40
    assert sorted(g["key"] for g in got) == sorted(s["key"] for s in sent)
    for g in got:
        assert bytes.fromhex(g["body"]) == body(g["key"], 100)
        assert g["tags"] == "broker"


def test_java_batch_sends_and_pull_consumer(
    java_client, served: Served, store: MessageStore, tmp_path: Path
) -> None:
    topic = _topic()
    store.create_topic(topic, 2)
    messages = [
        {
            "body": base64.b64encode(f"batch-{i}".encode()).decode(),
            "tags": "TagB",
            "keys": [f"bk{i}"],
            "queue": {"broker": store.config.broker_name, "queueId": i % 2},
        }
        for i in range(20)
    ]
    spec = {"topic": topic, "messages": messages, "batch": 5}
    sent = java_client(served.namesrv_address, tmp_path / "home", "produce", stdin=json.dumps(spec))
    assert len(sent) == 20
    assert all("error" not in s for s in sent), sent[:3]
    for q in (0, 1):
        stored = store.pull(topic, q, 0, 100).messages
        assert [m.body for m in stored] == [f"batch-{i}".encode() for i in range(q, 20, 2)]
        assert [list(m.keys) for m in stored] == [[f"bk{i}"] for i in range(q, 20, 2)]
    pulled = java_client(
        served.namesrv_address,
        tmp_path / "home",
        "pull",
        stdin=json.dumps({"topic": topic, "expected": 20, "tags": "TagB", "timeoutMs": 30000}),
    )
    assert len(pulled) == 20


def test_java_transactional_producer(java_client, tmp_path: Path) -> None:
    """A commit, a rollback and one left UNKNOW that the server's check-back resolves."""
    with MessageStore.open(str(tmp_path / "tx"), transactionTimeOut=1000) as store:
        with serve(store, namesrv_port=0, broker_port=0) as srv:
            topic = _topic()
            store.create_topic(topic, 1)
            states = [("COMMIT", "ROLLBACK"), ("ROLLBACK", "COMMIT"), ("UNKNOW", "COMMIT")]
            spec = {
                "topic": topic,
                "messages": [
                    {
                        "body": base64.b64encode(f"tx-{i}".encode()).decode(),
                        "keys": [f"tx{i}"],
                        "local": local,
                        "check": check,
                    }
                    for i, (local, check) in enumerate(states)
                ],
                "waitChecks": 1,
                "checkTimeoutMs": 60000,
            }
            out = java_client(
                srv.namesrv_address, tmp_path / "home", "transact", stdin=json.dumps(spec)
            )
            sent = [o for o in out if "index" in o]
            checks = [o for o in out if "check" in o]
            assert [s["status"] for s in sent] == ["SEND_OK"] * 3, sent
            assert [s["localState"] for s in sent] == [
                "COMMIT_MESSAGE",
                "ROLLBACK_MESSAGE",
                "UNKNOW",
            ]
            assert [c["check"] for c in checks] == [2], checks
            assert checks[0]["answer"] == "COMMIT_MESSAGE"
            deadline = time.monotonic() + 10
            while store.max_offset(topic, 0) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            stored = store.pull(topic, 0, 0, 10).messages
            assert sorted(m.body for m in stored) == [b"tx-0", b"tx-2"]
            assert store.open_transactions() == []


def test_java_check_back_names_the_real_topic_and_queue(java_client, tmp_path: Path) -> None:
    """The message a check-back hands the producer's check listener carries the topic and
    queue it was sent to (REAL_TOPIC / REAL_QID restored), not the half topic's."""
    with MessageStore.open(str(tmp_path / "tx"), transactionTimeOut=1000) as store:
        with serve(store, namesrv_port=0, broker_port=0) as srv:
            topic = _topic()
            store.create_topic(topic, 4)
            spec = {
                "topic": topic,
                "messages": [
                    {
                        "body": base64.b64encode(f"tx-{i}".encode()).decode(),
                        "keys": [f"tx{i}"],
                        "local": "UNKNOW",
                        "check": "COMMIT",
                    }
                    for i in range(3)
                ],
                "waitChecks": 3,
                "checkTimeoutMs": 60000,
            }
            out = java_client(
                srv.namesrv_address, tmp_path / "home", "transact", stdin=json.dumps(spec)
            )
            sent = {o["index"]: o for o in out if "index" in o}
            checks = [o for o in out if "check" in o]
            assert {c["check"] for c in checks} == {0, 1, 2}, checks
            assert len({s["queueId"] for s in sent.values()}) > 1, sent  # not all on queue 0
            for c in checks:
                assert c["topic"] == topic, c
                assert c["queueId"] == sent[c["check"]]["queueId"], (c, sent)
            deadline = time.monotonic() + 10
            while (
                sum(store.max_offset(topic, q) for q in range(4)) < 3
                and time.monotonic() < deadline
            ):
                time.sleep(0.05)
            for i, s in sent.items():
                stored = store.pull(topic, s["queueId"], 0, 10).messages
                assert f"tx-{i}".encode() in [m.body for m in stored], (i, s)
            assert store.open_transactions() == []

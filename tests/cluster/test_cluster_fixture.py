"""The run's real RocketMQ cluster (``rocketmq_cluster``): what later tests rely on.

A NameServer and two masters, broker-a and broker-b, on loopback; RocketMQ's own Java
producer, pull consumer and admin client drive it. Shown here: both brokers are routed,
with the test settings and every port on loopback; a topic created on both has its
queues on both; what the Java producer sends (tags, keys, user properties, non-ASCII
text, batches, explicit queues) the Java consumer reads back exactly, from both brokers;
a consumer's commits show in the consumer progress; the brokers check undecided
transactions back within seconds; a broker SIGKILLed and restarted keeps every
acknowledged message.

Marked ``cluster``: ``-m "not cluster"`` deselects them. Needs java, javac and the jars
``./dev setup`` fetches; under CI their absence fails.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from tests.helpers.cluster import BROKERS, unique_topic
from tests.helpers.jvm import listening

pytestmark = pytest.mark.cluster


def _messages(n: int, prefix: str) -> list[dict]:
    """Messages with every kind of content: non-ASCII and binary bodies, tags (some
    none), several keys, user properties with non-ASCII values (some none)."""
    out = []
    for i in range(n):
        m: dict = {
            "body": f"{prefix}-{i} héllo wörld 世界 🚀 ".encode() + bytes(range(i % 7, 256, 37)),
            "keys": [f"{prefix}-{i}", f"客户-{i % 3}"],
        }
        if i % 4:
            m["tags"] = ["created", "paid", "shipped"][i % 3] if i % 5 else "标签"
        if i % 3:
            m["properties"] = {"index": str(i), "città": f"Zürich №{i} ✓", "empty-ish": " x "}
        out.append(m)
    return out


def _position(r: dict) -> tuple[str, int, int]:
    return (r["brokerName"], r["queueId"], r["queueOffset"])


def test_both_brokers_are_routed(rocketmq_cluster):
    c = rocketmq_cluster
    print(f"\ncluster start (s): {c.timings}")
    assert c.namesrv.startswith("127.0.0.1:")
    listed = {(r["brokerName"], r["brokerId"], r["addr"], r["cluster"]) for r in c.cluster_info()}
    assert listed == {(b, 0, c.addr(b), "DefaultCluster") for b in BROKERS}
    assert set(c.broker_addrs) == set(BROKERS)
    assert all(a.startswith("127.0.0.1:") for a in c.broker_addrs.values())


def test_settings_and_loopback_only(rocketmq_cluster):
    c = rocketmq_cluster
    for name in BROKERS:
        conf = c.broker_config(name)
        assert {k: conf[k] for k in ("brokerName", "brokerClusterName", "brokerId")} == {
            "brokerName": name,
            "brokerClusterName": "DefaultCluster",
            "brokerId": "0",
        }
        assert conf["autoCreateTopicEnable"] == "true"
        assert conf["waitTimeMillsInSendQueue"] == "3000"
        assert (conf["transactionTimeOut"], conf["transactionCheckInterval"]) == ("3000", "2000")
        assert conf["transactionOpBatchInterval"] == "500"
        assert conf["timerFlushIntervalMs"] == "60000"
    # every port of every JVM is on loopback, the brokers' HA acceptor's too
    ports = {name: listening(pid) for name, pid in c.pids().items()}
    assert all(host == "127.0.0.1" for found in ports.values() for host, _ in found), ports
    assert ports["namesrv"] == {("127.0.0.1", int(c.namesrv.split(":")[1]))}
    for name in BROKERS:
        port = c.brokers[name].port
        # the broker's port, its fast port (port - 2), its HA acceptor (port + 1)
        assert {("127.0.0.1", p) for p in (port, port - 2, port + 1)} <= ports[name]
    assert ports["java client"] == set()


def test_topic_created_on_both_brokers_has_eight_queues(rocketmq_cluster):
    c = rocketmq_cluster
    topic = unique_topic("eight")
    route = c.create_topic(topic, queues=4)
    assert [(r["brokerName"], r["readQueueNums"], r["writeQueueNums"]) for r in route] == [
        ("broker-a", 4, 4),
        ("broker-b", 4, 4),
    ]
    assert c.route(topic) == route
    one = unique_topic("one")
    assert [r["brokerName"] for r in c.create_topic(one, queues=2, brokers=["broker-b"])] == [
        "broker-b"
    ]


def test_java_producer_to_java_consumer_over_both_brokers(rocketmq_cluster):
    c = rocketmq_cluster
    topic = unique_topic("roundtrip")
    c.create_topic(topic, queues=4)
    single = _messages(40, "single")
    batched = _messages(30, "batch")
    placed = [{**m, "queue": (BROKERS[i % 2], i % 4)} for i, m in enumerate(_messages(8, "pin"))]

    sent = c.produce(topic, single)
    sent += c.produce(topic, batched, batch=10)
    pinned = c.produce(topic, placed)
    sent += pinned
    messages = single + batched + placed
    # explicit queues are honoured; the producer spreads the rest over all 8 queues
    assert [(r["brokerName"], r["queueId"]) for r in pinned] == [m["queue"] for m in placed]
    queues = Counter((r["brokerName"], r["queueId"]) for r in sent)
    assert set(queues) == {(b, q) for b in BROKERS for q in range(4)}
    assert len({_position(r) for r in sent}) == len(sent)
    # a batch lands as consecutive offsets of one queue
    for r0, r1 in zip(sent[40:49], sent[41:50], strict=True):
        assert _position(r1) == (r0["brokerName"], r0["queueId"], r0["queueOffset"] + 1)

    got = c.pull(topic, expected=len(sent))
    by_position = {_position(r): r for r in got}
    assert len(by_position) == len(got) == len(sent)
    assert set(by_position) == {_position(r) for r in sent}
    for m, r in zip(messages, sent, strict=True):
        x = by_position[_position(r)]
        assert x["topic"] == topic
        assert x["body"] == m["body"]
        assert x.get("tags") == m.get("tags")
        assert x["keys"] == " ".join(m["keys"])
        assert x["properties"] == m.get("properties", {})
        # a batch's messages are read back with the batch's msgId, not their own
        assert x["msgId"] == x["systemProperties"]["UNIQ_KEY"] == r.get("batchMsgId", r["msgId"])
        assert x["offsetMsgId"] == r["offsetMsgId"]
        assert x["reconsumeTimes"] == 0
        assert 0 < x["bornTimestamp"] <= x["storeTimestamp"] <= time.time() * 1000 + 1000
    assert len({r["msgId"] for r in sent}) == len(sent)
    assert len({r["batchMsgId"] for r in sent if "batchMsgId" in r}) == 3


def test_consumer_progress_after_a_java_consumer_commits(rocketmq_cluster):
    c = rocketmq_cluster
    topic = unique_topic("progress")
    c.create_topic(topic, queues=4)
    sent = c.produce(topic, _messages(24, "p"))
    max_offsets = Counter((r["brokerName"], r["queueId"]) for r in sent)
    group = f"{topic}-group"

    def progress() -> dict:
        return {
            (r["brokerName"], r["queueId"]): (r["brokerOffset"], r["consumerOffset"])
            for r in c.consumer_progress(group, topic)
        }

    assert progress() == {(b, q): (max_offsets[(b, q)], 0) for b in BROKERS for q in range(4)}
    # read and commit broker-b's queue 1 to its end, and broker-a's queue 2 up to 1
    end_b1 = max_offsets[("broker-b", 1)]
    read = c.pull(topic, queues=[("broker-b", 1, 0), ("broker-a", 2, 0)], group=group, commit=True)
    assert Counter((r["brokerName"], r["queueId"]) for r in read) == {
        ("broker-b", 1): end_b1,
        ("broker-a", 2): max_offsets[("broker-a", 2)],
    }
    c.pull(topic, queues=[("broker-a", 2, 0)], max_messages=1, group=group, commit=True)
    want = {(b, q): (max_offsets[(b, q)], 0) for b in BROKERS for q in range(4)}
    want[("broker-b", 1)] = (end_b1, end_b1)
    want[("broker-a", 2)] = (max_offsets[("broker-a", 2)], 1)
    assert progress() == want
    # a consumer of the group (in a JVM of its own) resumes from the committed offsets
    rest = c.pull(
        topic, start="committed", group=group, expected=len(sent) - end_b1 - 1, separate=True
    )
    assert len(rest) == len(sent) - end_b1 - 1
    assert ("broker-b", 1) not in {(r["brokerName"], r["queueId"]) for r in rest}


def test_transaction_check_back_within_a_test(rocketmq_cluster):
    c = rocketmq_cluster
    topic = unique_topic("tx")
    c.create_topic(topic, queues=2)
    messages = [
        {"body": "committed", "keys": ["tx-0"], "local": "COMMIT"},
        {"body": "rolled back", "keys": ["tx-1"], "local": "ROLLBACK"},
        {"body": "checked: commit", "keys": ["tx-2"], "local": "UNKNOW", "check": "COMMIT"},
        {"body": "checked: rollback", "keys": ["tx-3"], "local": "UNKNOW", "check": "ROLLBACK"},
    ]
    t0 = time.monotonic()
    sends, checks = c.transact(topic, messages, wait_checks=2, check_timeout=60)
    took = time.monotonic() - t0
    print(f"\ncheck-backs after (ms): {[r['afterMs'] for r in checks]}; transact {took:.1f} s")
    assert [r["localState"] for r in sends] == [
        "COMMIT_MESSAGE",
        "ROLLBACK_MESSAGE",
        "UNKNOW",
        "UNKNOW",
    ]
    # only the undecided are checked back, after the transaction timeout (3 s)
    assert sorted({r["check"] for r in checks}) == [2, 3]
    assert all(r["afterMs"] >= 3000 for r in checks)
    got = c.pull(topic, expected=2)
    assert sorted(r["body"] for r in got) == [b"checked: commit", b"committed"]
    assert all(r["msgId"] in {s["msgId"] for s in sends} for r in got)


def test_broker_b_killed_and_restarted_keeps_acknowledged_messages(rocketmq_cluster):
    c = rocketmq_cluster
    topic = unique_topic("crash")
    c.create_topic(topic, queues=4)
    before = c.produce(topic, _messages(60, "before"), batch=5)
    assert {r["brokerName"] for r in before} == set(BROKERS)

    c.kill("broker-b")
    assert [r["brokerName"] for r in c.route(topic)] == ["broker-a"]
    during = c.produce(topic, _messages(10, "during"), separate=True)
    assert {r["brokerName"] for r in during} == {"broker-a"}

    took = c.restart("broker-b")
    print(f"\nbroker-b restart after SIGKILL: {took:.1f} s; {c.timings}")
    assert [r["brokerName"] for r in c.route(topic)] == list(BROKERS)
    after = c.produce(topic, _messages(16, "after"))
    acked = before + during + after
    got = {_position(r): r for r in c.pull(topic, expected=len(acked))}
    assert set(got) == {_position(r) for r in acked}
    for r in acked:
        assert got[_position(r)]["msgId"] == r.get("batchMsgId", r["msgId"])

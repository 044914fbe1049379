"""RocketMQ's ``mqadmin`` against ``serve``: the common commands on a store in ``tmp_path``.

One JVM per command (MQAdminStartup from ``./dev``'s rocketmq-tools jar: the ``mqadmin``
fixture of tests/serve/conftest.py); skipped without java or the jars.
"""

from __future__ import annotations

import uuid

from rocketspark.remoting.processors import Served
from rocketspark.store.message_store import MessageStore


def test_mqadmin_commands(mqadmin, store: MessageStore, served: Served) -> None:
    topic = f"admin-{uuid.uuid4().hex[:10]}"
    out = mqadmin(
        "updateTopic", "-c", store.config.broker_cluster_name, "-t", topic, "-r", "2", "-w", "2"
    )
    assert "success" in out
    assert store.topic(topic).write_queue_nums == 2
    assert topic in mqadmin("topicList").split()
    route = mqadmin("topicRoute", "-t", topic)
    assert served.broker_address in route and '"readQueueNums":2' in route

    sent = mqadmin("sendMessage", "-t", topic, "-p", "hello", "-k", "key1", "-c", "tagA")
    assert "SEND_OK" in sent
    (msg,) = [m for q in (0, 1) for m in store.pull(topic, q, 0, 10).messages]
    assert (msg.body, msg.tags, list(msg.keys)) == (b"hello", "tagA", ["key1"])

    status = mqadmin("topicStatus", "-t", topic)
    rows = [
        line.split() for line in status.splitlines() if line.startswith(store.config.broker_name)
    ]
    assert sorted((int(r[1]), int(r[2]), int(r[3])) for r in rows) == sorted(
        [(msg.queue_id, 0, 1), (1 - msg.queue_id, 0, 0)]
    )
    cluster = mqadmin("clusterList")
    assert served.broker_address in cluster

    by_key = mqadmin("queryMsgByKey", "-t", topic, "-k", "key1")
    assert msg.uniq_key in by_key
    by_id = mqadmin("queryMsgById", "-t", topic, "-i", msg.uniq_key)
    assert "key1" in by_id and "tagA" in by_id

    group = f"admin-group-{uuid.uuid4().hex[:8]}"
    store.commit_offset(group, topic, msg.queue_id, 1)
    progress = mqadmin("consumerProgress", "-g", group)
    assert topic in progress

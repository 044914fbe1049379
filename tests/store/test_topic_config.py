"""topics.json (TopicConfigTable): RocketMQ's fields, dataVersion, TopicInfo, the shrink check."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rocketspark.store.metadata import read_json
from rocketspark.store.topic_config import TopicConfigTable

BROKER_TOPICS = (
    "{\n"
    '\t"dataVersion":{\n'
    '\t\t"counter":2,\n'
    '\t\t"stateVersion":0,\n'
    '\t\t"timestamp":1700000000000\n'
    "\t},\n"
    '\t"topicConfigTable":{\n'
    '\t\t"SCHEDULE_TOPIC_XXXX":{\n'
    '\t\t\t"attributes":{},\n'
    '\t\t\t"order":false,\n'
    '\t\t\t"perm":6,\n'
    '\t\t\t"readQueueNums":18,\n'
    '\t\t\t"topicFilterType":"SINGLE_TAG",\n'
    '\t\t\t"topicName":"SCHEDULE_TOPIC_XXXX",\n'
    '\t\t\t"topicSysFlag":0,\n'
    '\t\t\t"writeQueueNums":18\n'
    "\t\t},\n"
    '\t\t"TopicTest":{\n'
    '\t\t\t"attributes":{"+message.type":"NORMAL"},\n'
    '\t\t\t"order":false,\n'
    '\t\t\t"perm":6,\n'
    '\t\t\t"readQueueNums":4,\n'
    '\t\t\t"topicFilterType":"SINGLE_TAG",\n'
    '\t\t\t"topicName":"TopicTest",\n'
    '\t\t\t"topicSysFlag":0,\n'
    '\t\t\t"writeQueueNums":4\n'
    "\t\t}\n"
    "\t}\n"
    "}"
)


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    d = tmp_path / "store" / "config"
    d.mkdir(parents=True)
    return d


def text_of(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_topics_written_by_a_broker_are_read_and_their_fields_kept(config_dir):
    (config_dir / "topics.json").write_text(BROKER_TOPICS)
    table = TopicConfigTable(config_dir)
    assert table.names() == ["SCHEDULE_TOPIC_XXXX", "TopicTest"]
    assert table.get("SCHEDULE_TOPIC_XXXX")["readQueueNums"] == 18
    assert table.get("nope") is None
    table.create("TopicTest", 8, 8)
    data = read_json(config_dir / "topics.json")
    assert data["dataVersion"]["counter"] == 3
    assert data["topicConfigTable"]["TopicTest"] == {
        "attributes": {"+message.type": "NORMAL"},
        "order": False,
        "perm": 6,
        "readQueueNums": 8,
        "topicFilterType": "SINGLE_TAG",
        "topicName": "TopicTest",
        "topicSysFlag": 0,
        "writeQueueNums": 8,
    }


def test_create_topic_writes_rocketmqs_fields_and_bumps_data_version(config_dir):
    table = TopicConfigTable(config_dir)
    table.create("TopicA", 4, 4)
    text = text_of(config_dir / "topics.json")
    assert text.startswith('{"dataVersion":{"counter":1,"stateVersion":0,"timestamp":')
    assert text.endswith(
        '"topicConfigTable":{"TopicA":{"attributes":{},"order":false,"perm":6,'
        '"readQueueNums":4,"topicFilterType":"SINGLE_TAG","topicName":"TopicA",'
        '"topicSysFlag":0,"writeQueueNums":4}}}'
    )
    stamp = os.stat(config_dir / "topics.json").st_ino
    table.create("TopicA", 4, 4)  # unchanged: not written
    assert os.stat(config_dir / "topics.json").st_ino == stamp
    table.create("TopicA", 4, 2, perm=4, order=True)
    assert table.get("TopicA")["writeQueueNums"] == 2
    assert table.get("TopicA")["perm"] == 4
    assert table.get("TopicA")["order"] is True
    assert read_json(config_dir / "topics.json")["dataVersion"]["counter"] == 2
    assert TopicConfigTable(config_dir).get("TopicA") == table.get("TopicA")


def test_get_returns_a_copy(config_dir):
    table = TopicConfigTable(config_dir)
    table.create("TopicA", 4, 4)
    table.get("TopicA")["readQueueNums"] = 99
    assert table.get("TopicA")["readQueueNums"] == 4


def test_check_shrink_refuses_to_drop_queues_holding_or_awaiting_messages(tmp_path):
    from types import SimpleNamespace

    from rocketspark.errors import TopicShrinkError
    from rocketspark.message.model import PROPERTY_REAL_QUEUE_ID, PROPERTY_REAL_TOPIC

    topics = TopicConfigTable(str(tmp_path))
    topics.create("t", 4, 4)

    def bound_for(topic, queue):
        props = {PROPERTY_REAL_TOPIC: topic, PROPERTY_REAL_QUEUE_ID: str(queue)}
        return SimpleNamespace(properties=props)

    def check(queues, holding=(), pending=()):
        topics.check_shrink(
            "t", queues, holds_messages=lambda q: q in holding, pending=lambda: pending
        )

    check(2)  # the dropped queues are empty and nothing is bound for them
    check(8, holding={0, 1, 2, 3})  # growing hides nothing
    check(2, pending=[bound_for("t", 1), bound_for("other", 3)])  # kept, or another topic's
    with pytest.raises(TopicShrinkError, match=r"queue\(s\) 2, 3"):
        check(2, holding={3}, pending=[bound_for("t", 2)])
    topics.check_shrink("absent", 1, holds_messages=lambda q: True, pending=lambda: ())


def test_info_reads_a_topic_config_as_topic_info(tmp_path):
    from rocketspark.message.model import TopicInfo

    topics = TopicConfigTable(str(tmp_path))
    topics.create("t", 2, 3, perm=4, order=True)
    assert topics.info("t") == TopicInfo("t", 2, 3, 4, True)
    assert topics.info("absent") is None


def test_create_if_absent_leaves_a_topic_made_meanwhile(config_dir):
    table = TopicConfigTable(config_dir)
    TopicConfigTable(config_dir).create("T", 3, 3, perm=4)  # another process, say
    table.create("T", 1, 1, if_absent=True)
    assert (table.get("T") or {})["readQueueNums"] == 3
    assert (TopicConfigTable(config_dir).get("T") or {})["perm"] == 4
    table.create("U", 1, 1, if_absent=True)
    assert (TopicConfigTable(config_dir).get("U") or {})["writeQueueNums"] == 1

"""They write, we read: a store written by Apache RocketMQ 5.3.1's own store code.

The data (tests/store/data/rocketmq-5-store, see its README) holds 61 messages:
two topics with two queues each, IPv6 born and store hosts, a 140-character
topic (v2 magic), a 0-length body, non-ASCII tags. expected.json is what the
real store read back.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import shutil

import pytest

from rocketspark.store import Message, MessageStore, PullStatus
from rocketspark.store.store_check import check_store

DATA = os.path.join(os.path.dirname(__file__), "data", "rocketmq-5-store")
SIZES = dict(
    mappedFileSizeCommitLog=4096,
    mappedFileSizeConsumeQueue=1280,
    maxHashSlotNum=64,
    maxIndexNum=256,
)

with open(os.path.join(DATA, "expected.json"), encoding="utf-8") as _f:
    EXPECTED = json.load(_f)


def host(text: str) -> tuple[ipaddress._BaseAddress, int]:
    addr, _, port = text.rpartition(":")
    return ipaddress.ip_address(addr.strip("[]/")), int(port)


@pytest.fixture
def golden(tmp_path):
    path = tmp_path / "golden"
    shutil.copytree(DATA, path)
    return path


def check_message(m, e):
    assert m.topic == e["topic"]
    assert (m.queue_id, m.queue_offset) == (e["queueId"], e["queueOffset"])
    assert (m.commitlog_offset, m.store_size) == (e["commitLogOffset"], e["storeSize"])
    assert m.msg_id == e["msgId"]
    assert m.body_crc == e["bodyCRC"] and m.sys_flag == e["sysFlag"]
    assert (m.born_timestamp, m.store_timestamp) == (e["bornTimestamp"], e["storeTimestamp"])
    assert host(str(m.born_host)) == host(e["bornHost"])
    assert host(str(m.store_host)) == host(e["storeHost"])
    assert (m.reconsume_times, m.flag) == (e["reconsumeTimes"], e["flag"])
    assert m.prepared_transaction_offset == e["preparedTransactionOffset"]
    assert m.body == base64.b64decode(e["body"])
    assert dict(m.properties) == e["properties"]


def test_every_message_reads_back_through_pull(golden):
    by_queue: dict[tuple[str, int], list[dict]] = {}
    for e in EXPECTED["messages"]:
        by_queue.setdefault((e["topic"], e["queueId"]), []).append(e)
    with MessageStore.open(golden, **SIZES) as store:
        assert not store.recovery_report.abnormal_exit
        seen = 0
        for (topic, qid), want in by_queue.items():
            assert store.max_offset(topic, qid) == len(want)
            res = store.pull(topic, qid, 0, max_msgs=100)
            assert res.status is PullStatus.FOUND
            assert len(res.messages) == len(want)
            for m, e in zip(
                res.messages, sorted(want, key=lambda e: e["queueOffset"]), strict=True
            ):
                check_message(m, e)
                seen += 1
        assert seen == EXPECTED["messageCount"] == 61


def test_every_message_reads_back_through_arrow(golden):
    with MessageStore.open(golden, **SIZES) as store:
        for topic, qid in {(e["topic"], e["queueId"]) for e in EXPECTED["messages"]}:
            want = sorted(
                (e for e in EXPECTED["messages"] if (e["topic"], e["queueId"]) == (topic, qid)),
                key=lambda e: e["queueOffset"],
            )
            batches, nxt = store.read_batches(topic, qid, 0, None)
            rows = [r for b in batches for r in b.to_pylist()]
            assert nxt == len(want) == len(rows)
            for r, e in zip(rows, want, strict=True):
                assert r["msgId"] == e["msgId"] and r["body"] == base64.b64decode(e["body"])
                assert dict(r["properties"]) == {
                    k: v
                    for k, v in e["properties"].items()
                    if k not in ("TAGS", "KEYS", "UNIQ_KEY")
                }
                assert r["tags"] == e["properties"].get("TAGS")
                assert r["uniqKey"] == e["properties"].get("UNIQ_KEY")
                assert r["queueOffset"] == e["queueOffset"]
                assert host(r["bornHost"]) == host(e["bornHost"])
                assert int(r["storeTimestamp"].timestamp() * 1000) == e["storeTimestamp"]


@pytest.mark.parametrize(
    "columns", [("body", "msgId"), ("bornHost", "storeHost", "queueOffset"), ("properties",)]
)
def test_some_columns_read_back_as_in_the_full_read(golden, columns):
    """IPv6 hosts (the per-record path), the v2 magic and a tag filter without the tags."""
    with MessageStore.open(golden, **SIZES) as store:
        for topic, qid in {(e["topic"], e["queueId"]) for e in EXPECTED["messages"]}:
            for expression in ("*", "TagA || 标签"):
                full, nxt = store.read_batches(topic, qid, 0, None, expression)
                some, nxt2 = store.read_batches(topic, qid, 0, None, expression, columns=columns)
                assert nxt == nxt2
                want = [{c: r[c] for c in columns} for b in full for r in b.to_pylist()]
                assert [r for b in some for r in b.to_pylist()] == want
                assert all(b.schema.names == list(columns) for b in some)


def test_index_queries_match_rocketmq(golden):
    with MessageStore.open(golden, **SIZES) as store:
        for q in EXPECTED["indexQueries"]:
            found = store.query_by_key(q["topic"], q["key"])
            assert sorted(m.commitlog_offset for m in found) == sorted(q["commitLogOffsets"])


def test_store_check_passes_on_the_golden_store(golden):
    report = check_store(str(golden))
    assert report.ok, report.render()
    assert report.records == 61


def test_writing_continues_where_rocketmq_stopped(golden):
    with MessageStore.open(golden, **SIZES) as store:
        r = store.put(Message("GoldenTopicB", b"from rocketspark", tags="TagA", queue_id=1))
        assert r.queue_offset == 15
        assert r.commitlog_offset == EXPECTED["commitLogMaxOffset"]
    with MessageStore.open(golden, **SIZES) as store:
        res = store.pull("GoldenTopicB", 1, 14, max_msgs=10)
        assert [m.queue_offset for m in res.messages] == [14, 15]
        assert res.messages[-1].body == b"from rocketspark"
    assert check_store(str(golden)).ok


def test_a_brokers_store_opens_with_default_settings_in_its_own_geometry(golden):
    """Nothing says what sizes a broker used: they are read off its files (segment
    spacing, ConsumeQueue file size, index file size) and recorded, not imposed."""
    sizes = {
        os.path.join(d, p): os.path.getsize(os.path.join(d, p))
        for d, _, names in os.walk(golden)
        for p in names
    }
    with MessageStore.open(golden) as store:
        assert {
            k: getattr(store.config, f)
            for k, f in [
                ("mappedFileSizeCommitLog", "mapped_file_size_commit_log"),
                ("mappedFileSizeConsumeQueue", "mapped_file_size_consume_queue"),
                ("maxHashSlotNum", "max_hash_slot_num"),
                ("maxIndexNum", "max_index_num"),
            ]
        } == SIZES
        got = [
            m
            for e in EXPECTED["messages"][:5]
            for m in store.pull(e["topic"], e["queueId"], e["queueOffset"], 1).messages
        ]
        assert [m.msg_id for m in got] == [e["msgId"] for e in EXPECTED["messages"][:5]]
    for path, size in sizes.items():
        assert os.path.getsize(path) == size, path
    with open(os.path.join(golden, "rocketspark.geometry"), encoding="ascii") as f:
        assert "mappedFileSizeConsumeQueue=1280" in f.read()

"""The config/ JSON files: fastjson's bare integer keys, .bak fallback, several processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rocketspark.errors import CorruptRecordError, InvalidNameError
from rocketspark.message.fastjson import loads_lenient
from rocketspark.store import metadata
from rocketspark.store.metadata import (
    ConsumerOffsetTable,
    DelayOffsetTable,
    SubscriptionGroupTable,
    read_json,
    write_json,
)
from rocketspark.store.topic_config import TopicConfigTable

ROOT = Path(__file__).resolve().parents[2]

# consumerOffset.json as a RocketMQ 5.x broker writes it: fastjson PrettyFormat with
# bare integer keys (see tests/message/test_fastjson.py), plus the manager's dataVersion.
BROKER_CONSUMER_OFFSET_5 = (
    "{\n"
    '\t"dataVersion":{\n'
    '\t\t"counter":3,\n'
    '\t\t"stateVersion":0,\n'
    '\t\t"timestamp":1700000000000\n'
    "\t},\n"
    '\t"offsetTable":{\n'
    '\t\t"TopicA@GroupA":{0:120,1:98\n'
    "\t\t},\n"
    '\t\t"TopicA@GroupB":{0:5\n'
    "\t\t},\n"
    '\t\t"%RETRY%GroupA@GroupA":{0:7\n'
    "\t\t}\n"
    "\t}\n"
    "}"
)

BROKER_SUBSCRIPTION_GROUP = (
    '{"dataVersion":{"counter":1,"stateVersion":0,"timestamp":1700000000000},'
    '"forbiddenTable":{},'
    '"subscriptionGroupTable":{"GroupA":{"attributes":{},"brokerId":0,'
    '"consumeBroadcastEnable":true,"consumeEnable":true,"consumeFromMinEnable":true,'
    '"consumeMessageOrderly":false,"consumeTimeoutMinute":15,"groupName":"GroupA",'
    '"groupRetryPolicy":{"type":"CUSTOMIZED"},"groupSysFlag":0,'
    '"notifyConsumerIdsChangedEnable":true,"retryMaxTimes":3,"retryQueueNums":1,'
    '"whichBrokerWhenConsumeSlowly":1}}}'
)


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    d = tmp_path / "store" / "config"
    d.mkdir(parents=True)
    return d


def text_of(path: Path) -> str:
    return path.read_text(encoding="utf-8")


# -- atomic files --------------------------------------------------------------------


def test_write_json_keeps_the_previous_file_as_bak(tmp_path):
    path = tmp_path / "config" / "delayOffset.json"
    write_json(path, {"offsetTable": {1: 0}})
    assert text_of(path) == '{"offsetTable":{1:0}}'
    assert not os.path.exists(f"{path}.bak")
    write_json(path, {"offsetTable": {1: 0, 3: 57}})
    assert text_of(path) == '{"offsetTable":{1:0,3:57}}'
    assert text_of(Path(f"{path}.bak")) == '{"offsetTable":{1:0}}'
    assert not os.path.exists(f"{path}.tmp")
    assert read_json(path) == {"offsetTable": {"1": 0, "3": 57}}
    write_json(path, {"a": {2: 1}}, bare_int_keys=False)
    assert text_of(path) == '{"a":{"2":1}}'


def test_backup_is_copied_where_hard_links_are_not_supported(tmp_path, monkeypatch):
    def no_links(src, dst):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    path = tmp_path / "x.json"
    write_json(path, {"v": 1})
    write_json(path, {"v": 2})
    assert read_json(Path(f"{path}.bak")) == {"v": 1}
    assert read_json(path) == {"v": 2}


def test_read_json_of_nothing_is_none(tmp_path):
    assert read_json(tmp_path / "absent.json") is None


def test_a_damaged_file_never_replaces_a_good_backup(tmp_path):
    path = tmp_path / "x.json"
    write_json(path, {"v": 1})
    write_json(path, {"v": 2})
    path.write_bytes(b'{"v":')  # torn
    write_json(path, {"v": 3})
    assert read_json(Path(f"{path}.bak")) == {"v": 1}
    assert read_json(path) == {"v": 3}


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(
            lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), id="truncated"
        ),
        pytest.param(lambda p: p.write_bytes(b"\x00\xff\xfe garbage \x01"), id="garbage"),
        pytest.param(lambda p: p.write_bytes(b""), id="empty"),
        pytest.param(lambda p: p.write_bytes(b"  \n"), id="blank"),
        pytest.param(lambda p: p.write_bytes(b"[1, 2]"), id="wrong-shape"),
        pytest.param(lambda p: p.unlink(), id="missing"),
    ],
)
def test_offsets_fall_back_to_bak(config_dir, damage):
    table = ConsumerOffsetTable(config_dir)
    table.commit("GroupA", "TopicA", 0, 10)
    table.commit("GroupA", "TopicA", 0, 11)  # .bak now holds offset 10
    damage(config_dir / "consumerOffset.json")
    assert ConsumerOffsetTable(config_dir).query("GroupA", "TopicA", 0) == 10
    # The damaged file is not made the backup: the next commit keeps the good .bak.
    reopened = ConsumerOffsetTable(config_dir)
    reopened.commit("GroupA", "TopicA", 1, 5)
    assert read_json(config_dir / "consumerOffset.json.bak") == {
        "offsetTable": {"TopicA@GroupA": {"0": 10}}
    }
    assert ConsumerOffsetTable(config_dir).offsets_of_group("GroupA") == {
        ("TopicA", 0): 10,
        ("TopicA", 1): 5,
    }


def test_both_files_unreadable_is_corruption(config_dir):
    path = config_dir / "consumerOffset.json"
    path.write_text('{"offsetTable":{"T@G":{0:')
    Path(f"{path}.bak").write_bytes(b"\xff\xfe")
    with pytest.raises(CorruptRecordError) as err:
        ConsumerOffsetTable(config_dir)
    assert err.value.file == str(path)
    assert "consumerOffset.json" in str(err.value)
    assert "consumerOffset.json.bak" in str(err.value)
    with pytest.raises(CorruptRecordError):
        read_json(path)


def test_unreadable_file_without_backup_is_corruption(config_dir):
    # RocketMQ would start with empty offsets here; silently re-consuming
    # everything is worse than stopping with the name of the file.
    (config_dir / "consumerOffset.json").write_text("garbage")
    with pytest.raises(CorruptRecordError, match="there is no backup"):
        ConsumerOffsetTable(config_dir)


def test_missing_file_with_unreadable_backup_is_corruption(config_dir):
    (config_dir / "delayOffset.json.bak").write_text("{1:")
    with pytest.raises(CorruptRecordError, match="delayOffset.json.bak"):
        DelayOffsetTable(config_dir)


# -- consumer offsets ----------------------------------------------------------------


def test_offsets_written_by_a_broker_are_read_and_kept(config_dir):
    (config_dir / "consumerOffset.json").write_text(BROKER_CONSUMER_OFFSET_5)
    table = ConsumerOffsetTable(config_dir)
    assert table.query("GroupA", "TopicA", 0) == 120
    assert table.query("GroupA", "TopicA", 1) == 98
    assert table.query("GroupA", "TopicA", 2) is None
    assert table.query("GroupC", "TopicA", 0) is None
    assert table.groups() == ["GroupA", "GroupB"]
    assert table.offsets_of_group("GroupA") == {
        ("TopicA", 0): 120,
        ("TopicA", 1): 98,
        ("%RETRY%GroupA", 0): 7,
    }
    table.commit("GroupA", "TopicA", 1, 99)
    on_disk = text_of(config_dir / "consumerOffset.json")
    assert on_disk == (
        '{"dataVersion":{"counter":3,"stateVersion":0,"timestamp":1700000000000},'
        '"offsetTable":{"TopicA@GroupA":{0:120,1:99},"TopicA@GroupB":{0:5},'
        '"%RETRY%GroupA@GroupA":{0:7}}}'
    )
    assert loads_lenient(text_of(config_dir / "consumerOffset.json.bak")) == loads_lenient(
        BROKER_CONSUMER_OFFSET_5
    )


def test_offsets_file_is_written_like_rocketmq(config_dir):
    table = ConsumerOffsetTable(config_dir)
    assert not (config_dir / "consumerOffset.json").exists()
    table.commit("GroupA", "TopicA", 0, 120)
    table.commit("GroupA", "TopicA", 1, 98)
    assert text_of(config_dir / "consumerOffset.json") == (
        '{"offsetTable":{"TopicA@GroupA":{0:120,1:98}}}'
    )


def test_commit_many_is_one_write(config_dir):
    table = ConsumerOffsetTable(config_dir)
    table.commit_many("G", {("T", 0): 1, ("T", 1): 2, ("U", 0): 3})
    assert not (config_dir / "consumerOffset.json.bak").exists()
    assert table.offsets_of_group("G") == {("T", 0): 1, ("T", 1): 2, ("U", 0): 3}


def test_an_unchanged_commit_does_not_write(config_dir):
    table = ConsumerOffsetTable(config_dir)
    table.commit("G", "T", 0, 1)
    before = os.stat(config_dir / "consumerOffset.json")
    table.commit("G", "T", 0, 1)
    after = os.stat(config_dir / "consumerOffset.json")
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)


def test_another_instance_sees_each_commit_even_when_size_and_mtime_tick_match(config_dir):
    writer, reader = ConsumerOffsetTable(config_dir), ConsumerOffsetTable(config_dir)
    for offset in range(1, 10):  # every rewrite has the same size
        writer.commit("G", "T", 0, offset)
        assert reader.query("G", "T", 0) == offset


def test_a_failed_write_leaves_no_phantom_commit(config_dir, monkeypatch):
    table = ConsumerOffsetTable(config_dir)
    table.commit("G", "T", 0, 1)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(metadata, "_replace", disk_full)
    with pytest.raises(OSError):
        table.commit("G", "T", 0, 2)
    monkeypatch.undo()
    assert table.query("G", "T", 0) == 1


def test_threads_committing_different_queues_lose_nothing(config_dir):
    table = ConsumerOffsetTable(config_dir)

    def run(queue_id: int) -> None:
        for offset in range(1, 51):
            table.commit("G", "T", queue_id, offset)

    threads = [threading.Thread(target=run, args=(q,)) for q in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ConsumerOffsetTable(config_dir).offsets_of_group("G") == {("T", q): 50 for q in range(4)}


COMMITTER = """
import os, sys, time
from rocketspark.store.metadata import ConsumerOffsetTable

config_dir, queue_id, count, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
other = 1 - queue_id
table = ConsumerOffsetTable(config_dir)
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
seen_other = 0
for offset in range(1, count + 1):
    table.commit("GroupA", "TopicA", queue_id, offset)
    assert table.query("GroupA", "TopicA", queue_id) == offset
    now = table.query("GroupA", "TopicA", other) or 0
    assert now >= seen_other, (now, seen_other)  # another process's offset never goes back
    seen_other = now
"""


@pytest.mark.slow
def test_two_processes_committing_different_queues_lose_no_update(config_dir, tmp_path):
    count = 200
    go = tmp_path / "go"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", COMMITTER, str(config_dir), str(q), str(count), str(go)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for q in (0, 1)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline() == b"ready\n", p.stderr.read().decode()
        go.touch()
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err.decode()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    table = ConsumerOffsetTable(config_dir)
    assert table.offsets_of_group("GroupA") == {("TopicA", 0): count, ("TopicA", 1): count}
    text = text_of(config_dir / "consumerOffset.json")
    assert re.fullmatch(
        r'\{"offsetTable":\{"TopicA@GroupA":\{([01]):200,(?!\1)[01]:200\}\}\}', text
    )
    assert not (config_dir / "consumerOffset.json.tmp").exists()


def test_tables_refuse_names_rocketmq_refuses(config_dir):
    with pytest.raises(InvalidNameError):
        ConsumerOffsetTable(config_dir).commit("a@b", "T", 0, 1)
    with pytest.raises(InvalidNameError):
        ConsumerOffsetTable(config_dir).commit("G", "../T", 0, 1)
    with pytest.raises(InvalidNameError):
        TopicConfigTable(config_dir).create("a/b", 1, 1)
    with pytest.raises(InvalidNameError):
        SubscriptionGroupTable(config_dir).get_or_create("")
    assert os.listdir(config_dir) == []


# -- subscription groups -------------------------------------------------------------


def test_new_group_has_subscription_group_config_defaults(config_dir):
    table = SubscriptionGroupTable(config_dir)
    assert table.retry_max_times("GroupA") == 16
    cfg = table.get_or_create("GroupA")
    assert cfg == {
        "brokerId": 0,
        "consumeBroadcastEnable": True,
        "consumeEnable": True,
        "consumeFromMinEnable": True,
        "groupName": "GroupA",
        "notifyConsumerIdsChangedEnable": True,
        "retryMaxTimes": 16,
        "retryQueueNums": 1,
        "whichBrokerWhenConsumeSlowly": 1,
    }
    data = read_json(config_dir / "subscriptionGroup.json")
    assert data["dataVersion"]["counter"] == 1
    assert table.get_or_create("GroupA") == cfg
    assert read_json(config_dir / "subscriptionGroup.json")["dataVersion"]["counter"] == 1


def test_default_retry_max_times_comes_from_the_store_config(config_dir):
    table = SubscriptionGroupTable(config_dir, default_retry_max_times=5)
    assert table.retry_max_times("G") == 5
    assert table.get_or_create("G")["retryMaxTimes"] == 5


def test_groups_written_by_a_broker_are_read_and_their_fields_kept(config_dir):
    (config_dir / "subscriptionGroup.json").write_text(BROKER_SUBSCRIPTION_GROUP)
    table = SubscriptionGroupTable(config_dir)
    assert table.retry_max_times("GroupA") == 3
    table.get_or_create("GroupB")
    data = read_json(config_dir / "subscriptionGroup.json")
    assert data["forbiddenTable"] == {}
    assert data["subscriptionGroupTable"]["GroupA"]["groupRetryPolicy"] == {"type": "CUSTOMIZED"}
    assert data["dataVersion"]["counter"] == 2
    assert table.names() == ["GroupA", "GroupB"]


# -- delay offsets -------------------------------------------------------------------


def test_delay_offsets(config_dir):
    (config_dir / "delayOffset.json").write_text('{\n\t"offsetTable":{1:0,3:57\n\t}\n}')
    table = DelayOffsetTable(config_dir)
    assert table.get(1) == 0 and table.get(3) == 57 and table.get(2) is None
    table.set(2, 5)
    assert text_of(config_dir / "delayOffset.json") == '{"offsetTable":{1:0,3:57,2:5}}'
    assert DelayOffsetTable(config_dir).offsets() == {1: 0, 3: 57, 2: 5}


# -- persist -------------------------------------------------------------------------


def test_persist_creates_the_file_and_rewrites_strict_json_in_rocketmqs_form(config_dir):
    table = DelayOffsetTable(config_dir)
    table.persist()
    assert text_of(config_dir / "delayOffset.json") == '{"offsetTable":{}}'
    (config_dir / "delayOffset.json").write_text('{"offsetTable": {"4": 9}}')
    table.persist()
    assert text_of(config_dir / "delayOffset.json") == '{"offsetTable":{4:9}}'
    assert table.get(4) == 9


def test_load_rereads_the_file(config_dir):
    table = DelayOffsetTable(config_dir)
    write_json(config_dir / "delayOffset.json", {"offsetTable": {1: 3}})
    table.load()
    assert table.offsets() == {1: 3}


def test_deferred_commits_are_read_at_once_and_written_by_flush(config_dir):
    table = ConsumerOffsetTable(config_dir)
    table.commit("G", "T", 0, 1)
    table.commit_many("G", {("T", 0): 5, ("T", 1): 6}, deferred=True)
    assert table.query("G", "T", 0) == 5
    assert table.offsets_of_group("G") == {("T", 0): 5, ("T", 1): 6}
    table.commit_many("H", {("T", 0): 7}, deferred=True)
    assert table.groups() == ["G", "H"]
    # Another process reads the file: the deferred commits are not there yet.
    assert ConsumerOffsetTable(config_dir).offsets_of_group("G") == {("T", 0): 1}
    # Another process commits meanwhile: the flush keeps what it wrote.
    ConsumerOffsetTable(config_dir).commit("G", "U", 0, 9)
    table.flush()
    other = ConsumerOffsetTable(config_dir)
    assert other.offsets_of_group("G") == {("T", 0): 5, ("T", 1): 6, ("U", 0): 9}
    assert other.query("H", "T", 0) == 7
    mtime = (config_dir / "consumerOffset.json").stat().st_mtime_ns
    table.flush()  # nothing deferred: no write
    assert (config_dir / "consumerOffset.json").stat().st_mtime_ns == mtime


def test_a_commit_written_at_once_replaces_a_deferred_one(config_dir):
    table = ConsumerOffsetTable(config_dir)
    table.commit_many("G", {("T", 0): 5}, deferred=True)
    table.commit("G", "T", 0, 3)
    assert table.query("G", "T", 0) == 3
    table.flush()
    assert ConsumerOffsetTable(config_dir).query("G", "T", 0) == 3

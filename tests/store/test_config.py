"""broker.conf parsing, keyword overrides and delay levels."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from rocketspark.errors import ConfigError
from rocketspark.store.config import (
    DEFAULT_MESSAGE_DELAY_LEVEL,
    MessageStoreConfig,
)

ROOT = Path(__file__).resolve().parents[2]

# The property lines of RocketMQ's distribution/conf/broker.conf, spacing kept.
ROCKETMQ_DISTRIBUTION_CONF = """\
brokerClusterName = DefaultCluster
brokerName = broker-a
brokerId = 0
deleteWhen = 04
fileReservedTime = 48
brokerRole = ASYNC_MASTER
flushDiskType = ASYNC_FLUSH
"""


def write_conf(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "broker.conf"
    path.write_text(text, encoding="utf-8")
    return path


# -- defaults and the shipped file ---------------------------------------------------


def test_defaults_are_rocketmqs_except_where_documented():
    c = MessageStoreConfig()
    assert c.mapped_file_size_commit_log == 1 << 30
    assert c.mapped_file_size_consume_queue == 300_000 * 20
    assert (c.max_hash_slot_num, c.max_index_num) == (5_000_000, 20_000_000)
    assert c.flush_disk_type == "ASYNC_FLUSH"
    assert (
        c.flush_interval_commit_log,
        c.flush_commit_log_least_pages,
        c.flush_commit_log_thorough_interval,
        c.sync_flush_timeout,
    ) == (500, 4, 10_000, 5_000)
    assert c.message_delay_level == DEFAULT_MESSAGE_DELAY_LEVEL
    assert c.max_message_size == 4 << 20
    assert (c.broker_name, c.broker_ip1, c.listen_port) == ("broker-a", "127.0.0.1", 10911)
    assert c.default_topic_queue_nums == 4
    assert c.auto_create_topic_enable is False
    assert (c.max_reconsume_times, c.transaction_timeout, c.transaction_check_max) == (16, 6000, 15)
    assert c.long_polling_enable is True
    assert (c.file_reserved_time, c.delete_when) == (72, "04")


def test_shipped_broker_conf_holds_exactly_the_defaults():
    path = ROOT / "conf" / "broker.conf"
    assert MessageStoreConfig.load(path) == MessageStoreConfig()
    text = path.read_text()
    for f in dataclasses.fields(MessageStoreConfig):
        assert f"\n{f.metadata['key']}=" in text, f"{f.metadata['key']} is not documented"


def test_load_without_path_reads_conf_broker_conf_of_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert MessageStoreConfig.load() == MessageStoreConfig()
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "broker.conf").write_text("brokerName=from-cwd\n")
    assert MessageStoreConfig.load().broker_name == "from-cwd"
    assert MessageStoreConfig.load(None, brokerName="kw").broker_name == "kw"


def test_rocketmq_distribution_broker_conf_loads(tmp_path):
    c = MessageStoreConfig.load(write_conf(tmp_path, ROCKETMQ_DISTRIBUTION_CONF))
    assert (c.broker_cluster_name, c.broker_name, c.broker_id) == ("DefaultCluster", "broker-a", 0)
    assert (c.delete_when, c.file_reserved_time, c.broker_role) == ("04", 48, "ASYNC_MASTER")


def test_config_is_frozen():
    c = MessageStoreConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.broker_name = "x"  # type: ignore[misc]


# -- properties syntax ---------------------------------------------------------------


def test_properties_syntax_comments_blanks_separators_continuations_escapes(tmp_path):
    path = write_conf(
        tmp_path,
        (
            "# a comment\n"
            "! another comment\n"
            "\n"
            "   \t\n"
            "  brokerName   =   broker-b   \n"
            "listenPort:10922\n"
            "brokerClusterName Cluster-X\n"
            "storePathRootDir=C:\\\\data\\\\rocket store\n"
            "messageDelayLevel=1s 5s \\\n"
            "    10s\n"
            "flushDiskType=SYNC_FLUSH\r\n"
            "autoCreateTopicEnable = TRUE\n"
        ),
    )
    c = MessageStoreConfig.load(path)
    assert c.broker_name == "broker-b"
    assert c.listen_port == 10922
    assert c.broker_cluster_name == "Cluster-X"
    assert c.store_path_root_dir == "C:\\data\\rocket store"
    assert c.message_delay_level == "1s 5s 10s"
    assert c.flush_disk_type == "SYNC_FLUSH"
    assert c.auto_create_topic_enable is True


def test_a_later_line_wins_like_java_properties(tmp_path):
    c = MessageStoreConfig.load(write_conf(tmp_path, "listenPort=1\nlistenPort=2\n"))
    assert c.listen_port == 2


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read store configuration .*nope.conf"):
        MessageStoreConfig.load(tmp_path / "nope.conf")


def test_to_properties_round_trips(tmp_path):
    c = MessageStoreConfig.load(
        None,
        store_path_root_dir="C:\\my data\\store",
        flushDiskType="SYNC_FLUSH",
        auto_create_topic_enable=True,
        messageDelayLevel="1s 1d",
        listen_port=1234,
    )
    path = write_conf(tmp_path, c.to_properties())
    assert MessageStoreConfig.load(path) == c
    assert "storePathRootDir=C:\\\\my data\\\\store\n" in c.to_properties()
    assert "flushDiskType=SYNC_FLUSH\n" in c.to_properties(comments=False)
    assert "autoCreateTopicEnable=true\n" in c.to_properties(comments=False)
    assert not any(line.startswith("#") for line in c.to_properties(comments=False).splitlines())


# -- unknown keys and bad values -----------------------------------------------------


def test_unknown_key_in_file_names_file_line_and_suggests(tmp_path):
    path = write_conf(tmp_path, "# header\nbrokerName=a\nflushDiskTyp=SYNC_FLUSH\n")
    with pytest.raises(
        ConfigError,
        match=r"broker\.conf:3: unknown store configuration key "
        r"'flushDiskTyp'; did you mean 'flushDiskType'\?",
    ):
        MessageStoreConfig.load(path)


def test_snake_case_or_wrong_case_in_a_file_is_rejected_with_the_rocketmq_name(tmp_path):
    with pytest.raises(ConfigError, match="did you mean 'flushDiskType'"):
        MessageStoreConfig.load(write_conf(tmp_path, "flush_disk_type=SYNC_FLUSH\n"))
    with pytest.raises(ConfigError, match="did you mean 'brokerIP1'"):
        MessageStoreConfig.load(write_conf(tmp_path, "brokerIp1=10.0.0.1\n"))


def test_unknown_keyword_suggests_in_the_callers_style():
    with pytest.raises(ConfigError, match="did you mean 'flush_disk_type'"):
        MessageStoreConfig.load(None, flush_disk_typ="SYNC_FLUSH")
    with pytest.raises(ConfigError, match="did you mean 'mappedFileSizeCommitLog'"):
        MessageStoreConfig.load(None, mappedFileSizeCommitlog=4096)
    with pytest.raises(ConfigError, match="unknown store configuration key 'zzz'$"):
        MessageStoreConfig.load(None, zzz=1)


def test_bad_int_names_key_file_and_line(tmp_path):
    path = write_conf(tmp_path, "brokerName=a\n\n# c\n\nmappedFileSizeCommitLog = 1G\n")
    with pytest.raises(ConfigError) as err:
        MessageStoreConfig.load(path)
    assert str(err.value) == (f"{path}:5: mappedFileSizeCommitLog: expected an integer, got '1G'")


@pytest.mark.parametrize(
    "line, message",
    [
        ("longPollingEnable=yes", "longPollingEnable: expected true or false, got 'yes'"),
        ("flushDiskType=FAST_FLUSH", "flushDiskType: expected one of ASYNC_FLUSH, SYNC_FLUSH"),
        ("brokerRole=SLAVE", "brokerRole: expected one of ASYNC_MASTER, SYNC_MASTER"),
        ("mappedFileSizeCommitLog=100", "mappedFileSizeCommitLog: must be at least 4096"),
        (
            "mappedFileSizeCommitLog=4294967296",
            "mappedFileSizeCommitLog: must be at most 2147483647",
        ),
        ("mappedFileSizeConsumeQueue=1001", "mappedFileSizeConsumeQueue: must be a multiple of 20"),
        ("listenPort=70000", "listenPort: must be at most 65535"),
        ("defaultTopicQueueNums=0", "defaultTopicQueueNums: must be at least 1"),
        ("brokerIP1=localhost", "brokerIP1: expected an IPv4 or IPv6 address"),
        ("deleteWhen=25", "deleteWhen: expected hours of the day"),
        ("storePathRootDir=", "storePathRootDir: must not be empty"),
        ("messageDelayLevel=1s 5x", "messageDelayLevel: delay '5x' is not a whole number"),
        ("maxIndexNum=1_000", "maxIndexNum: expected an integer, got '1_000'"),
    ],
)
def test_bad_values_name_key_and_line(tmp_path, line, message):
    path = write_conf(tmp_path, f"brokerName=a\n{line}\n")
    with pytest.raises(ConfigError) as err:
        MessageStoreConfig.load(path)
    assert str(err.value).startswith(f"{path}:2: {message}")


def test_ipv6_store_host_is_accepted():
    assert MessageStoreConfig.load(None, brokerIP1="::1").broker_ip1 == "::1"


# -- overrides -----------------------------------------------------------------------


def test_overrides_in_snake_and_camel_case_beat_the_file(tmp_path):
    path = write_conf(tmp_path, "flushDiskType=ASYNC_FLUSH\nlistenPort=1\nbrokerName=file\n")
    c = MessageStoreConfig.load(
        path, flushDiskType="SYNC_FLUSH", listen_port=2, store_path_root_dir=tmp_path / "s"
    )
    assert c.flush_disk_type == "SYNC_FLUSH"
    assert c.listen_port == 2
    assert c.broker_name == "file"
    assert c.store_path_root_dir == os.fspath(tmp_path / "s")


def test_string_overrides_are_parsed_like_the_file():
    # Spark options arrive as strings.
    c = MessageStoreConfig.load(
        None,
        mappedFileSizeCommitLog="65536",
        auto_create_topic_enable="true",
        longPollingEnable="False",
    )
    assert c.mapped_file_size_commit_log == 65536
    assert c.auto_create_topic_enable is True
    assert c.long_polling_enable is False


def test_bad_overrides_name_the_keyword():
    with pytest.raises(
        ConfigError, match="keyword argument listen_port: listenPort: expected an integer, got True"
    ):
        MessageStoreConfig.load(None, listen_port=True)
    with pytest.raises(
        ConfigError,
        match="keyword argument autoCreateTopicEnable: "
        "autoCreateTopicEnable: expected true or false, got 1",
    ):
        MessageStoreConfig.load(None, autoCreateTopicEnable=1)
    with pytest.raises(
        ConfigError, match="keyword argument brokerName: brokerName: expected a string, got None"
    ):
        MessageStoreConfig.load(None, brokerName=None)
    with pytest.raises(
        ConfigError, match="listenPort is given twice, as listenPort and as listen_port"
    ):
        MessageStoreConfig.load(None, listenPort=1, listen_port=2)


def test_direct_construction_validates():
    with pytest.raises(ConfigError, match="flushDiskType: expected one of"):
        MessageStoreConfig(flush_disk_type="FAST")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="maxMessageSize: must be at least 1"):
        MessageStoreConfig(max_message_size=0)


# -- delay levels --------------------------------------------------------------------


def test_default_delay_levels():
    levels = MessageStoreConfig().delay_levels_ms()
    assert len(levels) == 18
    assert levels[:4] == (1_000, 5_000, 10_000, 30_000)
    assert levels[4] == 60_000 and levels[13] == 600_000
    assert levels[-2:] == (3_600_000, 7_200_000)


def test_delay_levels_with_every_unit_and_extra_blanks():
    c = MessageStoreConfig.load(None, messageDelayLevel="  1s   2m 3h\t1d ")
    assert c.delay_levels_ms() == (1_000, 120_000, 10_800_000, 86_400_000)


@pytest.mark.parametrize("bad", ["", "   ", "5", "s", "1.5s", "-1s", "1w", "1S", "1s,2s"])
def test_bad_delay_levels_name_messagedelaylevel(bad):
    with pytest.raises(ConfigError, match="messageDelayLevel"):
        MessageStoreConfig.load(None, messageDelayLevel=bad)


@pytest.mark.parametrize("value", ["0", "101", "-5"])
def test_disk_ratios_are_percentages(value):
    for key in (
        "diskSpaceWarningLevelRatio",
        "diskSpaceCleanForciblyRatio",
        "diskMaxUsedSpaceRatio",
    ):
        with pytest.raises(ConfigError, match=key):
            MessageStoreConfig.load(None, **{key: value})
    assert MessageStoreConfig().disk_space_warning_level_ratio == 90

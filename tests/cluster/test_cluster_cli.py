"""The command line against a cluster (``--namesrv``): topics, send, tail, group, query.

Marked ``cluster``.
"""

from __future__ import annotations

import io
import json

import pytest

from rocketspark.cli import main
from rocketspark.client import close_all
from tests.helpers.cluster import unique_topic

pytestmark = pytest.mark.cluster


def _run(*argv: str) -> str:
    out = io.StringIO()
    assert main(list(argv), out=out) == 0
    return out.getvalue()


def test_topics_send_tail_group_and_query_on_a_cluster(rocketmq_cluster):
    ns = rocketmq_cluster.namesrv
    topic, group = unique_topic("cli"), unique_topic("cli-group")
    made = _run("--namesrv", ns, "topic", "create", topic, "--queues", "2")
    assert "broker-a/0" in made and "broker-b/0" in made
    for i in range(6):
        sent = _run("--namesrv", ns, "send", topic, f"héllo {i}", "--keys", f"k{i}", "--tags", "t")
        assert sent.startswith("PUT_OK") and "broker=broker-" in sent
    listed = _run("--namesrv", ns, "topic", "list")
    assert any(line.split()[:3] == [topic, "2", "6"] for line in listed.splitlines())
    lines = _run("--namesrv", ns, "tail", topic, "--group", group, "--max", "4").splitlines()
    assert len(lines) == 4 and all(json.loads(x)["tags"] == "t" for x in lines)
    rest = _run("--namesrv", ns, "tail", topic, "--group", group).splitlines()
    bodies = sorted(json.loads(x)["body"] for x in lines + rest)
    assert bodies == sorted(f"héllo {i}" for i in range(6))
    offsets = _run("--namesrv", ns, "group", "offsets", group, "--topic", topic)
    assert "total lag: 0" in offsets
    found = _run("--namesrv", ns, "query", topic, "k3")
    assert json.loads(found.splitlines()[0])["body"] == "héllo 3" and "1 message(s)" in found
    close_all()


def test_store_commands_refuse_a_cluster(capsys):
    with pytest.raises(SystemExit):
        main(["--namesrv", "127.0.0.1:9876", "store", "check"])
    assert "store directory" in capsys.readouterr().err


def test_send_a_body_file_and_refuse_a_queue_the_topic_lacks_on_a_cluster(
    rocketmq_cluster, tmp_path, capsys
):
    ns = rocketmq_cluster.namesrv
    topic = unique_topic("cli-file")
    _run("--namesrv", ns, "topic", "create", topic, "--queues", "2")
    body = bytes(range(256)) * 512  # 128 KiB, not UTF-8
    (tmp_path / "body.bin").write_bytes(body)
    sent = _run("--namesrv", ns, "send", topic, "--body-file", str(tmp_path / "body.bin"))
    assert sent.startswith("PUT_OK")
    (row,) = (json.loads(x) for x in _run("--namesrv", ns, "tail", topic).splitlines())
    assert row["body"] == body.decode("utf-8", "backslashreplace")
    assert main(["--namesrv", ns, "tail", topic, "--queue", "7"], out=io.StringIO()) == 2
    assert f"queue 7 of topic {topic!r} does not exist" in capsys.readouterr().err
    close_all()

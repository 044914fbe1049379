"""``rocketspark serve`` as a process: it binds loopback, serves, stops cleanly on SIGTERM,
and refuses a second server of the same store."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from rocketspark.client import ClientRef
from rocketspark.client.remote import RemoteClient
from rocketspark.message.model import Message
from rocketspark.store.message_store import MessageStore
from rocketspark.store.metadata import read_json

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(store: Path, ns: int, broker: int) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rocketspark.cli",  # the rocketspark command: --store before serve is its option
            "--store",
            str(store),
            "serve",
            "--listen",
            f"127.0.0.1:{ns}",
            "--broker-port",
            str(broker),
            "--log-level",
            "WARNING",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.fixture
def server(tmp_path: Path):
    ns, broker = _free_port(), _free_port()
    proc = _start(tmp_path / "store", ns, broker)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(30)
        pytest.fail(f"serve did not start: {proc.stderr.read() if proc.stderr else ''}")
    yield proc, tmp_path / "store", ns, broker, line
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)


def test_serve_then_sigterm(server) -> None:
    proc, store, ns, broker, line = server
    assert f"NameServer 127.0.0.1:{ns}" in line
    assert f"at 127.0.0.1:{broker}" in line
    topic = f"cli-{uuid.uuid4().hex[:10]}"
    client = RemoteClient(ClientRef("cluster", f"127.0.0.1:{ns}"))
    try:
        client.create_topic(topic, queues=2)
        client.put_batch([Message(topic, b"kept", queue_id=1)])
        # A pull answered from the mapped segments before the stop: the store still
        # closes cleanly (no view of a segment is left).
        mq = [q for q in client.queues(topic) if q.queue_id == 1][0]
        batches, _ = client.read_batches(mq, 0, 1)
        assert [bytes(r["body"]) for b in batches for r in b.to_pylist()] == [b"kept"]
    finally:
        client.close()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    with MessageStore.open(str(store)) as s:
        assert not s.recovery_report.abnormal_exit
        assert [m.body for m in s.pull(topic, 1, 0, 10).messages] == [b"kept"]


def test_second_server_of_the_store_is_refused(server) -> None:
    proc, store, ns, broker, _ = server
    second = _start(store, _free_port(), _free_port())
    out, err = second.communicate(timeout=60)
    assert second.returncode == 2
    assert "already served" in err
    assert proc.poll() is None


def test_bad_listen_address(tmp_path: Path) -> None:
    from rocketspark import cli_serve

    assert cli_serve.main(["--store", str(tmp_path / "s"), "--listen", "nonsense"]) == 2


def test_sigkill_under_sync_flush_loses_nothing_acknowledged(tmp_path: Path) -> None:
    store = tmp_path / "sync"
    conf = tmp_path / "broker.conf"
    conf.write_text(f"storePathRootDir={store}\nflushDiskType=SYNC_FLUSH\n")
    ns, broker = _free_port(), _free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rocketspark.cli_serve",
            "--config",
            str(conf),
            "--listen",
            f"127.0.0.1:{ns}",
            "--broker-port",
            str(broker),
            "--log-level",
            "WARNING",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline()
        topic = f"sync-{uuid.uuid4().hex[:10]}"
        client = RemoteClient(ClientRef("cluster", f"127.0.0.1:{ns}"))
        acknowledged: list[bytes] = []
        client.create_topic(topic, queues=1)

        def send() -> None:
            try:
                for i in range(100_000):
                    client.put_batch([Message(topic, b"m%d" % i)])
                    acknowledged.append(b"m%d" % i)
            except Exception:
                pass  # the server was killed

        sender = threading.Thread(target=send)
        sender.start()
        try:
            deadline = time.monotonic() + 60
            while len(acknowledged) < 30 and time.monotonic() < deadline:
                time.sleep(0.005)
        finally:
            proc.kill()  # SIGKILL while sending: no flush, no clean shutdown
            proc.wait(30)
            sender.join(60)
            client.close()
        assert len(acknowledged) >= 30
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    with MessageStore.open(str(store)) as s:
        assert s.recovery_report.abnormal_exit
        stored = [m.body for m in s.pull(topic, 0, 0, 100_000).messages]
        # Everything acknowledged, in order; at most the one send in flight beyond it.
        assert stored[: len(acknowledged)] == acknowledged
        assert len(stored) <= len(acknowledged) + 1


def _offset_in_file(store: Path, group: str, topic: str, queue_id: int) -> int | None:
    """The group's offset as consumerOffset.json holds it now (what other processes read)."""
    path = store / "config" / "consumerOffset.json"
    if not path.exists():
        return None
    return read_json(path)["offsetTable"].get(f"{topic}@{group}", {}).get(str(queue_id))


def _commit(ns: int, group: str, topic: str, offset: int, *, create: bool = False) -> None:
    client = RemoteClient(ClientRef("cluster", f"127.0.0.1:{ns}"))
    try:
        if create:
            client.create_topic(topic, queues=1)
            client.put_batch([Message(topic, b"m%d" % i) for i in range(5)])
        (mq,) = client.queues(topic)
        client.commit_offsets(group, {mq: offset})
        assert client.committed_offset(group, mq) == offset  # the server reads it at once
    finally:
        client.close()


def test_consumer_offsets_survive_sigterm(server) -> None:
    """Commits kept in memory between flushes are written when the server stops."""
    proc, store, ns, _, _ = server
    group, topic = f"g-{uuid.uuid4().hex[:8]}", f"cli-{uuid.uuid4().hex[:10]}"
    _commit(ns, group, topic, 3, create=True)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    with MessageStore.open(str(store)) as s:
        assert s.committed_offset(group, topic, 0) == 3


def test_sigkill_loses_at_most_the_last_interval_of_consumer_offsets(server) -> None:
    """Consumer offsets are written every flushConsumerOffsetInterval (5 s), not per commit:
    a SIGKILL loses the commits made since the last write, and no earlier one."""
    proc, store, ns, _, _ = server
    group, topic = f"g-{uuid.uuid4().hex[:8]}", f"cli-{uuid.uuid4().hex[:10]}"
    _commit(ns, group, topic, 2, create=True)
    deadline = time.monotonic() + 20
    while _offset_in_file(store, group, topic, 0) != 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _offset_in_file(store, group, topic, 0) == 2  # written by the periodic flush
    _commit(ns, group, topic, 4)
    proc.kill()
    proc.wait(30)
    with MessageStore.open(str(store)) as s:
        # 4 unless a periodic write came between the commit and the kill
        assert s.committed_offset(group, topic, 0) in (2, 4)


def test_wildcard_listen_needs_advertise(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from rocketspark import cli_serve

    for listen in ("0.0.0.0:9876", "[::]:9876"):
        assert cli_serve.main(["--store", str(tmp_path / "s"), "--listen", listen]) == 2
        err = capsys.readouterr().err
        assert "binds every address" in err and "--advertise HOST" in err
    assert not (tmp_path / "s").exists()  # refused before the store is opened
    assert cli_serve.main(["--store", str(tmp_path / "s"), "--advertise", "0.0.0.0"]) == 2
    assert "--advertise" in capsys.readouterr().err


def test_serve_refuses_a_wildcard_host_without_advertised_host(tmp_path: Path) -> None:
    from rocketspark.errors import ConfigError
    from rocketspark.remoting.processors import serve

    with MessageStore.open(str(tmp_path / "s")) as store:
        with pytest.raises(ConfigError, match="advertised_host"):
            serve(store, host="0.0.0.0", namesrv_port=0, broker_port=0)


def test_advertised_name_is_the_broker_address_in_routes(tmp_path: Path) -> None:
    from rocketspark.remoting.processors import serve

    with MessageStore.open(str(tmp_path / "s")) as store:
        with serve(store, namesrv_port=0, broker_port=0, advertised_host="localhost") as srv:
            topic = f"adv-{uuid.uuid4().hex[:10]}"
            store.create_topic(topic, 1)
            broker = f"localhost:{srv.broker_server.port}"
            client = RemoteClient(ClientRef("cluster", srv.namesrv_address))
            try:
                route = client.remoting.route(topic)
                assert [dict(b.addrs) for b in route.broker_datas] == [{0: broker}]
                assert client.remoting.brokers() == {store.config.broker_name: {0: broker}}
                # Clients reach the broker by the advertised name.
                client.put_batch([Message(topic, b"by name")])
                assert [m.body for m in store.pull(topic, 0, 0, 10).messages] == [b"by name"]
            finally:
                client.close()


@pytest.mark.parametrize("listen", ["0.0.0.0", "127.0.0.2"])
def test_listen_on_every_address_advertise_one(tmp_path: Path, listen: str) -> None:
    """--listen 0.0.0.0 --advertise 127.0.0.2: routes and new msgIds (brokerIP1) name
    127.0.0.2, which reaches the wildcard listener (Linux routes 127/8 to loopback).
    --listen 127.0.0.2 alone names it the same way: the listen host is advertised."""
    store = tmp_path / "store"
    ns, broker = _free_port(), _free_port()
    advertise = ["--advertise", "127.0.0.2"] if listen == "0.0.0.0" else []
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rocketspark.cli_serve",
            "--store",
            str(store),
            "--listen",
            f"{listen}:{ns}",
            "--broker-port",
            str(broker),
            *advertise,
            "--log-level",
            "WARNING",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if listen == "0.0.0.0":
            assert f"at 127.0.0.2:{broker} (listening on 0.0.0.0:{broker})" in line, line
        else:
            assert line.rstrip().endswith(f"at 127.0.0.2:{broker}"), line
        topic = f"adv-{uuid.uuid4().hex[:10]}"
        client = RemoteClient(
            ClientRef("cluster", f"{listen.replace('0.0.0.0', '127.0.0.1')}:{ns}")
        )
        try:
            client.create_topic(topic, queues=1)
            route = client.remoting.route(topic)
            assert [dict(b.addrs) for b in route.broker_datas] == [{0: f"127.0.0.2:{broker}"}]
            client.put_batch([Message(topic, b"advertised")])
        finally:
            client.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    with MessageStore.open(str(store)) as s:
        (msg,) = s.pull(topic, 0, 0, 10).messages
        assert str(msg.store_host) == f"127.0.0.2:{broker}"

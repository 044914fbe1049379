"""``rocketspark serve`` as a process: it binds loopback, serves, stops cleanly on SIGTERM,
and refuses a second server of the same store."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from rocketspark.client import ClientRef
from rocketspark.client.remote import RemoteClient
from rocketspark.message.model import Message
from rocketspark.store.message_store import MessageStore

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
            "rocketspark.cli_serve",
            "--store",
            str(store),
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

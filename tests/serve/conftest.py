"""Fixtures shared by tests/serve: a store served on free ports, and RocketMQ's Java programs
run against it (skipped without java or ``./dev``'s jars, as ``rocketmq_java`` is).

- ``store``: a MessageStore in ``tmp_path / "store"``, closed after the test.
- ``served``: ``serve(store)`` on free ports (a NameServer and a broker), stopped after.
- ``java_client``: ``java_client(namesrv, home, mode, *args, stdin=None)`` runs
  ``tests/helpers/java/RocketClient`` (its ``send``, ``produce``, ``consume``, ``pull``,
  ``transact`` modes) and returns its output lines, parsed; asserts it exited 0.
- ``java_program``: ``java_program(main, home, *args)`` runs a program of
  ``tests/serve/java`` (compiled once a run) and returns its output lines, parsed;
  asserts it exited 0.
- ``mqadmin``: ``mqadmin(command, *args)`` runs RocketMQ's ``mqadmin`` against ``served``
  and returns its stdout; asserts no exception was printed.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rocketspark.remoting.processors import Served, serve
from rocketspark.store.message_store import MessageStore
from tests.helpers import jvm
from tests.helpers.rocketmq import parse_lines

JAVA_SOURCES = Path(__file__).resolve().parent / "java"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    with MessageStore.open(str(tmp_path / "store")) as s:
        yield s


@pytest.fixture
def served(store: MessageStore) -> Iterator[Served]:
    with serve(store, namesrv_port=0, broker_port=0) as srv:
        yield srv


def _java_command(
    classpath: str, main: str, home: Path, *args: object, log_root: bool = True
) -> list[str]:
    """The command line of ``main`` with RocketMQ's client logging under ``home``."""
    return [
        "java",
        "-Xmx256m",
        *jvm.FLAGS,
        *jvm.QUIET,
        f"-Duser.home={home}",
        *([f"-Drocketmq.client.logRoot={home}"] if log_root else []),
        "-cp",
        classpath,
        main,
        *map(str, args),
    ]


@pytest.fixture
def java_client(rocketmq_java) -> Callable[..., list[dict]]:
    def run(namesrv: str, home: Path, *args: object, stdin: str | None = None) -> list[dict]:
        cmd = rocketmq_java.client_command(namesrv, home, *args)
        proc = subprocess.run(
            cmd, input=stdin, capture_output=True, text=True, encoding="utf-8", timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return parse_lines(proc.stdout)

    return run


@pytest.fixture(scope="session")
def serve_java_classpath(rocketmq_java, tmp_path_factory) -> str:
    """The classes of ``tests/serve/java`` (compiled once a run) and RocketMQ's jars."""
    out = tmp_path_factory.mktemp("serve-java")
    jvm.javac(sorted(JAVA_SOURCES.glob("*.java")), rocketmq_java.rocketmq_classpath, out)
    return f"{out}:{rocketmq_java.rocketmq_classpath}"


@pytest.fixture
def java_program(serve_java_classpath: str) -> Callable[..., list[dict]]:
    def run(main: str, home: Path, *args: object) -> list[dict]:
        cmd = _java_command(serve_java_classpath, main, home, *args)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return parse_lines(proc.stdout)

    return run


@pytest.fixture
def mqadmin(rocketmq_java, served: Served, tmp_path: Path) -> Callable[..., str]:
    classpath = rocketmq_java.classpath()

    def run(command: str, *args: str) -> str:
        cmd = _java_command(
            classpath,
            "org.apache.rocketmq.tools.command.MQAdminStartup",
            tmp_path / "home",
            command,
            "-n",
            served.namesrv_address,
            *args,
            log_root=False,
        )
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        out = proc.stdout + proc.stderr
        assert "Exception" not in out, out[-3000:]
        return proc.stdout

    return run

"""A real Apache RocketMQ on loopback for tests: NameServer, brokers, RocketMQ's Java client.

The jars come from ``./dev``'s directories (``tests/helpers/jvm.py``): the broker, client
and tools at 5.3.1 from ``.jars/rocketmq``, the NameServer (5.3.3: 5.3.1 is not on Maven
Central) from ``.jars/rocketmq-namesrv``. Each JVM gets its own ``user.home`` and
``rocketmq.home.dir`` under a run directory, so its logs land there. The Java programs in
``tests/helpers/java`` are compiled with ``javac`` once per test session, when a test
first needs them:

- ``LoopbackOnlyHAService``: the brokers' HA service with its listener bound to loopback (RocketMQ
  5.3 binds it to all interfaces; see the class), so every port a test opens is on loopback;
- ``RocketClient``: RocketMQ's own producer, consumers and admin client, printing JSON
  lines; one run per call (``RocketMQ.client``, ``RocketMQ.run``) or one long-running
  process answering requests (``JavaService``: a session pays for one JVM start).

A broker is started on a given store directory (with that store's segment sizes when it
has some: a broker refuses files of other sizes), stopped with SIGTERM (its shutdown hook
flushes and removes the abort file) or SIGKILL (a crash: recovery on the next start).
"""

from __future__ import annotations

import base64
import json
import os
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from tests.helpers import jvm
from tests.helpers.jvm import JavaServer, free_port

JAVA_SOURCES = Path(__file__).resolve().parent / "java"


class JavaPrograms:
    """The Java test programs, compiled on first use into ``run_dir/classes``."""

    def __init__(self, run_dir: Path, broker_classpath: str, namesrv_classpath: str) -> None:
        self.run_dir = run_dir
        self.classes = run_dir / "classes"
        self.rocketmq_classpath = broker_classpath
        self.namesrv_classpath = namesrv_classpath
        self._lock = threading.Lock()
        self._compiled = False

    def classpath(self) -> str:
        """The classpath of brokers and clients: the compiled programs first, then RocketMQ."""
        with self._lock:
            if not self._compiled:
                jvm.javac(
                    sorted(JAVA_SOURCES.glob("*.java")), self.rocketmq_classpath, self.classes
                )
                services = self.classes / "META-INF" / "service"
                services.mkdir(parents=True, exist_ok=True)
                (services / "org.apache.rocketmq.store.ha.HAService").write_text(
                    "rocketspark.test.LoopbackOnlyHAService\n"
                )
                self._compiled = True
        return f"{self.classes}{os.pathsep}{self.rocketmq_classpath}"

    def client_command(self, namesrv: str, home: Path, *args: object) -> list[str]:
        """The command line of ``RocketClient`` against ``namesrv``, logging nowhere."""
        return [
            "java",
            "-Xmx256m",
            *jvm.FLAGS,
            *jvm.QUIET,
            f"-Duser.home={home}",
            f"-Drocketmq.client.logRoot={home}",
            "-cp",
            self.classpath(),
            "RocketClient",
            namesrv,
            *map(str, args),
        ]


class Broker:
    """A master broker on a store directory and a fixed port; it can be killed and started
    again on both (each start in a run directory of its own under ``run_root``)."""

    def __init__(
        self, programs: JavaPrograms, run_root: Path, store: str, conf: dict[str, object]
    ) -> None:
        self.programs = programs
        self.run_root = run_root
        self.store = store
        self.conf = conf
        self.name = str(conf["brokerName"])
        self.port = int(str(conf["listenPort"]))
        self.addr = f"127.0.0.1:{self.port}"
        self.starts = 0
        self.server: JavaServer | None = None

    def start(self) -> JavaServer:
        """Start the broker JVM (without waiting for it to boot)."""
        self.starts += 1
        self.server = JavaServer(
            "broker",
            self.run_root / f"run-{self.starts}",
            self.programs.classpath(),
            "org.apache.rocketmq.broker.BrokerStartup",
            self.conf,
            "512m",
        )
        return self.server

    @property
    def running(self) -> bool:
        return self.server is not None and self.server.proc.poll() is None

    def wait_boot(self) -> None:
        assert self.server is not None
        self.server.wait_boot()

    def terminate(self, timeout: float = 120.0) -> int:
        """Stop cleanly (SIGTERM) and return the exit status."""
        assert self.server is not None
        return self.server.terminate(timeout)

    def kill(self) -> None:
        """Crash it (SIGKILL)."""
        if self.server is not None:
            self.server.kill()


def broker_conf(
    name: str,
    store: str,
    namesrv: str,
    *,
    cluster: str = "DefaultCluster",
    port: int | None = None,
    commitlog_size: int | None = None,
    consumequeue_size: int | None = None,
    **extra: object,
) -> dict[str, object]:
    """The ``broker.conf`` of a loopback-only master ``name`` on ``store``."""
    port = port or free_port(also_below=2)
    conf: dict[str, object] = {
        "brokerClusterName": cluster,
        "brokerName": name,
        "brokerId": 0,
        "namesrvAddr": namesrv,
        "listenPort": port,
        # bound to 127.0.0.1 by LoopbackOnlyHAService
        "haListenPort": port + 1,
        "bindAddress": "127.0.0.1",
        "brokerIP1": "127.0.0.1",
        "brokerIP2": "127.0.0.1",
        "storePathRootDir": store,
        "storePathCommitLog": os.path.join(store, "commitlog"),
        # the default 200 ms answers "broker busy" on a loaded 2-core machine
        "waitTimeMillsInSendQueue": 3000,
        "autoCreateTopicEnable": "true",
    }
    if commitlog_size is not None:
        conf["mappedFileSizeCommitLog"] = commitlog_size
    if consumequeue_size is not None:
        conf["mappedFileSizeConsumeQueue"] = consumequeue_size
    conf.update(extra)
    return conf


class RocketMQ:
    """A NameServer on loopback, and brokers and Java clients using it."""

    def __init__(self, run_dir: Path, programs: JavaPrograms) -> None:
        self.run_dir = run_dir
        self.programs = programs
        port = free_port()
        self.namesrv = JavaServer(
            "namesrv",
            run_dir / "namesrv",
            programs.namesrv_classpath,
            "org.apache.rocketmq.namesrv.NamesrvStartup",
            {"listenPort": port, "bindAddress": "127.0.0.1"},
            "256m",
        )
        self.addr = f"127.0.0.1:{port}"
        self.brokers: list[Broker] = []
        try:
            programs.classpath()  # javac while the NameServer starts
            self.namesrv.wait_boot()
        except BaseException:
            self.namesrv.kill()
            raise

    def close(self) -> None:
        """Stop the NameServer, and crash any broker a failed test left running."""
        for broker in self.brokers:
            broker.kill()
        self.namesrv.terminate()

    def add_broker(self, name: str, store: str | os.PathLike[str], **conf: Any) -> Broker:
        """Return a broker ``name`` on ``store`` for this NameServer, not yet started
        (``conf``: ``broker_conf``'s keywords and any other broker settings)."""
        store = os.fspath(store)
        run_root = self.run_dir / f"{name}-{len(self.brokers) + 1}"
        broker = Broker(self.programs, run_root, store, broker_conf(name, store, self.addr, **conf))
        self.brokers.append(broker)
        return broker

    def start_broker(
        self,
        store: str | os.PathLike[str],
        *,
        commitlog_size: int,
        consumequeue_size: int,
        topics: list[str],
        name: str = "broker-a",
    ) -> Broker:
        """Start a broker on ``store`` and return it once it serves ``topics``."""
        broker = self.add_broker(
            name, store, commitlog_size=commitlog_size, consumequeue_size=consumequeue_size
        )
        broker.start()
        try:
            broker.wait_boot()
            (ready,) = self.client("ready", name, *topics)
            if not ready["ready"]:
                raise RuntimeError(f"broker booted but is not routed: {ready}")
        except BaseException:
            broker.kill()
            raise
        return broker

    def client_process(self, *args: object, stdin: int | None = None) -> subprocess.Popen:
        """Start the Java client (``RocketClient`` modes), its stdout a pipe of JSON lines."""
        home = self.run_dir / "client-home"
        return subprocess.Popen(
            self.programs.client_command(self.addr, home, *args),
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
        )

    def client(self, *args: object, stdin: str | None = None, timeout: float = 300.0) -> list[dict]:
        """Run the Java client to the end and return the JSON objects it printed."""
        proc = self.client_process(*args, stdin=None if stdin is None else subprocess.PIPE)
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise RuntimeError(f"client {args} timed out:\n{err[-3000:]}") from None
        if proc.returncode != 0:
            raise RuntimeError(f"client {args} failed ({proc.returncode}):\n{err[-3000:]}")
        return parse_lines(out)

    def run(self, mode: str, spec: dict, *, timeout: float = 300.0) -> list[dict]:
        """Run one ``produce`` / ``pull`` in a JVM of its own, ``spec`` on its stdin."""
        return self.client(mode, stdin=json.dumps(spec), timeout=timeout)


class JavaService:
    """``RocketClient serve``: one JVM answering requests, one JSON line each, in order.

    A request's output lines end with ``{"_end": true}`` (and ``"error"`` when it failed,
    which ``request`` raises). Requests are serialised (a lock): the process runs one at
    a time.
    """

    def __init__(self, programs: JavaPrograms, namesrv: str, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self._stderr = open(run_dir / "stderr.log", "wb")  # closed in close()
        self.proc = subprocess.Popen(
            programs.client_command(namesrv, run_dir / "home", "serve"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            encoding="utf-8",
        )
        self.stderr_path = run_dir / "stderr.log"
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()
        self.started = time.monotonic()
        self.ready_after: float | None = None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _collect(self, timeout: float, what: object) -> list[dict]:
        rows: list[dict] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.proc.kill()
                raise RuntimeError(f"{what} timed out after {timeout:.0f} s") from None
            if line is None:
                err = self.stderr_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the Java client exited during {what}:\n{err}")
            if not line.startswith("{"):
                continue
            row = json.loads(line)
            if row.get("_end"):
                if row.get("error"):
                    raise RuntimeError(f"{what} failed: {row['error']}")
                return rows
            rows.append(row)

    def wait_started(self, timeout: float = jvm.BOOT_TIMEOUT) -> None:
        """Wait for the process's first line (its JVM started and the admin client too)."""
        with self._lock:
            self._collect(timeout, "start")
        self.ready_after = time.monotonic() - self.started

    def request(self, op: str, *, timeout: float = 300.0, **spec: object) -> list[dict]:
        """Run operation ``op`` with ``spec`` and return the lines it printed."""
        with self._lock:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"op": op, **spec}) + "\n")
            self.proc.stdin.flush()
            return self._collect(timeout, op)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(30)
        self._stderr.close()


def parse_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def body(key: str, size: int) -> bytes:
    """The body ``RocketClient send`` gives the message with this key."""
    unit = (key + "|").encode()
    return (unit * (size // len(unit) + 1))[:size]


def offset_msg_id_phy(offset_msg_id: str) -> int:
    """The commit log offset in a broker's offsetMsgId (store host, port, offset; hex)."""
    return int(offset_msg_id[-16:], 16)


def encode_message(m: dict) -> dict:
    """A message for ``RocketClient produce``: ``body`` (bytes or str) as base64, ``queue``
    (``(broker, queue id)``) as an object; ``topic``, ``tags``, ``keys``, ``properties``
    and ``delayLevel`` as given."""
    out = dict(m)
    b = m["body"]
    out["body"] = base64.b64encode(b.encode() if isinstance(b, str) else b).decode()
    if m.get("queue") is not None:
        broker, queue_id = m["queue"]
        out["queue"] = {"broker": broker, "queueId": queue_id}
    return out


def decode_message(row: dict) -> dict:
    """A message ``RocketClient pull`` printed, its body as bytes."""
    return {**row, "body": base64.b64decode(row["body"])}

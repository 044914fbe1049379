"""Java for the interoperability tests: classpaths from ``./dev``'s jar directories only,
javac, free loopback ports, and server JVMs started in run directories of their own.

``./dev setup`` copies each set of Apache RocketMQ artifacts, with its runtime
dependencies, into a directory of its own under ``$ROCKETSPARK_JARS`` (default: the
checkout's ``.jars``): ``rocketmq`` (broker, client, tools, store 5.3.1) and
``rocketmq-namesrv`` (the NameServer, 5.3.3: 5.3.1 is not on Maven Central). A
classpath is every jar of one such directory and nothing else; never ``~/.m2``, whose
other RocketMQ versions and logging back-ends would load instead of these.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKOUT_JARS = os.path.join(os.path.dirname(os.path.dirname(HERE)), ".jars")
ROCKETMQ = "rocketmq"
NAMESRV = "rocketmq-namesrv"
# JVM options for test programs whose stdout a test parses: RocketMQ's shaded logback
# reads this property (not logback.configurationFile).
QUIET = ["-Drmq.logback.configurationFile=" + os.path.join(HERE, "quiet-logback.xml")]
# What RocketMQ's own start scripts pass on JDK 9+, and what makes short-lived JVMs start
# fast on two busy cores (C1 only, serial GC). UTF-8 for the JSON the programs print.
FLAGS = [
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "--add-exports=java.base/sun.nio.ch=ALL-UNNAMED",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Dfile.encoding=UTF-8",
    "-Dcom.rocketmq.remoting.client.connect.timeout=10000",
]
BOOT_TIMEOUT = 240.0


def jar_dir(name: str) -> str | None:
    """Return ``./dev``'s directory of the artifact set ``name``, if it was fetched whole.

    ``$ROCKETSPARK_JARS/<name>`` first, then the checkout's ``.jars/<name>``; a directory
    counts only with the stamp ``./dev`` writes after a complete fetch.
    """
    roots = [os.environ.get("ROCKETSPARK_JARS"), CHECKOUT_JARS]
    for root in roots:
        if root and os.path.isfile(os.path.join(root, name, ".artifacts")):
            return os.path.join(root, name)
    return None


def classpath(name: str = ROCKETMQ) -> str | None:
    """Return the classpath of every jar in ``name``'s directory, or None without one."""
    d = jar_dir(name)
    if d is None:
        return None
    jars = sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".jar"))
    return os.pathsep.join(jars) if jars else None


def need_java(*names: str) -> list[str]:
    """Return the classpaths of ``names`` (default: RocketMQ's), skipping without a JDK.

    Under CI (``$CI`` set) a missing JDK or jar set fails the test instead: CI must run
    the interoperability tests, not skip them.
    """
    names = names or (ROCKETMQ,)
    paths = [classpath(n) for n in names]
    missing = [n for n, p in zip(names, paths, strict=True) if p is None]
    tools = [t for t in ("java", "javac") if not shutil.which(t)]
    if missing or tools:
        what = ", ".join(tools + [f"the jars of {n} (./dev setup fetches them)" for n in missing])
        if os.environ.get("CI"):
            pytest.fail(f"{what} missing: CI must run the RocketMQ interoperability tests")
        pytest.skip(f"needs {what}")
    return [p for p in paths if p is not None]


def javac(sources: Sequence[str | os.PathLike[str]], classpath: str, out: Path) -> None:
    """Compile Java source files into ``out``; raise with javac's errors on failure."""
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["javac", "-nowarn", "-encoding", "UTF-8", "-cp", classpath, "-d", str(out)]
        + [os.fspath(s) for s in sources],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"javac failed:\n{done.stderr[-4000:]}")


def free_port(*, also_below: int = 0) -> int:
    """Return a free loopback port p (and p - also_below free too: the broker's fast port)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port - also_below < 1024:
            continue
        try:
            for p in {port, port - also_below, port + 1}:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free loopback port")


class JavaServer:
    """A RocketMQ server JVM started in a run directory of its own; stdout to a file.

    ``main`` is started with ``-c <run_dir>/<name>.conf`` holding ``conf``; its user home
    and RocketMQ home are ``<run_dir>/home``, so its logs land there.
    """

    def __init__(
        self, name: str, run_dir: Path, classpath: str, main: str, conf: dict, heap: str
    ) -> None:
        self.name = name
        self.dir = run_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "home").mkdir(exist_ok=True)
        conf_file = self.dir / f"{name}.conf"
        conf_file.write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
        self.stdout = self.dir / "stdout.log"
        cmd = [
            "java",
            f"-Xms{heap}",
            f"-Xmx{heap}",
            f"-XX:MaxDirectMemorySize={heap}",
            *FLAGS,
            f"-Duser.home={self.dir / 'home'}",
            f"-Drocketmq.home.dir={self.dir / 'home'}",
            "-cp",
            classpath,
            main,
            "-c",
            str(conf_file),
        ]
        with open(self.stdout, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.started = time.monotonic()
        self.booted: float | None = None  # seconds from start to "boot success"

    def output(self) -> str:
        return self.stdout.read_text(errors="replace")

    def wait_boot(self, timeout: float = BOOT_TIMEOUT) -> None:
        """Wait for the JVM's "boot success" line; fail with its output if it exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "boot success" in self.output():
                self.booted = time.monotonic() - self.started
                return
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited ({self.proc.returncode}):\n{self.output()[-4000:]}"
                )
            time.sleep(0.25)
        self.kill()
        raise RuntimeError(f"{self.name} did not boot in {timeout:.0f} s:\n{self.output()[-4000:]}")

    def terminate(self, timeout: float = 120.0) -> int:
        """Stop cleanly (SIGTERM: RocketMQ's shutdown hook runs) and wait for the exit."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise RuntimeError(f"{self.name} did not stop in {timeout:.0f} s") from None
        return self.proc.returncode

    def kill(self) -> None:
        """Crash it: SIGKILL, no shutdown hook, the abort file stays."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(60)


def _proc_net_address(hex_addr: str) -> str:
    """An address of /proc/net/tcp{,6}: 32-bit words in host (little-endian) order."""
    raw = b"".join(bytes.fromhex(hex_addr[i : i + 8])[::-1] for i in range(0, len(hex_addr), 8))
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw))
    v6 = ipaddress.IPv6Address(raw)
    return str(v6.ipv4_mapped or v6)


def listening(pid: int) -> set[tuple[str, int]]:
    """The (address, port) of every TCP socket process ``pid`` listens on (Linux /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    host, port = fields[1].split(":")
                    found.add((_proc_net_address(host), int(port, 16)))
    return found

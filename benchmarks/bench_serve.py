"""Serve benchmark: ``rocketspark serve`` against a real RocketMQ broker, one Java client.

    ./dev bench-serve            # or: python benchmarks/bench_serve.py [--quick] [--rounds N]
    ./dev bench-serve --only pull32,pull1024     # some measurements only (here: the pulls)

Starts ``rocketspark serve`` on a fresh store directory (the ``rocketspark`` command, as a
user starts it, in a process of its own) and Apache RocketMQ 5.3.1 (a NameServer and a
broker on loopback, started as ``bench_cluster.py`` starts them; the broker allows answers
of 1024 messages / 4 MiB a pull, as serve does, so that a client asking for 1024 gets
them), fills a 4-queue topic on each with the same N messages of 100-byte bodies (tag
"t", through the remoting client), and measures RocketMQ's own Java client against both
in one JVM (``benchmarks/java/ClusterBench.java``: the same compiled code, the same
requests; its requests name the NameServer), in rounds that alternate which server goes
first (a warm-up round first, not counted; medians):

- single sends: N synchronous ``DefaultMQProducer.send(msg)``, msg/s;
- batch sends: ``send(Collection)`` of 1024 messages, 200 of them a round, msg/s;
- pull: a ``DefaultLitePullConsumer`` (a new group, the 4 queues assigned from the first
  offset, ``poll()`` until all N came) draining the topic, rows/s, with
  ``pullBatchSize`` 32 (the broker's default answer) and 1024;
- long-poll wake-up: a ``DefaultMQPushConsumer`` waits on an empty 4-queue topic (its
  pulls held by the server); the same JVM sends one message, waits for the listener to
  get it, sleeps 20 ms (the consumer's next pull is held again), and so on: the time from
  just before ``send`` to the listener's call, both ``System.nanoTime()`` of that JVM.
  p50 and p99 over every round's messages.

The Java client's own work is the same on both sides (one JVM, kept warm, the same
code): what differs is the server. The ratios are serve / the real broker (above 1:
serve is faster); each measurement also shows the CPU the servers spent on it, from
/proc (serve's process; the broker's and the NameServer's JVMs), and the Java client's
JVM's (its own cost, which should be alike on both sides). The machine's state
and load average are printed at the start and end. The machine is shared: compare
ratios from one run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from bench_cluster import (  # noqa: E402
    QUEUES,
    TUNED,
    JavaBench,
    client,
    fill,
    start_cluster,
    stop,
    wait_brokers,
)
from machine import CLK_TCK, proc_stat, reference  # noqa: E402

from tests.helpers.jvm import free_port  # noqa: E402

BROKER = "broker-a"  # the real broker's name, and serve's (the store's default brokerName)
PULL_TOPIC = "bench"
SEND_TOPIC = "send"
SIDES = ("serve", "real")
STEPS = ("single", "batch", "pull32", "pull1024", "wake")  # the measurements, in order


class Serve:
    """``rocketspark serve`` on ``store``, in a process of its own, started as a user does."""

    def __init__(self, store: Path, log: Path, timeout: float = 120.0) -> None:
        self.namesrv_port, self.broker_port = free_port(), free_port()
        exe = Path(sys.executable).with_name("rocketspark")
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "rocketspark.cli"]
        cmd += [
            "serve",
            "--store",
            str(store),
            "--listen",
            f"127.0.0.1:{self.namesrv_port}",
            "--broker-port",
            str(self.broker_port),
            "--log-level",
            "WARNING",
        ]
        # This checkout's code, also when the command is an installed one.
        path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
        self._log = open(log, "wb")  # closed in stop()
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env={**os.environ, "PYTHONPATH": path},
            start_new_session=True,
        )
        timer = threading.Timer(timeout, self.proc.kill)
        timer.start()
        try:
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline()
        finally:
            timer.cancel()
        if not line.startswith("serving "):
            self.stop()
            raise RuntimeError(f"rocketspark serve did not start: {line!r}, see {log}")
        self.addr = f"127.0.0.1:{self.namesrv_port}"

    def stop(self) -> None:
        """SIGTERM (serve flushes and checkpoints), then wait."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(60)
        self._log.close()


def cpu_seconds(pids: list[int]) -> float:
    """CPU-seconds the processes used so far (their own and their reaped children's)."""
    ticks = 0
    for pid in pids:
        st = proc_stat(pid)
        if st is not None:
            ticks += st.total
    return ticks / CLK_TCK


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by the nearest rank."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small runs (a smoke test)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (default 5)")
    ap.add_argument("-n", type=int, default=400_000, help="messages in the pulled topic")
    ap.add_argument("--single", type=int, default=10_000, help="single sends per round")
    ap.add_argument("--batch", type=int, default=1024, help="messages per batch send")
    # 200 batches: a round of ~0.5 s (50 took ~0.15 s, and its rounds swung 0.7-1.6)
    ap.add_argument("--batches", type=int, default=200, help="batch sends per round")
    ap.add_argument("--wake", type=int, default=300, help="long-poll wake-ups per round")
    ap.add_argument(
        "--only",
        default=",".join(STEPS),
        help=f"measurements to run, comma-separated (default all: {','.join(STEPS)}; "
        "'pull32,pull1024': the pulls only)",
    )
    args = ap.parse_args()
    only = {key.strip() for key in args.only.split(",") if key.strip()}
    if not only or set(only) - set(STEPS):
        ap.error(f"--only takes some of {','.join(STEPS)}")
    n, n_single, n_wake, rounds = args.n, args.single, args.wake, args.rounds
    if args.quick:
        n, n_single, n_wake, rounds = 40_000, 1_000, 50, 1
    n_batch = (10 if args.quick else args.batches) * args.batch
    # SIGTERM as Ctrl-C: the finally block stops the servers and removes the files.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    start_machine, start_load = reference(), os.getloadavg()
    run_dir = Path(tempfile.mkdtemp(prefix="rs-bench-serve-"))
    rocketmq = serve = java = None
    rates: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    wakes: dict[str, list[list[float]]] = {side: [] for side in SIDES}  # per round
    try:
        rocketmq, classpath = start_cluster(run_dir, {BROKER: dict(TUNED)})
        serve = Serve(run_dir / "serve-store", run_dir / "serve.log")
        ns = {"serve": serve.addr, "real": rocketmq.addr}
        servers = {
            "serve": [serve.proc.pid],
            "real": [rocketmq.namesrv.proc.pid]
            + [b.server.proc.pid for b in rocketmq.brokers if b.server is not None],
        }
        wake_topics = {side: [f"wake-{r}" for r in range(rounds + 1)] for side in SIDES}
        for side in SIDES:
            admin = client(ns[side], 32)
            wait_brokers(admin, {BROKER})
            for topic in (PULL_TOPIC, SEND_TOPIC, *wake_topics[side]):
                admin.remoting.create_topic(topic, {BROKER: QUEUES})
            if only & {"pull32", "pull1024"}:
                fill(client(ns[side], 1024), PULL_TOPIC, n)
        java = JavaBench(classpath, rocketmq.addr, run_dir / "java-home")
        print(
            f"serve ({serve.addr}) and RocketMQ ({rocketmq.addr}) up; "
            f"{n if only & {'pull32', 'pull1024'} else 0:,} messages in {PULL_TOPIC!r} on each",
            flush=True,
        )

        steps: list[tuple[str, str, dict[str, object]]] = [
            ("single", "send", {"topic": SEND_TOPIC, "n": n_single, "batch": 0}),
            ("batch", "send", {"topic": SEND_TOPIC, "n": n_batch, "batch": args.batch}),
            ("pull32", "pull", {"topic": PULL_TOPIC, "n": n, "batch": 32}),
            ("pull1024", "pull", {"topic": PULL_TOPIC, "n": n, "batch": 1024}),
            ("wake", "wake", {"n": n_wake, "gapMs": 20}),
        ]
        steps = [step for step in steps if step[0] in only]

        for r in range(rounds + 1):  # round 0 warms up (JIT, page cache, connections)
            order = SIDES if r % 2 else SIDES[::-1]
            line = []
            for key, op, spec in steps:
                for side in order:
                    request = {**spec, "ns": ns[side]}
                    if op == "wake":
                        request["topic"] = wake_topics[side][r]
                    cpu0 = cpu_seconds(servers[side]), cpu_seconds([java.proc.pid])
                    row = java.request(op, **request)
                    used = cpu_seconds(servers[side]) - cpu0[0]
                    used_java = cpu_seconds([java.proc.pid]) - cpu0[1]
                    if op == "wake":
                        got = [float(us) for us in row["micros"]]
                        value = percentile(got, 99) / 1000
                        line.append(f"{key} {side} p99 {value:.2f} ms")
                        if r:
                            wakes[side].append(got)
                        continue
                    value = row["rows"] / row["seconds"]
                    line.append(f"{key} {side} {value:,.0f}")
                    if r:
                        rates.setdefault(f"{key} {side}", []).append(value)
                        cpu.setdefault(f"{key} {side}", []).append(used)
                        cpu.setdefault(f"{key} {side} java", []).append(used_java)
            print(f"round {r}{' (warm-up)' if not r else ''}: " + ", ".join(line), flush=True)
        end_machine, end_load = reference(), os.getloadavg()
    finally:
        if java is not None:
            java.close()
        if serve is not None:
            serve.stop()
        from rocketspark.client import close_all

        close_all()
        if rocketmq is not None:
            stop(rocketmq)
        shutil.rmtree(run_dir, ignore_errors=True)
    report(
        rates,
        cpu,
        wakes,
        n=n,
        n_single=n_single,
        n_batch=n_batch,
        batch=args.batch,
        rounds=rounds,
        machine=[
            f"at the start: {start_machine}; load average {start_load[0]:.2f} "
            f"{start_load[1]:.2f} {start_load[2]:.2f}",
            f"at the end:   {end_machine}; load average {end_load[0]:.2f} "
            f"{end_load[1]:.2f} {end_load[2]:.2f}",
        ],
    )


def report(
    rates: dict[str, list[float]],
    cpu: dict[str, list[float]],
    wakes: dict[str, list[list[float]]],
    *,
    n: int,
    n_single: int,
    n_batch: int,
    batch: int,
    rounds: int,
    machine: list[str],
) -> None:
    med = statistics.median
    print()
    print(
        f"rocketspark serve vs Apache RocketMQ 5.3.1, RocketMQ's Java client on both: "
        f"100-byte bodies, medians of {rounds} rounds, ratios serve / real broker"
    )
    for line in machine:
        print(f"  machine {line}")
    rows: list[tuple[str, ...]] = [
        (
            "measurement",
            "serve",
            "real broker",
            "ratio",
            "goal",
            "server CPU-s serve / real",
            "Java CPU-s serve / real",
        )
    ]
    labels: dict[str, tuple[str, str]] = {
        "single": (f"single sync sends, {n_single:,} a round, msg/s", ">= 0.5"),
        "batch": (f"send(Collection of {batch}), {n_batch:,} a round, msg/s", ">= 1.0"),
        "pull32": (f"lite pull of {n:,} from 4 queues, pullBatchSize 32, rows/s", ">= 1.0"),
        "pull1024": ("the same, pullBatchSize 1024, rows/s", ">= 1.0"),
    }
    fmt: Callable[[float], str] = "{:,.0f}".format
    for key, (label, goal) in labels.items():
        if f"{key} serve" not in rates:
            continue
        ours, theirs = med(rates[f"{key} serve"]), med(rates[f"{key} real"])
        c_ours, c_theirs = med(cpu[f"{key} serve"]), med(cpu[f"{key} real"])
        j_ours, j_theirs = med(cpu[f"{key} serve java"]), med(cpu[f"{key} real java"])
        per_round = ", ".join(
            f"{a / b:.2f}" for a, b in zip(rates[f"{key} serve"], rates[f"{key} real"], strict=True)
        )
        rows.append(
            (
                label,
                fmt(ours),
                fmt(theirs),
                f"{ours / theirs:.2f} ({per_round})",
                goal,
                f"{c_ours:.2f} / {c_theirs:.2f}",
                f"{j_ours:.2f} / {j_theirs:.2f}",
            )
        )
    if wakes["serve"] and wakes["real"]:
        every = {side: [us for got in wakes[side] for us in got] for side in SIDES}
        for q, goal in ((50, ""), (99, "serve < 5 ms")):
            ours, theirs = (percentile(every[side], q) / 1000 for side in SIDES)
            per_round = ", ".join(
                f"{percentile(a, q) / 1000:.1f}/{percentile(b, q) / 1000:.1f}"
                for a, b in zip(wakes["serve"], wakes["real"], strict=True)
            )
            rows.append(
                (
                    f"long-poll wake-up, send -> push listener, p{q} "
                    f"({len(every['serve'])} each), ms",
                    f"{ours:.2f}",
                    f"{theirs:.2f}",
                    f"{ours / theirs:.2f} (serve/real {per_round})",
                    goal,
                    "",
                    "",
                )
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for i, r in enumerate(rows):
        print(
            "  "
            + " | ".join(
                c.ljust(w) if j == 0 else c.rjust(w)
                for j, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
        if i == 0:
            print("  " + "-+-".join("-" * w for w in widths))
    print(
        "  ratio: serve / real broker, from the medians (each round's in brackets); rows/s "
        "above 1: serve is faster; the wake-up's: above 1 is slower"
    )


if __name__ == "__main__":
    main()

"""Cluster benchmark: rocketspark against RocketMQ's own Java client, on the same brokers.

    ./dev bench-cluster          # or: python benchmarks/bench_cluster.py [--quick] [--runs N]

Starts its own RocketMQ (a NameServer and two masters on loopback, ``broker-a`` with the
broker's default pull limits, ``broker-b`` tuned: see ``BROKERS``), fills a 4-queue topic
on each with N messages of 100-byte bodies (tag "t"), and measures in alternating rounds
(medians):

- pull: the whole topic into Arrow by one Python process (``RemoteClient.read_batches``
  over the 4 queues, one after the other, ``pullPipeline`` pulls in flight) against
  RocketMQ's ``DefaultLitePullConsumer`` (the 4 queues assigned, from the first offset,
  ``poll()`` until N; its pull threads pull the queues in parallel, one request in
  flight per queue). Both ask for the same pullBatchSize: 32 on broker-a, 1024 on
  broker-b;
- transactional sends: N halves prepared and committed as the exactly-once sink does
  (``prepare_columns``, halves pipelined, then ``end_transactions``, every answer awaited)
  against N ``TransactionMQProducer.sendMessageInTransaction`` (a half, then a one-way
  END_TRANSACTION, one message after the other);
- send: synchronous single sends (``put_batch([message])`` per call against
  ``producer.send(msg)``), and batches (``put_columns`` of B rows, which the client
  splits into one SEND_BATCH_MESSAGE per queue, against ``producer.send(Collection)`` of
  B messages, one request to one queue);
- the Spark source (local[2], noop sink): the topic through ``nameServer`` against the
  same rows in an embedded store (``store``), same SparkSession;
- the Spark sink: at-least-once and exactly-once ``df.write`` into broker-a, and into an
  embedded store for comparison.

The Java side runs in one JVM (``benchmarks/java/ClusterBench.java``, compiled with javac
against ``./dev``'s RocketMQ jars) that stays up for the whole run, so its later rounds
run JIT-compiled code. ``--profile pull|send`` runs one round of ours under cProfile and
prints where the time goes. The machine is shared: compare ratios from one run.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from machine import reference  # noqa: E402

from rocketspark.client.api import ClientRef  # noqa: E402
from rocketspark.message.model import Message  # noqa: E402
from rocketspark.store import MessageStore  # noqa: E402
from tests.helpers import jvm  # noqa: E402
from tests.helpers.rocketmq import JavaPrograms, RocketMQ  # noqa: E402

BODY = b"x" * 100
TAG = "t"
QUEUES = 4
TX_GROUP = "bench-transact"
# The two brokers: the same store settings, different pull limits. A pull answers at most
# maxTransferCountOnMessageInMemory messages / maxTransferBytesOnMessageInMemory bytes
# (…OnDisk when the messages are no longer in the page cache): 32 / 256 KiB and 8 / 64 KiB
# by default. The benchmark's data fits in memory (accessMessageInMemoryMaxRatio: 40% of RAM).
COMMON: dict[str, object] = {
    "mappedFileSizeCommitLog": 256 * 1024 * 1024,
    "timerFlushIntervalMs": 60_000,  # see tests/helpers/cluster.py
}
TUNED: dict[str, object] = {
    "maxTransferCountOnMessageInMemory": 1024,
    "maxTransferBytesOnMessageInMemory": 4 * 1024 * 1024,
    "maxTransferCountOnMessageInDisk": 1024,
    "maxTransferBytesOnMessageInDisk": 4 * 1024 * 1024,
}
BROKERS: dict[str, tuple[str, dict[str, object], int]] = {
    # label: (broker, settings, pullBatchSize of both clients)
    "default": ("broker-a", {}, 32),
    "tuned": ("broker-b", TUNED, 1024),
}
JAVA_FLAGS = [f for f in jvm.FLAGS if f not in ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")]


class JavaBench:
    """``ClusterBench``: one JVM answering one JSON request a line."""

    def __init__(self, classpath: str, namesrv: str, home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self._err = open(home / "stderr.log", "wb")  # closed in close()
        self.proc = subprocess.Popen(
            [
                "java",
                "-Xms1g",
                "-Xmx1g",
                *JAVA_FLAGS,
                *jvm.QUIET,
                f"-Duser.home={home}",
                f"-Drocketmq.client.logRoot={home}",
                "-cp",
                classpath,
                "ClusterBench",
                namesrv,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
            encoding="utf-8",
        )
        self._read()  # {"ready": true}

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                row = json.loads(line)
                if "error" in row:
                    raise RuntimeError(f"ClusterBench: {row['error']}")
                return row
        raise RuntimeError(f"ClusterBench exited ({self.proc.wait()})")

    def request(self, op: str, **spec: object) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **spec}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def rate(self, op: str, **spec: object) -> float:
        row = self.request(op, **spec)
        return row["rows"] / row["seconds"]

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self._err.close()


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ---- ours ---------------------------------------------------------------------------


def client(namesrv: str, pull_batch: int) -> Any:
    return ClientRef.cluster(namesrv, {"pullBatchSize": str(pull_batch)}).connect()


def pull_all(c: Any, topic: str) -> int:
    """Read every queue of ``topic`` into Arrow, one queue after the other; rows read."""
    rows = 0
    for mq in c.queues(topic):
        batches, _ = c.read_batches(mq, 0, c.max_offset(mq))
        rows += sum(b.num_rows for b in batches)
    return rows


def pull_parallel(c: Any, topic: str) -> int:
    """Read every queue of ``topic`` into Arrow, a thread per queue; rows read."""

    def one(mq: Any) -> int:
        batches, _ = c.read_batches(mq, 0, c.max_offset(mq))
        return sum(b.num_rows for b in batches)

    mqs = c.queues(topic)
    with ThreadPoolExecutor(len(mqs)) as pool:
        return sum(pool.map(one, mqs))


def ours_pull_parallel(c: Any, topic: str, n: int) -> float:
    t0 = time.perf_counter()
    rows = pull_parallel(c, topic)
    dt = time.perf_counter() - t0
    assert rows == n, (rows, n)
    return n / dt


def ours_pull(c: Any, topic: str, n: int) -> float:
    t0 = time.perf_counter()
    rows = pull_all(c, topic)
    dt = time.perf_counter() - t0
    assert rows == n, (rows, n)
    return n / dt


def ours_single(c: Any, topic: str, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        c.put_batch([Message(topic, BODY, tags=TAG)])
    return n / (time.perf_counter() - t0)


def ours_columns(c: Any, topic: str, n: int, batch: int) -> float:
    bodies, tags = [BODY] * batch, [TAG] * batch
    t0 = time.perf_counter()
    for _ in range(n // batch):
        c.put_columns(bodies, topic=topic, tags=tags)
    return (n // batch) * batch / (time.perf_counter() - t0)


def ours_transact(c: Any, topic: str, n: int) -> float:
    """n halves prepared (pipelined, as the exactly-once sink's tasks send them) and
    committed (every END_TRANSACTION answer awaited, as the sink's driver does)."""
    t0 = time.perf_counter()
    results = c.prepare_columns([BODY] * n, topic=topic, tags=[TAG] * n, producer_group=TX_GROUP)
    c.end_transactions(c.halves(results, producer_group=TX_GROUP), commit=True)
    return n / (time.perf_counter() - t0)


def fill(c: Any, topic: str, n: int) -> None:
    step = 4096
    for i in range(0, n, step):
        k = min(step, n - i)
        c.put_columns([BODY] * k, topic=topic, tags=[TAG] * k)


# ---- Spark ----------------------------------------------------------------------------


def spark_read(spark: Any, options: dict[str, str]) -> None:
    reader = spark.read.format("rocketmq")
    for k, v in options.items():
        reader = reader.option(k, v)
    reader.load().write.format("noop").mode("overwrite").save()


def spark_write(df: Any, options: dict[str, str], guarantee: str) -> None:
    writer = df.write.format("rocketmq").option("deliveryGuarantee", guarantee)
    for k, v in options.items():
        writer = writer.option(k, v)
    writer.mode("append").save()


# ---- main -----------------------------------------------------------------------------


def profile(fn: Callable[[], object], what: str, top: int = 30) -> None:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(top)
        print(f"---- profile of {what}, by {key} ----")
        print(out.getvalue())


def run_profiles(
    what: list[str],
    ns: str,
    topics: dict[str, str],
    n: int,
    n_single: int,
    n_batch: int,
    batch: int,
) -> None:
    if "pull" in what:
        c = client(ns, BROKERS["tuned"][2])
        pull_all(c, topics["tuned"])  # warm-up
        profile(lambda: pull_all(c, topics["tuned"]), f"pull of {n:,} rows (tuned)")
        c = client(ns, BROKERS["default"][2])
        profile(lambda: pull_all(c, topics["default"]), f"pull of {n:,} rows (default)")
    c = client(ns, 32)
    if "send" in what:
        ours_single(c, "send-default", 500)
        profile(lambda: ours_single(c, "send-default", n_single), f"{n_single:,} single sends")
        profile(
            lambda: ours_columns(c, "send-default", n_batch, batch),
            f"{n_batch:,} rows in put_columns of {batch}",
        )
    if "prepare" in what:
        rows = 10 * batch

        def prepare_and_commit() -> None:
            group = "bench-prepare"
            results = []
            for _ in range(rows // batch):
                results += c.prepare_columns(
                    [BODY] * batch, topic="send-default", tags=[TAG] * batch, producer_group=group
                )
            c.end_transactions(c.halves(results, producer_group=group), commit=True)

        dt = _timed(prepare_and_commit)
        print(f"{rows:,} halves prepared and committed: {rows / dt:,.0f} rows/s")
        profile(prepare_and_commit, f"{rows:,} halves prepared and committed")


def start_cluster(
    run_dir: Path, brokers: dict[str, dict[str, object]] | None = None
) -> tuple[RocketMQ, str]:
    """Start a NameServer and ``brokers`` (name: settings besides ``COMMON``; default
    ``BROKERS``') and compile ClusterBench; return them and ClusterBench's classpath."""
    broker_cp, namesrv_cp = jvm.classpath(jvm.ROCKETMQ), jvm.classpath(jvm.NAMESRV)
    if broker_cp is None or namesrv_cp is None or not shutil.which("javac"):
        sys.exit("needs java, javac and RocketMQ's jars (./dev setup fetches them)")
    if brokers is None:
        brokers = {broker: settings for broker, settings, _ in BROKERS.values()}
    programs = JavaPrograms(run_dir / "java", broker_cp, namesrv_cp)
    rocketmq = RocketMQ(run_dir / "cluster", programs)
    try:
        started = []
        for broker, settings in brokers.items():
            b = rocketmq.add_broker(broker, run_dir / broker / "store", **COMMON, **settings)
            b.start()
            started.append(b)
        for b in started:
            b.wait_boot()
        jvm.javac(
            [Path(ROOT) / "benchmarks" / "java" / "ClusterBench.java"],
            broker_cp,
            run_dir / "bench-classes",
        )
    except BaseException:
        rocketmq.close()
        raise
    return rocketmq, f"{run_dir / 'bench-classes'}{os.pathsep}{broker_cp}"


def wait_brokers(c: Any, names: set[str], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not names <= set(c.remoting.brokers()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"brokers {sorted(names)} not registered in {timeout:.0f} s")
        time.sleep(0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small runs (a smoke test)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("-n", type=int, default=400_000, help="messages in each pulled topic")
    ap.add_argument("--single", type=int, default=20_000, help="single sends per round")
    ap.add_argument("--batch", type=int, default=1024, help="messages per batch send call")
    ap.add_argument("--transact", type=int, default=4_000, help="transactional sends per round")
    ap.add_argument("--sink", type=int, default=100_000, help="rows per Spark write")
    ap.add_argument("--no-spark", action="store_true", help="pull and send only")
    ap.add_argument(
        "--only",
        choices=("pull", "send"),
        help="measure pulls or sends only (send: no pulled topics are filled, no Spark)",
    )
    ap.add_argument(
        "--profile",
        nargs="+",
        choices=("pull", "send", "prepare"),
        help="profile one round of ours (prepare: exactly-once halves, prepared and ended)",
    )
    args = ap.parse_args()
    n, n_single, n_sink, runs = args.n, args.single, args.sink, args.runs
    n_tx = args.transact
    if args.quick:
        n, n_single, n_sink, runs, n_tx = 40_000, 2_000, 20_000, 1, 500
    n_batch = 50 * args.batch if not args.quick else 10 * args.batch
    before, load = reference(), os.getloadavg()
    run_dir = Path(tempfile.mkdtemp(prefix="rs-bench-cluster-"))
    rocketmq: RocketMQ | None = None
    java: JavaBench | None = None
    spark = None
    results: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        results.setdefault(key, []).append(value)

    try:
        rocketmq, classpath = start_cluster(run_dir)
        ns = rocketmq.addr
        admin = client(ns, 32)
        wait_brokers(admin, {b for b, _, _ in BROKERS.values()})
        topics = {}
        for label, (broker, _, batch) in BROKERS.items():
            topic = topics[label] = f"bench-{label}"
            admin.remoting.create_topic(topic, {broker: QUEUES})
            admin.remoting.create_topic(f"send-{label}", {broker: QUEUES})
            if args.only != "send":
                fill(client(ns, batch), topic, n)
        java = JavaBench(classpath, ns, run_dir / "java-home")
        print(f"cluster up ({ns}); {n:,} messages in each of {sorted(topics.values())}", flush=True)

        if args.profile:
            run_profiles(args.profile, ns, topics, n, n_single, n_batch, args.batch)
            return

        # pull and send: a warm-up round (JIT, page cache, connections), then the rounds
        if args.only != "send":
            java.rate("pull", topic=topics["default"], n=n, batch=32)
            pull_all(client(ns, 32), topics["default"])
        if args.only != "pull":
            java.rate("send", topic="send-default", n=n_single // 4, batch=0)
            ours_single(client(ns, 32), "send-default", n_single // 4)
        for r in range(runs):
            java_first = r % 2 == 1
            steps: list[tuple[str, Callable[..., float], tuple[Any, ...], dict[str, Any]]] = []
            for label, (_, _, batch) in BROKERS.items():
                c = client(ns, batch)
                pull = {"topic": topics[label], "n": n, "batch": batch}
                steps.append((f"pull {label} java", java.rate, ("pull",), pull))
                steps.append((f"pull {label} ours", ours_pull, (c, topics[label], n), {}))
                steps.append((f"pull {label} java", java.rate, ("pull",), pull))
                steps.append((f"pull {label} ours4", ours_pull_parallel, (c, topics[label], n), {}))
            c, send = client(ns, 32), "send-default"
            single = {"topic": send, "n": n_single, "batch": 0}
            batches = {"topic": send, "n": n_batch, "batch": args.batch}
            steps += [
                ("single java", java.rate, ("send",), single),
                ("single ours", ours_single, (c, send, n_single), {}),
                ("batch java", java.rate, ("send",), batches),
                ("batch ours", ours_columns, (c, send, n_batch, args.batch), {}),
                ("transact java", java.rate, ("transact",), {"topic": send, "n": n_tx}),
                ("transact ours", ours_transact, (c, send, n_tx), {}),
                ("batch4 ours", ours_columns, (c, send, n_batch, 4 * args.batch), {}),
            ]
            if args.only is not None:  # the pull steps, or the send steps
                steps = [s for s in steps if s[0].startswith("pull") == (args.only == "pull")]
            # pairs (java, ours) in alternating order from round to round
            for k in range(0, len(steps), 2):
                pair = steps[k : k + 2]
                for key, fn, a, kw in pair if java_first else pair[::-1]:
                    add(key, fn(*a, **kw))
            print(
                f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in results.items()),
                flush=True,
            )
        java.close()
        java = None

        if not args.no_spark and args.only is None:
            spark = run_spark(ns, topics, n, n_sink, runs, run_dir, add)
    finally:
        if java is not None:
            java.close()
        if spark is not None:
            spark.stop()
        from rocketspark.client import close_all

        close_all()
        if rocketmq is not None:
            stop(rocketmq)
        shutil.rmtree(run_dir, ignore_errors=True)
    report(
        results,
        n=n,
        n_single=n_single,
        n_tx=n_tx,
        n_batch=n_batch,
        batch=args.batch,
        n_sink=n_sink,
        runs=runs,
        before=before,
        load=load,
    )


def run_spark(
    ns: str,
    topics: dict[str, str],
    n: int,
    n_sink: int,
    runs: int,
    run_dir: Path,
    add: Callable[[str, float], None],
) -> Any:
    from pyspark.sql import functions as F

    from rocketspark.session import local_session

    spark = local_session(
        "rocketspark-bench-cluster", delta=False, conf={"spark.ui.showConsoleProgress": "false"}
    )
    store = str(run_dir / "embedded")
    with MessageStore.open(store) as s:
        s.create_topic("bench", queues=QUEUES)
        for i in range(0, n, 4096):
            k = min(4096, n - i)
            s.put_columns([BODY] * k, topic="bench", tags=[TAG] * k)
        s.create_topic("sink", queues=QUEUES)
    admin = client(ns, 32)
    admin.remoting.create_topic("sink", {"broker-a": QUEUES})
    sources = {"embedded": {"store": store, "topic": "bench"}}
    for label, (_, _, batch) in BROKERS.items():
        sources[label] = {"nameServer": ns, "topic": topics[label], "pullBatchSize": str(batch)}
    for options in sources.values():  # warm-up: Python workers, page cache
        spark_read(spark, options)
    for r in range(runs):
        order = list(sources.items())
        for label, options in order if r % 2 == 0 else order[::-1]:
            add(f"source {label}", n / _timed(lambda options=options: spark_read(spark, options)))
        print(f"spark source round {r + 1}", flush=True)
    df = spark.range(n_sink, numPartitions=2).select(F.lit(BODY).cast("binary").alias("body"))
    df = df.cache()
    df.count()
    sinks = {
        "broker": {"nameServer": ns, "topic": "sink"},
        "embedded": {"store": store, "topic": "sink"},
    }
    for guarantee in ("at_least_once", "exactly_once"):
        try:
            for options in sinks.values():
                spark_write(df, options, guarantee)  # warm-up
            for _ in range(runs):
                for where, options in sinks.items():
                    dt = _timed(lambda options=options, g=guarantee: spark_write(df, options, g))
                    add(f"sink {guarantee} {where}", n_sink / dt)
        except Exception as e:  # reported: a failed write is a finding, not the end of the run
            lines = str(e).strip().splitlines() or [repr(e)]
            ours = [line for line in lines if "rocketspark.errors." in line]
            print(f"spark sink {guarantee} FAILED: {(ours or lines)[-1]}", flush=True)
            continue
        print(f"spark sink {guarantee} done", flush=True)
    df.unpersist()
    return spark


def stop(rocketmq: RocketMQ) -> None:
    """Stop the brokers (SIGTERM, together), then the NameServer."""
    running = [b.server for b in rocketmq.brokers if b.running and b.server is not None]
    for server in running:
        server.proc.terminate()
    for server in running:
        try:
            server.proc.wait(120)
        except subprocess.TimeoutExpired:
            server.kill()
    rocketmq.close()


def report(
    results: dict[str, list[float]],
    *,
    n: int,
    n_single: int,
    n_tx: int,
    n_batch: int,
    batch: int,
    n_sink: int,
    runs: int,
    before: str,
    load: tuple[float, float, float],
) -> None:
    med = {k: statistics.median(v) for k, v in results.items()}

    def row(label: str, ours: str, theirs: str | None, note: str = "") -> None:
        if ours not in med:
            return
        if theirs is None or theirs not in med:
            print(f"  {label:<44} {med[ours]:>11,.0f} {'':>11} {'':>7}  {note}")
            return
        ratio = med[ours] / med[theirs]
        print(f"  {label:<44} {med[ours]:>11,.0f} {med[theirs]:>11,.0f} {ratio:>7.2f}  {note}")

    print()
    print(f"rocketspark cluster benchmark: 100-byte bodies, medians of {runs} rounds")
    print(f"  machine at the start: {before}; load average {load[0]:.2f} {load[1]:.2f}")
    print(f"  machine at the end:   {reference()}; load average {os.getloadavg()[0]:.2f}")
    print("  brokers: broker-a defaults (a pull answers <= 32 messages / 256 KiB), pullBatchSize")
    print("  32; broker-b maxTransferCount/BytesOnMessageInMemory (and InDisk) 1024 / 4 MiB,")
    print("  pullBatchSize 1024; both clients ask for the same pullBatchSize")
    print(f"  {'':<44} {'ours':>11} {'reference':>11} {'ratio':>7}")
    for label in BROKERS:
        row(
            f"pull {n:,} rows, 4 queues, {label} broker",
            f"pull {label} ours",
            f"pull {label} java",
            "rows/s; reference: DefaultLitePullConsumer",
        )
        row("  the same, a thread per queue", f"pull {label} ours4", f"pull {label} java")
    row(
        f"send single, synchronous ({n_single:,})",
        "single ours",
        "single java",
        "rows/s; reference: producer.send(msg)",
    )
    row(
        f"send batches: put_columns({batch})",
        "batch ours",
        "batch java",
        f"reference: producer.send(Collection of {batch})",
    )
    row(
        f"send batches: put_columns({4 * batch})",
        "batch4 ours",
        "batch java",
        f"({n_batch:,} rows a round)",
    )
    row(
        f"transactional sends, committed ({n_tx:,})",
        "transact ours",
        "transact java",
        "reference: sendMessageInTransaction",
    )
    for label in BROKERS:
        row(
            f"Spark source via nameServer, {label} broker",
            f"source {label}",
            "source embedded",
            "rows/s, local[2] -> noop; reference: embedded",
        )
    row("Spark source, embedded store", "source embedded", None)
    for label in BROKERS:  # what the broker answers at all: a bound for the Spark source
        for who in ("ours", "java"):
            row(
                f"  one process's pull ({who}), {label} broker",
                f"pull {label} {who}",
                "source embedded",
                "reference: the Spark source on the embedded store",
            )
    for g in ("at_least_once", "exactly_once"):
        row(
            f"Spark sink {g} into the broker ({n_sink:,})",
            f"sink {g} broker",
            f"sink {g} embedded",
            "rows/s; reference: embedded store",
        )


if __name__ == "__main__":
    main()

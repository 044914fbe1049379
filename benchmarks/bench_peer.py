"""Peer benchmark: our Spark source against Spark's own Kafka source on a real Kafka broker.

    ./dev bench-peer             # or: python benchmarks/bench_peer.py --kafka-jars DIR
                                 #       --spark-kafka-jars DIR [--quick] [--rows N] [--runs N]

What a data engineer compares a Spark connector with is Spark's built-in Kafka
source reading a Kafka broker. This starts a single-node Apache Kafka broker
(KRaft, broker and controller on 127.0.0.1 only, a storage directory of its own
formatted with a random cluster id), fills a 4-partition topic with N rows
(key ``k``, 100-byte value) and a 4-queue topic of an embedded rocketspark
store with the same N rows (key ``k``, 100-byte body), then in one SparkSession
(local[2], Spark's Kafka connector from ``--spark-kafka-jars``) measures, in
rounds that alternate which system goes first (a warm-up round first, not
counted; medians):

- a batch read of the whole topic into Spark's ``noop`` sink, rows/s;
- the same, of the bodies only: ours told so with ``.schema("body binary")`` (the
  source then builds that column alone), Kafka's source with ``select("value")``
  (it has no way to be told: it reads every column, Spark drops the others);
- an AvailableNow stream of the whole topic (from the earliest offsets, a new
  checkpoint each run) into ``noop``, rows/s from ``start()`` to its end, and
  from ``start()`` to its first trigger (the first progress event's timestamp,
  when the trigger began) and to its first progress event (that timestamp plus
  the trigger's duration);
- the CPU each family of processes spent in each run, from /proc/<pid>/stat
  (utime + stime, read before the run, every 0.25 s during it and after it):
  the Spark JVM (its own threads); the Python workers (every process below the
  Spark JVM: pyspark.daemon, the workers it forks, the planner and
  streaming-source processes Spark starts, each counted once for what it spent
  during the run: one the JVM reaped during the run whole through the JVM's
  cutime + cstime less what its samples counted, also one that ended in the
  previous run; pyspark.daemon's workers, which leave no trace when they end, up
  to their last sample); the Kafka broker JVM; this driver process (with the
  sampling). The broker runs, idle, during our runs too: its CPU then is shown
  but not counted in our total.

``--hog N`` runs N busy-loop processes beside the timed rounds: a busy machine,
the same for both systems. Ratios are ours / Kafka: above 1 is faster for
rows/s, slower for times and CPU. CPU per row does not depend on the machine's
load; rows/s do. The machine is shared: compare ratios from one run.
Everything started here (broker, Spark) is stopped on exit, also on Ctrl-C or
a failure, and the temporary directory (store, broker data, checkpoints)
removed.
"""

from __future__ import annotations

import argparse
import base64
import glob
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from machine import CLK_TCK, Proc, proc_stat, reference  # noqa: E402

from rocketspark.session import jars_dir, local_session  # noqa: E402
from rocketspark.store import MessageStore  # noqa: E402

BODY = b"x" * 100
KEY = "k"
PARTITIONS = 4
TOPIC = "bench"
FAMILIES = ("spark_jvm", "python", "broker", "driver")
FAMILY_NAMES = {
    "spark_jvm": "Spark JVM",
    "python": "Python workers",
    "broker": "Kafka broker JVM",
    "driver": "driver (this Python)",
}


# --- the Kafka broker -------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _random_cluster_id() -> str:
    """Return a cluster id as Kafka's ``Uuid.randomUuid().toString()`` spells one."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


class KafkaBroker:
    """A single-node KRaft Kafka broker on 127.0.0.1, in a directory of its own."""

    def __init__(self, jars: str, workdir: str, heap: str = "768m"):
        self.classpath = os.path.join(jars, "*")  # exactly the fetched jars
        self.dir = workdir
        self.heap = heap
        self.port = _free_port()
        self.controller_port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = os.path.join(workdir, "broker.log")

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _java(self, main: str, *args: str) -> list[str]:
        return [
            "java",
            f"-Xms{self.heap}",
            f"-Xmx{self.heap}",
            "-Djava.awt.headless=true",
            "-cp",
            self.classpath,
            main,
            *args,
        ]

    def start(self, timeout: float = 120.0) -> None:
        props = os.path.join(self.dir, "server.properties")
        with open(props, "w", encoding="utf-8") as f:
            f.write(
                "\n".join(
                    [
                        "process.roles=broker,controller",
                        "node.id=1",
                        f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
                        f"listeners=PLAINTEXT://127.0.0.1:{self.port},"
                        f"CONTROLLER://127.0.0.1:{self.controller_port}",
                        f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                        "controller.listener.names=CONTROLLER",
                        "inter.broker.listener.name=PLAINTEXT",
                        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                        f"log.dirs={os.path.join(self.dir, 'data')}",
                        # The topic is created with the first write to it (Spark's Kafka sink).
                        f"num.partitions={PARTITIONS}",
                        "auto.create.topics.enable=true",
                        "offsets.topic.replication.factor=1",
                        "transaction.state.log.replication.factor=1",
                        "transaction.state.log.min.isr=1",
                        "share.coordinator.state.topic.replication.factor=1",
                        "share.coordinator.state.topic.min.isr=1",
                        "group.initial.rebalance.delay.ms=0",
                        "",
                    ]
                )
            )
        with open(self.log_path, "ab") as log:
            subprocess.run(
                self._java(
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    _random_cluster_id(),
                    "-c",
                    props,
                ),
                stdout=log,
                stderr=subprocess.STDOUT,
                check=True,
                timeout=timeout,
            )
            # A session of its own: a Ctrl-C reaches this process, which then stops
            # the broker in order (SIGTERM: Kafka's controlled shutdown).
            self.proc = subprocess.Popen(
                self._java("kafka.Kafka", props),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the Kafka broker exited: {self.log_tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError as e:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the Kafka broker did not listen: {self.log_tail()}") from e
                time.sleep(0.2)

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# --- CPU per process family --------------------------------------------------------


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
            if st is not None:
                children.setdefault(st.ppid, []).append(int(name))
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def tree(root: int) -> dict[int, Proc]:
    """``root`` and every process below it, by pid (``root`` absent if it is gone)."""
    out = {}
    for pid in [root, *_descendants(root)]:
        st = proc_stat(pid)
        if st is not None:
            out[pid] = st
    return out


def below_ticks(root: int, first: dict[int, Proc], latest: dict[int, Proc], gone: set[int]) -> int:
    """Clock ticks the processes below ``root`` spent between two snapshots of its tree.

    ``first``: the tree at the start; ``latest``: each process's latest sample (the
    start's and the end's included); ``gone``: the pids of ``latest`` absent at the end.
    Each process counts its total (own + reaped children's) minus its total at the start
    (0 if it started later). A process reaped during the run shows twice: under its own
    pid up to its latest sample, and whole in its parent's reaped ticks (``root``'s are
    counted, a child's are in its total); what its latest sample counted is taken off
    the parent's growth (never more than that growth: a parent that ignores SIGCHLD,
    as pyspark.daemon does, reaps nothing into its own). A process the JVM reaped
    between two runs is in neither: neither's cutime grew by it.
    """
    ticks = 0
    twice: dict[int, int] = {}
    for pid, p in latest.items():
        start = first.get(pid)
        if pid != root:
            ticks += p.total - (start.total if start is not None else 0)
        if pid in gone:
            twice[p.ppid] = twice.get(p.ppid, 0) + p.total
    for parent, counted in twice.items():
        p = latest.get(parent)
        if p is None:
            continue
        start = first.get(parent)
        grew = p.reaped - (start.reaped if start is not None else 0)
        ticks -= min(counted, grew)
    r = latest.get(root)
    if r is not None:
        start = first.get(root)
        ticks += r.reaped - (start.reaped if start is not None else 0)
    return ticks


@dataclass(frozen=True)
class Pids:
    spark_jvm: int
    broker: int


class CpuMeter:
    """The CPU-seconds each family spends while a run goes on, sampled every ``interval`` s.

    The Spark JVM's own threads; the Python workers: every process below the JVM
    (``below_ticks``: each counted once, also one reaped during the run, and only what
    it spent during the run); the broker JVM (own and reaped); this process.
    pyspark.daemon ignores SIGCHLD, so a worker it forked leaves no trace once it ends:
    sampling while the run goes on keeps all but its last ``interval``.
    """

    def __init__(self, pids: Pids, interval: float = 0.25):
        self.pids, self.interval = pids, interval
        self.latest: dict[int, Proc] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> tuple[dict[int, Proc], Proc | None, Proc | None]:
        now = tree(self.pids.spark_jvm)
        self.latest.update(now)
        return now, proc_stat(self.pids.broker), proc_stat(os.getpid())

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> CpuMeter:
        self.first, self.broker0, self.me0 = self._sample()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        self.last, self.broker1, self.me1 = self._sample()

    def seconds(self) -> dict[str, float]:
        jvm = self.pids.spark_jvm
        out = dict.fromkeys(FAMILIES, 0.0)
        if jvm in self.first and jvm in self.last:
            out["spark_jvm"] = (self.last[jvm].own - self.first[jvm].own) / CLK_TCK
        gone = set(self.latest) - set(self.last)
        out["python"] = below_ticks(jvm, self.first, self.latest, gone) / CLK_TCK
        if self.broker0 is not None and self.broker1 is not None:
            out["broker"] = (self.broker1.total - self.broker0.total) / CLK_TCK
        if self.me0 is not None and self.me1 is not None:
            out["driver"] = (self.me1.own - self.me0.own) / CLK_TCK
        return out


def _spark_jvm_pid(spark, broker_pid: int) -> int:
    """Return the pid of the Spark driver's JVM (spark-submit execs java)."""
    proc = getattr(spark.sparkContext._gateway, "proc", None)
    candidates = ([proc.pid] if proc is not None else []) + _descendants(os.getpid())
    for pid in candidates:
        if pid == broker_pid:
            continue
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8") as f:
                if f.read().strip() == "java":
                    return pid
        except OSError:
            pass
    raise RuntimeError("the Spark JVM was not found among this process's children")


# --- the measurements ----------------------------------------------------------------


@dataclass
class Run:
    rows_per_s: float
    cpu: dict[str, float]
    first_trigger_ms: float | None = None
    first_progress_ms: float | None = None


class Bench:
    def __init__(self, spark, pids: Pids, store: str, bootstrap: str, workdir: str, n: int):
        self.spark, self.pids, self.store, self.bootstrap = spark, pids, store, bootstrap
        self.workdir, self.n = workdir, n
        self.checkpoints = 0

    def _source(self, system: str, reader):
        if system == "rocketspark":
            return reader.format("rocketmq").option("store", self.store).option("topic", TOPIC)
        return (
            reader.format("kafka")
            .option("kafka.bootstrap.servers", self.bootstrap)
            .option("subscribe", TOPIC)
        )

    def _measured(self, fn: Callable[[], None]) -> tuple[float, dict[str, float]]:
        with CpuMeter(self.pids) as meter:
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
        return dt, meter.seconds()

    def batch(self, system: str) -> Run:
        return self._batch(system, narrow=False)

    def narrow(self, system: str) -> Run:
        """A batch read of the bodies only: ours told so with ``.schema("body binary")``,
        Kafka's source (which reads every column whatever the query uses) ``select("value")``."""
        return self._batch(system, narrow=True)

    def _batch(self, system: str, narrow: bool) -> Run:
        def run() -> None:
            reader = self.spark.read
            if narrow and system == "rocketspark":
                reader = reader.schema("body binary")
            df = self._source(system, reader).option("startingOffsets", "earliest")
            if system == "kafka":
                df = df.option("endingOffsets", "latest")
            rows = df.load()
            if narrow and system == "kafka":
                rows = rows.select("value")
            rows.write.format("noop").mode("overwrite").save()

        dt, cpu = self._measured(run)
        return Run(self.n / dt, cpu)

    def stream(self, system: str) -> Run:
        self.checkpoints += 1
        chk = os.path.join(self.workdir, "checkpoints", f"{system}-{self.checkpoints}")
        times: dict[str, float] = {}

        def run() -> None:
            df = self._source(system, self.spark.readStream).option("startingOffsets", "earliest")
            writer = (
                df.load()
                .writeStream.format("noop")
                .option("checkpointLocation", chk)
                .trigger(availableNow=True)
            )
            times["start"] = time.time()
            q = writer.start()
            q.awaitTermination()
            progress = q.recentProgress
            rows = sum(p.numInputRows for p in progress)
            if rows != self.n:
                raise RuntimeError(f"{system} stream read {rows} rows, expected {self.n}")
            first = progress[0]
            began = datetime.fromisoformat(first.timestamp.replace("Z", "+00:00")).timestamp()
            times["trigger"] = began
            times["progress"] = began + first.durationMs["triggerExecution"] / 1000

        dt, cpu = self._measured(run)
        shutil.rmtree(chk, ignore_errors=True)
        return Run(
            self.n / dt,
            cpu,
            (times["trigger"] - times["start"]) * 1000,
            (times["progress"] - times["start"]) * 1000,
        )


def fill_store(path: str, n: int) -> None:
    """Write n rows (key, 100-byte body) into a 4-queue topic, row i into queue i % 4."""
    with MessageStore.open(path) as s:
        s.create_topic(TOPIC, queues=PARTITIONS)
        chunk = 1 << 16
        for start in range(0, n, chunk):
            k = min(chunk, n - start)
            s.put_columns(
                [BODY] * k,
                topic=TOPIC,
                keys=[KEY] * k,
                queue_ids=[(start + i) % PARTITIONS for i in range(k)],
            )
        total = sum(s.max_offset(TOPIC, q) for q in range(PARTITIONS))
    if total != n:
        raise RuntimeError(f"the store holds {total} rows, expected {n}")


def fill_kafka(spark, bootstrap: str, n: int) -> None:
    """Write the same n rows into the Kafka topic, row i into partition i % 4, and check."""
    from pyspark.sql import functions as F

    (
        spark.range(n, numPartitions=2)
        .select(
            F.lit(KEY).alias("key"),
            F.lit(BODY).cast("binary").alias("value"),
            (F.col("id") % PARTITIONS).cast("int").alias("partition"),
        )
        .write.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", TOPIC)
        .option("kafka.linger.ms", "20")
        .option("kafka.batch.size", str(1 << 20))
        # Generous timeouts: on a loaded machine a produce request can wait long.
        .option("kafka.request.timeout.ms", "300000")
        .option("kafka.delivery.timeout.ms", "900000")
        .save()
    )
    counts = {
        r["partition"]: r["count"]
        for r in spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", TOPIC)
        .load()
        .groupBy("partition")
        .count()
        .collect()
    }
    want = {p: len(range(p, n, PARTITIONS)) for p in range(PARTITIONS)}
    if counts != want:
        raise RuntimeError(f"the Kafka topic holds {counts} rows per partition, expected {want}")


# --- the report --------------------------------------------------------------------


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def report(
    n: int, runs: list[dict[str, Run]], versions: str, machine: list[str], loads: list[float]
) -> None:
    med = statistics.median

    def m(key: str, get: Callable[[Run], float | None]) -> float:
        values = [get(r[key]) for r in runs]
        return med([v for v in values if v is not None])

    def total(key: str, system: str) -> float:
        fams = ("spark_jvm", "python", "driver") + (("broker",) if system == "kafka" else ())
        return m(key, lambda r: sum(r.cpu[f] for f in fams))

    rows: list[tuple[str, str, str, str]] = []
    for kind, label in KINDS.items():
        ours, kafka = m(f"{kind}/rocketspark", _rps), m(f"{kind}/kafka", _rps)
        rows.append((f"{label}, rows/s", f"{ours:,.0f}", f"{kafka:,.0f}", _ratio(ours, kafka)))
    for what, get in (
        ("stream: start() to its first trigger, ms", _trigger),
        ("stream: start() to its first progress event, ms", _progress),
    ):
        ours, kafka = m("stream/rocketspark", get), m("stream/kafka", get)
        rows.append((what, f"{ours:,.0f}", f"{kafka:,.0f}", _ratio(ours, kafka)))
    for kind in KINDS:
        for fam in FAMILIES:
            ours = m(f"{kind}/rocketspark", lambda r, f=fam: r.cpu[f])
            kafka = m(f"{kind}/kafka", lambda r, f=fam: r.cpu[f])
            cell = f"({ours:.2f} idle)" if fam == "broker" else f"{ours:.2f}"
            rows.append((f"CPU-s, {kind}: {FAMILY_NAMES[fam]}", cell, f"{kafka:.2f}", ""))
        ours = total(f"{kind}/rocketspark", "rocketspark")
        kafka = total(f"{kind}/kafka", "kafka")
        rows.append(
            (f"CPU-s, {kind}: all processes", f"{ours:.2f}", f"{kafka:.2f}", _ratio(ours, kafka))
        )

    print()
    print(
        f"rocketspark vs Spark's Kafka source: {n:,} rows (key {KEY!r}, 100-byte bodies) in "
        f"{PARTITIONS} queues / partitions, local[2], noop sink, one SparkSession, rounds "
        f"alternated, median of {len(runs)}"
    )
    print(f"  peer: {versions}")
    for line in machine:
        print(f"  {line}")
    print(
        f"  load average (1 min) over the timed rounds: min {min(loads):.1f}, "
        f"median {med(loads):.1f}, max {max(loads):.1f} ({os.cpu_count()} cores)"
    )
    widths = [max(len(r[i]) for r in rows + [HEADER]) for i in range(4)]
    for i, r in enumerate([HEADER, *rows]):
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
        "  ratios: ours / Kafka (rows/s: above 1 is faster; times and CPU: above 1 is more);"
        " CPU-s are per run of all the rows; the broker's CPU during our runs is not counted"
    )


KINDS = {
    "batch": "batch read -> noop",
    "narrow": "batch read of the bodies only -> noop",
    "stream": "AvailableNow stream -> noop",
}
HEADER = (
    "measurement",
    "rocketspark (embedded store)",
    "Kafka (broker + spark-sql-kafka)",
    "ratio",
)


def _rps(r: Run) -> float:
    return r.rows_per_s


def _trigger(r: Run) -> float | None:
    return r.first_trigger_ms


def _progress(r: Run) -> float | None:
    return r.first_progress_ms


# --- main ----------------------------------------------------------------------------


def _jars(arg: str | None, name: str) -> str:
    path = arg or os.path.join(jars_dir() or os.path.join(ROOT, ".jars"), name)
    if not glob.glob(os.path.join(path, "*.jar")):
        sys.exit(f"no jars in {path}: run ./dev bench-peer, which fetches them")
    return path


def _stamp(path: str) -> str:
    try:
        with open(os.path.join(path, ".artifacts"), encoding="utf-8") as f:
            return f.read().split(" (")[0].strip()
    except OSError:
        return os.path.basename(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small runs (a smoke test)")
    ap.add_argument("--rows", type=int, help="rows in each system (default 2,000,000)")
    ap.add_argument("--runs", type=int, default=5, help="timed rounds (default 5)")
    ap.add_argument(
        "--kafka-jars", help="the Kafka broker's jars (default: $ROCKETSPARK_JARS/kafka)"
    )
    ap.add_argument(
        "--spark-kafka-jars",
        help="Spark's Kafka connector (default: $ROCKETSPARK_JARS/spark-kafka)",
    )
    ap.add_argument("--broker-heap", default="768m")
    ap.add_argument(
        "--hog",
        type=int,
        default=0,
        metavar="N",
        help="N busy-loop processes beside the timed rounds (a busy machine)",
    )
    args = ap.parse_args()
    n = args.rows or (100_000 if args.quick else 2_000_000)
    runs = 2 if args.quick else args.runs
    kafka_jars = _jars(args.kafka_jars, "kafka")
    spark_kafka_jars = _jars(args.spark_kafka_jars, "spark-kafka")
    versions = f"{_stamp(kafka_jars)}; {_stamp(spark_kafka_jars)}"

    # SIGTERM as Ctrl-C: the finally blocks stop Spark and the broker, then remove the files.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    machine = [f"machine at the start: {reference()}, load average {os.getloadavg()[0]:.1f}"]
    workdir = tempfile.mkdtemp(prefix="rs-peer-")
    broker = KafkaBroker(kafka_jars, os.path.join(workdir, "kafka"), args.broker_heap)
    os.makedirs(broker.dir)
    spark = None
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        print(f"starting a Kafka broker on {broker.bootstrap} ...", flush=True)
        broker.start()
        store = os.path.join(workdir, "store")
        print(f"writing {n:,} rows into an embedded store ...", flush=True)
        fill_store(store, n)
        jars = sorted(glob.glob(os.path.join(spark_kafka_jars, "*.jar")))
        spark = local_session(
            "rocketspark-bench-peer",
            delta=False,
            conf={"spark.jars": ",".join(jars), "spark.ui.showConsoleProgress": "false"},
        )
        assert broker.proc is not None
        pids = Pids(_spark_jvm_pid(spark, broker.proc.pid), broker.proc.pid)
        print(f"writing {n:,} rows into Kafka ...", flush=True)
        fill_kafka(spark, broker.bootstrap, n)
        bench = Bench(spark, pids, store, broker.bootstrap, workdir, n)
        for _ in range(args.hog):  # a busy machine: the same for both systems
            hogs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        if hogs:
            machine.append(f"{len(hogs)} busy-loop processes ran beside the timed rounds")
        results: list[dict[str, Run]] = []
        loads: list[float] = []
        for i in range(runs + 1):  # round 0 warms up (JIT, workers, page cache)
            order = ("rocketspark", "kafka") if i % 2 else ("kafka", "rocketspark")
            got: dict[str, Run] = {}
            for kind in KINDS:
                for system in order:
                    got[f"{kind}/{system}"] = getattr(bench, kind)(system)
                    if i:
                        loads.append(os.getloadavg()[0])
            print(
                f"round {i}{' (warm-up)' if not i else ''}: "
                + ", ".join(f"{k} {r.rows_per_s:,.0f} rows/s" for k, r in got.items()),
                flush=True,
            )
            if i:
                results.append(got)
        machine.append(
            f"machine at the end:   {reference()}, load average {os.getloadavg()[0]:.1f}"
        )
    except Exception:
        print(f"the Kafka broker's log ends:\n{broker.log_tail()}", file=sys.stderr)
        raise
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        try:
            if spark is not None:
                spark.stop()
        finally:
            from rocketspark.client import close_all

            close_all()
            broker.stop()
            shutil.rmtree(workdir, ignore_errors=True)
    report(n, results, versions, machine, loads)


if __name__ == "__main__":
    main()

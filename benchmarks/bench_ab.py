"""A/B benchmark: this checkout against an older revision, in one run, alternating.

    python benchmarks/bench_ab.py --base REV [--runs 5] [--spark-runs 3] [--only NAME ...]

The machine's speed swings between runs, so a change is judged by running the
code before it and after it in turn, in the same run, and comparing medians.
``REV`` is exported (``git archive``) into a temporary directory; every figure
is measured in a fresh Python process whose ``PYTHONPATH`` starts with one of
the two trees, calling that tree's own benchmark functions (``bench_store.py``,
``bench_spark.py``), so each side runs exactly its own code. The order of the
two sides alternates from one round to the next (A B, B A, ...).

Figures (rows or messages per second; higher is better): the store's
``put_batch`` (uniform and varied bodies), single ``put``, the Arrow read
(``read_batches`` in the Spark reader's chunks), and on local[2] the Spark
source (batch read into the noop sink) and the exactly-once sink (steady
state). The last column is after / before: 1.00 is no change.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# name -> (code run in a fresh process of one tree, spark?). The code prints one JSON
# number: the figure. It uses only the functions both trees' benchmark files have.
STORE_FIGURES = {
    "put_batch of 1000": "import bench_store as b; print(b.bench_put_batch(1_000_000, 1000))",
    "put_batch of 1000, varied bodies": (
        "import bench_store as b; print(b.bench_put_batch(1_000_000, 1000, varied=True))"
    ),
    "put, one at a time": "import bench_store as b; print(b.bench_put_single(200_000))",
    "Arrow read (read_batches)": (
        "import bench_store as b; print(b.bench_pull_arrow(1_000_000, b.READ_CHUNK))"
    ),
}

# One Spark session per process; both figures from it, after a warm-up read.
SPARK_DRIVER = """
import json, shutil, statistics, tempfile
import bench_spark as b
from rocketspark.session import local_session
from rocketspark.store import Message, MessageStore
n_src, n_sink = 2_000_000, 500_000
spark = local_session("rocketspark-bench-ab", delta=False)
spark.dataSource.register(b._Ceiling)  # bench_source reads it after each of ours
path = tempfile.mkdtemp(prefix="rs-ab-src-")
try:
    with MessageStore.open(path) as s:
        s.create_topic("bench", queues=2)
        msgs = [Message("bench", b.BODY, tags="t", keys=["k"]) for _ in range(10_000)]
        for _ in range(n_src // 10_000):
            s.put_batch(msgs)
    b.bench_source(spark, path, n_src, 1)
    source, ceiling = b.bench_source(spark, path, n_src, 1)
finally:
    shutil.rmtree(path, ignore_errors=True)
steady, _ = b.bench_sink(spark, n_sink, 1, "exactly_once")
spark.stop()
print(json.dumps({
    "Spark source -> noop": source[0],
    "Spark source / Arrow ceiling, %": 100 * source[0] / ceiling[0],
    "exactly-once sink": steady[0],
}))
"""


def export(rev: str, into: Path) -> Path:
    """Write the tree of ``rev`` into ``into`` (no .git: the code only)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def run_in(tree: Path, code: str, timeout: float) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tree), str(tree / "benchmarks"), env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if out.returncode != 0:
        raise SystemExit(f"benchmark failed in {tree}:\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the revision to compare against (A)")
    ap.add_argument("--runs", type=int, default=5, help="rounds of each store figure")
    ap.add_argument("--spark-runs", type=int, default=3, help="rounds of the Spark figures")
    ap.add_argument("--no-spark", action="store_true", help="the store figures only")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rs-ab-") as tmp:
        before = export(args.base, Path(tmp))
        sides = {"before": before, "after": ROOT}
        figures: dict[str, dict[str, list[float]]] = {}

        def record(name: str, side: str, value: float) -> None:
            figures.setdefault(name, {"before": [], "after": []})[side].append(value)

        for r in range(args.runs):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for name, code in STORE_FIGURES.items():
                for side in order:
                    record(name, side, float(run_in(sides[side], code, 600)))
            print(f"store round {r + 1}/{args.runs} done", file=sys.stderr, flush=True)
        if not args.no_spark:
            for r in range(args.spark_runs):
                order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
                for side in order:
                    for name, value in json.loads(run_in(sides[side], SPARK_DRIVER, 1800)).items():
                        record(name, side, value)
                print(f"Spark round {r + 1}/{args.spark_runs} done", file=sys.stderr, flush=True)
    med = statistics.median
    print(f"A/B against {args.base}: medians, msg/s or rows/s; after / before")
    print(f"  {'figure':<36} {'before':>12} {'after':>12} {'ratio':>7}  runs (before | after)")
    for name, runs in figures.items():
        a, b = med(runs["before"]), med(runs["after"])
        each = " ".join(f"{v:,.0f}" for v in runs["before"])
        each += " | " + " ".join(f"{v:,.0f}" for v in runs["after"])
        print(f"  {name:<36} {a:>12,.0f} {b:>12,.0f} {b / a:>7.2f}  {each}")


if __name__ == "__main__":
    main()

"""Store benchmark: the figures issue 2 asks for, measured on this machine.

    ./dev bench                 # or: python benchmarks/bench_store.py [--quick]

Each figure is the median of several runs in this one process tree, 100-byte
bodies, a fresh store in a temporary directory per scenario.
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

from machine import reference  # noqa: E402  (benchmarks/ is on sys.path when run)

from rocketspark.store import Message, MessageStore

READ_CHUNK = 1 << 16  # records per read_batches call of the Spark reader (datasource.source)

BODY = b"x" * 100


def _fresh(**overrides):
    path = tempfile.mkdtemp(prefix="rs-bench-")
    store = MessageStore.open(path, **overrides)
    store.create_topic("bench", queues=4)
    return path, store


def bench_put_batch(n: int, batch: int, varied: bool = False) -> float:
    """put_batch of ``batch`` messages of BODY, or (``varied``) of bodies of 50-150
    bytes (100 on average), whose records differ in size (the general copy path)."""
    path, store = _fresh()
    msgs = [Message("bench", BODY[:50] + bytes(i % 101) if varied else BODY) for i in range(batch)]
    try:
        t0 = time.perf_counter()
        for _ in range(n // batch):
            store.put_batch(msgs)
        return (n // batch) * batch / (time.perf_counter() - t0)
    finally:
        store.close()
        shutil.rmtree(path, ignore_errors=True)


def bench_put_single(n: int) -> float:
    path, store = _fresh()
    msg = Message("bench", BODY)
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            store.put(msg)
        return n / (time.perf_counter() - t0)
    finally:
        store.close()
        shutil.rmtree(path, ignore_errors=True)


def _sync_producer(path: str, n: int, batch: int, start: mp.Event, done: mp.Queue) -> None:
    with MessageStore.open(path, flushDiskType="SYNC_FLUSH") as store:
        msgs = [Message("bench", BODY) for _ in range(batch)]
        start.wait()
        t0 = time.perf_counter()
        for _ in range(n // batch):
            if batch == 1:
                store.put(msgs[0])
            else:
                store.put_batch(msgs)
        done.put((t0, time.perf_counter()))


def bench_sync_flush(producers: int, n_each: int, batch: int = 1) -> float:
    path, store = _fresh(flushDiskType="SYNC_FLUSH")
    ctx = mp.get_context("spawn")
    start, done = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_sync_producer, args=(path, n_each, batch, start, done))
        for _ in range(producers)
    ]
    try:
        for p in procs:
            p.start()
        time.sleep(1.0)  # let every producer open the store
        start.set()
        spans = [done.get(timeout=600) for _ in procs]
        for p in procs:
            p.join()
        t0 = min(s for s, _ in spans)
        t1 = max(e for _, e in spans)
        return producers * (n_each // batch) * batch / (t1 - t0)
    finally:
        store.close()
        shutil.rmtree(path, ignore_errors=True)


def bench_pull_arrow(
    n: int, block: int | None, keyed: bool = False, varied: bool = False, check_crc: bool = True
) -> float:
    """Read a queue range into Arrow: in blocks the caller drops as it goes (as the Spark
    reader does, READ_CHUNK records a call), or with ``block`` None in one call whose
    million rows stay in memory (then fresh memory's page faults are most of the time).
    With ``keyed``, each message has a key of 1-6 characters: properties of varying
    length (six layouts, parsed by one template each). With ``varied``, bodies of
    50-150 bytes. ``check_crc`` False reads without verifying body CRCs."""
    return bench_pull_arrow_pair(n, block, keyed, varied, (check_crc,))[0]


def bench_pull_arrow_pair(
    n: int,
    block: int | None,
    keyed: bool = False,
    varied: bool = False,
    checks: tuple[bool, ...] = (True, False),
) -> list[float]:
    """bench_pull_arrow for each body CRC setting of ``checks``, runs interleaved on one
    store (so that both see the same machine)."""
    path = tempfile.mkdtemp(prefix="rs-bench-")
    try:
        with MessageStore.open(path) as store:
            store.create_topic("bench", queues=1)
            msgs = [
                Message(
                    "bench",
                    BODY[:50] + bytes(i % 101) if varied else BODY,
                    tags="t",
                    keys=[str(10 ** (i % 6) + i)[: 1 + i % 6]] if keyed else (),
                )
                for i in range(1000)
            ]
            for _ in range(n // 1000):
                store.put_batch(msgs)
            runs: dict[bool, list[float]] = {c: [] for c in checks}
            for _ in range(3):
                for check in checks:
                    t0 = time.perf_counter()
                    rows = 0
                    pos = 0
                    while pos < n:
                        batches, pos = store.read_batches(
                            "bench", 0, pos, None if block is None else pos + block, check_crc=check
                        )
                        rows += sum(b.num_rows for b in batches)
                        del batches
                    runs[check].append(rows / (time.perf_counter() - t0))
                    assert rows == n and pos == n, (rows, pos)
            return [statistics.median(runs[c]) for c in checks]
    finally:
        shutil.rmtree(path, ignore_errors=True)


def bench_long_poll(samples: int) -> tuple[float, float]:
    path, store = _fresh()
    latencies = []
    try:
        for i in range(samples):
            ready = threading.Event()
            got: dict[str, float] = {}

            def consumer(ready: threading.Event, offset: int, got: dict[str, float]) -> None:
                ready.set()
                res = store.pull("bench", 0, offset, timeout_ms=5000)
                got["t"] = time.perf_counter()
                got["n"] = len(res.messages)

            t = threading.Thread(target=consumer, args=(ready, i, got))
            t.start()
            ready.wait()
            time.sleep(0.002)  # the pull is parked by now
            t0 = time.perf_counter()
            store.put(Message("bench", BODY, queue_id=0))
            t.join()
            assert got["n"] == 1
            latencies.append((got["t"] - t0) * 1000)
        latencies.sort()
        return statistics.median(latencies), latencies[int(len(latencies) * 0.99) - 1]
    finally:
        store.close()
        shutil.rmtree(path, ignore_errors=True)


def bench_sync_floor(samples: int = 1000) -> float:
    """The p50 of one msync of a page after a 100-byte write: what a SYNC_FLUSH put waits
    for at least, whatever the store does."""
    path = tempfile.mkdtemp(prefix="rs-bench-")
    try:
        fd = os.open(os.path.join(path, "probe"), os.O_RDWR | os.O_CREAT)
        try:
            os.ftruncate(fd, samples * 100 + mmap.PAGESIZE)
            with mmap.mmap(fd, samples * 100 + mmap.PAGESIZE) as mm:
                syncs = []
                for i in range(samples):
                    mm[i * 100 : i * 100 + 100] = BODY
                    t0 = time.perf_counter()
                    mm.flush((i * 100) // mmap.PAGESIZE * mmap.PAGESIZE, mmap.PAGESIZE)
                    syncs.append(time.perf_counter() - t0)
        finally:
            os.close(fd)
        return statistics.median(syncs)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def crc_cost(n: int, runs: int, varied: bool) -> None:
    """Print what checking body CRCs (checkCRCOnRead) costs read_batches a row."""
    on, off = [], []
    for _ in range(runs):
        a, b = bench_pull_arrow_pair(n, READ_CHUNK, varied=varied)
        on.append(1e9 / a)
        off.append(1e9 / b)
    on_ns, off_ns = statistics.median(on), statistics.median(off)
    what = "bodies of 50-150 bytes" if varied else "100-byte bodies"
    print(
        f"  {'read_batches, ' + what + ': CRC check':<44} {on_ns:>8.0f} ns/row on, "
        f"{off_ns:.0f} off: +{on_ns - off_ns:.0f} ns/row, x{on_ns / off_ns:.2f}",
        flush=True,
    )


def read_figures(report: Callable[[str, str, list[float]], None], scale: int, runs: int) -> None:
    report(
        "read_batches: a queue range into Arrow",
        ">= 2,000,000",
        [bench_pull_arrow(1_000_000 // scale, READ_CHUNK) for _ in range(runs)],
    )
    report(
        "read_batches: 1M rows in one call, all kept",
        "(same target)",
        [bench_pull_arrow(1_000_000 // scale, None) for _ in range(runs)],
    )
    report(
        "read_batches: keys of 1-6 characters",
        "(same target)",
        [bench_pull_arrow(1_000_000 // scale, READ_CHUNK, keyed=True) for _ in range(runs)],
    )
    crc_cost(1_000_000 // scale, runs, varied=False)
    crc_cost(1_000_000 // scale, runs, varied=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller runs (a smoke test)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--reads", action="store_true", help="the read_batches figures only")
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    runs = 1 if args.quick else args.runs
    print(
        f"rocketspark store benchmark: {os.cpu_count()} cores, 100-byte bodies, "
        f"median of {runs} runs"
    )
    print(f"  machine at the start: {reference()}", flush=True)
    rows = []

    def report(name: str, target: str, values: list[float], unit: str = "msg/s") -> None:
        med = statistics.median(values)
        rows.append((name, med, unit, target))
        print(
            f"  {name:<44} {med:>14,.0f} {unit:<6} (target {target}; runs "
            f"{', '.join(f'{v:,.0f}' for v in values)})",
            flush=True,
        )

    if args.reads:
        read_figures(report, scale, runs)
        return
    report(
        "put_batch, ASYNC_FLUSH, batches of 1000",
        ">= 1,000,000",
        [bench_put_batch(1_000_000 // scale, 1000) for _ in range(runs)],
    )
    report(
        "put_batch of 1000, bodies of 50-150 bytes",
        "(same target)",
        [bench_put_batch(1_000_000 // scale, 1000, varied=True) for _ in range(runs)],
    )
    report(
        "put, one message at a time",
        ">= 200,000",
        [bench_put_single(200_000 // scale) for _ in range(runs)],
    )
    report(
        "put, SYNC_FLUSH, 4 producer processes",
        ">= 50,000",
        [bench_sync_flush(4, 5_000 // scale) for _ in range(runs)],
    )
    report(
        "put_batch of 100, SYNC_FLUSH, 4 processes",
        "(same target)",
        [bench_sync_flush(4, 100_000 // scale, 100) for _ in range(runs)],
    )
    read_figures(report, scale, runs)
    floor = bench_sync_floor(1000 // scale)
    print(
        f"  {'this disk: msync of one page, p50':<44} {floor * 1e6:>11,.0f} µs     "
        f"(so 4 producers of single puts reach at most {4 / floor:,.0f}/s)"
    )
    p50, p99 = bench_long_poll(200 // scale)
    print(
        f"  {'long-poll wake-up after a put':<44} p50 {p50:.3f} ms, p99 {p99:.3f} ms "
        "(target p99 < 5 ms)"
    )
    print(f"  machine at the end:   {reference()}")


if __name__ == "__main__":
    main()

"""The peer benchmark's CPU accounting (``benchmarks/bench_peer.py``): each run counts the
CPU its processes spent during it, once, also for processes reaped during it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_peer.py"
_spec = importlib.util.spec_from_file_location("bench_peer", BENCH)
assert _spec is not None and _spec.loader is not None
bench_peer = importlib.util.module_from_spec(_spec)
_path = list(sys.path)
sys.modules["bench_peer"] = bench_peer
try:
    _spec.loader.exec_module(bench_peer)
finally:
    sys.path[:] = _path  # the script puts the checkout and benchmarks/ first
Proc, below_ticks = bench_peer.Proc, bench_peer.below_ticks

JVM = 100


def _ticks(first: dict, *samples: dict) -> int:
    latest = dict(first)
    for s in samples:
        latest.update(s)
    return below_ticks(JVM, first, latest, set(latest) - set(samples[-1]))


def test_alive_all_along_counts_its_growth() -> None:
    first = {JVM: Proc(1, 500, 0), 7: Proc(JVM, 10, 0)}
    assert _ticks(first, {JVM: Proc(1, 900, 0), 7: Proc(JVM, 25, 0)}) == 15


def test_started_and_reaped_during_the_run_counts_once() -> None:
    first = {JVM: Proc(1, 500, 0)}
    mid = {JVM: Proc(1, 550, 0), 7: Proc(JVM, 40, 0)}
    end = {JVM: Proc(1, 600, 50)}  # reaped: its whole 50 in the JVM's cutime
    assert _ticks(first, mid, end) == 50


def test_ended_in_the_previous_run_and_reaped_in_this_one_counts_nothing() -> None:
    # A zombie at the start (its final ticks already counted by the previous run), reaped
    # before the first sample: its ticks arrive in the JVM's cutime and are not this run's.
    first = {JVM: Proc(1, 500, 0), 7: Proc(JVM, 100, 0)}
    end = {JVM: Proc(1, 600, 100)}
    assert _ticks(first, end) == 0


def test_alive_at_the_start_and_reaped_during_counts_what_it_spent_in_the_run() -> None:
    first = {JVM: Proc(1, 500, 0), 7: Proc(JVM, 30, 0)}
    mid = {JVM: Proc(1, 550, 0), 7: Proc(JVM, 70, 0)}
    end = {JVM: Proc(1, 600, 75)}  # 5 ticks after its last sample
    assert _ticks(first, mid, end) == 45


def test_a_parent_that_reaps_nothing_keeps_its_children_s_samples() -> None:
    # pyspark.daemon (pid 8) ignores SIGCHLD: a worker's ticks end with its last sample.
    first = {JVM: Proc(1, 500, 0), 8: Proc(JVM, 20, 0)}
    mid = {JVM: Proc(1, 550, 0), 8: Proc(JVM, 22, 0), 9: Proc(8, 30, 0)}
    end = {JVM: Proc(1, 600, 0), 8: Proc(JVM, 23, 0)}
    assert _ticks(first, mid, end) == 3 + 30


def _burn(seconds: float) -> subprocess.Popen[bytes]:
    code = f"import time\nt = time.process_time() + {seconds}\nwhile time.process_time() < t: pass"
    return subprocess.Popen([sys.executable, "-c", code])


def _reap(child: subprocess.Popen[bytes]) -> float:
    """Reap ``child`` (wait4) and return the CPU-seconds it used."""
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


def test_real_processes_reaped_late_are_counted_in_their_run_only() -> None:
    """Run in a fresh interpreter: under the suite, this process has other children (the
    shared Spark JVM, brokers) whose CPU the meter would rightly count as its tree's."""
    done = subprocess.run(
        [sys.executable, __file__], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _real_processes_reaped_late_are_counted_in_their_run_only() -> None:
    """This process as the JVM: a child that burns CPU during one run, ends after it,
    and is reaped during the next run (before its first sample) counts in the first."""
    pids = bench_peer.Pids(os.getpid(), os.getpid())
    tick = 1 / bench_peer.CLK_TCK
    child = _burn(0.3)
    with bench_peer.CpuMeter(pids, interval=0.05) as run1:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # a zombie: ended, not reaped
            with open(f"/proc/{child.pid}/stat", "rb") as f:
                if f.read().split(b") ")[1][:1] == b"Z":
                    break
            time.sleep(0.01)
    with bench_peer.CpuMeter(pids, interval=10) as run2:
        used = _reap(child)  # reaped now: its ticks land in this process's cutime
    assert abs(run1.seconds()["python"] - used) <= 3 * tick, (run1.seconds(), used)
    assert run2.seconds()["python"] == 0, run2.seconds()
    # Started and reaped within one run: once, in that run.
    with bench_peer.CpuMeter(pids, interval=0.05) as run3:
        used = _reap(_burn(0.2))
    assert abs(run3.seconds()["python"] - used) <= 3 * tick, (run3.seconds(), used)


if __name__ == "__main__":
    _real_processes_reaped_late_are_counted_in_their_run_only()

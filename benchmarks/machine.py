"""How fast this machine is at the moment, printed beside the benchmark figures.

The development machine is a shared VM whose speed swings by 2x within hours
(other jobs on the host; memory handed back to the host and faulted in again).
Two reference figures, taken at a benchmark's start and end, tell a reader
which state a run met: a pure-Python loop (CPU) and writing new page cache.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import dataclass

CLK_TCK = os.sysconf("SC_CLK_TCK")


def python_loop_ms() -> float:
    """Median time of ``sum(range(10**6))``, ms (~8-10 ms on an unloaded ~3 GHz core)."""
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        sum(range(10**6))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def new_page_cache_mb_s(size_mb: int = 256) -> float:
    """MB/s of pwrite(2) of zeros into a fresh file: the cost of memory the store newly uses."""
    zeros = bytes(1 << 20)
    fd, path = tempfile.mkstemp(prefix="rs-machine-")
    try:
        t0 = time.perf_counter()
        for i in range(size_mb):
            os.pwrite(fd, zeros, i << 20)
        return size_mb / (time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)


def reference() -> str:
    return (
        f"sum(range(10**6)) takes {python_loop_ms():.1f} ms, new page cache "
        f"{new_page_cache_mb_s():,.0f} MB/s"
    )


@dataclass(frozen=True)
class Proc:
    """One process as /proc/<pid>/stat shows it: parent, own clock ticks (utime + stime)
    and the ticks of the children it reaped (cutime + cstime)."""

    ppid: int
    own: int
    reaped: int

    @property
    def total(self) -> int:
        return self.own + self.reaped


def proc_stat(pid: int) -> Proc | None:
    """Return a process's ``Proc``, None if it is gone (a zombie still has one)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()  # from field 3 (state) on
    return Proc(
        int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
    )

"""Other processes busy on this process's cores: the cause of the spread between processes (issue 43).

Measured 2026-12-06 on an idle 2-core Intel Xeon (docs/TIMING.md; vanilla on 12 demo captions x 64
tokens, `lvspec-eval bench --methods vanilla --solo`): 2 threads alone 223 tokens/s; beside one
single-threaded busy loop 41 tokens/s (5.4x slower: torch's OpenMP threads wait for each other at
every parallel region, and one of them shares its core with the neighbour); 1 thread beside the same
busy loop 169 tokens/s (174 alone). OMP_WAIT_POLICY=PASSIVE rescues the busy case (154) and costs
2.9x on the idle machine (77), so it is no default. A timing taken while our threads and other work
oversubscribe our cores says more about the neighbours than about the method: `check` measures how
busy our cores are now and warns where they and our threads oversubscribe them.

Which cores are ours (issue 52, item 5): the CPUs this process may run on (`os.sched_getaffinity`:
taskset, a cgroup cpuset), capped by the cgroup's CPU quota (cgroup v2 `cpu.max`, v1
`cpu.cfs_quota_us`; every container and cluster job may have one): 1.5 cores of quota on 4 CPUs
is 1.5 cores. Not `os.cpu_count()`, the machine's.

How busy they are: per-CPU busy time from /proc/stat over WINDOW_S, summed over our CPUs, less this
process's own CPU time in that window. Chosen over counting runnable threads (/proc/<pid>/task/*/stat
state R and the CPU each last ran on) because it is one file read per sample where the thread scan
reads a file per thread of the machine, and because it is correct where the scan is not: inside a
container /proc lists only the container's processes, while /proc/stat counts every process on those
cores, and a thread's last CPU says little about where a runnable thread will run next. What it
cannot tell: two busy threads on one core read as one busy core; that core is taken either way,
which is what the decision needs. The host-wide /proc/loadavg counts other cores' work: it is
recorded (load_average_1m) but decides nothing.
"""
from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

from . import host

WINDOW_S = 0.25  # per-CPU busy time is read this far apart (at 100 ticks/s: 25 ticks per CPU)
SLACK = 0.25  # cores' worth of background work (interrupts, daemons) that oversubscribes nothing


def usable_cores(root: Path | None = None) -> tuple[float, int, float | None]:
    """(the cores this process may use: its CPUs, capped by its cgroup's quota; the CPUs; the quota)."""
    cpus = len(host.allowed_cpus())
    quota = host.cpu_quota(root)
    return (min(cpus, quota) if quota else cpus), cpus, quota


def busy_cores(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]], cpus: set[int]) -> float | None:
    """Cores' worth of busy time on `cpus` between two host.cpu_ticks snapshots (None: none of them
    is in both)."""
    shares = []
    for cpu in cpus & set(before) & set(after):
        busy, total = (a - b for a, b in zip(after[cpu], before[cpu]))
        if total > 0:
            shares.append(busy / total)
    return sum(shares) if shares else None


def others_busy(window_s: float = WINDOW_S, root: Path | None = None) -> float | None:
    """Cores' worth of other work on the CPUs this process may use, over `window_s` now (our own
    threads' CPU time left out); None where /proc/stat cannot be read."""
    cpus = host.allowed_cpus()
    before, own, start = host.cpu_ticks(root), time.process_time(), time.perf_counter()
    time.sleep(window_s)
    after, own, elapsed = host.cpu_ticks(root), time.process_time() - own, time.perf_counter() - start
    busy = busy_cores(before, after, cpus)
    return None if busy is None else round(max(0.0, busy - own / elapsed), 2)


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def check(threads: int, cores: float | None = None, others: float | None = None, root: Path | None = None) -> dict:
    """How busy this process's cores are as a timing starts; warns where the other work on them and
    our `threads` oversubscribe them (beyond SLACK). Returns what it saw (for a run's environment
    record). cores, others: given instead of read (tests); root: a fake / for the readers."""
    usable, cpus, quota = usable_cores(root)
    cores = cores or usable
    others = others_busy(root=root) if others is None else others
    seen = {"others_busy": others, "cores": cores, "cpus": cpus, "cpu_quota": quota, "threads": threads,
            "load_average_1m": _load_average(), "oversubscribed": (others or 0) + threads > cores + SLACK}
    if seen["oversubscribed"]:
        free = max(1, int(cores - (others or 0)))
        seen["warning"] = (f"{others or 0:g} cores' worth of other work on the {cores:g} cores this process may use "
                           f"({cpus} CPUs{f', a quota of {quota:g}' if quota else ''}) beside this run's {threads} "
                           f"threads: torch's threads will wait for each other and the timings measure the neighbours "
                           f"(measured: 5.4x slower at 2 threads on 2 cores beside one busy loop). Time on a quiet "
                           f"machine, or with threads={free} (docs/TIMING.md)")
        warnings.warn(seen["warning"], RuntimeWarning, stacklevel=2)
    return seen

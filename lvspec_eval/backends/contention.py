"""Other processes busy on this machine's cores: the cause of the spread between processes (issue 43).

Measured 2026-12-06 on an idle 2-core Intel Xeon (docs/TIMING.md; vanilla on 12 demo captions x 64
tokens, `lvspec-eval bench --methods vanilla --solo`): 2 threads alone 223 tokens/s; beside one
single-threaded busy loop 41 tokens/s (5.4x slower: torch's OpenMP threads wait for each other at
every parallel region, and one of them shares its core with the neighbour); 1 thread beside the same
busy loop 169 tokens/s (174 alone). OMP_WAIT_POLICY=PASSIVE rescues the busy case (154) and costs
2.9x on the idle machine (77), so it is no default. A timing taken while more runnable threads than
cores compete says more about the neighbours than about the method: `check` samples how many other
processes are runnable now and warns where they and our threads oversubscribe the cores.
"""
from __future__ import annotations

import os
import statistics
import time
import warnings
from pathlib import Path

SAMPLES = 5  # reads of /proc/loadavg, SPACING_S apart: a runnable count is a moment's
SPACING_S = 0.05


def runnable_others(samples: int = SAMPLES) -> float | None:
    """The median number of other runnable threads on the machine now (Linux: /proc/loadavg's
    running count, less the reading thread itself); None where the count cannot be read."""
    counts = []
    for k in range(samples):
        try:
            running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return None
        counts.append(max(0, running - 1))
        if k + 1 < samples:
            time.sleep(SPACING_S)
    return statistics.median(counts)


def check(threads: int, cores: int | None = None, others: float | None = None) -> dict:
    """How busy the machine is as a timing starts; warns where the other runnable threads and our
    `threads` oversubscribe the cores. Returns what it saw (for a run's environment record)."""
    cores = cores or os.cpu_count() or 1
    others = runnable_others() if others is None else others
    try:
        load = round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        load = None
    seen = {"runnable_others": others, "load_average_1m": load, "cores": cores, "threads": threads,
            "oversubscribed": others is not None and others + threads > cores}
    if seen["oversubscribed"]:
        free = max(1, int(cores - others))
        seen["warning"] = (f"{others:g} other runnable threads on {cores} cores beside this run's {threads}: torch's "
                      f"threads will wait for each other and the timings measure the neighbours (measured: 5.4x "
                      f"slower at 2 threads on 2 cores beside one busy loop). Time on a quiet machine, or with "
                      f"threads={free} (docs/TIMING.md)")
        warnings.warn(seen["warning"], RuntimeWarning, stacklevel=2)
    return seen

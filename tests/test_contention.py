"""backends/contention.py: a timing that starts while other work and our threads oversubscribe the
cores this process may use (its affinity, its cgroup's CPU quota) is flagged (the cause of the spread
between processes, docs/TIMING.md). The readers (backends/host.py) are tested on fake /proc and
cgroup trees, the affinity with a real `sched_setaffinity`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from lvspec_eval.backends import contention, host


def test_oversubscribed_cores_warn_and_name_a_thread_count_that_fits():
    with pytest.warns(RuntimeWarning, match="threads=1"):
        seen = contention.check(threads=2, cores=2, others=1)
    assert seen["oversubscribed"] and seen["others_busy"] == 1 and "5.4x" in seen["warning"]


@pytest.mark.parametrize("threads,others", [(2, 0), (1, 1), (4, 4), (2, 0.2)])
def test_cores_enough_for_everyone_say_nothing(threads, others):
    cores = 8 if threads == 4 else 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seen = contention.check(threads=threads, cores=cores, others=others)
    assert not seen["oversubscribed"] and "warning" not in seen


def fake_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize("files,quota", [
    ({"proc/self/cgroup": "0::/job/step\n", "sys/fs/cgroup/job/step/cpu.max": "150000 100000\n"}, 1.5),
    ({"proc/self/cgroup": "0::/job/step\n", "sys/fs/cgroup/job/step/cpu.max": "max 100000\n",
      "sys/fs/cgroup/job/cpu.max": "100000 100000\n"}, 1.0),  # the parent's quota binds the child
    ({"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/cpu.max": "max 100000\n"}, None),
    ({"proc/self/cgroup": "12:pids:/docker/abc\n4:cpu,cpuacct:/docker/abc\n",
      "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "200000\n",
      "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"}, 2.0),
    ({"proc/self/cgroup": "4:cpu,cpuacct:/docker/abc\n",  # a container sees its own cgroup at the mount
      "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "50000\n", "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
     0.5),
    ({"proc/self/cgroup": "4:cpu:/x\n", "sys/fs/cgroup/cpu/x/cpu.cfs_quota_us": "-1\n",
      "sys/fs/cgroup/cpu/x/cpu.cfs_period_us": "100000\n"}, None),
    ({}, None),
])
def test_the_cgroup_cpu_quota_is_read_from_v2_and_v1_files(files, quota, tmp_path):
    assert host.cpu_quota(fake_tree(tmp_path, files)) == quota


def test_a_quota_below_our_threads_is_oversubscribed_even_on_idle_cores(tmp_path):
    root = fake_tree(tmp_path, {"proc/self/cgroup": "0::/job\n", "sys/fs/cgroup/job/cpu.max": "100000 100000\n"})
    with pytest.warns(RuntimeWarning, match="a quota of 1"):
        seen = contention.check(threads=2, others=0, root=root)
    assert seen["cores"] == 1 and seen["cpu_quota"] == 1 and seen["oversubscribed"]


def test_busy_time_counts_only_our_cpus(tmp_path):
    stat = "cpu  1 2 3 4 5 6 7 8 0 0\ncpu0 {}\ncpu1 {}\nintr 5\n"
    idle = "100 0 0 900 0 0 0 0 0 0"  # user nice system idle iowait irq softirq steal guest guest_nice
    before = host.cpu_ticks(fake_tree(tmp_path / "a", {"proc/stat": stat.format(idle, idle)}))
    after = host.cpu_ticks(fake_tree(tmp_path / "b", {"proc/stat": stat.format(
        "190 0 5 900 0 0 0 5 50 0",  # cpu0 fully busy (guest time is inside user), steal counts as busy
        "110 0 0 980 10 0 0 0 0 0")}))  # cpu1 10 % busy, its iowait idle
    assert before[0] == (100, 1000) and after[0] == (200, 1100)
    assert contention.busy_cores(before, after, {0}) == pytest.approx(1.0)
    assert contention.busy_cores(before, after, {1}) == pytest.approx(0.1)
    assert contention.busy_cores(before, after, {0, 1}) == pytest.approx(1.1)
    assert contention.busy_cores(before, after, {7}) is None  # not in /proc/stat: unknown
    assert host.cpu_ticks(tmp_path / "none") == {}


def test_without_proc_stat_nothing_is_claimed(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seen = contention.check(threads=1, root=tmp_path)
    assert seen["others_busy"] is None and not seen["oversubscribed"]


PINNED = """
import json, os, sys
from lvspec_eval.backends import contention
os.sched_setaffinity(0, {int(sys.argv[1])})
seen = contention.check(threads=int(sys.argv[2]))
print(json.dumps({k: seen[k] for k in ("cores", "cpus", "others_busy", "oversubscribed")}))
"""
SPIN = "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])}); [None for _ in iter(int, 1)]"


def pinned_check(cpu: int, threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent.parent),
                                                                      os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", PINNED, str(cpu), str(threads)], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_a_process_pinned_to_one_cpu_counts_one_core():
    """Under taskset (here sched_setaffinity) the cores are the CPUs the process may use, not the machine's."""
    cpu = min(os.sched_getaffinity(0))
    seen = pinned_check(cpu, threads=2)
    assert seen["cpus"] == 1 and seen["cores"] == 1 and seen["oversubscribed"]  # 2 threads on 1 core


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_a_busy_loop_on_our_cpu_is_counted():
    cpu = min(os.sched_getaffinity(0))
    with subprocess.Popen([sys.executable, "-c", SPIN, str(cpu)]) as spin:
        try:
            seen = pinned_check(cpu, threads=1)
        finally:
            spin.kill()
    assert seen["others_busy"] >= 0.7 and seen["oversubscribed"]


def test_bench_records_what_it_saw_as_timing_started(tmp_path):
    from lvspec_eval import cli
    from lvspec_eval.measure import bench

    args = cli.build_parser().parse_args(["bench", "--methods", "vanilla", "--limit", "1", "--max-new-tokens", "4",
                                          "--threads", "1", "--cpu-kernels", "torch", "--device", "cpu"])
    result = bench.run(args)
    seen = result["env"]["at_start"]
    assert seen["threads"] == 1 and "others_busy" in seen and "oversubscribed" in seen and seen["cores"] >= 1

"""What this process runs on, read from Linux's /proc and cgroup files: the CPU, a process's identity,
the cores this process may use and how busy they are. The one place that parses these files.

Every reader takes `root` (None: ROOT, the real "/"), so tests hand them a fake tree. Where a file
is missing (another OS, a sandbox) a reader says it does not know (None, or an empty result),
never guesses.
"""
from __future__ import annotations

import hashlib
import os
import platform
import socket
from pathlib import Path

ROOT = Path("/")
CGROUP = Path("sys/fs/cgroup")  # where cgroup v2 (and v1's per-controller folders) are mounted
V1_CPU_FOLDERS = ("cpu,cpuacct", "cpu", "cpuacct,cpu")  # v1 mounts the cpu controller under one of these


def _read(relative: str, root: Path | None) -> str | None:
    try:
        return ((root or ROOT) / relative).read_text()
    except (OSError, UnicodeDecodeError):
        return None


# ---- the CPU -------------------------------------------------------------------------------------
def cpuinfo(root: Path | None = None) -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (its first block, up to the first blank line);
    empty where there is none."""
    out: dict[str, str] = {}
    for line in (_read("proc/cpuinfo", root) or "").split("\n"):
        if not line.strip():
            if out:
                break
            continue
        key, _, value = line.partition(":")
        out.setdefault(key.strip(), value.strip())
    return out


def cpu_identity(root: Path | None = None) -> tuple[str, str | None]:
    """(the CPU's model name, a short digest of its feature flags: `flags` on x86, `Features` on Arm;
    None where /proc/cpuinfo gives none)."""
    info = cpuinfo(root)
    flags = info.get("flags") or info.get("Features")
    model = info.get("model name") or platform.processor() or platform.machine()
    return model, hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:12] if flags else None


# ---- a process's identity ------------------------------------------------------------------------
def boot_id(root: Path | None = None) -> str | None:
    raw = _read("proc/sys/kernel/random/boot_id", root)
    return raw.strip() if raw else None


def start_ticks(pid: int, root: Path | None = None) -> int | None:
    """Field 22 of /proc/<pid>/stat: when the process started, in clock ticks since boot (None: no such
    process, or no /proc). The command name (field 2) may hold spaces and parentheses: the fields
    after it are counted from its last ')'."""
    raw = _read(f"proc/{int(pid)}/stat", root)
    try:
        return int(raw[raw.rindex(")") + 2:].split()[19])
    except (TypeError, ValueError, IndexError):
        return None


def process_identity(pid: int | None = None, root: Path | None = None) -> dict:
    """What tells a process apart from a later one with the same PID: host name, boot id and start
    time (this process by default)."""
    pid = os.getpid() if pid is None else int(pid)
    return {"pid": pid, "host": socket.gethostname(), "boot": boot_id(root), "start": start_ticks(pid, root)}


def is_running(identity: dict, root: Path | None = None) -> bool:
    """Whether the process `identity` (process_identity's dict, as recorded) runs now: same host, same
    boot, and its PID held by a process that started at the recorded time. Without /proc (no start
    time to compare) only the same host and a live PID count."""
    try:
        pid = int(identity["pid"])
    except (KeyError, TypeError, ValueError):
        return False
    now = process_identity(pid, root)
    if identity.get("host") != now["host"] or identity.get("boot") != now["boot"]:
        return False
    if now["start"] is not None or start_ticks(os.getpid(), root) is not None:  # /proc is there: it decides
        return now["start"] is not None and identity.get("start") == now["start"]
    return identity.get("start") is None and _pid_alive(pid)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


# ---- the cores this process may use --------------------------------------------------------------
def allowed_cpus() -> set[int]:
    """The CPUs this process may run on (its affinity: taskset, a cgroup cpuset); all of them where
    the OS cannot say."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def _cgroup_paths(root: Path | None) -> tuple[str | None, str | None]:
    """(this process's cgroup v2 path, its v1 cpu controller's path) from /proc/self/cgroup."""
    v2 = v1 = None
    for line in (_read("proc/self/cgroup", root) or "").splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _ancestors(mount: Path, path: str) -> list[Path]:
    """The cgroup's folder and each parent's up to the mount (a parent's quota binds its children too;
    inside a container the path may name folders the container cannot see: those are skipped)."""
    parts = [p for p in path.split("/") if p]
    return [mount.joinpath(*parts[:k]) for k in range(len(parts), -1, -1)]


def _v2_quota(folder: Path) -> float | None:
    try:
        quota, period = folder.joinpath("cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _v1_quota(folder: Path) -> float | None:
    try:
        quota = int(folder.joinpath("cpu.cfs_quota_us").read_text())
        period = int(folder.joinpath("cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def cpu_quota(root: Path | None = None) -> float | None:
    """How many cores' worth of CPU time this process's cgroup may use (cgroup v2 `cpu.max`, v1
    `cpu.cfs_quota_us` / `cpu.cfs_period_us`; the smallest along its ancestors), None where no quota
    is set or none can be read."""
    mount = (root or ROOT) / CGROUP
    v2, v1 = _cgroup_paths(root)
    found = []
    if v2 is not None:
        found += [_v2_quota(folder) for folder in _ancestors(mount, v2)]
    if v1 is not None:
        found += [_v1_quota(folder) for name in V1_CPU_FOLDERS for folder in _ancestors(mount / name, v1)]
    found = [q for q in found if q is not None]
    return min(found) if found else None


def cpu_ticks(root: Path | None = None) -> dict[int, tuple[int, int]]:
    """Per CPU, (busy ticks, all ticks) since boot from /proc/stat. Busy: all but idle and iowait
    (steal counts as busy: the hypervisor's other guests held the core); guest time is left out of
    the sum, since user and nice already hold it."""
    out = {}
    for line in (_read("proc/stat", root) or "").splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        try:
            ticks = [int(f) for f in fields[:8]]
            out[int(name[3:])] = (sum(ticks) - ticks[3] - ticks[4], sum(ticks))
        except (ValueError, IndexError):
            continue
    return out

"""The per-sample decode statistics JSONL (model_arg `stats_path`), one line per request.

Several ranks of a data-parallel run append to the same file, and a run may be killed at any
moment (then resumed with lmms-eval's --use_cache, models/resume.py), so every line is written
when its sample completes, as one os.write of the whole line under an exclusive lock, then fsync'd:
a reader never sees two records interleaved, and a crash loses at most the line being written,
which `StatsWriter` cuts off (a torn tail) before appending again. Keys are those of
`decoding/stats.py` plus task, doc_id, rank, error, text and token_texts (report.py reads them),
settings (what produced the record, models/resume.py), and from the runner the per-token lists
kinds, relevance and replaced (with replaced_texts: the draft token each of the target's
step-closing tokens overruled). Failure records carry device_error (true when the device failed
rather than the sample's input).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
from pathlib import Path

from loguru import logger

from .. import jsonl


class StatsWriter:
    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        try:  # fail at start, not after the first sample, if the file cannot be written
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()
        except OSError as err:
            raise ValueError(f"stats_path={str(path)!r} cannot be written: {err}") from err
        with self.locked() as fd:
            cut_torn_tail(fd, self.path)

    @contextlib.contextmanager
    def locked(self):
        """The file open for appending (a raw descriptor), under the exclusive lock every rank takes."""
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # closing releases the lock

    def write(self, record: dict) -> None:
        data = (json.dumps(_finite(record), ensure_ascii=False) + "\n").encode("utf-8")
        with self.locked() as fd:
            written = 0
            while written < len(data):  # one call in practice; a short write is continued, not lost
                written += os.write(fd, data[written:])
            os.fsync(fd)


def read_lines(path: str | Path) -> list[str]:
    """The complete lines of a stats file, read under a shared lock (the writers' exclusive lock
    excludes it, so a record another rank is appending is never half read), by the package's reader
    (lvspec_eval/jsonl.py: split on "\n" only, each line decoded alone; a last line without its newline,
    a killed writer's not yet cut by StatsWriter, is no record: left out, with a warning)."""
    with open(path, "rb") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_SH)
        data = f.read()  # closing the file releases the lock
    return jsonl.complete_lines(data, path, logger.warning)


def cut_torn_tail(fd: int, path: Path) -> None:
    """Truncate a last line without its newline: what a process killed while writing leaves. It is no
    record (that sample never completed), and a line appended after it would be glued to it."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    keep, end = 0, size
    while end > 0:  # back to the last newline, a chunk at a time
        start = max(0, end - (1 << 20))
        newline = os.pread(fd, end - start, start).rfind(b"\n")
        if newline >= 0:
            keep = start + newline + 1
            break
        end = start
    logger.warning(f"lvspec: {path} ended with a torn line ({size - keep} bytes, a killed writer's): cut off")
    os.ftruncate(fd, keep)
    os.fsync(fd)


def _finite(value):
    """NaN/inf -> None, so every line is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def success_record(stats: dict, *, task: str, doc_id, rank: int, text: str, token_texts: list[str],
                   extra: dict | None = None) -> dict:
    """Runner's Generation.stats plus where the sample came from and what it said."""
    return {**stats, **(extra or {}), "task": task, "doc_id": doc_id, "rank": rank, "error": None,
            "text": text, "token_texts": token_texts}


def failure_record(reason: str, *, method: str, task: str, doc_id, rank: int, device_error: bool = False,
                   extra: dict | None = None) -> dict:
    """A failed sample: no timings (report.py leaves it out of speed), the reason in `error`;
    device_error: the device failed (CUDA error, out of memory), not the sample's input."""
    return {"method": method, **(extra or {}), "task": task, "doc_id": doc_id, "rank": rank, "error": reason,
            "text": "", "tokens": [], "token_texts": [], "num_new_tokens": 0, "device_error": device_error}

"""The per-sample decode statistics JSONL (model_arg `stats_path`), one line per request.

Several ranks of a data-parallel run append to the same file, so every line is written in one
call under an exclusive lock; a reader never sees two records interleaved. Keys are those of
`decoding/stats.py` plus task, doc_id, rank, error, text and token_texts (report.py reads them), and
from the runner the per-token lists kinds, relevance and replaced (with replaced_texts: the draft
token each of the target's step-closing tokens overruled). Failure records carry device_error (true
when the device failed rather than the sample's input).
"""
from __future__ import annotations

import fcntl
import json
import math
from pathlib import Path


class StatsWriter:
    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        try:  # fail at start, not after the first sample, if the file cannot be written
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()
        except OSError as err:
            raise ValueError(f"stats_path={str(path)!r} cannot be written: {err}") from err

    def write(self, record: dict) -> None:
        line = json.dumps(_finite(record), ensure_ascii=False) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                f.write(line)
                f.flush()
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


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


def failure_record(reason: str, *, method: str, task: str, doc_id, rank: int, device_error: bool = False) -> dict:
    """A failed sample: no timings (report.py leaves it out of speed), the reason in `error`;
    device_error: the device failed (CUDA error, out of memory), not the sample's input."""
    return {"method": method, "task": task, "doc_id": doc_id, "rank": rank, "error": reason, "text": "",
            "tokens": [], "token_texts": [], "num_new_tokens": 0, "device_error": device_error}

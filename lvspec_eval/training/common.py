"""What the trainers share: their JSON-lines logs and their resumable state, saved so that a run
killed while saving leaves the previous state whole."""
from __future__ import annotations

import json
from pathlib import Path

import torch


def log_jsonl(path: Path, record: dict) -> None:
    """Append one record to a JSON-lines log."""
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def save_atomic(state: dict, path: Path) -> None:
    """torch.save to a temporary file beside `path`, then rename it over `path` (an atomic replace):
    a reader, or a resume after a kill, sees the old state or the new one, never half of one."""
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)

"""Resuming a killed run from its stats file (lmms-eval's --use_cache with model_arg stats_path).

lmms-eval 0.7.3's ResponseCache cannot resume a run that died: it stores a task's answers only
after the model has answered every request of that type (`ResponseCache.execute` calls
`generate_until` once with all cache misses), keeps them under a fresh run id per process
(uuid4 unless LMMS_CACHE_RUN_ID, SLURM_JOB_ID or TORCHELASTIC_RUN_ID is set), and a rerun reads only
the root cache.db, written when a run ends well. What does survive is our stats file: one complete,
fsync'd line per finished sample, with its answer text. So a rerun with --use_cache and the same
stats_path serves a sample that already has a record from that record (its text; no decode, no
second record) and decodes only the others; the file then holds each sample once, the report and
`check` read the union. Samples that lmms-eval's own cache serves (a finished earlier run, same
model_args, so the same stats_path) never reach the model; their records are in the file already.

A record is reused only if it was made under the same settings (`run_settings`: method, drafter,
verifier, tree and every decoding option, dtype, frames, the checkpoints and their weights' finger-
prints) and the same request (`request_key`); anything else is an error naming what differs, never
a silent reuse. A failed sample's record (error set) is served like any other: its empty answer again,
its error record kept. The failures that reach a record are the input's (missing or corrupt video, a
doc_to_visual that raises, a prompt over the context: the same input fails the same way) or, with
on_device_error=skip, the device's (e.g. out of memory on a sample too large for the device), so a
resume does not retry them; to retry, delete their lines (error not null) from the stats file. The
one exception is the sample a device failure stopped the run on (on_device_error=abort, the record's
stopped_run): the rerun decodes it again, and its new record, later in the file, is the one the
report reads (report.py keeps a sample's later record).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

from loguru import logger

from ..backends.loading import DEMO_NAMES
from .args import ModelArgs
from .stats_writer import read_lines

# model_args that do not change what a sample decodes (where records go, what a device error does)
NOT_SETTINGS = ("stats_path", "on_device_error", "batch_size", "max_batch_size")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
MAX_SHOWN = 8  # differing settings named in the error, these first:
FIRST_SHOWN = ("method", "drafter", "verifier", "pretrained", "draft", "weights.pretrained", "weights.draft", "dtype")
EDGE_BYTES = 1 << 16  # of each weight file's head and tail: a retrained checkpoint changes its tensors


class ResumeMismatch(ValueError):
    """A record in stats_path was made under other settings or for another request."""


def run_settings(args: ModelArgs, options) -> dict:
    """What a record's answer depends on, flat (so a mismatch names its key): the model_args (defaults
    filled), the decoding options with their defaults (`options`: the runner's DecodeOptions, as
    options.NAME) and a fingerprint of each checkpoint's weights (weights.pretrained, weights.draft)."""
    settings = {k: v for k, v in asdict(args).items() if k not in NOT_SETTINGS and k != "options"}
    decode = asdict(options)
    settings.update({f"options.{k}": v for k, v in {**decode.pop("extra"), **decode}.items()})
    settings.update({f"weights.{name}": checkpoint_fingerprint(getattr(args, name)) for name in ("pretrained", "draft")})
    return json.loads(json.dumps(settings, sort_keys=True, default=str))  # as it reads back from the file


def checkpoint_fingerprint(name: str | None) -> str | None:
    """A local folder's weight files by name, size and first and last bytes (cheap on a 70B checkpoint,
    and a checkpoint retrained in place changes them); a hub id as given (its revision is in the cache)."""
    folder = DEMO_NAMES.get(name, Path(name).expanduser()) if name else None
    if folder is None or not Path(folder).is_dir():
        return name
    digest = hashlib.sha256()
    for path in sorted(Path(folder).rglob("*")):
        if path.suffix in WEIGHT_SUFFIXES or path.name == "config.json":
            size = path.stat().st_size
            digest.update(f"{path.relative_to(folder)}:{size}:".encode())
            with open(path, "rb") as f:
                digest.update(f.read(EDGE_BYTES))
                f.seek(max(0, size - EDGE_BYTES))
                digest.update(f.read(EDGE_BYTES))
    return digest.hexdigest()[:16]


def request_key(context: str, gen_kwargs: dict | None) -> str:
    """The request as lmms-eval's ResponseCache tells requests apart: its text context and the
    generation kwargs that change the output (the same canonical form)."""
    from lmms_eval.caching.response_cache import canonicalize_gen_kwargs

    raw = f"{context}\0{canonicalize_gen_kwargs(gen_kwargs)}"
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:16]


class Resume:
    """The completed samples of stats_path, by (task, doc_id), checked against this run's settings."""

    def __init__(self, path: Path, settings: dict):
        self.path = path
        self.records: dict[tuple[str, str], dict] = {}
        for number, record in read_records(path):
            check_settings(record, settings, f"{path}:{number}")
            key = (str(record.get("task")), str(record.get("doc_id")))
            if record.get("stopped_run"):  # the device failure that stopped the run: decoded again
                self.records.pop(key, None)
            else:
                self.records[key] = record
        if self.records:
            logger.info(f"lvspec: resuming from {path}: its {len(self.records)} completed samples are served from it")

    def lookup(self, task: str, doc_id, request: str) -> dict | None:
        """The record of this sample, if it completed; ResumeMismatch if it answered another request."""
        record = self.records.get((str(task), str(doc_id)))
        if record is not None and record.get("request") != request:
            raise ResumeMismatch(
                f"{self.path}: task {task} doc {doc_id} was answered for another request (its prompt or generation "
                f"kwargs differ: request key {record.get('request')} there, {request} now; the task changed?). A "
                "record is never reused for another request: give this run its own stats_path")
        return record


def read_records(path: Path) -> list[tuple[int, dict]]:
    """(line number, record) of each complete line, read under the writers' lock, split on "\n" only
    (stats_writer.read_lines)."""
    out = []
    for number, line in enumerate(read_lines(path), 1):
        if line.strip():
            try:
                out.append((number, json.loads(line)))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not JSON ({err.msg}); cannot resume from it") from err
    return out


def check_settings(record: dict, settings: dict, where: str) -> None:
    """ResumeMismatch naming every setting in which `record` differs from this run."""
    theirs = record.get("settings")
    if theirs is None:
        raise ResumeMismatch(f"{where} (task {record.get('task')} doc {record.get('doc_id')}) carries no settings "
                             "(written by an older lvspec-eval): it cannot be checked, so it is not reused; give this "
                             "run its own stats_path")
    diffs = [f"{key}={theirs.get(key)!r} there, {settings.get(key)!r} now"
             for key in sorted(set(theirs) | set(settings), key=lambda k: (k not in FIRST_SHOWN, k)) if theirs.get(key) != settings.get(key)]
    if diffs:
        shown = "; ".join(diffs[:MAX_SHOWN]) + (f"; and {len(diffs) - MAX_SHOWN} more" if len(diffs) > MAX_SHOWN else "")
        raise ResumeMismatch(f"{where} (task {record.get('task')} doc {record.get('doc_id')}) was made under other "
                             f"settings: {shown}. A record from other settings is never reused: rerun "
                             "with the same model_args, or give this run its own stats_path")

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
prints), for the same request (`request_key`: the text, the generation kwargs, each video file's
name, size and head-and-tail digest, and the rule that picks its frames) and on the same machine
(`machine_settings`: CPU model and flags, cores, threads, GPUs, torch and transformers versions);
anything else is an error naming what differs, never a silent reuse. What a run chose under its load
(`load_choices`: the CPU kernel per weight shape and row count, the prepacked copies' size) is no
resume key: those choices depend on the memory free and on the other lvspec processes' share of the
kernel budget (backends/linear_kernels.py), and on whether a measurement was re-taken on a busy
machine, so the same machine under another load (a neighbour holding the budget, the second rank of a
`torchrun` run) chooses otherwise. Each record carries them (`load`), and the report says where a
run's records ran under more than one (reporting/rows.py `note_load_choices`). Records of another machine are reused only with model_arg resume_any_machine=true
(their timings do not compare with this machine's, and a tree method's tokens can differ at a
near-tie under other kernels); the report then flags the run as timed on more than one machine.
A failed sample's record (error set) is served like any other: its empty answer again,
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
import os
from dataclasses import asdict
from pathlib import Path

import torch
import transformers

from loguru import logger

from .. import jsonl
from ..backends import host
from ..backends.loading import DEMO_NAMES
from .args import ModelArgs
from .stats_writer import read_lines

# model_args that do not change what a sample decodes (where records go, what a device error does)
NOT_SETTINGS = ("stats_path", "on_device_error", "batch_size", "max_batch_size", "resume_any_machine", "warmup")
MACHINE_PREFIXES = ("machine.",)  # settings that say where a record was made, not what it asked
# what a run chose under its load: no resume key (records of older versions carry kernels.* in settings)
LOAD_PREFIXES = ("kernels.", "packed_mb.")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
MAX_SHOWN = 8  # differing settings named in the error, these first:
FIRST_SHOWN = ("method", "drafter", "verifier", "pretrained", "draft", "weights.pretrained", "weights.draft", "dtype")
EDGE_BYTES = 1 << 16  # of each weight file's head and tail: a retrained checkpoint changes its tensors


class ResumeMismatch(ValueError):
    """A record in stats_path was made under other settings or for another request."""


def run_settings(args: ModelArgs, options, machine: dict | None = None) -> dict:
    """What a record's answer depends on, flat (so a mismatch names its key): the model_args (defaults
    filled), the decoding options with their defaults (`options`: the runner's DecodeOptions, as
    options.NAME), a fingerprint of each checkpoint's weights (weights.pretrained, weights.draft) and
    the machine it runs on (`machine`: machine_settings())."""
    settings = {k: v for k, v in asdict(args).items() if k not in NOT_SETTINGS and k != "options"}
    decode = asdict(options)
    settings.update({f"options.{k}": v for k, v in {**decode.pop("extra"), **decode}.items()})
    settings.update({f"weights.{name}": checkpoint_fingerprint(getattr(args, name)) for name in ("pretrained", "draft")})
    settings.update(machine or {})
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
            digest.update(f"{path.relative_to(folder)}:".encode())
            _digest_edges(digest, path)
    return digest.hexdigest()[:16]


def _digest_edges(digest, path: Path) -> None:
    """Feed a file's size and its first and last EDGE_BYTES to `digest`."""
    size = path.stat().st_size
    digest.update(f"{size}:".encode())
    with open(path, "rb") as f:
        digest.update(f.read(EDGE_BYTES))
        f.seek(max(0, size - EDGE_BYTES))
        digest.update(f.read(EDGE_BYTES))


def video_fingerprint(path: str) -> str:
    """A video file by its name, size and first and last bytes: a re-encoded or replaced file changes
    them, a copy to another folder or machine does not (the folder is not part of it). A file that
    cannot be read gives its name and the error, so a sample that failed on it keys the same again."""
    digest = hashlib.sha256()
    try:
        _digest_edges(digest, Path(path))
    except OSError as err:
        return f"{Path(path).name}:unreadable:{type(err).__name__}"
    return f"{Path(path).name}:{digest.hexdigest()[:16]}"


def request_key(context: str, gen_kwargs: dict | None, videos: tuple[str, ...] = (), frames: str = "") -> str:
    """The request: its text context and the generation kwargs that change the output (as lmms-eval's
    ResponseCache tells requests apart, the same canonical form), the fingerprint of each video it
    sends (`video_fingerprint`; in a task whose docs share one instruction the videos are what tell
    them apart) and the rule that picks the frames (`frames`: the frame plan in words)."""
    from lmms_eval.caching.response_cache import canonicalize_gen_kwargs

    raw = "\0".join([context, str(canonicalize_gen_kwargs(gen_kwargs)), frames, *videos])
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:16]


def machine_settings() -> dict:
    """Where records are made, flat (`machine.*`): the CPU's model, a digest of its flags (backends/
    host.py) and its core count, torch's thread count, every visible GPU's name and compute
    capability, the torch and transformers versions. Nothing that depends on the machine's load."""
    cpu, flags = host.cpu_identity()
    gpus = [f"{torch.cuda.get_device_name(i)} (sm {'.'.join(map(str, torch.cuda.get_device_capability(i)))})"
            for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return {"machine.cpu": cpu, "machine.cpu_flags": flags, "machine.cores": os.cpu_count(),
            "machine.threads": torch.get_num_threads(), "machine.gpus": ", ".join(gpus) or None,
            "machine.torch": torch.__version__, "machine.transformers": transformers.__version__}


def load_choices(target=None, draft=None) -> dict:
    """What this run chose under the machine's load, per loaded backend (`pretrained`, `draft`): a
    fingerprint of its CPU kernel choices (`kernels.*`, kernel_fingerprint) and the MiB of prepacked
    copies it holds (`packed_mb.*`; 0 where none fit the allowance). Recorded, never a resume key."""
    out = {}
    for name, backend in (("pretrained", target), ("draft", draft)):
        report = getattr(backend, "kernels", None)
        out[f"kernels.{name}"] = kernel_fingerprint(backend)
        out[f"packed_mb.{name}"] = None if report is None else round(report.packed_mb, 1)
    return out


def kernel_fingerprint(backend) -> str | None:
    """A digest of the kernel chosen per weight shape and row count on `backend` (its linear_kernels
    KernelReport); None where none is installed (nn.Linear throughout) or no backend is loaded."""
    report = getattr(backend, "kernels", None)
    if report is None:
        return None
    choices = {shape: entry.get("choices") for shape, entry in report.shapes.items()}
    return hashlib.sha256(json.dumps(choices, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Resume:
    """The completed samples of stats_path, by (task, doc_id), checked against this run's settings."""

    def __init__(self, path: Path, settings: dict, any_machine: bool = False):
        self.path = path
        self.records: dict[tuple[str, str], dict] = {}
        for number, record in read_records(path):
            check_settings(record, settings, f"{path}:{number}", any_machine)
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
                f"{self.path}: task {task} doc {doc_id} was answered for another request (its prompt, generation "
                f"kwargs, video files or frame rule differ: request key {record.get('request')} there, {request} "
                "now; the task changed?). A record is never reused for another request: give this run its own "
                "stats_path")
        return record


def read_records(path: Path) -> list[tuple[int, dict]]:
    """(line number, record) of each complete line, read under the writers' lock (stats_writer.read_lines)."""
    try:
        return jsonl.parse_lines(read_lines(path), path)
    except ValueError as err:
        raise ValueError(f"{err}; cannot resume from it") from err


def check_settings(record: dict, settings: dict, where: str, any_machine: bool = False) -> None:
    """ResumeMismatch naming every setting in which `record` differs from this run; a record made on
    another machine (MACHINE_PREFIXES) passes only with `any_machine` (model_arg resume_any_machine).
    The load's choices (LOAD_PREFIXES) that an older version kept among the settings are not compared."""
    theirs = record.get("settings")
    if theirs is not None:  # an older version's record: its load's choices were among its settings
        theirs = {k: v for k, v in theirs.items() if not k.startswith(LOAD_PREFIXES)}
    what = f"{where} (task {record.get('task')} doc {record.get('doc_id')})"
    if theirs is None:
        raise ResumeMismatch(f"{what} carries no settings (written by an older lvspec-eval): it cannot be checked, so "
                             "it is not reused; give this run its own stats_path")
    diffs = [key for key in sorted(set(theirs) | set(settings), key=lambda k: (k not in FIRST_SHOWN, k))
             if theirs.get(key) != settings.get(key)]
    machine = [key for key in diffs if key.startswith(MACHINE_PREFIXES)]
    if len(machine) < len(diffs):
        raise ResumeMismatch(f"{what} was made under other settings: {_shown(diffs, theirs, settings)}. A record from "
                             "other settings is never reused: rerun with the same model_args, or give this run its "
                             "own stats_path")
    if machine and not any_machine:
        raise ResumeMismatch(f"{what} was made on another machine: {_shown(machine, theirs, settings)}. Its timings do "
                             "not compare with this machine's (and a tree method's tokens can differ at a near-tie "
                             "under other kernels): give this run its own stats_path, or pass resume_any_machine=true "
                             "in model_args to reuse it anyway (the report then flags the run)")


def _shown(keys: list[str], theirs: dict, settings: dict) -> str:
    shown = "; ".join(f"{key}={theirs.get(key)!r} there, {settings.get(key)!r} now" for key in keys[:MAX_SHOWN])
    return shown + (f"; and {len(keys) - MAX_SHOWN} more" if len(keys) > MAX_SHOWN else "")

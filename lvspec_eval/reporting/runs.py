"""Reading saved runs for the report: lmms-eval's results and samples files and the lvspec
model's decode-stats JSONL (the formats are in report.py's docstring). No statistics here; both
report.py and the modules it uses (divergence, baseline_run) import from this one, so none of them
imports report.py.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import jsonl

log = logging.getLogger(__name__)  # under the report's package logger: its warnings land in summary.json

LOSSLESS_METHODS = ("vanilla", "sd_tree", "specvlm", "sparrow", "mtp", "sage", "std")


@dataclass(frozen=True)
class TaskRun:
    """One method on one task: a results file, its samples file and the matching decode stats."""

    method: str
    task: str
    metrics: tuple[str, ...]  # metric names in the results JSON's order
    samples: dict[str, dict]  # doc_id -> logged sample
    stats: dict[str, dict]  # doc_id -> decode-stats record
    source: Path  # the results file
    lossless: bool


def parse_model_args(value: str | Mapping | None) -> dict[str, str]:
    """lmms-eval keeps model_args as the CLI string "k=v,k=v" (or a dict when called from code)."""
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    pairs = [item.split("=", 1) for item in (value or "").split(",") if item.strip()]
    return {k.strip(): v.strip() for k, v in (p if len(p) == 2 else (p[0], "") for p in pairs)}


def run_method(model_args: Mapping[str, str], where: str) -> str:
    """The row name, as the lvspec model labels its stats records: `method` (default vanilla, as
    in the model), or "custom:<drafter>+<verifier>" for method=custom."""
    method = model_args.get("method") or "vanilla"
    if method != "custom":
        return method
    drafter, verifier = model_args.get("drafter"), model_args.get("verifier")
    if not drafter or not verifier:
        raise ValueError(f"{where}: method=custom without drafter=<name> and verifier=<name> in model_args")
    return f"custom:{drafter}+{verifier}"


def is_lossless(method: str, verifier: str | None = None) -> bool:
    """Exact verification is lossless. `verifier` is model_args' verifier= (it may swap the
    verifier of a named method); without it the method name decides."""
    if verifier:
        return verifier == "exact"
    if method.startswith("custom:"):
        return method.rsplit("+", 1)[-1] == "exact"
    return method in LOSSLESS_METHODS


def read_jsonl(path: Path) -> list[dict]:
    """The package's JSON-lines reader (lvspec_eval/jsonl.py), warning through the report's logger (so a
    killed run's torn last line is named in summary.json's warnings)."""
    return jsonl.read_jsonl(path, log.warning)


def metric_names(task_results: Mapping) -> tuple[str, ...]:
    """ "acc,none" -> "acc"; stderr entries and the alias are not metrics."""
    names = [k.split(",", 1)[0] for k in task_results if k != "alias" and "_stderr" not in k and "," in k]
    return tuple(dict.fromkeys(names))


def stats_files(model_args: Mapping[str, str], results_path: Path, run_dir: Path) -> list[Path]:
    """The run's stats_path (as written, else relative to RUN or to the results file) and every
    stats*.jsonl under RUN, each once."""
    found = sorted(run_dir.rglob("stats*.jsonl"))
    given = model_args.get("stats_path")
    if given:
        candidates = [c for c in (Path(given), run_dir / given, results_path.parent / given) if c.is_file()]
        if not candidates:
            log.warning("%s: stats_path %s not found (also looked under %s)", results_path, given, run_dir)
        found += candidates[:1]
    unique = {p.resolve(): p for p in found}
    return list(unique.values())


def load_stats(paths: list[Path], method: str) -> dict[str, dict[str, dict]]:
    """task -> doc_id -> record, for this method's records only (a later line wins)."""
    out: dict[str, dict[str, dict]] = {}
    for path in paths:
        for rec in read_jsonl(path):
            if rec.get("method", method) == method:
                out.setdefault(str(rec.get("task")), {})[str(rec.get("doc_id"))] = rec
    return out


def load_results_file(path: Path, run_dir: Path) -> list[TaskRun]:
    data = json.loads(path.read_text(encoding="utf-8"))
    config = data.get("config") or {}
    model_args = parse_model_args(config.get("model_args", data.get("model_args")))
    method = run_method(model_args, str(path))
    lossless = is_lossless(method, model_args.get("verifier"))
    decode_stats = load_stats(stats_files(model_args, path, run_dir), method)
    date_id = path.name[: -len("_results.json")]
    runs = []
    for task, task_results in (data.get("results") or {}).items():
        samples_path = path.parent / f"{date_id}_samples_{task}.jsonl"
        if not samples_path.is_file():
            if not (data.get("group_subtasks") or {}).get(task):  # groups have no samples of their own
                log.warning("%s: no samples file for task %s (run lmms-eval with --log_samples)", path, task)
            continue
        samples = {str(s["doc_id"]): s for s in read_jsonl(samples_path)}
        metrics = metric_names(task_results)
        runs.append(TaskRun(method, task, metrics, samples, decode_stats.get(task, {}), path, lossless))
    return runs


def discover(run_dirs: list[Path]) -> dict[tuple[str, str], TaskRun]:
    """(task, method) -> its run; the latest results file (by name, which starts with the date)
    wins when a method ran a task twice."""
    runs: dict[tuple[str, str], TaskRun] = {}
    for run_dir in map(Path, run_dirs):
        results = sorted(run_dir.rglob("*_results.json"), key=lambda p: p.name)
        if not results:
            raise ValueError(f"no *_results.json under {run_dir}; give folders written by lmms-eval --output_path")
        for path in results:
            for run in load_results_file(path, run_dir):
                key = (run.task, run.method)
                if key in runs:
                    log.warning(
                        "method %s ran task %s twice: using the later of %s and %s",
                        run.method,
                        run.task,
                        path,
                        runs[key].source,
                    )
                if key not in runs or path.name >= runs[key].source.name:
                    runs[key] = run
    return runs

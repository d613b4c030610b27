"""`lvspec-eval demo`: every method through lmms-eval on the demo world, then the leaderboard.

Each method is a real lmms-eval run (the registered `lvspec` model, the synthvid tasks, results
and per-sample logs written by lmms-eval itself), all in this one process, back to back, so the
report's speed ratios compare runs on the same machine state. lmms-eval exits 0 even when a run
fails, so each run's results file is checked before the report is built.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parents[2]
TASKS_DIR = REPO / "tasks"
DEMO_METHODS = ("vanilla", "sd_tree", "specvlm", "sparrow", "fly", "lvspec")
DEMO_TASKS = ("synthvid_caption", "synthvid_mcq")


def available_methods(requested: tuple[str, ...]) -> list[str]:
    """The requested methods whose drafter and verifier exist in this build."""
    from ..decoding import methods

    out = []
    for name in requested:
        spec = methods.METHODS[name]
        if spec.drafter in methods.DRAFTERS and spec.verifier in methods.VERIFIERS:
            out.append(name)
    return out


def results_files(run_dir: Path) -> list[Path]:
    return sorted(run_dir.rglob("*_results.json"))


def run_lmms_eval(method: str, run_dir: Path, tasks: tuple[str, ...], limit: int, extra_args: str = "") -> Path:
    """One real lmms-eval CLI run, in-process; returns its results file or raises."""
    from lmms_eval.__main__ import cli_evaluate

    run_dir.mkdir(parents=True, exist_ok=True)
    stats = run_dir / "stats.jsonl"
    stats.unlink(missing_ok=True)
    model_args = f"pretrained=demo,draft=demo-draft,method={method},stats_path={stats}" + (
        f",{extra_args}" if extra_args else "")
    argv = ["lmms-eval", "--model", "lvspec", "--model_args", model_args, "--tasks", ",".join(tasks),
            "--include_path", str(TASKS_DIR), "--limit", str(limit), "--output_path", str(run_dir),
            "--log_samples", "--verbosity", "INFO"]
    before = set(results_files(run_dir))
    with mock.patch.object(sys, "argv", argv):
        cli_evaluate()
    new = [p for p in results_files(run_dir) if p not in before]
    if not new:
        raise RuntimeError(f"lmms-eval wrote no results for method {method!r} in {run_dir}; see the log above")
    return new[-1]


def run_demo(out: Path, methods: list[str], limit: int, threads: int) -> dict:
    import torch

    from .. import report

    if not TASKS_DIR.is_dir():
        raise FileNotFoundError(f"the synthvid task folder {TASKS_DIR} is missing (run from a clone of the repo)")
    torch.set_num_threads(threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    run_dirs = []
    for method in methods:
        t0 = time.time()
        run_lmms_eval(method, out / "runs" / method, DEMO_TASKS, limit)
        print(f"[demo] {method}: lmms-eval run done in {time.time() - t0:.0f} s", flush=True)
        run_dirs.append(out / "runs" / method)
    return report.build_report(run_dirs, out, echo=True)


def _main(args: argparse.Namespace) -> int:
    requested = tuple(args.methods.split(",")) if args.methods else DEMO_METHODS
    methods = available_methods(requested)
    t0 = time.time()
    run_demo(Path(args.out), methods, args.limit, args.threads)
    print(f"[demo] {len(methods)} methods in {time.time() - t0:.0f} s; report in {args.out}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("demo", help="run every method through lmms-eval on the demo world and report")
    p.add_argument("--out", default="results/demo", help="where runs, summary.json and the leaderboard go")
    p.add_argument("--methods", default="", help=f"comma-separated subset of {', '.join(DEMO_METHODS)}")
    p.add_argument("--limit", type=int, default=20, help="samples per task")
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=_main)

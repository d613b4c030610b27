"""`lvspec-eval report --baseline-run DIR`: a run of lmms-eval's own model class as the quality baseline.

Users often already have scores from lmms-eval's own class (`--model qwen2_5_vl`, `--model llava_hf`,
...). Given that run's `--output_path` folder (its `*_results.json` and, from `--log_samples`, its
`*_samples_<task>.jsonl`), the report adds a row named `lmms-eval` per task and compares every
method's quality with it: retention, its interval, non-inferiority and the tests are then against the
numbers the user already has, and the `vanilla` row shows how closely `method=vanilla` reproduces them
(1.000 and exact text when parity holds, models/parity.py).

lmms-eval's classes record no decode timings or token ids, so speed, exact match and divergence stay
measured against this project's vanilla run of the same task: the `lmms-eval` row carries vanilla's
decode statistics (its speedups read 1.00 by construction). A task without a vanilla run is left out.
"""
from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

from lvspec_eval.reporting.runs import load_results_file

log = logging.getLogger(__name__)

NAME = "lmms-eval"  # the row name, and the report's baseline when a baseline run is given


def reference_model(path: Path) -> str:
    """The `--model` of a results file (e.g. qwen2_5_vl), for the log."""
    config = json.loads(path.read_text(encoding="utf-8")).get("config") or {}
    return str(config.get("model") or "unknown model")


def load(run_dir: Path, runs: dict, vanilla: str = "vanilla") -> dict:
    """(task, NAME) -> TaskRun of the reference run, for every task that `runs` (the report's
    (task, method) -> TaskRun) also ran with `vanilla`."""

    run_dir = Path(run_dir)
    results = sorted(run_dir.rglob("*_results.json"), key=lambda p: p.name)
    if not results:
        raise ValueError(f"--baseline-run {run_dir}: no *_results.json under it; give the --output_path folder of "
                         "an lmms-eval run (with --log_samples)")
    out = {}
    for path in results:  # the latest file wins a task, as for the method runs
        for run in load_results_file(path, run_dir):
            ours = runs.get((run.task, vanilla))
            if ours is None:
                log.warning("--baseline-run: task %s has no %s run to time against: left out", run.task, vanilla)
                continue
            log.info("--baseline-run: task %s from %s (%s)", run.task, path, reference_model(path))
            out[(run.task, NAME)] = replace(run, method=NAME, stats=ours.stats, lossless=False)
    if not out:
        tasks = sorted({t for t, _ in runs})
        raise ValueError(f"--baseline-run {run_dir}: no task in common with the method runs (theirs: "
                         f"{', '.join(tasks) or 'none'}) among those with a {vanilla} run")
    return out

"""The report's rows: one per task and method, paired with the baseline's run of the task.

Rows are ordered by task, then vanilla, sd_tree, specvlm, sparrow, fly, lvspec, others by name;
length tasks (ReportOptions.length_tasks) come after every other task's, in the given order.
A row joins the speed figures (speed.py), the quality figures (quality.py), the divergence of
exact methods (divergence.py) and the policy's figures (policy.py).
"""

from __future__ import annotations

import logging

from judges import stats
from lvspec_eval.reporting import divergence
from lvspec_eval.reporting import policy as report_policy
from lvspec_eval.reporting.options import ReportOptions
from lvspec_eval.reporting.quality import quality_fields
from lvspec_eval.reporting.runs import TaskRun
from lvspec_eval.reporting.speed import (
    cold_starts,
    sample_shape,
    speed_fields,
    timed_pairs,
)

log = logging.getLogger(__name__)

METHOD_ORDER = ("vanilla", "sd_tree", "specvlm", "sage", "std", "sparrow", "mtp", "fly", "lvspec")


def method_row(run: TaskRun, vanilla: TaskRun, metric: str, opts: ReportOptions) -> dict:
    pairs = timed_pairs(run, vanilla)
    if not run.stats:
        log.warning(
            "no decode statistics for %s on %s (give stats_path= or put stats*.jsonl in its RUN folder)",
            run.method,
            run.task,
        )
    row = {"task": run.task, "method": run.method, "lossless": run.lossless}
    row["failed"] = sum(1 for r in run.stats.values() if r.get("error"))
    row["untimed"] = sum(1 for r in run.stats.values() if r.get("untimed"))  # left out of the speed figures
    row.update(speed_fields(pairs, opts), cold_starts=cold_starts(run, vanilla))
    if run.method == opts.baseline and pairs:  # against itself: exactly 1, no verdict to give
        row.update(e2e_verdict=None, decode_verdict=None, e2e_speedup_ci=[1.0, 1.0], decode_speedup_ci=[1.0, 1.0])
    row.update(quality_fields(run, vanilla, metric, opts))
    if run.lossless and run.method != opts.baseline:
        row["divergence"] = divergence.row_fields(run.stats, vanilla.stats)
    row["policy"] = report_policy.policy_fields(run.stats.values())
    row.update(sample_shape(pairs))
    return row


def method_sort_key(method: str) -> tuple[int, str]:
    return (METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER), method)


def task_rows(task: str, runs: dict[str, TaskRun], opts: ReportOptions) -> list[dict]:
    """Rows of one task, baseline first; p-values Holm-corrected across the task's methods."""
    vanilla = runs[opts.baseline]
    metric = opts.metrics.get(task) or (vanilla.metrics[0] if vanilla.metrics else None)
    if metric is None:
        raise ValueError(f"{vanilla.source}: task {task} lists no metric; give --metric {task}=NAME")
    rows = [method_row(runs[m], vanilla, metric, opts) for m in sorted(runs, key=method_sort_key)]
    adjusted = stats.holm([r["p_value"] if r["p_value"] is not None else float("nan") for r in rows])
    for row, p in zip(rows, adjusted):
        row["p_holm"] = None if row["p_value"] is None else float(p)
    return rows


def task_order(tasks: set[str], length_tasks: tuple[str, ...] = ()) -> list[str]:
    """Tasks by name, then the length tasks in their given order."""
    return sorted(tasks - set(length_tasks)) + [t for t in dict.fromkeys(length_tasks) if t in tasks]


def build_rows(runs: dict[tuple[str, str], TaskRun], opts: ReportOptions) -> list[dict]:
    methods = sorted({m for _, m in runs}, key=method_sort_key)
    if opts.baseline not in methods:
        found = ", ".join(methods) or "none"
        raise ValueError(f"no run with method={opts.baseline} (the baseline); runs found: {found}")
    warn_machines(runs)
    note_load_choices(runs)
    tasks = task_order({t for t, _ in runs}, opts.length_tasks)
    for task in sorted(set(opts.metrics) - set(tasks)):
        log.warning("--metric names task %s, which no run has (tasks: %s)", task, ", ".join(tasks))
    rows = []
    for task in tasks:
        by_method = {m: run for (t, m), run in runs.items() if t == task}
        if opts.baseline not in by_method:
            log.warning("task %s has no %s run: left out of the leaderboard", task, opts.baseline)
            continue
        rows.extend(task_rows(task, by_method, opts))
    return rows


def warn_machines(runs: dict[tuple[str, str], TaskRun]) -> None:
    """Warn when the records come from more than one machine (their settings' machine.* entries,
    models/resume.py: a run resumed with resume_any_machine=true, or runs made on two machines): times
    of two machines do not compare, paired or not."""
    machines: dict[tuple, list[str]] = {}
    for run in runs.values():
        for record in run.stats.values():
            settings = record.get("settings") or {}
            ident = tuple(sorted((k, str(v)) for k, v in settings.items() if k.startswith("machine.")))
            if ident and f"{run.method}/{run.task}" not in machines.setdefault(ident, []):
                machines[ident].append(f"{run.method}/{run.task}")
    if len(machines) > 1:
        where = "; ".join(f"{', '.join(dict(m).get(k, '?') for k in ('machine.cpu', 'machine.threads'))}: "
                          f"{', '.join(names[:4])}" for m, names in machines.items())
        log.warning("the records come from %d machines (%s): their times do not compare", len(machines), where)


def note_load_choices(runs: dict[tuple[str, str], TaskRun]) -> None:
    """Warn where one run's records ran under more than one set of CPU kernel choices (each record's
    `load`, models/resume.py load_choices: what the run chose under the machine's load, e.g. its
    prepacked copies dropped while another process held the kernel budget, then resumed): the same
    machine, but its timings mix two kernel plans."""
    for run in runs.values():
        plans = {tuple(sorted((k, str(v)) for k, v in (r.get("load") or {}).items() if k.startswith("kernels.")))
                 for r in run.stats.values()} - {()}
        if len(plans) > 1:
            log.warning("%s/%s: its records ran under %d kernel choices (the machine's load at the time: prepacked "
                        "kernels dropped where the memory allowance was short); their timings mix them",
                        run.method, run.task, len(plans))

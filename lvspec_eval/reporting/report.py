"""`lvspec-eval report RUN... -o DIR`: the leaderboard, built only from saved results.

Inputs (found recursively under each RUN folder):
- lmms-eval's output of `--output_path RUN --log_samples`: `RUN/<model>/<date>_results.json`
  ("results" per task with "<metric>,<filter>" keys in the task's order; "config"."model_args")
  and `RUN/<model>/<date>_samples_<task>.jsonl` (one logged doc per line: "doc_id", the per-sample
  value under each metric name, "filtered_resps", ...). model_args holds `method=<name>`, which
  names the row; the run whose method is the baseline ("vanilla") is what every row is paired
  with. When one method/task appears twice, the latest results file wins (with a warning).
- The decode statistics JSONL written by the lvspec model: model_arg `stats_path=` (as given,
  else relative to RUN) and any `stats*.jsonl` under RUN; records whose "method" differs from
  the run's are ignored, so several runs may share one file. A record per sample: "task",
  "doc_id", "method", "error", "num_new_tokens", "num_steps", "accepted_lengths", "tau",
  "decode_s", "e2e_s", "visual_tokens", "tokens", and for the relevance plot either
  "token_records" [{"token", "text", "kind", "relevance"}] or the parallel lists "kinds",
  "relevance", "token_texts" (what lvspec_eval/decoding/runner.py writes). A model_args without method=
  is vanilla (the model's default); method=custom,drafter=D,verifier=V is "custom:D+V".

How figures are computed (per task and method, against the baseline):
- Quality: mean per-sample metric over the samples both runs have (paired by doc_id). The metric
  is the task's first in its results JSON unless `--metric task=name`. A per-sample value is a
  number, a bool, or a dict with a numeric "score" (lmms-eval's video tasks log such dicts).
  Retention, its BCa interval, non-inferiority and the tests come from judges/stats.py.
- Speed: over the samples both runs timed without error. decode/e2e speedup = the median over those
  requests of vanilla's decode_s (e2e_s) / the method's, with a percentile bootstrap interval
  (judges.stats.speedup_interval; n_boot, alpha and seed as for retention); a row whose interval
  holds 1.0 says "no clear difference". The ratio of summed seconds is kept beside it (*_total); where the method's records carry "vanilla_decode_s" and
  "vanilla_e2e_s" (model_arg paired_timing: vanilla decoded beside each request, same process,
  same moment), those are vanilla's times ("timing": "paired", else "runs"; "mixed" when only some
  records have them); decode tokens/s = new tokens / decode seconds. tau =
  all accepted draft tokens / all steps (bonus excluded, as the papers report it);
  tokens_per_step = tau + 1. Failed samples still count in quality (their answer is what was
  scored) and in "failed"; they are left out of speed.
- Exact match: share of paired samples whose output token ids equal the baseline's
  ("exact_match_basis": "tokens"); when a record lacks "tokens", the logged responses are
  compared instead ("text").
- Fact errors introduced: for tasks whose per-sample metric dicts list the facts an answer got
  right ("facts_right": the synthvid captions), the facts vanilla's answer had right that the
  method's lost, summed over the paired docs, and their share of vanilla's right facts.

The pages (leaderboard.html, standalone; leaderboard.md, the same sections for GitHub) open with the
summary (per task the recommended method: report_overview.recommend), then failures and
divergences, the compact end-to-end leaderboard, the time per phase, and the full tables collapsed.

summary.json (read by `lvspec-eval check`; NaN is written as null):
{"version": 1,
 "headline": {"recommended": [{"task", "method", "e2e_speedup", "decode_speedup", "retention",
   "retention_ci", "reason"}], "overall": {method: {"e2e_speedup", "decode_speedup", "tasks"}}
   (geometric means over the method's tasks)},
 "baseline": "vanilla", "alpha": 0.05, "n_boot": 2000,
 "rows": [{"task", "method", "lossless": bool (verifier exact: vanilla, sd_tree, specvlm,
   sparrow, "custom:<drafter>+exact", or any method run with verifier=exact), "n" (paired samples), "n_timed", "failed", "tau",
   "tokens_per_step", "e2e_speedup" and "decode_speedup" (medians of per-request ratios baseline / method),
   "e2e_speedup_ci" and "decode_speedup_ci" ([lo, hi], percentile bootstrap), "e2e_speedup_total" and
   "decode_speedup_total" (ratios of summed seconds), "e2e_verdict" and "decode_verdict" ("faster",
   "slower", "no clear difference", "too few requests"; null for the baseline), "e2e_paired_s" ([[baseline
   seconds, method seconds], ...] per timed request), "retimed" (pairs decoded again after a stall,
   decoding/runner.timed_pair), "untimed" (requests left out of the speed figures: stalled twice), "timing", "decode_tokens_per_s", "quality",
   "vanilla_quality", "metric", "retention", "retention_ci": [lo, hi], "non_inferior",
   "margin", "non_inferior_by_margin": {"0.01": bool, "0.02": bool},
   "exact_match_rate", "exact_match_basis", "facts_lost", "fact_error_rate" (null where the task
   logs no "facts_right"), "p_value", "p_holm", "test" ("mcnemar_exact",
   "wilcoxon" or null for the baseline), "zero_method",
   "divergence" (exact methods other than the baseline, else absent): {"compared", "diverged",
   "near_tie", "elsewhere", "unclassified", "dtype", "tolerance", "basis", "first_divergences"}
   (see lvspec_eval/reporting/divergence.py: where the method first leaves the baseline's tokens, a near-tie
   of the target's logits there is numerics, anything else a bug)},
   "visual_tokens", "mean_new_tokens" (means over the timed samples), "time_breakdown": mean seconds
   per sample in each phase (report_overview.PHASES, from the stats' preprocess_s, prefill_s,
   draft_prepare_s, else draft_prefill_s + draft_vision_s, prune_s, decode_s, e2e_s) and "e2e"],
 "plots": [{"name", "path" (a PNG relative to DIR; null for a table-only entry), "caption", plus
   the hook's extra figures, e.g. "top_loose_tokens": [[text, count], ...]}], "warnings": [str]}
Rows are ordered by task, then vanilla, sd_tree, specvlm, sparrow, fly, lvspec, others by name.
Length tasks (option `length_tasks`, CLI `--length-tasks`; the demo's length stage passes its
synthvid_caption_f32 ... _f512 tasks) are tasks that differ from another only in video length:
their rows come after every other task's, in the given order, and are paired with vanilla like
any task (by task and doc_id: vanilla's run of that task, whichever RUN folder it came from),
so the rows of the trained-length tasks lead the table unchanged. The speed-vs-retention panels
leave them out (a handful of samples per length); the speed-vs-visual-tokens curve uses them.
Plots come from report_plots.PLOT_HOOKS (extendable); `--no-plots` skips them.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from judges import stats
from lvspec_eval.reporting import baseline_run as baseline_runs
from lvspec_eval.reporting import divergence
from lvspec_eval.reporting import overview as report_overview
from lvspec_eval.reporting import page as report_html
from lvspec_eval.reporting import plots as report_plots
from lvspec_eval.reporting import policy as report_policy
from lvspec_eval.reporting.divergence import divergence_summary  # noqa: F401  (for `check` and callers holding records)
from lvspec_eval.reporting.page import Section, Table
from lvspec_eval.reporting.runs import (  # noqa: F401  (the report's public names: callers and tests use them)
    LOSSLESS_METHODS,
    TaskRun,
    discover,
    is_lossless,
    load_results_file,
    metric_names,
    parse_model_args,
    read_jsonl,
    run_method,
)

log = logging.getLogger(__name__)
# build_report collects the warnings of every module of the package (loading, plots...) into summary.json
PACKAGE_LOG = logging.getLogger(__name__.rpartition(".")[0])

METHOD_ORDER = ("vanilla", "sd_tree", "specvlm", "sparrow", "mtp", "fly", "lvspec")
REPORTED_MARGINS = (0.01, 0.02)
# keys lmms-eval writes into every logged sample besides the metrics
LOGGED_SAMPLE_KEYS = ("doc_id", "target", "resps", "filtered_resps", "doc_hash", "input", "token_counts", "input_media")


@dataclass(frozen=True)
class ReportOptions:
    metrics: Mapping[str, str] = field(default_factory=dict)  # task -> metric override
    margin: float = 0.01  # the non-inferiority margin of the "non_inferior" column
    n_boot: int = 2000
    alpha: float = 0.05
    seed: int = 0
    baseline: str = "vanilla"
    echo: bool = False  # print the table to stdout
    plots: bool = True  # draw the PNGs (off: faster, for CI gates that read only summary.json)
    length_tasks: tuple[str, ...] = ()  # rows after the other tasks', in this order (see the docstring)
    lossless_tasks: tuple[str, ...] = ()  # tasks whose recommended method must be lossless (exact output)


# ------------------------------------------------------------------------------------- statistics


def score_value(value, metric: str, where: str) -> float | None:
    """A per-sample metric as a number (lmms-eval's video tasks log dicts with a "score").

    None means missing (a judge that did not answer): such samples are left out, never scored 0.
    """
    if value is None or (isinstance(value, Mapping) and "score" in value and value["score"] is None):
        return None
    if isinstance(value, Mapping) and isinstance(value.get("score"), (int, float)):
        value = value["score"]
    if isinstance(value, (bool, int, float)) and math.isfinite(float(value)):
        return float(value)
    raise ValueError(
        f"{where}: per-sample {metric!r} is {value!r}; expected a number, a bool or a dict with a numeric "
        "'score' (pick another metric with --metric TASK=NAME)"
    )


def sample_scores(run: TaskRun, metric: str) -> dict[str, float]:
    out = {}
    for doc_id, sample in run.samples.items():
        if metric not in sample:
            available = ", ".join(sorted(k for k in sample if k not in LOGGED_SAMPLE_KEYS))
            raise ValueError(
                f"{run.source}: sample {doc_id} of {run.task} has no metric {metric!r}; available: {available}"
            )
        score = score_value(sample[metric], metric, f"{run.source} {run.task} doc {doc_id}")
        if score is not None:
            out[doc_id] = score
    return out


PAIRED_TIMES = ("decode_s", "e2e_s")  # a method record's "vanilla_<key>": vanilla timed beside it


def timed_pairs(run: TaskRun, vanilla: TaskRun) -> list[tuple[dict, dict]]:
    """(method record, vanilla record) for the samples both timed without error. Where the method's
    record carries vanilla's times from the same process and moment (model_arg paired_timing), they
    replace the vanilla run's times in its record (marked "paired": True)."""
    ids = sorted(set(run.stats) & set(vanilla.stats), key=str)
    ok = [i for i in ids if not run.stats[i].get("error") and not vanilla.stats[i].get("error")]
    ok = [i for i in ok if not run.stats[i].get("untimed")]  # stalled twice (runner.timed_pair): no timing
    return [(run.stats[i], _beside(run.stats[i], vanilla.stats[i])) for i in ok]


def _beside(method: dict, vanilla: dict) -> dict:
    if any(method.get(f"vanilla_{key}") is None for key in PAIRED_TIMES):
        return vanilla
    return {**vanilla, **{key: method[f"vanilla_{key}"] for key in PAIRED_TIMES}, "paired": True}


def _timing_basis(pairs: list[tuple[dict, dict]]) -> str:
    """'paired' (every speed pair timed side by side), 'runs' (vanilla's own run), or 'mixed'."""
    paired = sum(bool(v.get("paired")) for _, v in pairs)
    return "paired" if paired == len(pairs) else "runs" if paired == 0 else "mixed"


def _total(records: list[dict], key: str) -> float:
    missing = [r.get("doc_id") for r in records if r.get(key) is None]
    if missing:
        raise ValueError(f"decode-stats records of docs {missing[:5]} lack {key!r}; expected the fields in report.py")
    return float(sum(float(r[key]) for r in records))


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else float("nan")


def _accepted(rec: dict) -> float:
    """Draft tokens accepted over the whole sample (from tau x steps if the list is missing)."""
    if rec.get("accepted_lengths") is not None:
        return float(sum(rec["accepted_lengths"]))
    return float(rec.get("tau") or 0.0) * float(rec.get("num_steps") or 0)


SPEEDUPS = {"e2e": "e2e_s", "decode": "decode_s"}  # figure -> the per-request seconds it compares


def speed_fields(pairs: list[tuple[dict, dict]], opts: ReportOptions = ReportOptions()) -> dict:
    """tau pools all steps of all timed samples (a long answer weighs more, as in the papers).
    Each speedup (SPEEDUPS) is the median of per-request ratios vanilla / method with its
    percentile bootstrap interval (judges.stats.speedup_interval: one stalled request cannot
    decide it), the ratio of summed seconds beside it (<figure>_speedup_total), and a verdict
    ("faster", "slower", "no clear difference" when the interval holds 1.0)."""
    nan = float("nan")
    if not pairs:
        out = {"n_timed": 0, "tau": nan, "tokens_per_step": nan, "decode_tokens_per_s": nan, "timing": None,
               "retimed": 0}
        for figure in SPEEDUPS:
            out.update({f"{figure}_speedup": nan, f"{figure}_speedup_ci": [nan, nan], f"{figure}_speedup_total": nan,
                        f"{figure}_verdict": None})
        return out
    method = [m for m, _ in pairs]
    vanilla = [v for _, v in pairs]
    tau = _ratio(sum(map(_accepted, method)), _total(method, "num_steps"))
    out = {
        "n_timed": len(pairs),
        "tau": tau,
        "tokens_per_step": tau + 1.0,
        "decode_tokens_per_s": _ratio(_total(method, "num_new_tokens"), _total(method, "decode_s")),
        "timing": _timing_basis(pairs),
        # pairs where one arm's prefill was stalled and that arm decoded again (decoding/runner.timed_pair)
        "retimed": sum(bool(m.get("retimed")) for m in method),
    }
    for figure, key in SPEEDUPS.items():
        total = _ratio(_total(vanilla, key), _total(method, key))  # raises when a record lacks the field
        s = stats.speedup_interval([float(v[key]) for v in vanilla], [float(m[key]) for m in method],
                                   n_boot=opts.n_boot, alpha=opts.alpha, seed=opts.seed)
        out.update({f"{figure}_speedup": s.median, f"{figure}_speedup_ci": [s.lo, s.hi],
                    f"{figure}_speedup_total": total,
                    f"{figure}_verdict": s.verdict})
    # the per-request seconds (vanilla, method), so that task groups can pool requests (report_overview)
    out["e2e_paired_s"] = [[float(v["e2e_s"]), float(m["e2e_s"])] for m, v in pairs]
    return out


def exact_match(run: TaskRun, vanilla: TaskRun, ids: tuple) -> tuple[float, str]:
    """Token ids when every paired sample has them on both sides, else the logged responses."""
    recs = [(run.stats.get(i) or {}, vanilla.stats.get(i) or {}) for i in ids]
    if ids and all(m.get("tokens") is not None and v.get("tokens") is not None for m, v in recs):
        rate = stats.exact_match_rate([m["tokens"] for m, _ in recs], [v["tokens"] for _, v in recs])
        return rate, "tokens"
    method_text = [_response_text(run.samples[i]) for i in ids]
    return stats.exact_match_rate(method_text, [_response_text(vanilla.samples[i]) for i in ids]), "text"


FACTS_KEY = "facts_right"  # a per-sample metric dict may list the facts its answer got right (synthvid captions)


def _facts_right(sample: dict) -> set[str] | None:
    for value in sample.values():
        if isinstance(value, Mapping) and isinstance(value.get(FACTS_KEY), list):
            return set(value[FACTS_KEY])
    return None


def fact_errors(run: TaskRun, vanilla: TaskRun, ids: tuple) -> tuple[int | None, float | None]:
    """(facts vanilla's answer had right that the method's lost, their share of vanilla's right
    facts) over the paired docs, for tasks whose samples log FACTS_KEY lists; (None, None) else."""
    lost = right = 0
    for i in ids:
        mine, theirs = _facts_right(run.samples[i]), _facts_right(vanilla.samples[i])
        if mine is None or theirs is None:
            return None, None
        lost += len(theirs - mine)
        right += len(theirs)
    return (lost, lost / right if right else None) if ids else (None, None)


def _response_text(sample: dict) -> str:
    return json.dumps(sample.get("filtered_resps", sample.get("resps")), ensure_ascii=False)


def quality_fields(run: TaskRun, vanilla: TaskRun, metric: str, opts: ReportOptions) -> dict:
    paired = stats.pair_by_id(sample_scores(run, metric), sample_scores(vanilla, metric))
    margins = sorted({*REPORTED_MARGINS, opts.margin})
    cmp = stats.compare_quality(paired, margins=margins, n_boot=opts.n_boot, alpha=opts.alpha, seed=opts.seed)
    by_margin = {f"{ni.margin:g}": ni.non_inferior for ni in cmp.non_inferiority}
    rate, basis = exact_match(run, vanilla, paired.ids)
    lost, error_rate = fact_errors(run, vanilla, paired.ids)
    is_baseline = run.method == opts.baseline
    return {
        "n": paired.n,
        "metric": metric,
        "quality": float(paired.method.mean()) if paired.n else float("nan"),
        "vanilla_quality": float(paired.vanilla.mean()) if paired.n else float("nan"),
        "retention": cmp.retention.estimate,
        "retention_ci": [cmp.retention.lo, cmp.retention.hi],
        "non_inferior": by_margin[f"{opts.margin:g}"],
        "margin": opts.margin,
        "non_inferior_by_margin": by_margin,
        "exact_match_rate": rate,
        "exact_match_basis": basis,
        "facts_lost": lost,
        "fact_error_rate": error_rate,
        "test": None if is_baseline else cmp.test.test,
        "zero_method": None if is_baseline else cmp.test.zero_method,
        "p_value": None if is_baseline else cmp.test.p_value,
    }


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
    row.update(speed_fields(pairs, opts))
    if run.method == opts.baseline:  # against itself: no verdict to give
        row.update(e2e_verdict=None, decode_verdict=None)
    row.update(quality_fields(run, vanilla, metric, opts))
    if run.lossless and run.method != opts.baseline:
        row["divergence"] = divergence.row_fields(run.stats, vanilla.stats)
    row["policy"] = report_policy.policy_fields(run.stats.values())
    row.update(sample_shape([m for m, _ in pairs]))
    return row


def sample_shape(records: list[dict]) -> dict:
    """Mean visual tokens and answer length of the timed samples (the leaderboard's task groups), and
    the mean seconds per phase of a request (report_overview.PHASES)."""
    def mean(key: str) -> float:
        values = [float(r[key]) for r in records if isinstance(r.get(key), (int, float))]
        return sum(values) / len(values) if values else float("nan")

    return {"visual_tokens": mean("visual_tokens"), "mean_new_tokens": mean("num_new_tokens"),
            "time_breakdown": report_overview.breakdown_fields(records)}


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


# ----------------------------------------------------------------------------------------- output


def _num(x, fmt: str = ".3f", suffix: str = "") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:{fmt}}{suffix}"


def _speedup_cell(r: dict, figure: str) -> str:
    return report_overview.speed_text(r[f"{figure}_speedup"], r.get(f"{figure}_speedup_ci"))


def _retention_cell(r: dict) -> str:
    lo, hi = r["retention_ci"]
    return f"{_num(r['retention'])} [{_num(lo)}, {_num(hi)}]"


COLUMNS = (
    ("task", lambda r: r["task"]),
    ("method", lambda r: r["method"]),
    ("lossless", lambda r: "yes" if r["lossless"] else "no"),
    ("n", lambda r: str(r["n"])),
    ("failed", lambda r: str(r["failed"])),
    ("tau", lambda r: _num(r["tau"], ".2f")),
    ("tokens/step", lambda r: _num(r["tokens_per_step"], ".2f")),
    ("e2e speedup [CI]", lambda r: _speedup_cell(r, "e2e")),
    ("e2e summed", lambda r: _num(r.get("e2e_speedup_total"), ".2f", "x")),
    ("e2e verdict", lambda r: r.get("e2e_verdict") or "-"),
    ("decode speedup [CI]", lambda r: _speedup_cell(r, "decode")),
    ("timing", lambda r: r.get("timing") or "-"),
    ("decode tok/s", lambda r: _num(r["decode_tokens_per_s"], ".1f")),
    ("metric", lambda r: r["metric"]),
    ("quality", lambda r: _num(r["quality"], ".4f")),
    ("retention [95% CI]", _retention_cell),
    ("non-inferior", lambda r: f"{'yes' if r['non_inferior'] else 'no'} @{r['margin']:.0%}"),
    ("exact match", lambda r: _num(r["exact_match_rate"], ".1%")),
    ("facts lost", lambda r: "-" if r.get("facts_lost") is None else f"{r['facts_lost']} ({_num(r['fact_error_rate'], '.1%')})"),
    ("test", lambda r: r["test"] or "-"),
    ("p", lambda r: _num(r["p_value"], ".3g")),
    ("p (Holm)", lambda r: _num(r["p_holm"], ".3g")),
)


def table_cells(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    return [h for h, _ in COLUMNS], [[cell(r) for _, cell in COLUMNS] for r in rows]


def markdown_table(rows: list[dict]) -> str:
    headers, cells = table_cells(rows)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(c) + " |" for c in cells])


def method_note(opts: ReportOptions) -> str:
    ci = f"{1 - opts.alpha:.0%}"
    return (
        f"Baseline: {opts.baseline}. Speedups are medians over the samples both runs timed of the per-request "
        f"ratio baseline time / method time, with a {1 - opts.alpha:.0%} percentile bootstrap interval "
        f"({opts.n_boot} resamples; 'no clear difference' when it holds 1.0), the ratio of summed times beside "
        "them (decode excludes prefill, pruning and draft prefill; e2e includes them); timing: 'paired' when the "
        "baseline was decoded beside each request in the method's own process (model_arg paired_timing=true), "
        "'runs' when its own run's times are used. tau = accepted draft tokens "
        "per step, bonus token excluded; tokens/step = tau + 1. Retention = mean(method) / mean(baseline) on "
        f"paired samples with a {ci} paired BCa bootstrap interval ({opts.n_boot} resamples); non-inferior when "
        f"its lower bound >= 1 - margin. p: McNemar exact test for 0/1 metrics, else Wilcoxon signed-rank "
        "(zero differences split); Holm-corrected across the methods of a task."
    ) + (
        f" The last tasks ({', '.join(opts.length_tasks)}) repeat a task at other video lengths, a few samples "
        "each, for the speedup-vs-visual-tokens plot."
        if opts.length_tasks
        else ""
    )


LEADERBOARD_NOTE = (
    "A cell: end-to-end speedup over the baseline (wall clock from request to answer, preprocessing and every "
    "prefill included: the median over requests of the baseline's time / the method's, both timed side by side), "
    "below it its percentile bootstrap interval, then retention (quality / the baseline's). '≈1 (1.02x)': the "
    "interval holds 1.0, no clear difference (neither a gain nor a loss). Task-group cells: the median over the "
    "group's requests pooled, with its interval, and the lowest retention of the group's tasks; groups: "
    "multiple choice = answers of at most "
    f"{report_overview.SHORT_ANSWER_TOKENS} tokens, long videos = at least {report_overview.LONG_VIDEO_TOKENS} "
    "visual tokens. tau: mean accepted draft tokens per step (bonus excluded), averaged over tasks. Overall: "
    "geometric means over the method's tasks; decode overall counts the decoding loop only."
)
BREAKDOWN_NOTE = (
    "Mean milliseconds per sample in each phase of a request, over the method's timed samples: preprocessing "
    "(video decoding, processor), the target's prefill, the draft's preparation (its vision tower and prefill), "
    "pruning the draft's visual tokens, decoding; other = the measured end-to-end time minus these."
)


def summary_sections(rows: list[dict], opts: ReportOptions) -> list[Section]:
    """Which method to use per task, then the failures and divergences (if any)."""
    picks = report_overview.recommend(rows, opts.baseline, opts.lossless_tasks)
    issues = report_overview.problems(rows, opts.baseline)
    note = (f"Per task, the fastest method end to end among those whose retention interval clears the "
            f"{opts.margin:.0%} non-inferiority margin and whose end-to-end speedup interval lies above 1.0; the baseline ({opts.baseline}, 1.00x) always qualifies"
            + (f"; lossless required on {', '.join(opts.lossless_tasks)}" if opts.lossless_tasks else "") + ".")
    table = Table(report_overview.RECOMMEND_HEADERS, report_overview.recommend_cells(picks), element_id="recommended")
    out = [Section("Summary: which method to use", tables=[table], notes=[note], element_id="summary")]
    if issues:
        out.append(Section("Failures and divergences", bullets=issues, element_id="problems"))
    return out


def table_sections(rows: list[dict], opts: ReportOptions) -> list[Section]:
    """The compact leaderboard, the time breakdown, then the full tables, collapsed."""
    headers, cells = report_overview.leaderboard(rows, opts.baseline, opts.n_boot, opts.alpha, opts.seed)
    main = [r for r in rows if r["task"] not in opts.length_tasks]
    lengths = [r for r in rows if r["task"] in opts.length_tasks]
    out = [Section("Leaderboard: end-to-end speedup and retention", tables=[Table(headers, cells, css="leaderboard",
                                                                                element_id="leaderboard")],
                   notes=[LEADERBOARD_NOTE], element_id="board"),
           Section("Where the time goes", tables=[Table(report_overview.BREAKDOWN_HEADERS,
                                                        report_overview.breakdown_cells(rows, opts.baseline))],
                   notes=[BREAKDOWN_NOTE]),
           Section("All figures, per task and method", [method_note(opts)],
                   [Table(*table_cells(main), css="wide", element_id="full-table")], collapsed=True)]
    if lengths:
        out.append(Section("Length stage: the same task at other video lengths",
                           ["A few samples per length, for the speedup-vs-visual-tokens plot."],
                           [Table(*table_cells(lengths), css="wide", element_id="length-table")], collapsed=True))
    return out


def detail_sections(rows: list[dict], plots: list[report_plots.Plot]) -> list[Section]:
    out = []
    div_cells = divergence.table_cells(rows)
    if div_cells:
        diverged = any((r.get("divergence") or {}).get("diverged") for r in rows)
        out.append(Section(divergence.SECTION_TITLE + ("" if diverged else ": none"), [divergence.SECTION_NOTE],
                           [Table(list(divergence.TABLE_HEADERS), div_cells, css="wide")], collapsed=not diverged))
    policy_cells = report_policy.table_cells(rows)
    if policy_cells:
        out.append(Section(report_policy.TITLE, [report_policy.NOTE],
                           [Table(report_policy.HEADERS, policy_cells, css="wide")], collapsed=True))
    figures = [(p.path, p.caption) for p in plots if p.path]
    if figures:
        out.append(Section("Plots", figures=figures))
    out += [Section(p.caption, tables=[Table(*p.table)], collapsed=True) for p in plots if p.table]
    return out


def page_sections(rows: list[dict], plots: list[report_plots.Plot], opts: ReportOptions) -> list[Section]:
    return [*summary_sections(rows, opts), *table_sections(rows, opts), *detail_sections(rows, plots)]


TITLE = "lvspec-eval leaderboard"


def json_safe(x):
    """NaN and infinity become null: strict JSON readers reject them."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, Mapping):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def plot_input(
    rows: list[dict], runs: dict[tuple[str, str], TaskRun], opts: ReportOptions, out_dir: Path
) -> report_plots.PlotInput:
    pairs = {
        (task, method): timed_pairs(run, runs[(task, opts.baseline)])
        for (task, method), run in runs.items()
        if (task, opts.baseline) in runs
    }
    return report_plots.PlotInput(
        rows=json_safe(rows), pairs=pairs, baseline=opts.baseline, out_dir=out_dir, length_tasks=tuple(opts.length_tasks)
    )


class _WarningCollector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def make_options(options: Mapping) -> ReportOptions:
    allowed = [f.name for f in fields(ReportOptions)]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"unknown report option(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")
    values = {k: v for k, v in options.items() if v is not None}
    if "length_tasks" in values:
        values["length_tasks"] = tuple(values["length_tasks"])
    return ReportOptions(**values)


def summary_dict(rows: list[dict], plots: list[report_plots.Plot], opts: ReportOptions, warnings: list[str]) -> dict:
    """summary.json's content (schema in the module docstring), JSON-safe."""
    plot_entries = [
        {"name": p.name, "path": p.path.name if p.path else None, "caption": p.caption, **p.extra} for p in plots
    ]
    picks = report_overview.recommend(rows, opts.baseline, opts.lossless_tasks)
    headline = {
        "recommended": [{"task": p["task"], "method": p["row"]["method"], "e2e_speedup": p["row"]["e2e_speedup"],
                         "decode_speedup": p["row"]["decode_speedup"], "retention": p["row"]["retention"],
                         "retention_ci": p["row"]["retention_ci"], "reason": p["reason"]} for p in picks],
        "overall": report_overview.overall(rows),
    }
    return json_safe(
        {
            "version": 1,
            "headline": headline,
            "baseline": opts.baseline,
            "alpha": opts.alpha,
            "n_boot": opts.n_boot,
            "rows": rows,
            "plots": plot_entries,
            "warnings": warnings,
        }
    )


def write_outputs(summary: dict, plots: list[report_plots.Plot], opts: ReportOptions, out_dir: Path) -> None:
    sections = page_sections(summary["rows"], plots, opts)
    intro = f"Baseline: {opts.baseline}. Built from saved runs by lvspec-eval report."
    (out_dir / "leaderboard.md").write_text(report_html.render_markdown(TITLE, intro, sections), encoding="utf-8")
    (out_dir / "leaderboard.html").write_text(report_html.render_html(TITLE, intro, sections), encoding="utf-8")
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n", encoding="utf-8")


def build_report(run_dirs: list[Path], out_dir: Path, baseline_run: Path | None = None, **options) -> dict:
    """Read the runs, write leaderboard.md/.html, summary.json and the plots to out_dir, and
    return the summary. Options: see ReportOptions. Warnings (missing stats, duplicate runs...)
    are logged and kept in summary["warnings"]. baseline_run: a run of lmms-eval's own model class,
    the quality baseline (lvspec_eval/reporting/baseline_run.py)."""
    opts = make_options(options)
    out_dir = Path(out_dir)
    collector = _WarningCollector()
    PACKAGE_LOG.addHandler(collector)
    try:
        runs = discover([Path(d) for d in run_dirs])
        if baseline_run is not None:
            runs.update(baseline_runs.load(baseline_run, runs, opts.baseline))
            opts = replace(opts, baseline=baseline_runs.NAME)
        rows = build_rows(runs, opts)
        out_dir.mkdir(parents=True, exist_ok=True)
        plots = report_plots.draw_all(plot_input(rows, runs, opts, out_dir)) if opts.plots else []
    finally:
        PACKAGE_LOG.removeHandler(collector)
    summary = summary_dict(rows, plots, opts, collector.messages)
    write_outputs(summary, plots, opts, out_dir)
    if opts.echo:  # the collector kept the warnings from logging's stderr fallback: show them here
        opening = [*summary_sections(summary["rows"], opts), table_sections(summary["rows"], opts)[0]]
        print("\n\n".join(report_html.section_markdown(section) for section in opening))
        for message in summary["warnings"]:
            print(f"warning: {message}", file=sys.stderr)
    return summary


# -------------------------------------------------------------------------------------------- CLI


def parse_metric_overrides(items: list[str] | None) -> dict[str, str]:
    out = {}
    for item in items or []:
        task, sep, metric = item.partition("=")
        if not sep or not task or not metric:
            raise ValueError(f"--metric {item!r}; expected TASK=METRIC, e.g. videomme=videomme_perception_score")
        out[task] = metric
    return out


def _run(args: argparse.Namespace) -> int:
    build_report(
        args.runs,
        args.output,
        metrics=parse_metric_overrides(args.metric),
        margin=args.margin,
        n_boot=args.n_boot,
        alpha=args.alpha,
        seed=args.seed,
        baseline=args.baseline,
        baseline_run=args.baseline_run,
        echo=True,
        plots=not args.no_plots,
        length_tasks=tuple(t for t in (args.length_tasks or "").split(",") if t),
        lossless_tasks=tuple(t for t in (args.lossless_tasks or "").split(",") if t),
    )
    print(f"wrote {args.output / 'leaderboard.md'}, leaderboard.html, summary.json")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("report", help="leaderboard (markdown, HTML, plots, summary.json) from lmms-eval runs")
    p.add_argument(
        "runs",
        nargs="+",
        type=Path,
        metavar="RUN",
        help="lmms-eval --output_path folders (typically one per method, vanilla among them)",
    )
    p.add_argument("-o", "--output", type=Path, required=True, metavar="DIR")
    p.add_argument(
        "--metric",
        action="append",
        metavar="TASK=NAME",
        help="the quality metric of a task (default: its first metric); repeatable",
    )
    p.add_argument("--margin", type=float, default=0.01, help="non-inferiority margin (0.01 = 1%%)")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples of the retention interval")
    p.add_argument("--alpha", type=float, default=0.05, help="1 - confidence of the retention interval")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--baseline", default="vanilla", help="the method every row is compared with")
    p.add_argument("--baseline-run", type=Path, metavar="DIR",
                   help="a run of lmms-eval's own model class (--output_path with --log_samples): the quality "
                   "baseline, row `lmms-eval`; speed stays against vanilla")
    p.add_argument("--no-plots", action="store_true", help="skip the PNGs (tables and summary.json only)")
    p.add_argument(
        "--length-tasks",
        default="",
        metavar="T1,T2,...",
        help="tasks that vary only video length: listed last, in this order, and left out of the retention panels",
    )
    p.add_argument("--lossless-tasks", default="", metavar="T1,T2,...",
                   help="tasks whose recommended method (the report's summary) must reproduce the baseline exactly")
    p.set_defaults(func=_run)

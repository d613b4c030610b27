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

How figures are computed: speed in speed.py, quality in quality.py, the rows in rows.py, the
pages' sections in sections.py, the options in options.py.

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
   sparrow, "custom:<drafter>+exact", or any method run with verifier=exact), "n" (paired samples),
   "n_timed", "cold_starts" (error-free pairs left out of speed as a process's first request), "failed",
   "tau", "tokens_per_step", "e2e_speedup" and "decode_speedup" (medians of per-request ratios baseline /
   method of seconds per generated token: speed.py), "e2e_speedup_ci" and "decode_speedup_ci" ([lo, hi],
   order statistics; [1, 1] for the baseline), "e2e_speedup_total" and "decode_speedup_total" (ratios of
   summed seconds per token), "e2e_verdict" and "decode_verdict" ("faster", "slower", "no clear
   difference", "too few requests"; null for the baseline), "e2e_request_speedup" and
   "e2e_request_speedup_ci" (per request, whatever the answers' lengths), "length_ratio" (method tokens /
   baseline tokens), "e2e_paired_s_per_token" ([[baseline, method] seconds per generated token, ...] per
   timed request), "retimed" (pairs decoded again after a
   stall, decoding/runner.timed_pair), "untimed" (requests left out of the speed figures: stalled twice), "timing", "decode_tokens_per_s", "quality",
   "vanilla_quality", "metric", "protocol" (the scoring protocol the task's samples name, e.g. VDC's
   "vdcscore-per-dimension" or "lmms-eval-hub"; null when they name none), "retention", "retention_ci": [lo, hi], "non_inferior",
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
   draft_prepare_s, else draft_prefill_s + draft_vision_s, prune_s, decode_s, e2e_s), "e2e",
   "new_tokens" and "n", over the timed requests; "baseline_time_breakdown" the same of the baseline
   arms those requests were compared with (the paired vanilla decodes where timing is paired)],
 "length_pooled": [{"method", "n", "e2e_speedup", "e2e_speedup_ci", "e2e_verdict", "tasks"}] (each
   method's length-task rows pooled; [] without length tasks),
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
from dataclasses import replace
from pathlib import Path

from lvspec_eval.reporting import baseline_run as baseline_runs
from lvspec_eval.reporting import overview as report_overview
from lvspec_eval.reporting import page as report_html
from lvspec_eval.reporting import plots as report_plots
from lvspec_eval.reporting.divergence import divergence_summary  # noqa: F401  (for `check` and callers holding records)
from lvspec_eval.reporting.options import ReportOptions, make_options
from lvspec_eval.reporting.quality import score_value  # noqa: F401  (public name)
from lvspec_eval.reporting.rows import (  # noqa: F401  (public names)
    build_rows,
    note_load_choices,
    task_order,
    warn_machines,
)
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
from lvspec_eval.reporting.sections import (
    TITLE,
    length_pooled,
    page_sections,
    summary_sections,
    table_sections,
)
from lvspec_eval.reporting.speed import timed_pairs

log = logging.getLogger(__name__)
# build_report collects the warnings of every module of the package (loading, plots...) into summary.json
PACKAGE_LOG = logging.getLogger(__name__.rpartition(".")[0])


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
        message = record.getMessage()
        if message not in self.messages:  # a file two runs share (a stats_path) is read, and warned about, per run
            self.messages.append(message)


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
            "length_pooled": length_pooled(rows, opts) if opts.length_tasks else [],
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

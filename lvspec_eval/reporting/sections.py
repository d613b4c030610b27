"""The report's pages as sections: the summary, the leaderboard, the time breakdown, the full
tables, then the details (divergence, policy, plots). Rendered by page.py (markdown and HTML)."""

from __future__ import annotations

import math

from lvspec_eval.reporting import divergence
from lvspec_eval.reporting import overview as report_overview
from lvspec_eval.reporting import plots as report_plots
from lvspec_eval.reporting import policy as report_policy
from lvspec_eval.reporting.options import ReportOptions
from lvspec_eval.reporting.page import Section, Table


def _num(x, fmt: str = ".3f", suffix: str = "") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:{fmt}}{suffix}"


def _speedup_cell(r: dict, figure: str) -> str:
    return report_overview.speed_text(r[f"{figure}_speedup"], r.get(f"{figure}_speedup_ci"), r.get(f"{figure}_verdict"))


def answers_differ(r: dict) -> bool:
    """Whether the method's answers may differ from the baseline's (then its per-request speedup and
    answer-length ratio are shown beside the per-token one)."""
    return not r.get("lossless") or r.get("exact_match_rate") not in (1.0, None)


def _per_request_cell(r: dict) -> str:
    """'1.18x (1.40)': the median per-request speedup and the answer-length ratio (method / baseline)."""
    if not answers_differ(r):
        return "-"
    return f"{_num(r.get('e2e_request_speedup'), '.2f', 'x')} ({_num(r.get('length_ratio'), '.2f')})"


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
    ("per request (length)", _per_request_cell),
    ("decode speedup [CI]", lambda r: _speedup_cell(r, "decode")),
    ("timing", lambda r: r.get("timing") or "-"),
    ("timed (cold)", lambda r: f"{r.get('n_timed', '-')} ({r.get('cold_starts', '-')})"),
    ("decode tok/s", lambda r: _num(r["decode_tokens_per_s"], ".1f")),
    ("metric", lambda r: r["metric"] + (f" ({r['protocol']})" if r.get("protocol") else "")),
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
        f"Baseline: {opts.baseline}. Speed is per generated token, prefill included: per request, the baseline's "
        "seconds per generated token / the method's; speedups are the medians of these over the requests both runs "
        f"timed, with a {ci} distribution-free interval from order statistics (binomial; 'too few requests' "
        "below 6 requests, 'no clear difference' when it holds 1.0), the ratio of summed seconds per token beside "
        "them (decode excludes prefill, pruning and draft prefill; e2e includes them). A shorter answer is never a "
        "speedup: where a method's answers may differ from the baseline's, 'per request (length)' gives the "
        "median per-request speedup and the answer-length ratio (method tokens / baseline tokens). timing: "
        "'paired' when the baseline was decoded beside each request in the method's own process (model_arg "
        "paired_timing=true), 'runs' when its own run's times are used; each process's first (cold-start) request "
        "is left out of speed and counted in 'timed (cold)'. tau = accepted draft tokens "
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
    "A cell: end-to-end speedup over the baseline per generated token (wall clock from request to answer, "
    "preprocessing and every prefill included, divided by the tokens generated: the median over requests of the "
    "baseline's time per token / the method's, both timed side by side), below it its distribution-free interval "
    "('too few requests' where there are fewer than 6), then retention (quality / the baseline's). '≈1 (1.02x)': the "
    "interval holds 1.0, no clear difference (neither a gain nor a loss). Task-group cells: the median over the "
    "group's requests pooled, with its interval, and the lowest retention of the group's tasks; groups: "
    "multiple choice = answers of at most "
    f"{report_overview.SHORT_ANSWER_TOKENS} tokens, long videos = at least {report_overview.LONG_VIDEO_TOKENS} "
    "visual tokens. tau: mean accepted draft tokens per step (bonus excluded), averaged over tasks. Overall: "
    "geometric means over the method's tasks; decode overall counts the decoding loop only."
)
BREAKDOWN_NOTE = (
    "Mean milliseconds per request in each phase, over the requests the leaderboard's speedups use (each "
    "process's first, cold-start request left out: counted in brackets): preprocessing (video decoding, "
    "processor), the target's prefill, the draft's preparation (its vision tower and prefill), pruning the "
    "draft's visual tokens, decoding; other = the measured end-to-end time minus these. baseline ms/token: the "
    "baseline arms each method was compared with, on the same requests (the vanilla decodes beside the method's "
    "where timing is paired; the baseline's own line, '(own run)', is its own process): baseline ms/token over "
    "ms/token is the method's summed per-token speedup (the full table's 'e2e summed')."
)
LENGTH_NOTE = (
    "A few samples per length, for the speedup-vs-visual-tokens plot: too few for an interval per length "
    "('too few requests' below 6). The pooled table puts each method's requests of every length together "
    "(the median of their per-token ratios, with its interval): a verdict over all lengths, not per length."
)
LENGTH_POOLED_HEADERS = ["method", "requests", "e2e speedup, all lengths pooled", "verdict"]


def length_pooled(rows: list[dict], opts: ReportOptions) -> list[dict]:
    """Per method but the baseline, its length rows pooled: {"method", "n", "e2e_speedup", "e2e_speedup_ci",
    "e2e_verdict", "tasks"} (summary.json's "length_pooled")."""
    out = []
    for m in dict.fromkeys(r["method"] for r in rows if r["task"] in opts.length_tasks):
        mine = [r for r in rows if r["method"] == m and r["task"] in opts.length_tasks]
        if m == opts.baseline or len(mine) < 2:
            continue
        speed, ci, verdict = report_overview.pooled_speedup(mine, opts.alpha)
        out.append({"method": m, "n": sum(r.get("n_timed") or 0 for r in mine), "e2e_speedup": speed,
                    "e2e_speedup_ci": ci, "e2e_verdict": verdict, "tasks": [r["task"] for r in mine]})
    return out


def length_pooled_cells(pooled: list[dict]) -> list[list[str]]:
    return [[p["method"], str(p["n"]), report_overview.speed_text(p["e2e_speedup"], p["e2e_speedup_ci"], p["e2e_verdict"]),
             p["e2e_verdict"] or "-"] for p in pooled]


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
    headers, cells = report_overview.leaderboard(rows, opts.baseline, opts.alpha)
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
        pooled = Table(LENGTH_POOLED_HEADERS, length_pooled_cells(length_pooled(rows, opts)), element_id="length-pooled")
        out.append(Section("Length stage: the same task at other video lengths", [LENGTH_NOTE],
                           [pooled, Table(*table_cells(lengths), css="wide", element_id="length-table")],
                           collapsed=True))
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

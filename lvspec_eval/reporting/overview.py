"""The report's first screen: which method to use per task, a compact leaderboard, where time goes.

Everything here reads the rows rows.py builds (summary.json's "rows"), nothing else:
- recommend(): per task, the fastest method end to end among those shown non-inferior at the
  report's margin and clearly faster than the baseline (the interval of their end-to-end speedup
  above 1.0; the baseline always qualifies, at 1.00x), leaving out rows with failed samples
  or divergences that are not near-ties, and, for the tasks named in `lossless_tasks`, rows that are
  not lossless token for token.
- leaderboard(): methods as rows, task columns (or task groups when there are more than
  MAX_TASK_COLUMNS tasks), a cell = end-to-end speedup per generated token (the median of
  per-request ratios, speed.py), its order-statistic interval, and retention; then mean tau and the
  overall end-to-end and decode speedups (geometric means over the tasks). A group cell pools its
  tasks' requests (the median of all their ratios, with its interval) and shows the LOWEST retention
  of its tasks. A speedup whose interval holds 1.0 reads "≈1 (1.02x)": no clear difference, neither
  a gain nor a loss; one without an interval (under 6 requests) "(1.10x) too few requests".
- breakdown_cells(): mean milliseconds per request in each phase, per leaderboard column and method,
  over the requests the speedups use, with the baseline arms those speedups compare with beside it,
  and the engine's own cost per decode step (host work outside the forwards, host synchronisations).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from judges import stats

MAX_TASK_COLUMNS = 4  # more tasks than this: one column per task group
LONG_VIDEO_TOKENS = 1024  # a task whose samples average at least this many visual tokens is a long-video task
SHORT_ANSWER_TOKENS = 8  # a task whose baseline answers average at most this many tokens is multiple choice
# The leaderboard must fit a 1280 px window: at most this many columns, no cell line longer than
# CELL_CHARS characters (the method column: METHOD_CHARS); tests/test_report_page.py holds it to it.
COLUMN_BUDGET = 8
CELL_CHARS = 16
METHOD_CHARS = 24
GROUPS = ("short videos", "long videos", "multiple choice")
PHASES = ("preprocess", "target prefill", "draft preparation", "pruning", "decode", "other")
TOO_FEW = "too few requests"  # judges.stats.SpeedupInterval.verdict without an interval
# per decode step, from the stats records (decoding/stats.py): the host work outside the models'
# forwards, and the host synchronisations the engine's own code made (decoding/host_sync.py)
STEP_FIELDS = {"host_ms_per_step": "overhead_step_ms", "host_syncs_per_step": "host_syncs_per_step"}
PAIRED_KEY = "e2e_paired_s_per_token"  # a row's [[baseline, method] seconds per generated token] per request


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _x(x) -> str:
    return f"{x:.2f}x" if _finite(x) else "-"


def _f(x, fmt: str = ".3f") -> str:
    return f"{x:{fmt}}" if _finite(x) else "-"


def geomean(values: Iterable[float]) -> float:
    kept = [v for v in values if _finite(v) and v > 0]
    return math.exp(sum(map(math.log, kept)) / len(kept)) if kept else float("nan")


# ------------------------------------------------------------------------------ per-sample phases


def phase_seconds(rec: Mapping) -> dict[str, float]:
    """A stats record's wall clock split into PHASES. Newer records carry draft_prepare_s (all
    draft-side work, pruning included) and a measured e2e_s; older ones draft_prefill_s only."""
    prune = float(rec.get("prune_s") or 0.0)
    if rec.get("draft_prepare_s") is not None:
        draft = float(rec["draft_prepare_s"]) - prune
    else:
        draft = float(rec.get("draft_prefill_s") or 0.0) + float(rec.get("draft_vision_s") or 0.0)
    out = {"preprocess": float(rec.get("preprocess_s") or 0.0), "target prefill": float(rec.get("prefill_s") or 0.0),
           "draft preparation": draft, "pruning": prune, "decode": float(rec.get("decode_s") or 0.0)}
    e2e = float(rec.get("e2e_s") or sum(out.values()))
    out["other"] = max(e2e - sum(out.values()), 0.0)
    out["e2e"] = e2e
    return out


def breakdown_fields(records: list[Mapping]) -> dict | None:
    """Mean seconds per sample in each phase (and end to end) over the given timed records, their
    mean generated tokens ("new_tokens") and their number ("n", to pool rows by)."""
    if not records:
        return None
    per = [phase_seconds(r) for r in records]
    out = {k: sum(p[k] for p in per) / len(per) for k in (*PHASES, "e2e")}
    tokens = [max(1.0, float(r.get("num_new_tokens") or 0)) for r in records]
    for key, field in STEP_FIELDS.items():  # the engine's own cost per decode step, where recorded
        values = [float(r[field]) for r in records if r.get("timed_steps") and _finite(r.get(field))]
        if len(values) == len(records):
            out[key] = sum(values) / len(values)
    return {**out, "new_tokens": sum(tokens) / len(tokens), "n": len(records)}


# ---------------------------------------------------------------------------------- task groups


def _by_task(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["task"], []).append(r)
    return out


def task_group(task_rows: list[dict], baseline: str) -> str:
    base = next((r for r in task_rows if r["method"] == baseline), task_rows[0])
    answer = base.get("mean_new_tokens")
    if _finite(answer) and answer <= SHORT_ANSWER_TOKENS:
        return "multiple choice"
    tokens = base.get("visual_tokens")
    return "long videos" if _finite(tokens) and tokens >= LONG_VIDEO_TOKENS else "short videos"


def columns(rows: list[dict], baseline: str) -> dict[str, list[str]]:
    """Column name -> its tasks: one per task when there are few, else the task groups."""
    tasks = _by_task(rows)
    if len(tasks) <= MAX_TASK_COLUMNS:
        return {t: [t] for t in tasks}
    out: dict[str, list[str]] = {g: [] for g in GROUPS}
    for task, task_rows in tasks.items():
        out[task_group(task_rows, baseline)].append(task)
    return {g: ts for g, ts in out.items() if ts}


# ------------------------------------------------------------------------------ recommendation


def qualifies(row: dict, lossless_tasks: Iterable[str]) -> bool:
    div = row.get("divergence") or {}
    if row.get("failed") or div.get("elsewhere") or not row.get("non_inferior"):
        return False
    if row["task"] in set(lossless_tasks):
        return bool(row.get("lossless")) and (row.get("exact_match_rate") == 1.0 or div.get("near_tie") == div.get("diverged"))
    return True


def recommend(rows: list[dict], baseline: str, lossless_tasks: Iterable[str] = ()) -> list[dict]:
    """Per task: the recommended row and why ({"task", "row", "reason"})."""
    out = []
    for task, task_rows in _by_task(rows).items():
        ok = [r for r in task_rows if r["method"] == baseline or (qualifies(r, lossless_tasks) and clearly_faster(r)
                                                                  and _finite(r.get("e2e_speedup")))]
        best = max(ok, key=lambda r: 1.0 if r["method"] == baseline else r["e2e_speedup"], default=None)
        if best is None:
            continue
        faster = best["method"] != baseline
        reason = "fastest non-inferior" if faster else "no non-inferior method is clearly faster"
        if task in set(lossless_tasks):
            reason += " and lossless"
        out.append({"task": task, "row": best, "reason": reason})
    return out


def clearly_faster(row: dict) -> bool:
    """Whether the row's end-to-end speedup interval lies above 1.0 (rows written before the report
    had intervals: their point estimate decides, as it did then)."""
    verdict = row.get("e2e_verdict")
    return verdict == "faster" if verdict is not None else True


def speed_text(speed, ci, verdict: str | None = None) -> str:
    """'1.46x [1.310, 1.620]', '≈1 (1.02x) [0.910, 1.130]' when the interval holds 1.0, '(1.10x) too few
    requests' when there is no interval."""
    return " ".join(speed_lines(speed, ci, verdict))


def speed_lines(speed, ci, verdict: str | None = None) -> list[str]:
    """A speedup and its interval as one or two short lines (a leaderboard cell's)."""
    lo, hi = ci or (None, None)
    if verdict == TOO_FEW and _finite(speed):  # a point estimate alone says neither faster nor slower
        return [f"({_x(speed)})", TOO_FEW]
    if not (_finite(lo) and _finite(hi)) or lo == hi == 1.0:  # no interval, or the baseline against itself
        return [_x(speed)]
    first = _x(speed) if lo > 1.0 or hi < 1.0 else f"≈1 ({_x(speed)})"
    return [first, f"[{lo:.3f}, {hi:.3f}]"]  # 3 decimals: a bound of 0.998 must not read as 1.00


def _retention(r: dict) -> str:
    lo, hi = r.get("retention_ci") or (None, None)
    return f"{_f(r.get('retention'))} [{_f(lo)}, {_f(hi)}]"


RECOMMEND_HEADERS = ["task", "use", "e2e speedup", "decode speedup", "retention [95% CI]", "why"]


def recommend_cells(picks: list[dict]) -> list[list[str]]:
    return [[p["task"], p["row"]["method"], _row_speed(p["row"], "e2e"), _row_speed(p["row"], "decode"),
             _retention(p["row"]), p["reason"]] for p in picks]


def _row_speed(row: dict, figure: str) -> str:
    return speed_text(row.get(f"{figure}_speedup"), row.get(f"{figure}_speedup_ci"), row.get(f"{figure}_verdict"))


def problems(rows: list[dict], baseline: str) -> list[str]:
    """Failed samples, divergences of exact methods, rows not shown non-inferior: one line each."""
    out = []
    for r in rows:
        name = f"{r['method']} on {r['task']}"
        if r.get("failed"):
            out.append(f"{name}: {r['failed']} failed sample(s)")
        div = r.get("divergence") or {}
        if div.get("diverged"):
            out.append(f"{name}: {div['diverged']} of {div.get('compared')} samples diverge from the baseline "
                       f"({div.get('near_tie')} near-tie, {div.get('elsewhere')} elsewhere: a bug)")
        if r["method"] != baseline and not r.get("non_inferior"):
            out.append(f"{name}: not shown non-inferior at {r.get('margin', 0):.0%} (retention {_retention(r)})")
    return out


# -------------------------------------------------------------------------------- leaderboard


def pooled_speedup(task_rows: list[dict], alpha: float = 0.05) -> tuple:
    """(speedup, [lo, hi], verdict) of some tasks' rows of one method: one row's own figures; several
    rows' requests pooled (the median of all their paired ratios of seconds per generated token, with
    its interval); rows without their requests' figures (older summaries): the geometric mean of
    their speedups, no interval."""
    if len(task_rows) == 1:
        r = task_rows[0]
        return r.get("e2e_speedup"), r.get("e2e_speedup_ci"), r.get("e2e_verdict")
    if not all(r.get(PAIRED_KEY) for r in task_rows):
        return geomean(r.get("e2e_speedup") for r in task_rows), None, None
    pairs = [p for r in task_rows for p in r[PAIRED_KEY]]
    s = stats.speedup_interval([v for v, _ in pairs], [m for _, m in pairs], alpha=alpha)
    return s.median, [s.lo, s.hi], s.verdict


def _cell(task_rows: list[dict], alpha: float, is_baseline: bool = False) -> str:
    if not task_rows:
        return "-"
    speed = ["1.00x"] if is_baseline else speed_lines(*pooled_speedup(task_rows, alpha))  # against itself: exactly 1
    retention = min((r["retention"] for r in task_rows if _finite(r.get("retention"))), default=float("nan"))
    return "\n".join([*speed, f"ret {_f(retention)}"])


def leaderboard(rows: list[dict], baseline: str, alpha: float = 0.05) -> tuple[list[str], list[list[str]]]:
    """(headers, cells): methods as rows, task (group) columns, then tau and the overall speedups.
    alpha: the interval of a group's pooled requests (the report's own)."""
    cols = columns(rows, baseline)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    headers = ["method", *cols, "tau", "e2e overall", "decode overall"]
    cells = []
    for m in methods:
        mine = [r for r in rows if r["method"] == m]
        tau = [r["tau"] for r in mine if _finite(r.get("tau"))]
        cells.append([m, *(_cell([r for r in mine if r["task"] in tasks], alpha, m == baseline) for tasks in cols.values()),
                      _f(sum(tau) / len(tau), ".2f") if tau else "-",
                      _x(geomean(r.get("e2e_speedup") for r in mine)), _x(geomean(r.get("decode_speedup") for r in mine))])
    return headers, cells


def overall(rows: list[dict]) -> dict[str, dict]:
    """method -> geometric-mean e2e and decode speedups over its tasks (summary.json's "headline")."""
    out = {}
    for m in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == m]
        out[m] = {"e2e_speedup": geomean(r.get("e2e_speedup") for r in mine),
                  "decode_speedup": geomean(r.get("decode_speedup") for r in mine), "tasks": len(mine)}
    return out


# ---------------------------------------------------------------------------------- breakdown


BREAKDOWN_HEADERS = ["tasks", "method", "requests (cold)", "host ms/step", "host syncs/step",
                     *(f"{p} ms" for p in PHASES), "e2e ms", "ms/token", "baseline ms/token"]


def pooled_breakdown(parts: list[dict]) -> dict:
    """Several rows' breakdowns as one: means over all their requests (each row weighs its n)."""
    n = sum(p.get("n", 1) for p in parts)
    out = {k: sum(p[k] * p.get("n", 1) for p in parts) / n for k in (*PHASES, "e2e")}
    for key in ("new_tokens", *STEP_FIELDS):
        if all(key in p for p in parts):
            out[key] = sum(p[key] * p.get("n", 1) for p in parts) / n
    return out


def ms_per_token(part: dict | None) -> float:
    """Mean end-to-end milliseconds per generated token of a (pooled) breakdown: summed seconds / summed tokens."""
    return 1000 * part["e2e"] / part["new_tokens"] if part and part.get("new_tokens") else float("nan")


def breakdown_cells(rows: list[dict], baseline: str) -> list[list[str]]:
    """Mean ms per sample, per column of the leaderboard (task or group) and method, over the requests
    its speedups use (cold starts apart), and beside it the baseline arms those speedups compare with
    (the paired vanilla decodes where timing was paired): baseline ms/token over ms/token is the row's
    summed per-token speedup, so this table and the leaderboard tell one story."""
    out = []
    for name, tasks in columns(rows, baseline).items():
        cell_rows = [r for r in rows if r["task"] in tasks]
        paired = any(r.get("timing") in ("paired", "mixed") for r in cell_rows)
        for m in dict.fromkeys(r["method"] for r in rows):
            mine = [r for r in cell_rows if r["method"] == m and r.get("time_breakdown")]
            if not mine:
                continue
            mean = pooled_breakdown([r["time_breakdown"] for r in mine])
            base = [r.get("baseline_time_breakdown") for r in mine]
            base_ms = ms_per_token(pooled_breakdown(base)) if all(base) else float("nan")
            label = f"{m} (own run)" if m == baseline and paired else m
            timed = sum(r["time_breakdown"].get("n", 0) for r in mine)
            cold = sum(r.get("cold_starts") or 0 for r in mine)
            out.append([name, label, f"{timed} ({cold})", _f(mean.get("host_ms_per_step"), ".2f"),
                        _f(mean.get("host_syncs_per_step"), ".1f"), *(f"{1000 * mean[k]:.1f}" for k in (*PHASES, "e2e")),
                        _f(ms_per_token(mean), ".2f"), _f(base_ms, ".2f")])
    return out

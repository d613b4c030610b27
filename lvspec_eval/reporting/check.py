"""`lvspec-eval check SUMMARY.json`: the CI gate on a report's summary.json.

A row fails when (the baseline row, vanilla, is exempt from the first and third rule):
- its retention lower bound is under --min-retention (an unknown bound fails: no evidence);
- it is lossless but its exact_match_rate is below 1.0 (an exact method changed an output), unless
  the report classified every divergence as a near-tie (numerics, e.g. bf16 with another kernel);
- any of its divergences from vanilla is not a near-tie ("elsewhere" in the report: a bug);
- --min-e2e-speedup is given and its e2e_speedup (wall clock, request to answer) is under it;
- --min-speedup is given and its decode_speedup is under it;
- --baseline OLD.json is given and, for the row of the same task and method there, decode or
  e2e speedup, quality or retention fell by more than --tolerance (relative: 0.05 = 5 %).
Speedups are the report's (lvspec_eval/reporting/speed.py): per generated token, prefill included,
the median over requests of vanilla's seconds per token / the method's, so a method that answers
shorter is not faster for that. A speedup gated on fewer requests than its interval needs ("too
few requests") is gated on its point estimate and named in a note.
Each failure prints one line naming method, task and figure; the exit code is then 1. Otherwise
it prints a short OK table and exits 0.

--methods a,b gates the rows of those methods only (e.g. the lossless ones and lvspec, leaving out
FLy, lossy by design); a name the summary does not have is an error that lists the ones it has.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

SUMMARY_VERSION = 1
REGRESSION_FIGURES = ("decode_speedup", "e2e_speedup", "quality", "retention")


@dataclass(frozen=True)
class Gate:
    min_retention: float = 0.99
    min_speedup: float | None = None
    min_e2e_speedup: float | None = None
    tolerance: float = 0.05


def load_summary(path: Path) -> dict:
    summary = json.loads(Path(path).read_text(encoding="utf-8"))
    if summary.get("version") != SUMMARY_VERSION:
        raise ValueError(f"{path}: summary version {summary.get('version')!r}; supported: {SUMMARY_VERSION}")
    return summary


def _known(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _fmt(x) -> str:
    return f"{x:.4g}" if _known(x) else "unknown"


def row_failures(row: dict, baseline: str, gate: Gate) -> list[str]:
    """The figures of one row that miss the bars (no baseline summary involved)."""
    name = f"{row['method']} on {row['task']}"
    out = []
    if row["method"] != baseline:
        lo = (row.get("retention_ci") or [None, None])[0]
        if not (_known(lo) and lo >= gate.min_retention):
            out.append(f"FAIL {name}: retention lower bound {_fmt(lo)} < {gate.min_retention:g} (n={row.get('n')})")
        for figure, bar in (("e2e_speedup", gate.min_e2e_speedup), ("decode_speedup", gate.min_speedup)):
            speed = row.get(figure)
            if bar is not None and not (_known(speed) and speed >= bar):
                out.append(f"FAIL {name}: {figure} {_fmt(speed)} < {bar:g}")
    match = row.get("exact_match_rate")
    div = row.get("divergence") or {}
    if div.get("elsewhere"):
        out.append(f"FAIL {name}: {div['elsewhere']} of {div.get('compared')} samples diverge from vanilla where "
                   "neither run was near a tie (a bug, not numerics)")
    elif row.get("lossless") and not (_known(match) and match >= 1.0) and not _only_near_ties(div):
        out.append(f"FAIL {name}: lossless method has exact_match_rate {_fmt(match)} < 1.0")
    return out


def _only_near_ties(div: dict) -> bool:
    """Every divergence is a near-tie (numerics: bf16 and another kernel), none unexplained."""
    return bool(div.get("diverged")) and div.get("near_tie") == div["diverged"] and not div.get("unclassified")


def regressions(row: dict, old: dict, tolerance: float) -> list[str]:
    """Figures that fell by more than `tolerance` (relative) since the old summary's row."""
    out = []
    for figure in REGRESSION_FIGURES:
        new_value, old_value = row.get(figure), old.get(figure)
        if not _known(old_value):
            continue
        bar = old_value * (1.0 - tolerance)
        if not (_known(new_value) and new_value >= bar):
            out.append(
                f"FAIL {row['method']} on {row['task']}: {figure} {_fmt(new_value)} regressed from {_fmt(old_value)} "
                f"(allowed down to {_fmt(bar)}, tolerance {tolerance:g})"
            )
    return out


def check_summary(summary: dict, gate: Gate, old: dict | None = None) -> tuple[list[str], list[str]]:
    """(failures, notes). A row of the old summary missing from the new one is a note, not a
    failure: a smaller run may leave methods out on purpose."""
    rows = summary.get("rows") or []
    failures = [] if rows else ["FAIL summary: no rows (did the report find any runs?)"]
    baseline = summary.get("baseline", "vanilla")
    for row in rows:
        failures += row_failures(row, baseline, gate)
    notes = [f"note: {r['method']} on {r['task']}: e2e speedup over {r.get('n_timed')} requests, too few for an "
             "interval (its verdict says neither faster nor slower)"
             for r in rows if r.get("e2e_verdict") == "too few requests" and gate.min_e2e_speedup is not None]
    if old is not None:
        new_rows = {(r["task"], r["method"]): r for r in rows}
        for old_row in old.get("rows") or []:
            key = (old_row["task"], old_row["method"])
            if key in new_rows:
                failures += regressions(new_rows[key], old_row, gate.tolerance)
            else:
                notes.append(f"note: {key[1]} on {key[0]} is in the baseline summary but not in this one")
    return failures, notes


def parse_methods(value: str | None) -> tuple[str, ...] | None:
    """--methods "a,b" -> ("a", "b"); not given -> None (every method)."""
    if value is None:
        return None
    names = tuple(dict.fromkeys(m.strip() for m in value.split(",") if m.strip()))
    if not names:
        raise ValueError(f"--methods {value!r} names no method; give a comma-separated list, e.g. sd_tree,lvspec")
    return names


def keep_methods(summary: dict, methods: tuple[str, ...] | None) -> dict:
    """The summary with the rows of `methods` only (all rows when None)."""
    if methods is None:
        return summary
    return {**summary, "rows": [r for r in summary.get("rows") or [] if r["method"] in methods]}


def select_methods(summary: dict, methods: tuple[str, ...] | None) -> dict:
    """keep_methods, after checking that the summary has every named method."""
    present = sorted({r["method"] for r in summary.get("rows") or []})
    unknown = [m for m in methods or () if m not in present]
    if unknown:
        raise ValueError(f"--methods: {', '.join(unknown)} not in the summary; its methods: "
                         f"{', '.join(present) or 'none'}")
    return keep_methods(summary, methods)


def ok_table(summary: dict) -> str:
    lines = [f"{'task':<20} {'method':<28} {'e2e x':>7} {'decode x':>9} {'retention lo':>12} {'exact':>7}"]
    for r in summary.get("rows") or []:
        lo = _fmt((r.get("retention_ci") or [None])[0])
        match, e2e, speed = _fmt(r.get("exact_match_rate")), _fmt(r.get("e2e_speedup")), _fmt(r.get("decode_speedup"))
        lines.append(f"{r['task']:<20} {r['method']:<28} {e2e:>7} {speed:>9} {lo:>12} {match:>7}")
    return "\n".join(lines)


def _validate(args: argparse.Namespace) -> Gate:
    if not 0.0 <= args.tolerance < 1.0:
        raise ValueError(f"--tolerance {args.tolerance}; allowed: 0 <= tolerance < 1 (0.05 = 5 %)")
    if not 0.0 < args.min_retention <= 2.0:
        raise ValueError(f"--min-retention {args.min_retention}; allowed: 0 < value <= 2 (0.99 = 99 %)")
    return Gate(min_retention=args.min_retention, min_speedup=args.min_speedup,
                min_e2e_speedup=args.min_e2e_speedup, tolerance=args.tolerance)


def _run(args: argparse.Namespace) -> int:
    gate = _validate(args)
    methods = parse_methods(args.methods)
    summary = select_methods(load_summary(args.summary), methods)
    old = keep_methods(load_summary(args.baseline), methods) if args.baseline else None
    failures, notes = check_summary(summary, gate, old)
    for line in failures + notes:
        print(line)
    if failures:
        return 1
    scope = f"; methods {', '.join(methods)}" if methods else ""
    print(f"OK: {len(summary['rows'])} rows pass (min retention {gate.min_retention:g}{scope})")
    print(ok_table(summary))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("check", help="CI gate: fail when retention, losslessness or speed miss the bars")
    p.add_argument("summary", type=Path, metavar="SUMMARY.json", help="summary.json written by `lvspec-eval report`")
    p.add_argument("--min-retention", type=float, default=0.99, help="lowest allowed retention lower bound")
    p.add_argument("--min-e2e-speedup", type=float, default=None,
                   help="lowest allowed end-to-end speedup, request to answer (non-baseline rows)")
    p.add_argument("--min-speedup", type=float, default=None, help="lowest allowed decode speedup (non-baseline rows)")
    p.add_argument(
        "--baseline", type=Path, default=None, metavar="OLD.json", help="an earlier summary.json to detect regressions"
    )
    p.add_argument("--tolerance", type=float, default=0.05, help="allowed relative drop against --baseline")
    p.add_argument("--methods", default=None, metavar="A,B",
                   help="gate only these methods' rows (default: every method in the summary)")
    p.set_defaults(func=_run)

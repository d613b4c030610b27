"""A row's speed figures, from the decode-stats records of the requests both runs timed.

Over the samples both runs timed without error. decode/e2e speedup = the median over those
requests of vanilla's decode_s (e2e_s) / the method's, with a percentile bootstrap interval
(judges.stats.speedup_interval; n_boot, alpha and seed as for retention); a row whose interval
holds 1.0 says "no clear difference". The ratio of summed seconds is kept beside it (*_total);
where the method's records carry "vanilla_decode_s" and "vanilla_e2e_s" (model_arg paired_timing:
vanilla decoded beside each request, same process, same moment), those are vanilla's times
("timing": "paired", else "runs"; "mixed" when only some records have them); decode tokens/s =
new tokens / decode seconds. tau = all accepted draft tokens / all steps (bonus excluded, as the
papers report it); tokens_per_step = tau + 1. Failed samples are left out of speed.
"""

from __future__ import annotations

from judges import stats
from lvspec_eval.reporting import overview as report_overview
from lvspec_eval.reporting.options import ReportOptions
from lvspec_eval.reporting.runs import TaskRun

PAIRED_TIMES = ("decode_s", "e2e_s")  # a method record's "vanilla_<key>": vanilla timed beside it


def timed_pairs(run: TaskRun, vanilla: TaskRun) -> list[tuple[dict, dict]]:
    """(method record, vanilla record) for the samples both timed without error. Where the method's
    record carries vanilla's times from the same process and moment (model_arg paired_timing), they
    replace the vanilla run's times in its record (marked "paired": True)."""
    ids = sorted(set(run.stats) & set(vanilla.stats), key=str)
    ok = [i for i in ids if not run.stats[i].get("error") and not vanilla.stats[i].get("error")]
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
        raise ValueError(f"decode-stats records of docs {missing[:5]} lack {key!r}; expected the fields in report.py's docstring")
    return float(sum(float(r[key]) for r in records))


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else float("nan")


def _accepted(rec: dict) -> float:
    """Draft tokens accepted over the whole sample (from tau x steps if the list is missing)."""
    if rec.get("accepted_lengths") is not None:
        return float(sum(rec["accepted_lengths"]))
    return float(rec.get("tau") or 0.0) * float(rec.get("num_steps") or 0)


SPEEDUPS = {"e2e": "e2e_s", "decode": "decode_s"}  # figure -> the per-request seconds it compares


def speed_fields(pairs: list[tuple[dict, dict]], opts: ReportOptions | None = None) -> dict:
    """tau pools all steps of all timed samples (a long answer weighs more, as in the papers).
    Each speedup (SPEEDUPS) is the median of per-request ratios vanilla / method with its
    percentile bootstrap interval (judges.stats.speedup_interval: one stalled request cannot
    decide it), the ratio of summed seconds beside it (<figure>_speedup_total), and a verdict
    ("faster", "slower", "no clear difference" when the interval holds 1.0)."""
    opts = opts or ReportOptions()
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


def sample_shape(records: list[dict]) -> dict:
    """Mean visual tokens and answer length of the timed samples (the leaderboard's task groups), and
    the mean seconds per phase of a request (report_overview.PHASES)."""
    def mean(key: str) -> float:
        values = [float(r[key]) for r in records if isinstance(r.get(key), (int, float))]
        return sum(values) / len(values) if values else float("nan")

    return {"visual_tokens": mean("visual_tokens"), "mean_new_tokens": mean("num_new_tokens"),
            "time_breakdown": report_overview.breakdown_fields(records)}

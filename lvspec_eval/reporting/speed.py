"""A row's speed figures, from the decode-stats records of the requests both runs timed.

Speed is per generated token, prefill included (judges.stats.per_token_speedup, the one definition
that bench, report, check and the summary share): per request, vanilla's end-to-end seconds per
generated token / the method's ("e2e_speedup"; "decode_speedup" the same over the decoding loop's
seconds), the median over requests with its distribution-free interval (judges.stats.
speedup_interval: "too few requests" below n = 6 at 95 %, "no clear difference" when it holds 1.0)
and the ratio of summed seconds per token beside it (*_total). A shorter answer is never a speedup.
Beside them, for methods whose answers may differ from vanilla's: "e2e_request_speedup" (the
median of per-request ratios of seconds, whatever each answer's length) and "length_ratio" (the
method's generated tokens / vanilla's, summed).

Over the samples both runs timed without error, less each process's first request (a cold start:
"request_index" 0 in its record; left out of every speed figure and mean, counted in "cold_starts").
Where the method's records carry "vanilla_decode_s" and "vanilla_e2e_s" (model_arg paired_timing:
vanilla decoded beside each request, same process, same moment), those are vanilla's times, with
vanilla_prefill_s and vanilla_num_new_tokens ("timing": "paired", else "runs"; "mixed" when only
some records have them): the leaderboard, the time breakdown (the baseline arms' phases,
"baseline_time_breakdown") and the plots read the same pairs. Decode tokens/s = new tokens / decode
seconds. tau = all accepted draft tokens / all steps (bonus excluded, as the papers report it);
tokens_per_step = tau + 1. Failed samples are left out of speed.
"""

from __future__ import annotations

from judges import stats
from lvspec_eval.reporting import overview as report_overview
from lvspec_eval.reporting.options import ReportOptions
from lvspec_eval.reporting.runs import TaskRun

PAIRED_TIMES = ("decode_s", "e2e_s")  # a method record's "vanilla_<key>": vanilla timed beside it
# draft-side phases vanilla does not have (its paired arm's record carries none)
DRAFT_PHASES = ("draft_prepare_s", "draft_prefill_s", "draft_vision_s", "prune_s")


def timed_pairs(run: TaskRun, vanilla: TaskRun) -> list[tuple[dict, dict]]:
    """(method record, vanilla record) for the samples both timed without error, cold starts left
    out (is_cold). Where the method's record carries vanilla's times from the same process and
    moment (model_arg paired_timing), they replace the vanilla run's times in its record (marked
    "paired": True)."""
    return [p for p in _error_free_pairs(run, vanilla) if not is_cold(*p)]


def cold_starts(run: TaskRun, vanilla: TaskRun) -> int:
    """How many error-free pairs timed_pairs leaves out as cold starts."""
    return sum(is_cold(*p) for p in _error_free_pairs(run, vanilla))


def is_cold(method: dict, vanilla: dict) -> bool:
    """Either arm was its process's first request (request_index 0: caches, allocator, lazily built
    kernels and trees still cold) and was timed without a warm-up decode before it (model_arg
    `warmup`, runner.Runner: "warmed_up" in the record). A paired arm ran in the method's process: it
    carries the method's index. Records written before request_index existed are all taken as warm."""
    return any(r.get("request_index") == 0 and not r.get("warmed_up") for r in (method, vanilla))


def _error_free_pairs(run: TaskRun, vanilla: TaskRun) -> list[tuple[dict, dict]]:
    ids = sorted(set(run.stats) & set(vanilla.stats), key=str)
    ok = [i for i in ids if not run.stats[i].get("error") and not vanilla.stats[i].get("error")]
    ok = [i for i in ok if not run.stats[i].get("untimed")]  # stalled twice (runner.timed_pair): no timing
    return [(run.stats[i], _beside(run.stats[i], vanilla.stats[i])) for i in ok]


def _beside(method: dict, vanilla: dict) -> dict:
    """Vanilla's record for this request: its own run's, or, where the method's record carries the
    vanilla arm decoded beside it, that arm's times, tokens and phases (the request's one
    preprocessing is charged to both arms; vanilla prepares no draft)."""
    if any(method.get(f"vanilla_{key}") is None for key in PAIRED_TIMES):
        return vanilla
    paired = {key: method[f"vanilla_{key}"] for key in PAIRED_TIMES}
    for key in ("prefill_s", "num_new_tokens"):
        if method.get(f"vanilla_{key}") is not None:
            paired[key] = method[f"vanilla_{key}"]
    paired["preprocess_s"] = method.get("preprocess_s", vanilla.get("preprocess_s"))
    return {**vanilla, **paired, **dict.fromkeys(DRAFT_PHASES, 0.0), "request_index": method.get("request_index"),
            "paired": True}


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


def _tokens(rec: dict) -> float:
    """Generated tokens of a request (at least one: a request that generated none still took its time)."""
    return max(1.0, float(rec.get("num_new_tokens") or 0))


def _empty_speed() -> dict:
    nan = float("nan")
    out = {"n_timed": 0, "tau": nan, "tokens_per_step": nan, "decode_tokens_per_s": nan, "timing": None,
           "retimed": 0, "e2e_request_speedup": nan, "e2e_request_speedup_ci": [nan, nan], "length_ratio": nan}
    for figure in SPEEDUPS:
        out.update({f"{figure}_speedup": nan, f"{figure}_speedup_ci": [nan, nan], f"{figure}_speedup_total": nan,
                    f"{figure}_verdict": None})
    return out


def speed_fields(pairs: list[tuple[dict, dict]], opts: ReportOptions | None = None) -> dict:
    """tau pools all steps of all timed samples (a long answer weighs more, as in the papers).
    Each speedup (SPEEDUPS) is per generated token (the module docstring): the median of per-request
    ratios vanilla / method of seconds per token with its order-statistic interval (one stalled
    request cannot decide it), the ratio of summed seconds per token beside it
    (<figure>_speedup_total), and a verdict ("faster", "slower", "no clear difference" when the
    interval holds 1.0, "too few requests" when there is none)."""
    opts = opts or ReportOptions()
    if not pairs:
        return _empty_speed()
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
    vanilla_tokens, method_tokens = [_tokens(v) for v in vanilla], [_tokens(m) for m in method]
    for figure, key in SPEEDUPS.items():
        _total(vanilla, key), _total(method, key)  # raise when a record lacks the field
        s = stats.per_token_speedup([float(v[key]) for v in vanilla], vanilla_tokens, [float(m[key]) for m in method],
                                    method_tokens, alpha=opts.alpha)
        out.update({f"{figure}_speedup": s.median, f"{figure}_speedup_ci": [s.lo, s.hi],
                    f"{figure}_speedup_total": s.total, f"{figure}_verdict": s.verdict})
    request = stats.speedup_interval([float(v["e2e_s"]) for v in vanilla], [float(m["e2e_s"]) for m in method],
                                     alpha=opts.alpha)
    out.update(e2e_request_speedup=request.median, e2e_request_speedup_ci=[request.lo, request.hi],
               length_ratio=_ratio(sum(method_tokens), sum(vanilla_tokens)))
    # per request, seconds per generated token (vanilla, method): task groups pool them (report_overview)
    out["e2e_paired_s_per_token"] = [[float(v["e2e_s"]) / vt, float(m["e2e_s"]) / mt]
                                     for (m, v), vt, mt in zip(pairs, vanilla_tokens, method_tokens)]
    return out


def sample_shape(pairs: list[tuple[dict, dict]]) -> dict:
    """Mean visual tokens and answer length of the timed samples (the leaderboard's task groups), and
    the mean seconds per phase of a request (report_overview.PHASES) of the method and of the
    baseline arms it was timed against, over the same requests as its speedups."""
    records = [m for m, _ in pairs]

    def mean(key: str) -> float:
        values = [float(r[key]) for r in records if isinstance(r.get(key), (int, float))]
        return sum(values) / len(values) if values else float("nan")

    return {"visual_tokens": mean("visual_tokens"), "mean_new_tokens": mean("num_new_tokens"),
            "time_breakdown": report_overview.breakdown_fields(records),
            "baseline_time_breakdown": report_overview.breakdown_fields([v for _, v in pairs])}

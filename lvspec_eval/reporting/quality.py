"""A row's quality figures against the baseline, from lmms-eval's logged samples.

- Quality: mean per-sample metric over the samples both runs have (paired by doc_id). The metric
  is the task's first in its results JSON unless `--metric task=name`. A per-sample value is a
  number, a bool, or a dict with a numeric "score" (lmms-eval's video tasks log such dicts).
  Retention, its BCa interval, non-inferiority and the tests come from judges/stats.py.
  Failed samples still count (their answer is what was scored).
- Exact match: share of paired samples whose output token ids equal the baseline's
  ("exact_match_basis": "tokens"); when a record lacks "tokens", the logged responses are
  compared instead ("text").
- Protocol: the scoring protocol the task logged in its per-sample metric dicts ("protocol": VDC's
  "vdcscore-per-dimension" or "lmms-eval-hub"), shown beside the metric; None when it logs none.
- Fact errors introduced: for tasks whose per-sample metric dicts list the facts an answer got
  right ("facts_right": the synthvid captions), the facts vanilla's answer had right that the
  method's lost, summed over the paired docs, and their share of vanilla's right facts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from judges import stats
from lvspec_eval.reporting.options import ReportOptions
from lvspec_eval.reporting.runs import TaskRun

REPORTED_MARGINS = (0.01, 0.02)
# keys lmms-eval writes into every logged sample besides the metrics
LOGGED_SAMPLE_KEYS = ("doc_id", "target", "resps", "filtered_resps", "doc_hash", "input", "token_counts", "input_media")


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


def protocol(run: TaskRun, metric: str) -> str | None:
    """The "protocol" the task's per-sample metric dicts name ("a+b" when they name several), or None."""
    named = {v.get("protocol") for s in run.samples.values() if isinstance(v := s.get(metric), Mapping)}
    named.discard(None)
    return "+".join(sorted(named)) or None


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
        "protocol": protocol(run, metric),
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

"""Statistics that say whether a method keeps the target's quality (pure functions on arrays).

Every comparison is paired: a method and vanilla are scored on the same samples, matched by
sample id (`pair_by_id`), so sample difficulty cancels out of the comparison.

- Retention = mean(method) / mean(vanilla) over the paired samples. Its confidence interval is a
  paired BCa bootstrap (`retention_interval`): resample whole pairs (so the correlation between a
  method's score and vanilla's on the same sample is kept), correct the percentile interval for
  bias (z0) and skew (acceleration a, from the jackknife of the ratio). Defaults: n_boot = 2000
  resamples, alpha = 0.05 (a two-sided 95 % interval), seed 0 so a report is reproducible.
- Non-inferiority at margin d (`non_inferiority`; the report uses d = 1 % and 2 %): a method is
  non-inferior when the LOWER bound of its retention interval is >= 1 - d. With alpha = 0.05
  this is a one-sided test at level 0.025 that the method loses less than d of vanilla's quality.
- Significance of a difference: McNemar's exact test for 0/1 outcomes (multiple-choice
  accuracy), Wilcoxon signed-rank otherwise; Holm's step-down correction across the methods
  compared within one task.
- Exact-output match rate: share of paired samples whose output equals vanilla's. Lossless
  methods must reach 1.0 (in fp32).

Decode-speed figures (tau, tokens/step) are defined in decoding/stats.py; this module only
judges quality.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

ZERO_METHODS = ("zsplit", "wilcox", "pratt")
BOOT_CHUNK = 256  # resamples drawn at once: bounds memory at BOOT_CHUNK x n indices


@dataclass(frozen=True)
class Paired:
    """Scores of one method and vanilla on the samples both have, in the same order."""

    ids: tuple  # sample ids, sorted
    method: np.ndarray  # [n] float
    vanilla: np.ndarray  # [n] float

    @property
    def n(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class RatioInterval:
    """Retention and its BCa interval; lo/hi are NaN when it cannot be estimated (n < 2 or a
    zero vanilla mean)."""

    estimate: float
    lo: float
    hi: float
    alpha: float
    n_boot: int
    n: int


@dataclass(frozen=True)
class NonInferiority:
    margin: float
    bar: float  # 1 - margin: the lowest retention lower bound that passes
    lower: float
    non_inferior: bool


@dataclass(frozen=True)
class PairedTest:
    """A two-sided paired test of method against vanilla."""

    test: str  # "mcnemar_exact" or "wilcoxon"
    statistic: float
    p_value: float
    zero_method: str | None = None  # Wilcoxon only: how zero differences were treated
    n_discordant: tuple[int, int] | None = None  # McNemar only: (vanilla right only, method right only)


@dataclass(frozen=True)
class QualityComparison:
    n: int
    retention: RatioInterval
    non_inferiority: tuple[NonInferiority, ...]
    test: PairedTest


def pair_by_id(method: Mapping[Hashable, float], vanilla: Mapping[Hashable, float]) -> Paired:
    """Keep the samples both runs scored, so that a method that skipped or added samples is
    compared on common ground only."""
    ids = tuple(sorted(set(method) & set(vanilla), key=str))
    return Paired(
        ids=ids,
        method=np.array([float(method[i]) for i in ids], dtype=float),
        vanilla=np.array([float(vanilla[i]) for i in ids], dtype=float),
    )


def _check_pair(method: np.ndarray, vanilla: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    m = np.asarray(method, dtype=float)
    v = np.asarray(vanilla, dtype=float)
    if m.ndim != 1 or m.shape != v.shape:
        raise ValueError(f"paired scores need two 1-D arrays of one length, got shapes {m.shape} and {v.shape}")
    if not (np.isfinite(m).all() and np.isfinite(v).all()):
        raise ValueError("paired scores contain NaN or infinity; allowed: finite numbers")
    return m, v


def _check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha={alpha!r}; allowed: 0 < alpha < 1")


def _bootstrap_ratios(m: np.ndarray, v: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """mean(m*)/mean(v*) over n_boot resamples of whole pairs; resamples whose ratio is not
    finite (all resampled vanilla scores zero) are dropped."""
    rng = np.random.default_rng(seed)
    n = len(m)
    out = []
    for start in range(0, n_boot, BOOT_CHUNK):
        idx = rng.integers(0, n, size=(min(BOOT_CHUNK, n_boot - start), n))  # [chunk, n]
        with np.errstate(divide="ignore", invalid="ignore"):
            out.append(m[idx].mean(axis=1) / v[idx].mean(axis=1))
    ratios = np.concatenate(out)
    return ratios[np.isfinite(ratios)]


def _jackknife_acceleration(m: np.ndarray, v: np.ndarray) -> float:
    """Acceleration a of BCa from the leave-one-out ratios (Efron 1987, "Better bootstrap
    confidence intervals"). 0 when a leave-one-out ratio is undefined (a single nonzero vanilla
    score), which falls back to the bias-corrected percentile interval."""
    with np.errstate(divide="ignore", invalid="ignore"):
        loo = (m.sum() - m) / (v.sum() - v)  # [n]; the 1/(n-1) factors cancel
    if not np.isfinite(loo).all():
        return 0.0
    d = loo.mean() - loo
    denom = 6.0 * float((d**2).sum()) ** 1.5
    return float((d**3).sum() / denom) if denom > 0 else 0.0


def _bca_levels(ratios: np.ndarray, estimate: float, a: float, alpha: float) -> tuple[float, float]:
    """Percentile levels of the BCa interval. z0 counts ties with the estimate as half below:
    with 0/1 metrics many resamples equal it exactly, and counting them as "not below" would
    shift the interval for no reason."""
    b = len(ratios)
    tie = np.isclose(ratios, estimate, rtol=1e-12, atol=0.0)  # equal up to summation order
    share = (np.sum((ratios < estimate) & ~tie) + 0.5 * np.sum(tie)) / b
    z0 = sps.norm.ppf(np.clip(share, 0.5 / b, 1 - 0.5 / b))
    levels = []
    for z in sps.norm.ppf([alpha / 2, 1 - alpha / 2]):
        shifted = z0 + z
        denom = 1 - a * shifted  # <= 0 only for an extreme acceleration: take the outermost level
        levels.append(float(sps.norm.cdf(z0 + shifted / denom)) if denom > 0 else float(z > 0))
    return levels[0], levels[1]


def retention_interval(
    method: Sequence[float], vanilla: Sequence[float], n_boot: int = 2000, alpha: float = 0.05, seed: int = 0
) -> RatioInterval:
    """Retention mean(method)/mean(vanilla) with a paired BCa bootstrap interval.

    When method == vanilla on every sample, retention and interval are exactly 1 (every resample
    gives 1), even when vanilla scores 0 everywhere: identical scores retain all there was.
    Otherwise a zero vanilla mean leaves retention undefined (NaN).
    """
    m, v = _check_pair(method, vanilla)
    _check_alpha(alpha)
    if n_boot < 1:
        raise ValueError(f"n_boot={n_boot!r}; allowed: an integer >= 1")
    n = len(m)
    if n > 0 and np.array_equal(m, v):
        return RatioInterval(1.0, 1.0, 1.0, alpha, n_boot, n)
    if n == 0 or v.mean() == 0:
        return RatioInterval(float("nan"), float("nan"), float("nan"), alpha, n_boot, n)
    estimate = float(m.mean() / v.mean())
    ratios = _bootstrap_ratios(m, v, n_boot, seed)
    if n < 2 or len(ratios) == 0:
        return RatioInterval(estimate, float("nan"), float("nan"), alpha, n_boot, n)
    if np.ptp(ratios) == 0:
        return RatioInterval(estimate, float(ratios[0]), float(ratios[0]), alpha, n_boot, n)
    lo_level, hi_level = _bca_levels(ratios, estimate, _jackknife_acceleration(m, v), alpha)
    lo, hi = np.quantile(ratios, [lo_level, hi_level])
    return RatioInterval(estimate, float(lo), float(hi), alpha, n_boot, n)


def non_inferiority(interval: RatioInterval, margin: float) -> NonInferiority:
    """Non-inferior when the retention lower bound is >= 1 - margin (an unknown bound fails)."""
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin={margin!r}; allowed: 0 <= margin < 1 (0.01 means 1 %)")
    bar = 1.0 - margin
    ok = bool(np.isfinite(interval.lo) and interval.lo >= bar - 1e-12)
    return NonInferiority(margin=margin, bar=bar, lower=interval.lo, non_inferior=ok)


def wilcoxon_test(method: Sequence[float], vanilla: Sequence[float], zero_method: str = "zsplit") -> PairedTest:
    """Wilcoxon signed-rank test of method - vanilla (two-sided).

    Default zero_method "zsplit": samples the method scored exactly like vanilla stay in the test
    (their ranks split between the signs), so a method that changed 3 samples out of 500 is
    judged on 500 samples, the n the report shows; "wilcox" would drop them and test the 3.
    All differences zero means no evidence of change: p = 1.0 (scipy would warn or give NaN).
    """
    if zero_method not in ZERO_METHODS:
        raise ValueError(f"zero_method={zero_method!r}; allowed: {', '.join(ZERO_METHODS)}")
    m, v = _check_pair(method, vanilla)
    d = m - v
    if len(d) == 0 or not np.any(d):
        return PairedTest("wilcoxon", 0.0, 1.0, zero_method=zero_method)
    res = sps.wilcoxon(d, zero_method=zero_method)
    p = float(res.pvalue) if np.isfinite(res.pvalue) else 1.0
    return PairedTest("wilcoxon", float(res.statistic), p, zero_method=zero_method)


def is_binary(*arrays: Sequence[float]) -> bool:
    """True when every value is 0 or 1: the outcomes McNemar's test is for."""
    return all(np.isin(np.asarray(a, dtype=float), (0.0, 1.0)).all() for a in arrays)


def mcnemar_exact(method: Sequence[float], vanilla: Sequence[float]) -> PairedTest:
    """McNemar's exact test: under "no difference" each discordant pair is a fair coin, so the
    count where only the method is right is Binomial(b + c, 1/2); two-sided p from binomtest."""
    m, v = _check_pair(method, vanilla)
    if not is_binary(m, v):
        raise ValueError("mcnemar_exact needs 0/1 outcomes; got other values (use wilcoxon_test)")
    b = int(np.sum((v == 1) & (m == 0)))  # vanilla right, method wrong
    c = int(np.sum((v == 0) & (m == 1)))  # method right, vanilla wrong
    p = 1.0 if b + c == 0 else float(sps.binomtest(c, b + c, 0.5).pvalue)
    return PairedTest("mcnemar_exact", float(min(b, c)), p, n_discordant=(b, c))


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error across the methods of one task).

    NaN entries (no test run) stay NaN and do not count in the family size.
    """
    p = np.asarray(p_values, dtype=float)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    order = ok[np.argsort(p[ok], kind="stable")]
    k = len(order)
    adjusted = np.maximum.accumulate(p[order] * (k - np.arange(k)))
    out[order] = np.minimum(adjusted, 1.0)
    return out


def exact_match_rate(method_outputs: Sequence[Sequence], vanilla_outputs: Sequence[Sequence]) -> float:
    """Share of paired samples whose output (token ids or text) equals vanilla's; NaN if none."""
    if len(method_outputs) != len(vanilla_outputs):
        raise ValueError(
            f"need one vanilla output per method output, got {len(method_outputs)} and {len(vanilla_outputs)}"
        )
    if not method_outputs:
        return float("nan")
    same = sum(_as_output(a) == _as_output(b) for a, b in zip(method_outputs, vanilla_outputs))
    return same / len(method_outputs)


def _as_output(x: Sequence) -> str | list:
    """Texts compare as strings, token sequences (lists, tuples, arrays) as lists of ints."""
    return x if isinstance(x, str) else [int(t) for t in x]


def compare_quality(
    paired: Paired,
    margins: Sequence[float] = (0.01, 0.02),
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> QualityComparison:
    """Everything the leaderboard says about one method's quality against vanilla on one task:
    retention with its interval, non-inferiority at each margin, and McNemar for 0/1 scores
    (Wilcoxon otherwise)."""
    interval = retention_interval(paired.method, paired.vanilla, n_boot=n_boot, alpha=alpha, seed=seed)
    if paired.n and is_binary(paired.method, paired.vanilla):
        test = mcnemar_exact(paired.method, paired.vanilla)
    else:
        test = wilcoxon_test(paired.method, paired.vanilla)
    verdicts = tuple(non_inferiority(interval, d) for d in margins)
    return QualityComparison(n=paired.n, retention=interval, non_inferiority=verdicts, test=test)

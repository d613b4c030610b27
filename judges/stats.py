"""Statistics that say whether a method keeps the target's quality (pure functions on arrays).

Every comparison is paired: a method and vanilla are scored on the same samples, matched by
sample id (`pair_by_id`), so sample difficulty cancels out of the comparison.

- Retention = mean(method) / mean(vanilla) over the paired samples. Its confidence interval is a
  paired BCa bootstrap (`retention_interval`), computed by `scipy.stats.bootstrap(paired=True,
  method="BCa")`: resample whole pairs (so the correlation between a method's score and vanilla's
  on the same sample is kept), correct the percentile interval for bias (z0, ties counted half)
  and skew (acceleration a, from the jackknife of the ratio). Defaults: n_boot = 2000 resamples,
  alpha = 0.05 (a two-sided 95 % interval), seed 0 so a report is reproducible. What we add
  around scipy: the cases scipy leaves undefined get a stated answer (identical scores: exactly 1;
  zero vanilla mean or n < 2: NaN; every resample the same ratio: that point).
- Non-inferiority at margin d (`non_inferiority`; the report uses d = 1 % and 2 %): a method is
  non-inferior when the LOWER bound of its retention interval is >= 1 - d. With alpha = 0.05
  this is a one-sided test at level 0.025 that the method loses less than d of vanilla's quality.
- Significance of a difference: McNemar's exact test for 0/1 outcomes (multiple-choice
  accuracy), Wilcoxon signed-rank otherwise; Holm's step-down correction across the methods
  compared within one task (statsmodels' `multipletests(method="holm")`; we only keep tests that
  were not run, NaN, out of the family).
- Exact-output match rate: share of paired samples whose output equals vanilla's. Lossless
  methods must reach 1.0 (in fp32).

- Speedup (`speedup_interval`): the median of per-request ratios vanilla_seconds / method_seconds
  with a distribution-free interval from order statistics (`median_interval_rank`): the sorted
  ratios' k-th smallest and k-th largest, k the largest with 2 P(Binomial(n, 1/2) < k) <= alpha, so
  the interval holds the true median ratio with probability >= 1 - alpha at every n, whatever the
  distribution (no bootstrap: a percentile bootstrap of a median over n <= 5 requests is the min-max
  range, 87.5 % coverage at n = 4). Below the n where 1 - alpha is reachable (n < 6 at 95 %) there
  is no interval and the verdict is "too few requests". A median is what one stalled request
  cannot move, and an interval that holds 1.0 says the run cannot tell the two apart
  (`SpeedupInterval.verdict`: "no clear difference").
- Speed is per generated token (`per_token_speedup`, the project's one definition, used by bench,
  report, check and the summary): each request's end-to-end (or decode) seconds divided by the
  tokens it generated, vanilla's over the method's, so a method whose answers are shorter is not
  faster for that.

Decode-speed figures (tau, tokens/step) are defined in decoding/stats.py.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

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


def _ratio_of_means(m: np.ndarray, v: np.ndarray, axis: int = -1) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return m.mean(axis=axis) / v.mean(axis=axis)


def _scipy_bca(m: np.ndarray, v: np.ndarray, n_boot: int, alpha: float, seed: int) -> tuple[float, float]:
    """scipy's paired BCa interval of mean(m)/mean(v); NaN where scipy finds it undefined, except
    that a bootstrap distribution of one single value gives that value (scipy: NaN, as its
    jackknife acceleration is 0/0)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sps.DegenerateDataWarning)  # we report NaN ourselves
        res = sps.bootstrap((m, v), _ratio_of_means, paired=True, vectorized=True, n_resamples=n_boot,
                            confidence_level=1 - alpha, method="BCa", batch=BOOT_CHUNK, rng=seed)
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    ratios = res.bootstrap_distribution
    if not (np.isfinite(lo) and np.isfinite(hi)) and np.isfinite(ratios).all() and np.ptp(ratios) == 0:
        return float(ratios[0]), float(ratios[0])
    return lo, hi


def retention_interval(
    method: Sequence[float], vanilla: Sequence[float], n_boot: int = 2000, alpha: float = 0.05, seed: int = 0
) -> RatioInterval:
    """Retention mean(method)/mean(vanilla) with a paired BCa bootstrap interval.

    When method == vanilla on every sample, retention and interval are exactly 1 (every resample
    gives 1), even when vanilla scores 0 everywhere: identical scores retain all there was.
    Otherwise a zero vanilla mean leaves retention undefined (NaN). When some resample has a zero
    vanilla mean (rare: mostly-zero 0/1 scores on few samples) the ratio is undefined there and
    scipy's interval is NaN: a gate then fails, as it should on so little evidence.
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
    if n < 2:
        return RatioInterval(estimate, float("nan"), float("nan"), alpha, n_boot, n)
    lo, hi = _scipy_bca(m, v, n_boot, alpha, seed)
    return RatioInterval(estimate, lo, hi, alpha, n_boot, n)


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
    ok = np.isfinite(p)
    if ok.any():
        out[ok] = multipletests(p[ok], method="holm")[1]
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


@dataclass(frozen=True)
class SpeedupInterval:
    """How much faster a method is than vanilla over paired requests (> 1: faster)."""

    median: float  # median over requests of vanilla_s / method_s
    lo: float  # the order-statistic interval of that median (NaN below the n where 1 - alpha is reachable)
    hi: float
    total: float  # sum(vanilla_s) / sum(method_s): the summed wall clocks
    n: int
    alpha: float
    coverage: float  # the interval's exact coverage of the true median, >= 1 - alpha (NaN without one)

    @property
    def verdict(self) -> str:
        """"faster" / "slower" when the whole interval lies above / below 1.0, "no clear
        difference" when it holds 1.0, "too few requests" when there is none."""
        if not (np.isfinite(self.lo) and np.isfinite(self.hi)):
            return "too few requests"
        return "faster" if self.lo > 1.0 else "slower" if self.hi < 1.0 else "no clear difference"


@functools.lru_cache(maxsize=1024)
def median_interval_rank(n: int, alpha: float = 0.05) -> int:
    """k for the interval [x_(k), x_(n+1-k)] of the median of n sorted values: the largest k with
    P(x_(k) > median) = P(Binomial(n, 1/2) <= k - 1) <= alpha / 2 (the same on the other side), so
    the interval holds the median with probability >= 1 - alpha for any continuous distribution
    (and at least that with ties). 0: no k qualifies (n < 6 at alpha 0.05: even the min-max range
    covers only 1 - 2 / 2^n). Exact integer arithmetic: at n = 6, P = 1/64 <= 0.025, so k = 1."""
    _check_alpha(alpha)
    bar = math.floor(Fraction(alpha) * 2**n)  # exact integers: no float overflow at large n
    k, below, term = 0, 0, 1  # below = sum of C(n, i) for i < k; term = C(n, k)
    while k < n and 2 * (below + term) <= bar:
        below += term
        term = term * (n - k) // (k + 1)
        k += 1
    return k


def median_interval_coverage(n: int, k: int) -> float:
    """P(x_(k) <= median <= x_(n+1-k)) for a continuous distribution: 1 - 2 P(Binomial(n, 1/2) < k)."""
    return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2**n


def speedup_interval(vanilla_s: Sequence[float], method_s: Sequence[float], alpha: float = 0.05) -> SpeedupInterval:
    """Median of the per-request ratios vanilla_s[i] / method_s[i] with its two-sided
    distribution-free interval [r_(k), r_(n+1-k)] (k = median_interval_rank(n, alpha)). Requests
    with a time <= 0 are left out (nothing was timed).

    Example: ratios 0.9, 1.2, 1.3, 1.5, 1.6, 2.0 (n = 6): k = 1, the interval is [0.9, 2.0] with
    coverage 1 - 2/64 = 96.9 %: "no clear difference". Four ratios of 1.01-1.10: no interval at 95 %,
    "too few requests" (a min-max range over 4 covers the median 87.5 % of the time).
    """
    v, m = _check_pair(vanilla_s, method_s)
    _check_alpha(alpha)
    timed = (v > 0) & (m > 0)
    v, m = v[timed], m[timed]
    nan = float("nan")
    if len(v) == 0:
        return SpeedupInterval(nan, nan, nan, nan, 0, alpha, nan)
    ratios = np.sort(v / m)
    n = len(ratios)
    median, total = float(np.median(ratios)), float(v.sum() / m.sum())
    k = median_interval_rank(n, alpha)
    if k == 0:
        return SpeedupInterval(median, nan, nan, total, n, alpha, nan)
    return SpeedupInterval(median, float(ratios[k - 1]), float(ratios[n - k]), total, n, alpha,
                           median_interval_coverage(n, k))


def per_token_speedup(vanilla_s: Sequence[float], vanilla_tokens: Sequence[float], method_s: Sequence[float],
                      method_tokens: Sequence[float], alpha: float = 0.05) -> SpeedupInterval:
    """The project's one definition of speed: per request, seconds per generated token (a request
    that generated none counts as one), vanilla's / the method's; its median and interval as in
    speedup_interval, and `total` = (sum of vanilla's seconds / its tokens) / (the method's): the
    summed wall clocks per token. Equal per-token time reads 1.0 however short the method's answers."""
    v, m = _check_pair(vanilla_s, method_s)
    vt, mt = _check_pair(vanilla_tokens, method_tokens)
    if vt.shape != v.shape:
        raise ValueError(f"need one token count per request, got {len(vt)} counts for {len(v)} requests")
    vt, mt = np.maximum(vt, 1.0), np.maximum(mt, 1.0)
    s = speedup_interval(v / vt, m / mt, alpha)
    timed = (v > 0) & (m > 0)
    if not timed.any():
        return s
    total = float((v[timed].sum() / vt[timed].sum()) / (m[timed].sum() / mt[timed].sum()))
    return replace(s, total=total)


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

"""judges/stats.py against known values: hand-computed tests, a textbook Holm example, scipy."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats as sps

from judges import stats


def test_mcnemar_exact_matches_hand_computed_binomial():
    # 1 pair where only vanilla is right, 7 where only the method is right, 12 concordant.
    vanilla = [1] * 1 + [0] * 7 + [1] * 6 + [0] * 6
    method = [0] * 1 + [1] * 7 + [1] * 6 + [0] * 6
    res = stats.mcnemar_exact(method, vanilla)
    # two-sided: 2 * P(X <= 1), X ~ Binomial(8, 1/2) = 2 * (1 + 8) / 256
    assert res.p_value == pytest.approx(18 / 256)
    assert res.n_discordant == (1, 7)
    assert res.test == "mcnemar_exact"


def test_mcnemar_without_discordant_pairs_is_one():
    assert stats.mcnemar_exact([1, 0, 1], [1, 0, 1]).p_value == 1.0


def test_mcnemar_rejects_non_binary_scores():
    with pytest.raises(ValueError, match="0/1"):
        stats.mcnemar_exact([0.5, 1.0], [1.0, 1.0])


def test_holm_textbook_example():
    # m = 4: sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> monotone 0.06
    adjusted = stats.holm([0.01, 0.04, 0.03, 0.005])
    np.testing.assert_allclose(adjusted, [0.03, 0.06, 0.06, 0.02])


def test_holm_skips_nan_and_caps_at_one():
    adjusted = stats.holm([0.6, float("nan"), 0.02])
    assert math.isnan(adjusted[1])  # no test: not counted in the family
    np.testing.assert_allclose(adjusted[[0, 2]], [0.6, 0.04])  # family of 2
    np.testing.assert_allclose(stats.holm([0.6, 0.7]), [1.0, 1.0])


def _synthetic(n: int = 400, ratio: float = 0.95, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    vanilla = rng.gamma(4.0, 0.25, n)
    method = ratio * vanilla * rng.lognormal(0.0, 0.05, n)
    return method, vanilla


def test_bca_interval_contains_true_ratio():
    method, vanilla = _synthetic()
    r = stats.retention_interval(method, vanilla)
    assert r.lo < 0.95 * math.exp(0.05**2 / 2) < r.hi
    assert r.lo < r.estimate < r.hi
    assert (r.n, r.n_boot, r.alpha) == (400, 2000, 0.05)


def test_bca_interval_agrees_with_scipy_bca():
    method, vanilla = _synthetic(n=150, ratio=0.9, seed=5)
    ours = stats.retention_interval(method, vanilla, n_boot=4000)
    ref = sps.bootstrap(
        (method, vanilla),
        lambda m, v, axis=-1: m.mean(axis=axis) / v.mean(axis=axis),
        paired=True,
        vectorized=True,
        n_resamples=4000,
        method="BCa",
        rng=0,
    ).confidence_interval
    assert ours.lo == pytest.approx(ref.low, abs=3e-3)
    assert ours.hi == pytest.approx(ref.high, abs=3e-3)


def test_bca_collapses_to_a_point_when_method_equals_vanilla():
    _, vanilla = _synthetic()
    r = stats.retention_interval(vanilla, vanilla)
    assert (r.estimate, r.lo, r.hi) == (1.0, 1.0, 1.0)
    binary = np.array([1, 0, 1, 1, 0, 1], dtype=float)
    assert stats.retention_interval(binary, binary).lo == 1.0


def test_bca_is_reproducible_with_the_fixed_seed():
    method, vanilla = _synthetic(n=60)
    assert stats.retention_interval(method, vanilla) == stats.retention_interval(method, vanilla)


def test_identical_scores_retain_everything_even_at_zero():
    r = stats.retention_interval([0.0, 0.0, 0.0], [0.0, 0.0, 0.0])
    assert (r.estimate, r.lo, r.hi) == (1.0, 1.0, 1.0)


def test_bca_undefined_cases_give_nan():
    assert math.isnan(stats.retention_interval([1.0, 0.0], [0.0, 0.0]).estimate)
    single = stats.retention_interval([0.5], [1.0])
    assert single.estimate == 0.5 and math.isnan(single.lo)


def test_retention_rejects_bad_arguments():
    with pytest.raises(ValueError, match="alpha=1.5"):
        stats.retention_interval([1.0, 1.0], [1.0, 1.0], alpha=1.5)
    with pytest.raises(ValueError, match="shapes"):
        stats.retention_interval([1.0, 1.0], [1.0])
    with pytest.raises(ValueError, match="n_boot=0"):
        stats.retention_interval([1.0, 1.0], [1.0, 1.0], n_boot=0)


@pytest.mark.parametrize(
    ("lower", "margin", "expected"),
    [(0.99, 0.01, True), (0.9899, 0.01, False), (0.985, 0.02, True), (float("nan"), 0.02, False)],
)
def test_non_inferiority_rule_is_lower_bound_at_least_one_minus_margin(lower, margin, expected):
    interval = stats.RatioInterval(1.0, lower, 1.01, 0.05, 2000, 100)
    verdict = stats.non_inferiority(interval, margin)
    assert verdict.non_inferior is expected
    assert verdict.bar == pytest.approx(1 - margin)


def test_non_inferiority_rejects_margin_given_in_percent():
    with pytest.raises(ValueError, match="margin=1"):
        stats.non_inferiority(stats.RatioInterval(1.0, 1.0, 1.0, 0.05, 1, 2), 1)


def test_wilcoxon_equals_scipy_and_reports_zero_method():
    rng = np.random.default_rng(0)
    vanilla = rng.random(40)
    method = vanilla + rng.normal(-0.05, 0.1, 40)
    method[:5] = vanilla[:5]  # some zero differences
    res = stats.wilcoxon_test(method, vanilla)
    ref = sps.wilcoxon(method - vanilla, zero_method="zsplit")
    assert res.zero_method == "zsplit"
    assert (res.statistic, res.p_value) == pytest.approx((ref.statistic, ref.pvalue))
    ref_w = sps.wilcoxon(method - vanilla, zero_method="wilcox")
    assert stats.wilcoxon_test(method, vanilla, zero_method="wilcox").p_value == pytest.approx(ref_w.pvalue)


def test_wilcoxon_all_zero_differences_is_p_one_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = stats.wilcoxon_test([0.3, 0.5, 0.7], [0.3, 0.5, 0.7])
    assert res.p_value == 1.0


def test_wilcoxon_rejects_unknown_zero_method():
    with pytest.raises(ValueError, match="zero_method='drop'.*zsplit, wilcox, pratt"):
        stats.wilcoxon_test([1.0], [0.0], zero_method="drop")


def test_exact_match_rate_on_tokens_and_text():
    assert stats.exact_match_rate([[1, 2], [3], (4, 5)], [[1, 2], [3, 9], [4, 5]]) == pytest.approx(2 / 3)
    assert stats.exact_match_rate(["a b", "c"], ["a b", "c"]) == 1.0
    assert math.isnan(stats.exact_match_rate([], []))


def test_pair_by_id_keeps_common_samples_only():
    paired = stats.pair_by_id({"a": 1.0, "b": 0.0, "c": 1.0}, {"b": 1.0, "c": 1.0, "d": 0.0})
    assert paired.ids == ("b", "c")
    np.testing.assert_array_equal(paired.method, [0.0, 1.0])
    np.testing.assert_array_equal(paired.vanilla, [1.0, 1.0])


def test_compare_quality_picks_the_test_by_metric_type():
    binary = stats.pair_by_id({i: float(i % 2) for i in range(10)}, {i: 1.0 for i in range(10)})
    graded = stats.pair_by_id({i: i / 10 for i in range(10)}, {i: 0.5 for i in range(10)})
    b = stats.compare_quality(binary, n_boot=200)
    g = stats.compare_quality(graded, n_boot=200)
    assert b.test.test == "mcnemar_exact" and b.test.n_discordant == (5, 0)
    assert b.test.p_value == pytest.approx(2 / 32)
    assert g.test.test == "wilcoxon" and g.test.zero_method == "zsplit"
    assert [ni.margin for ni in b.non_inferiority] == [0.01, 0.02]
    assert b.retention.estimate == pytest.approx(0.5)


def test_median_interval_rank_matches_the_binomial_table():
    # k = the largest with 2 P(Bin(n, 1/2) <= k - 1) <= 0.05: the textbook sign-test table
    assert [stats.median_interval_rank(n) for n in range(1, 21)] == [0] * 5 + [1] * 3 + [2] * 3 + [3] * 3 + \
        [4] * 2 + [5] * 3 + [6]
    assert stats.median_interval_coverage(6, 1) == pytest.approx(1 - 2 / 64)
    assert stats.median_interval_coverage(20, 6) == pytest.approx(1 - 2 * sum(math.comb(20, i) for i in range(6)) / 2**20)
    assert stats.median_interval_rank(5000) > 0  # exact arithmetic, no float overflow at large n
    assert stats.median_interval_rank(6, alpha=0.01) == 0  # 99 % needs n >= 8
    assert stats.median_interval_rank(8, alpha=0.01) == 1


def test_speedup_interval_six_requests_hand_computed():
    # ratios 0.9, 1.2, 1.3, 1.5, 1.6, 2.0: k = 1, the min-max range, coverage 1 - 2 / 64
    s = stats.speedup_interval([0.9, 1.2, 2.6, 1.5, 3.2, 2.0], [1.0, 1.0, 2.0, 1.0, 2.0, 1.0])
    assert (s.median, s.lo, s.hi, s.n) == (pytest.approx(1.4), 0.9, 2.0, 6)
    assert s.coverage == pytest.approx(1 - 2 / 64) and s.verdict == "no clear difference"
    assert s.total == pytest.approx(11.4 / 8)
    faster = stats.speedup_interval([1.1, 1.2, 1.3, 1.5, 1.6, 2.0] * 2, [1.0] * 12)  # n = 12: k = 3
    assert (faster.lo, faster.hi, faster.verdict) == (1.2, 1.6, "faster")


def test_four_requests_never_read_faster():
    """The issue's case: four requests at 1.01-1.10 read "faster" [1.010, 1.100] with a percentile
    bootstrap (a min-max range, 87.5 % coverage); below n = 6 no 95 % interval exists."""
    for n in range(1, 6):
        s = stats.speedup_interval([2.0 + 0.01 * i for i in range(n)], [1.0] * n)
        assert s.verdict == "too few requests" and math.isnan(s.lo) and s.median >= 2.0
    s = stats.speedup_interval([1.01, 1.03, 1.06, 1.10], [1.0] * 4)
    assert s.verdict == "too few requests" and s.median == pytest.approx(1.045)


def test_one_stalled_request_moves_the_total_not_the_median():
    vanilla = [1.0] * 8
    method = [0.5] * 7 + [5.0]  # one request stalled 10x
    s = stats.speedup_interval(vanilla, method)
    assert s.median == 2.0 and s.verdict == "no clear difference"  # n = 8: k = 1, the stall is the lower bound
    assert s.total < 1.0  # the summed ratio says "slower"
    s = stats.speedup_interval([1.0] * 9, [0.5] * 8 + [5.0])  # n = 9: k = 2, the stall is outside
    assert (s.median, s.lo, s.verdict) == (2.0, 2.0, "faster")


def test_speedup_interval_edge_cases():
    same = stats.speedup_interval([2.0] * 6, [1.0] * 6)
    assert (same.median, same.lo, same.hi) == (2.0, 2.0, 2.0)
    one = stats.speedup_interval([2.0], [1.0])
    assert one.median == 2.0 and math.isnan(one.lo) and one.verdict == "too few requests"
    assert stats.speedup_interval([1.0, 0.0], [1.0, 1.0]).n == 1  # an untimed request is left out
    assert stats.speedup_interval([], []).verdict == "too few requests"
    assert stats.speedup_interval([1.0] * 6, [2.0] * 6).verdict == "slower"
    with pytest.raises(ValueError, match="alpha"):
        stats.speedup_interval([1.0, 2.0], [1.0, 1.0], alpha=1.5)


def test_per_token_speedup_does_not_count_shorter_answers_as_speed():
    """A method whose answers are half vanilla's length at the same time per token: per request it
    reads 2x, per token (the project's definition) 1.0x."""
    vanilla_s, vanilla_tokens = [2.0] * 8, [40] * 8
    method_s, method_tokens = [1.0] * 8, [20] * 8
    assert stats.speedup_interval(vanilla_s, method_s).median == 2.0
    s = stats.per_token_speedup(vanilla_s, vanilla_tokens, method_s, method_tokens)
    assert (s.median, s.lo, s.hi, s.total) == (1.0, 1.0, 1.0, 1.0) and s.verdict == "no clear difference"
    longer = stats.per_token_speedup([1.0] * 6, [10] * 6, [1.0] * 6, [15] * 6)  # 1.5x the tokens, same time
    assert longer.median == pytest.approx(1.5) and longer.verdict == "faster"
    zero = stats.per_token_speedup([1.0] * 6, [0] * 6, [1.0] * 6, [0] * 6)  # no token: counts as one
    assert zero.median == 1.0
    with pytest.raises(ValueError, match="one token count per request"):
        stats.per_token_speedup([1.0, 1.0], [1], [1.0, 1.0], [1])


def _ratio_samples(kind: str, rng: np.random.Generator, size: tuple[int, int], median: float) -> np.ndarray:
    """Per-request ratios with the given true median: light tails (lognormal) or heavy (Cauchy in
    log space: a stall or a lucky request can be any size)."""
    if kind == "lognormal":
        return median * np.exp(rng.normal(0.0, 0.3, size))
    return median * np.exp(np.clip(0.1 * rng.standard_cauchy(size), -30, 30))


@pytest.mark.parametrize("kind", ["lognormal", "cauchy"])
def test_speedup_interval_holds_its_level_at_every_n(kind):
    """Simulation, n = 4..30: under a true median ratio of 1.0 a "faster" or "slower" verdict comes
    up at most alpha of the time, and the interval covers a true median of 1.3 at least 1 - alpha
    of the time (Monte Carlo slack: 4 standard errors of 0.05 at 1,500 trials, 0.023)."""
    rng = np.random.default_rng(7)
    trials, alpha, slack = 1500, 0.05, 0.023
    for n in range(4, 31):
        null = _ratio_samples(kind, rng, (trials, n), 1.0)
        verdicts = [stats.speedup_interval(r, np.ones(n), alpha).verdict for r in null]
        false = sum(v in ("faster", "slower") for v in verdicts) / trials
        assert false <= alpha + slack, (n, false)
        if n < 6:
            assert set(verdicts) == {"too few requests"}
            continue
        shifted = _ratio_samples(kind, rng, (trials, n), 1.3)
        covered = 0
        for r in shifted:
            s = stats.speedup_interval(r, np.ones(n), alpha)
            covered += s.lo <= 1.3 <= s.hi
        assert covered / trials >= 1 - alpha - slack, (n, covered / trials)

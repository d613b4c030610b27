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


def test_speedup_interval_two_requests_hand_computed():
    # ratios 2 and 4: a resample's median is 2 (1/4), 3 (1/2) or 4 (1/4) -> 95 % interval [2, 4]
    s = stats.speedup_interval([2.0, 8.0], [1.0, 2.0])
    assert (s.median, s.lo, s.hi, s.n) == (3.0, 2.0, 4.0, 2)
    assert s.total == pytest.approx(10 / 3)
    assert s.verdict == "faster"


def test_speedup_interval_three_requests_spanning_one_is_no_clear_difference():
    # ratios 0.5, 1, 2: a resample's median is 0.5 with probability 7/27 (two or three draws of 0.5), so
    # the 2.5 % quantile is 0.5; likewise the 97.5 % quantile is 2
    s = stats.speedup_interval([1.0, 1.0, 4.0], [2.0, 1.0, 2.0])
    assert (s.median, s.lo, s.hi) == (1.0, 0.5, 2.0)
    assert s.total == pytest.approx(6 / 5)
    assert s.verdict == "no clear difference"


def test_one_stalled_request_moves_the_total_not_the_median():
    vanilla = [1.0] * 8
    method = [0.5] * 7 + [5.0]  # one request stalled 10x
    s = stats.speedup_interval(vanilla, method)
    assert s.median == 2.0 and s.lo == 2.0 and s.verdict == "faster"
    assert s.total < 1.0  # the summed ratio says "slower"


def test_speedup_interval_edge_cases():
    same = stats.speedup_interval([2.0, 2.0, 2.0], [1.0, 1.0, 1.0])
    assert (same.median, same.lo, same.hi) == (2.0, 2.0, 2.0)
    one = stats.speedup_interval([2.0], [1.0])
    assert one.median == 2.0 and math.isnan(one.lo) and one.verdict == "too few requests"
    assert stats.speedup_interval([1.0, 0.0], [1.0, 1.0]).n == 1  # an untimed request is left out
    assert stats.speedup_interval([], []).verdict == "too few requests"
    assert stats.speedup_interval([1.0, 3.0, 2.0], [2.0, 1.0, 1.0], seed=3) == \
        stats.speedup_interval([1.0, 3.0, 2.0], [2.0, 1.0, 1.0], seed=3)
    assert stats.speedup_interval([1.0, 2.0], [2.0, 4.0]).verdict == "slower"
    with pytest.raises(ValueError, match="n_boot"):
        stats.speedup_interval([1.0, 2.0], [1.0, 1.0], n_boot=0)

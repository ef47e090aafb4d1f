"""Tests for grpo_knobs.stats: each pins a number or an error that a wrong
implementation would change."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from grpo_knobs.stats import (
    hierarchical_bootstrap,
    mixed_group_fraction,
    mixed_group_probability,
    paired_bootstrap,
    predicted_mixed_fraction,
    sample_auc,
    seed_permutation_test,
    seed_summary,
    seed_welch_interval,
    summarize_time_to_target,
    time_to_target,
)
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats as sps


def _scores(seed: int, shape: tuple[int, int], p: float) -> np.ndarray:
    return (np.random.default_rng(seed).random(shape) < p).astype(float)


# --- paired_bootstrap -------------------------------------------------------
@pytest.mark.parametrize("method,scipy_method", [("percentile", "percentile"), ("bca", "BCa")])
def test_paired_bootstrap_matches_scipy_on_seed_averaged_differences(method, scipy_method):
    a = _scores(1, (3, 200), 0.7)
    b = _scores(2, (3, 200), 0.6)
    ours = paired_bootstrap(a, b, n_resamples=20_000, seed=3, method=method)
    ref = sps.bootstrap(
        ((a - b).mean(axis=0),),
        np.mean,
        n_resamples=20_000,
        method=scipy_method,
        confidence_level=0.95,
        rng=np.random.default_rng(4),
    )
    assert ours.mean_diff_pp == pytest.approx(100 * (a.mean() - b.mean()))
    # Monte-Carlo tolerance: both intervals come from 20k resamples.
    assert ours.ci_low_pp == pytest.approx(100 * ref.confidence_interval.low, abs=0.35)
    assert ours.ci_high_pp == pytest.approx(100 * ref.confidence_interval.high, abs=0.35)


def test_paired_bootstrap_per_seed_differences_and_sign():
    a = np.array([[1, 1, 1, 0], [1, 0, 1, 1]], dtype=float)
    b = np.array([[1, 0, 0, 0], [1, 1, 1, 1]], dtype=float)
    res = paired_bootstrap(a, b, n_resamples=2_000)
    np.testing.assert_allclose(res.per_seed_diff_pp, [50.0, -25.0])
    assert res.mean_diff_pp == pytest.approx(12.5)
    assert res.ci_low_pp <= res.mean_diff_pp <= res.ci_high_pp
    # a - b, not b - a: swapping flips the sign.
    assert paired_bootstrap(b, a, n_resamples=2_000).mean_diff_pp == pytest.approx(-12.5)


def test_paired_bootstrap_identical_recipes_give_zero_interval():
    a = _scores(5, (3, 50), 0.5)
    res = paired_bootstrap(a, a.copy(), n_resamples=500)
    assert (res.mean_diff_pp, res.ci_low_pp, res.ci_high_pp, res.p_le_zero) == (0.0, 0.0, 0.0, 1.0)


def test_paired_bootstrap_resamples_problems_jointly_across_seeds():
    # Seeds disagree in opposite directions on each problem; joint resampling
    # makes them cancel in every resample, independent resampling would not.
    a = np.array([[1, 0] * 20, [0, 1] * 20], dtype=float)
    b = np.zeros_like(a)
    res = paired_bootstrap(a, b, n_resamples=1_000)
    assert res.ci_low_pp == pytest.approx(50.0)
    assert res.ci_high_pp == pytest.approx(50.0)


def test_paired_bootstrap_is_deterministic_under_seed():
    a, b = _scores(6, (3, 80), 0.6), _scores(7, (3, 80), 0.5)
    r1 = paired_bootstrap(a, b, n_resamples=3_000, seed=11)
    r2 = paired_bootstrap(a, b, n_resamples=3_000, seed=11)
    r3 = paired_bootstrap(a, b, n_resamples=3_000, seed=12)
    assert (r1.ci_low_pp, r1.ci_high_pp, r1.p_le_zero) == (r2.ci_low_pp, r2.ci_high_pp, r2.p_le_zero)
    assert (r1.ci_low_pp, r1.ci_high_pp) != (r3.ci_low_pp, r3.ci_high_pp)


def test_paired_bootstrap_p_le_zero_counts_resamples_at_or_below_zero():
    a = np.array([[1.0, 0.0, 0.0, 0.0]])
    b = np.zeros((1, 4))
    res = paired_bootstrap(a, b, n_resamples=40_000, seed=0)
    # The resampled mean is zero exactly when problem 0 is never drawn: (3/4)^4.
    assert res.p_le_zero == pytest.approx(0.75**4, abs=0.01)


def test_paired_bootstrap_p_le_zero_counts_ties_that_rounding_moves_off_zero():
    # Ten seeds make per-problem differences of 0.1, 0.2 and -0.3, whose float sum is not exactly 0.
    a = np.zeros((10, 3))
    a[:1, 0], a[:2, 1] = 1.0, 1.0
    b = np.zeros((10, 3))
    b[:3, 2] = 1.0
    diffs = (a - b).mean(axis=0)
    draws = [diffs[list(idx)].mean() for idx in itertools.product(range(3), repeat=3)]
    assert any(0 < d < 1e-12 for d in draws)  # the case the tolerance is for
    # Enumerated over the 27 equally likely index draws: sums of 0.1 x + 0.2 y - 0.3 z at or below zero.
    exact = np.mean([np.isclose(d, 0) or d < 0 for d in draws])
    res = paired_bootstrap(a, b, n_resamples=100_000, seed=3)
    assert res.p_le_zero == pytest.approx(exact, abs=0.01)


@pytest.mark.parametrize("a_shape,b_shape", [((3, 10), (3, 11)), ((3, 10), (2, 10)), ((10,), (10,))])
def test_paired_bootstrap_rejects_mismatched_shapes(a_shape, b_shape):
    with pytest.raises(ValueError, match="shape"):
        paired_bootstrap(np.zeros(a_shape), np.zeros(b_shape))


def test_paired_bootstrap_rejects_misaligned_problem_ids():
    a = b = np.zeros((2, 3))
    with pytest.raises(ValueError, match="different order"):
        paired_bootstrap(a, b, problem_ids_a=["p1", "p2", "p3"], problem_ids_b=["p1", "p3", "p2"])
    with pytest.raises(ValueError, match="sets differ"):
        paired_bootstrap(a, b, problem_ids_a=["p1", "p2", "p3"], problem_ids_b=["p1", "p2", "p4"])
    with pytest.raises(ValueError, match="together"):
        paired_bootstrap(a, b, problem_ids_a=["p1", "p2", "p3"])
    with pytest.raises(ValueError, match="has 2 IDs"):
        paired_bootstrap(a, b, problem_ids_a=["p1", "p2"], problem_ids_b=["p1", "p2"])


def test_paired_bootstrap_rejects_duplicated_problem_ids():
    with pytest.raises(ValueError, match="duplicated.*p1"):
        paired_bootstrap(
            np.zeros((1, 3)), np.zeros((1, 3)), problem_ids_a=["p1", "p1", "p2"], problem_ids_b=["p1", "p1", "p2"]
        )


def test_paired_bootstrap_rejects_nan_scores():
    a = np.zeros((2, 3))
    a[0, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        paired_bootstrap(a, np.zeros((2, 3)))


# --- time_to_target ---------------------------------------------------------
RESP = [0, 4096, 8192, 12288, 16384]
ACTIVE = [0.0, 100.0, 210.0, 330.0, 450.0]
JOB = [20.0, 140.0, 270.0, 410.0, 560.0]


def test_time_to_target_exact_bracket():
    res = time_to_target(RESP, [0.80, 0.84, 0.87, 0.90, 0.86], 0.88, ACTIVE, JOB)
    assert res.reached
    assert (res.responses_low, res.responses_high) == (8192, 12288)
    assert (res.active_seconds_low, res.active_seconds_high) == (210.0, 330.0)
    assert (res.job_seconds_low, res.job_seconds_high) == (270.0, 410.0)
    assert res.censored_at is None
    assert res.describe() == "(8,192, 12,288]"


def test_time_to_target_counts_equality_and_uses_first_crossing():
    # Equal to target counts; the later dip does not move the bracket.
    res = time_to_target(RESP, [0.1, 0.5, 0.2, 0.6, 0.0], 0.5)
    assert (res.responses_low, res.responses_high) == (0, 4096)
    assert res.active_seconds_low is None and res.job_seconds_high is None


def test_time_to_target_censored_is_never_replaced_by_budget():
    res = time_to_target(RESP, [0.80, 0.84, 0.87, 0.88, 0.86], 0.8859375, ACTIVE, JOB)
    assert not res.reached
    assert res.censored_at == 16384
    assert res.responses_high is None and res.responses_low is None
    assert res.active_seconds_high is None and res.job_seconds_high is None
    assert res.describe() == "not reached by 16,384 responses"


def test_time_to_target_met_at_first_evaluation_collapses_bracket():
    res = time_to_target(RESP, [0.95, 0.9, 0.9, 0.9, 0.9], 0.9)
    assert (res.responses_low, res.responses_high) == (0, 0)


def test_time_to_target_rejects_unsorted_points_and_bad_axes():
    with pytest.raises(ValueError, match="increasing"):
        time_to_target([0, 8192, 4096], [0, 1, 1], 0.5)
    with pytest.raises(ValueError, match="shape"):
        time_to_target(RESP, [0.1] * 5, 0.5, active_seconds=[1, 2])


@given(st.lists(st.integers(0, 64), min_size=1, max_size=12), st.integers(0, 65))
def test_time_to_target_bracket_is_the_first_crossing(counts, target_count):
    responses = np.arange(len(counts)) * 1024
    accuracy = np.array(counts) / 64
    target = target_count / 64
    res = time_to_target(responses, accuracy, target)
    if res.reached:
        first = int(np.flatnonzero(accuracy >= target)[0])
        assert res.responses_high == responses[first]
        assert res.responses_low == responses[max(first - 1, 0)]
        assert res.censored_at is None
    else:
        assert (accuracy < target).all() and res.censored_at == responses[-1]
        assert res.responses_low is None and res.responses_high is None


def test_summarize_time_to_target_keeps_censoring():
    results = [
        time_to_target(RESP, [0.0, 0.2, 0.6, 0.7, 0.8], 0.5, ACTIVE, JOB),
        time_to_target(RESP, [0.0, 0.6, 0.6, 0.7, 0.8], 0.5, ACTIVE, JOB),
        time_to_target(RESP, [0.0, 0.1, 0.1, 0.2, 0.3], 0.5, ACTIVE, JOB),
    ]
    summary = summarize_time_to_target(results)
    assert (summary.n_runs, summary.n_reached) == (3, 2)
    assert (summary.responses_low_min, summary.responses_high_max) == (0, 8192)
    assert (summary.active_seconds_low_min, summary.active_seconds_high_max) == (0.0, 210.0)
    assert summary.censored_at == (16384,)
    assert summary.describe() == "2/3 reached within (0, 8,192]; 1 not reached by 16,384 responses"


def test_summarize_time_to_target_all_censored():
    res = time_to_target(RESP, [0.1] * 5, 0.5)
    summary = summarize_time_to_target([res, res])
    assert summary.n_reached == 0 and summary.responses_high_max is None
    assert summary.describe() == "0/2 reached; 2 not reached by 16,384 responses"


def test_summarize_time_to_target_rejects_mixed_targets():
    with pytest.raises(ValueError, match="mix targets"):
        summarize_time_to_target([time_to_target(RESP, [0.1] * 5, t) for t in (0.5, 0.6)])


# --- mixed groups -----------------------------------------------------------
def test_mixed_group_probability_values():
    assert mixed_group_probability(0.5, 2) == pytest.approx(0.5)
    assert mixed_group_probability(0.5, 8) == pytest.approx(1 - 2 / 256)
    assert mixed_group_probability(0.1, 4) == pytest.approx(1 - 0.1**4 - 0.9**4)
    assert mixed_group_probability(0.0, 8) == 0.0 and mixed_group_probability(1.0, 8) == 0.0
    np.testing.assert_allclose(
        mixed_group_probability(np.array([[0.2], [0.8]]), np.array([4, 16])),
        [[1 - 0.2**4 - 0.8**4, 1 - 0.2**16 - 0.8**16]] * 2,
    )


def test_mixed_group_probability_rejects_invalid_inputs():
    with pytest.raises(ValueError, match="p must"):
        mixed_group_probability(1.2, 4)
    with pytest.raises(ValueError, match="G must"):
        mixed_group_probability(0.5, 2.5)


def test_mixed_group_fraction_counts_unequal_groups():
    rewards = np.array([[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 1, 1]])
    assert mixed_group_fraction(rewards) == 0.5


def test_mixed_group_fraction_agrees_with_formula_by_monte_carlo():
    rng = np.random.default_rng(0)
    for p, g in [(0.1, 4), (0.3, 8), (0.85, 16)]:
        rewards = rng.random((40_000, g)) < p
        assert mixed_group_fraction(rewards) == pytest.approx(float(mixed_group_probability(p, g)), abs=0.01)


# --- seed summary and AUC ---------------------------------------------------
def test_seed_summary_mean_min_max_per_point():
    s = seed_summary([[0.1, 0.5], [0.3, 0.4], [0.2, 0.9]])
    np.testing.assert_allclose(s.mean, [0.2, 0.6])
    np.testing.assert_allclose(s.min, [0.1, 0.4])
    np.testing.assert_allclose(s.max, [0.3, 0.9])


def test_seed_summary_rejects_missing_points():
    with pytest.raises(ValueError, match="NaN"):
        seed_summary([[0.1, np.nan]])


def test_sample_auc_is_span_normalized_trapezoid():
    assert sample_auc([0, 10], [0.0, 1.0]) == pytest.approx(0.5)
    assert sample_auc([0, 4096, 12288], [0.2, 0.4, 0.4]) == pytest.approx((0.3 * 4096 + 0.4 * 8192) / 12288)
    assert sample_auc([100, 200, 300], [0.7] * 3) == pytest.approx(0.7)


# --- seed-level comparisons -------------------------------------------------
def _exact_hierarchical_distribution(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Every equally likely outcome of one hierarchical resample, enumerated by hand."""
    (n_a, n_p), n_b = a.shape, b.shape[0]
    values = []
    for rows_a in itertools.product(range(n_a), repeat=n_a):
        for rows_b in itertools.product(range(n_b), repeat=n_b):
            for cols in itertools.product(range(n_p), repeat=n_p):
                values.append(a[np.ix_(rows_a, cols)].mean() - b[np.ix_(rows_b, cols)].mean())
    return np.array(values)


@pytest.mark.parametrize("shape_a,shape_b", [((2, 2), (2, 2)), ((2, 3), (2, 3)), ((3, 2), (1, 2))])
def test_hierarchical_bootstrap_matches_enumerated_distribution(shape_a, shape_b):
    rng = np.random.default_rng(11)
    a = (rng.random(shape_a) < 0.6).astype(float)
    b = (rng.random(shape_b) < 0.4).astype(float)
    a[0, 0], b[0, 0] = 1.0, 0.0  # keep the distribution non-degenerate
    exact = 100 * _exact_hierarchical_distribution(a, b)
    res = hierarchical_bootstrap(a, b, n_resamples=200_000, seed=5)
    assert res.mean_diff_pp == pytest.approx(100 * (a.mean() - b.mean()))
    # The Monte Carlo CDF agrees with the enumerated one at every support point.
    support = np.unique(exact)
    exact_cdf = np.array([np.mean(exact <= v + 1e-9) for v in support])
    # Re-draw the Monte Carlo values with the same generator to read their CDF.
    mc = _hierarchical_draws(a, b, 200_000, 5)
    mc_cdf = np.array([np.mean(mc <= v + 1e-9) for v in support])
    assert np.max(np.abs(mc_cdf - exact_cdf)) < 0.005
    # The interval's ends are percentiles of that distribution.
    assert np.mean(exact < res.ci_low_pp - 1e-9) <= 0.025 + 0.005
    assert np.mean(exact <= res.ci_high_pp + 1e-9) >= 0.975 - 0.005
    assert res.p_le_zero == pytest.approx(np.mean(exact <= 1e-9), abs=0.005)


def _hierarchical_draws(a: np.ndarray, b: np.ndarray, n: int, seed: int) -> np.ndarray:
    """The resampled differences, by explicit index draws (the definition, not the weights)."""
    rng = np.random.default_rng(seed)
    (n_a, n_p), n_b = a.shape, b.shape[0]
    rows_a = rng.integers(0, n_a, (n, n_a))
    rows_b = rng.integers(0, n_b, (n, n_b))
    cols = rng.integers(0, n_p, (n, n_p))
    means_a = a[rows_a[:, :, None], cols[:, None, :]].mean(axis=(1, 2))
    means_b = b[rows_b[:, :, None], cols[:, None, :]].mean(axis=(1, 2))
    return 100 * (means_a - means_b)


def test_hierarchical_bootstrap_with_one_seed_each_is_the_problem_bootstrap():
    a, b = _scores(1, (1, 300), 0.6), _scores(2, (1, 300), 0.5)
    res = hierarchical_bootstrap(a, b, n_resamples=40_000, seed=1)
    ref = paired_bootstrap(a, b, n_resamples=40_000, seed=2)
    assert res.ci_low_pp == pytest.approx(ref.ci_low_pp, abs=0.5)
    assert res.ci_high_pp == pytest.approx(ref.ci_high_pp, abs=0.5)


def test_hierarchical_bootstrap_widens_with_seed_spread_and_ignores_seed_pairing():
    # Recipe a: one weak and two strong models; b: three middling ones.
    a = np.vstack([_scores(3, (1, 200), 0.2), _scores(4, (2, 200), 0.9)])
    b = _scores(5, (3, 200), 0.55)
    seed_level = hierarchical_bootstrap(a, b, n_resamples=20_000)
    conditional = paired_bootstrap(a, b, n_resamples=20_000)
    assert seed_level.ci_high_pp - seed_level.ci_low_pp > 2 * (conditional.ci_high_pp - conditional.ci_low_pp)
    # Reordering the seeds of one recipe changes only Monte Carlo noise: seeds are not paired.
    again = hierarchical_bootstrap(a[::-1], b, n_resamples=20_000)
    assert (again.ci_low_pp, again.ci_high_pp) == pytest.approx((seed_level.ci_low_pp, seed_level.ci_high_pp), abs=1.5)
    assert (seed_level.n_seeds_a, seed_level.n_seeds_b, seed_level.n_problems) == (3, 3, 200)


def test_hierarchical_bootstrap_accepts_unequal_seed_counts_and_rejects_other_problems():
    res = hierarchical_bootstrap(_scores(1, (5, 40), 0.6), _scores(2, (3, 40), 0.4), n_resamples=1_000)
    assert (res.n_seeds_a, res.n_seeds_b) == (5, 3)
    with pytest.raises(ValueError, match="same problems"):
        hierarchical_bootstrap(np.ones((3, 40)), np.ones((3, 41)))
    with pytest.raises(ValueError, match=r"\[seeds, problems\]"):
        hierarchical_bootstrap(np.ones(40), np.ones((3, 40)))


def _permutation_p_by_hand(m_a: list[float], m_b: list[float], alternative: str) -> float:
    pooled = m_a + m_b
    observed = np.mean(m_a) - np.mean(m_b)
    hits = total = 0
    for chosen in itertools.combinations(range(len(pooled)), len(m_a)):
        rest = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        d = np.mean([pooled[i] for i in chosen]) - np.mean(rest)
        total += 1
        hits += {
            "greater": d >= observed - 1e-12,
            "less": d <= observed + 1e-12,
            "two-sided": abs(d) >= abs(observed) - 1e-12,
        }[alternative]
    return hits / total


@pytest.mark.parametrize("alternative", ["greater", "less", "two-sided"])
@pytest.mark.parametrize("n_a,n_b", [(3, 3), (5, 3), (2, 4)])
def test_seed_permutation_test_matches_enumeration_by_hand(alternative, n_a, n_b):
    a, b = _scores(7, (n_a, 30), 0.55), _scores(8, (n_b, 30), 0.45)
    res = seed_permutation_test(a, b, alternative)
    expected = _permutation_p_by_hand(list(a.mean(axis=1)), list(b.mean(axis=1)), alternative)
    assert res.p_value == pytest.approx(expected)
    assert res.n_relabellings == math.comb(n_a + n_b, n_a)
    assert res.mean_diff_pp == pytest.approx(100 * (a.mean() - b.mean()))


def test_seed_permutation_test_extremes_and_ties():
    # Every seed of a beats every seed of b: only the observed labelling is as extreme.
    res = seed_permutation_test([0.7, 0.72, 0.7], [0.46, 0.72 - 0.5, 0.28])
    assert res.p_value == pytest.approx(1 / 20)
    assert seed_permutation_test([0.7, 0.72, 0.7], [0.46, 0.22, 0.28], "two-sided").p_value == pytest.approx(2 / 20)
    # Identical recipes: every relabelling ties, so p = 1.
    assert seed_permutation_test(np.full((3, 4), 0.5), np.full((3, 4), 0.5)).p_value == 1.0
    with pytest.raises(ValueError, match="alternative"):
        seed_permutation_test([1, 2], [1, 2], "bigger")


def test_seed_welch_interval_matches_the_formula():
    m_a, m_b = np.array([0.60, 0.72, 0.70]), np.array([0.46, 0.72, 0.28])
    res = seed_welch_interval(m_a, m_b)
    va, vb = m_a.var(ddof=1) / 3, m_b.var(ddof=1) / 3
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)
    half = sps.t.ppf(0.975, df) * math.sqrt(va + vb)
    diff = m_a.mean() - m_b.mean()
    assert res.df == pytest.approx(df)
    assert (res.ci_low_pp, res.ci_high_pp) == pytest.approx((100 * (diff - half), 100 * (diff + half)))
    with pytest.raises(ValueError, match="two seeds"):
        seed_welch_interval([0.5], [0.4, 0.3])


def test_predicted_mixed_fraction_averages_the_formula_over_groups():
    # All-or-nothing groups predict no mixing even though their mean rate is 0.5.
    assert predicted_mixed_fraction([0.0, 1.0, 0.0, 1.0], 8) == 0.0
    assert mixed_group_probability(0.5, 8) > 0.99
    assert predicted_mixed_fraction([0.5, 0.0], 2) == pytest.approx(0.25)

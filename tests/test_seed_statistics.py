"""Tests for the statistics of a many-seed study (grpo_knobs.stats): Holm's adjustment against its
step-down procedure, the permutation test beyond enumerable seed counts, and the rerun-versus-seed
variance split against hand numbers and simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from grpo_knobs.stats import (
    SampledPermutationTest,
    SeedPermutationTest,
    holm_adjust,
    rerun_seed_variance,
    seed_permutation_p,
    seed_permutation_test,
)
from hypothesis import given, settings
from hypothesis import strategies as st


# --- Holm ----------------------------------------------------------------------------------
def test_holm_adjust_by_hand():
    # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> 0.06, monotone)
    adjusted = holm_adjust([0.01, 0.04, 0.03, 0.005])
    assert adjusted.tolist() == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm_adjust([0.5, 0.6]).tolist() == [1.0, 1.0]  # capped at 1
    assert holm_adjust([0.02]).tolist() == [0.02]  # one comparison: unchanged
    assert holm_adjust([0.01, 0.01, 0.01]).tolist() == pytest.approx([0.03, 0.03, 0.03])  # ties alike
    assert holm_adjust([]).shape == (0,)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        holm_adjust([0.1, float("nan")])
    with pytest.raises(ValueError, match="shape"):
        holm_adjust([[0.1, 0.2]])


def _holm_rejects(p: list[float], alpha: float) -> set[int]:
    """Holm's procedure itself: walk the p-values up from the smallest, reject while
    p_(j) <= alpha / (m - j + 1), stop at the first that is not."""
    m = len(p)
    rejected = set()
    for j, i in enumerate(sorted(range(m), key=lambda i: p[i])):
        if p[i] * (m - j) > alpha:
            break
        rejected.add(i)
    return rejected


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=1, max_size=8))
def test_holm_adjusted_p_is_the_smallest_alpha_the_procedure_rejects_at(counts):
    p = [c / 1000 for c in counts]
    adjusted = holm_adjust(p)
    # Rejecting "adjusted <= alpha" is the step-down procedure at every level away from the
    # adjusted values themselves (where float rounding decides either way).
    for alpha in np.linspace(0.0005, 1.0, 240):
        if np.min(np.abs(adjusted - alpha)) < 1e-9:
            continue
        assert {i for i, q in enumerate(adjusted) if q <= alpha} == _holm_rejects(p, alpha), alpha


# --- permutation test at any seed count ----------------------------------------------------
def _scores(seed: int, shape: tuple[int, int], p: float) -> np.ndarray:
    return (np.random.default_rng(seed).random(shape) < p).astype(float)


def test_seed_permutation_p_enumerates_small_seed_counts_and_samples_large_ones():
    a, b = _scores(1, (5, 40), 0.55), _scores(2, (5, 40), 0.45)
    exact = seed_permutation_p(a, b, "two-sided")
    assert isinstance(exact, SeedPermutationTest) and exact == seed_permutation_test(a, b, "two-sided")
    sampled = seed_permutation_p(a, b, "two-sided", max_exact=0, n_relabellings=40_000, seed=3)
    assert isinstance(sampled, SampledPermutationTest) and sampled.n_relabellings == 40_000
    se = math.sqrt(exact.p_value * (1 - exact.p_value) / 40_000)
    assert abs(sampled.p_value - exact.p_value) < 4 * se + 1 / 40_000
    assert sampled == seed_permutation_p(a, b, "two-sided", max_exact=0, n_relabellings=40_000, seed=3)
    assert sampled.mean_diff_pp == pytest.approx(exact.mean_diff_pp)
    for alternative in ("greater", "less"):
        one = seed_permutation_p(a, b, alternative, max_exact=0, n_relabellings=40_000)
        assert abs(one.p_value - seed_permutation_test(a, b, alternative).p_value) < 0.01


def test_twenty_seeds_each_are_sampled_and_the_p_value_is_never_zero():
    rng = np.random.default_rng(0)
    high, low = 0.6 + 0.01 * rng.random(20), 0.3 + 0.01 * rng.random(20)  # [seeds]: every a above every b
    res = seed_permutation_p(high, low, "two-sided", n_relabellings=20_000)
    assert isinstance(res, SampledPermutationTest) and (res.n_seeds_a, res.n_seeds_b) == (20, 20)
    assert res.p_value == 1 / 20_001  # exact p is 2 / C(40, 20) = 1.4e-11: no sampled relabelling reaches it
    assert seed_permutation_p(high, low, "less", n_relabellings=1_000).p_value == 1.0
    same = seed_permutation_p(np.full(20, 0.5), np.full(20, 0.5), n_relabellings=1_000)
    assert same.p_value == 1.0  # every relabelling ties with the observed one
    mixed = seed_permutation_p(rng.random(20), rng.random(20), n_relabellings=20_000)
    assert 0.01 < mixed.p_value < 1  # no difference by construction
    with pytest.raises(ValueError, match="alternative"):
        seed_permutation_p(high, low, "bigger")


# --- rerun versus seed variance ------------------------------------------------------------
def test_variance_split_by_hand():
    # seed means 2 and 6; within: (1 + 1 + 1 + 1) / 2 = 2; between: 2 (4 + 4) / 1 = 16; n0 = 2.
    split = rerun_seed_variance([[1.0, 3.0], [5.0, 7.0]])
    assert (split.ms_within, split.ms_between, split.n0) == (2.0, 16.0, 2.0)
    assert (split.rerun_variance, split.seed_variance) == (2.0, 7.0)
    assert split.seed_share == pytest.approx(7 / 9)
    assert (split.n_seeds, split.n_runs, split.rerun_df) == (2, 4, 2)


def test_variance_split_of_the_committed_default_mode_reruns():
    # Validation % at 16,384 responses: seed 1 three times in default mode, seed 2 once
    # (benchmarks/results/determinism-h200/call-2-price). Seed 1's mean 32, grand mean 30:
    # within (64 + 36 + 4) / 2 = 52; between (3 * 4 + 36) / 1 = 48; n0 = 4 - 10 / 4 = 1.5.
    split = rerun_seed_variance([[40.0, 26.0, 30.0], [24.0, np.nan, np.nan]])
    assert (split.ms_within, split.ms_between, split.n0) == (52.0, 48.0, 1.5)
    assert split.seed_variance_raw == pytest.approx(-8 / 3)
    assert split.seed_variance == 0.0 and split.seed_share == 0.0 and split.rerun_df == 2


@pytest.mark.parametrize("reruns", [[3] * 20, [1] * 10 + [2] * 6 + [4] * 4])
def test_variance_split_is_unbiased_in_simulation(reruns):
    """Balanced and unbalanced designs: the raw estimates average to the true variances."""
    rng = np.random.default_rng(5)
    seed_sd, rerun_sd, width = 2.0, 1.0, max(reruns)
    raw, within = [], []
    for _ in range(3000):
        y = np.full((len(reruns), width), np.nan)  # [seeds, reruns]
        for i, k in enumerate(reruns):
            y[i, :k] = 50 + seed_sd * rng.standard_normal() + rerun_sd * rng.standard_normal(k)
        split = rerun_seed_variance(y)
        raw.append(split.seed_variance_raw)
        within.append(split.rerun_variance)
    assert np.mean(within) == pytest.approx(rerun_sd**2, rel=0.05)
    assert np.mean(raw) == pytest.approx(seed_sd**2, rel=0.08)


def test_variance_split_needs_two_seeds_and_a_rerun():
    with pytest.raises(ValueError, match="two seeds and a seed with two reruns"):
        rerun_seed_variance([[0.4], [0.3], [0.5]])  # one run per seed: reruns unseen
    with pytest.raises(ValueError, match="two seeds and a seed with two reruns"):
        rerun_seed_variance([[0.4, 0.3, 0.5]])
    with pytest.raises(ValueError, match=r"rows\) \[1\] have none"):
        rerun_seed_variance([[0.4, 0.3], [np.nan, np.nan]])
    with pytest.raises(ValueError, match="shape"):
        rerun_seed_variance([0.4, 0.3])

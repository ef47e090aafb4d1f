"""Statistics for the study's comparisons, on plain NumPy arrays.

Every function takes arrays whose shapes are stated in its docstring and
returns small frozen dataclasses, in the spirit of ``rliable``: the analysis
layer (``grpo_knobs.analysis``) turns run records into these arrays.

Conventions
-----------
* Accuracies are fractions or percentages; a function never converts units
  except ``paired_bootstrap``, whose outputs are in percentage points (pp)
  because the study reports differences that way.
* "Seeds" are independently trained models of one recipe; "problems" are the
  held-out problems every model was graded on, aligned by problem ID.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import combinations
from typing import Sequence

import numpy as np
from scipy import special
from scipy import stats as sps

# Float slack for comparisons of ratios of counts: a value printed as the target must count as
# reaching it, and a resampled difference that is zero in exact arithmetic (e.g. 0.1 + 0.2 - 0.3)
# must count as zero.
_TARGET_ATOL = 1e-9
# Resamples drawn per chunk, so problem-index matrices stay small in memory.
_CHUNK = 1_000


# ---------------------------------------------------------------------------
# Paired bootstrap over problems, jointly across seeds
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class PairedBootstrap:
    """Difference ``a - b`` in mean accuracy, in percentage points.

    ``ci_low_pp``/``ci_high_pp`` bound a problem-resampling interval that is
    conditional on the trained models: it measures uncertainty over problems,
    not over training seeds. ``per_seed_diff_pp`` has shape [seeds].
    ``p_le_zero`` is the share of resampled differences at or below zero, ties
    at zero included.
    """

    mean_diff_pp: float
    ci_low_pp: float
    ci_high_pp: float
    per_seed_diff_pp: np.ndarray
    p_le_zero: float
    n_resamples: int
    confidence: float
    method: str


def _as_score_matrix(x: np.ndarray | Sequence, name: str) -> np.ndarray:
    """Return ``x`` as a finite float array of shape [seeds, problems]."""
    arr = np.asarray(x, dtype=float)
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} must have shape [seeds, problems] with both > 0; got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite scores")
    return arr


def _check_problem_ids(ids_a: Sequence | None, ids_b: Sequence | None, n_problems: int) -> None:
    """Reject problem ID lists that would pair different problems."""
    if ids_a is None and ids_b is None:
        return
    if ids_a is None or ids_b is None:
        raise ValueError("pass problem_ids_a and problem_ids_b together, or neither")
    ids_a, ids_b = list(ids_a), list(ids_b)
    for name, ids in (("problem_ids_a", ids_a), ("problem_ids_b", ids_b)):
        if len(ids) != n_problems:
            raise ValueError(f"{name} has {len(ids)} IDs but the scores have {n_problems} problems")
        if len(set(ids)) != len(ids):
            dupes = sorted(str(i) for i, n in Counter(ids).items() if n > 1)[:5]
            raise ValueError(f"{name} has duplicated problem IDs, e.g. {dupes}")
    if set(ids_a) != set(ids_b):
        only_a = sorted(map(str, set(ids_a) - set(ids_b)))[:5]
        only_b = sorted(map(str, set(ids_b) - set(ids_a)))[:5]
        raise ValueError(f"problem ID sets differ: only in a {only_a}, only in b {only_b}")
    if ids_a != ids_b:
        first = next(i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y)
        raise ValueError(
            f"problem IDs are in a different order (first mismatch at column {first}: "
            f"{ids_a[first]!r} vs {ids_b[first]!r}); align both score matrices by problem ID"
        )


def _bootstrap_means(values: np.ndarray, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Means of ``values`` [problems] over ``n_resamples`` resamples of problem indices."""
    n = values.shape[0]
    out = np.empty(n_resamples)
    for start in range(0, n_resamples, _CHUNK):
        stop = min(start + _CHUNK, n_resamples)
        idx = rng.integers(0, n, size=(stop - start, n))
        out[start:stop] = values[idx].mean(axis=1)
    return out


def _bca_levels(boot: np.ndarray, values: np.ndarray, estimate: float, alpha: float) -> tuple[float, float]:
    """Bias-corrected and accelerated percentile levels for the mean of ``values``.

    Acceleration comes from the jackknife over problems; ``boot`` has shape
    [n_resamples].
    """
    n = values.shape[0]
    z0 = special.ndtri(np.mean(boot < estimate))
    jack = (values.sum() - values) / (n - 1)
    dev = jack.mean() - jack
    denom = 6.0 * np.sum(dev**2) ** 1.5
    accel = np.sum(dev**3) / denom if denom > 0 else 0.0
    levels = []
    for q in (alpha / 2, 1 - alpha / 2):
        zq = special.ndtri(q)
        levels.append(float(special.ndtr(z0 + (z0 + zq) / (1 - accel * (z0 + zq)))))
    return levels[0], levels[1]


def paired_bootstrap(
    a: np.ndarray | Sequence,
    b: np.ndarray | Sequence,
    n_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
    problem_ids_a: Sequence | None = None,
    problem_ids_b: Sequence | None = None,
    method: str = "percentile",
) -> PairedBootstrap:
    """Paired bootstrap of mean accuracy ``a - b`` over problems, jointly across seeds.

    ``a`` and ``b`` have shape [seeds, problems] with 0/1 (or fractional)
    scores; row ``i`` of ``a`` is paired with row ``i`` of ``b`` and column
    ``j`` is the same problem in both. Each resample draws problem indices once
    and applies them to every seed of both recipes, so the interval reflects
    which problems were sampled, conditional on these trained models.

    Because every seed sees the same indices, the resampled statistic equals
    the mean of the seed-averaged per-problem differences, which is what
    ``scipy.stats.bootstrap`` would resample.

    ``method`` is ``"percentile"`` (the study's) or ``"bca"``.
    Raises ValueError for misaligned inputs.
    """
    a_arr = _as_score_matrix(a, "a")
    b_arr = _as_score_matrix(b, "b")
    if a_arr.shape != b_arr.shape:
        raise ValueError(f"a and b must have the same [seeds, problems] shape; got {a_arr.shape} and {b_arr.shape}")
    _check_problem_ids(problem_ids_a, problem_ids_b, a_arr.shape[1])
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1); got {confidence}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be positive; got {n_resamples}")
    if method not in ("percentile", "bca"):
        raise ValueError(f"method must be 'percentile' or 'bca'; got {method!r}")

    diffs = a_arr - b_arr  # [seeds, problems]
    per_problem = diffs.mean(axis=0)  # [problems]
    estimate = float(per_problem.mean())
    boot = _bootstrap_means(per_problem, n_resamples, np.random.default_rng(seed))

    alpha = 1.0 - confidence
    levels = (alpha / 2, 1 - alpha / 2)
    if method == "bca":
        levels = _bca_levels(boot, per_problem, estimate, alpha)
    low, high = np.percentile(boot, [100 * levels[0], 100 * levels[1]])
    return PairedBootstrap(
        mean_diff_pp=100 * estimate,
        ci_low_pp=100 * float(low),
        ci_high_pp=100 * float(high),
        per_seed_diff_pp=100 * diffs.mean(axis=1),
        p_le_zero=float(np.mean(boot <= _TARGET_ATOL)),
        n_resamples=n_resamples,
        confidence=confidence,
        method=method,
    )


# ---------------------------------------------------------------------------
# Seed-level comparisons: the trained model is the unit
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class HierarchicalBootstrap:
    """Difference ``a - b`` in mean accuracy with a two-level (seeds, then problems) interval, in pp.

    Each resample redraws the trained models of each recipe and then the
    problems, so the interval covers what another set of training seeds, graded
    on another draw of problems, could give. ``p_le_zero`` is the share of
    resampled differences at or below zero.
    """

    mean_diff_pp: float
    ci_low_pp: float
    ci_high_pp: float
    p_le_zero: float
    n_seeds_a: int
    n_seeds_b: int
    n_problems: int
    n_resamples: int
    confidence: float


def _check_same_problems(a: np.ndarray, b: np.ndarray) -> None:
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a and b must grade the same problems; got {a.shape[1]} and {b.shape[1]} problem columns")


def hierarchical_bootstrap(
    a: np.ndarray | Sequence,
    b: np.ndarray | Sequence,
    n_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> HierarchicalBootstrap:
    """Two-level bootstrap of mean accuracy ``a - b``: seeds, then problems.

    ``a`` has shape [seeds_a, problems] and ``b`` [seeds_b, problems] (0/1 or
    fractional scores, columns in the same problem order; the seed counts may
    differ). Each resample draws ``seeds_a`` rows of ``a`` and ``seeds_b`` rows
    of ``b`` independently with replacement (seed ``i`` of one recipe is not
    paired with seed ``i`` of the other), then one set of problem indices with
    replacement, applied to both recipes. The interval is the percentile
    interval of the resampled differences.
    """
    a_arr = _as_score_matrix(a, "a")
    b_arr = _as_score_matrix(b, "b")
    _check_same_problems(a_arr, b_arr)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1); got {confidence}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be positive; got {n_resamples}")
    rng = np.random.default_rng(seed)
    (n_a, n_p), n_b = a_arr.shape, b_arr.shape[0]
    boot = np.empty(n_resamples)  # [n_resamples]
    for start in range(0, n_resamples, _CHUNK):
        size = min(_CHUNK, n_resamples - start)
        # Multinomial counts are the histograms of uniform index draws with replacement.
        w_a = rng.multinomial(n_a, np.full(n_a, 1 / n_a), size=size) / n_a  # [size, seeds_a]
        w_b = rng.multinomial(n_b, np.full(n_b, 1 / n_b), size=size) / n_b  # [size, seeds_b]
        w_p = rng.multinomial(n_p, np.full(n_p, 1 / n_p), size=size) / n_p  # [size, problems]
        per_problem = w_a @ a_arr - w_b @ b_arr  # [size, problems]: resampled seed means per problem
        boot[start : start + size] = np.sum(per_problem * w_p, axis=1)
    alpha = 1.0 - confidence
    low, high = np.percentile(boot, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return HierarchicalBootstrap(
        mean_diff_pp=100 * float(a_arr.mean() - b_arr.mean()),
        ci_low_pp=100 * float(low),
        ci_high_pp=100 * float(high),
        p_le_zero=float(np.mean(boot <= _TARGET_ATOL)),
        n_seeds_a=n_a,
        n_seeds_b=n_b,
        n_problems=n_p,
        n_resamples=n_resamples,
        confidence=confidence,
    )


@dataclass(frozen=True)
class SeedPermutationTest:
    """Exact permutation test of the difference in seed-mean accuracy ``a - b``, in pp.

    ``p_value`` is the share of the ``n_relabellings`` ways to split the pooled
    per-seed means into groups of ``n_seeds_a`` and ``n_seeds_b`` whose
    difference is at least as extreme as the observed one (``alternative``:
    "greater", "less" or "two-sided"). Its smallest possible value is
    ``1 / n_relabellings``.
    """

    mean_diff_pp: float
    p_value: float
    alternative: str
    n_relabellings: int
    n_seeds_a: int
    n_seeds_b: int


def _per_seed_means(x: np.ndarray | Sequence, name: str) -> np.ndarray:
    """[seeds] from [seeds, problems] (row means) or [seeds] (already per seed)."""
    arr = np.asarray(x, dtype=float)
    if arr.ndim == 1:
        arr = arr[:, None]
    return _as_score_matrix(arr, name).mean(axis=1)


def seed_permutation_test(
    a: np.ndarray | Sequence, b: np.ndarray | Sequence, alternative: str = "greater"
) -> SeedPermutationTest:
    """Exact permutation p-value for ``a - b`` over all relabellings of the per-seed means.

    ``a`` has shape [seeds_a, problems] or [seeds_a] (per-seed accuracies),
    ``b`` likewise; both in the same units. Every one of the
    ``C(seeds_a + seeds_b, seeds_a)`` assignments of the pooled per-seed means
    to recipe ``a`` is enumerated, so the p-value is exact, not Monte Carlo.
    """
    if alternative not in ("greater", "less", "two-sided"):
        raise ValueError(f"alternative must be 'greater', 'less' or 'two-sided'; got {alternative!r}")
    m_a, m_b = _per_seed_means(a, "a"), _per_seed_means(b, "b")
    pooled = np.concatenate([m_a, m_b])  # [seeds_a + seeds_b]
    n_a, total = m_a.size, pooled.sum()
    groups = np.array(list(combinations(range(pooled.size), n_a)))  # [relabellings, seeds_a]
    sum_a = pooled[groups].sum(axis=1)  # [relabellings]
    diffs = sum_a / n_a - (total - sum_a) / m_b.size  # [relabellings]
    observed = m_a.mean() - m_b.mean()
    tol = 1e-12 * max(1.0, float(np.abs(pooled).max()))  # ties must count as "at least as extreme"
    if alternative == "greater":
        extreme = diffs >= observed - tol
    elif alternative == "less":
        extreme = diffs <= observed + tol
    else:
        extreme = np.abs(diffs) >= abs(observed) - tol
    return SeedPermutationTest(
        mean_diff_pp=100 * float(observed),
        p_value=float(extreme.mean()),
        alternative=alternative,
        n_relabellings=len(groups),
        n_seeds_a=n_a,
        n_seeds_b=m_b.size,
    )


@dataclass(frozen=True)
class WelchInterval:
    """Welch's t interval for the difference in seed-mean accuracy ``a - b``, in pp.

    Treats each trained model's accuracy as one observation; ``df`` is the
    Welch-Satterthwaite degrees of freedom and ``p_value`` is two-sided.
    """

    mean_diff_pp: float
    ci_low_pp: float
    ci_high_pp: float
    df: float
    p_value: float
    confidence: float


def seed_welch_interval(a: np.ndarray | Sequence, b: np.ndarray | Sequence, confidence: float = 0.95) -> WelchInterval:
    """Welch's unequal-variance t interval on per-seed mean accuracies.

    ``a`` [seeds_a, problems] or [seeds_a], ``b`` likewise; each recipe needs
    at least two seeds.
    """
    m_a, m_b = _per_seed_means(a, "a"), _per_seed_means(b, "b")
    if m_a.size < 2 or m_b.size < 2:
        raise ValueError(f"Welch's interval needs at least two seeds per recipe; got {m_a.size} and {m_b.size}")
    res = sps.ttest_ind(m_a, m_b, equal_var=False)
    ci = res.confidence_interval(confidence_level=confidence)
    return WelchInterval(
        mean_diff_pp=100 * float(m_a.mean() - m_b.mean()),
        ci_low_pp=100 * float(ci.low),
        ci_high_pp=100 * float(ci.high),
        df=float(res.df),
        p_value=float(res.pvalue),
        confidence=confidence,
    )


# ---------------------------------------------------------------------------
# Time to target, as observation brackets with right censoring
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class TimeToTarget:
    """When a run first reached ``target``, as a bracket between evaluations.

    Evaluations are discrete, so the crossing lies in ``(previous evaluation,
    first evaluation at or above target]``. Bracket fields are None when the
    run never reached the target; it is then right-censored at
    ``censored_at`` responses and must be reported as "not reached by N",
    never as N. A target already met by the first evaluation collapses the
    bracket to that point (low == high).
    """

    target: float
    reached: bool
    responses_low: float | None
    responses_high: float | None
    active_seconds_low: float | None
    active_seconds_high: float | None
    job_seconds_low: float | None
    job_seconds_high: float | None
    censored_at: float | None

    def describe(self, unit: str = "responses") -> str:
        """Human-readable bracket in ``unit`` (responses, active_seconds, job_seconds)."""
        if not self.reached:
            return f"not reached by {_fmt_number(self.censored_at)} responses"
        low, high = getattr(self, f"{unit}_low"), getattr(self, f"{unit}_high")
        if low is None:
            return "n/a"
        return f"({_fmt_number(low)}, {_fmt_number(high)}]"


def _fmt_number(x: float | None) -> str:
    """Integers without decimals, other values with one decimal."""
    if x is None:
        return "n/a"
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"


def _optional_axis(values: np.ndarray | Sequence | None, n: int, name: str) -> np.ndarray | None:
    """Validate an optional time axis aligned with the evaluation points."""
    if values is None:
        return None
    arr = np.asarray(values, dtype=float)
    if arr.shape != (n,):
        raise ValueError(f"{name} must have shape [{n}] like responses; got {arr.shape}")
    return arr


def time_to_target(
    responses: np.ndarray | Sequence,
    accuracy: np.ndarray | Sequence,
    target: float,
    active_seconds: np.ndarray | Sequence | None = None,
    job_seconds: np.ndarray | Sequence | None = None,
) -> TimeToTarget:
    """Bracket the first evaluation at or above ``target``.

    ``responses``, ``accuracy`` and the optional ``active_seconds`` /
    ``job_seconds`` have shape [eval_points], ordered by strictly increasing
    cumulative responses. ``target`` is in the units of ``accuracy``. A run
    that never reaches it stays censored at its last evaluation.
    """
    resp = np.asarray(responses, dtype=float)
    acc = np.asarray(accuracy, dtype=float)
    if resp.ndim != 1 or resp.size == 0 or acc.shape != resp.shape:
        raise ValueError(f"responses and accuracy must be 1-D and equally long; got {resp.shape} and {acc.shape}")
    if np.any(np.diff(resp) <= 0):
        raise ValueError("responses must be strictly increasing evaluation points")
    if not np.all(np.isfinite(acc)):
        raise ValueError("accuracy contains NaN or infinite values")
    active = _optional_axis(active_seconds, resp.size, "active_seconds")
    job = _optional_axis(job_seconds, resp.size, "job_seconds")

    hits = np.flatnonzero(acc >= target - _TARGET_ATOL)
    if hits.size == 0:
        return TimeToTarget(target, False, None, None, None, None, None, None, float(resp[-1]))
    hi = int(hits[0])
    lo = max(hi - 1, 0)

    def pick(axis: np.ndarray | None) -> tuple[float | None, float | None]:
        return (None, None) if axis is None else (float(axis[lo]), float(axis[hi]))

    return TimeToTarget(target, True, float(resp[lo]), float(resp[hi]), *pick(active), *pick(job), None)


@dataclass(frozen=True)
class TimeToTargetSummary:
    """Time to target across the seeds of one recipe.

    Ranges span the reached runs' brackets: ``*_low_min`` is the earliest
    bracket start and ``*_high_max`` the latest bracket end. ``censored_at``
    lists, per censored run, the responses it was censored at.
    """

    target: float
    n_runs: int
    n_reached: int
    responses_low_min: float | None
    responses_high_max: float | None
    active_seconds_low_min: float | None
    active_seconds_high_max: float | None
    job_seconds_low_min: float | None
    job_seconds_high_max: float | None
    censored_at: tuple[float, ...]

    def describe(self, unit: str = "responses") -> str:
        """E.g. "2/3 reached within (4,096, 12,288]; 1 not reached by 32,768 responses"."""
        parts = [f"{self.n_reached}/{self.n_runs} reached"]
        if self.n_reached:
            low, high = getattr(self, f"{unit}_low_min"), getattr(self, f"{unit}_high_max")
            if low is not None:
                parts[0] += f" within ({_fmt_number(low)}, {_fmt_number(high)}]"
        for n_resp in sorted(set(self.censored_at)):
            count = self.censored_at.count(n_resp)
            parts.append(f"{count} not reached by {_fmt_number(n_resp)} responses")
        return "; ".join(parts)


def summarize_time_to_target(results: Sequence[TimeToTarget]) -> TimeToTargetSummary:
    """Summarize per-seed brackets of one recipe and one target."""
    if not results:
        raise ValueError("summarize_time_to_target needs at least one result")
    targets = {r.target for r in results}
    if len(targets) != 1:
        raise ValueError(f"results mix targets {sorted(targets)}; summarize one target at a time")
    reached = [r for r in results if r.reached]

    def span(unit: str) -> tuple[float | None, float | None]:
        lows = [getattr(r, f"{unit}_low") for r in reached]
        highs = [getattr(r, f"{unit}_high") for r in reached]
        if not reached or any(v is None for v in lows + highs):
            return None, None
        return min(lows), max(highs)

    return TimeToTargetSummary(
        target=targets.pop(),
        n_runs=len(results),
        n_reached=len(reached),
        responses_low_min=span("responses")[0],
        responses_high_max=span("responses")[1],
        active_seconds_low_min=span("active_seconds")[0],
        active_seconds_high_max=span("active_seconds")[1],
        job_seconds_low_min=span("job_seconds")[0],
        job_seconds_high_max=span("job_seconds")[1],
        censored_at=tuple(r.censored_at for r in results if not r.reached),
    )


# ---------------------------------------------------------------------------
# Group size: mixed reward groups
# ---------------------------------------------------------------------------
def mixed_group_probability(p: np.ndarray | float, G: np.ndarray | int) -> np.ndarray:
    """Chance that ``G`` independent binary rewards with success ``p`` are not all equal.

    ``1 - p**G - (1 - p)**G``; ``p`` and ``G`` broadcast against each other.
    Only mixed groups carry a relative learning signal after the group mean is
    subtracted.
    """
    p_arr = np.asarray(p, dtype=float)
    g_arr = np.asarray(G)
    if np.any((p_arr < 0) | (p_arr > 1)):
        raise ValueError("p must lie in [0, 1]")
    if np.any(g_arr < 1) or not np.all(np.equal(np.mod(g_arr, 1), 0)):
        raise ValueError("G must be a positive integer group size")
    return 1.0 - p_arr**g_arr - (1.0 - p_arr) ** g_arr


def predicted_mixed_fraction(success: np.ndarray | Sequence, G: int) -> float:
    """Mean over groups of ``1 - p**G - (1 - p)**G``, one ``p`` per group.

    ``success`` has shape [groups]: each group's own success rate (e.g. its
    mean reward). Averaging the formula over per-group rates, rather than
    evaluating it at the mean rate, keeps the spread of difficulty: groups
    that always or never succeed contribute nothing.
    """
    p = np.asarray(success, dtype=float)
    if p.ndim != 1 or p.size == 0:
        raise ValueError(f"success must have shape [groups] with groups > 0; got {p.shape}")
    return float(np.mean(mixed_group_probability(p, G)))


def mixed_group_fraction(rewards: np.ndarray | Sequence) -> float:
    """Share of groups whose rewards are not all equal.

    ``rewards`` has shape [groups, G]: one row per prompt, one column per
    sampled answer, as recorded in a collection.
    """
    arr = np.asarray(rewards, dtype=float)
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise ValueError(f"rewards must have shape [groups, G] with groups > 0; got {arr.shape}")
    return float(np.mean(np.ptp(arr, axis=1) > 0))


# ---------------------------------------------------------------------------
# Seed ranges and curve areas
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class SeedSummary:
    """Mean and observed range across seeds; each field has shape [points]."""

    mean: np.ndarray
    min: np.ndarray
    max: np.ndarray


def seed_summary(values: np.ndarray | Sequence) -> SeedSummary:
    """Mean, min and max across seeds at every evaluation point.

    ``values`` has shape [seeds, points]. The study draws dots at the mean and
    vertical lines over the observed min-max range (not a confidence band).
    """
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise ValueError(f"values must have shape [seeds, points] with seeds > 0; got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("values contain NaN: every seed needs every evaluation point")
    return SeedSummary(arr.mean(axis=0), arr.min(axis=0), arr.max(axis=0))


def sample_auc(responses: np.ndarray | Sequence, accuracy: np.ndarray | Sequence) -> float:
    """Area under accuracy over cumulative responses, divided by the response span.

    Trapezoidal rule on [eval_points] arrays; the result is a time-averaged
    accuracy in the units of ``accuracy`` (the study's ``sample_auc``).
    """
    resp = np.asarray(responses, dtype=float)
    acc = np.asarray(accuracy, dtype=float)
    if resp.ndim != 1 or resp.size < 2 or acc.shape != resp.shape:
        raise ValueError("sample_auc needs at least two aligned evaluation points")
    if np.any(np.diff(resp) <= 0):
        raise ValueError("responses must be strictly increasing evaluation points")
    return float(np.trapezoid(acc, resp) / (resp[-1] - resp[0]))


# ---------------------------------------------------------------------------
# Many comparisons, many seeds, reruns of one seed
# ---------------------------------------------------------------------------
def holm_adjust(p_values: np.ndarray | Sequence) -> np.ndarray:
    """Holm's step-down adjusted p-values, shape [comparisons] -> [comparisons], in the input order.

    With the p-values sorted ascending, p_(1) <= ... <= p_(m), the adjusted value of the
    i-th smallest is ``max over j <= i of min(1, (m - j + 1) * p_(j))``. Rejecting every
    comparison whose adjusted p is at most alpha is Holm's procedure: the chance of any
    false rejection in the family stays at most alpha whatever the dependence between the
    tests. Ties get the same adjusted value whichever order they are taken in.
    """
    p = np.asarray(p_values, dtype=float)
    if p.ndim != 1:
        raise ValueError(f"p_values must have shape [comparisons]; got {p.shape}")
    if not np.all((p >= 0) & (p <= 1)):
        raise ValueError(f"p_values must lie in [0, 1] (no NaN); got {p.tolist()}")
    m = p.size
    order = np.argsort(p, kind="stable")  # [comparisons]
    stepped = np.minimum(1.0, (m - np.arange(m)) * p[order])  # [comparisons], (m - j + 1) p_(j) for j = 1..m
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(stepped)
    return adjusted


# Above this many relabellings, seed_permutation_p samples them instead of listing them all
# (5 v 5 seeds: 252; 10 v 10: 184,756; 20 v 20: 1.4e11).
MAX_EXACT_RELABELLINGS = 200_000


@dataclass(frozen=True)
class SampledPermutationTest:
    """Monte Carlo permutation test of the difference in seed-mean accuracy ``a - b``, in pp.

    ``n_relabellings`` random relabellings of the pooled per-seed means are drawn (with
    ``seed``); ``p_value = (1 + extreme) / (1 + n_relabellings)``, counting the observed
    labelling as one of them: the test keeps its level (under no difference, P(p <= alpha)
    <= alpha) and p is never zero. Its Monte Carlo standard error is about
    sqrt(p (1 - p) / n_relabellings).
    """

    mean_diff_pp: float
    p_value: float
    alternative: str
    n_relabellings: int
    n_seeds_a: int
    n_seeds_b: int
    seed: int


def seed_permutation_p(
    a: np.ndarray | Sequence,
    b: np.ndarray | Sequence,
    alternative: str = "two-sided",
    max_exact: int = MAX_EXACT_RELABELLINGS,
    n_relabellings: int = 100_000,
    seed: int = 0,
) -> SeedPermutationTest | SampledPermutationTest:
    """The permutation test of :func:`seed_permutation_test` at any seed count.

    ``a`` has shape [seeds_a, problems] or [seeds_a], ``b`` likewise. With at most
    ``max_exact`` relabellings (``C(seeds_a + seeds_b, seeds_a)``) every one is enumerated
    (a :class:`SeedPermutationTest`); beyond, ``n_relabellings`` are sampled (a
    :class:`SampledPermutationTest`).
    """
    if alternative not in ("greater", "less", "two-sided"):
        raise ValueError(f"alternative must be 'greater', 'less' or 'two-sided'; got {alternative!r}")
    m_a, m_b = _per_seed_means(a, "a"), _per_seed_means(b, "b")
    if special.comb(m_a.size + m_b.size, m_a.size, exact=True) <= max_exact:
        return seed_permutation_test(m_a, m_b, alternative)
    if n_relabellings < 1:
        raise ValueError(f"n_relabellings must be positive; got {n_relabellings}")
    pooled = np.concatenate([m_a, m_b])  # [seeds_a + seeds_b]
    n_a, total = m_a.size, pooled.sum()
    observed = m_a.mean() - m_b.mean()
    tol = 1e-12 * max(1.0, float(np.abs(pooled).max()))  # ties count as "at least as extreme"
    rng = np.random.default_rng(seed)
    extreme = 0
    for start in range(0, n_relabellings, _CHUNK):
        size = min(_CHUNK, n_relabellings - start)
        shuffled = rng.permuted(np.broadcast_to(pooled, (size, pooled.size)), axis=1)  # [size, seeds_a + seeds_b]
        sum_a = shuffled[:, :n_a].sum(axis=1)  # [size]
        diffs = sum_a / n_a - (total - sum_a) / m_b.size  # [size]
        if alternative == "greater":
            extreme += int(np.sum(diffs >= observed - tol))
        elif alternative == "less":
            extreme += int(np.sum(diffs <= observed + tol))
        else:
            extreme += int(np.sum(np.abs(diffs) >= abs(observed) - tol))
    return SampledPermutationTest(
        mean_diff_pp=100 * float(observed),
        p_value=(1 + extreme) / (1 + n_relabellings),
        alternative=alternative,
        n_relabellings=n_relabellings,
        n_seeds_a=n_a,
        n_seeds_b=m_b.size,
        seed=seed,
    )


@dataclass(frozen=True)
class VarianceSplit:
    """How an endpoint's spread divides into reruns of one seed and differences between seeds.

    Model: run ``j`` of seed ``i`` ends at ``mu + s_i + r_ij``, with seed effects ``s_i`` of
    variance ``seed_variance`` and rerun noise ``r_ij`` (the GPU's arithmetic: the same seed,
    other rounding) of variance ``rerun_variance``. A fresh seed's single run then varies by
    their sum. Variances are in the endpoint's units squared.
    """

    rerun_variance: float  # within a seed: the pooled variance of its reruns
    seed_variance: float  # between seeds beyond rerun noise, floored at 0
    seed_variance_raw: float  # the moment estimate before the floor (negative: reruns spread as much as seeds)
    seed_share: float  # seed_variance / (seed_variance + rerun_variance); NaN when both are 0
    ms_between: float
    ms_within: float
    n0: float  # the effective reruns per seed of an unbalanced design
    n_seeds: int
    n_runs: int
    rerun_df: int  # sum over seeds of (reruns - 1): how much the rerun variance rests on


def rerun_seed_variance(endpoints: np.ndarray | Sequence) -> VarianceSplit:
    """One-way random-effects ANOVA estimate of the rerun and seed variance of an endpoint.

    ``endpoints`` has shape [seeds, reruns]: row ``i`` holds the endpoint (e.g. test
    accuracy) of every rerun of seed ``i``, NaN where a seed has fewer reruns than the
    widest row. With ``k_i`` reruns of seed ``i``, ``N = sum k_i`` runs and ``a`` seeds:

    - ``ms_within = sum_ij (y_ij - mean_i)^2 / (N - a)`` estimates the rerun variance;
    - ``ms_between = sum_i k_i (mean_i - mean)^2 / (a - 1)`` has expectation
      ``rerun_variance + n0 * seed_variance``, ``n0 = (N - sum k_i^2 / N) / (a - 1)``;
    - ``seed_variance = (ms_between - ms_within) / n0``, floored at 0.

    Both are unbiased before the floor (the ANOVA, or Henderson I, estimator). A seed with
    one run adds to ``ms_between`` only. Needs two seeds and one seed with two reruns;
    with few of either the estimates are very imprecise (``rerun_df`` says how few).
    """
    y = np.asarray(endpoints, dtype=float)
    if y.ndim != 2:
        raise ValueError(f"endpoints must have shape [seeds, reruns]; got {y.shape}")
    if np.isinf(y).any():
        raise ValueError("endpoints must be finite (NaN marks a missing rerun)")
    k = np.sum(~np.isnan(y), axis=1)  # [seeds] reruns per seed
    if np.any(k == 0):
        empty = np.flatnonzero(k == 0).tolist()
        raise ValueError(f"every seed needs at least one run; seeds (rows) {empty} have none")
    n_seeds, n_runs = y.shape[0], int(k.sum())
    if n_seeds < 2 or n_runs - n_seeds < 1:
        raise ValueError(
            f"the split needs two seeds and a seed with two reruns; got {n_seeds} seeds and {n_runs} runs"
        )
    seed_means = np.nanmean(y, axis=1)  # [seeds]
    grand = np.nansum(y) / n_runs
    ms_within = float(np.nansum((y - seed_means[:, None]) ** 2) / (n_runs - n_seeds))
    ms_between = float(np.sum(k * (seed_means - grand) ** 2) / (n_seeds - 1))
    n0 = float((n_runs - np.sum(k**2) / n_runs) / (n_seeds - 1))
    raw = (ms_between - ms_within) / n0
    seed_var = max(0.0, raw)
    total = seed_var + ms_within
    return VarianceSplit(
        rerun_variance=ms_within,
        seed_variance=seed_var,
        seed_variance_raw=raw,
        seed_share=seed_var / total if total > 0 else float("nan"),
        ms_between=ms_between,
        ms_within=ms_within,
        n0=n0,
        n_seeds=n_seeds,
        n_runs=n_runs,
        rerun_df=n_runs - n_seeds,
    )

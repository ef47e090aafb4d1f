"""The four GRPO batch knobs and their exact accounting.

One collection gathers ``rollout_batch_size`` prompts (P) x ``n_samples_per_prompt``
responses (G). Training consumes it as ``num_steps_per_rollout`` (S) disjoint slices of
``global_batch_size`` responses (B), one optimizer update per slice. Every response is
used exactly once, so P x G = B x S must hold exactly: nothing is floored, trimmed or
replayed. Memory settings (micro-batches, token budgets) live elsewhere and never
change B.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

KNOB_NAMES = ("rollout_batch_size", "n_samples_per_prompt", "global_batch_size", "num_steps_per_rollout")


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            raise ValueError(f"{name} must be an integer, got the float {value!r}; write {int(value)}.")
        raise ValueError(f"{name} must be a positive integer, got {value!r} ({type(value).__name__}).")
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value}.")
    return value


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _nearest(values: list[int], target: int, k: int = 2) -> list[int]:
    return sorted(sorted(values, key=lambda v: (abs(v - target), v))[:k])


@dataclass(frozen=True)
class BatchPlan:
    """Exact batch accounting for one GRPO configuration.

    Args:
        rollout_batch_size: P, prompts drawn per collection.
        n_samples_per_prompt: G, responses sampled per prompt (the group size, >= 2).
        global_batch_size: B, responses per optimizer update.
        num_steps_per_rollout: S, updates per collection; derived as P x G / B when None.

    Raises:
        ValueError: a knob is not a positive integer, G < 2, or the shape does not
            partition exactly. The message names the knob to change and nearby valid values.
    """

    rollout_batch_size: int
    n_samples_per_prompt: int
    global_batch_size: int
    num_steps_per_rollout: int | None = field(default=None)

    def __post_init__(self) -> None:
        p = _check_positive_int("rollout_batch_size", self.rollout_batch_size)
        g = _check_positive_int("n_samples_per_prompt", self.n_samples_per_prompt)
        b = _check_positive_int("global_batch_size", self.global_batch_size)
        if g < 2:
            raise ValueError(
                "n_samples_per_prompt must be at least 2: GRPO's advantage compares responses within a "
                f"group, and a group of {g} carries no signal. Try 4 or 8."
            )
        n = p * g
        if self.num_steps_per_rollout is None:
            if n % b:
                valid_b = _nearest(_divisors(n), b)
                valid_p = _nearest([m // g for m in range(b, 8 * n + b, b) if m % g == 0], p)
                raise ValueError(
                    f"global_batch_size={b} does not divide the collection of rollout_batch_size x "
                    f"n_samples_per_prompt = {p} x {g} = {n} responses, so some responses would be "
                    f"dropped. Change global_batch_size to a divisor of {n} (nearest: "
                    f"{', '.join(map(str, valid_b))}) or rollout_batch_size so that P x G is a multiple "
                    f"of {b} (nearest: {', '.join(map(str, valid_p))})."
                )
            object.__setattr__(self, "num_steps_per_rollout", n // b)
        else:
            s = _check_positive_int("num_steps_per_rollout", self.num_steps_per_rollout)
            if b * s != n:
                hint = (
                    f"num_steps_per_rollout={n // b}"
                    if n % b == 0
                    else (
                        f"a global_batch_size that divides {n} "
                        f"(nearest: {', '.join(map(str, _nearest(_divisors(n), b)))})"
                    )
                )
                raise ValueError(
                    f"Inconsistent batch shape: rollout_batch_size x n_samples_per_prompt = {p} x {g} = {n} "
                    f"responses, but global_batch_size x num_steps_per_rollout = {b} x {s} = {b * s}. Every "
                    f"response must be used exactly once. Use {hint}, or omit num_steps_per_rollout to derive it."
                )

    @property
    def responses_per_collection(self) -> int:
        return self.rollout_batch_size * self.n_samples_per_prompt

    @property
    def groups_per_update(self) -> int | None:
        """Whole groups per update slice, or None when a slice splits a group."""
        b, g = self.global_batch_size, self.n_samples_per_prompt
        return b // g if b % g == 0 else None

    def collections_for_budget(self, response_budget: int) -> int:
        """Collections that spend exactly ``response_budget`` responses."""
        _check_positive_int("response_budget", response_budget)
        n = self.responses_per_collection
        if response_budget % n:
            lo, hi = (response_budget // n) * n, (response_budget // n + 1) * n
            options = ", ".join(str(v) for v in (lo, hi) if v > 0)
            raise ValueError(
                f"response_budget={response_budget} is not a whole number of collections of {n} responses "
                f"(rollout_batch_size x n_samples_per_prompt). Use a multiple of {n}: {options}."
            )
        return response_budget // n

    def updates_for_budget(self, response_budget: int) -> int:
        return self.collections_for_budget(response_budget) * self.num_steps_per_rollout

    def prompts_exposed(self, response_budget: int) -> int:
        """Prompt draws over the budget (distinct prompts when the pool is not exhausted)."""
        return self.collections_for_budget(response_budget) * self.rollout_batch_size

    def eval_points(self, response_budget: int, eval_every_responses: int) -> list[int]:
        """Cumulative responses at which evaluation runs: 0, every N, and the end.

        ``eval_every_responses`` must be a whole number of collections so that each
        evaluation sees a policy that has finished all its updates.
        """
        n_coll = self.collections_for_budget(response_budget)
        _check_positive_int("eval_every_responses", eval_every_responses)
        n = self.responses_per_collection
        if eval_every_responses % n:
            k = max(1, round(eval_every_responses / n))
            raise ValueError(
                f"eval_every_responses={eval_every_responses} is not a whole number of collections of {n} "
                f"responses; evaluation happens between collections. Use a multiple of {n}, e.g. {k * n}."
            )
        points = list(range(0, n_coll * n + 1, eval_every_responses))
        if points[-1] != n_coll * n:
            points.append(n_coll * n)
        return points

    def summary(self, response_budget: int | None = None, eval_every_responses: int | None = None) -> dict:
        """The derived plan as plain data, for printing and for run records."""
        out = {name: getattr(self, name) for name in KNOB_NAMES}
        out["responses_per_collection"] = self.responses_per_collection
        if response_budget is not None:
            out["response_budget"] = response_budget
            out["collections"] = self.collections_for_budget(response_budget)
            out["updates"] = self.updates_for_budget(response_budget)
            out["prompts_exposed"] = self.prompts_exposed(response_budget)
            if eval_every_responses is not None:
                out["eval_points"] = self.eval_points(response_budget, eval_every_responses)
                out["evaluations"] = len(out["eval_points"])
        return out

    def describe(self) -> str:
        p, g, b, s = (getattr(self, k) for k in KNOB_NAMES)
        return (
            f"P={p} prompts x G={g} samples = {p * g} responses per collection, "
            f"consumed as S={s} update{'s' if s > 1 else ''} of B={b}"
        )


def update_slices(plan: BatchPlan, seed: int, collection: int) -> list[np.ndarray]:
    """Which responses each of a collection's S updates uses: the study's central rule.

    The collection is laid out group-major (P groups of G responses). Groups are shuffled with
    ``(seed, collection)``, then the P x G responses are cut into S contiguous slices of B. So every
    response is used exactly once, and when G divides B every slice holds whole groups (true for
    every arm of the study); otherwise a group may straddle two slices (its advantages were already
    computed over the whole group).

    Returns:
        S int64 arrays of shape [B]: indices into the collection's P x G responses.
    """
    p, g, b = plan.rollout_batch_size, plan.n_samples_per_prompt, plan.global_batch_size
    order = np.random.default_rng([seed, 11, collection]).permutation(p)  # [P] shuffled groups
    flat = (order[:, None] * g + np.arange(g)).reshape(-1)  # [P*G] members of a group stay together
    return [flat[k * b : (k + 1) * b] for k in range(plan.num_steps_per_rollout)]


@dataclass(frozen=True)
class Arm:
    """A named knob shape with a learning-rate multiplier, as in the study's screening grid."""

    name: str
    rollout_batch_size: int
    n_samples_per_prompt: int
    global_batch_size: int
    num_steps_per_rollout: int
    lr_multiplier: float = 1.0

    @cached_property
    def plan(self) -> BatchPlan:
        """Built on first use, so a plan names the run whose arm has a bad shape."""
        return BatchPlan(
            self.rollout_batch_size, self.n_samples_per_prompt, self.global_batch_size, self.num_steps_per_rollout
        )


# The study's screening grid: 11 arms per task. The two "-sqrt" arms carry a scaled
# learning rate (the study's names; onpolicy-large-sqrt uses 2x, i.e. sqrt of its 4x batch).
STUDY_ARMS: dict[str, Arm] = {
    a.name: a
    for a in (
        Arm("onpolicy-small", 16, 8, 128, 1),
        Arm("split-2", 32, 8, 128, 2),
        Arm("split-4", 64, 8, 128, 4),
        Arm("split-8", 128, 8, 128, 8),
        Arm("batch-256", 64, 8, 256, 2),
        Arm("batch-256-sqrt", 64, 8, 256, 2, math.sqrt(2)),
        Arm("onpolicy-large", 64, 8, 512, 1),
        Arm("onpolicy-large-sqrt", 64, 8, 512, 1, 2.0),
        Arm("group-4", 128, 4, 128, 4),
        Arm("group-16", 32, 16, 128, 4),
        Arm("group-32", 16, 32, 128, 4),
    )
}

# The study's one-seed learning-rate follow-up: the small baseline at a third of the base rate.
LR_FOLLOWUP_ARM = Arm("onpolicy-small-lr1e6", 16, 8, 128, 1, 1.0 / 3.0)

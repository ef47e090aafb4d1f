"""The analysis a preset registers before any run: its ``analysis:`` section, checked against the plan.

A study that means to settle recipe comparisons fixes, in the preset file and so before any of its
runs, what it will measure and how it will decide: the primary endpoint, the comparisons by name,
the tests, the correction for testing several comparisons and the error rate. ``grpo-knobs plan``
prints it, ``run_study`` copies it into ``<study_dir>/plan.json`` and refuses to go on under a
changed one, and ``grpo_knobs.analysis.preregistered`` computes exactly it.

Schema (every key but ``comparisons`` has the default shown)::

    analysis:
      endpoint: test_accuracy     # terminal test accuracy of each confirmation run's final checkpoint
      responses: 16384            # ... after this many training responses (every compared run's budget)
      comparisons:                # name: x versus y (the difference is x - y), recipes fixed in the plan
        batch-256-vs-baseline: {task: countdown-2x10, x: batch-256, y: onpolicy-small}
      alternative: two-sided      # of the permutation test: two-sided, greater (x better) or less
      correction: holm            # across all comparisons of the study
      alpha: 0.05                 # family-wise error rate
      confidence: 0.95            # of the seed-level and conditional intervals
      resamples: 10000            # bootstrap resamples of each interval
      relabellings: 100000        # sampled relabellings where there are too many to list them all
      exact_relabellings: 200000  # up to this many, every relabelling is listed (an exact p)
      seed: 0                     # of the bootstrap and the sampled relabellings
      secondary: []               # analyses that are not part of the decision, in words
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ENDPOINTS = {
    "test_accuracy": "terminal test accuracy of each confirmation run's final checkpoint",
}
ALTERNATIVES = {
    "two-sided": "two-sided",
    "greater": "one-sided, H1: x is better",
    "less": "one-sided, H1: x is worse",
}
CORRECTIONS = {"holm": "Holm's step-down adjustment"}
_DEFAULTS: dict[str, Any] = {
    "endpoint": "test_accuracy",
    "responses": None,  # required
    "alternative": "two-sided",
    "correction": "holm",
    "alpha": 0.05,
    "confidence": 0.95,
    "resamples": 10_000,
    "relabellings": 100_000,
    "exact_relabellings": None,  # stats.MAX_EXACT_RELABELLINGS
    "seed": 0,
    "secondary": [],
}
_KEYS = set(_DEFAULTS) | {"comparisons"}


class PreregistrationError(ValueError):
    """An ``analysis:`` section that does not fit its plan; the message names the key."""


@dataclass(frozen=True)
class Comparison:
    """One registered comparison: the difference ``x - y`` in the endpoint on ``task``."""

    name: str
    task: str
    x: str
    y: str


@dataclass(frozen=True)
class Preregistration:
    """A preset's registered analysis, with the seeds and test problems its plan gives every recipe."""

    endpoint: str
    responses: int
    comparisons: tuple[Comparison, ...]
    seeds: dict[str, list[int]]  # task -> confirmation seeds of each of its recipes
    test_problems: dict[str, int | None]  # task -> terminal test problems (None: the whole test split)
    alternative: str
    correction: str
    alpha: float
    confidence: float
    resamples: int
    relabellings: int
    exact_relabellings: int
    seed: int
    secondary: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "responses": self.responses,
            "comparisons": [{"name": c.name, "task": c.task, "x": c.x, "y": c.y} for c in self.comparisons],
            "seeds": self.seeds,
            "test_problems": self.test_problems,
            "alternative": self.alternative,
            "correction": self.correction,
            "alpha": self.alpha,
            "confidence": self.confidence,
            "resamples": self.resamples,
            "relabellings": self.relabellings,
            "exact_relabellings": self.exact_relabellings,
            "seed": self.seed,
            "secondary": list(self.secondary),
        }

    def describe(self) -> str:
        """The block ``grpo-knobs plan`` prints."""
        level = f"{100 * self.confidence:g}%"
        problems = "; ".join(
            f"{t}: {'all' if n is None else f'{n:,}'} test problems" for t, n in self.test_problems.items()
        )
        width = max(len(c.name) for c in self.comparisons)
        lines = [
            "Pre-registered analysis (the preset's analysis: section, fixed before any run):",
            f"  Primary endpoint: {ENDPOINTS[self.endpoint]} at {self.responses:,} responses ({problems}).",
            "  Seeds per recipe: "
            + "; ".join(f"{t}: {format_seeds(s)} (n = {len(s)})" for t, s in self.seeds.items())
            + ". The seed is the unit of every claim.",
            "  Comparisons (difference x - y in percentage points):",
            *(f"    {c.name:<{width}}  {c.task}: {c.x} versus {c.y}" for c in self.comparisons),
            f"  Seed-level interval: hierarchical bootstrap (seeds per recipe, then problems), {level}, "
            f"{self.resamples:,} resamples; beside it the conditional interval (problems resampled jointly "
            "across seeds paired by number).",
            f"  Test: permutation test over seeds of the seed-mean difference, {ALTERNATIVES[self.alternative]}; "
            f"exact up to {self.exact_relabellings:,} relabellings, else {self.relabellings:,} sampled "
            f"(p = (1 + as extreme) / (1 + sampled)); random seed {self.seed}.",
            f"  Multiple comparisons: {CORRECTIONS[self.correction]} across all {len(self.comparisons)} "
            f"comparisons, family-wise alpha {self.alpha:g}; a comparison without results counts as p = 1.",
        ]
        if self.secondary:
            lines += ["  Secondary analyses (not part of the decision):", *(f"    - {s}" for s in self.secondary)]
        return "\n".join(lines)


def format_seeds(seeds: list[int]) -> str:
    """[1, 2, 3, 5, 7, 8] -> "1-3, 5, 7-8"."""
    runs: list[list[int]] = []
    for s in sorted(seeds):
        if runs and s == runs[-1][-1] + 1:
            runs[-1].append(s)
        else:
            runs.append([s])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _number(section: dict, key: str, kind: type, low: float, high: float | None = None) -> Any:
    value = section[key]
    ok = isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
    if not ok or not (low < value and (high is None or value < high)):
        bound = f"in ({low:g}, {high:g})" if high is not None else f"above {low:g}"
        what = "a whole number" if kind is int else "a number"
        raise PreregistrationError(f"analysis.{key} must be {what} {bound}, got {value!r}.")
    return value


def _choice(section: dict, key: str, options: dict[str, str]) -> str:
    if section[key] not in options:
        raise PreregistrationError(f"analysis.{key} must be one of {', '.join(options)}, got {section[key]!r}.")
    return section[key]


def _comparisons(raw: Any, fixed: dict[str, list[str]], tasks: list[str]) -> tuple[Comparison, ...]:
    if not isinstance(raw, dict) or not raw:
        raise PreregistrationError(
            "analysis.comparisons must map each comparison's name to {task, x, y}, e.g. "
            "batch-256-vs-baseline: {task: countdown-2x10, x: batch-256, y: onpolicy-small}."
        )
    out, pairs = [], set()
    for name, pair in raw.items():
        where = f"analysis.comparisons.{name}"
        if not isinstance(pair, dict) or set(pair) != {"task", "x", "y"}:
            raise PreregistrationError(f"{where} must be {{task, x, y}}, got {pair!r}.")
        task, x, y = pair["task"], pair["x"], pair["y"]
        if task not in tasks:
            raise PreregistrationError(f"{where}: task {task!r} is not one of the plan's tasks {tasks}.")
        if task not in fixed:
            raise PreregistrationError(
                f"{where}: {task}'s confirmation recipes are chosen by selection after screening; a registered "
                f"comparison names recipes fixed before any run (tasks.{task}.confirmation.recipes)."
            )
        missing = [r for r in (x, y) if r not in fixed[task]]
        if missing:
            raise PreregistrationError(f"{where}: {missing} not among {task}'s confirmation recipes {fixed[task]}.")
        if x == y or frozenset((task, x, y)) in pairs:
            raise PreregistrationError(f"{where}: {x} versus {y} on {task} is not a new pair of two recipes.")
        pairs.add(frozenset((task, x, y)))
        out.append(Comparison(str(name), task, x, y))
    return tuple(out)


def preregistration(
    raw: Any,
    seeds: dict[str, list[int]],
    budgets: dict[str, list[int]],
    fixed: dict[str, list[str]],
    test_problems: dict[str, int | None],
) -> Preregistration:
    """Check a preset's ``analysis:`` section against its plan.

    Per task of the plan: ``seeds`` and ``budgets`` (response budgets) of its confirmation runs,
    ``fixed`` the recipes the preset fixes (tasks whose recipes are selected are absent) and
    ``test_problems`` its terminal test size.
    """
    from ..stats import MAX_EXACT_RELABELLINGS

    if not isinstance(raw, dict):
        raise PreregistrationError(f"analysis must be a mapping of {sorted(_KEYS)}, got {type(raw).__name__}.")
    unknown = set(raw) - _KEYS
    if unknown:
        raise PreregistrationError(f"analysis: unknown key(s) {sorted(unknown)}; keys: {sorted(_KEYS)}.")
    section = _DEFAULTS | {"exact_relabellings": MAX_EXACT_RELABELLINGS} | raw
    comparisons = _comparisons(raw.get("comparisons"), fixed, list(seeds))
    compared = list(dict.fromkeys(c.task for c in comparisons))
    responses = _number(section, "responses", int, 0)
    for task in compared:
        off = sorted(set(budgets[task]) - {responses})
        if off:
            raise PreregistrationError(
                f"analysis.responses is {responses:,}, but {task}'s confirmation runs train for {off[0]:,} responses; "
                "the endpoint is measured at the end of each compared run."
            )
    secondary = section["secondary"]
    if not isinstance(secondary, list) or not all(isinstance(s, str) for s in secondary):
        raise PreregistrationError(f"analysis.secondary must be a list of sentences, got {secondary!r}.")
    return Preregistration(
        endpoint=_choice(section, "endpoint", ENDPOINTS),
        responses=responses,
        comparisons=comparisons,
        seeds={t: sorted(seeds[t]) for t in compared},
        test_problems={t: test_problems.get(t) for t in compared},
        alternative=_choice(section, "alternative", ALTERNATIVES),
        correction=_choice(section, "correction", CORRECTIONS),
        alpha=_number(section, "alpha", float, 0, 1),
        confidence=_number(section, "confidence", float, 0, 1),
        resamples=_number(section, "resamples", int, 0),
        relabellings=_number(section, "relabellings", int, 0),
        exact_relabellings=_number(section, "exact_relabellings", int, 0),
        seed=_number(section, "seed", int, -1),
        secondary=tuple(secondary),
    )


def check_unchanged(recorded: dict[str, Any] | None, current: Preregistration | None, where: str) -> None:
    """Refuse to go on with a study whose registered analysis differs from the one its ``plan.json``
    recorded when it started (``recorded``: that file's contents, None when there is none yet)."""
    if recorded is None:
        return
    before = recorded.get("preregistration")
    now = current.to_json() if current is not None else None
    if before == now:
        return
    keys = sorted(k for k in set(before or {}) | set(now or {}) if (before or {}).get(k) != (now or {}).get(k))
    raise PreregistrationError(
        f"{where} records another registered analysis than the preset's ({', '.join(keys) or 'analysis'} differ); "
        "a registered analysis is fixed before the study's first run: restore the preset's analysis: section, "
        "or give the changed study a new --study-dir."
    )


def check_same_code(recorded: dict[str, Any] | None, source_sha256: str, where: str) -> None:
    """Refuse to add runs to a registered study from library code other than its first runs': every
    run of its comparisons must come from one code version (``recorded``: its ``plan.json``)."""
    code = (recorded or {}).get("code") or {}
    if code.get("source_sha256") in (None, source_sha256):
        return
    commit = code.get("git_commit") or "not recorded"
    raise PreregistrationError(
        f"{where}: this study's runs come from library source {code['source_sha256'][:12]} (git commit {commit}), "
        f"this library is {source_sha256[:12]}; a registered study runs on one code version: run it from that "
        "revision (git checkout, or a copy of it), or give new code a new --study-dir."
    )

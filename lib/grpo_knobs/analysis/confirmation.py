"""Confirmation tables (notebook 51): per-run endpoints, paired test comparisons, phase costs, truncation."""

from __future__ import annotations

from itertools import combinations
from typing import Sequence

import numpy as np
import pandas as pd

from grpo_knobs import stats
from grpo_knobs.analysis.ordering import _sort_by_labels


def confirmation_run_table(runs: pd.DataFrame, labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Per run: recipe, seed, final validation %, test %, active phase and job minutes."""
    table = pd.DataFrame({
        "task": runs["task"], "recipe": runs["label"], "seed": runs["seed"],
        "val_pct": 100 * runs["final_accuracy"],
        "test_pct": 100 * runs.get("test_accuracy", pd.Series(np.nan, index=runs.index)),
        "phase_min": runs["active_phase_seconds"] / 60,
        "job_min": runs["job_seconds"] / 60,
    })
    return _sort_by_labels(table, labels, ["task", "recipe", "seed"])


def recipe_test_scores(tests: pd.DataFrame, runs: pd.DataFrame, label: str, task: str,
                      column: str = "correct") -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Terminal test scores of one recipe as ([seeds, problems], seeds, problem IDs).

    Problem columns are sorted by ID; every seed must have graded the same
    problems exactly once.
    """
    chosen = runs[(runs["task"] == task) & (runs["label"] == label)][["run_id", "seed"]]
    rows = tests.merge(chosen, on="run_id")
    if rows.empty:
        raise ValueError(f"no terminal test rows for recipe {label!r} on {task}")
    if rows.duplicated(["seed", "problem_id"]).any():
        raise ValueError(f"recipe {label!r} on {task} has duplicated test rows per problem")
    wide = rows.pivot(index="seed", columns="problem_id", values=column).sort_index(axis=0).sort_index(axis=1)
    if wide.isna().any().any():
        raise ValueError(f"seeds of recipe {label!r} on {task} graded different test problems")
    return wide.to_numpy(dtype=float), wide.index.to_numpy(), [str(c) for c in wide.columns]


def default_comparisons(labels: Sequence[str]) -> list[tuple[str, str]]:
    """The study's comparison order: each alternative vs the baseline, then alternatives pairwise.

    ``labels[0]`` is the baseline; a pair ``(x, y)`` reads "x versus y".
    """
    base, *alts = labels
    return [(alt, base) for alt in alts] + [(y, x) for x, y in combinations(alts, 2)]


def paired_comparisons(runs: pd.DataFrame, tests: pd.DataFrame, task: str,
                       pairs: Sequence[tuple[str, str]], n_resamples: int = 10_000, seed: int = 0,
                       confidence: float = 0.95) -> pd.DataFrame:
    """Test-accuracy differences ``x - y`` per pair, via :func:`stats.paired_bootstrap`.

    Seeds are paired by seed number, so both recipes need the same seed set.
    """
    rows = []
    for x, y in pairs:
        a, seeds_a, ids_a = recipe_test_scores(tests, runs, x, task)
        b, seeds_b, ids_b = recipe_test_scores(tests, runs, y, task)
        if list(seeds_a) != list(seeds_b):
            raise ValueError(f"{x!r} and {y!r} on {task} have different seeds: {list(seeds_a)} vs {list(seeds_b)}")
        res = stats.paired_bootstrap(a, b, n_resamples=n_resamples, seed=seed, confidence=confidence,
                                     problem_ids_a=ids_a, problem_ids_b=ids_b)
        rows.append({
            "task": task, "comparison": f"{x} versus {y}", "mean_pp": res.mean_diff_pp,
            "ci_low_pp": res.ci_low_pp, "ci_high_pp": res.ci_high_pp,
            "seed_diffs_pp": tuple(float(d) for d in res.per_seed_diff_pp),
            "p_le_zero": res.p_le_zero, "n_seeds": a.shape[0], "n_problems": a.shape[1],
        })
    return pd.DataFrame(rows)


def paired_job_times(runs: pd.DataFrame, task: str, pairs: Sequence[tuple[str, str]]) -> pd.DataFrame:
    """Job-time change of ``x`` against ``y`` per pair, seeds paired by number (the study's
    "time reduction": 1 - x / y, positive when ``x`` finishes sooner).

    Uses the seeds both recipes have; a pair without a common seed is left out.
    """
    rows = []
    for x, y in pairs:
        minutes = {label: runs[(runs["task"] == task) & (runs["label"] == label)].set_index("seed")["job_seconds"] / 60
                   for label in (x, y)}
        seeds = sorted(set(minutes[x].index) & set(minutes[y].index))
        if not seeds:
            continue
        a, b = minutes[x].loc[seeds].to_numpy(), minutes[y].loc[seeds].to_numpy()  # [seeds]
        reductions = 100 * (1 - a / b)  # [seeds]
        rows.append({
            "task": task, "comparison": f"{x} versus {y}", "x_job_min": a.mean(), "y_job_min": b.mean(),
            "ratio": a.mean() / b.mean(), "reduction_pct": 100 * (1 - a.mean() / b.mean()),
            "seed_reductions_pct": tuple(float(r) for r in reductions), "seeds_faster": int((reductions > 0).sum()),
            "n_seeds": len(seeds),
        })
    return pd.DataFrame(rows, columns=["task", "comparison", "x_job_min", "y_job_min", "ratio", "reduction_pct",
                                       "seed_reductions_pct", "seeds_faster", "n_seeds"])


def format_comparisons(table: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """The study's display: signed pp, "[low, high]" interval, per-seed differences."""
    interval = f"Conditional {round(100 * confidence)}% interval"
    return pd.DataFrame({
        "Comparison": table["comparison"],
        "Mean pp": table["mean_pp"].map(lambda v: f"{v:+.2f}"),
        interval: [f"[{lo:+.2f}, {hi:+.2f}]" for lo, hi in zip(table["ci_low_pp"], table["ci_high_pp"])],
        "Seed differences pp": table["seed_diffs_pp"].map(lambda d: ", ".join(f"{v:+.2f}" for v in d)),
    })


def phase_cost_table(runs: pd.DataFrame, labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Seed-mean minutes per phase and output tokens per recipe.

    "Other" is job time minus the recorded phases (generation, trainer,
    sync), as in the study: it holds initialization, validation, checkpoint
    saving and orchestration.
    """
    per_run = pd.DataFrame({
        "task": runs["task"], "recipe": runs["label"],
        "generate_min": runs["generation_seconds"] / 60,
        "trainer_min": runs["trainer_seconds"] / 60,
        "sync_min": runs["sync_seconds"] / 60,
        "other_min": (runs["job_seconds"] - runs["generation_seconds"] - runs["trainer_seconds"]
                      - runs["sync_seconds"]) / 60,
        "output_million_tokens": runs["output_tokens"] / 1e6,
    })
    table = per_run.groupby(["task", "recipe"], sort=False).mean().reset_index()
    table["n_runs"] = per_run.groupby(["task", "recipe"], sort=False).size().to_numpy()
    return _sort_by_labels(table, labels, ["task", "recipe"])


def truncation_table(runs: pd.DataFrame, labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Per run: terminal test mean response length and truncation %."""
    table = pd.DataFrame({
        "task": runs["task"], "recipe": runs["label"], "seed": runs["seed"],
        "test_response_length": runs["test_response_length"],
        "test_truncation_pct": 100 * runs["test_truncation_fraction"],
    })
    return _sort_by_labels(table, labels, ["task", "recipe", "seed"])


def truncation_range(table: pd.DataFrame) -> pd.DataFrame:
    """Per task: min and max terminal-test truncation % across runs."""
    return table.groupby("task", sort=False)["test_truncation_pct"].agg(["min", "max", "count"]).reset_index()

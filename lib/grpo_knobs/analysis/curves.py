"""Curves and run endpoints: validation curves, their seed summaries and the training signals."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from grpo_knobs import stats
from grpo_knobs.analysis.ordering import _sort_by_labels, sort_tasks


def eval_curves(evals: pd.DataFrame) -> pd.DataFrame:
    """Per-problem validation rows -> one row per run and evaluation point.

    ``accuracy``/``accuracy_strict`` are fractions of problems correct;
    ``n_problems`` lets callers check that every point graded the same set.
    """
    keys = ["run_id", "responses"]
    grouped = evals.groupby(keys, sort=True)
    curves = grouped.agg(
        collections=("collections", "first"),
        updates=("updates", "first"),
        output_tokens=("output_tokens", "first"),
        active_seconds=("active_seconds", "first"),
        job_seconds=("job_seconds", "first"),
        accuracy=("correct", "mean"),
        accuracy_strict=("correct_strict", "mean"),
        truncation_fraction=("truncated", "mean"),
        response_length_mean=("response_length", "mean"),
        n_problems=("problem_id", "nunique"),
    ).reset_index()
    return curves


def final_evaluation_rows(evals: pd.DataFrame) -> pd.DataFrame:
    """The per-problem rows of each run's last evaluation: a stand-in for terminal test rows
    (same columns) when runs saved no checkpoint to test."""
    last = evals.groupby("run_id")["responses"].transform("max")
    return evals[evals["responses"] == last].reset_index(drop=True)


def _curve_endpoints(curves: pd.DataFrame) -> pd.DataFrame:
    """Initial and final validation accuracy and sample AUC per run."""
    rows = []
    for run_id, c in curves.groupby("run_id", sort=True):
        resp, acc = c["responses"].to_numpy(), c["accuracy"].to_numpy()
        rows.append(
            {
                "run_id": run_id,
                "initial_accuracy": acc[0],
                "final_accuracy": acc[-1],
                "sample_auc": stats.sample_auc(resp, acc) if len(c) > 1 else np.nan,
            }
        )
    return pd.DataFrame(rows)


def _test_endpoints(tests: pd.DataFrame) -> pd.DataFrame:
    """Terminal test accuracy, length and truncation per run."""
    if tests.empty:
        return pd.DataFrame(
            columns=[
                "run_id",
                "test_accuracy",
                "test_accuracy_strict",
                "test_response_length",
                "test_truncation_fraction",
            ]
        )
    return (
        tests.groupby("run_id")
        .agg(
            test_accuracy=("correct", "mean"),
            test_accuracy_strict=("correct_strict", "mean"),
            test_response_length=("response_length", "mean"),
            test_truncation_fraction=("truncated", "mean"),
        )
        .reset_index()
    )


def summarize_curves(curves: pd.DataFrame, runs: pd.DataFrame, x: str = "responses") -> pd.DataFrame:
    """Seed mean and observed range of validation accuracy per recipe and evaluation point.

    Points are matched across seeds by cumulative responses (the evaluation
    schedule) and only points every run of the recipe evaluated are kept;
    ``x`` is then averaged across seeds, since active seconds and output
    tokens differ by seed. Accuracy columns are in percent.
    """
    merged = curves.merge(runs[["run_id", "task", "label", "seed"]], on="run_id")
    rows = []
    for (task, label), g in merged.groupby(["task", "label"], sort=True):
        acc = g.pivot(index="run_id", columns="responses", values="accuracy")  # [seeds, points]
        acc = acc.loc[:, acc.notna().all()]  # points every seed evaluated (unequal budgets, unfinished runs)
        xs = g.pivot(index="run_id", columns="responses", values=x)
        summary = stats.seed_summary(100 * acc.to_numpy())
        for i, responses in enumerate(acc.columns):
            rows.append(
                {
                    "task": task,
                    "label": label,
                    "responses": responses,
                    "x": float(xs[responses].mean()),
                    "accuracy_mean_pct": summary.mean[i],
                    "accuracy_min_pct": summary.min[i],
                    "accuracy_max_pct": summary.max[i],
                    "n_seeds": acc.shape[0],
                }
            )
    return pd.DataFrame(rows)


def curve_endpoint_table(summary: pd.DataFrame, labels: Sequence[str] | None = None) -> pd.DataFrame:
    """The last evaluation point of each recipe in a :func:`summarize_curves` table."""
    last = summary.sort_values("responses").groupby(["task", "label"], sort=False).tail(1)
    table = last[
        ["task", "label", "responses", "accuracy_mean_pct", "accuracy_min_pct", "accuracy_max_pct", "n_seeds"]
    ].rename(columns={"label": "recipe"})
    return sort_tasks(_sort_by_labels(table, labels, ["recipe"]))


# Per-collection training signals drawn beside the learning curves: column -> scale to display units
# (their panel titles: grpo_knobs.plots.SIGNAL_TITLES).
TRAINING_SIGNALS = {
    "reward_mean": 100.0,
    "mixed_group_fraction": 100.0,
    "truncation_fraction": 100.0,
    "response_length_mean": 1.0,
}


def training_signals(collections: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Seed mean and range of the per-collection training signals, in response windows.

    Collections are averaged within windows of W responses, W being the largest collection
    (P x G) among the task's runs, so every run has at least one collection in each window and
    runs with small collections are smoothed to the same resolution. Windows are matched
    across seeds by their end (``responses``); only windows every seed of a recipe finished
    are kept. Returns one row per task, recipe, signal and window, values scaled as in
    :data:`TRAINING_SIGNALS`.
    """
    meta = runs[["run_id", "task", "label"]]
    merged = collections.merge(meta, on="run_id")
    rows = []
    for task, t in merged.groupby("task", sort=True):
        per_collection = (t["responses"] // (t["collection"] + 1)).astype(int)  # [collections] P x G of each run
        width = int(per_collection.max())
        window_end = width * np.ceil(t["responses"] / width).astype(int)  # [collections]
        t = t.assign(window=window_end)
        for label, g in t.groupby("label", sort=True):
            for column, scale in TRAINING_SIGNALS.items():
                table = g.pivot_table(
                    index="run_id", columns="window", values=column, aggfunc="mean"
                )  # [seeds, windows]
                table = table.loc[:, table.notna().all()]
                if table.empty:
                    continue
                summary = stats.seed_summary(scale * table.to_numpy())
                for i, end in enumerate(table.columns):
                    rows.append(
                        {
                            "task": task,
                            "label": label,
                            "signal": column,
                            "responses": int(end),
                            "mean": summary.mean[i],
                            "min": summary.min[i],
                            "max": summary.max[i],
                            "n_seeds": table.shape[0],
                        }
                    )
    return pd.DataFrame(rows, columns=["task", "label", "signal", "responses", "mean", "min", "max", "n_seeds"])

"""Collapse diagnostics (notebooks 50, 53, 55): zero-advantage share, entropy, per-group mixing.

A GRPO group whose rewards are all equal has all-zero advantages and teaches
nothing. A run has *collapsed* when almost every group is like that for
several collections in a row after it started learning: the policy answers
every prompt the same way (always right, or always wrong), so learning stops.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from grpo_knobs import stats

# A collection counts toward a collapse when at least this share of its groups has zero advantage...
COLLAPSE_THRESHOLD = 0.9
# ...in consecutive collections spanning at least this many responses (4 collections of 512, 16 of
# 128: small collections are noisy, so the span is in responses, not collections),
COLLAPSE_MIN_RESPONSES = 2048
# counted only after the run's first collection below the threshold: at the start nearly every
# group is all wrong, which is not learning yet rather than a collapse.
RECORDED = "recorded"
DERIVED = "1 - mixed_group_fraction (binary rewards)"


@dataclass(frozen=True)
class CollapseRule:
    """When a run counts as collapsed: consecutive collections whose zero-advantage share is at
    least ``threshold``, spanning at least ``min_responses`` responses, after the run's first
    collection below the threshold."""

    threshold: float = COLLAPSE_THRESHOLD
    min_responses: int = COLLAPSE_MIN_RESPONSES

    def describe(self) -> str:
        return (
            f"zero-advantage share >= {self.threshold:.0%} in consecutive collections spanning "
            f">= {self.min_responses:,} responses, after the run's first collection below {self.threshold:.0%}"
        )


def zero_advantage_series(collections: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Per run and collection: the zero-advantage share and where it comes from.

    ``zero_advantage_fraction`` is the trainer's record where present;
    otherwise, for binary rewards, a group has zero advantages exactly when it
    is not mixed, so ``1 - mixed_group_fraction`` stands in (``source`` says
    which). ``entropy_mean`` is NaN where not recorded.
    """
    cols = ["run_id", "task", "phase", "label", "arm", "seed"]
    merged = collections.merge(runs[cols], on="run_id")
    recorded = pd.to_numeric(
        merged.get("zero_advantage_fraction", pd.Series(np.nan, index=merged.index)), errors="coerce"
    )
    entropy = pd.to_numeric(merged.get("entropy_mean", pd.Series(np.nan, index=merged.index)), errors="coerce")
    out = merged[cols + ["collection", "responses", "reward_mean", "mixed_group_fraction"]].copy()
    out["zero_advantage_fraction"] = recorded.fillna(1 - merged["mixed_group_fraction"])
    out["source"] = np.where(recorded.notna(), RECORDED, DERIVED)
    out["entropy_mean"] = entropy
    return out.sort_values(["task", "phase", "label", "seed", "collection"], ignore_index=True)


def _first_streak(values: np.ndarray, responses: np.ndarray, rule: CollapseRule) -> tuple[int | None, int]:
    """Start index and length (collections) of the first qualifying streak in ``values`` [collections];
    ``responses`` [collections] are cumulative responses after each collection."""
    above = values >= rule.threshold
    below = np.flatnonzero(~above)
    if below.size == 0:
        return None, 0
    per_collection = np.diff(responses, prepend=0)  # [collections]
    i, n = int(below[0]) + 1, len(values)
    while i < n:
        if not above[i]:
            i += 1
            continue
        end = i
        while end < n and above[end]:
            end += 1
        if per_collection[i:end].sum() >= rule.min_responses:
            return i, end - i
        i = end
    return None, 0


def collapse_points(series: pd.DataFrame, rule: CollapseRule = CollapseRule()) -> pd.DataFrame:
    """Per run: whether and when it collapsed under ``rule``.

    ``series`` comes from :func:`zero_advantage_series`. ``collapse_responses``
    is the cumulative responses at the end of the streak's first collection;
    ``streak`` its length in collections; ``to_end`` says it lasted to the
    run's last collection (learning never resumed), otherwise the run
    recovered.
    """
    rows = []
    for run_id, g in series.groupby("run_id", sort=False):
        g = g.sort_values("collection")
        start, length = _first_streak(g["zero_advantage_fraction"].to_numpy(), g["responses"].to_numpy(), rule)
        first = g.iloc[0]
        row = {k: first[k] for k in ("run_id", "task", "phase", "label", "arm", "seed")}
        row |= {"collapsed": start is not None, "source": first["source"], "collections": len(g)}
        if start is None:
            row |= {"collapse_collection": np.nan, "collapse_responses": np.nan, "streak": 0, "to_end": False}
        else:
            row |= {
                "collapse_collection": int(g["collection"].iloc[start]),
                "collapse_responses": int(g["responses"].iloc[start]),
                "streak": length,
                "to_end": start + length == len(g),
            }
        rows.append(row)
    return pd.DataFrame(
        rows,
        columns=[
            "run_id",
            "task",
            "phase",
            "label",
            "arm",
            "seed",
            "collapsed",
            "source",
            "collections",
            "collapse_collection",
            "collapse_responses",
            "streak",
            "to_end",
        ],
    )


def describe_collapse(points: pd.DataFrame) -> pd.Series:
    """One display string per run: "no", or "at 6,144 responses (collection 11), to the end"."""
    if points.empty:
        return pd.Series([], dtype=str)

    def text(r: pd.Series) -> str:
        if not r["collapsed"]:
            return "no"
        tail = "until the run ended" if r["to_end"] else f"recovered after {r['streak']} collections"
        return f"at {r['collapse_responses']:,.0f} responses (collection {r['collapse_collection']:.0f}), {tail}"

    return points.apply(text, axis=1)


def add_collapse_column(table: pd.DataFrame, points: pd.DataFrame) -> pd.DataFrame:
    """``table`` (rows keyed by task, arm, seed) with a ``collapsed`` column from :func:`collapse_points`."""
    shown = points.assign(collapsed_text=describe_collapse(points))[["task", "arm", "seed", "collapsed_text"]]
    merged = table.merge(shown, on=["task", "arm", "seed"], how="left")
    return merged.rename(columns={"collapsed_text": "collapsed"}).fillna({"collapsed": "n/a"})


def plateau_outcomes(
    runs: pd.DataFrame,
    curves: pd.DataFrame,
    series: pd.DataFrame,
    points: pd.DataFrame,
    plateau_pct: float | Mapping[str, float],
    margin_pp: float = 2.0,
    last_collections: int = 4,
) -> pd.DataFrame:
    """Per run: did it leave a one-category plateau, and did it stop learning?

    ``curves`` from :func:`eval_curves`, ``series`` and ``points`` from
    :func:`zero_advantage_series` / :func:`collapse_points`. A run *escaped*
    when its last validation accuracy exceeds ``plateau_pct`` (the accuracy of
    a policy that solves exactly one category; a number, or one per task) by
    more than ``margin_pp`` points. The zero-advantage share and entropy are
    means over its last ``last_collections`` collections (entropy: nats per
    sampled token).
    """
    rows = []
    when = dict(zip(points["run_id"], describe_collapse(points)))
    for run in runs.sort_values(["label", "seed"]).itertuples():
        c = curves[curves["run_id"] == run.run_id].sort_values("responses")
        z = series[series["run_id"] == run.run_id].sort_values("collection")
        if c.empty or z.empty:
            continue
        tail = z.tail(last_collections)
        final = 100 * float(c["accuracy"].iloc[-1])
        plateau = plateau_pct[run.task] if isinstance(plateau_pct, Mapping) else plateau_pct
        rows.append(
            {
                "task": run.task,
                "label": run.label,
                "seed": int(run.seed),
                "lr": float(run.lr),
                "initial_pct": 100 * float(c["accuracy"].iloc[0]),
                "best_pct": 100 * float(c["accuracy"].max()),
                "final_pct": final,
                "plateau_pct": plateau,
                "escaped": final > plateau + margin_pp,
                "collapsed": when.get(run.run_id, "n/a"),
                "zero_advantage_last": float(tail["zero_advantage_fraction"].mean()),
                "entropy_first": float(z["entropy_mean"].iloc[0]),
                "entropy_last": float(tail["entropy_mean"].mean()),
            }
        )
    return pd.DataFrame(rows)


def group_mixing_prediction(collections: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Per collection: measured mixed fraction, the formula at the mean reward, and the formula
    averaged over each group's own mean reward (:func:`stats.predicted_mixed_fraction`).

    ``predicted_per_group`` is NaN where ``group_reward_means`` was not recorded.
    """
    cols = ["run_id", "task", "phase", "arm", "seed", "n_samples_per_prompt"]
    merged = collections.merge(runs[cols], on="run_id")
    group_means = merged.get("group_reward_means", pd.Series([None] * len(merged), index=merged.index))
    per_group = [
        stats.predicted_mixed_fraction(np.asarray(m, dtype=float), int(g))
        if isinstance(m, (list, tuple, np.ndarray)) and len(m)
        else np.nan
        for m, g in zip(group_means, merged["n_samples_per_prompt"])
    ]
    out = merged[cols[1:] + ["collection", "reward_mean", "mixed_group_fraction"]].copy()
    out["formula_at_mean_reward"] = stats.mixed_group_probability(
        out["reward_mean"].clip(0, 1).to_numpy(), out["n_samples_per_prompt"].to_numpy()
    )
    out["predicted_per_group"] = per_group
    return out.sort_values(["task", "n_samples_per_prompt", "seed", "collection"], ignore_index=True)


def mixing_prediction_summary(prediction: pd.DataFrame) -> pd.DataFrame:
    """Per run: mean measured mixed fraction, mean formula at the collection mean reward, and mean
    per-group prediction ("not recorded" runs show NaN), over its collections."""
    grouped = prediction.groupby(["task", "phase", "arm", "seed", "n_samples_per_prompt"], sort=False)
    table = grouped.agg(
        collections=("collection", "size"),
        measured=("mixed_group_fraction", "mean"),
        formula_at_mean_reward=("formula_at_mean_reward", "mean"),
        predicted_per_group=("predicted_per_group", "mean"),
        recorded=("predicted_per_group", lambda s: int(s.notna().sum())),
    ).reset_index()
    return table.rename(columns={"n_samples_per_prompt": "G"})

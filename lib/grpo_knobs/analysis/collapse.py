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


def _streaks(values: np.ndarray, responses: np.ndarray, rule: CollapseRule) -> list[tuple[int, int]]:
    """Start index and length (collections) of every qualifying streak in ``values`` [collections];
    ``responses`` [collections] are cumulative responses after each collection."""
    above = values >= rule.threshold
    below = np.flatnonzero(~above)
    if below.size == 0:
        return []
    per_collection = np.diff(responses, prepend=0)  # [collections]
    streaks = []
    i, n = int(below[0]) + 1, len(values)
    while i < n:
        if not above[i]:
            i += 1
            continue
        end = i
        while end < n and above[end]:
            end += 1
        if per_collection[i:end].sum() >= rule.min_responses:
            streaks.append((i, end - i))
        i = end
    return streaks


POINT_COLUMNS = [
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
    "stretches",
    "stretch_collections",
    "stretch_responses",
    "stretch_lengths",
    "to_end",
]


def collapse_points(series: pd.DataFrame, rule: CollapseRule = CollapseRule()) -> pd.DataFrame:
    """Per run: whether, when and how often it collapsed under ``rule``.

    ``series`` comes from :func:`zero_advantage_series`. Every collapse stretch
    of a run is listed: ``stretch_collections`` and ``stretch_responses`` (the
    collection, and the cumulative responses at its end, where each stretch
    starts) and ``stretch_lengths`` (collections), all [stretches];
    ``collapse_collection``, ``collapse_responses`` and ``streak`` repeat the
    first. ``to_end`` says the last stretch lasted to the run's last
    collection (the run ended collapsed); otherwise every stretch recovered.
    """
    rows = []
    for run_id, g in series.groupby("run_id", sort=False):
        g = g.sort_values("collection")
        found = _streaks(g["zero_advantage_fraction"].to_numpy(), g["responses"].to_numpy(), rule)
        starts = [start for start, _ in found]
        first = g.iloc[0]
        row = {k: first[k] for k in ("run_id", "task", "phase", "label", "arm", "seed")}
        row |= {
            "collapsed": bool(found),
            "source": first["source"],
            "collections": len(g),
            "collapse_collection": int(g["collection"].iloc[starts[0]]) if found else np.nan,
            "collapse_responses": int(g["responses"].iloc[starts[0]]) if found else np.nan,
            "streak": found[0][1] if found else 0,
            "stretches": len(found),
            "stretch_collections": tuple(int(c) for c in g["collection"].iloc[starts]),
            "stretch_responses": tuple(int(r) for r in g["responses"].iloc[starts]),
            "stretch_lengths": tuple(length for _, length in found),
            "to_end": bool(found) and sum(found[-1]) == len(g),
        }
        rows.append(row)
    return pd.DataFrame(rows, columns=POINT_COLUMNS)


def describe_collapse(points: pd.DataFrame) -> pd.Series:
    """One display string per run: "no", or every stretch in order, e.g. "at 6,016 responses (collection 46),
    recovered after 18 collections; at 12,416 responses (collection 96), until the run ended"."""
    if points.empty:
        return pd.Series([], dtype=str)

    def text(r: pd.Series) -> str:
        if not r["collapsed"]:
            return "no"
        parts = []
        stretches = zip(r["stretch_collections"], r["stretch_responses"], r["stretch_lengths"])
        for i, (collection, responses, length) in enumerate(stretches):
            last = i == r["stretches"] - 1
            tail = "until the run ended" if last and r["to_end"] else f"recovered after {length} collections"
            parts.append(f"at {responses:,} responses (collection {collection}), {tail}")
        return "; ".join(parts)

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
    a policy that solves exactly one category; a number, or one per run ID,
    :func:`one_category_plateaus` on the problems each run graded) by more than
    ``margin_pp`` points. The zero-advantage share and entropy are
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
        plateau = plateau_pct[run.run_id] if isinstance(plateau_pct, Mapping) else plateau_pct
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

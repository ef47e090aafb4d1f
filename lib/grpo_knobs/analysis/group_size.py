"""Group size (notebook 53): measured mixed-group fractions of the group arms."""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from grpo_knobs import stats
from grpo_knobs.analysis.collapse import group_mixing_prediction
from grpo_knobs.analysis.constants import GROUP_ARMS
from grpo_knobs.analysis.ordering import sort_tasks


def mixed_group_points(
    collections: pd.DataFrame, runs: pd.DataFrame, arms: Sequence[str] = GROUP_ARMS, phase: str = "screening"
) -> pd.DataFrame:
    """Per collection of the group arms: mean training reward, measured mixed fraction and, where
    ``group_reward_means`` was recorded, the per-group prediction (NaN otherwise; see
    :func:`grpo_knobs.analysis.group_mixing_prediction`)."""
    chosen = runs[runs["arm"].isin(arms) & (runs["phase"] == phase)]
    predicted = group_mixing_prediction(collections, chosen)
    return predicted[
        [
            "task",
            "arm",
            "seed",
            "n_samples_per_prompt",
            "collection",
            "reward_mean",
            "mixed_group_fraction",
            "predicted_per_group",
        ]
    ]


def group_size_table(runs: pd.DataFrame, arms: Sequence[str] = GROUP_ARMS, phase: str = "screening") -> pd.DataFrame:
    """Per group arm: G, prompts per collection, prompts exposed at the budget, measured mixing.

    ``formula_at_mean_reward`` evaluates the mixed-group formula at the
    run's mean training reward; because the formula is concave in p, the
    measured fraction (averaged over problems of different difficulty) is
    expected to lie at or below it.
    """
    chosen = runs[runs["arm"].isin(arms) & (runs["phase"] == phase)]
    table = pd.DataFrame(
        {
            "task": chosen["task"],
            "arm": chosen["arm"],
            "seed": chosen["seed"],
            "G": chosen["n_samples_per_prompt"],
            "P": chosen["rollout_batch_size"],
            "responses": chosen["responses"],
            "prompts_exposed": chosen["responses"] // chosen["n_samples_per_prompt"],
            "distinct_prompts": chosen["distinct_prompts"],
            "mean_reward": chosen["mean_training_reward"],
            "mixed_fraction": chosen["mixed_group_fraction"],
            "formula_at_mean_reward": stats.mixed_group_probability(
                chosen["mean_training_reward"].to_numpy(), chosen["n_samples_per_prompt"].to_numpy()
            ),
            "final_val_pct": 100 * chosen["final_accuracy"],
        }
    )
    return sort_tasks(table.sort_values(["G", "seed"]))

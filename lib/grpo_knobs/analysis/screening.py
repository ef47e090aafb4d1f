"""Screening (notebook 55): per-arm endpoints beside the study's published ones."""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from grpo_knobs.analysis.ordering import _sort_by_labels, sort_tasks


def screening_table(
    runs: pd.DataFrame,
    arms: Sequence[str] | None = None,
    reference: pd.DataFrame | None = None,
    phases: Sequence[str] = ("screening",),
) -> pd.DataFrame:
    """Per task and arm: shape, final validation %, job minutes and mixed-group %.

    With ``reference`` the study's published numbers for the same task and
    arm are added as ``study_*`` columns (the study ran each screening arm
    once, on a different model and budget). ``arms`` fixes which arms appear
    and in which order; an arm absent from ``runs`` is left out.
    """
    chosen = runs[runs["phase"].isin(phases)]
    if arms is not None:
        chosen = chosen[chosen["arm"].isin(arms)]
    table = pd.DataFrame(
        {
            "task": chosen["task"],
            "arm": chosen["arm"],
            "seed": chosen["seed"],
            "P": chosen["rollout_batch_size"],
            "G": chosen["n_samples_per_prompt"],
            "B": chosen["global_batch_size"],
            "S": chosen["num_steps_per_rollout"],
            "collection": chosen["rollout_batch_size"] * chosen["n_samples_per_prompt"],
            "lr": chosen["lr"],
            "val_pct": 100 * chosen["final_accuracy"],
            "job_min": chosen["job_seconds"] / 60,
            "mixed_pct": 100 * chosen["mixed_group_fraction"],
        }
    )
    if reference is not None:
        ref = reference[reference["phase"].isin(phases)]
        study_cols = pd.DataFrame(
            {
                "task": ref["task"],
                "arm": ref["arm"],
                "study_val_pct": 100 * ref["final_accuracy"],
                "study_job_min": ref["job_seconds"] / 60,
                "study_mixed_pct": 100 * ref["mixed_group_fraction"],
            }
        )
        table = table.merge(study_cols, on=["task", "arm"], how="left")
    if arms is not None:
        return sort_tasks(_sort_by_labels(table, arms, ["task", "arm", "seed"], column="arm"))
    return sort_tasks(table.sort_values(["collection", "B", "arm", "seed"]))

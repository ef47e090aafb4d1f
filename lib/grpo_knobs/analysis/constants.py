"""The study's vocabulary: phases, shape columns, recipe names, screening questions, group arms."""

from __future__ import annotations

PHASES = ("screening", "lr-followup", "confirmation")  # study stages, in order
SHAPE_COLUMNS = ("rollout_batch_size", "n_samples_per_prompt", "global_batch_size", "num_steps_per_rollout")

# The study's display names for its confirmation recipes (seed article tables).
STUDY_RECIPE_NAMES = {
    "onpolicy-small": "Small one-update baseline",
    "onpolicy-large": "Large one-update batch",
    "batch-256-sqrt": "Two updates, retuned LR",
    "group-4": "Four answers, four updates",
}

# The screen's three questions: slug -> (title, arms in display order).
SCREENING_QUESTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "collection_size": (
        "Collection size at fixed B=128 (16/8/128/1 .. 128/8/128/8)",
        ("onpolicy-small", "split-2", "split-4", "split-8"),
    ),
    "optimizer_batch": (
        "Optimizer batch B inside a fixed 512-response collection",
        ("split-4", "batch-256", "onpolicy-large"),
    ),
    "group_size": (
        "Group size G at a fixed response budget (B=128, S=4)",
        ("group-4", "split-4", "group-16", "group-32"),
    ),
}
# Arms whose group size varies at a fixed budget (the mixed-group comparison).
GROUP_ARMS = ("group-4", "split-4", "group-16", "group-32")

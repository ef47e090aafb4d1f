"""Time to target (notebook 52)."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from grpo_knobs import stats
from grpo_knobs.analysis.ordering import _sort_by_labels


def time_to_target_table(
    curves: pd.DataFrame, runs: pd.DataFrame, targets: Mapping[str, Sequence[float]]
) -> pd.DataFrame:
    """One row per run and target (percent): the bracket in responses, active and job seconds.

    Censored runs keep ``reached=False`` and ``censored_at``; their bracket
    fields are NaN, never the budget.
    """
    rows = []
    for run in runs.itertuples():
        c = curves[curves["run_id"] == run.run_id].sort_values("responses")
        for target in targets.get(run.task, ()):
            res = stats.time_to_target(
                c["responses"], 100 * c["accuracy"], target, c["active_seconds"], c["job_seconds"]
            )
            rows.append(
                {
                    "task": run.task,
                    "recipe": run.label,
                    "seed": run.seed,
                    "run_id": run.run_id,
                    "target_pct": target,
                    "reached": res.reached,
                    **{
                        f"{u}_{side}": _none_to_nan(getattr(res, f"{u}_{side}"))
                        for u in ("responses", "active_seconds", "job_seconds")
                        for side in ("low", "high")
                    },
                    "censored_at": _none_to_nan(res.censored_at),
                    "responses_bracket": res.describe("responses"),
                    "active_seconds_bracket": res.describe("active_seconds"),
                    "job_seconds_bracket": res.describe("job_seconds"),
                    "result": res,
                }
            )
    return pd.DataFrame(rows)


def _none_to_nan(value: float | None) -> float:
    return np.nan if value is None else float(value)


def time_to_target_summary(table: pd.DataFrame, labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Per recipe and target: how many seeds reached it and the bracket ranges per unit."""
    rows = []
    for (task, recipe, target), g in table.groupby(["task", "recipe", "target_pct"], sort=False):
        summary = stats.summarize_time_to_target(list(g["result"]))
        rows.append(
            {
                "task": task,
                "recipe": recipe,
                "target_pct": target,
                "reached": f"{summary.n_reached}/{summary.n_runs}",
                "responses": summary.describe("responses"),
                "active_seconds": summary.describe("active_seconds"),
                "job_seconds": summary.describe("job_seconds"),
            }
        )
    return _sort_by_labels(pd.DataFrame(rows), labels, ["task", "target_pct", "recipe"])

"""Selection: the preset's rule applied to the complete screening runs, frozen once written to
``<study_dir>/selection.json``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..records import RunDir, atomic_write_json, read_json
from .planning import RANK_METRICS, Plan, PlanError, plan


def _validation_scores(run_dir: Path) -> dict[str, float]:
    """Final accuracy, sample AUC and job seconds of one complete run, from validation rows only."""
    import pandas as pd

    from ..stats import sample_auc

    run = RunDir(run_dir)
    evals = pd.read_parquet(run.evals_path, columns=["split", "responses", "correct"])
    curve = evals[evals["split"] == "validation"].groupby("responses")["correct"].mean().sort_index()
    if curve.empty:
        raise PlanError(f"{run_dir}: no validation rows in evals.parquet.")
    auc = sample_auc(curve.index.to_numpy(), curve.to_numpy()) if len(curve) > 1 else float(curve.iloc[-1])
    return {
        "final_accuracy": float(curve.iloc[-1]),
        "sample_auc": auc,
        "job_seconds": run.job_seconds(),
    }


def _rank(scores: dict[str, dict[str, float]], rank_by: tuple[str, ...]) -> list[str]:
    def key(arm: str) -> tuple:
        return tuple(-scores[arm][m] if RANK_METRICS[m] else scores[arm][m] for m in rank_by) + (arm,)

    return sorted(scores, key=key)


def compute_selection(plan: Plan) -> dict:
    """Apply the plan's selection rule to its complete screening runs.

    Raises PlanError listing the screening runs that are not complete: the rule ranks
    the whole screened pool, so selecting from a partial screen would change its meaning.
    """
    screening = plan.phase("screening")
    missing = [r.run_id for r in screening if not RunDir(plan.study_dir / r.run_id).is_complete()]
    if missing:
        raise PlanError(f"Selection needs every screening run complete; not complete: {', '.join(missing)}.")
    recipes, scores = {}, {}
    for task, pool in plan.candidates.items():
        per_arm: dict[str, dict[str, float]] = {}
        for arm in pool:
            seeds = [
                _validation_scores(plan.study_dir / r.run_id) for r in screening if r.task == task and r.arm == arm
            ]
            per_arm[arm] = {m: sum(s[m] for s in seeds) / len(seeds) for m in RANK_METRICS}
        order = _rank(per_arm, plan.rule.rank_by)
        keep = list(plan.rule.always_include)
        recipes[task] = keep + [a for a in order if a not in keep][: plan.rule.recipes[task] - len(keep)]
        scores[task] = {a: per_arm[a] | {"rank": order.index(a) + 1} for a in order}
    return {"rule": plan.rule.describe(), "rank_by": list(plan.rule.rank_by), "recipes": recipes, "scores": scores}


def select(
    preset_or_plan: str | Path | Plan, *, study_dir: str | Path | None = None, params: dict[str, Any] | None = None
) -> dict:
    """Write ``<study_dir>/selection.json`` once; afterwards the recipes are frozen.

    Rerunning returns the existing file when the rule still yields the same recipes and
    raises otherwise, so a changed screen can never silently change what was confirmed.
    """
    p = (
        preset_or_plan
        if isinstance(preset_or_plan, Plan)
        else plan(preset_or_plan, study_dir=study_dir, params=params)
    )
    fresh = compute_selection(p)
    path = p.study_dir / "selection.json"
    if path.exists():
        existing = read_json(path)
        if existing.get("recipes") != fresh["recipes"]:
            raise PlanError(
                f"{path} already holds recipes {existing.get('recipes')}, but the screening runs now give "
                f"{fresh['recipes']}. Selection is frozen once written; move the file away to reselect."
            )
        return existing
    atomic_write_json(
        path,
        fresh
        | {
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "screening_runs": [r.run_id for r in p.phase("screening")],
        },
    )
    return read_json(path)


def validation_summary(p: Plan, phase: str):
    """Final validation accuracy, sample AUC and job seconds of the phase's complete runs."""
    import pandas as pd

    rows = [
        {
            "task": r.task,
            "arm": r.arm,
            "seed": r.seed,
            "run_id": r.run_id,
            **_validation_scores(p.study_dir / r.run_id),
        }
        for r in p.phase(phase)
        if not r.placeholder and RunDir(p.study_dir / r.run_id).is_complete()
    ]
    return pd.DataFrame(rows, columns=["task", "arm", "seed", "run_id", *RANK_METRICS])


def selection_table(selection: dict):
    """The selection scores as a DataFrame (task, arm, rank, metrics, selected)."""
    import pandas as pd

    rows = [
        {"task": task, "arm": arm, **vals, "selected": arm in selection["recipes"][task]}
        for task, arms in selection["scores"].items()
        for arm, vals in arms.items()
    ]
    return pd.DataFrame(rows).sort_values(["task", "rank"]).reset_index(drop=True)

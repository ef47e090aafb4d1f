"""Problem categories (notebook 57): accuracy per category and paired differences split by category.

Every problem has a ``category`` (:attr:`grpo_knobs.data.Problem.category`):
for Countdown the operation sets of its solutions ("+", "*", "+|*", ...), for
GSM8K the number of steps in its gold rationale. Evaluation rows are tagged
by problem ID from the data layer; rows that already carry a ``category``
column (the synthetic fixture) keep it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from grpo_knobs import data
from grpo_knobs.analysis.confirmation import recipe_test_scores

# Evaluation split names as recorded -> the data layer's split names.
_SPLIT_NAMES = {"val": "validation", "validation": "validation", "test": "test", "train": "train"}


def problem_categories(task: str, split: str) -> pd.Series:
    """Category per problem ID of one split of ``task``, from the data layer."""
    problems = data.load_split(task, _SPLIT_NAMES.get(split, split))
    return pd.Series({p.id: p.category for p in problems}, name="category")


def tag_categories(rows: pd.DataFrame, runs: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """``rows`` (evaluation or test rows) with ``task`` and ``category`` columns, and one note per
    (task, split) whose problems the data layer cannot tag (their rows are dropped)."""
    tagged = rows.merge(runs[["run_id", "task"]], on="run_id") if "task" not in rows else rows.copy()
    if "category" in tagged and tagged["category"].notna().all():
        return tagged, []
    parts, notes = [], []
    for (task, split), part in tagged.groupby(["task", "split"], sort=False):
        try:
            cats = problem_categories(task, split)
        except (ValueError, FileNotFoundError, KeyError) as error:
            notes.append(f"{task} {split}: no problem categories ({error}); left out")
            continue
        part = part.assign(category=part["problem_id"].map(cats))
        missing = int(part["category"].isna().sum())
        if missing:
            notes.append(f"{task} {split}: {missing} rows have problem IDs the data layer does not know; left out")
            part = part.dropna(subset=["category"])
        parts.append(part)
    frame = pd.concat(parts, ignore_index=True) if parts else tagged.iloc[:0].assign(category=pd.Series(dtype=str))
    return frame, notes


def category_order(categories: Sequence[str]) -> list[str]:
    """Display order: GSM8K step counts numerically, Countdown operation sets shortest first."""

    def key(c: str) -> tuple:
        head = c.split()[0]
        return (0, int(head), c) if head.isdigit() else (1, len(c), c)

    return sorted(set(categories), key=key)


def category_sizes(tagged: pd.DataFrame) -> pd.DataFrame:
    """Problems per category and split (each problem counted once), with its share of the split in %."""
    problems = tagged.drop_duplicates(["task", "split", "problem_id"])
    table = problems.groupby(["task", "split", "category"]).size().rename("problems").reset_index()
    table["share_pct"] = 100 * table["problems"] / table.groupby(["task", "split"])["problems"].transform("sum")
    order = {c: i for i, c in enumerate(category_order(table["category"]))}
    return table.sort_values(
        ["task", "split", "category"], key=lambda s: s.map(order) if s.name == "category" else s, ignore_index=True
    )


def category_curves(tagged_evals: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Validation accuracy per recipe, category and evaluation point: seed mean, min and max in %."""
    rows = tagged_evals.merge(runs[["run_id", "label", "seed"]], on="run_id")
    per_run = rows.groupby(["task", "label", "category", "responses", "run_id"])["correct"].mean().mul(100)
    table = per_run.groupby(["task", "label", "category", "responses"]).agg(["mean", "min", "max", "count"])
    problems = rows.drop_duplicates(["task", "category", "problem_id"]).groupby(["task", "category"]).size()
    table = table.reset_index().rename(
        columns={"mean": "accuracy_pct", "min": "min_pct", "max": "max_pct", "count": "n_runs"}
    )
    return table.merge(problems.rename("problems").reset_index(), on=["task", "category"])


def category_test_table(
    tagged_tests: pd.DataFrame, runs: pd.DataFrame, labels: Sequence[str] | None = None
) -> pd.DataFrame:
    """Terminal test accuracy per recipe and category: seed mean % and per-seed %."""
    rows = tagged_tests.merge(runs[["run_id", "label", "seed"]], on="run_id")
    per_seed = rows.groupby(["task", "label", "category", "seed"])["correct"].mean().mul(100).reset_index()
    table = (
        per_seed.groupby(["task", "label", "category"])
        .agg(accuracy_pct=("correct", "mean"), seed_pct=("correct", tuple))
        .reset_index()
    )
    sizes = rows.drop_duplicates(["task", "category", "problem_id"]).groupby(["task", "category"]).size()
    table = table.merge(sizes.rename("problems").reset_index(), on=["task", "category"])
    label_rank = {lab: i for i, lab in enumerate(labels or sorted(table["label"].unique()))}
    cat_rank = {c: i for i, c in enumerate(category_order(table["category"]))}
    table["_l"], table["_c"] = table["label"].map(label_rank), table["category"].map(cat_rank)
    table = table.sort_values(["task", "_l", "_c"]).drop(columns=["_l", "_c"]).reset_index(drop=True)
    return table[["task", "label", "category", "problems", "accuracy_pct", "seed_pct"]]


def category_decomposition(
    tagged_tests: pd.DataFrame, runs: pd.DataFrame, task: str, pairs: Sequence[tuple[str, str]]
) -> pd.DataFrame:
    """Each test-accuracy difference ``x - y`` split by category.

    Per pair and category: problems, correct answers per trained model of
    each recipe (seed mean), their difference, and its contribution to the
    overall difference in pp (difference / all problems x 100); contributions
    sum to the overall seed-mean difference. ``net_correct_all_seeds`` sums
    the difference over seeds when both recipes have the same seed count.
    """
    cats = tagged_tests.drop_duplicates("problem_id").set_index("problem_id")["category"]
    rows = []
    for x, y in pairs:
        a, _, ids = recipe_test_scores(tagged_tests, runs, x, task)  # [seeds_x, problems]
        b, _, ids_b = recipe_test_scores(tagged_tests, runs, y, task)  # [seeds_y, problems]
        if ids != ids_b:
            raise ValueError(f"{x!r} and {y!r} on {task} graded different test problems")
        problem_cat = cats.reindex(ids).to_numpy()  # [problems]
        for cat in category_order(problem_cat):
            cols = problem_cat == cat  # [problems]
            per_model_x, per_model_y = a[:, cols].sum(axis=1).mean(), b[:, cols].sum(axis=1).mean()
            rows.append(
                {
                    "task": task,
                    "comparison": f"{x} versus {y}",
                    "category": cat,
                    "problems": int(cols.sum()),
                    "x_correct_per_model": per_model_x,
                    "y_correct_per_model": per_model_y,
                    "diff_per_model": per_model_x - per_model_y,
                    "contribution_pp": 100 * (per_model_x - per_model_y) / len(ids),
                    "net_correct_all_seeds": (a[:, cols].sum() - b[:, cols].sum()) if len(a) == len(b) else np.nan,
                }
            )
    return pd.DataFrame(rows)


def exact_category_solutions(tagged_evals: pd.DataFrame) -> pd.DataFrame:
    """Evaluations whose correct set is exactly the problems of one category, per task and category.

    One row per (task, category, accuracy) that some evaluation matched: how many
    evaluations (run and point) solved exactly that category's problems among
    those it graded, and nothing else, out of all evaluations at that accuracy.
    A plateau at such an accuracy is a policy that has learned one operation; an
    evaluation of a subset of the split has its own plateau (the category's share
    of that subset).
    """
    rows = []
    for task, part in tagged_evals.groupby("task"):
        members = part.drop_duplicates("problem_id").groupby("category")["problem_id"].agg(frozenset)
        for (_, _), ev in part.groupby(["run_id", "responses"]):
            graded = frozenset(ev["problem_id"])
            solved = frozenset(ev.loc[ev["correct"] > 0, "problem_id"])
            for cat, ids in members.items():
                if solved and solved == ids & graded:
                    rows.append({"task": task, "category": cat, "accuracy_pct": 100 * len(solved) / len(ev)})
    if not rows:
        return pd.DataFrame(columns=["task", "category", "accuracy_pct", "evaluations", "evaluations_at_accuracy"])
    found = pd.DataFrame(rows).groupby(["task", "category", "accuracy_pct"]).size().rename("evaluations").reset_index()
    per_eval = tagged_evals.groupby(["task", "run_id", "responses"])["correct"].mean().mul(100).round(9).reset_index()
    at_acc = [
        int(((per_eval["task"] == r.task) & np.isclose(per_eval["correct"], r.accuracy_pct)).sum())
        for r in found.itertuples()
    ]
    return found.assign(evaluations_at_accuracy=at_acc)


def one_category_plateaus(tagged_evals: pd.DataFrame) -> pd.DataFrame:
    """Per run: the most a policy that solves exactly one category can score on the problems the run's
    last evaluation graded, i.e. the largest category's share of them in % (``plateau_pct``), with that
    ``category`` and the number of ``problems``. A run evaluated on a subset of the split (e.g.
    ``eval_problems=256``) gets the plateau of its subset, not of the whole split."""
    rows = []
    for run_id, part in tagged_evals.groupby("run_id", sort=False):
        last = part[part["responses"] == part["responses"].max()].drop_duplicates("problem_id")
        shares = last["category"].value_counts()
        rows.append(
            {
                "run_id": run_id,
                "task": last["task"].iloc[0],
                "problems": len(last),
                "category": shares.index[0],
                "plateau_pct": 100 * shares.iloc[0] / len(last),
            }
        )
    return pd.DataFrame(rows, columns=["run_id", "task", "problems", "category", "plateau_pct"])


def pool_coverage(collections: pd.DataFrame, runs: pd.DataFrame, pool_size: int) -> pd.DataFrame:
    """Per arm (P): the first collection (1-based) by which every run of it had drawn all ``pool_size``
    training prompts, and the prompt slots of one collection beyond the pool (P - pool_size when
    positive): at least that many prompts of every such collection are repeats."""
    merged = collections.merge(runs[["run_id", "arm", "rollout_batch_size"]], on="run_id")
    full = merged[merged["distinct_prompts"] >= pool_size].groupby("run_id")["collection"].min() + 1
    per_run = runs.set_index("run_id")[["arm", "rollout_batch_size"]].join(full.rename("covered_by"), how="inner")
    table = per_run.groupby(["rollout_batch_size"]).agg(
        arms=("arm", lambda a: ", ".join(sorted(set(a)))), runs=("arm", "size"), covered_by=("covered_by", "max")
    )
    table = table.reset_index().rename(columns={"rollout_batch_size": "P"})
    table["repeated_slots_min"] = (table["P"] - pool_size).clip(lower=0)
    return table


def shared_numbers(task: str) -> pd.DataFrame:
    """Per held-out split of a Countdown task: problems whose (sorted) numbers also occur in a
    training problem, with a different target."""
    pool = data.load_split(task, "train")
    train = {tuple(sorted(p.numbers)) for p in pool}
    rows = []
    for split in ("validation", "test"):
        problems = data.load_split(task, split)
        shared = sum(tuple(sorted(p.numbers)) in train for p in problems)
        rows.append(
            {
                "task": task,
                "split": split,
                "problems": len(problems),
                "share_train_numbers": shared,
                "train_pool": len(pool),
            }
        )
    return pd.DataFrame(rows)

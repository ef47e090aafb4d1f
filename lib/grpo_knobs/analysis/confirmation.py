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
    table = pd.DataFrame(
        {
            "task": runs["task"],
            "recipe": runs["label"],
            "seed": runs["seed"],
            "val_pct": 100 * runs["final_accuracy"],
            "test_pct": 100 * runs.get("test_accuracy", pd.Series(np.nan, index=runs.index)),
            "phase_min": runs["active_phase_seconds"] / 60,
            "job_min": runs["job_seconds"] / 60,
        }
    )
    return _sort_by_labels(table, labels, ["task", "recipe", "seed"])


def recipe_test_scores(
    tests: pd.DataFrame, runs: pd.DataFrame, label: str, task: str, column: str = "correct"
) -> tuple[np.ndarray, np.ndarray, list[str]]:
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


def paired_comparisons(
    runs: pd.DataFrame,
    tests: pd.DataFrame,
    task: str,
    pairs: Sequence[tuple[str, str]],
    n_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> pd.DataFrame:
    """Test-accuracy differences ``x - y`` per pair, via :func:`stats.paired_bootstrap`.

    Seeds are paired by seed number, so both recipes need the same seed set.
    """
    rows = []
    for x, y in pairs:
        a, seeds_a, ids_a = recipe_test_scores(tests, runs, x, task)
        b, seeds_b, ids_b = recipe_test_scores(tests, runs, y, task)
        if list(seeds_a) != list(seeds_b):
            raise ValueError(f"{x!r} and {y!r} on {task} have different seeds: {list(seeds_a)} vs {list(seeds_b)}")
        res = stats.paired_bootstrap(
            a, b, n_resamples=n_resamples, seed=seed, confidence=confidence, problem_ids_a=ids_a, problem_ids_b=ids_b
        )
        rows.append(
            {
                "task": task,
                "comparison": f"{x} versus {y}",
                "mean_pp": res.mean_diff_pp,
                "ci_low_pp": res.ci_low_pp,
                "ci_high_pp": res.ci_high_pp,
                "seed_diffs_pp": tuple(float(d) for d in res.per_seed_diff_pp),
                "p_le_zero": res.p_le_zero,
                "n_seeds": a.shape[0],
                "n_problems": a.shape[1],
            }
        )
    return pd.DataFrame(rows)


# What a run's times in seconds depend on besides its recipe: how it generated and how it trained.
PATH_COLUMNS = ("rollout_path", "trainer_path")


def _run_paths(runs: pd.DataFrame) -> pd.DataFrame:
    """Each run's decode and trainer path ([runs, 2]), and ``_path``, one label for the pair
    (e.g. "fused / packed-liger"); a decode path a record predates reads "unrecorded" (the trainer
    path of such records is read from them by :func:`load_study`)."""
    missing = pd.Series(None, index=runs.index, dtype=object)
    paths = pd.DataFrame({c: runs.get(c, missing).fillna("unrecorded").astype(str) for c in PATH_COLUMNS})
    return paths.assign(_path=paths["rollout_path"] + " / " + paths["trainer_path"])


def _device_use(runs: pd.DataFrame) -> pd.Series:
    """[runs] "shared" where a run trained beside other runs on its device (``loading.shared_device``), else
    "alone" (also for records that cannot tell, such as the published study's)."""
    return runs.get("device_use", pd.Series("alone", index=runs.index)).fillna("alone")


def _task_runs(runs: pd.DataFrame, task: str) -> pd.DataFrame:
    """The task's runs with their paths and device use filled in (:func:`_run_paths`, :func:`_device_use`)."""
    task_runs = runs[runs["task"] == task]
    filled = task_runs.drop(columns=list(PATH_COLUMNS), errors="ignore").join(_run_paths(task_runs))
    return filled.assign(device_use=_device_use(task_runs))


def _seed_pairs(task_runs: pd.DataFrame, x: str, y: str) -> tuple[dict, dict[str, list], list, list]:
    """Runs of ``x`` and ``y`` by seed, the seeds both ran split into those whose two runs had their device to
    themselves and share a path (by path), those on different paths, and those where a run shared its device
    (its times include waiting for the runs beside it)."""
    chosen = {label: task_runs[task_runs["label"] == label].set_index("seed") for label in (x, y)}
    by_path: dict[str, list] = {}
    mixed, crowded = [], []
    for seed in sorted(set(chosen[x].index) & set(chosen[y].index)):
        path = chosen[x].at[seed, "_path"]
        if "shared" in (chosen[x].at[seed, "device_use"], chosen[y].at[seed, "device_use"]):
            crowded.append(seed)
        elif path == chosen[y].at[seed, "_path"]:
            by_path.setdefault(path, []).append(seed)
        else:
            mixed.append(seed)
    return chosen, by_path, mixed, crowded


# Measured: the same code and seed on two H200 machines, trainer phase per 1,000 response tokens 12.1 against
# 17.8 ms (docs/performance.md, "The batch-256 recipe in one process and in fresh processes").
MACHINE_SPREAD = "the same code's trainer phase took 1.5x as long per response token on one H200 machine as on another"


def run_path_note(runs: pd.DataFrame, task: str) -> str | None:
    """Lines naming the decode and trainer paths when the task's runs used more than one, the runs that
    shared their device with other runs, and how many GPUs trained them when more than one, else None: times
    in seconds then depend on the path, the runs beside them or the machine, as well as on the recipe, while
    response counts do not."""
    task_runs = _task_runs(runs, task)
    keys, lines = task_runs["_path"], []
    if keys.nunique() > 1:
        counts = ", ".join(f"{key} {n}" for key, n in keys.value_counts().sort_index().items())
        lines.append(
            f"{task}: runs used more than one decode / trainer path (runs per path: {counts}); times in seconds "
            "mix them, compare recipes on responses or within one path"
        )
    crowded = task_runs[task_runs["device_use"] == "shared"]
    if len(crowded):
        lines.append(
            f"{task}: {len(crowded)} of {len(task_runs)} runs trained beside other runs on one device; their times "
            "in seconds include waiting for them, compare recipes on responses or on runs that trained alone"
        )
    gpus = task_runs.get("trained_on", pd.Series(dtype=object)).dropna()
    if gpus.nunique() > 1:
        lines.append(
            f"{task}: {len(gpus)} runs trained on {gpus.nunique()} GPUs ({MACHINE_SPREAD}); times in seconds "
            "mix machines, compare recipes on responses or on runs of one GPU"
        )
    return "\n".join(lines) or None


def trainer_path_note(runs: pd.DataFrame, task: str) -> str | None:
    """A line saying how the trainer paths the task's runs did not record were read from their records
    (``trainer_path_source`` of :func:`load_study`), with run counts; None when every run recorded its path."""
    task_runs = runs[runs["task"] == task]
    if "trainer_path_source" not in task_runs:
        return None
    read = task_runs[task_runs["trainer_path_source"] != "recorded"]
    if read.empty:
        return None
    counts = read.groupby(["trainer_path", "trainer_path_source"], sort=True).size()
    parts = "; ".join(f"{path} for {n} ({source})" for (path, source), n in counts.items())
    return f"{task}: trainer path not recorded by {len(read)} of {len(task_runs)} runs, read from the records: {parts}"


def job_time_path_notes(runs: pd.DataFrame, task: str, pairs: Sequence[tuple[str, str]]) -> list[str]:
    """One line per pair whose seed pairs include runs on different decode or trainer paths (left out
    of :func:`paired_job_times`, since job time depends on both); empty when every seed pair shares one."""
    notes = []
    task_runs = _task_runs(runs, task)
    for x, y in pairs:
        _, _, mixed, crowded = _seed_pairs(task_runs, x, y)
        if mixed:
            notes.append(
                f"{task}: {x} versus {y}: job times of seeds {mixed} left out (runs on different decode or "
                f"trainer paths); accuracy comparisons use every seed"
            )
        if crowded:
            notes.append(
                f"{task}: {x} versus {y}: job times of seeds {crowded} left out (a run trained beside other runs "
                f"on one device); accuracy comparisons use every seed"
            )
    return notes


def paired_job_times(runs: pd.DataFrame, task: str, pairs: Sequence[tuple[str, str]]) -> pd.DataFrame:
    """Job-time change of ``x`` against ``y`` per pair and path, seeds paired by number (the study's
    "time reduction": 1 - x / y, positive when ``x`` finishes sooner).

    Job time depends on how a run generated (``rollout_path``) and trained (``trainer_path``);
    runs that predate the decode path's record count as "unrecorded" there. A seed pair counts only when both
    runs share both paths, and each (decode, trainer) path gets its own row
    (:func:`job_time_path_notes` lists the seed pairs left out). A pair without such a seed is
    left out.
    """
    rows = []
    task_runs = _task_runs(runs, task)
    for x, y in pairs:
        chosen, by_path, _, _ = _seed_pairs(task_runs, x, y)
        for _, seeds in sorted(by_path.items()):  # one row per shared path
            a = chosen[x].loc[seeds, "job_seconds"].to_numpy() / 60  # [seeds]
            b = chosen[y].loc[seeds, "job_seconds"].to_numpy() / 60  # [seeds]
            reductions = 100 * (1 - a / b)  # [seeds]
            rows.append(
                {
                    "task": task,
                    "comparison": f"{x} versus {y}",
                    **{c: chosen[x].at[seeds[0], c] for c in PATH_COLUMNS},
                    "x_job_min": a.mean(),
                    "y_job_min": b.mean(),
                    "ratio": a.mean() / b.mean(),
                    "reduction_pct": 100 * (1 - a.mean() / b.mean()),
                    "seed_reductions_pct": tuple(float(r) for r in reductions),
                    "seeds_faster": int((reductions > 0).sum()),
                    "n_seeds": len(seeds),
                }
            )
    return pd.DataFrame(
        rows,
        columns=[
            "task",
            "comparison",
            *PATH_COLUMNS,
            "x_job_min",
            "y_job_min",
            "ratio",
            "reduction_pct",
            "seed_reductions_pct",
            "seeds_faster",
            "n_seeds",
        ],
    )


def format_comparisons(table: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """The study's display: signed pp, "[low, high]" interval, per-seed differences."""
    interval = f"Conditional {round(100 * confidence)}% interval"
    return pd.DataFrame(
        {
            "Comparison": table["comparison"],
            "Mean pp": table["mean_pp"].map(lambda v: f"{v:+.2f}"),
            interval: [f"[{lo:+.2f}, {hi:+.2f}]" for lo, hi in zip(table["ci_low_pp"], table["ci_high_pp"])],
            "Seed differences pp": table["seed_diffs_pp"].map(lambda d: ", ".join(f"{v:+.2f}" for v in d)),
        }
    )


def phase_cost_table(runs: pd.DataFrame, labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Seed-mean minutes per phase and output tokens per recipe.

    "Other" is job time minus the recorded phases (generation, trainer,
    sync), as in the study: it holds initialization, validation, checkpoint
    saving and orchestration. When the runs used more than one decode path
    (``rollout_path``) or trainer path (``trainer_path``), or some trained beside other runs on
    their device (``device_use``), each gets its own rows, since times depend on them.
    """
    paths = _run_paths(runs).assign(device_use=_device_use(runs))
    split = [c for c in (*PATH_COLUMNS, "device_use") if paths[c].nunique() > 1]
    per_run = pd.DataFrame(
        {
            "task": runs["task"],
            "recipe": runs["label"],
            **{c: paths[c] for c in split},
            "generate_min": runs["generation_seconds"] / 60,
            "trainer_min": runs["trainer_seconds"] / 60,
            "sync_min": runs["sync_seconds"] / 60,
            "other_min": (
                runs["job_seconds"] - runs["generation_seconds"] - runs["trainer_seconds"] - runs["sync_seconds"]
            )
            / 60,
            "output_million_tokens": runs["output_tokens"] / 1e6,
        }
    )
    keys = ["task", "recipe", *split]
    table = per_run.groupby(keys, sort=False).mean().reset_index()
    table["n_runs"] = per_run.groupby(keys, sort=False).size().to_numpy()
    return _sort_by_labels(table, labels, keys)


def truncation_table(runs: pd.DataFrame, labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Per run: terminal test mean response length and truncation %."""
    table = pd.DataFrame(
        {
            "task": runs["task"],
            "recipe": runs["label"],
            "seed": runs["seed"],
            "test_response_length": runs["test_response_length"],
            "test_truncation_pct": 100 * runs["test_truncation_fraction"],
        }
    )
    return _sort_by_labels(table, labels, ["task", "recipe", "seed"])


def truncation_range(table: pd.DataFrame) -> pd.DataFrame:
    """Per task: min and max terminal-test truncation % across runs."""
    return table.groupby("task", sort=False)["test_truncation_pct"].agg(["min", "max", "count"]).reset_index()


def _unpaired_test_scores(
    runs: pd.DataFrame, tests: pd.DataFrame, task: str, x: str, y: str, max_seeds: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Test scores [seeds, problems] of ``x`` and ``y`` on the same problem columns; with
    ``max_seeds`` only each recipe's lowest-numbered seeds."""
    a, seeds_a, ids_a = recipe_test_scores(tests, runs, x, task)
    b, seeds_b, ids_b = recipe_test_scores(tests, runs, y, task)
    if ids_a != ids_b:
        raise ValueError(f"{x!r} and {y!r} on {task} graded different test problems")
    if max_seeds is not None:
        a, b = a[np.argsort(seeds_a)[:max_seeds]], b[np.argsort(seeds_b)[:max_seeds]]
    return a, b


def seed_level_comparisons(
    runs: pd.DataFrame,
    tests: pd.DataFrame,
    task: str,
    pairs: Sequence[tuple[str, str]],
    n_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
    max_seeds: int | None = None,
) -> pd.DataFrame:
    """Test-accuracy differences ``x - y`` with the trained model as the unit, per pair.

    Three views of the same difference: the two-level bootstrap
    (:func:`stats.hierarchical_bootstrap`, seeds then problems), the
    one-sided permutation test over the per-seed means (exact up to 200,000 relabellings)
    (:func:`stats.seed_permutation_p`, H1: ``x`` is better) and Welch's t
    interval on the per-seed means (NaN with fewer than two seeds). Seeds are
    not paired, so the recipes may have different seed counts; ``max_seeds``
    keeps each recipe's lowest-numbered seeds.
    """
    rows = []
    for x, y in pairs:
        a, b = _unpaired_test_scores(runs, tests, task, x, y, max_seeds)  # [seeds_x, problems], [seeds_y, problems]
        boot = stats.hierarchical_bootstrap(a, b, n_resamples=n_resamples, seed=seed, confidence=confidence)
        perm = stats.seed_permutation_p(a, b, alternative="greater")  # exact up to 200,000 relabellings
        welch = stats.seed_welch_interval(a, b, confidence) if min(len(a), len(b)) >= 2 else None
        rows.append(
            {
                "task": task,
                "comparison": f"{x} versus {y}",
                "n_seeds_x": len(a),
                "n_seeds_y": len(b),
                "n_problems": a.shape[1],
                "mean_pp": boot.mean_diff_pp,
                "hier_low_pp": boot.ci_low_pp,
                "hier_high_pp": boot.ci_high_pp,
                "perm_p_greater": perm.p_value,
                "n_relabellings": perm.n_relabellings,
                "welch_low_pp": welch.ci_low_pp if welch else np.nan,
                "welch_high_pp": welch.ci_high_pp if welch else np.nan,
                "welch_p_two_sided": welch.p_value if welch else np.nan,
            }
        )
    return pd.DataFrame(rows)


def tested_seeds(runs: pd.DataFrame, tests: pd.DataFrame, task: str) -> dict[str, list[int]]:
    """Seeds with terminal test rows, per recipe label of ``task``."""
    tested = tests.merge(runs[runs["task"] == task][["run_id", "label", "seed"]], on="run_id")
    return {label: sorted(int(s) for s in set(g)) for label, g in tested.groupby("label")["seed"]}


def tested_pairs(
    runs: pd.DataFrame, tests: pd.DataFrame, task: str, pairs: Sequence[tuple[str, str]]
) -> tuple[list[tuple[str, str]], list[str]]:
    """The pairs :func:`seed_level_comparisons` can compare (both recipes have test rows; their
    seeds may differ), and a note per pair it cannot."""
    seeds = tested_seeds(runs, tests, task)
    ok, notes = [], []
    for x, y in pairs:
        missing = [lab for lab in (x, y) if lab not in seeds]
        if missing:
            notes.append(f"{task}: {x} versus {y}: no terminal test rows for {', '.join(missing)}")
        else:
            ok.append((x, y))
    return ok, notes


def format_seed_level(table: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """Display strings of :func:`seed_level_comparisons` rows (and its ``seeds`` column if present)."""
    level = round(100 * confidence)
    shown = pd.DataFrame({"Comparison": table["comparison"]})
    if "seeds" in table:
        shown["Seeds used"] = table["seeds"]
    shown["Seeds x / y"] = [f"{x} / {y}" for x, y in zip(table["n_seeds_x"], table["n_seeds_y"])]
    shown["Problems"] = table["n_problems"].astype(int)
    shown["Mean pp"] = table["mean_pp"].map(lambda v: f"{v:+.2f}")
    shown[f"Seed-level {level}% (seeds, then problems)"] = [
        f"[{lo:+.2f}, {hi:+.2f}]" for lo, hi in zip(table["hier_low_pp"], table["hier_high_pp"])
    ]
    shown["Permutation p (one-sided)"] = [
        f"{p:.3f} (of {n})" for p, n in zip(table["perm_p_greater"], table["n_relabellings"])
    ]
    shown[f"Welch {level}%"] = [
        "n/a" if np.isnan(lo) else f"[{lo:+.2f}, {hi:+.2f}], p={p:.2f}"
        for lo, hi, p in zip(table["welch_low_pp"], table["welch_high_pp"], table["welch_p_two_sided"])
    ]
    return shown.reset_index(drop=True)


def comparison_side_by_side(
    conditional: pd.DataFrame, seed_level: pd.DataFrame, confidence: float = 0.95
) -> pd.DataFrame:
    """The conditional (problem-bootstrap) and seed-level intervals of each comparison, one row each.

    ``conditional`` comes from :func:`paired_comparisons`, ``seed_level`` from
    :func:`seed_level_comparisons`; a comparison missing from ``conditional``
    (seeds not paired) shows n/a there.
    """
    level = round(100 * confidence)
    shown = format_seed_level(seed_level, confidence)
    cond = conditional.set_index("comparison") if len(conditional) else pd.DataFrame(columns=["ci_low_pp"])
    column = [
        f"[{cond.at[c, 'ci_low_pp']:+.2f}, {cond.at[c, 'ci_high_pp']:+.2f}]"
        if c in cond.index
        else "n/a (seeds not paired)"
        for c in seed_level["comparison"]
    ]
    shown.insert(4, f"Conditional {level}% (problems)", column)
    return shown


INTERVAL_MEANINGS = {
    "conditional": (
        "Conditional interval: how much the difference between these particular trained models "
        "could move if they were graded on another draw of test problems of the same kind."
    ),
    "hierarchical": (
        "Seed-level interval: how much the difference between the recipes could move with other "
        "training seeds and other test problems; seeds are resampled per recipe, not paired."
    ),
    "permutation": (
        "Permutation p: the share of all ways to relabel the trained models between the two recipes "
        "that give a difference in seed-mean accuracy at least as large as the observed one."
    ),
    "welch": (
        "Welch interval: a t interval that treats each trained model's test accuracy as one observation; "
        "with three seeds per recipe it has about two degrees of freedom and is wide."
    ),
}


def seed_count_change(
    runs: pd.DataFrame,
    tests: pd.DataFrame,
    task: str,
    pairs: Sequence[tuple[str, str]],
    first: int = 3,
    n_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> pd.DataFrame:
    """The seed-level comparison on each recipe's first ``first`` seeds and on all its seeds.

    Only pairs where a recipe has more than ``first`` tested seeds appear (an
    empty frame when none has). Column ``seeds`` says which rows are which.
    """
    task_runs = runs[runs["task"] == task]
    tested = tests.merge(task_runs[["run_id", "label", "seed"]], on="run_id")
    counts = tested.groupby("label")["seed"].nunique()
    grown = [(x, y) for x, y in pairs if max(counts.get(x, 0), counts.get(y, 0)) > first]
    if not grown:
        return pd.DataFrame()
    few = seed_level_comparisons(runs, tests, task, grown, n_resamples, seed, confidence, max_seeds=first)
    every = seed_level_comparisons(runs, tests, task, grown, n_resamples, seed, confidence)
    table = pd.concat([few.assign(seeds=f"first {first}"), every.assign(seeds="all")], ignore_index=True)
    order = {c: i for i, c in enumerate(every["comparison"])}
    table = table.sort_values(
        ["comparison", "seeds"],
        key=lambda s: s.map(order) if s.name == "comparison" else s.map(lambda v: 0 if v.startswith("first") else 1),
        ignore_index=True,
    )
    return table[["task", "comparison", "seeds", *[c for c in every.columns if c not in ("task", "comparison")]]]

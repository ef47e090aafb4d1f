"""The analysis a study registered before its runs (notebook 59): every registered comparison with the
seed as the unit, Holm-adjusted across the comparisons, and the rerun-versus-seed variance split.

``registered`` is the JSON form of a preset's ``analysis:`` section
(``grpo_knobs.study.preregistration.Preregistration.to_json``; ``plan.json`` holds it as
``preregistration``). Frames are those of :func:`grpo_knobs.analysis.load_study`.
"""

from __future__ import annotations

import json
from itertools import count, groupby
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from grpo_knobs import stats
from grpo_knobs.analysis.confirmation import recipe_test_scores

# config.json fields that name a run or say where it ran; two runs equal in every other field (and
# in their library source) are reruns of one seed.
_NAMING_FIELDS = (
    "run_id",
    "output_dir",
    "resume",
    "tracking_dir",
    "tracker",
    "study",
    "recipe",
    "arm",
    "phase",
    "seed",
)


def _seeds_used(tested: Sequence[int], registered: Sequence[int], first: int | None) -> list[int]:
    wanted = sorted(registered)[:first] if first else sorted(registered)
    return [s for s in wanted if s in set(tested)]


def _tested(runs: pd.DataFrame, tests: pd.DataFrame, task: str, arm: str) -> list[int]:
    chosen = runs[(runs["task"] == task) & (runs["arm"] == arm)]
    return sorted(int(s) for s in chosen[chosen["run_id"].isin(tests["run_id"])]["seed"].unique())


def _scores(runs: pd.DataFrame, tests: pd.DataFrame, task: str, arm: str, seeds: list[int]):
    """([seeds, problems] test scores, problem IDs) of ``arm`` on ``task``, rows in ``seeds`` order."""
    chosen = runs[(runs["task"] == task) & (runs["arm"] == arm) & runs["seed"].isin(seeds)].assign(label=arm)
    scores, _, ids = recipe_test_scores(tests, chosen, arm, task)  # rows in seed order, as ``seeds``
    return scores, ids


def coverage_notes(runs: pd.DataFrame, tests: pd.DataFrame, registered: dict) -> list[str]:
    """One line per compared recipe whose tested seeds differ from its registered seeds."""
    runs = runs[runs["phase"] == "confirmation"]
    notes = []
    recipes = dict.fromkeys((c["task"], arm) for c in registered["comparisons"] for arm in (c["x"], c["y"]))
    for task, arm in recipes:
        want, have = registered["seeds"][task], _tested(runs, tests, task, arm)
        missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
        if missing:
            notes.append(
                f"{task} {arm}: {len(want) - len(missing)} of {len(want)} registered seeds tested (missing: "
                f"{_span(missing)}); its comparisons are a preview, not the registered analysis"
            )
        if extra:
            notes.append(f"{task} {arm}: seeds {_span(extra)} are not registered and are left out")
    return notes


def _span(seeds: Sequence[int]) -> str:
    """[1, 2, 3, 7] -> "1-3, 7": consecutive seeds share seed - position."""
    runs = [list(g) for _, g in groupby(sorted(seeds), key=lambda s, n=count(): s - next(n))]
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def preregistered_comparisons(
    runs: pd.DataFrame, tests: pd.DataFrame, registered: dict, first_seeds: int | None = None
) -> pd.DataFrame:
    """Every registered comparison ``x - y`` of test accuracy, one row each, in the registered order.

    Per comparison: the recipes' seed means (``x_pct``, ``y_pct``), the difference (``mean_pp``),
    the seed-level interval (:func:`stats.hierarchical_bootstrap`: seeds per recipe, then problems),
    the conditional interval beside it (:func:`stats.paired_bootstrap`: problems, seeds paired by
    number; NaN where the seeds differ), the permutation p over seeds
    (:func:`stats.seed_permutation_p`, the registered alternative) and Holm's adjusted p across all
    registered comparisons (:func:`stats.holm_adjust`), where a comparison without test rows counts
    as p = 1. Only registered seeds with test rows are used; with ``first_seeds``, each recipe's
    lowest-numbered registered seeds. ``complete`` says whether both recipes had every registered
    seed in use (the registered analysis rather than a preview).
    """
    runs = runs[runs["phase"] == "confirmation"]
    rows = []
    for c in registered["comparisons"]:
        task, x, y = c["task"], c["x"], c["y"]
        want = registered["seeds"][task]
        seeds = {arm: _seeds_used(_tested(runs, tests, task, arm), want, first_seeds) for arm in (x, y)}
        row = {"task": task, "comparison": c["name"], "x": x, "y": y, "n_seeds_x": len(seeds[x])}
        row |= {"n_seeds_y": len(seeds[y]), "registered_seeds": min(first_seeds or len(want), len(want))}
        if not (seeds[x] and seeds[y]):
            rows.append(row | {"perm_p": np.nan})
            continue
        (a, ids_a), (b, ids_b) = _scores(runs, tests, task, x, seeds[x]), _scores(runs, tests, task, y, seeds[y])
        if ids_a != ids_b:
            raise ValueError(f"{x!r} and {y!r} on {task} were tested on different problems")
        level = registered["confidence"]
        boot = stats.hierarchical_bootstrap(a, b, registered["resamples"], registered["seed"], level)
        perm = stats.seed_permutation_p(
            a,
            b,
            registered["alternative"],
            registered["exact_relabellings"],
            registered["relabellings"],
            registered["seed"],
        )
        if seeds[x] == seeds[y]:
            cond = stats.paired_bootstrap(a, b, registered["resamples"], registered["seed"], level)
            cond_ci = (cond.ci_low_pp, cond.ci_high_pp)
        else:
            cond_ci = (np.nan, np.nan)
        rows.append(
            row
            | {
                "n_problems": a.shape[1],
                "x_pct": 100 * a.mean(),
                "y_pct": 100 * b.mean(),
                "mean_pp": boot.mean_diff_pp,
                "seed_low_pp": boot.ci_low_pp,
                "seed_high_pp": boot.ci_high_pp,
                "cond_low_pp": cond_ci[0],
                "cond_high_pp": cond_ci[1],
                "perm_p": perm.p_value,
                "perm_method": f"{'exact' if isinstance(perm, stats.SeedPermutationTest) else 'sampled'}, "
                f"{perm.n_relabellings:,}",
            }
        )
    table = pd.DataFrame(rows)
    table["holm_p"] = stats.holm_adjust(table["perm_p"].fillna(1.0).to_numpy())
    table["rejected"] = table["holm_p"] <= registered["alpha"]
    table["complete"] = (table["n_seeds_x"] == table["registered_seeds"]) & (
        table["n_seeds_y"] == table["registered_seeds"]
    )
    columns = ["task", "comparison", "x", "y", "n_seeds_x", "n_seeds_y", "registered_seeds", "n_problems", "x_pct"]
    columns += ["y_pct", "mean_pp", "seed_low_pp", "seed_high_pp", "cond_low_pp", "cond_high_pp", "perm_p"]
    columns += ["perm_method", "holm_p", "rejected", "complete"]
    return table.reindex(columns=columns)


def seed_test_scores(runs: pd.DataFrame, tests: pd.DataFrame, registered: dict) -> pd.DataFrame:
    """Test accuracy (%) of every compared recipe's registered, tested seeds: one row per run
    (task, arm, seed, test_pct), recipes in the order the registered comparisons name them."""
    runs = runs[runs["phase"] == "confirmation"]
    recipes = dict.fromkeys((c["task"], arm) for c in registered["comparisons"] for arm in (c["x"], c["y"]))
    rows = []
    for task, arm in recipes:
        seeds = _seeds_used(_tested(runs, tests, task, arm), registered["seeds"][task], None)
        if seeds:
            scores, _ = _scores(runs, tests, task, arm, seeds)  # [seeds, problems]
            rows += [(task, arm, s, 100 * v) for s, v in zip(seeds, scores.mean(axis=1))]
    return pd.DataFrame(rows, columns=["task", "arm", "seed", "test_pct"])


def format_preregistered(table: pd.DataFrame, registered: dict) -> pd.DataFrame:
    """Display strings of :func:`preregistered_comparisons` rows."""
    level = f"{100 * registered['confidence']:g}%"

    def interval(lo: float, hi: float, missing: str) -> str:
        return missing if np.isnan(lo) else f"[{lo:+.2f}, {hi:+.2f}]"

    def number(v: float, spec: str) -> str:
        return "n/a" if np.isnan(v) else format(v, spec)

    return pd.DataFrame(
        {
            "Comparison": table["comparison"],
            "x versus y": [f"{t}: {x} versus {y}" for t, x, y in zip(table["task"], table["x"], table["y"])],
            "Seeds x / y": [f"{a} / {b}" for a, b in zip(table["n_seeds_x"], table["n_seeds_y"])],
            "Problems": table["n_problems"].map(lambda v: number(v, ".0f")),
            "x %": table["x_pct"].map(lambda v: number(v, ".1f")),
            "y %": table["y_pct"].map(lambda v: number(v, ".1f")),
            "Difference pp": table["mean_pp"].map(lambda v: number(v, "+.2f")),
            f"Seed-level {level}": [
                interval(lo, hi, "n/a") for lo, hi in zip(table["seed_low_pp"], table["seed_high_pp"])
            ],
            f"Conditional {level}": [
                interval(lo, hi, "n/a" if np.isnan(p) else "n/a (seeds not paired)")
                for lo, hi, p in zip(table["cond_low_pp"], table["cond_high_pp"], table["perm_p"])
            ],
            "Permutation p": [
                "n/a" if np.isnan(p) else f"{p:.4f} ({m})" for p, m in zip(table["perm_p"], table["perm_method"])
            ],
            "Holm p": table["holm_p"].map(lambda v: f"{v:.4f}"),
            f"Holm p <= {registered['alpha']:g}": table["rejected"].map({True: "yes", False: "no"}),
        }
    )


def decision_lines(table: pd.DataFrame, registered: dict) -> list[str]:
    """One sentence per comparison: the difference, its seed-level interval and sample sizes, and
    what Holm's adjusted p says at the registered alpha."""
    level, alpha = f"{100 * registered['confidence']:g}%", registered["alpha"]
    lines = []
    for r in table.itertuples(index=False):
        head = f"{r.comparison} ({r.task}): {r.x} - {r.y}"
        if np.isnan(r.perm_p):
            lines.append(f"{head}: no terminal test rows yet; counted as p = 1 in Holm's adjustment")
            continue
        verdict = (
            f"the recipes differ at family-wise alpha {alpha:g}"
            if r.rejected
            else f"no difference shown at family-wise alpha {alpha:g}"
        )
        scope = "" if r.complete else f" PREVIEW: {min(r.n_seeds_x, r.n_seeds_y)} of {r.registered_seeds} seeds;"
        lines.append(
            f"{head} = {r.mean_pp:+.2f} pp, seed-level {level} [{r.seed_low_pp:+.2f}, {r.seed_high_pp:+.2f}] "
            f"(seeds {r.n_seeds_x} / {r.n_seeds_y}, {int(r.n_problems):,} problems); permutation p {r.perm_p:.4f}, "
            f"Holm p {r.holm_p:.4f}:{scope} {verdict}"
        )
    return lines


def code_versions_note(runs: pd.DataFrame) -> str:
    """How many library sources, git commits and modes the runs came from (one line)."""
    sources = runs.get("source_sha256", pd.Series(dtype=object)).fillna("unrecorded")
    commits = runs.get("git_commit", pd.Series(dtype=object)).fillna("unrecorded")
    det = runs.get("deterministic", pd.Series(dtype=object))
    modes = {True: "deterministic", False: "default mode"}
    mode = ", ".join(sorted({modes.get(v, "unrecorded mode") for v in det})) or "unrecorded mode"
    line = (
        f"{len(runs)} runs from {sources.nunique()} library source(s) "
        f"({', '.join(sorted(s[:12] for s in sources.unique()))}) and {commits.nunique()} git commit(s); {mode}"
    )
    if sources.nunique() > 1:
        line += ": more than one code version, so recipe differences may mix with code differences"
    return line


# ---------------------------------------------------------------------------------------
# Rerun versus seed variance
# ---------------------------------------------------------------------------------------
def rerun_groups(study_dir: str | Path) -> dict[str, list[str]]:
    """Runs of ``study_dir`` grouped by everything but their name and seed (config and library source):
    within a group, runs of one seed are reruns. Keys describe the group (task, shape, mode)."""
    groups: dict[str, list[str]] = {}
    for path in sorted(Path(study_dir).glob("*/config.json")):
        meta = json.loads(path.read_text())
        cfg = meta.get("config") or {}
        if "num_steps_per_rollout" not in cfg:  # a test job's record (initial-<task>), not a training run
            continue
        key = json.dumps(
            {k: v for k, v in cfg.items() if k not in _NAMING_FIELDS} | {"source": meta.get("source_sha256")},
            sort_keys=True,
        )
        groups.setdefault(key, []).append(meta["run_id"])
    named = {}
    for key, run_ids in groups.items():
        cfg = json.loads(key)
        shape = "/".join(str(cfg[k]) for k in ("rollout_batch_size", "n_samples_per_prompt", "global_batch_size"))
        mode = "deterministic" if cfg.get("deterministic") else "default mode"
        label = (
            f"{cfg['task']} P/G/B={shape} S={cfg['num_steps_per_rollout']} lr {cfg.get('lr', 0):g}, {mode}, "
            f"source {str(cfg['source'])[:12]}"
        )
        # Groups may differ in a field the label leaves out: number them apart.
        label += f" ({sum(k.startswith(label) for k in named) + 1})" if label in named else ""
        named[label] = run_ids
    return named


def rerun_matrix(runs: pd.DataFrame, run_ids: Sequence[str], endpoint: str) -> tuple[np.ndarray, list[int]]:
    """[seeds, reruns] of ``endpoint`` (a ``runs`` column, in percent), NaN-padded, and the seeds (rows)."""
    chosen = runs[runs["run_id"].isin(run_ids)]
    by_seed = {int(s): 100 * g[endpoint].to_numpy(dtype=float) for s, g in chosen.groupby("seed")}
    width = max((len(v) for v in by_seed.values()), default=0)
    matrix = np.full((len(by_seed), width), np.nan)  # [seeds, reruns]
    for i, values in enumerate(by_seed.values()):
        matrix[i, : len(values)] = values
    return matrix, list(by_seed)


def variance_split_table(runs: pd.DataFrame, groups: dict[str, list[str]]) -> tuple[pd.DataFrame, list[str]]:
    """:func:`stats.rerun_seed_variance` per group of :func:`rerun_groups`, on test accuracy where every
    run of the group has it, else final validation accuracy; SDs in percentage points. A group with a
    rerun but fewer than two seeds gets a note instead of a row; groups without any rerun, one line."""
    rows, notes, unrepeated = [], [], 0
    for label, run_ids in groups.items():
        chosen = runs[runs["run_id"].isin(run_ids)]
        if chosen.empty:
            continue
        if chosen["seed"].is_unique:  # no seed ran twice: nothing to split
            unrepeated += 1
            continue
        endpoint = (
            "test_accuracy" if chosen.get("test_accuracy", pd.Series([np.nan])).notna().all() else "final_accuracy"
        )
        matrix, seeds = rerun_matrix(runs, run_ids, endpoint)
        try:
            split = stats.rerun_seed_variance(matrix)
        except ValueError as exc:
            notes.append(f"{label}: {len(chosen)} runs of seeds {_span(seeds)}; {exc}")
            continue
        rows.append(
            {
                "group": label,
                "endpoint": "test %" if endpoint == "test_accuracy" else "validation % (final)",
                "seeds": len(seeds),
                "runs": split.n_runs,
                "rerun_df": split.rerun_df,
                "rerun_sd_pp": float(np.sqrt(split.rerun_variance)),
                "seed_sd_pp": float(np.sqrt(split.seed_variance)),
                "seed_variance_raw": split.seed_variance_raw,
                "seed_share": split.seed_share,
            }
        )
    if unrepeated:
        notes.append(
            f"{unrepeated} group(s) of runs ran no seed twice (a deterministic rerun repeats its run bit for bit, "
            "docs/determinism.md); no split for them"
        )
    return pd.DataFrame(rows), notes


def variance_split_of_folders(folders: Sequence[str | Path]) -> tuple[pd.DataFrame, list[str]]:
    """:func:`variance_split_table` for the runs of each folder (a study, or a folder of benchmark runs),
    with a ``source`` column; folders that do not exist or hold no complete run get a note."""
    from grpo_knobs.analysis.loading import load_study

    tables, notes = [], []
    for folder in map(Path, folders):
        if not folder.is_dir():
            notes.append(f"{folder}: no such folder")
            continue
        try:
            runs = load_study(folder).runs
        except ValueError as exc:
            notes.append(f"{folder}: {exc}")
            continue
        table, more = variance_split_table(runs, rerun_groups(folder))
        if len(table):
            tables.append(table.assign(source=folder.name))
        notes += [f"{folder.name}: {n}" for n in more]
    table = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    return table, notes

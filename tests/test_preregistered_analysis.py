"""The registered analysis of a many-seed study (grpo_knobs.analysis.preregistered, notebook 59) on
synthetic test scores with planted differences: the seeds20 comparisons at 20 seeds, Holm across
them, the preview a study with fewer seeds gets, and the rerun-versus-seed variance split."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from grpo_knobs import analysis as an
from grpo_knobs import stats, study

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_analysis import STUDY_DIR, _run_notebook_inprocess

# Test accuracy each recipe is drawn around: batch-256 clearly above the other 2x10 recipes, the rest alike.
PLANTED = {
    ("countdown-2x10", "onpolicy-small"): 0.40,
    ("countdown-2x10", "batch-256"): 0.60,
    ("countdown-2x10", "split-8"): 0.41,
    ("countdown-2x99", "batch-256"): 0.45,
    ("countdown-2x99", "group-32"): 0.45,
}
N_PROBLEMS = 100


@pytest.fixture(scope="module")
def registered() -> dict:
    """The seeds20 preset's registered analysis, with fewer resamples and relabellings to stay fast."""
    reg = study.plan("seeds20").preregistration.to_json()
    return reg | {"resamples": 1_000, "relabellings": 2_000}


def _frames(seeds: dict[tuple[str, str], list[int]], rng_seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``runs`` and ``tests`` frames: every (task, arm) run once per seed, graded 0/1 on the task's problems
    with a per-seed offset (sd 0.04) around its planted accuracy."""
    rng = np.random.default_rng(rng_seed)
    runs, tests = [], []
    for (task, arm), wanted in seeds.items():
        for seed in wanted:
            run_id = f"confirmation-{task}-{arm}-s{seed}"
            p = np.clip(PLANTED[task, arm] + 0.04 * rng.standard_normal(), 0, 1)
            correct = (rng.random(N_PROBLEMS) < p).astype(float)  # [problems]
            runs.append({"run_id": run_id, "task": task, "phase": "confirmation", "arm": arm, "seed": seed})
            tests += [
                {"run_id": run_id, "problem_id": f"{task}-test-{i:04d}", "correct": c} for i, c in enumerate(correct)
            ]
    return pd.DataFrame(runs), pd.DataFrame(tests)


def _twenty() -> dict[tuple[str, str], list[int]]:
    return {key: list(range(1, 21)) for key in PLANTED}


def _arrays(runs, tests, task, arm, seeds):
    chosen = runs[(runs["task"] == task) & (runs["arm"] == arm) & runs["seed"].isin(seeds)].assign(label=arm)
    return an.recipe_test_scores(tests, chosen, arm, task)[0]  # [seeds, problems]


def test_twenty_seeds_per_recipe_give_the_registered_table(registered):
    runs, tests = _frames(_twenty())
    table = an.preregistered_comparisons(runs, tests, registered)
    assert list(table["comparison"]) == [c["name"] for c in registered["comparisons"]]
    assert table["complete"].all() and not an.coverage_notes(runs, tests, registered)
    assert (table[["n_seeds_x", "n_seeds_y", "registered_seeds"]] == 20).all().all()
    assert (table["n_problems"] == N_PROBLEMS).all()
    assert (table["perm_method"] == "sampled, 2,000").all()  # 20 v 20 seeds: 1.4e11 relabellings
    first = table.iloc[0]  # batch-256 versus onpolicy-small on countdown-2x10
    a = _arrays(runs, tests, "countdown-2x10", "batch-256", range(1, 21))
    b = _arrays(runs, tests, "countdown-2x10", "onpolicy-small", range(1, 21))
    boot = stats.hierarchical_bootstrap(a, b, 1_000, 0, 0.95)
    cond = stats.paired_bootstrap(a, b, 1_000, 0, 0.95)
    assert (first["mean_pp"], first["seed_low_pp"], first["seed_high_pp"]) == (
        boot.mean_diff_pp,
        boot.ci_low_pp,
        boot.ci_high_pp,
    )
    assert (first["cond_low_pp"], first["cond_high_pp"]) == (cond.ci_low_pp, cond.ci_high_pp)
    assert first["x_pct"] == pytest.approx(100 * a.mean()) and first["y_pct"] == pytest.approx(100 * b.mean())
    # Every batch-256 seed beats every baseline seed: no sampled relabelling is as extreme.
    assert first["perm_p"] == 1 / 2_001
    np.testing.assert_allclose(table["holm_p"], stats.holm_adjust(table["perm_p"]))
    assert list(table["rejected"]) == [True, False, True, False]  # batch-256 above both others, as planted
    assert first["holm_p"] == pytest.approx(4 / 2_001)
    lines = an.decision_lines(table, registered)
    assert lines[0].startswith("2x10-batch-256-vs-onpolicy-small (countdown-2x10): batch-256 - onpolicy-small = +")
    assert "(seeds 20 / 20, 100 problems)" in lines[0] and lines[0].endswith(
        "the recipes differ at family-wise alpha 0.05"
    )
    assert lines[1].endswith("no difference shown at family-wise alpha 0.05") and "PREVIEW" not in "".join(lines)
    shown = an.format_preregistered(table, registered)
    assert list(shown.columns) == [
        "Comparison",
        "x versus y",
        "Seeds x / y",
        "Problems",
        "x %",
        "y %",
        "Difference pp",
        "Seed-level 95%",
        "Conditional 95%",
        "Permutation p",
        "Holm p",
        "Holm p <= 0.05",
    ]
    assert shown["Permutation p"].iloc[0] == "0.0005 (sampled, 2,000)" and shown["Holm p <= 0.05"].iloc[0] == "yes"


def test_each_recipes_first_seeds_are_listed_exactly(registered):
    runs, tests = _frames(_twenty())
    early = an.preregistered_comparisons(runs, tests, registered, first_seeds=5)
    assert (early["perm_method"] == "exact, 252").all() and early["complete"].all()
    a = _arrays(runs, tests, "countdown-2x10", "batch-256", range(1, 6))
    b = _arrays(runs, tests, "countdown-2x10", "onpolicy-small", range(1, 6))
    assert early["perm_p"].iloc[0] == stats.seed_permutation_test(a, b, "two-sided").p_value
    full = an.preregistered_comparisons(runs, tests, registered)
    width = lambda t: (t["seed_high_pp"] - t["seed_low_pp"]).iloc[0]  # noqa: E731
    assert width(full) < width(early)  # twenty seeds narrow the seed-level interval


def test_fewer_seeds_than_registered_give_a_marked_preview(registered):
    seeds = _twenty() | {("countdown-2x10", "split-8"): [1, 2, 3], ("countdown-2x99", "group-32"): []}
    seeds[("countdown-2x10", "onpolicy-small")] = list(range(1, 22))  # seed 21 is not registered
    runs, tests = _frames(seeds)
    notes = an.coverage_notes(runs, tests, registered)
    assert notes == [
        "countdown-2x10 onpolicy-small: seeds 21 are not registered and are left out",
        "countdown-2x10 split-8: 3 of 20 registered seeds tested (missing: 4-20); its comparisons are a preview, "
        "not the registered analysis",
        "countdown-2x99 group-32: 0 of 20 registered seeds tested (missing: 1-20); its comparisons are a preview, "
        "not the registered analysis",
    ]
    table = an.preregistered_comparisons(runs, tests, registered)
    assert list(table["n_seeds_x"]) == [20, 3, 20, 0] and list(table["n_seeds_y"]) == [20, 20, 3, 20]
    assert list(table["complete"]) == [True, False, False, False]
    assert np.isnan(table["cond_low_pp"].iloc[1]) and np.isnan(table["perm_p"].iloc[3])  # unpaired; untested
    # The untested comparison still counts in the family, as p = 1.
    expected = stats.holm_adjust([*table["perm_p"].iloc[:3], 1.0])
    np.testing.assert_allclose(table["holm_p"], expected)
    lines = an.decision_lines(table, registered)
    assert "PREVIEW: 3 of 20 seeds;" in lines[1] and "PREVIEW" not in lines[0]
    assert lines[3].endswith("no terminal test rows yet; counted as p = 1 in Holm's adjustment")
    shown = an.format_preregistered(table, registered)
    assert list(shown["Conditional 95%"].iloc[1:]) == ["n/a (seeds not paired)", "n/a (seeds not paired)", "n/a"]


def test_seed_level_comparisons_of_notebook_51_take_twenty_seeds():
    runs, tests = _frames(_twenty())
    runs = runs.assign(label=runs["arm"])
    table = an.seed_level_comparisons(runs, tests, "countdown-2x10", [("batch-256", "onpolicy-small")], 500)
    assert table["n_relabellings"].iloc[0] == 100_000 and table["perm_p_greater"].iloc[0] == 1 / 100_001


# --- rerun versus seed variance ------------------------------------------------------------
def test_variance_split_table_of_the_committed_default_mode_reruns():
    runs = pd.DataFrame(
        {
            "run_id": ["default-s1", "default-s1-rerun1", "default-s1-rerun2", "default-s2", "det-s1", "det-s2"],
            "seed": [1, 1, 1, 2, 1, 2],
            "final_accuracy": [0.40, 0.26, 0.30, 0.24, 0.42, 0.26],
        }
    )
    groups = {"default": runs["run_id"][:4].tolist(), "deterministic": ["det-s1", "det-s2"]}
    table, notes = an.variance_split_table(runs, groups)
    (row,) = table.to_dict("records")
    assert (row["group"], row["endpoint"], row["seeds"], row["runs"], row["rerun_df"]) == (
        "default",
        "validation % (final)",
        2,
        4,
        2,
    )
    assert row["rerun_sd_pp"] == pytest.approx(np.sqrt(52)) and row["seed_variance_raw"] == pytest.approx(-8 / 3)
    assert row["seed_sd_pp"] == 0.0 and row["seed_share"] == 0.0
    assert notes == [
        "1 group(s) of runs ran no seed twice (a deterministic rerun repeats its run bit for bit, "
        "docs/determinism.md); no split for them"
    ]
    matrix, seeds = an.rerun_matrix(runs, groups["default"], "final_accuracy")
    np.testing.assert_allclose(matrix, [[40, 26, 30], [24, np.nan, np.nan]])
    assert seeds == [1, 2]


def _config(folder: Path, run_id: str, seed: int, source: str = "a" * 64, **config) -> None:
    (folder / run_id).mkdir(parents=True)
    cfg = {"task": "countdown-2x10", "rollout_batch_size": 64, "n_samples_per_prompt": 8, "global_batch_size": 256}
    cfg |= {"num_steps_per_rollout": 2, "lr": 2e-5, "deterministic": False, "arm": "custom"} | config
    meta = {"run_id": run_id, "source_sha256": source, "config": cfg | {"run_id": run_id, "seed": seed}}
    (folder / run_id / "config.json").write_text(json.dumps(meta | {"study": "x"}))


def test_reruns_are_runs_alike_but_for_name_and_seed(tmp_path):
    _config(tmp_path, "s1", 1)
    _config(tmp_path, "s1-again", 1, output_dir="/elsewhere", arm="other-name")
    _config(tmp_path, "s2", 2)
    _config(tmp_path, "det-s1", 1, deterministic=True)
    _config(tmp_path, "s1-new-code", 1, source="b" * 64)
    _config(tmp_path, "s1-lr", 1, lr=1e-5)
    (tmp_path / "initial-countdown-2x10").mkdir()  # a test job's folder: not a run
    (tmp_path / "initial-countdown-2x10" / "config.json").write_text(json.dumps({"run_id": "initial"}))
    groups = an.rerun_groups(tmp_path)
    assert sorted(map(sorted, groups.values())) == [["det-s1"], ["s1", "s1-again", "s2"], ["s1-lr"], ["s1-new-code"]]
    label = next(k for k, v in groups.items() if "s2" in v)
    assert label == "countdown-2x10 P/G/B=64/8/256 S=2 lr 2e-05, default mode, source aaaaaaaaaaaa"


# --- notebook 59 on a study directory ------------------------------------------------------
def _study_dir(root: Path, seeds: list[int], registered: dict) -> Path:
    """Copies of one synthetic fixture run per (arm, seed) of two recipes on "countdown", their test rows
    graded around the planted accuracies, and a plan.json that registers one comparison."""
    source = STUDY_DIR / "countdown-confirmation-onpolicy-small-s1"
    rng = np.random.default_rng(1)
    shapes = {"onpolicy-small": (16, 8, 128, 1), "batch-256": (64, 8, 256, 2)}  # P, G, B, S
    for arm, p in (("onpolicy-small", 0.40), ("batch-256", 0.60)):
        knobs = dict(
            zip(
                ("rollout_batch_size", "n_samples_per_prompt", "global_batch_size", "num_steps_per_rollout"),
                shapes[arm],
            )
        )
        for seed in seeds:
            run_id = f"countdown-confirmation-{arm}-s{seed}"
            dest = root / run_id
            shutil.copytree(source, dest)
            meta = json.loads((dest / "config.json").read_text())
            meta["run_id"] = run_id
            meta["config"] |= {"run_id": run_id, "arm": arm, "seed": seed, "recipe": ""} | knobs
            (dest / "config.json").write_text(json.dumps(meta))
            for name in ("evals.parquet", "test.parquet"):
                frame = pd.read_parquet(dest / name).assign(run_id=run_id)
                if name == "test.parquet":
                    frame["correct"] = (rng.random(len(frame)) < p).astype(float)
                frame.to_parquet(dest / name)
    reg = registered | {
        "comparisons": [{"name": "b-vs-a", "task": "countdown", "x": "batch-256", "y": "onpolicy-small"}],
        "seeds": {"countdown": list(range(1, 21))},
        "test_problems": {"countdown": None},
    }
    (root / "plan.json").write_text(json.dumps({"name": root.name, "preregistration": reg}))
    return root


def test_notebook_59_renders_the_registered_tables_and_degrades(tmp_path, monkeypatch, capsys, registered):
    monkeypatch.chdir(tmp_path)
    reruns = tmp_path / "reruns"
    for run_id, seed in (("s1", 1), ("s1-again", 1), ("s2", 2)):
        shutil.copytree(STUDY_DIR / "countdown-confirmation-onpolicy-small-s1", reruns / run_id)
        meta = json.loads((reruns / run_id / "config.json").read_text())
        meta["config"] |= {"run_id": run_id, "seed": seed}
        (reruns / run_id / "config.json").write_text(json.dumps(meta | {"run_id": run_id}))
        for name in ("evals.parquet", "test.parquet"):
            pd.read_parquet(reruns / run_id / name).assign(run_id=run_id).to_parquet(reruns / run_id / name)
    full = _study_dir(tmp_path / "full", list(range(1, 21)), registered)
    params = {"out_dir": str(tmp_path / "figs"), "preset": None, "reruns_dirs": [str(reruns)], "first_seeds": 5}
    _run_notebook_inprocess("59_preregistered", study_dir=str(full), **params)
    printed = capsys.readouterr().out
    assert (
        "b-vs-a (countdown): batch-256 - onpolicy-small = +" in printed and "(seeds 20 / 20, 96 problems)" in printed
    )
    assert "PREVIEW" not in printed and "each recipe's first 5 registered seeds" in printed
    written = pd.read_csv(tmp_path / "figs" / "preregistered_comparisons.csv")
    assert written[["comparison", "n_seeds_x", "rejected", "complete"]].values.tolist() == [["b-vs-a", 20, True, True]]
    assert (
        (tmp_path / "figs" / "preregistered_comparisons_first5.md")
        .read_text()
        .startswith("**SYNTHETIC DATA (test fixture, not training results)**")
    )
    # The three reruns folder runs are alike but for name and seed: seed 1 twice, with identical records.
    split = pd.read_csv(tmp_path / "figs" / "rerun_seed_variance.csv")
    assert split[["seeds", "runs", "rerun_df", "rerun_sd_pp", "source"]].values.tolist() == [[2, 3, 1, 0.0, "reruns"]]

    few = _study_dir(tmp_path / "few", [1, 2, 3], registered)
    _run_notebook_inprocess("59_preregistered", study_dir=str(few), **params)
    printed = capsys.readouterr().out
    assert "countdown batch-256: 3 of 20 registered seeds tested (missing: 4-20)" in printed
    assert "PREVIEW: 3 of 20 seeds;" in printed

    _run_notebook_inprocess("59_preregistered", study_dir=str(tmp_path / "none"), **params)
    assert "no study records at" in capsys.readouterr().out
    unregistered = tmp_path / "unregistered"
    shutil.copytree(few, unregistered)
    (unregistered / "plan.json").unlink()
    _run_notebook_inprocess("59_preregistered", study_dir=str(unregistered), **params)
    assert "unregistered registered no analysis (no preregistration in its plan.json)" in capsys.readouterr().out

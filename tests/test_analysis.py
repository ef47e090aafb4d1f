"""Tests for grpo_knobs.analysis and grpo_knobs.plots on the committed synthetic
study, on hand-made frames, and on the study's published endpoints."""

from __future__ import annotations

import dataclasses
import filecmp
import importlib.util
import io
import json
import shutil
import sys
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from grpo_knobs import analysis as an
from grpo_knobs import locations, plots
from grpo_knobs.study.notebooks import ANALYSIS_NOTEBOOKS

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
STUDY_DIR = FIXTURES / "synthetic_study"
BENCHMARK = FIXTURES / "rollout-synthetic.json"
NOTEBOOKS = ROOT / "lib" / "grpo_knobs" / "notebooks"
REFERENCE = ROOT / "lib" / "grpo_knobs" / "datasets" / "reference" / "study_endpoints.csv"


@pytest.fixture(scope="module")
def study() -> an.Study:
    return an.load_study(STUDY_DIR)


@pytest.fixture(scope="module")
def reference() -> pd.DataFrame:
    return an.load_reference(REFERENCE)


def _runs(study: an.Study, task: str, phase: str = "confirmation") -> pd.DataFrame:
    return study.runs[(study.runs["task"] == task) & (study.runs["phase"] == phase)]


# --- the fixture itself -----------------------------------------------------
def test_committed_fixture_matches_its_generator(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("make_synthetic_study", FIXTURES / "make_synthetic_study.py")
    gen = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, gen)  # dataclasses look their module up
    spec.loader.exec_module(gen)
    gen.main(tmp_path / "study", tmp_path / "bench.json")
    fresh = sorted(p.relative_to(tmp_path / "study") for p in (tmp_path / "study").rglob("*") if p.is_file())
    committed = sorted(p.relative_to(STUDY_DIR) for p in STUDY_DIR.rglob("*") if p.is_file())
    assert fresh == committed
    for rel in fresh:
        a, b = tmp_path / "study" / rel, STUDY_DIR / rel
        if rel.suffix == ".parquet":
            pd.testing.assert_frame_equal(pd.read_parquet(a), pd.read_parquet(b))
        else:
            assert filecmp.cmp(a, b, shallow=False), rel
    assert json.loads((tmp_path / "bench.json").read_text()) == json.loads(BENCHMARK.read_text())
    assert sum(p.stat().st_size for p in STUDY_DIR.rglob("*") if p.is_file()) < 1_000_000


# --- loading ----------------------------------------------------------------
def test_load_study_keeps_complete_runs_and_lists_skipped(study):
    assert len(study.runs) == 18 + 1 + 18
    assert study.skipped.to_dict("records") == [
        {"run_id": "gsm8k-screening-onpolicy-large-sqrt-s0", "status": "running"}
    ]
    assert (study.runs["status"] == "complete").all()
    assert study.tasks == ["gsm8k", "countdown"]
    assert study.synthetic
    assert "skipped gsm8k-screening-onpolicy-large-sqrt-s0 (status running)" in study.describe()
    assert study.selection["recipes"]["countdown"] == ["onpolicy-small", "onpolicy-large", "group-4"]
    assert sorted(study.audits) == ["countdown", "gsm8k"]


def test_load_study_schema(study):
    runs = study.runs
    for col in (
        "run_id",
        "task",
        "phase",
        "arm",
        "label",
        "seed",
        "lr",
        *an.SHAPE_COLUMNS,
        "generation_seconds",
        "trainer_seconds",
        "sync_seconds",
        "active_phase_seconds",
        "job_seconds",
        "output_tokens",
        "final_accuracy",
        "initial_accuracy",
        "sample_auc",
        "test_accuracy",
    ):
        assert col in runs.columns, col
    assert runs["run_id"].is_unique
    np.testing.assert_allclose(
        runs["active_phase_seconds"], runs[["generation_seconds", "trainer_seconds", "sync_seconds"]].sum(axis=1)
    )
    assert set(study.evals.columns) >= set(an.EVAL_COLUMNS)
    assert (study.evals["split"] == "val").all() and (study.tests["split"] == "test").all()
    assert set(study.tests["run_id"]) == set(runs.loc[runs["phase"] == "confirmation", "run_id"])
    assert sorted(study.initial_tests["task"].unique()) == ["countdown", "gsm8k"]
    assert {"generation_seconds", "clip_fraction_mean"} <= set(study.collections.columns)
    assert (study.curves["n_problems"] == 64).all()


def test_load_study_labels_use_recipe_names_then_arms(study):
    conf = _runs(study, "gsm8k")
    assert set(conf["label"]) == {"Small one-update baseline", "Large one-update batch", "Two updates, retuned LR"}
    assert set(_runs(study, "gsm8k", "screening")["label"]) == set(_runs(study, "gsm8k", "screening")["arm"])


def test_load_study_can_include_unfinished_runs(study):
    with_running = an.load_study(STUDY_DIR, statuses=("complete", "running"))
    row = with_running.runs.set_index("run_id").loc["gsm8k-screening-onpolicy-large-sqrt-s0"]
    assert row["status"] == "running" and row["collections_done"] == 5 and row["responses"] == 2560
    assert with_running.skipped.empty


def _copy_run(tmp_path: Path, run: str) -> Path:
    shutil.copytree(STUDY_DIR / run, tmp_path / run)
    return tmp_path / run


def test_load_study_rejects_missing_columns(tmp_path):
    run = _copy_run(tmp_path, "gsm8k-screening-split-4-s0")
    evals = pd.read_parquet(run / "evals.parquet").drop(columns=["correct_strict"])
    evals.to_parquet(run / "evals.parquet")
    with pytest.raises(ValueError, match=r"evals.parquet lacks columns \['correct_strict'\]"):
        an.load_study(tmp_path)


def test_load_study_without_complete_runs_says_so(tmp_path):
    _copy_run(tmp_path, "gsm8k-screening-onpolicy-large-sqrt-s0")
    with pytest.raises(ValueError, match="no runs with status"):
        an.load_study(tmp_path)


def test_load_study_lists_folders_without_config(tmp_path):
    _copy_run(tmp_path, "gsm8k-screening-split-4-s0")
    (tmp_path / "gsm8k-screening-split-2-s0").mkdir()  # failed before writing its config
    (tmp_path / ".lock").mkdir()  # hidden folders are not runs
    loaded = an.load_study(tmp_path)
    assert loaded.runs["run_id"].tolist() == ["gsm8k-screening-split-4-s0"]
    assert loaded.skipped.to_dict("records") == [{"run_id": "gsm8k-screening-split-2-s0", "status": "no config.json"}]


# --- curves -----------------------------------------------------------------
def _evals(run_id: str, points: dict[int, list[float]]) -> pd.DataFrame:
    rows = []
    for responses, correct in points.items():
        for j, c in enumerate(correct):
            rows.append(
                {
                    "run_id": run_id,
                    "split": "val",
                    "collections": responses // 128,
                    "updates": responses // 128,
                    "responses": responses,
                    "output_tokens": 10 * responses,
                    "active_seconds": responses / 100,
                    "job_seconds": 5 + responses / 50,
                    "problem_id": f"p{j}",
                    "correct": c,
                    "correct_strict": 0.0,
                    "response_length": 10 * (j + 1),
                    "truncated": j == 3,
                }
            )
    return pd.DataFrame(rows)


def test_eval_curves_per_point():
    curves = an.eval_curves(_evals("r", {0: [0, 0, 1, 0], 4096: [1, 1, 1, 0]}))
    assert curves["accuracy"].tolist() == [0.25, 0.75]
    assert curves["truncation_fraction"].tolist() == [0.25, 0.25]
    assert curves["response_length_mean"].tolist() == [25.0, 25.0]
    assert curves["job_seconds"].tolist() == [5.0, 5 + 4096 / 50]


def test_summarize_curves_seed_mean_and_range():
    evals = pd.concat([_evals("a1", {0: [0, 0], 128: [1, 0]}), _evals("a2", {0: [0, 1], 128: [1, 1]})])
    runs = pd.DataFrame({"run_id": ["a1", "a2"], "task": "t", "label": "A", "seed": [1, 2]})
    s = an.summarize_curves(an.eval_curves(evals), runs, "active_seconds")
    assert s["accuracy_mean_pct"].tolist() == [25.0, 75.0]
    assert s["accuracy_min_pct"].tolist() == [0.0, 50.0]
    assert s["accuracy_max_pct"].tolist() == [50.0, 100.0]
    assert s["x"].tolist() == [0.0, 1.28]


def test_curve_endpoints_on_fixture(study):
    conf = _runs(study, "countdown")
    labels = an.recipe_order(conf, "countdown", study.selection)
    table = an.curve_endpoint_table(an.summarize_curves(study.curves, conf), labels)
    assert table["recipe"].tolist() == labels
    base = table.iloc[0]  # seed 1 collapsed to 0 of 64; seeds 2, 3 end at 8 and 10 of 64
    assert (base["accuracy_min_pct"], base["accuracy_max_pct"]) == (0.0, 100 * 10 / 64)
    assert base["accuracy_mean_pct"] == pytest.approx(100 * 18 / 64 / 3)


# --- confirmation tables ----------------------------------------------------
def _hand_runs() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "run_id": ["b1", "b2", "l1"],
            "task": "t",
            "label": ["Base", "Base", "Large"],
            "seed": [1, 2, 1],
            "final_accuracy": [0.5, 0.6, 0.7],
            "test_accuracy": [0.4, 0.5, 0.6],
            "generation_seconds": [600.0, 720.0, 300.0],
            "trainer_seconds": [120.0, 120.0, 60.0],
            "sync_seconds": [6.0, 6.0, 3.0],
            "active_phase_seconds": [726.0, 846.0, 363.0],
            "job_seconds": [900.0, 1020.0, 480.0],
            "output_tokens": [2_000_000, 3_000_000, 1_000_000],
            "test_response_length": [100.0, 110.0, 90.0],
            "test_truncation_fraction": [0.0, 0.01, 0.002],
        }
    )


def test_confirmation_run_table_units_and_order():
    t = an.confirmation_run_table(_hand_runs(), ["Large", "Base"])
    assert t["recipe"].tolist() == ["Large", "Base", "Base"]
    assert t.iloc[1][["val_pct", "test_pct", "phase_min", "job_min"]].tolist() == [50.0, 40.0, 12.1, 15.0]


def test_phase_cost_table_other_is_job_minus_phases():
    t = an.phase_cost_table(_hand_runs(), ["Base", "Large"]).set_index("recipe")
    assert t.loc["Base", "generate_min"] == pytest.approx(11.0)
    assert t.loc["Base", "trainer_min"] == pytest.approx(2.0)
    assert t.loc["Base", "sync_min"] == pytest.approx(0.1)
    assert t.loc["Base", "other_min"] == pytest.approx((174 + 174) / 2 / 60)
    assert t.loc["Base", "output_million_tokens"] == pytest.approx(2.5)
    assert t.loc["Large", "n_runs"] == 1


def test_truncation_range_per_task():
    rng = an.truncation_range(an.truncation_table(_hand_runs()))
    assert rng.iloc[0][["min", "max", "count"]].tolist() == [0.0, 1.0, 3]


def test_training_signals_average_collections_in_windows_of_the_largest_collection():
    def run(run_id, per_collection, rewards):
        n = len(rewards)
        return pd.DataFrame(
            {
                "run_id": run_id,
                "collection": range(n),
                "responses": per_collection * np.arange(1, n + 1),
                "reward_mean": rewards,
                "mixed_group_fraction": 0.5,
                "truncation_fraction": 0.0,
                "response_length_mean": np.arange(n, dtype=float),
            }
        )

    collections = pd.concat(
        [
            run("small-s1", 4, [0.0, 0.2, 0.4, 0.6]),
            run("small-s2", 4, [0.2, 0.2, 0.2, 0.2]),
            run("large-s1", 8, [0.1, 0.5]),
        ],
        ignore_index=True,
    )
    runs = pd.DataFrame(
        {"run_id": ["small-s1", "small-s2", "large-s1"], "task": "t", "label": ["small", "small", "large"]}
    )
    table = an.training_signals(collections, runs)
    reward = table[(table["signal"] == "reward_mean") & (table["label"] == "small")].sort_values("responses")
    assert reward["responses"].tolist() == [8, 16]  # windows of 8 responses: the large run's collection
    assert reward["mean"].tolist() == pytest.approx([15.0, 35.0])  # seeds 10 and 20, then 50 and 20
    assert reward["min"].tolist() == pytest.approx([10.0, 20.0]) and reward["max"].tolist() == pytest.approx(
        [20.0, 50.0]
    )
    assert (reward["n_seeds"] == 2).all()
    large = table[(table["signal"] == "reward_mean") & (table["label"] == "large")]
    assert large["mean"].tolist() == pytest.approx([10.0, 50.0])
    length = table[(table["signal"] == "response_length_mean") & (table["label"] == "small")]
    assert length["mean"].tolist() == pytest.approx([0.5, 2.5])  # tokens, unscaled
    # A seed that stopped early drops the windows it did not finish.
    partial = collections[~((collections["run_id"] == "small-s2") & (collections["collection"] >= 2))]
    reward = an.training_signals(partial, runs).query("signal == 'reward_mean' and label == 'small'")
    assert reward["responses"].tolist() == [8]


def test_paired_job_times_pair_seeds_by_number():
    runs = pd.DataFrame(
        {
            "task": "t",
            "label": ["big"] * 3 + ["small"] * 4,
            "seed": [1, 2, 3, 1, 2, 3, 4],
            "job_seconds": [60.0, 120.0, 90.0, 120.0, 100.0, 180.0, 999.0],
        }
    )
    table = an.paired_job_times(runs, "t", [("big", "small"), ("big", "absent")])
    assert len(table) == 1  # no common seed with "absent"; seed 4 has no partner
    row = table.iloc[0]
    assert row["comparison"] == "big versus small" and row["n_seeds"] == 3 and row["seeds_faster"] == 2
    assert row["x_job_min"] == pytest.approx(1.5) and row["y_job_min"] == pytest.approx(400 / 180)
    assert row["seed_reductions_pct"] == pytest.approx((50.0, -20.0, 50.0))
    assert row["reduction_pct"] == pytest.approx(100 * (1 - 270 / 400)) and row["ratio"] == pytest.approx(270 / 400)


def test_default_comparisons_follow_the_study_order():
    assert an.default_comparisons(["base", "x", "y"]) == [("x", "base"), ("y", "base"), ("y", "x")]


def test_paired_comparisons_on_fixture(study):
    conf = _runs(study, "gsm8k")
    labels = an.recipe_order(conf, "gsm8k", study.selection)
    comp = an.paired_comparisons(conf, study.tests, "gsm8k", an.default_comparisons(labels), n_resamples=2000)
    first = comp.iloc[0]
    assert first["comparison"] == "Large one-update batch versus Small one-update baseline"
    # Test counts (of 96): large 74, 74, 76 vs baseline 71, 72, 73.
    np.testing.assert_allclose(first["seed_diffs_pp"], [300 / 96, 200 / 96, 300 / 96])
    assert first["mean_pp"] == pytest.approx(800 / 96 / 3)
    assert first["ci_low_pp"] < first["mean_pp"] < first["ci_high_pp"]
    assert (first["n_seeds"], first["n_problems"]) == (3, 96)
    shown = an.format_comparisons(comp).iloc[0]
    assert shown["Mean pp"] == "+2.78" and shown["Seed differences pp"] == "+3.12, +2.08, +3.12"


def test_paired_comparisons_reject_unpaired_seeds(study):
    conf = _runs(study, "gsm8k")
    conf = conf[~((conf["label"] == "Large one-update batch") & (conf["seed"] == 3))]
    with pytest.raises(ValueError, match="different seeds"):
        an.paired_comparisons(conf, study.tests, "gsm8k", [("Large one-update batch", "Small one-update baseline")])


def test_recipe_test_scores_rejects_different_problem_sets(study):
    conf = _runs(study, "gsm8k")
    run = conf[conf["label"] == "Large one-update batch"]["run_id"].iloc[0]
    tests = study.tests[~((study.tests["run_id"] == run) & (study.tests["problem_id"] == "gsm8k-test-0005"))]
    with pytest.raises(ValueError, match="different test problems"):
        an.recipe_test_scores(tests, conf, "Large one-update batch", "gsm8k")


# --- time to target ---------------------------------------------------------
def test_time_to_target_table_on_fixture(study):
    table = an.time_to_target_table(study.curves, _runs(study, "gsm8k"), {"gsm8k": [88.59375]})
    by = table.set_index(["recipe", "seed"])
    large1 = by.loc[("Large one-update batch", 1)]
    assert (large1["responses_low"], large1["responses_high"]) == (2048, 3072)
    assert large1["responses_bracket"] == "(2,048, 3,072]"
    base = by.loc[("Small one-update baseline", 3)]
    assert not base["reached"] and base["censored_at"] == 8192 and np.isnan(base["responses_high"])
    assert base["job_seconds_bracket"] == "not reached by 8,192 responses"
    summary = an.time_to_target_summary(table).set_index("recipe")
    assert summary.loc["Large one-update batch", "reached"] == "3/3"
    assert summary.loc["Two updates, retuned LR", "responses"] == (
        "1/3 reached within (5,120, 6,144]; 2 not reached by 8,192 responses"
    )


# --- group size, audit, screening -------------------------------------------
def test_group_size_table_prompts_exposed(study):
    t = an.group_size_table(_runs(study, "gsm8k", "screening"))
    assert t["G"].tolist() == [4, 8, 16, 32]
    assert t["prompts_exposed"].tolist() == [1024, 512, 256, 128]
    assert (t["prompts_exposed"] == t["distinct_prompts"]).all()
    # Concavity: the measured fraction sits below the formula at the mean reward.
    assert (t["mixed_fraction"] <= t["formula_at_mean_reward"]).all()
    points = an.mixed_group_points(study.collections, _runs(study, "gsm8k", "screening"))
    assert points.groupby("arm").size().to_dict() == {"group-16": 8, "group-32": 8, "group-4": 8, "split-4": 8}


def test_reward_audit_summary_and_examples(study):
    s = an.reward_audit_summary(study.audits).set_index("task")
    assert s.loc["gsm8k", "strict_pct"] == pytest.approx(100 * 39 / 64)
    assert s.loc["gsm8k", "flexible_pct"] == pytest.approx(100 * 52 / 64)
    assert (s.loc["gsm8k", "flexible_only"], s.loc["gsm8k", "strict_only"]) == (13, 0)
    ex = an.reward_audit_examples(study.audits["gsm8k"], n=2, max_chars=30)
    assert ex["problem_id"].tolist() == ["gsm8k-val-0039", "gsm8k-val-0040"]
    assert ex["response_end"].str.startswith("...").all() and ex["response_end"].str.len().max() == 33


def test_initial_test_grading(study):
    t = an.initial_test_grading(study.initial_tests).set_index("task")
    assert t.loc["gsm8k", "flexible_pct"] == pytest.approx(100 * 70 / 96)
    assert t.loc["gsm8k", "strict_pct"] < t.loc["gsm8k", "flexible_pct"]
    assert t.loc["countdown", "strict_pct"] == t.loc["countdown", "flexible_pct"]


def test_screening_table_question_order(study):
    title, arms = an.SCREENING_QUESTIONS["collection_size"]
    t = an.screening_table(study.runs, arms)
    assert t["task"].tolist() == ["gsm8k"] * 4 + ["countdown"] * 4
    assert t["arm"].tolist()[:4] == list(arms)
    assert t["collection"].tolist()[:4] == [128, 256, 512, 1024]
    assert t.iloc[0]["val_pct"] == pytest.approx(100 * 58 / 64)


def test_reference_reproduces_the_published_phase_tables(reference):
    conf = reference[reference["phase"] == "confirmation"]
    g = an.phase_cost_table(conf[conf["task"] == "gsm8k"]).set_index("recipe").round(2)
    assert g.loc[
        "Small one-update baseline", ["generate_min", "trainer_min", "sync_min", "other_min", "output_million_tokens"]
    ].tolist() == [11.78, 7.68, 0.61, 5.50, 10.21]
    c = an.phase_cost_table(conf[conf["task"] == "countdown"]).set_index("recipe").round(2)
    assert c.loc[
        "Four answers, four updates", ["generate_min", "trainer_min", "sync_min", "other_min", "output_million_tokens"]
    ].tolist() == [6.56, 3.69, 0.19, 3.29, 0.61]
    runs = an.confirmation_run_table(conf[conf["task"] == "gsm8k"]).round(2)
    first = runs[(runs["recipe"] == "Small one-update baseline") & (runs["seed"] == 1)].iloc[0]
    assert first[["val_pct", "phase_min", "job_min"]].tolist() == [81.64, 18.17, 23.77]


def test_screening_table_adds_the_study_numbers(study, reference):
    _, arms = an.SCREENING_QUESTIONS["collection_size"]
    t = an.screening_table(study.runs, arms, reference).set_index(["task", "arm"]).round(2)
    assert t.loc[("gsm8k", "onpolicy-small"), ["study_val_pct", "study_job_min"]].tolist() == [86.52, 13.63]
    assert t.loc[("countdown", "split-4"), "study_job_min"] == 7.56


# --- critical batches -------------------------------------------------------
def test_critical_generation_batch_first_within_fraction_of_peak():
    assert an.critical_generation_batch([8, 1, 4, 2], [100, 10, 91, 50]) == 4
    assert an.critical_generation_batch([1, 2, 4, 8], [10, 50, 89, 100]) == 8
    assert an.critical_generation_batch([1, 2], [10, 50], fraction=0.1) == 1


def test_critical_training_batch_tolerance_and_censoring():
    assert an.critical_training_batch([128, 256, 512], [2048, 2048, 3072]) == 256
    assert an.critical_training_batch([128, 256, 512], [2048, 2048, 2457.6]) == 512
    assert an.critical_training_batch([128, 256, 512], [2048, np.nan, 2048]) == 512
    assert an.critical_training_batch([128, 256, 512], [2048, 2048, np.nan]) == 256
    assert an.critical_training_batch([128, 256], [np.nan, np.nan]) is None


def test_interpolate_throughput_log2_and_clamped():
    np.testing.assert_allclose(an.interpolate_throughput([128, 512], [100, 300], [64, 256, 1024]), [100, 200, 300])


def test_responses_to_target_and_prediction_on_fixture(study):
    bench = an.load_rollout_benchmark(BENCHMARK)
    screening = study.runs[study.runs["phase"] == "screening"]
    rt = an.responses_to_target(study.curves, screening, {"gsm8k": 88.59375})
    need = rt.set_index("arm")["responses_needed"]
    assert (need["onpolicy-small"], need["batch-256"], need["onpolicy-large"]) == (2048, 2048, 3072)
    assert np.isnan(need["split-2"])
    pred = an.predict_time_to_target(rt, screening, study.collections, bench["batch"], bench["fast_tokens_per_s"])
    assert set(pred["arm"]) == set(rt.loc[rt["reached"], "arm"])
    # The fixture's timings come from the same throughput curve, so predictions land close.
    assert pred["ratio"].between(0.9, 1.15).all()
    # Decoding to the longest response (3x the mean in the fixture) costs more than the mean-length model.
    assert (pred["predicted_steps_active_s"] > pred["predicted_active_s"]).all()
    row = pred.set_index("arm").loc["onpolicy-small"]
    generation = (
        row["responses_needed"] / row["collection"] * row["longest_mean"] * 128 / row["benchmark_tokens_per_s"]
    )
    assert row["predicted_steps_active_s"] - row["predicted_active_s"] == pytest.approx(
        generation - row["responses_needed"] * row["mean_length"] / row["benchmark_tokens_per_s"]
    )
    small = pred.set_index("arm").loc["onpolicy-small"]
    assert small["generation_batch"] == 128 and small["benchmark_tokens_per_s"] == pytest.approx(5142.86)


def test_load_rollout_benchmark_forms(tmp_path):
    assert an.load_rollout_benchmark(tmp_path / "rollout-*.json") is None
    rows = json.loads(BENCHMARK.read_text())
    (tmp_path / "rollout-a.json").write_text(json.dumps({"rows": rows[:3]}))
    (tmp_path / "rollout-b.json").write_text(json.dumps(rows[3:]))
    (tmp_path / "rollout-a-countdown.json").write_text(json.dumps([{"task": "countdown", "responses": 64}]))
    bench = an.load_rollout_benchmark(tmp_path / "rollout-*.json")
    assert bench["batch"].tolist() == [r["batch"] for r in rows]  # the collection table is not read
    (tmp_path / "rollout-c.json").write_text(json.dumps([{"batch": 1}]))
    with pytest.raises(ValueError, match="rollout-c.json lacks columns"):
        an.load_rollout_benchmark(tmp_path / "rollout-*.json")


def test_study_summary_names_the_records_it_was_read_from(study, tmp_path):
    assert an.study_summary(study, ROOT) == (
        "study 'synthetic_study' (SYNTHETIC fixture data): records in tests/fixtures/synthetic_study; "
        f"{len(study.runs)} complete runs of synthetic-model on an unrecorded device"
    )
    runs = study.runs.assign(model="smollm2-135m-instruct", gpu=None, device="cpu", synthetic=False)
    runs.loc[runs.index[:3], ["model", "gpu"]] = ["qwen2.5-1.5b-instruct", "NVIDIA H200"]
    smoke = dataclasses.replace(study, name="smoke", runs=runs, directory=tmp_path / "smoke")
    # Outside the root the folder is shown as it is; mixed values are counted per run.
    assert an.study_summary(smoke, ROOT) == (
        f"study 'smoke': records in {tmp_path / 'smoke'}; {len(runs)} complete runs of smollm2-135m-instruct "
        f"({len(runs) - 3} runs), qwen2.5-1.5b-instruct (3 runs) on cpu ({len(runs) - 3} runs), NVIDIA H200 (3 runs)"
    )
    one = dataclasses.replace(smoke, runs=runs.iloc[:1])
    assert an.study_summary(one).endswith("; 1 complete run of qwen2.5-1.5b-instruct on NVIDIA H200")


def test_study_summary_of_the_committed_study(h200_mini):
    assert an.study_summary(h200_mini, ROOT) == (
        "study 'h200-mini': records in results/h200-mini; 35 complete runs of smollm2-135m-instruct on NVIDIA H200"
    )


# --- writing tables and figures ---------------------------------------------
def test_write_table_csv_and_markdown(tmp_path):
    table = pd.DataFrame(
        {
            "recipe": ["a|b"],
            "lr": [3e-6],
            "val_pct": [81.640625],
            "censored": [np.nan],
            "seed_diffs_pp": [(14.000000000000002, 0.0, -42.0)],
        }
    )
    paths = an.write_table(table, tmp_path, "t", formats={"lr": ".1e"})
    assert [p.name for p in paths] == ["t.csv", "t.md"]
    assert (tmp_path / "t.md").read_text() == (
        "| recipe | lr | val_pct | censored | seed_diffs_pp |\n| --- | --- | --- | --- | --- |\n"
        "| a\\|b | 3.0e-06 | 81.64 | n/a | 14.00, 0.00, -42.00 |\n"
    )
    csv = pd.read_csv(tmp_path / "t.csv")
    assert csv["val_pct"].tolist() == [81.640625] and csv["seed_diffs_pp"].tolist() == ["14.0; 0.0; -42.0"]


def test_learning_rates_keep_their_digits_without_a_format(tmp_path):
    table = pd.DataFrame({"lr": [2e-5, 2.828427e-5, 6.67e-6], "final_pct": [35.15625, 72.8515625, 30.0]})
    an.write_table(table, tmp_path, "t")
    assert (tmp_path / "t.md").read_text().splitlines()[2:] == [
        "| 2e-05 | 35.16 |",
        "| 2.83e-05 | 72.85 |",
        "| 6.67e-06 | 30.00 |",
    ]


def test_figures_written_with_stable_names_and_identical_bytes(study, tmp_path):
    plots.configure()
    conf = _runs(study, "countdown")
    labels = an.recipe_order(conf, "countdown", study.selection)

    def draw():
        summaries = {axis: an.summarize_curves(study.curves, conf, axis) for axis in plots.CURVE_AXES}
        return plots.learning_curves_figure(summaries, labels, [5.78125], plots.title_for("t", study.synthetic))

    first = plots.save_figure(draw(), tmp_path / "a", "learning_curves_countdown")
    second = plots.save_figure(draw(), tmp_path / "b", "learning_curves_countdown")
    assert [p.name for p in first] == ["learning_curves_countdown.png", "learning_curves_countdown.svg"]
    for a, b in zip(first, second):
        assert a.read_bytes() == b.read_bytes()
    svg = first[1].read_text()
    assert "<dc:date>" not in svg and "SYNTHETIC DATA" in svg
    plt.close("all")


def test_every_figure_helper_draws(study):
    plots.configure()
    screening = _runs(study, "gsm8k", "screening")
    conf = _runs(study, "gsm8k")
    labels = an.recipe_order(conf, "gsm8k", study.selection)
    bench = an.load_rollout_benchmark(BENCHMARK)
    rt = an.responses_to_target(study.curves, screening, {"gsm8k": 88.59375})
    train = rt[rt["arm"].isin(["onpolicy-small", "batch-256", "onpolicy-large"])]
    measured = an.measured_generation_throughput(study.collections, screening)
    pred = an.predict_time_to_target(rt, screening, study.collections, bench["batch"], bench["fast_tokens_per_s"])
    tables = {title: an.screening_table(screening, arms) for title, arms in an.SCREENING_QUESTIONS.values()}
    figures = {
        "time_to_target": plots.time_to_target_figure(
            an.time_to_target_table(study.curves, conf, {"gsm8k": [88.59375, 93.59375]}), labels, "t"
        ),
        "group_size": plots.group_size_figure(
            an.mixed_group_points(study.collections, screening), an.group_size_table(screening), "t"
        ),
        "reward_audit": plots.reward_audit_figure(
            an.reward_audit_summary(study.audits), an.initial_test_grading(study.initial_tests), "t"
        ),
        "screening": plots.screening_figure(tables, "t"),
        "training_signals": plots.training_signals_figure(an.training_signals(study.collections, conf), labels, "t"),
        "critical_batch": plots.critical_batch_figure(bench, measured, 512, train, 256, 1.2, pred, "t"),
        "critical_batch_no_benchmark": plots.critical_batch_figure(None, measured, None, train, 256, 1.2, None, "t"),
    }
    assert len(figures["critical_batch"].axes) == 3 and len(figures["critical_batch_no_benchmark"].axes) == 1
    # one panel per signal the table holds, titled
    assert list(plots.SIGNAL_TITLES) == list(an.TRAINING_SIGNALS)
    panels = figures["training_signals"].axes[: len(plots.SIGNAL_TITLES)]
    assert [ax.get_title() for ax in panels] == list(plots.SIGNAL_TITLES.values())
    for fig in figures.values():
        fig.savefig(io.BytesIO(), format="png", dpi=30)  # renders every artist
    plt.close("all")


# --- incomplete studies: fallbacks ------------------------------------------
def _subset_study(
    tmp_path: Path,
    runs: Sequence[str],
    name: str = "study",
    rename_arms: str = "",
    config: dict | None = None,
    drop: Sequence[str] = (),
) -> Path:
    """A study directory holding copies of some fixture runs.

    ``rename_arms`` prefixes every arm (so the study's arm names are absent),
    ``config`` overrides RunConfig fields and ``drop`` removes files (e.g.
    ``test.parquet``) from every copied run.
    """
    root = tmp_path / name
    for run in runs:
        dest = _copy_run(root, run)
        meta = json.loads((dest / "config.json").read_text())
        if rename_arms and meta["config"].get("arm"):
            meta["config"]["arm"] = rename_arms + meta["config"]["arm"]
        meta["config"].update(config or {})
        (dest / "config.json").write_text(json.dumps(meta))
        for f in drop:
            (dest / f).unlink(missing_ok=True)
    return root


COUNTDOWN_SCREENING = [
    f"countdown-screening-{arm}-s0"
    for arm in (
        "onpolicy-small",
        "split-2",
        "split-4",
        "split-8",
        "batch-256",
        "onpolicy-large",
        "group-4",
        "group-16",
        "group-32",
    )
]


def test_match_targets_exact_then_family_then_none():
    targets = {"countdown": [5.0], "countdown-2x10": [6.0, 12.0], "gsm8k": []}
    matched, notes = an.match_targets(targets, ["countdown-2x10", "countdown-3x10", "countdown", "gsm8k", "other"])
    assert matched == {"countdown-2x10": [6.0, 12.0], "countdown-3x10": [5.0], "countdown": [5.0]}
    assert notes[0] == "countdown-3x10: no targets under 'countdown-3x10'; using the 'countdown' family's [5.0]"
    assert notes[1].startswith("gsm8k: no accuracy target given") and notes[2].startswith("other: no accuracy")
    assert an.task_family("countdown-2x10") == "countdown" and an.task_family("gsm8k") == "gsm8k"
    assert an.task_family("countdownish") is None


def test_phase_runs_falls_back_to_a_present_phase(study):
    picked = an.phase_runs(study.runs, "confirmation")
    assert (picked.phase, picked.notes, picked.tasks) == ("confirmation", [], ["gsm8k", "countdown"])
    lr = an.phase_runs(study.runs, "lr-followup")
    assert lr.tasks == ["countdown"] and lr.notes == ["gsm8k: no 'lr-followup' runs; skipping it"]
    pilot = study.runs.assign(phase="pilot")
    picked = an.phase_runs(pilot, "screening")
    assert picked.phase == "pilot" and len(picked.runs) == len(pilot)
    assert picked.notes == ["no 'screening' runs; using the 'pilot' runs instead (phases present: ['pilot'])"]


def test_phases_to_draw_keeps_present_phases_in_order_and_falls_back(study):
    drawn, notes = an.phases_to_draw(study.runs, ["confirmation", "lr-followup", "no-such-phase"])
    assert [d.phase for d in drawn] == ["confirmation", "lr-followup"]
    assert notes == ["no 'no-such-phase' runs; skipping that phase", "gsm8k: no 'lr-followup' runs; skipping it"]
    drawn, notes = an.phases_to_draw(study.runs.assign(phase="pilot"), ["screening", "confirmation"])
    assert [d.phase for d in drawn] == ["pilot"] and "using the 'pilot' runs instead" in notes[0]
    with pytest.raises(TypeError, match="list of phase names"):
        an.phases_to_draw(study.runs, "screening")


def test_arms_are_derived_from_shapes_when_the_named_arms_are_absent(tmp_path, study):
    renamed = an.load_study(_subset_study(tmp_path, COUNTDOWN_SCREENING, rename_arms="mini-"))
    runs = renamed.runs
    named = study.runs[(study.runs["task"] == "countdown") & (study.runs["phase"] == "screening")]
    # Classifying runs by which knob differs recovers the study's three questions and its B arms.
    for slug, (title, arms) in an.SCREENING_QUESTIONS.items():
        derived = an.screening_question_arms(runs, slug)
        assert derived.derived and derived.arms == ["mini-" + a for a in an.screening_question_arms(named, slug).arms]
        assert sorted(derived.arms) == sorted("mini-" + a for a in arms)
        assert not an.screening_question_arms(named, slug).derived
    assert an.screening_question_arms(runs, "group_size").title == (
        "Group size G at fixed B=128, S=4 (128/4/128/4 .. 16/32/128/4)"
    )
    assert an.group_arms(runs).note.startswith(
        "group size arms derived from the runs (G varies at B=128, S=4, lr=3e-06)"
    )
    assert an.training_batch_arms(runs).arms == ["mini-onpolicy-small", "mini-batch-256", "mini-onpolicy-large"]
    # Named arms win when two are present, in the given order.
    assert an.group_arms(named, ["group-32", "group-4", "absent"]).arms == ["group-32", "group-4"]


def test_study_without_group_arms_says_so(tmp_path):
    runs = an.load_study(_subset_study(tmp_path, COUNTDOWN_SCREENING[:4], rename_arms="x-")).runs
    missing = an.group_arms(runs)
    assert missing.arms == [] and not missing.derived
    assert "no runs that differ in G at a shared B, S, lr" in missing.note
    assert an.screening_question_arms(runs, "optimizer_batch").arms == []
    assert an.screening_question_arms(runs, "collection_size").arms == [
        f"x-{a}" for a in ("onpolicy-small", "split-2", "split-4", "split-8")
    ]
    assert an.group_size_table(runs, missing.arms).empty


def test_one_seed_without_test_rows(tmp_path):
    root = _subset_study(
        tmp_path,
        ["countdown-confirmation-onpolicy-small-s1", "countdown-confirmation-group-4-s1"],
        drop=["test.parquet"],
    )
    one = an.load_study(root)
    assert one.tests.empty and one.runs["test_accuracy"].isna().all()
    runs = an.phase_runs(one.runs, "confirmation").runs
    summary = an.summarize_curves(one.curves, runs)
    assert (summary["n_seeds"] == 1).all()
    assert (summary["accuracy_min_pct"] == summary["accuracy_max_pct"]).all()
    labels = an.recipe_order(runs, "countdown", one.selection)
    pairs, notes = an.comparable_pairs(runs, one.tests, "countdown", an.default_comparisons(labels))
    assert pairs == [] and notes == [
        "countdown: no terminal test rows for any recipe; skipping the paired comparisons"
    ]
    assert an.truncation_table(runs)["test_truncation_pct"].isna().all()
    # With test rows back for one recipe only, the pair is still skipped, naming the missing one.
    shutil.copy(
        STUDY_DIR / "countdown-confirmation-group-4-s1" / "test.parquet",
        root / "countdown-confirmation-group-4-s1" / "test.parquet",
    )
    tested = an.load_study(root)
    pairs, notes = an.comparable_pairs(runs, tested.tests, "countdown", an.default_comparisons(labels))
    assert pairs == [] and notes == [
        f"countdown: {labels[1]} versus {labels[0]} skipped: no terminal test rows for Small one-update baseline"
    ]
    assert labels == ["Four answers, four updates", "Small one-update baseline"]  # no selection.json: sorted


def test_summarize_curves_keeps_points_every_seed_has():
    evals = pd.concat([_evals("a1", {0: [0, 0], 128: [1, 0], 256: [1, 1]}), _evals("a2", {0: [0, 1], 128: [1, 1]})])
    runs = pd.DataFrame({"run_id": ["a1", "a2"], "task": "t", "label": "A", "seed": [1, 2]})
    assert an.summarize_curves(an.eval_curves(evals), runs)["responses"].tolist() == [0, 128]


def test_load_study_ignores_output_folders_and_skips_runs_without_records(tmp_path):
    root = _subset_study(tmp_path, ["countdown-screening-split-4-s0", "countdown-screening-split-2-s0"])
    (root / "countdown-screening-split-2-s0" / "evals.parquet").unlink()
    (root / "figures").mkdir()
    (root / "figures" / "learning_curves_countdown.png").write_bytes(b"png")
    loaded = an.load_study(root)
    assert loaded.runs["run_id"].tolist() == ["countdown-screening-split-4-s0"]
    assert loaded.skipped.to_dict("records") == [
        {"run_id": "countdown-screening-split-2-s0", "status": "complete, but no evals.parquet"}
    ]


def test_shipped_rollout_benchmarks_describe_runs_on_their_own_gpu():
    """Notebook 56 reads every shipped table: runs on an H100 get the H100's rows, runs on an H200 the H200's."""
    shipped = an.load_rollout_benchmark(locations.ROLLOUT_BENCHMARKS / "rollout-*.json")
    for run_gpu, rows_gpu in (("NVIDIA H100 80GB HBM3", "h100-80gb-hbm3"), ("NVIDIA H200", "h200")):
        runs = pd.DataFrame({"model": ["smollm2-135m-instruct"], "device": ["cuda"], "gpu": [run_gpu]})
        rows, note = an.select_benchmark(shipped, runs)
        assert note is None and set(rows["gpu"]) == {rows_gpu}
        assert rows["batch"].is_monotonic_increasing and rows["batch"].is_unique and 512 in set(rows["batch"])
        assert (rows["fused_tokens_per_s"] > rows["fast_tokens_per_s"]).all()
        assert (rows["fast_tokens_per_s"] > rows["eager_tokens_per_s"]).all()
        assert (rows["fused_tokens_per_s"] < rows["bandwidth_bound_tokens_per_s"]).all()


def test_select_benchmark_matches_model_and_gpu():
    bench = pd.concat(
        [
            an.load_rollout_benchmark(BENCHMARK).assign(gpu="h200"),
            an.load_rollout_benchmark(BENCHMARK).assign(gpu="b200"),
        ],
        ignore_index=True,
    )
    runs = pd.DataFrame({"model": ["synthetic-model"], "device": ["cuda"], "gpu": ["NVIDIA B200"]})
    rows, note = an.select_benchmark(bench, runs)
    assert note is None and set(rows["gpu"]) == {"b200"}
    rows, note = an.select_benchmark(bench, runs.assign(device="cpu", gpu=None))
    assert rows is None and note.startswith("the runs ran on cpu, not on a benchmarked GPU (b200, h200)")
    assert an.select_benchmark(bench, runs.assign(gpu="NVIDIA A100"))[0] is None
    assert an.select_benchmark(bench, runs.assign(model="other"))[1].startswith("no benchmark rows for model other")
    assert set(an.select_benchmark(bench, runs, gpu="h200")[0]["gpu"]) == {"h200"}
    # Runs that recorded no device (the synthetic fixture) match by model: the first GPU.
    assert set(an.select_benchmark(bench, pd.DataFrame({"model": ["synthetic-model"]}))[0]["gpu"]) == {"h200"}
    assert an.select_benchmark(None, runs) == (None, "no rollout benchmark file")
    assert an.throughput_column_for(pd.DataFrame({"fast_rollout": ["off", "off"]})) == "eager_tokens_per_s"
    assert an.throughput_column_for(pd.DataFrame({"fast_rollout": ["off", "auto"]})) == "fast_tokens_per_s"
    assert an.throughput_column_for(pd.DataFrame({"model": ["m"]})) == "fast_tokens_per_s"
    assert an.throughput_column_for(pd.DataFrame({"fast_rollout": ["fused", "fused"]})) == "fused_tokens_per_s"
    assert an.throughput_column_for(pd.DataFrame({"fast_rollout": ["fused", "on"]})) == "fast_tokens_per_s"
    # the recorded decode path decides where it exists: auto became fused on GPU
    both = pd.DataFrame({"fast_rollout": ["auto", "auto"], "rollout_path": ["fused", "fused"]})
    assert an.throughput_column_for(both) == "fused_tokens_per_s"
    assert an.throughput_column_for(both.assign(rollout_path=["eager", "eager"])) == "eager_tokens_per_s"
    assert an.throughput_column_for(both.assign(rollout_path=["fused", None])) == "fast_tokens_per_s"  # old + new


def test_figure_helpers_on_sparse_data(study):
    plots.configure()
    assert plots.axis_units("output_tokens", [0, 497]) == ("Generated output tokens", 1.0)
    assert plots.axis_units("output_tokens", [0, 5e4]) == ("Generated output tokens (thousands)", 1e-3)
    assert plots.axis_units("output_tokens", [0, 2e6]) == plots.CURVE_AXES["output_tokens"]
    assert plots.axis_units("active_seconds", [0, 33.4]) == ("Active phase seconds", 1.0)
    screening = _runs(study, "countdown", "screening")
    two = ["group-4", "group-16"]
    fig = plots.group_size_figure(
        an.mixed_group_points(study.collections, screening, two), an.group_size_table(screening, two), "t"
    )
    assert [line.get_label() for line in fig.axes[0].get_lines()] == ["formula G=4", "formula G=16"]
    bench = an.load_rollout_benchmark(BENCHMARK)
    measured = an.measured_generation_throughput(study.collections, screening)
    assert len(plots.critical_batch_figure(bench, measured, 512, None, None, 1.2, None, "t").axes) == 1
    rt = an.responses_to_target(study.curves, screening, {"countdown": 5.78125})
    assert len(plots.critical_batch_figure(None, measured, None, rt, 256, 1.2, rt.iloc[:0], "t").axes) == 1
    with pytest.raises(ValueError, match="needs a benchmark"):
        plots.critical_batch_figure(None, measured, None, None, None, 1.2, None, "t")
    with pytest.raises(ValueError, match="needs audit rows"):
        plots.reward_audit_figure(pd.DataFrame(), pd.DataFrame(), "t")
    plt.close("all")


def _run_notebook_inprocess(name: str, **params) -> None:
    """Execute a notebook's code cells in this process, ``params`` overriding its parameters cell.

    Far faster than a kernel per notebook; magics (``%matplotlib``) are dropped.
    """
    nb = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())
    namespace: dict = {"__name__": f"notebook_{name[:2]}"}
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "\n".join(line for line in "".join(cell["source"]).splitlines() if not line.lstrip().startswith("%"))
        exec(compile(source, f"{name}.ipynb", "exec"), namespace)  # noqa: S102
        if "parameters" in cell["metadata"].get("tags", []):
            namespace.update(params)
    plt.close("all")


def test_every_notebook_runs_on_incomplete_studies(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    # Like the H200 pilot: one run of an unplanned phase, a task variant, no test rows, no
    # selection, audit or initial model.
    pilot = _subset_study(
        tmp_path,
        ["countdown-confirmation-onpolicy-large-s1"],
        name="pilot",
        config={"phase": "pilot", "task": "countdown-2x10"},
        drop=["test.parquet"],
    )
    # Like the smoke study: screening arms under other names, confirmation with two seeds.
    smoke = _subset_study(
        tmp_path,
        [
            "countdown-screening-onpolicy-small-s0",
            "countdown-screening-split-2-s0",
            "countdown-screening-group-4-s0",
            "countdown-screening-split-4-s0",
        ],
        name="smoke",
        rename_arms="mini-",
    )
    for study_dir, out in ((pilot, tmp_path / "pilot-figs"), (smoke, tmp_path / "smoke-figs")):
        for name in ANALYSIS_NOTEBOOKS:
            params = {"study_dir": str(study_dir), "out_dir": str(out)}
            if name in ("50_learning_curves", "52_time_to_target"):
                params["targets"] = {"countdown-2x10": [6.0], "countdown": [5.78125]}
            if name == "56_critical_batch":  # the study's targets: countdown-2x10 falls back to its family
                params["targets"] = {"gsm8k": 88.59375, "countdown": 5.78125}
            _run_notebook_inprocess(name, **params)
    printed = capsys.readouterr().out
    assert "no 'confirmation' runs; using the 'pilot' runs instead" in printed
    assert "countdown-2x10: no targets under 'countdown-2x10'; using the 'countdown' family's 5.78125" in printed
    assert "countdown-2x10: only one recipe (Large one-update batch); no paired comparisons" in printed
    assert "no terminal test rows for the 'pilot' runs; skipping the test truncation table" in printed
    assert "neither a reward audit nor initial-model test rows; skipping the reward-audit figure" in printed
    assert "countdown: group size arms derived from the runs (G varies at B=128, S=4" in printed
    assert "countdown: no optimizer batch arms" in printed
    assert "no run stored sampled completions (samples.jsonl.gz); these records predate them" in printed
    assert sorted(p.name for p in (tmp_path / "pilot-figs").glob("*.png")) == [
        "category_curves_pilot_countdown-2x10.png",
        "collapse_pilot_countdown-2x10.png",
        "critical_batch_countdown-2x10.png",
        "learning_curves_pilot_countdown-2x10.png",
        "time_to_target_pilot_countdown-2x10.png",
        "training_signals_pilot_countdown-2x10.png",
    ]
    assert sorted(p.name for p in (tmp_path / "smoke-figs").glob("*.png")) == [
        "category_curves_screening_countdown.png",
        "collapse_screening_countdown.png",
        "critical_batch_countdown.png",
        "group_size_countdown.png",
        "learning_curves_screening_countdown.png",
        "screening_countdown.png",
        "time_to_target_screening_countdown.png",
        "training_signals_screening_countdown.png",
    ]


def test_responses_to_target_without_a_target_for_the_studys_task_is_empty(study):
    screening = study.runs[study.runs["phase"] == "screening"]
    rt = an.responses_to_target(study.curves, screening, {"countdown-2x10": 6.0, "other-task": 1.0})
    assert rt.empty and "responses_needed" in rt.columns and "arm" in rt.columns


def test_recipe_colors_stay_distinct_past_ten_recipes():
    for n in (3, 10, 11, 20):
        colors = plots.label_colors([f"arm-{i}" for i in range(n)])
        assert len(set(colors.values())) == n


# --- seed-level comparisons -------------------------------------------------
def _with_extra_seed(study: an.Study, task: str, label: str, source_seed: int, new_seed: int):
    """runs and tests of ``study`` with a copy of one run of ``label`` under another seed number."""
    runs = _runs(study, task)
    row = runs[(runs["label"] == label) & (runs["seed"] == source_seed)].copy()
    new_id = row["run_id"].iloc[0] + f"-copy{new_seed}"
    extra_tests = study.tests[study.tests["run_id"] == row["run_id"].iloc[0]].assign(run_id=new_id)
    runs = pd.concat([runs, row.assign(run_id=new_id, seed=new_seed)], ignore_index=True)
    return runs, pd.concat([study.tests, extra_tests], ignore_index=True)


def test_seed_level_comparisons_on_fixture(study):
    from grpo_knobs import stats

    runs = _runs(study, "countdown")
    labels = an.recipe_order(runs, "countdown", study.selection)
    pairs = an.default_comparisons(labels)
    table = an.seed_level_comparisons(runs, study.tests, "countdown", pairs, n_resamples=2_000)
    a, _, _ = an.recipe_test_scores(study.tests, runs, pairs[0][0], "countdown")
    b, _, _ = an.recipe_test_scores(study.tests, runs, pairs[0][1], "countdown")
    boot = stats.hierarchical_bootstrap(a, b, n_resamples=2_000)
    first = table.iloc[0]
    assert (first["hier_low_pp"], first["hier_high_pp"]) == (boot.ci_low_pp, boot.ci_high_pp)
    assert first["perm_p_greater"] == stats.seed_permutation_test(a, b).p_value
    assert first["welch_low_pp"] == pytest.approx(stats.seed_welch_interval(a, b).ci_low_pp)
    assert list(table[["n_seeds_x", "n_seeds_y", "n_problems"]].iloc[0]) == [3, 3, 96]
    side = an.comparison_side_by_side(an.paired_comparisons(runs, study.tests, "countdown", pairs, 2_000), table)
    assert list(side.columns[:5]) == ["Comparison", "Seeds x / y", "Problems", "Mean pp", "Conditional 95% (problems)"]
    assert side["Permutation p (one-sided)"].iloc[0].endswith("(of 20)")


def test_seed_level_comparisons_take_unpaired_seed_counts_and_report_the_change(study):
    runs, tests = _with_extra_seed(study, "countdown", "Large one-update batch", 1, 4)
    labels = an.recipe_order(runs, "countdown", study.selection)
    pairs = an.default_comparisons(labels)
    paired, notes = an.comparable_pairs(runs, tests, "countdown", pairs)
    unpaired, _ = an.tested_pairs(runs, tests, "countdown", pairs)
    assert len(paired) == 1 and len(notes) == 2 and unpaired == pairs
    table = an.seed_level_comparisons(runs, tests, "countdown", pairs, n_resamples=1_000)
    assert list(table["n_seeds_x"]) == [4, 3, 3] and list(table["n_seeds_y"]) == [3, 3, 4]
    side = an.comparison_side_by_side(an.paired_comparisons(runs, tests, "countdown", paired, 1_000), table)
    assert side["Conditional 95% (problems)"].tolist()[:2] == ["n/a (seeds not paired)", side.iloc[1, 4]]
    change = an.seed_count_change(runs, tests, "countdown", pairs, first=3, n_resamples=1_000)
    # Only comparisons involving the grown recipe; "first 3" reproduces the three-seed analysis.
    assert change["seeds"].tolist() == ["first 3", "all", "first 3", "all"]
    three = an.seed_level_comparisons(_runs(study, "countdown"), study.tests, "countdown", pairs, n_resamples=1_000)
    first3 = change[change["seeds"] == "first 3"].reset_index(drop=True)
    expected = three[three["comparison"].isin(first3["comparison"])].reset_index(drop=True)
    pd.testing.assert_series_equal(first3["hier_low_pp"], expected["hier_low_pp"])
    assert an.seed_count_change(_runs(study, "countdown"), study.tests, "countdown", pairs).empty


# --- categories -------------------------------------------------------------
H200_MINI = ROOT / "results" / "h200-mini"


@pytest.fixture(scope="module")
def h200_mini() -> an.Study:
    return an.load_study(H200_MINI)


def test_category_decomposition_sums_to_the_difference(study):
    runs = _runs(study, "countdown")
    tests, notes = an.tag_categories(study.tests, study.runs)
    assert not notes and tests["category"].notna().all()
    pairs = an.default_comparisons(an.recipe_order(runs, "countdown", study.selection))
    parts = an.category_decomposition(tests[tests["task"] == "countdown"], runs, "countdown", pairs)
    overall = an.seed_level_comparisons(runs, study.tests, "countdown", pairs, n_resamples=100)
    sums = parts.groupby("comparison", sort=False)["contribution_pp"].sum()
    np.testing.assert_allclose(sums.to_numpy(), overall["mean_pp"].to_numpy())
    assert parts.groupby("comparison")["problems"].sum().eq(96).all()


def test_categories_of_the_committed_countdown_records(h200_mini):
    runs = h200_mini.runs[h200_mini.runs["task"] == "countdown-2x10"]
    evals, notes = an.tag_categories(h200_mini.evals[h200_mini.evals["run_id"].isin(runs["run_id"])], runs)
    assert not notes
    sizes = an.category_sizes(evals).set_index("category")["problems"]
    assert sizes.to_dict() == {"+": 17, "-": 17, "*": 7, "/": 5, "*|/": 4}
    # The 34% plateau: most evaluations at 17/50 solve exactly the 17 addition problems.
    exact = an.exact_category_solutions(evals)
    assert exact[["category", "accuracy_pct", "evaluations", "evaluations_at_accuracy"]].values.tolist() == [
        ["+", 34.0, 41, 53]
    ]
    confirm = runs[runs["phase"] == "confirmation"]
    tests, _ = an.tag_categories(h200_mini.tests[h200_mini.tests["run_id"].isin(confirm["run_id"])], confirm)
    parts = an.category_decomposition(tests, confirm, "countdown-2x10", [("batch-256", "onpolicy-small")])
    net = parts.set_index("category")["net_correct_all_seeds"]
    assert (net["+"], net.sum()) == (36, 31)  # five seeds per recipe


def test_one_category_plateau_is_read_on_the_problems_a_run_graded():
    # Run "full" grades the whole split (2 of 4 problems are additions), run "sub" a subset (1 of 3).
    evals = pd.DataFrame(
        {
            "run_id": ["full"] * 4 + ["sub"] * 3,
            "task": "t",
            "responses": 1024,
            "problem_id": ["a1", "a2", "b1", "b2", "a1", "b1", "b2"],
            "category": ["+", "+", "-", "-", "+", "-", "-"],
            "correct": [1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0],
        }
    )
    plateaus = an.one_category_plateaus(evals).set_index("run_id")
    assert plateaus.loc["full", ["problems", "category"]].tolist() == [4, "+"]
    assert plateaus.loc["full", "plateau_pct"] == pytest.approx(50.0)
    assert plateaus.loc["sub", ["problems", "category"]].tolist() == [3, "-"]
    assert plateaus.loc["sub", "plateau_pct"] == pytest.approx(200 / 3)
    # Both runs solved exactly the additions they graded: 50% of the split, 33.3% of the subset.
    exact = an.exact_category_solutions(evals)
    assert exact[["category", "evaluations", "evaluations_at_accuracy"]].values.tolist() == [["+", 1, 1]] * 2
    assert exact["accuracy_pct"].tolist() == pytest.approx([100 / 3, 50.0])


def test_the_pilot_on_a_subset_is_judged_against_its_own_plateau():
    pilot = an.load_study(ROOT / "results" / "task-pilot")
    runs = pilot.runs[pilot.runs["task"] == "countdown-2x99"]
    evals, notes = an.tag_categories(pilot.evals[pilot.evals["run_id"].isin(runs["run_id"])], runs)
    assert not notes
    plateaus = an.one_category_plateaus(evals).set_index("run_id")
    # eval_problems=256: its 256 validation problems hold 101 addition problems (39.45%), the split 180 of 512.
    assert plateaus["problems"].tolist() == [256, 256] and plateaus["category"].eq("+").all()
    assert plateaus["plateau_pct"].tolist() == pytest.approx([100 * 101 / 256] * 2)
    series = an.zero_advantage_series(pilot.collections, runs)
    table = an.plateau_outcomes(
        runs, pilot.curves, series, an.collapse_points(series), plateaus["plateau_pct"].to_dict()
    )
    fast = table[table["lr"] == 2e-5].iloc[0]
    assert fast["final_pct"] == pytest.approx(100 * 101 / 256) and not fast["escaped"]


def test_pool_facts_of_the_committed_countdown_records(h200_mini):
    runs = h200_mini.runs[h200_mini.runs["task"] == "countdown-2x10"]
    coverage = an.pool_coverage(h200_mini.collections, runs, 70).set_index("P")
    assert coverage["covered_by"].to_dict() == {16: 5, 32: 3, 64: 2, 128: 1}
    assert coverage.loc[128, "repeated_slots_min"] == 58
    shared = an.shared_numbers("countdown-2x10").set_index("split")
    assert shared["share_train_numbers"].to_dict() == {"validation": 39, "test": 31}
    assert set(shared["train_pool"]) == {70}


def test_category_order_numbers_then_operation_sets():
    assert an.category_order(["10 steps", "2 steps", "+|*", "*", "+"]) == ["2 steps", "10 steps", "*", "+", "+|*"]


# --- collapse ---------------------------------------------------------------
def test_zero_advantage_series_uses_records_then_the_mixed_group_fallback(study):
    series = an.zero_advantage_series(study.collections, study.runs)
    countdown, gsm8k = series[series["task"] == "countdown"], series[series["task"] == "gsm8k"]
    assert (countdown["source"] == "recorded").all() and countdown["entropy_mean"].notna().all()
    assert (gsm8k["source"] == an.collapse.DERIVED).all() and gsm8k["entropy_mean"].isna().all()
    np.testing.assert_allclose(gsm8k["zero_advantage_fraction"], 1 - gsm8k["mixed_group_fraction"])
    # The fixture's recorded share is the same quantity for its 0/1 rewards.
    np.testing.assert_allclose(countdown["zero_advantage_fraction"], 1 - countdown["mixed_group_fraction"])


def test_collapse_rule_needs_a_long_enough_streak_after_learning_began(study):
    runs = _runs(study, "countdown")
    series = an.zero_advantage_series(study.collections, runs[runs["label"] == "Small one-update baseline"])
    # Seed 1 ends with 14 collections of 128 responses at >= 90%: 1,792 responses, short of the default.
    default = an.collapse_points(series).set_index("seed")
    assert not default["collapsed"].any()
    shorter = an.collapse_points(series, an.CollapseRule(min_responses=1024)).set_index("seed")
    assert shorter.loc[1, ["collapsed", "collapse_collection", "streak", "to_end"]].tolist() == [True, 50, 14, True]
    described = an.describe_collapse(shorter.reset_index()).iloc[0]
    assert described == "at 6,528 responses (collection 50), until the run ended"


def test_collapse_ignores_the_all_wrong_start_and_reports_recovery():
    runs = pd.DataFrame({"run_id": ["r"], "task": ["t"], "phase": ["p"], "label": ["x"], "arm": ["x"], "seed": [0]})
    zero = [1.0, 1.0, 1.0, 0.5, 0.95, 0.95, 0.6, 0.92, 0.93, 0.99]
    collections = pd.DataFrame(
        {
            "run_id": "r",
            "collection": range(10),
            "responses": np.arange(1, 11) * 512,
            "reward_mean": 0.3,
            "mixed_group_fraction": 1 - np.array(zero),
        }
    )
    points = an.collapse_points(an.zero_advantage_series(collections, runs), an.CollapseRule(0.9, 1024))
    # Two stretches: collections 4-5 (recovered at 6) and 7-9, which lasts to the end.
    assert points.loc[0, ["collapsed", "collapse_collection", "streak", "stretches", "to_end"]].tolist() == [
        True,
        4,
        2,
        2,
        True,
    ]
    assert points.loc[0, ["stretch_collections", "stretch_responses", "stretch_lengths"]].tolist() == [
        (4, 7),
        (2560, 4096),
        (2, 3),
    ]
    strict = an.collapse_points(an.zero_advantage_series(collections, runs), an.CollapseRule(0.9, 1536))
    assert strict.loc[0, ["collapse_collection", "streak", "stretches", "to_end"]].tolist() == [7, 3, 1, True]
    table = pd.DataFrame({"task": ["t"], "arm": ["x"], "seed": [0]})
    assert an.add_collapse_column(table, points)["collapsed"].iloc[0] == (
        "at 2,560 responses (collection 4), recovered after 2 collections; "
        "at 4,096 responses (collection 7), until the run ended"
    )
    # A run whose last collection is mixed again recovered from both stretches.
    recovered = collections.assign(mixed_group_fraction=1 - np.array(zero[:9] + [0.5]))
    twice = an.collapse_points(an.zero_advantage_series(recovered, runs), an.CollapseRule(0.9, 1024)).iloc[0]
    assert (twice["stretch_collections"], twice["stretch_lengths"], twice["to_end"]) == ((4, 7), (2, 2), False)
    fig = plots.collapse_figure(an.zero_advantage_series(collections, runs), points, ["x"], 0.9, "t")
    assert fig.axes[0].collections[0].get_offsets().tolist() == [[2560, 95.0], [4096, 92.0]]  # an x per stretch


def test_plateau_outcomes_separate_escape_from_collapse():
    """Two runs on one task: one ends on the plateau with every group unmixed, one ends above it."""
    runs = pd.DataFrame(
        {
            "run_id": ["a", "b"],
            "task": "t",
            "phase": "p",
            "label": ["x", "y"],
            "arm": ["x", "y"],
            "seed": [1, 2],
            "lr": 2e-5,
        }
    )
    stuck = [1.0, 0.5, 0.95, 1.0, 1.0, 1.0]
    moving = [1.0, 0.5, 0.4, 0.5, 0.6, 0.7]
    collections = pd.DataFrame(
        {
            "run_id": ["a"] * 6 + ["b"] * 6,
            "collection": [*range(6), *range(6)],
            "responses": np.tile(np.arange(1, 7) * 512, 2),
            "reward_mean": 0.3,
            "mixed_group_fraction": 1 - np.array(stuck + moving),
            "entropy_mean": [2.0, 1.5, 0.5, 0.1, 0.1, 0.1, 2.0, 1.9, 1.8, 1.7, 1.6, 1.5],
        }
    )
    curves = pd.DataFrame(
        {"run_id": ["a", "a", "b", "b"], "responses": [0, 3072] * 2, "accuracy": [0.0, 0.35, 0.01, 0.60]}
    )
    series = an.zero_advantage_series(collections, runs)
    points = an.collapse_points(series, an.CollapseRule(0.9, 1024))
    out = an.plateau_outcomes(runs, curves, series, points, plateau_pct=35.0, last_collections=2).set_index("label")
    assert out.loc["x", "escaped"] == False and out.loc["y", "escaped"] == True  # noqa: E712 (numpy bools)
    assert out.loc["x", "final_pct"] == pytest.approx(35.0) and out.loc["y", "best_pct"] == pytest.approx(60.0)
    assert out.loc["x", "collapsed"].startswith("at 1,536 responses") and out.loc["y", "collapsed"] == "no"
    assert out.loc["x", "zero_advantage_last"] == pytest.approx(1.0)
    assert out.loc["y", "entropy_last"] == pytest.approx(1.55) and out.loc["y", "entropy_first"] == 2.0


def test_group_mixing_prediction_averages_the_formula_over_recorded_groups(study):
    from grpo_knobs import stats

    pred = an.group_mixing_prediction(study.collections, _runs(study, "countdown", "screening"))
    raw = study.collections.set_index(["run_id", "collection"])
    run_id = study.runs.set_index(["task", "phase", "arm"]).loc[("countdown", "screening", "group-4"), "run_id"]
    means = raw.loc[(run_id, 3), "group_reward_means"]
    row = pred[(pred["arm"] == "group-4") & (pred["collection"] == 3)].iloc[0]
    assert row["predicted_per_group"] == pytest.approx(stats.predicted_mixed_fraction(means, 4))
    # Measured mixing is the share of groups strictly between all wrong and all right.
    assert row["mixed_group_fraction"] == pytest.approx(np.mean([0 < m < 1 for m in means]), abs=1e-6)
    gsm8k = an.group_mixing_prediction(study.collections, _runs(study, "gsm8k", "screening"))
    assert gsm8k["predicted_per_group"].isna().all()
    summary = an.mixing_prediction_summary(gsm8k)
    assert (summary["recorded"] == 0).all() and summary["measured"].notna().all()


# --- completions --------------------------------------------------------------
def test_completion_examples_at_start_middle_and_end():
    examples = an.completion_examples(STUDY_DIR / "countdown-confirmation-onpolicy-small-s1", per_outcome=1)
    samples = an.load_samples(STUDY_DIR / "countdown-confirmation-onpolicy-small-s1")
    collections = sorted(samples["collection"].unique())
    stages = examples.groupby("stage", sort=False)["collection"].first()
    assert stages.to_dict() == {
        "start": collections[0],
        "middle": collections[len(collections) // 2],
        "end": collections[-1],
    }
    assert examples.groupby("stage")["reward"].apply(lambda r: r.is_unique).all()
    assert an.completion_examples(STUDY_DIR / "countdown-confirmation-onpolicy-small-s2").empty
    short = an.completion_examples(STUDY_DIR / "countdown-confirmation-onpolicy-small-s1", max_chars=10)
    assert short["text"].str.len().max() == 13 and short["text"].str.startswith("...").all()


def test_eval_response_examples_only_where_recorded(study):
    run_id = "countdown-confirmation-onpolicy-large-s1"
    examples = an.eval_response_examples(study.evals, run_id)
    assert examples["stage"].unique().tolist() == ["start", "middle", "end"]
    assert sorted(examples["correct"].unique()) == [0.0, 1.0]
    assert examples["response"].str.contains("<answer>").all()
    assert an.eval_response_examples(study.evals, "countdown-confirmation-group-4-s1").empty
    assert an.eval_response_examples(study.evals.drop(columns="response"), run_id).empty


def test_notebook_setup_returns_the_imported_checkout():
    assert an.notebook_setup() == ROOT


def test_collapse_and_category_figures_draw(study):
    runs = _runs(study, "countdown")
    labels = an.recipe_order(runs, "countdown", study.selection)
    series = an.zero_advantage_series(study.collections, runs)
    points = an.collapse_points(series, an.CollapseRule(min_responses=1024))
    fig = plots.collapse_figure(series, points, labels, 0.9, "t")
    assert len(fig.axes[0].collections) == 1 and len(fig.axes[0].collections[0].get_offsets()) == 1  # one x
    assert len(fig.axes[1].get_lines()) == len(runs)  # entropy recorded for every Countdown run
    gsm8k = an.zero_advantage_series(study.collections, _runs(study, "gsm8k"))
    fig = plots.collapse_figure(gsm8k, an.collapse_points(gsm8k), an.recipe_order(gsm8k, "gsm8k"), 0.9, "t")
    assert "entropy not recorded" in fig.axes[1].texts[0].get_text()
    evals, _ = an.tag_categories(study.evals[study.evals["run_id"].isin(runs["run_id"])], runs)
    curves = an.category_curves(evals, runs)
    cats = an.category_order(curves["category"])
    fig = plots.category_curves_figure(curves, labels, cats, "t")
    assert [ax.get_title() for ax in fig.axes] == [
        f"{c} ({n} problems)"
        for c, n in zip(cats, curves.drop_duplicates("category").set_index("category").loc[cats, "problems"])
    ]
    plt.close("all")


def test_paired_job_times_compare_only_runs_on_one_decode_path(study):
    runs = _runs(study, "countdown").copy()
    runs["rollout_path"] = None  # older records: one "unrecorded" path
    pairs = an.default_comparisons(an.recipe_order(runs, "countdown", study.selection))
    assert an.paired_job_times(runs, "countdown", pairs)["rollout_path"].tolist() == ["unrecorded"] * 3
    assert an.job_time_path_notes(runs, "countdown", pairs) == []
    # Seed 3 of every recipe on the fused path, seed 2 of the baseline too.
    runs["rollout_path"] = np.where(runs["seed"] == 3, "fused", None)
    runs.loc[(runs["label"] == "Small one-update baseline") & (runs["seed"] == 2), "rollout_path"] = "fused"
    times = an.paired_job_times(runs, "countdown", pairs)
    first = times[times["comparison"] == f"{pairs[0][0]} versus {pairs[0][1]}"].set_index("rollout_path")
    assert first["n_seeds"].to_dict() == {"fused": 1, "unrecorded": 1}
    minutes = runs.set_index(["label", "seed"])["job_seconds"] / 60
    assert first.at["fused", "x_job_min"] == pytest.approx(minutes[(pairs[0][0], 3)])
    notes = an.job_time_path_notes(runs, "countdown", pairs)
    assert len(notes) == 2 and all("seeds [2] left out" in n for n in notes)


def test_job_times_pair_only_runs_on_one_trainer_path(study):
    """Runs on one decode path but two trainer paths: seed pairs across trainer paths are left out."""
    runs = _runs(study, "countdown").copy()
    runs["rollout_path"] = "fused"
    runs["trainer_path"] = "packed-liger"
    pairs = an.default_comparisons(an.recipe_order(runs, "countdown", study.selection))
    x = pairs[0][0]
    runs.loc[(runs["label"] == x) & (runs["seed"] == 1), "trainer_path"] = "padded"
    times = an.paired_job_times(runs, "countdown", pairs).set_index("comparison")
    assert times.at[f"{x} versus {pairs[0][1]}", "n_seeds"] == 2
    assert set(times["trainer_path"]) == {"packed-liger"} and set(times["rollout_path"]) == {"fused"}
    (note,) = [n for n in an.job_time_path_notes(runs, "countdown", pairs) if n.startswith(f"countdown: {x} versus")]
    assert "seeds [1] left out (runs on different decode or trainer paths)" in note
    cost = an.phase_cost_table(runs)
    assert "rollout_path" not in cost.columns
    assert cost.set_index(["recipe", "trainer_path"]).at[(x, "padded"), "n_runs"] == 1


def test_phase_cost_table_splits_decode_paths_only_when_runs_mix_them(study):
    runs = _runs(study, "countdown").copy()
    assert "rollout_path" not in an.phase_cost_table(runs).columns
    runs["rollout_path"] = np.where(runs["seed"] == 3, "fused", "fast")
    cost = an.phase_cost_table(runs)
    assert cost.groupby("recipe")["rollout_path"].apply(sorted).tolist() == [["fast", "fused"]] * 3
    assert cost.set_index(["recipe", "rollout_path"])["n_runs"].sum() == 9


def test_confirmation_notebook_reports_the_change_from_three_to_five_seeds(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    recipes = ("onpolicy-small", "onpolicy-large", "group-4")
    runs = [f"countdown-confirmation-{arm}-s{seed}" for arm in recipes for seed in (1, 2, 3)]
    study_dir = _subset_study(tmp_path, runs, name="five")
    for arm in recipes:  # seeds 4 and 5: copies of seeds 2 and 3 under new IDs, on another decode path
        for new, old in ((4, 2), (5, 3)):
            dest = study_dir / f"countdown-confirmation-{arm}-s{new}"
            shutil.copytree(study_dir / f"countdown-confirmation-{arm}-s{old}", dest)
            meta = json.loads((dest / "config.json").read_text())
            meta["run_id"], meta["config"]["seed"], meta["rollout_path"] = dest.name, new, "fused"
            (dest / "config.json").write_text(json.dumps(meta))
            for name in ("evals.parquet", "test.parquet"):
                frame = pd.read_parquet(dest / name)
                frame.assign(run_id=dest.name).to_parquet(dest / name)
    (study_dir / "selection.json").write_text(json.dumps({"recipes": {"countdown": list(recipes)}}))
    _run_notebook_inprocess("51_confirmation", study_dir=str(study_dir), out_dir=str(tmp_path / "figs"))
    printed = capsys.readouterr().out
    assert "tested seeds per recipe: Small one-update baseline 5; Large one-update batch 5; " in printed
    change = pd.read_csv(tmp_path / "figs" / "confirmation_seed_count_countdown.csv")
    assert change["seeds"].tolist() == ["first 3", "all"] * 3
    assert set(change.loc[change["seeds"] == "all", "n_seeds_x"]) == {5}
    assert set(change.loc[change["seeds"] == "all", "n_relabellings"]) == {252}
    times = pd.read_csv(tmp_path / "figs" / "confirmation_job_time_countdown.csv")
    assert times.groupby("comparison")["rollout_path"].apply(sorted).tolist() == [["fused", "unrecorded"]] * 3


def test_trainer_path_is_read_from_records_that_predate_it(tmp_path):
    meta = json.loads((STUDY_DIR / "countdown-confirmation-onpolicy-small-s1" / "config.json").read_text())
    assert "trainer_path" not in meta and "trainer_path" not in meta["config"]
    collections = pd.DataFrame({"micro_batch_tokens_max": [4000.0, 30000.0]})
    read = an.loading._trainer_path
    assert read(meta, collections) == ("padded", "config predates trainer_path; padded was the only path")
    asked = {**meta, "config": {**meta["config"], "trainer_path": "packed"}}
    assert read(asked, collections)[0] == "packed"
    auto = {**meta, "config": {**meta["config"], "trainer_path": "auto", "max_tokens_per_micro_batch": 8192}}
    assert read(auto, collections)[0] == "packed"  # 30,000 tokens in one micro-batch: packed only
    assert read(auto, collections.clip(upper=8000)) == ("unknown", "trainer_path=auto, unrecorded")
    assert read({**auto, "trainer_path": "packed-liger"}, collections) == ("packed-liger", "recorded")
    shared = {**auto, "trainer_path": "packed-liger", "packed_prompts": "shared"}
    assert read(shared, collections) == ("packed-liger+shared-prompts", "recorded")


def test_trainer_paths_of_the_committed_confirmation_runs(h200_mini):
    runs = h200_mini.runs[h200_mini.runs["phase"] == "confirmation"].set_index(["task", "label", "seed"])
    countdown = runs.loc["countdown-2x10"]
    # Seeds 4 and 5 recorded trainer_path=auto in their config only; their updates ran as one micro-batch.
    assert set(countdown.loc[countdown.index.get_level_values("seed") >= 4, "trainer_path"]) == {"packed"}
    assert set(countdown.loc[countdown.index.get_level_values("seed") <= 3, "trainer_path"]) == {"padded"}
    assert set(runs.loc["gsm8k", "trainer_path"]) == {"padded"}
    note = an.trainer_path_note(h200_mini.runs, "countdown-2x10")
    assert note.startswith("countdown-2x10: trainer path not recorded by 27 of 27 runs") and "packed for 6" in note


def test_run_path_note_only_when_paths_mix(study):
    runs = _runs(study, "countdown").copy()
    assert an.run_path_note(runs, "countdown") is None
    runs["rollout_path"] = np.where(runs["seed"] == 3, "fused", None)
    assert an.run_path_note(runs, "countdown").startswith(
        "countdown: runs used more than one decode / trainer path "
        "(runs per path: fused / padded 3, unrecorded / padded 6)"
    )
    runs["rollout_path"] = "fused"  # one decode path, two trainer paths
    runs["trainer_path"] = np.where(runs["seed"] == 1, "padded", "packed-liger")
    assert "(runs per path: fused / packed-liger 6, fused / padded 3)" in an.run_path_note(runs, "countdown")


def test_run_path_note_names_runs_trained_on_several_gpus(study):
    runs = _runs(study, "countdown").copy()
    assert an.run_path_note(runs, "countdown") is None  # the fixture's records name no GPU
    runs["trained_on"] = np.where(runs["seed"] == 2, "GPU-b", "GPU-a")
    note = an.run_path_note(runs, "countdown")
    assert note.startswith("countdown: 9 runs trained on 2 GPUs (the same code's trainer phase took 1.5x")
    runs["trained_on"] = np.where(runs["seed"] == 2, None, "GPU-a")  # records without placements say nothing
    assert an.run_path_note(runs, "countdown") is None


def test_shared_device_finds_runs_whose_spans_overlap_on_one_device():
    devices = pd.Series(["gpu-a", "gpu-a", "gpu-a", "gpu-b", "gpu-a", None])
    starts = pd.Series([0.0, 100.0, 150.0, 120.0, 400.0, 130.0])
    seconds = pd.Series([103.0, 80.0, 40.0, 60.0, 50.0, 60.0])
    # 0 ends 3 s into 1 (within the slack of starts recorded to the second); 1 and 2 overlap for 30 s;
    # 3 overlaps them in time on another GPU; 4 comes later; 5 recorded no device.
    assert an.shared_device(devices, starts, seconds).tolist() == [False, True, True, False, False, False]


def test_committed_seeds20_runs_side_by_side_are_found_from_their_records():
    """Seeds 8-20 of seeds20 trained two or three at a time on one H200, seeds 1-7 one at a time."""
    runs = an.load_study(ROOT / "results" / "seeds20").runs
    assert set(runs.loc[runs["seed"] <= 7, "device_use"]) == {"alone"}
    assert set(runs.loc[runs["seed"] >= 8, "device_use"]) == {"shared"}
    assert runs["trained_on"].nunique() == 5 and runs["trained_on"].notna().all()  # five H200 machines


def test_time_comparisons_leave_out_runs_that_shared_their_device(study):
    runs = _runs(study, "countdown").copy()
    pairs = an.default_comparisons(an.recipe_order(runs, "countdown", study.selection))
    x, y = pairs[0]
    runs["device_use"] = np.where((runs["label"] == x) & (runs["seed"] == 2), "shared", "alone")
    times = an.paired_job_times(runs, "countdown", pairs).set_index("comparison")
    assert times.at[f"{x} versus {y}", "n_seeds"] == 2 and times["n_seeds"].tolist().count(3) == 1
    notes = an.job_time_path_notes(runs, "countdown", pairs)
    assert len(notes) == 2 and all("seeds [2] left out (a run trained beside other runs" in n for n in notes)
    assert "1 of 9 runs trained beside other runs on one device" in an.run_path_note(runs, "countdown")
    cost = an.phase_cost_table(runs).set_index(["recipe", "device_use"])
    assert cost.at[(x, "shared"), "n_runs"] == 1 and cost.at[(x, "alone"), "n_runs"] == 2
    assert "device_use" not in an.phase_cost_table(runs.drop(columns="device_use")).columns


def test_seed_scores_and_their_figure_for_the_registered_comparisons():
    """On the committed seeds20 records: one score per tested seed of every compared recipe, whose means are
    the table's recipe means; the figure has a panel per task and one interval row per comparison."""
    from grpo_knobs import plots
    from grpo_knobs.study import registered_analysis

    registered, _ = registered_analysis(ROOT / "results" / "seeds20", "seeds20")
    st = an.load_study(ROOT / "results" / "seeds20")
    table = an.preregistered_comparisons(st.runs, st.tests, registered)
    scores = an.seed_test_scores(st.runs, st.tests, registered)
    assert list(dict.fromkeys(zip(scores["task"], scores["arm"]))) == [
        ("countdown-2x10", "batch-256"),
        ("countdown-2x10", "onpolicy-small"),
        ("countdown-2x10", "split-8"),
        ("countdown-2x99", "group-32"),
        ("countdown-2x99", "batch-256"),
    ]
    means = scores.groupby(["task", "arm"])["test_pct"].mean()
    for r in table.itertuples():
        assert means[(r.task, r.x)] == pytest.approx(r.x_pct) and means[(r.task, r.y)] == pytest.approx(r.y_pct)
        assert (scores["arm"] == r.x).groupby(scores["task"]).sum()[r.task] == r.n_seeds_x
    fig = plots.preregistered_figure(scores, table, "t")
    assert [ax.get_title(loc="left") for ax in fig.axes[:2]] == ["countdown-2x10", "countdown-2x99"]
    assert len(fig.axes[2].get_yticks()) == len(table) == 4
    plt.close(fig)

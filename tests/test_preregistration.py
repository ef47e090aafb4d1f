"""Presets with fixed confirmation recipes and a registered analysis (the seeds20 preset): the plan,
what `grpo-knobs plan` prints, the checks on the analysis: section, and a study that refuses to go
on under another registered analysis or other library code."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from grpo_knobs import study
from grpo_knobs.cli import main as cli_main
from grpo_knobs.provenance import source_sha256
from grpo_knobs.records import RunDir
from grpo_knobs.study import notebooks as study_notebooks

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_study import _write_plan, needs_trainer

SEEDS20_RECIPES = {
    "countdown-2x10": ["onpolicy-small", "batch-256", "split-8"],
    "countdown-2x99": ["batch-256", "group-32"],
}
# What names a run rather than sets how it trains.
NAMING = ("run_id", "output_dir", "study")


def _fixed_plan(path: Path, analysis: dict | None = None, **changes) -> Path:
    """The tiny CPU plan of test_study with its recipes fixed, no screening, and (optionally) an analysis."""
    spec = {
        "screening": {"arms": []},
        "selection": {},
        "confirmation": {"seeds": [1, 2], "response_budget": 16, "recipes": ["t-small", "t-split"]},
        **({"analysis": analysis} if analysis is not None else {}),
        **changes,
    }
    return _write_plan(path, **spec)


ANALYSIS = {
    "responses": 16,
    "comparisons": {"split-vs-small": {"task": "countdown-2x10", "x": "t-split", "y": "t-small"}},
    "resamples": 200,
    "relabellings": 500,
}


def _two_run_plan(path: Path) -> Path:
    """Two fixed recipes, one seed each, tested on 4 problems right after training; no initial-model test."""
    return _fixed_plan(
        path,
        ANALYSIS,
        confirmation={"seeds": [1], "response_budget": 16, "recipes": ["t-small", "t-split"]},
        test={"problems": 4, "initial_model": False},
    )


# ---------------------------------------------------------------------------------------
# The seeds20 preset
# ---------------------------------------------------------------------------------------
def test_seeds20_runs_the_h200_mini_settings_on_twenty_fixed_seeds(tmp_path):
    p = study.plan("seeds20", study_dir=tmp_path)
    assert p.selected and not p.phase("screening") and not p.candidates
    runs = p.phase("confirmation")
    assert len(runs) == 100 and not any(r.placeholder for r in runs)
    for task, recipes in SEEDS20_RECIPES.items():
        mine = [r for r in runs if r.task == task]
        assert sorted({r.arm for r in mine}) == sorted(recipes)
        assert all(sorted(r.seed for r in mine if r.arm == arm) == list(range(1, 21)) for arm in recipes)
    assert {(r.config.deterministic, r.config.response_budget, r.config.lr) for r in runs} == {(True, 16_384, 2e-5)}
    assert len(p.tests) == 102 and {t.problems for t in p.tests} == {None}
    # Every setting but the run's name equals the h200-mini confirmation run of the same recipe and seed.
    mini = study.plan(
        "h200-mini",
        study_dir=tmp_path,
        selection={"recipes": {"countdown-2x10": SEEDS20_RECIPES["countdown-2x10"], "gsm8k": ["onpolicy-small"]}},
    )
    theirs = {(r.arm, r.seed): r.config.to_dict() for r in mini.phase("confirmation") if r.task == "countdown-2x10"}
    for r in runs:
        if r.task == "countdown-2x10" and r.seed <= 5:
            mine = {k: v for k, v in r.config.to_dict().items() if k not in NAMING}
            assert mine == {k: v for k, v in theirs[r.arm, r.seed].items() if k not in NAMING}, r.run_id
    reg = p.preregistration
    assert [(c.task, c.x, c.y) for c in reg.comparisons] == [
        ("countdown-2x10", "batch-256", "onpolicy-small"),
        ("countdown-2x10", "split-8", "onpolicy-small"),
        ("countdown-2x10", "batch-256", "split-8"),
        ("countdown-2x99", "group-32", "batch-256"),
    ]
    assert reg.seeds == {"countdown-2x10": list(range(1, 21)), "countdown-2x99": list(range(1, 21))}
    assert (reg.endpoint, reg.responses, reg.correction, reg.alpha, reg.alternative) == (
        "test_accuracy",
        16_384,
        "holm",
        0.05,
        "two-sided",
    )


def test_plan_prints_the_registered_analysis(tmp_path, capsys):
    assert cli_main(["plan", "seeds20", "--study-dir", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    block = table[table.index("Pre-registered analysis") :]
    for line in (
        "at 16,384 responses",
        "countdown-2x10: 1-20 (n = 20); countdown-2x99: 1-20 (n = 20)",
        "hierarchical bootstrap (seeds per recipe, then problems), 95%, 10,000 resamples",
        "two-sided; exact up to 200,000 relabellings, else 100,000 sampled",
        "Holm's step-down adjustment across all 4 comparisons, family-wise alpha 0.05",
    ):
        assert line in block, line
    assert re.search(r"\n    2x99-group-32-vs-batch-256 +countdown-2x99: group-32 versus batch-256\n", block)
    assert "Selection rule" not in table
    assert "fixed in the preset (not selected): countdown-2x10: onpolicy-small, batch-256, split-8" in table
    assert cli_main(["plan", "seeds20", "--json", "--study-dir", str(tmp_path)]) == 0
    rows = json.loads(capsys.readouterr().out)
    *planned, last = rows
    assert last["phase"] == "analysis" and len(last["preregistration"]["comparisons"]) == 4
    assert len(planned) == 202 and "preregistration" not in json.dumps(planned)
    assert cli_main(["plan", "h200-mini", "--json", "--study-dir", str(tmp_path)]) == 0
    assert all(r["phase"] != "analysis" for r in json.loads(capsys.readouterr().out))  # nothing registered


# ---------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change,message",
    [
        ({"analysis": ANALYSIS | {"power": 0.8}}, r"analysis: unknown key\(s\) \['power'\]"),
        (
            {"analysis": ANALYSIS | {"responses": 32}},
            r"analysis.responses is 32, but countdown-2x10's .* train for 16",
        ),
        ({"analysis": ANALYSIS | {"alpha": 1.5}}, r"analysis.alpha must be a number in \(0, 1\), got 1.5"),
        ({"analysis": ANALYSIS | {"resamples": 0}}, r"analysis.resamples must be a whole number above 0"),
        ({"analysis": ANALYSIS | {"alternative": "better"}}, r"analysis.alternative must be one of two-sided, gr"),
        ({"analysis": ANALYSIS | {"correction": "bonferroni"}}, r"analysis.correction must be one of holm"),
        ({"analysis": ANALYSIS | {"comparisons": {}}}, r"analysis.comparisons must map each comparison's name"),
        (
            {"analysis": ANALYSIS | {"comparisons": {"c": {"task": "countdown-2x10", "x": "t-split", "y": "t-big"}}}},
            r"analysis.comparisons.c: \['t-big'\] not among countdown-2x10's confirmation recipes",
        ),
        (
            {"analysis": ANALYSIS | {"comparisons": {"c": {"task": "gsm8k", "x": "t-split", "y": "t-small"}}}},
            r"analysis.comparisons.c: task 'gsm8k' is not one of the plan's tasks",
        ),
        (
            {
                "analysis": ANALYSIS
                | {
                    "comparisons": {
                        "a": {"task": "countdown-2x10", "x": "t-split", "y": "t-small"},
                        "b": {"task": "countdown-2x10", "x": "t-small", "y": "t-split"},
                    }
                }
            },
            r"analysis.comparisons.b: t-small versus t-split on countdown-2x10 is not a new pair",
        ),
        (
            {"screening": {"arms": ["t-small"]}},
            r"tasks.countdown-2x10: its confirmation recipes are fixed \(t-small, t-split\), so nothing is selected",
        ),
        (
            {"confirmation": {"seeds": [1], "response_budget": 16, "recipes": ["t-small", "t-huge"]}},
            r"confirmation \(countdown-2x10\): unknown arm 't-huge'",
        ),
        (
            {"confirmation": {"seeds": [1], "response_budget": 16, "recipes": ["t-small", "t-small"]}},
            r"recipes must be a non-empty list of distinct arm names",
        ),
    ],
)
def test_bad_fixed_recipes_or_analysis_name_the_key(tmp_path, capsys, change, message):
    path = _fixed_plan(tmp_path / "plan.yaml", **({"analysis": ANALYSIS} | change))
    with pytest.raises(study.PlanError, match=message):
        study.plan(path, study_dir=tmp_path / "s")
    assert cli_main(["plan", str(path), "--study-dir", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("grpo-knobs plan: error: ")


def test_a_comparison_needs_recipes_fixed_before_any_run(tmp_path):
    path = _write_plan(tmp_path / "plan.yaml", analysis=ANALYSIS)  # recipes chosen by selection
    with pytest.raises(
        study.PlanError, match=r"recipes are chosen by selection .*\(tasks.countdown-2x10.confirmation.recipes\)"
    ):
        study.plan(path, study_dir=tmp_path / "s")


def test_fixed_and_selected_tasks_in_one_plan(tmp_path):
    path = _write_plan(
        tmp_path / "plan.yaml",
        tasks={
            "countdown-2x10": {"targets": [5], "confirmation": {"recipes": ["t-split"]}, "screening": {"arms": []}},
            "countdown-3x10": {"targets": [5]},
        },
    )
    p = study.plan(path, study_dir=tmp_path / "s")
    assert p.candidates == {"countdown-3x10": ["t-small", "t-split"]} and not p.selected
    fixed = [r for r in p.phase("confirmation") if r.task == "countdown-2x10"]
    assert [(r.arm, r.placeholder) for r in fixed] == [("t-split", False)]
    assert all(r.placeholder for r in p.phase("confirmation") if r.task == "countdown-3x10")
    chosen = study.plan(path, study_dir=tmp_path / "s", selection={"recipes": {"countdown-3x10": ["t-small"]}})
    assert chosen.selected and {(r.task, r.arm) for r in chosen.phase("confirmation")} == {
        ("countdown-2x10", "t-split"),
        ("countdown-3x10", "t-small"),
    }


# ---------------------------------------------------------------------------------------
# A registered study keeps its analysis and its code
# ---------------------------------------------------------------------------------------
def test_a_registered_study_refuses_another_analysis_or_other_code(tmp_path, capsys):
    path = _fixed_plan(tmp_path / "plan.yaml", ANALYSIS)
    study_dir = tmp_path / "s"
    report = study.run_study(path, phases=["selection"], study_dir=study_dir, progress=False)
    assert [(r.phase, r.status) for r in report.results] == [("selection", "skipped")]  # nothing to select
    recorded = json.loads((study_dir / "plan.json").read_text())
    assert recorded["preregistration"]["comparisons"][0]["name"] == "split-vs-small"
    assert recorded["fixed_recipes"] == {"countdown-2x10": ["t-small", "t-split"]}
    assert recorded["code"]["source_sha256"] == source_sha256() and recorded["selection_rule"] is None
    before = (study_dir / "plan.json").read_bytes()

    _fixed_plan(path, ANALYSIS | {"alpha": 0.1})
    with pytest.raises(ValueError, match=r"records another registered analysis than the preset's \(alpha differ\)"):
        study.run_study(path, phases=["selection"], study_dir=study_dir, progress=False)
    assert cli_main(["study", str(path), "--study-dir", str(study_dir), "--phase", "confirmation"]) == 2
    assert "new --study-dir" in capsys.readouterr().err
    assert (study_dir / "plan.json").read_bytes() == before and not any(RunDir(d).state() for d in study_dir.iterdir())

    _fixed_plan(path, ANALYSIS)
    (study_dir / "plan.json").write_text(
        json.dumps(recorded | {"code": {"source_sha256": "0" * 64, "git_commit": "abc"}})
    )
    with pytest.raises(ValueError, match=r"come from library source 000000000000 \(git commit abc\), this library is"):
        study.run_study(path, phases=["selection"], study_dir=study_dir, progress=False)

    # A study without a registered analysis records its code and goes on under new code.
    plain = _write_plan(tmp_path / "plain.yaml")
    study.run_study(plain, phases=["lr-followup"], study_dir=tmp_path / "p", progress=False)
    snapshot = json.loads((tmp_path / "p" / "plan.json").read_text())
    (tmp_path / "p" / "plan.json").write_text(json.dumps(snapshot | {"code": {"source_sha256": "0" * 64}}))
    assert study.run_study(plain, phases=["lr-followup"], study_dir=tmp_path / "p", progress=False).ok


@needs_trainer
def test_a_fixed_recipe_study_trains_tests_and_times_its_runs(tmp_path):
    path = _two_run_plan(tmp_path / "plan.yaml")
    study_dir = tmp_path / "s"
    report = study.run_study(path, study_dir=study_dir, executor="inprocess", progress=False)
    assert report.ok, report.summary()
    assert [(r.run_id, r.status) for r in report.results] == [
        ("selection", "skipped"),
        ("confirmation-countdown-2x10-t-small-s1", "complete"),
        ("confirmation-countdown-2x10-t-split-s1", "complete"),
        ("confirmation-countdown-2x10-t-small-s1", "complete"),  # tested right after training
        ("confirmation-countdown-2x10-t-split-s1", "complete"),
    ]
    times = json.loads((study_dir / "study_times.json").read_text())["calls"]
    (call,) = times
    jobs = {
        r: json.loads(RunDir(study_dir / r).timings_path.read_text())["job"]
        for r in ("confirmation-countdown-2x10-t-small-s1", "confirmation-countdown-2x10-t-split-s1")
    }
    assert call["runs_trained"] == 2 and call["tests_run"] == 2 and call["scheduler"] == "local"
    assert call["run_job_seconds"] == pytest.approx(sum(jobs.values()))
    # One run at a time: the wall time holds both runs, their tests and the start-up.
    assert sum(jobs.values()) < call["wall_seconds"] and 0 < call["parallelism"] < 1
    assert {r: v["job_seconds"] for r, v in call["runs"].items()} == jobs
    assert call["gpus"] == [] and call["ray_nodes"] == [] and len(call["hosts"]) == 1
    assert f"Wall time {call['wall_seconds'] / 60:.1f} min for 2 trained runs" in report.summary()
    placement = json.loads(RunDir(study_dir / "confirmation-countdown-2x10-t-small-s1").config_path.read_text())[
        "placements"
    ]
    assert [(p["device"], p["gpu"], p["ray_node_id"]) for p in placement] == [("cpu", None, None)]
    again = study.run_study(path, study_dir=study_dir, executor="inprocess", progress=False)
    assert "no run trained in this call" in again.summary()
    assert len(json.loads((study_dir / "study_times.json").read_text())["calls"]) == 2
    # The registered analysis on the trained records: notebook 59 through papermill, one seed each.
    (executed,) = study.run_analysis(study_dir, tmp_path / "figs", notebooks=["59_preregistered"], progress=False)
    table = pd.read_csv(tmp_path / "figs" / "preregistered_comparisons.csv")
    assert table[["comparison", "x", "y", "n_seeds_x", "n_seeds_y", "n_problems", "complete"]].values.tolist() == [
        ["split-vs-small", "t-split", "t-small", 1, 1, 4, True]
    ]
    assert "1 library source(s)" in executed.read_text()
    assert (tmp_path / "figs" / "preregistered_seeds.png").stat().st_size > 0  # the seeds and intervals drawn


@needs_trainer
def test_a_study_call_cut_short_records_the_runs_it_finished(tmp_path):
    """SIGTERM, as a machine's time limit sends it, while the second run trains: the call still appends its
    entry to study_times.json, marked interrupted, with the run and the test it finished and their places."""
    confirmation = {"seeds": [1], "response_budget": 400, "recipes": ["t-small", "t-split"]}
    path = _fixed_plan(
        tmp_path / "plan.yaml", None, confirmation=confirmation, test={"problems": 4, "initial_model": False}
    )
    study_dir = tmp_path / "s"
    args = ["study", str(path), "--study-dir", str(study_dir), "--executor", "inprocess"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpo_knobs.cli", *args],
        env=study._subprocess_env(None),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    small, split = (RunDir(study_dir / f"confirmation-countdown-2x10-{a}-s1") for a in ("t-small", "t-split"))
    try:
        deadline = time.time() + 300
        while (split.state() or {}).get("collections_done", 0) < 1:
            assert proc.poll() is None, proc.communicate()
            assert time.time() < deadline, "the second run did not start"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    assert proc.returncode != 0 and "grpo-knobs study: interrupted" in err, err[-3000:]
    assert small.is_complete() and small.test_path.exists() and not split.is_complete()
    (call,) = json.loads((study_dir / "study_times.json").read_text())["calls"]
    assert call["interrupted"] is True and call["runs_trained"] == 1 and call["tests_run"] == 1
    job = json.loads(small.timings_path.read_text())["job"]
    assert list(call["runs"]) == [small.path.name] and call["runs"][small.path.name]["job_seconds"] == job
    assert job < call["wall_seconds"] and call["hosts"] and call["scheduler"] == "local"


@needs_trainer
def test_a_time_limit_leaves_runs_it_cannot_hold_for_the_next_call(tmp_path, capsys):
    """--time-limit on a machine held for a limited time: a recipe with no finished run to go by starts; once
    its runs have a recorded job time, a run that would end past the limit is left for a later call (no
    analysis then), and the next call with time to spare trains it."""
    path = _fixed_plan(tmp_path / "plan.yaml", None, test={"problems": 4, "initial_model": False})
    study_dir = tmp_path / "s"
    base = ["study", str(path), "--study-dir", str(study_dir), "--executor", "inprocess"]
    assert cli_main([*base, "--only", "*-s1", "--time-limit", "0.001"]) == 0  # nothing to go by: both train
    seed2 = [RunDir(study_dir / f"confirmation-countdown-2x10-{a}-s2") for a in ("t-small", "t-split")]
    capsys.readouterr()
    assert cli_main([*base, "--time-limit", "0.001"]) == 0
    out = capsys.readouterr().out
    assert "4 deferred" in out  # each run and its test job
    assert "2 run(s) left for a later call: its recipe's longest run took" in out and "BLOCKED" not in out
    assert not any(r.path.exists() for r in seed2) and not (study_dir / "figures").exists()
    calls = json.loads((study_dir / "study_times.json").read_text())["calls"]
    assert [c["runs_trained"] for c in calls] == [2, 0]
    report = study.run_study(path, study_dir=study_dir, executor="inprocess", progress=False, time_limit=3600)
    assert report.ok and not report.deferred and all(r.is_complete() for r in seed2)
    with pytest.raises(ValueError, match="time_limit must be a positive number of seconds"):
        study.run_study(path, study_dir=study_dir, progress=False, time_limit=0)
    with pytest.raises(ValueError, match="time_limit is for scheduler 'local'"):
        study.run_study(path, study_dir=study_dir, progress=False, time_limit=60, scheduler="ray")


def test_run_analysis_adds_notebook_59_where_the_study_registered_an_analysis(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(
        study_notebooks, "execute_notebook", lambda source, target, **kw: ran.append(Path(target).stem)
    )
    monkeypatch.setattr(study_notebooks, "_tidy_executed", lambda target, root: None)  # nothing was executed
    registered = tmp_path / "registered"
    study.run_study(_fixed_plan(tmp_path / "plan.yaml", ANALYSIS), phases=["selection"], study_dir=registered)
    study.run_analysis(registered, progress=False)
    assert ran == [*study.ANALYSIS_NOTEBOOKS, "59_preregistered"]
    ran.clear()
    study.run_study(_write_plan(tmp_path / "plain.yaml"), phases=["lr-followup"], study_dir=tmp_path / "plain")
    study.run_analysis(tmp_path / "plain", progress=False)
    assert ran == list(study.ANALYSIS_NOTEBOOKS)

"""Tracker output read back with the trackers' own readers: TensorBoard's EventAccumulator and trackio's storage."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("tensorboard", reason="the tracking extra is not installed (pip install -e '.[tracking]')")
pytest.importorskip("trackio", reason="the tracking extra is not installed (pip install -e '.[tracking]')")

from grpo_knobs import tracking  # noqa: E402
from grpo_knobs.analysis.loading import load_study  # noqa: E402
from grpo_knobs.config import RunConfig  # noqa: E402
from grpo_knobs.records import RunDir  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "results" / "h200-mini"
SYNTHETIC = ROOT / "tests" / "fixtures" / "synthetic_study"
# three shapes: S=1, S=4 with G=32, and S=2 with B=256
MINI_RUNS = (
    "screening-countdown-2x10-onpolicy-small-s0",
    "screening-countdown-2x10-group-32-s0",
    "screening-countdown-2x10-batch-256-s0",
)


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "grpo_knobs.cli", *args], capture_output=True, text=True, check=False, env=env, cwd=ROOT
    )


def _scalars(event_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of one run's event files, read by TensorBoard's own loader."""
    acc = EventAccumulator(str(event_dir), size_guidance={"scalars": 0})  # 0: keep every point
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _trackio_logs(directory: Path, project: str) -> dict[str, list[dict]]:
    """Every run's logs of a trackio project, read in a fresh process that finds the project the documented
    way (TRACKIO_DIR set before trackio is imported), through trackio's SQLiteStorage reader."""
    code = (
        "import json, sys; from trackio.sqlite_storage import SQLiteStorage as S; p = sys.argv[1]; "
        "print(json.dumps({r: S.get_logs(p, r) for r in S.get_runs(p)}, default=str))"
    )
    env = dict(os.environ, TRACKIO_DIR=str(directory))
    out = subprocess.run([sys.executable, "-c", code, project], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout)


def _series(logs: list[dict], tag: str) -> list[tuple[int, float]]:
    return [(row["step"], row[tag]) for row in logs if tag in row]


def _same(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> bool:
    """Equal steps, values equal to float32 precision (TensorBoard stores float32)."""
    assert [int(s) for s, _ in got] == [int(s) for s, _ in want]
    assert [v for _, v in got] == pytest.approx([float(v) for _, v in want], rel=1e-6, abs=1e-9)
    return True


@pytest.fixture(scope="module")
def mini_study(tmp_path_factory) -> Path:
    """A study directory holding three of the committed h200-mini runs (links, read only)."""
    study = tmp_path_factory.mktemp("h200-mini")
    for name in MINI_RUNS:
        (study / name).symlink_to(MINI / name, target_is_directory=True)
    return study


@pytest.fixture(scope="module")
def mini_tensorboard(mini_study, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tb")
    done = _cli("export", str(mini_study), "--to", "tensorboard", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "3 run(s) written" in done.stdout and f"tensorboard --logdir {out}" in done.stdout
    return out


def test_tensorboard_export_holds_the_records(mini_study, mini_tensorboard):
    study = load_study(mini_study)  # the analysis' own reading of the same records
    for name in MINI_RUNS:
        got = _scalars(mini_tensorboard / name)
        rows = RunDir(MINI / name).collections()
        assert _same(got["train/reward_mean"], [(r["responses"], r["reward_mean"]) for r in rows])
        assert [s for s, _ in got["train/truncation_fraction"]] == [r["responses"] for r in rows]
        frame = study.collections[study.collections["run_id"] == name]
        assert [v for _, v in got["update/clip_fraction_mean"]] == pytest.approx(frame["clip_fraction_mean"].tolist())
        assert [v for _, v in got["update/grad_norm_mean"]] == pytest.approx(frame["grad_norm_mean"].tolist())
        assert [v for _, v in got["time/generation_seconds"]] == pytest.approx(frame["generation_seconds"].tolist())
        curve = study.curves[study.curves["run_id"] == name]
        assert _same(got["validation/accuracy"], list(zip(curve["responses"], curve["accuracy"])))
        # every update at the responses it had consumed: S of them per collection, B apart
        b, s = rows[0]["responses"] // len(rows[0]["per_update"]), len(rows[0]["per_update"])
        updates = got["update/each/grad_norm"]
        assert len(updates) == len(rows) * s
        assert [step for step, _ in updates][:s] == [b * (k + 1) for k in range(s)]
        assert [v for _, v in updates] == pytest.approx([u["grad_norm"] for r in rows for u in r["per_update"]])
        totals = json.loads((MINI / name / "timings.json").read_text())
        assert _same(got["total/job_seconds"], [(rows[-1]["responses"], totals["job"])])


@pytest.mark.parametrize("x", ["updates", "seconds"])
def test_tensorboard_x_axes(mini_study, tmp_path, x):
    name = MINI_RUNS[1]
    done = _cli("export", str(MINI / name), "--to", "tensorboard", "--x", x, "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    got = _scalars(tmp_path / name)
    rows = RunDir(MINI / name).collections()
    want = [r["updates"] if x == "updates" else round(1000 * r["active_seconds"]) for r in rows]
    assert [s for s, _ in got["train/reward_mean"]] == want
    evals = RunDir(MINI / name).evals().groupby("responses").first()
    want = evals["updates"].tolist() if x == "updates" else [round(1000 * v) for v in evals["active_seconds"]]
    assert [s for s, _ in got["validation/accuracy"]] == want
    if x == "updates":
        assert [s for s, _ in got["update/each/approx_kl"]] == [u["update"] for r in rows for u in r["per_update"]]
    else:
        assert "update/each/approx_kl" not in got  # updates inside a collection have no time of their own


def test_trackio_export_is_read_by_trackio(mini_study, mini_tensorboard, tmp_path):
    done = _cli("export", str(mini_study), "--to", "trackio", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "h200-mini.db").is_file()
    logs = _trackio_logs(tmp_path, "h200-mini")
    assert sorted(logs) == sorted(MINI_RUNS)
    for name in MINI_RUNS:
        board = _scalars(mini_tensorboard / name)
        for tag in ("train/reward_mean", "train/mixed_group_fraction", "validation/accuracy", "update/approx_kl_mean"):
            assert _same(_series(logs[name], tag), board[tag]), tag
    with tracking.trackio_directory(tmp_path) as storage:  # the same store from this process
        config = storage.get_run_config("h200-mini", MINI_RUNS[0])
    assert config["global_batch_size"] == 128 and config["n_samples_per_prompt"] == 8


def test_synthetic_study_exports_every_run(tmp_path):
    runs = tracking.run_directories(SYNTHETIC)
    assert len(runs) >= 30 and not any(r.name.startswith("initial-") for r in runs)
    for kind in tracking.KINDS:
        done = _cli(
            "export",
            str(SYNTHETIC),
            "--to",
            kind,
            "--x",
            "updates",
            "--project",
            "synthetic",
            "--out",
            str(tmp_path / kind),
        )
        assert done.returncode == 0, done.stderr
        assert f"{len(runs)} run(s) written" in done.stdout
    logs = _trackio_logs(tmp_path / "trackio", "synthetic")
    assert sorted(logs) == sorted(r.name for r in runs)
    for run in runs[:: max(1, len(runs) // 5)]:
        rows = RunDir(run).collections()
        board = _scalars(tmp_path / "tensorboard" / run.name)
        want = [(r["updates"], r["reward_mean"]) for r in rows]
        assert _same(board["train/reward_mean"], want)
        assert _same(_series(logs[run.name], "train/reward_mean"), want)
        test = pd.read_parquet(run / "test.parquet") if (run / "test.parquet").is_file() else None
        if test is not None:
            assert _same(board["test/accuracy"], [(int(test["updates"].iloc[0]), test["correct"].mean())])


def test_export_refuses_bad_input(tmp_path):
    empty = _cli("export", str(tmp_path), "--to", "tensorboard")
    assert empty.returncode == 2 and "holds no run directories" in empty.stderr and len(empty.stderr.splitlines()) == 1
    missing = _cli("export", str(tmp_path / "nope"), "--to", "trackio")
    assert missing.returncode == 2 and "is not a directory" in missing.stderr
    assert _cli("export", str(tmp_path), "--to", "wandb").returncode == 2


def _feed(tracker: tracking.Tracker, run: RunDir) -> None:
    """Replay a recorded run through the live interface, in the order the trainer writes it."""
    evals = run.evals()
    by_responses = {r: g for r, g in evals.groupby("responses")}
    tracker.log_eval(by_responses.pop(0).to_dict("records"))
    for row in run.collections():
        tracker.log_collection(row)
        if row["responses"] in by_responses:
            tracker.log_eval(by_responses.pop(row["responses"]).to_dict("records"))
    tracker.close()


@pytest.mark.parametrize("kind", tracking.KINDS)
def test_live_tracker_matches_the_records(tmp_path, kind):
    name = MINI_RUNS[2]
    run = RunDir(MINI / name)
    tracker = tracking.Tracker(kind, tmp_path / kind, name, project="live", batch_size=256)
    assert not (tmp_path / kind).exists()  # nothing is created before the first point
    _feed(tracker, run)
    rows = run.collections()
    want = [(r["responses"], r["mixed_group_fraction"]) for r in rows]
    if kind == "tensorboard":
        got = _scalars(tmp_path / kind / name)
        series = {tag: got[tag] for tag in ("train/mixed_group_fraction", "validation/accuracy")}
    else:
        logs = _trackio_logs(tmp_path / kind, "live")[name]
        series = {tag: _series(logs, tag) for tag in ("train/mixed_group_fraction", "validation/accuracy")}
    assert _same(series["train/mixed_group_fraction"], want)
    curve = run.evals().groupby("responses")["correct"].mean()
    assert _same(series["validation/accuracy"], list(curve.items()))


def test_open_tracker_follows_the_run_config(tmp_path):
    none = tracking.open_tracker(RunConfig(output_dir=str(tmp_path)))
    assert isinstance(none, tracking.NullTracker) and none.log_collection({}) == 0
    cfg = RunConfig(output_dir=str(tmp_path), run_id="r1", tracker="tensorboard")
    tracker = tracking.open_tracker(cfg)
    row = RunDir(MINI / MINI_RUNS[0]).collections()[0]
    assert tracker.log_collection(row) == 2  # the collection's point and its one update's
    tracker.close()
    events = list((tmp_path / "r1" / "tracking" / "tensorboard" / "r1").glob("events.out.tfevents.*"))
    assert len(events) == 1
    elsewhere = RunConfig(
        output_dir=str(tmp_path), run_id="r2", tracker="trackio", tracking_dir=str(tmp_path / "tio"), study="mine"
    )
    with tracking.open_tracker(elsewhere) as tracker:
        tracker.log_collection(row)
    assert _series(_trackio_logs(tmp_path / "tio", "mine")["r2"], "train/reward_mean") == [(128, row["reward_mean"])]
    with pytest.raises(ValueError, match="tracker must be one of"):
        RunConfig(tracker="wandb")


def test_points_skip_absent_values_and_keep_new_fields():
    row = dict(
        RunDir(MINI / MINI_RUNS[0]).collections()[0],
        logprob_mismatch=None,
        peak_memory_gib=float("nan"),
        entropy_mean=1.25,
        zero_advantage_fraction=0.5,
    )
    (step, values), *_ = tracking.collection_points(row, "responses", 128)
    assert step == 128 and "train/logprob_mismatch" not in values and "train/peak_memory_gib" not in values
    assert values["train/entropy_mean"] == 1.25 and values["train/zero_advantage_fraction"] == 0.5
    assert all(math.isfinite(v) for v in values.values())
    assert np.isclose(values["time/active_seconds"], row["active_seconds"])


@pytest.mark.slow
def test_training_with_a_live_tracker(tmp_path):
    """A real (tiny, CPU) run with tracker=tensorboard: the event files hold its records, the records are unchanged."""
    from grpo_knobs.trainer import train
    from test_trainer import tiny_cfg

    cfg = tiny_cfg(tmp_path, response_budget=32, eval_every_responses=16, tracker="tensorboard")
    run = RunDir(train(cfg, progress=False))
    got = _scalars(run.path / "tracking" / "tensorboard" / "tiny")
    rows = run.collections()
    assert _same(got["train/reward_mean"], [(r["responses"], r["reward_mean"]) for r in rows])
    curve = run.evals().groupby("responses")["correct"].mean()
    assert _same(got["validation/accuracy"], list(curve.items()))
    assert {p.name for p in run.path.iterdir()} >= {"config.json", "collections.jsonl", "evals.parquet", "tracking"}

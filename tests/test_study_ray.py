"""Studies under ``--scheduler ray`` on a real local Ray instance: the records equal the local
scheduler's, a killed Ray worker's run is retried and resumed, and each run asks for the GPUs
and CPUs its config needs."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from grpo_knobs import study
from grpo_knobs.cli import main as cli_main
from grpo_knobs.records import RunDir
from grpo_knobs.study import run as study_run
from grpo_knobs.study import scheduling
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_preregistration import _two_run_plan
from test_study import _mtimes, _write_plan, needs_trainer

needs_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install -e '.[ray]')"
)
# A small local instance, as a CI machine affords; each tiny CPU run asks for one core.
RAY_INIT = {"address": "local", "num_cpus": 2, "include_dashboard": False, "log_to_driver": False}
TIMING_KEYS = ("seconds", "active_seconds", "job_seconds", "peak_memory_gib")  # of a collection row
EVAL_TIMINGS = ("active_seconds", "job_seconds")  # of an evaluation or test row
CONFIG_RECORD_KEYS = ("data", "model", "plan", "rollout_path", "source_sha256", "device")


def _records(run_dir: Path) -> dict:
    """Everything a run records except its timings, its host and where it lives."""
    run = RunDir(run_dir)
    conf = json.loads(run.config_path.read_text())
    evals = run.evals().drop(columns=list(EVAL_TIMINGS))
    weights = load_file(run.final_path / "model.safetensors")
    return {
        "state": run.state(),
        "collections": [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in run.collections()],
        "evals": evals.to_dict("records"),
        "config": {k: v for k, v in conf["config"].items() if k not in ("output_dir", "resume")},
        "record": {k: conf[k] for k in CONFIG_RECORD_KEYS},
        "weights": {k: v.numpy().tobytes() for k, v in weights.items()},
    }


def _assert_same_records(a: Path, b: Path) -> None:
    ra, rb = _records(a), _records(b)
    assert ra["collections"] and ra["weights"]
    for key in ra:
        assert ra[key] == rb[key], f"{a.name}: {key} differs"


def _statuses(report: study.StudyReport) -> list[tuple[str, str, str]]:
    return [(r.run_id, r.phase, r.status) for r in report.results]


def _local_reference(path: Path, study_dir: Path, monkeypatch, **kw) -> study.StudyReport:
    """The local scheduler's worker processes, one torch thread each, as a Ray task of one CPU gets."""
    monkeypatch.setattr(study_run.os, "cpu_count", lambda: 2)
    return study.run_study(path, jobs=2, study_dir=study_dir, executor="inprocess", progress=False, **kw)


@pytest.fixture
def local_ray(request):
    """A local Ray instance; ``@pytest.mark.parametrize("local_ray", [{...}], indirect=True)`` adds to its settings."""
    ray = pytest.importorskip("ray")
    ray.init(**RAY_INIT | getattr(request, "param", {}))
    yield ray
    ray.shutdown()


# ---------------------------------------------------------------------------------------
# Resource requests and bad input (no Ray instance)
# ---------------------------------------------------------------------------------------
def test_each_run_asks_for_the_gpus_its_config_needs(tmp_path, capsys):
    assert cli_main(["plan", "paper", "--json", "--study-dir", str(tmp_path)]) == 0
    rows = json.loads(capsys.readouterr().out)
    runs = [r for r in rows if r["phase"] != "test"]
    assert len(runs) == 41 and all(r["resources"] == {"gpus": 2, "cpus": 8} for r in runs)  # SGLang + trainer
    assert all(r["resources"] == {"gpus": 1, "cpus": 4} for r in rows if r["phase"] == "test")
    assert cli_main(["plan", "smoke", "--json", "--study-dir", str(tmp_path)]) == 0
    assert {json.dumps(r["resources"]) for r in json.loads(capsys.readouterr().out)} == {'{"gpus": 0, "cpus": 1}'}
    hf = {"device": "auto", "engine": "hf"}
    assert scheduling.config_resources(hf) == scheduling.Resources(1, 4)
    assert scheduling.config_resources(hf, cluster_has_gpus=False) == scheduling.Resources(0, 1)
    assert (
        scheduling.config_resources({"device": "cuda", "engine": "sglang", "engine_url": "http://h:30000"}).gpus == 1
    )


def test_scheduler_choices_are_checked_before_anything_starts(tmp_path, capsys):
    path = _write_plan(tmp_path / "plan.yaml")
    with pytest.raises(ValueError, match="scheduler must be one of"):
        study.run_study(path, study_dir=tmp_path / "s", scheduler="slurm", progress=False)
    assert cli_main(["study", str(path), "--study-dir", str(tmp_path / "s"), "--ray-address", "auto"]) == 2
    assert "add --scheduler ray" in capsys.readouterr().err
    if importlib.util.find_spec("ray") is not None:
        assert (
            cli_main(["study", str(path), "--study-dir", str(tmp_path / "s"), "--scheduler", "ray", "--jobs", "2"])
            == 2
        )
        assert "Drop --jobs" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_a_run_no_node_can_hold_fails_at_once():
    with pytest.raises(ValueError, match=r"run r needs 2 GPU\(s\) on one node.* largest node has 1"):
        scheduling._fit(scheduling.Resources(2, 8), [(1, 16), (0, 64)], "r")
    assert scheduling._fit(scheduling.Resources(1, 4), [(1, 2)], "r") == scheduling.Resources(1, 2)
    # 8 GPUs and 16 cores: four SGLang runs side by side, not two
    assert scheduling._fit(scheduling.Resources(2, 8), [(8, 16)], "r") == scheduling.Resources(2, 4)
    assert scheduling._fit(scheduling.Resources(0, 1), [(0, 2)], "r") == scheduling.Resources(0, 1)


# ---------------------------------------------------------------------------------------
# Real studies on a local Ray instance
# ---------------------------------------------------------------------------------------
@pytest.mark.slow
@needs_ray
@needs_trainer
def test_ray_study_records_equal_the_local_schedulers(tmp_path, monkeypatch, local_ray):
    bad = "lr-followup-countdown-2x10-t-small-s0"
    path = _write_plan(
        tmp_path / "plan.yaml",
        lr_followup=[{"task": "countdown-2x10", "arm": "t-small", "seeds": [0], "model": "no-such-model"}],
    )
    phases = ["screening", "selection", "confirmation", "test"]
    local = _local_reference(path, tmp_path / "local", monkeypatch, phases=phases)
    assert local.ok, local.summary()
    on_ray = study.run_study(
        path, phases=phases, study_dir=tmp_path / "ray", executor="inprocess", scheduler="ray", progress=False
    )
    assert on_ray.ok, on_ray.summary()
    assert _statuses(on_ray) == _statuses(local) and len(on_ray.results) == 8  # 4 runs, selection, 3 test jobs
    p = study.plan(path, study_dir=tmp_path / "ray")
    runs = [r for r in p.runs if r.phase in phases]
    assert [r.run_id for r in p.phase("confirmation")] == [
        r.run_id for r in study.plan(path, study_dir=tmp_path / "local").phase("confirmation")
    ]
    for r in runs:
        _assert_same_records(tmp_path / "local" / r.run_id, tmp_path / "ray" / r.run_id)
        log = (tmp_path / "ray" / ".logs" / f"{r.run_id}.log").read_text()
        assert "ray worker start" in log and "1 threads" in log
    for job in p.tests:
        a, b = (
            pd.read_parquet(RunDir(tmp_path / d / job.run_id).test_path).drop(columns=list(EVAL_TIMINGS))
            for d in ("local", "ray")
        )
        pd.testing.assert_frame_equal(a, b)
    before = {r.run_id: _mtimes(tmp_path / "ray" / r.run_id) for r in runs}
    again = study.run_study(
        path, phases=phases, study_dir=tmp_path / "ray", executor="inprocess", scheduler="ray", progress=False
    )
    assert {r.status for r in again.results} == {"skipped"}
    assert {r.run_id: _mtimes(tmp_path / "ray" / r.run_id) for r in runs} == before
    # A run that fails inside its task is recorded, not retried: here its executed notebook.
    failed = study.run_study(
        path, phases=["lr-followup"], study_dir=tmp_path / "ray", executor="papermill", scheduler="ray", progress=False
    )
    (failure,) = failed.failed
    assert failure.run_id == bad and "no-such-model" in failure.error
    record = Path(failure.record)
    assert record == tmp_path / "ray" / bad / "10_train.failed.ipynb" and "no-such-model" in record.read_text()
    assert len(re.findall("ray worker start", (tmp_path / "ray" / ".logs" / f"{bad}.log").read_text())) == 1


@pytest.mark.slow
@needs_ray
@needs_trainer
def test_a_killed_ray_worker_is_retried_and_its_run_resumed(tmp_path, monkeypatch):
    path = _write_plan(tmp_path / "plan.yaml", screening={"arms": ["t-small", "t-split"], "response_budget": 64})
    run_id = "screening-countdown-2x10-t-split-s0"  # 4 collections of 16, resumable after each
    study_dir = tmp_path / "ray"
    code = (
        "import sys, ray; from grpo_knobs.study import run_study; "
        f"ray.init(**{RAY_INIT!r}); "
        f"r = run_study({str(path)!r}, phases=['screening'], only=[{run_id!r}], study_dir={str(study_dir)!r}, "
        "executor='inprocess', scheduler='ray', progress=False); "
        "print(r.summary()); sys.exit(0 if r.ok else 1)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=study._subprocess_env(None),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    run, log = RunDir(study_dir / run_id), study_dir / ".logs" / f"{run_id}.log"
    try:
        deadline = time.time() + 300
        while (run.state() or {}).get("collections_done", 0) < 2:  # half-way, past a saved resume state
            assert proc.poll() is None, proc.stdout.read()
            assert time.time() < deadline, "the run did not get half-way"
            time.sleep(0.05)
        (worker,) = map(int, re.findall(r"ray worker start \(pid (\d+)", log.read_text()))
        os.kill(worker, signal.SIGKILL)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.terminate()  # the driver's ray.shutdown() stops the instance it started
            proc.wait(timeout=60)
    assert proc.returncode == 0, out
    assert "1 complete" in out
    headers = re.findall(r"ray worker start \(pid (\d+)", log.read_text())
    assert len(headers) == 2 and int(headers[1]) != worker  # retried in a fresh worker
    assert json.loads(run.config_path.read_text())["config"]["resume"] is True  # continued, not restarted
    first, retry = json.loads(run.config_path.read_text())["placements"]  # the first start, then the resume
    assert first["pid"] == worker and retry["pid"] == int(headers[1]) and first["ray_node_id"] == retry["ray_node_id"]
    reference = _local_reference(path, tmp_path / "local", monkeypatch, phases=["screening"], only=[run_id])
    assert reference.ok, reference.summary()
    _assert_same_records(tmp_path / "local" / run_id, run.path)


@pytest.mark.slow
@needs_ray
@needs_trainer
@pytest.mark.parametrize("local_ray", [{"num_gpus": 4}], indirect=True)
def test_gpu_runs_get_the_gpus_they_ask_for(tmp_path, local_ray):
    """Four GPUs declared to Ray on a CPU machine: each CUDA run is handed its own devices, then fails
    at once on finding no CUDA, which is recorded like any run's failure and not retried."""
    path = _write_plan(tmp_path / "plan.yaml")
    runs = study.plan(path, study_dir=tmp_path / "study").phase("screening")
    engines = {runs[0].run_id: "sglang", runs[1].run_id: "hf"}
    units = [
        {
            "kind": "train",
            "executor": "inprocess",
            "config": r.config.to_dict() | {"device": "cuda", "engine": engines[r.run_id]},
        }
        for r in runs
    ]
    results = scheduling.execute_on_ray(units, "screening", progress=False)
    assert [r.run_id for r in results] == [r.run_id for r in runs] and {r.status for r in results} == {"failed"}
    assert all("CUDA is not available" in r.error for r in results)
    for run_id, engine in engines.items():
        (gpus,) = re.findall(
            r"ray worker start \(pid \d+, node [^,]+, GPUs \[([^\]]*)\], 1 threads\)",  # 2 cores / 4 GPUs
            (tmp_path / "study" / ".logs" / f"{run_id}.log").read_text(),
        )
        assert len(gpus.split(",")) == (2 if engine == "sglang" else 1)  # SGLang + trainer, or the trainer alone


@pytest.mark.slow
@needs_ray
@needs_trainer
def test_ctrl_c_cancels_queued_ray_tasks_and_interrupts_running_ones(tmp_path):
    """Four runs on a two-core Ray instance: two run, two wait; a Ctrl-C starts neither waiting run and
    ends the running ones recorded as interrupted and resumable."""
    screening = {
        "arms": ["t-small", "t-split"],
        "seeds": [0, 1],
        "response_budget": 160,  # 20 and 10 collections: none ends before the Ctrl-C
        "eval_every_responses": 80,
        "resume_every_collections": 1,
    }
    path = _write_plan(tmp_path / "plan.yaml", screening=screening)
    study_dir = tmp_path / "ray"
    code = f"import sys, ray; from grpo_knobs.cli import main; ray.init(**{RAY_INIT!r}); sys.exit(main(sys.argv[1:]))"
    args = ["study", str(path), "--study-dir", str(study_dir), "--phase", "screening", "--scheduler", "ray"]
    args += ["--executor", "inprocess"]
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env=study._subprocess_env(None),
        start_new_session=True,  # a terminal's foreground job: its own process group
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    runs = [RunDir(study_dir / f"screening-countdown-2x10-{a}-s{s}") for a in ("t-small", "t-split") for s in (0, 1)]
    try:
        deadline = time.time() + 300
        while len(running := [r for r in runs if (r.state() or {}).get("collections_done", 0) >= 1]) < 2:
            assert proc.poll() is None, proc.communicate()
            assert time.time() < deadline, "two runs did not start"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("grpo-knobs")]
    assert len(lines) == 1 and lines[0].startswith("grpo-knobs study: interrupted; to continue:"), err[-3000:]
    for run in running:
        state = run.state()
        assert state["status"] == "failed" and state["error"] == "interrupted", (run.path.name, state)
        assert run.latest_resume_state() is not None
    assert [r for r in runs if r not in running and r.path.exists()] == [], "a queued run started"


def test_ray_runs_record_their_node_and_the_study_its_wall_time(tmp_path, local_ray):
    path = _two_run_plan(tmp_path / "plan.yaml")
    study_dir = tmp_path / "ray"
    report = study.run_study(path, study_dir=study_dir, executor="inprocess", scheduler="ray", progress=False)
    assert report.ok, report.summary()
    node = local_ray.get_runtime_context().get_node_id()  # the local instance's one node
    runs = [r.run_id for r in study.plan(path, study_dir=study_dir).phase("confirmation")]
    jobs = {}
    for run_id in runs:
        run = RunDir(study_dir / run_id)
        (where,) = json.loads(run.config_path.read_text())["placements"]
        assert (where["hostname"], where["ray_node_id"], where["device"], where["gpu"]) == (
            socket.gethostname(),
            node,
            "cpu",
            None,
        )
        assert where["ray_task_id"] and where["pid"] != os.getpid()  # a Ray worker's process, not the driver
        jobs[run_id] = json.loads(run.timings_path.read_text())["job"]
    (call,) = json.loads((study_dir / "study_times.json").read_text())["calls"]
    assert (call["scheduler"], call["runs_trained"], call["tests_run"]) == ("ray", 2, 2)
    assert call["ray_nodes"] == [node] and call["hosts"] == [socket.gethostname()] and call["gpus"] == []
    assert call["run_job_seconds"] == pytest.approx(sum(jobs.values()))
    # Two one-core runs side by side on two cores: the wall time holds the longer run, and the job
    # times add up to at most twice the wall time.
    assert max(jobs.values()) < call["wall_seconds"] and 0 < call["parallelism"] <= 2
    assert "2 trained runs whose job times sum to" in report.summary() and "on 1 host;" in report.summary()


def test_placement_names_the_gpu_as_cuda_visible_devices_exposes_it(monkeypatch):
    """The GPU fields on a CPU machine: CUDA's device properties stand in for the second of two GPUs
    a scheduler exposed (on a GPU machine the same fields come from the device)."""
    import torch
    from grpo_knobs import provenance

    props = SimpleNamespace(name="NVIDIA H200", uuid="GPU-5f0e", pci_bus_id=0x9B)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,6")
    monkeypatch.setenv(provenance.RAY_NODE_ENV, "node-a")
    where = provenance.placement(torch.device("cuda"))
    assert where["gpu"] == {
        "name": "NVIDIA H200",
        "index": 1,
        "visible_id": "6",
        "uuid": "GPU-5f0e",
        "pci_bus_id": 0x9B,
    }
    assert (where["cuda_visible_devices"], where["ray_node_id"], where["device"]) == ("3,6", "node-a", "cuda")
    assert provenance.placement(torch.device("cuda", 0))["gpu"]["visible_id"] == "3"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert provenance.placement(torch.device("cuda", 0))["gpu"]["visible_id"] is None  # every GPU visible
    assert provenance.placement(torch.device("cpu"))["gpu"] is None


def test_the_ray_run_on_an_h200_records_its_gpu_node_and_wall_time():
    """results/ray-h200: a seeds20 run through ``--scheduler ray`` on one H200, Ray holding the GPU as the
    run's resource. The run names the GPU by UUID, as Ray exposed it, with the Ray node and task; the study's
    times name the same GPU and node and set the run's job time against the study's wall time."""
    root = Path(__file__).resolve().parents[1] / "results" / "ray-h200"
    run = root / "confirmation-countdown-2x10-batch-256-s1"
    config = json.loads((run / "config.json").read_text())
    (placement,) = config["placements"]
    assert placement["device"] == "cuda" and placement["cuda_visible_devices"] == "0"
    assert placement["gpu"]["name"] == "NVIDIA H200" and re.fullmatch(r"[0-9a-f-]{36}", placement["gpu"]["uuid"])
    assert placement["ray_node_id"] and placement["ray_task_id"]
    assert json.loads((run / "state.json").read_text())["status"] == "complete" and (run / "test.parquet").exists()
    (call,) = json.loads((root / "study_times.json").read_text())["calls"]
    job = json.loads((run / "timings.json").read_text())["job"]
    assert call["scheduler"] == "ray" and call["runs_trained"] == 1
    assert call["gpus"] == [placement["gpu"]["uuid"]] and call["ray_nodes"] == [placement["ray_node_id"]]
    assert call["runs"][run.name]["job_seconds"] == call["run_job_seconds"] == job
    assert job < call["wall_seconds"] and call["parallelism"] == pytest.approx(job / call["wall_seconds"])

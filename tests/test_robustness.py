"""Bad input, bad records, bad numbers, full disks and Ctrl-C, each through the real command line:
nothing escapes its directory, nothing non-finite trains, every failure is one line."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from grpo_knobs.config import RunConfig
from grpo_knobs.locations import MANIFESTS, NOTEBOOKS
from grpo_knobs.locks import exclusive, run_lock_path, study_lock_path
from grpo_knobs.records import RecordsError, RunDir, read_collections

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from test_hardening import _assert_same_records, _env, _foreground_job, _start_cli, _wait_for  # noqa: E402
from test_study import _write_plan  # noqa: E402
from test_trainer import tiny_cfg  # noqa: E402

# A real run's records (128 collections of 64 responses), copied before anything is done to them.
RECORDED_RUN = ROOT / "results" / "h200-mini" / "screening-countdown-2x10-onpolicy-small-s0"


def _cli(*args: str, cwd: Path, code: str = "", timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """``grpo-knobs ARGS`` in a fresh process; ``code`` runs first in it (a test hook, e.g. a patch)."""
    main = "import sys\nfrom grpo_knobs.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code) + "\n" + main, *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )


def _one_error_line(proc: subprocess.CompletedProcess, command: str, pattern: str, code: int = 2) -> str:
    """The process failed with exactly one ``grpo-knobs COMMAND: ...`` line matching ``pattern``, no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr and "unexpected error" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("grpo-knobs")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith(f"grpo-knobs {command}: "), lines[0]
    assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` and its sha256 (links as their targets)."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            out[str(path.relative_to(root))] = "-> " + os.readlink(path)
        elif path.is_file():
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[str(path.relative_to(root))] = "dir"
    return out


def _train_args(cfg: RunConfig, **changes) -> list[str]:
    values = cfg.to_dict() | changes
    return ["train", "--no-progress", *[a for k, v in values.items() if v is not None for a in ("-p", f"{k}={v}")]]


def _elsewhere(cfg: RunConfig, tmp_path: Path) -> RunConfig:
    """``cfg`` with its run directory under ``tmp_path/study``."""
    return RunConfig.from_dict(cfg.to_dict() | {"output_dir": str(tmp_path / "study")})


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted tiny run, 4 collections, resumable state after each."""
    from grpo_knobs.trainer import train

    cfg = tiny_cfg(
        tmp_path_factory.mktemp("ref"), response_budget=64, eval_every_responses=32, resume_every_collections=1
    )
    return cfg, RunDir(train(cfg, progress=False))


# ----------------------------------------------------------------------------- containment
def test_an_arm_or_run_id_cannot_lead_a_run_outside_output_dir(tmp_path):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    out = work / "out"
    before = _tree(tmp_path)
    common = ["-p", "model=tiny-random", "-p", "device=cpu", "-p", f"output_dir={out}"]
    proc = _cli("train", *common, "-p", "run_id=", "-p", "arm=x/../../../escape", cwd=work)
    _one_error_line(proc, "train", r"run directory name .*x/\.\./\.\./\.\./escape.* choose such an arm name")
    proc = _cli("train", *common, "-p", "run_id=../escape", cwd=work)
    _one_error_line(proc, "train", r"run_id '\.\./escape' must be 1-128 letters")
    # a planted symbolic link named like the run does not lead it elsewhere either
    out.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (out / "linked").symlink_to(tmp_path / "elsewhere")
    before = _tree(tmp_path)
    proc = _cli("train", *common, "-p", "run_id=linked", cwd=work)
    _one_error_line(proc, "train", r"resolves to .*elsewhere, outside .*out; nothing is written there")
    assert _tree(tmp_path) == before


def test_test_eval_writes_only_inside_the_study(tmp_path):
    study = tmp_path / "study"
    proc = _cli(
        "test-eval", "--study-dir", str(study), "--run-id", "../escape", "--task", "countdown-2x10",
        "--model", "tiny-random", "--problems", "2", "--device", "cpu", cwd=tmp_path,
    )  # fmt: skip
    _one_error_line(proc, "test-eval", r"run_id '\.\./escape' must be")
    assert _tree(tmp_path) == {}


def test_a_plan_cannot_name_its_study_outside_the_runs_folder(tmp_path):
    plan = _write_plan(tmp_path / "plan.yaml", name="../../escape")
    proc = _cli("plan", str(plan), cwd=tmp_path)
    _one_error_line(proc, "plan", r"the study name '\.\./\.\./escape' must be 1-128 letters")
    proc = _cli("study", str(plan), "--executor", "inprocess", cwd=tmp_path)
    _one_error_line(proc, "study", r"the study name '\.\./\.\./escape'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.yaml"]


def test_a_run_named_study_and_the_study_have_their_own_locks(tmp_path):
    """The run lock and the study lock once shared .locks/study.lock: each refused the other, misleadingly."""
    cfg = tiny_cfg(tmp_path, run_id="study", response_budget=16, eval_every_responses=16)
    assert run_lock_path(cfg.output_dir, "study") != study_lock_path(cfg.output_dir)
    with exclusive(study_lock_path(cfg.output_dir), "a study"):  # a study holds its directory
        proc = _cli(*_train_args(cfg), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert RunDir(cfg.run_dir).is_complete()


# ----------------------------------------------------------------------------- non-finite values
@pytest.mark.parametrize("param", ["lr=inf", "temperature=nan", "grad_clip=-inf", "clip_high=1e400"])
def test_non_finite_settings_are_refused(tmp_path, param):
    proc = _cli("train", "-p", param, "-p", f"output_dir={tmp_path / 'out'}", cwd=tmp_path)
    _one_error_line(proc, "train", rf"{param.split('=')[0]} must be a finite number, got -?(inf|nan)\.")
    assert not (tmp_path / "out").exists()


def test_every_float_setting_must_be_finite():
    from grpo_knobs.cli import main
    from grpo_knobs.config import field_types

    floats = [name for name, kind in field_types().items() if kind is float]
    assert len(floats) >= 12
    for name in floats:
        for value in ("nan", "inf", "-inf", "1e999"):
            with pytest.raises(ValueError, match=rf"{name} must be a finite number"):
                RunConfig.from_dict({name: value})
            with pytest.raises(ValueError, match=rf"{name} must be a finite number"):
                RunConfig(**{name: float(value)})
    assert main(["train", "-p", "lr=nan", "-p", "output_dir=/nonexistent/x"]) == 2


def test_a_diverging_run_stops_at_its_first_non_finite_update(tmp_path):
    """A learning rate this large overflows the weights at the first step and every number after it."""
    cfg = tiny_cfg(tmp_path, lr=1e30, resume_every_collections=1)
    proc = _cli(*_train_args(cfg), cwd=tmp_path)
    stopped = r"training stopped at collection 0, update [12] \(update [12] of its 2\): non-finite .*resume=true"
    _one_error_line(proc, "train", stopped)
    run = RunDir(cfg.run_dir)
    assert run.state()["status"] == "failed" and run.state()["collections_done"] == 0
    assert run.collections() == [] and not run.final_path.exists() and run.resume_states() == []


NAN_LOSS_AT_COLLECTION_2 = """
import grpo_knobs.trainer as T
real = T.Trainer.train_on_collection
def poisoned(self, batch):
    if batch.index == 2:  # as if the loss of this collection's first update had overflowed
        real_update = self._update
        def update(*args):
            values, micro = real_update(*args)
            values = values.clone()
            values[0] = float("nan")
            self._update = real_update
            return values, micro
        self._update = update
    return real(self, batch)
T.Trainer.train_on_collection = poisoned
"""


def test_a_non_finite_loss_stops_the_run_resumable_from_its_last_good_state(reference, tmp_path):
    ref, cfg = reference[1], _elsewhere(reference[0], tmp_path)
    proc = _cli(*_train_args(cfg), cwd=tmp_path, code=NAN_LOSS_AT_COLLECTION_2)
    stopped = r"training stopped at collection 2, update 5 \(update 1 of its 2\): non-finite loss nan"
    _one_error_line(proc, "train", stopped)
    run = RunDir(cfg.run_dir)
    state = run.state()
    assert state["status"] == "failed" and state["collections_done"] == 2
    assert "NonFiniteError" in state["error"]
    assert [r["collection"] for r in run.collections()] == [0, 1]  # nothing of collection 2 was kept
    assert run.latest_resume_state().name == "resume-000002"
    done = _cli(*_train_args(cfg, resume=True), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert run.is_complete()
    _assert_same_records(run, ref)  # the resumed run is the run that never diverged


# ----------------------------------------------------------------------------- records
@pytest.fixture
def recorded(tmp_path) -> Path:
    run = tmp_path / "study" / RECORDED_RUN.name
    shutil.copytree(RECORDED_RUN, run)
    return run


def _corrupt(run: Path, line: int, text: str) -> None:
    path = run / "collections.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[line - 1] = text + "\n"
    path.write_text("".join(lines))


CORRUPTIONS = [
    ("this is not json", r"line 4: not valid JSON"),
    ("42", r"line 4: expected a JSON object, got 42"),
    ("[1, 2]", r"line 4: expected a JSON object, got \[1, 2\]"),
    ("null", r"line 4: expected a JSON object, got null"),
    ("{}", r"line 4: lacks collection, responses"),
]


@pytest.mark.parametrize("text, message", CORRUPTIONS, ids=["garbage", "number", "list", "null", "empty"])
def test_export_refuses_a_bad_line_naming_it_and_writes_nothing(recorded, tmp_path, text, message):
    _corrupt(recorded, 4, text)
    before = _tree(tmp_path)
    proc = _cli("export", str(recorded.parent), "--to", "tensorboard", cwd=tmp_path)
    _one_error_line(proc, "export", rf"{re.escape(str(recorded))}/collections\.jsonl {message}")
    assert _tree(tmp_path) == before  # nothing exported short, the records untouched


def _row_with(run: Path, line: int, **changes) -> str:
    row = json.loads((run / "collections.jsonl").read_text().splitlines()[line - 1])
    text = json.dumps(row | {k: "@" + k for k in changes})
    for k, v in changes.items():
        text = text.replace(f'"@{k}"', v)
    return text


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"responses": '"512"'}, r"responses must be a non-negative integer, got \"512\""),
        ({"reward_mean": "Infinity"}, r"not valid JSON \(Infinity is not a finite number"),
        ({"reward_mean": "NaN"}, r"not valid JSON \(NaN is not a finite number"),
        ({"updates": "1" + "0" * 400}, r"not valid JSON \(the integer 10000000000000000000\.\.\. is out of range"),
        ({"job_seconds": "1e400"}, r"not valid JSON \(1e400 is not a finite number"),
        ({"per_update": '[{"loss": "x"}]'}, r"per_update must be a list of objects of numbers"),
        ({"seconds": "true"}, r"seconds must be a object of numbers, got true"),
    ],
    ids=["string-count", "infinity", "nan", "huge-int", "overflow", "per-update", "bool"],
)
def test_records_are_checked_value_by_value(recorded, changes, message):
    _corrupt(recorded, 7, _row_with(recorded, 7, **changes))
    with pytest.raises(RecordsError, match=rf"collections\.jsonl line 7: {message}"):
        read_collections(recorded / "collections.jsonl")
    with pytest.raises(RecordsError, match=r"line 7"):  # resume and the trainer read the same way
        RunDir(recorded).collections()


def test_export_of_a_killed_run_leaves_out_its_torn_last_line_and_says_so(recorded, tmp_path):
    path = recorded / "collections.jsonl"
    whole = path.read_text().splitlines(keepends=True)
    path.write_text("".join(whole[:10]) + whole[10][:50])  # a kill in the middle of the 11th append
    proc = _cli("export", str(recorded), "--to", "tensorboard", "--out", str(tmp_path / "tb"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    notes = [line for line in proc.stderr.splitlines() if line.startswith("grpo-knobs")]
    assert notes == [
        f"grpo-knobs export: note: {path} line 11 is a torn last line (cut by a kill while it was written); "
        "read the 10 whole rows before it"
    ]
    assert "1 run(s) written" in proc.stdout


def test_analysis_refuses_a_bad_line_instead_of_analysing_short(recorded):
    from grpo_knobs.analysis.loading import load_study

    assert len(load_study(recorded.parent).collections) == 128
    _corrupt(recorded, 9, "[]")
    with pytest.raises(RecordsError, match=r"onpolicy-small-s0/collections\.jsonl line 9: expected a JSON object"):
        load_study(recorded.parent)


def test_resume_refuses_a_bad_line_before_any_set_up(reference, tmp_path):
    ref, cfg = reference[1], _elsewhere(reference[0], tmp_path)
    shutil.copytree(ref.path, cfg.run_dir)
    RunDir(cfg.run_dir).write_state("failed", 4)
    _corrupt(cfg.run_dir, 2, '{"collection": 1}')
    before = _tree(tmp_path / "study" / "tiny")
    proc = _cli(*_train_args(cfg, resume=True), cwd=tmp_path)
    _one_error_line(proc, "train", r"tiny/collections\.jsonl line 2: lacks responses, updates")
    assert _tree(tmp_path / "study" / "tiny") == before


# ----------------------------------------------------------------------------- one line for every failure
def test_malformed_plan_yaml_is_one_line(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("name: tiny\ntasks: {countdown-2x10: [1\n")
    for command in (["plan", str(plan)], ["study", str(plan), "--study-dir", str(tmp_path / "s")]):
        proc = _cli(*command, cwd=tmp_path)
        _one_error_line(proc, command[0], r"plan\.yaml: line 3, column 1: .*; fix the YAML syntax there\.")
    assert not (tmp_path / "s").exists()


def test_analyze_on_a_missing_directory_is_one_line(tmp_path):
    proc = _cli("analyze", str(tmp_path / "nope"), cwd=tmp_path)
    _one_error_line(proc, "analyze", r"no study directory at .*nope")


def test_a_manifest_missing_a_split_is_one_line(tmp_path):
    manifests = tmp_path / "manifests"
    shutil.copytree(MANIFESTS, manifests)
    path = manifests / "countdown-2x10.json"
    manifest = json.loads(path.read_text())
    del manifest["splits"]["test"]
    path.write_text(json.dumps(manifest))
    proc = _cli(
        "test-eval", "--study-dir", str(tmp_path / "s"), "--run-id", "initial-countdown-2x10",
        "--task", "countdown-2x10", "--model", "tiny-random", "--device", "cpu", cwd=tmp_path,
        code=f"import grpo_knobs.data as D; D.MANIFEST_DIR = D.Path({str(manifests)!r})",
    )  # fmt: skip
    _one_error_line(proc, "test-eval", r"manifest .*countdown-2x10\.json lacks split\(s\) test .*data build")


def _limit_file_size(limit: int):
    def limit_file_size():
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return limit_file_size


@pytest.mark.parametrize(
    "limit", [1_000_000, 20_000_000], ids=["weights-safetensors", "optimizer-torch-save"]
)  # the tiny model's weights are 12.9 MB, its optimizer state twice that
def test_a_full_disk_while_saving_resumable_state_is_one_line(tmp_path, limit):
    cfg = tiny_cfg(tmp_path, resume_every_collections=1)
    proc = _cli(*_train_args(cfg), cwd=tmp_path, preexec_fn=_limit_file_size(limit))
    _one_error_line(proc, "train", r"could not write .*resume-000001\.tmp \(.*\); free disk space .* resume the run")
    run = RunDir(cfg.run_dir)
    assert run.state()["status"] == "failed" and run.state()["collections_done"] == 1
    assert not list(run.path.glob(".resume-*")), "the partial state is removed, freeing its space"
    done = _cli(*_train_args(cfg, resume=True), cwd=tmp_path)
    assert done.returncode == 0 and run.is_complete(), done.stderr[-2000:]


# ----------------------------------------------------------------------------- resume rules and leftovers
def test_a_complete_run_resumed_with_a_changed_config_is_refused(reference, tmp_path):
    ref, cfg = reference[1], _elsewhere(reference[0], tmp_path)
    shutil.copytree(ref.path, cfg.run_dir)
    before = _tree(cfg.run_dir)
    proc = _cli(*_train_args(cfg, resume=True, lr=0.01), cwd=tmp_path)
    _one_error_line(proc, "train", r"resume of .*tiny refused: .*lr: recorded 0\.001, now 0\.01")
    assert _tree(cfg.run_dir) == before
    same = _cli(*_train_args(cfg, resume=True), cwd=tmp_path)
    assert same.returncode == 0 and "run complete" in same.stdout, same.stderr[-2000:]


def test_a_bad_tracking_dir_leaves_nothing_that_blocks_the_corrected_rerun(tmp_path):
    pytest.importorskip("tensorboard", reason="the tracking extra is not installed")
    cfg = tiny_cfg(tmp_path, response_budget=16, eval_every_responses=16, tracker="tensorboard")
    (tmp_path / "a-file").write_text("")
    proc = _cli(*_train_args(cfg, tracking_dir=tmp_path / "a-file" / "tb"), cwd=tmp_path)
    _one_error_line(proc, "train", r"tracking_dir .*a-file/tb is not a writable directory")
    assert not cfg.run_dir.exists()
    done = _cli(*_train_args(cfg, tracking_dir=tmp_path / "tb"), cwd=tmp_path)  # no resume needed
    assert done.returncode == 0, done.stderr[-2000:]
    assert RunDir(cfg.run_dir).is_complete() and list((tmp_path / "tb").rglob("events.out.tfevents.*"))


KILL_BEFORE_PRUNING = """
import os, signal
import grpo_knobs.trainer as T
real = T.RunDir.prune_resume_states
def prune(self, keep):
    if keep is None and self.is_complete():
        os.kill(os.getpid(), signal.SIGKILL)  # "complete" is written; the resume states are not yet removed
    return real(self, keep)
T.RunDir.prune_resume_states = prune
"""


def test_resume_states_left_by_a_kill_after_complete_are_removed(reference, tmp_path):
    cfg = _elsewhere(reference[0], tmp_path)
    killed = _cli(*_train_args(cfg), cwd=tmp_path, code=KILL_BEFORE_PRUNING)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    run = RunDir(cfg.run_dir)
    assert run.is_complete() and run.resume_states()
    done = _cli(*_train_args(cfg, resume=True), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert run.resume_states() == []


def test_a_study_tidies_what_a_kill_left_beside_its_complete_runs(tmp_path):
    plan = _write_plan(tmp_path / "plan.yaml", screening={"arms": ["t-small"], "response_budget": 16})
    study_dir = tmp_path / "study"
    args = ["study", str(plan), "--study-dir", str(study_dir), "--executor", "inprocess", "--phase", "screening"]
    first = _cli(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    run = RunDir(study_dir / "screening-countdown-2x10-t-small-s0")
    # what kills leave: a resume state after "complete", a papermill worker's executed notebook not moved in
    (run.path / "resume-000001").mkdir()
    (run.path / "resume-000001" / "state.json").write_text("{}")
    (study_dir / ".running").mkdir()
    shutil.copy(NOTEBOOKS / "10_train.ipynb", study_dir / ".running" / f"{run.path.name}.ipynb")
    again = _cli(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "1 skipped" in again.stdout
    assert run.resume_states() == [] and (run.path / "10_train.ipynb").is_file()
    assert not (study_dir / ".running" / f"{run.path.name}.ipynb").exists()


# ----------------------------------------------------------------------------- Ctrl-C on a study
def _study_plan(tmp_path: Path, seeds: list[int]) -> Path:
    """Runs long enough (10 and 20 collections) that none ends before the test's Ctrl-C."""
    screening = {
        "arms": ["t-small", "t-split"],
        "seeds": seeds,
        "response_budget": 160,
        "eval_every_responses": 80,
        "resume_every_collections": 1,
    }
    return _write_plan(tmp_path / "plan.yaml", screening=screening)


@pytest.mark.parametrize(
    "executor, jobs, seeds",
    [("papermill", 1, [0]), ("inprocess", 1, [0]), ("inprocess", 2, [0, 1]), ("papermill", 2, [0, 1])],
)
def test_ctrl_c_stops_a_study_starting_nothing_more(tmp_path, executor, jobs, seeds):
    plan = _study_plan(tmp_path, seeds)
    study_dir = tmp_path / "study"
    args = ["study", str(plan), "--study-dir", str(study_dir), "--phase", "screening", "--jobs", str(jobs)]
    args += ["--executor", executor]
    names = [f"screening-countdown-2x10-{arm}-s{seed}" for arm in ("t-small", "t-split") for seed in seeds]
    runs = [RunDir(study_dir / name) for name in names]
    proc = _start_cli(args, tmp_path, preexec_fn=_foreground_job)

    def started() -> list[RunDir]:
        return [r for r in runs if (r.state() or {}).get("collections_done", 0) >= 1]

    _wait_for(lambda: len(started()) == jobs, proc, f"{jobs} run(s) to record a collection", timeout=600)
    running = started()
    t0 = time.time()
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, (proc.returncode, err[-3000:])
    lines = [line for line in err.splitlines() if line.startswith("grpo-knobs")]
    assert lines == [
        f"grpo-knobs study: interrupted; to continue: run the same `grpo-knobs study {plan}` command again "
        "(complete runs are skipped)"
    ], err[-3000:]
    assert "Traceback" not in err and "Error" not in err, err[-3000:]
    assert time.time() - t0 < 120
    for run in running:  # ended cleanly, resumable from a saved state
        state = run.state()
        assert state["status"] == "failed" and state["error"] == "interrupted", (run.path.name, state)
        assert run.latest_resume_state() is not None and len(run.collections()) == state["collections_done"]
        if executor == "papermill":
            assert (run.path / "10_train.failed.ipynb").is_file()
    assert not [r.path.name for r in runs if r not in running and r.path.exists()], "a queued run started"
    # nothing is left running: no worker or kernel holds a run's lock
    for run in running:
        with exclusive(run_lock_path(study_dir, run.path.name), "test"):
            pass

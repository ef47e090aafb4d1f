"""Records that no crash, kill, second writer or bad input can corrupt: real processes, real kills."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
from grpo_knobs.config import RunConfig, parse_overrides
from grpo_knobs.locks import LockedError, exclusive, run_lock_path
from grpo_knobs.records import RunDir
from grpo_knobs.trainer import PhaseClock, train

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from test_study import _write_plan  # noqa: E402
from test_trainer import CrashingTrainer, _Crash, tiny_cfg  # noqa: E402


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "lib"), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


def _cli(*args: str, cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "grpo_knobs.cli", *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        **kw,
    )


def _start_cli(args: list[str], cwd: Path, code: str = "", env: dict | None = None, **kw) -> subprocess.Popen:
    """``grpo-knobs ARGS`` started in a fresh process, its output piped; ``code`` runs first in it (a test
    hook such as a patch)."""
    main = "import sys\nfrom grpo_knobs.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code) + "\n" + main, *args],
        cwd=cwd,
        env=_env() | (env or {}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def _wait_for(predicate, proc: subprocess.Popen, what: str, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert proc.poll() is None, f"the process ended before {what}: {proc.communicate()}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _records(run: RunDir) -> tuple[list[dict], pd.DataFrame]:
    """What analysis reads, with wall-clock fields dropped."""
    clock = ("seconds", "active_seconds", "job_seconds", "peak_memory_gib")
    rows = [{k: v for k, v in r.items() if k not in clock} for r in run.collections()]
    evals = run.evals().drop(columns=["active_seconds", "job_seconds"])
    return rows, evals


def _assert_same_records(a: RunDir, b: RunDir) -> None:
    rows_a, ev_a = _records(a)
    rows_b, ev_b = _records(b)
    assert rows_a == rows_b
    pd.testing.assert_frame_equal(ev_a.drop(columns="run_id"), ev_b.drop(columns="run_id"))
    assert a.samples() == b.samples()


def _assert_no_duplicates(run: RunDir, cfg: RunConfig) -> None:
    assert [r["collection"] for r in run.collections()] == list(range(cfg.collections))
    ev = run.evals()
    assert not ev.duplicated(["responses", "problem_id"]).any()
    assert sorted(ev["responses"].unique()) == cfg.eval_points


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted tiny run (3 collections, resumable state saved after each)."""
    cfg = tiny_cfg(tmp_path_factory.mktemp("ref"), resume_every_collections=1)
    return cfg, RunDir(train(cfg, progress=False))


# ----------------------------------------------------------------------------- one writer
def test_a_second_writer_of_a_run_is_refused_naming_the_holder(tmp_path):
    cfg = tiny_cfg(tmp_path)
    with exclusive(run_lock_path(cfg.output_dir, cfg.run_id), "test"):
        with pytest.raises(LockedError, match=rf"run .*tiny is in use by PID {os.getpid()} on "):
            train(cfg, progress=False)
    assert not cfg.run_dir.exists()


def test_two_studies_on_one_directory_the_second_stops_at_once(tmp_path):
    plan = _write_plan(tmp_path / "plan.yaml", screening={"arms": ["t-small", "t-split"], "response_budget": 48})
    study_dir = tmp_path / "study"
    args = ["study", str(plan), "--study-dir", str(study_dir), "--executor", "inprocess", "--phase", "screening"]
    first = _start_cli(args, cwd=tmp_path)
    lock = study_dir / ".locks" / "study.lock"
    _wait_for(lambda: lock.exists() and "PID" in lock.read_text(), first, "the first study to take its lock")
    t0 = time.time()
    second = _cli(*args, cwd=tmp_path)
    assert second.returncode == 2 and time.time() - t0 < 60
    assert second.stderr.count("\n") == 1, second.stderr
    assert f"is in use by PID {first.pid} on " in second.stderr
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0, out + err
    for run_id in ("screening-countdown-2x10-t-small-s0", "screening-countdown-2x10-t-split-s0"):
        run = RunDir(study_dir / run_id)
        _assert_no_duplicates(run, RunConfig.from_dict(json.loads(run.config_path.read_text())["config"]))


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _outliving(pids: list[int], seconds: float) -> list[int]:
    """The processes of ``pids`` still alive after waiting up to ``seconds`` for them to end."""
    deadline = time.time() + seconds
    while any(_alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_die_with_their_study(tmp_path):
    plan = _write_plan(tmp_path / "plan.yaml", screening={"arms": ["t-small", "t-split"], "response_budget": 64})
    study_dir = tmp_path / "study"
    code = (
        f"from grpo_knobs.study import run_study; run_study({str(plan)!r}, study_dir={str(study_dir)!r}, "
        "jobs=2, executor='inprocess', phases=['screening'], progress=False)"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _wait_for(
        lambda: (
            len(_children(parent.pid)) == 2
            and all(
                (RunDir(study_dir / r).state() or {}).get("status") == "running"
                for r in ("screening-countdown-2x10-t-small-s0", "screening-countdown-2x10-t-split-s0")
            )
        ),
        parent,
        "both workers to start their runs",
    )
    workers = _children(parent.pid)
    parent.kill()
    parent.wait()
    assert not _outliving(workers, 30), "a worker outlived its study"


_BURST_CHILD = """
import sys
from pathlib import Path
from grpo_knobs.runtime import die_with_parent, interrupts
die_with_parent()
with interrupts():
    try:
        print("ready", flush=True)
        while True:
            sum(range(50))
    except KeyboardInterrupt:  # inside the block, as a run records its interrupt
        Path(sys.argv[1]).write_text("interrupted")
"""
_BURST_PARENT = """
import subprocess, sys, threading, time
from grpo_knobs.runtime import die_with_parent
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], preexec_fn=die_with_parent,
                         stdout=subprocess.PIPE, text=True)
child.stdout.readline()
for _ in range(64):
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_burst_of_parent_death_signals_ends_a_worker_once(tmp_path):
    """A parent killed with 65 threads hands its child from thread to thread on the way out, and Linux sends the
    child's parent-death SIGTERM at every hand-over, microseconds apart. The child must take that as one
    interrupt and finish its clean-up: no handler waiting on a lock its interrupted self holds, no second
    KeyboardInterrupt inside the clean-up."""
    for trial in range(10):
        done = tmp_path / f"done-{trial}"
        args = [sys.executable, "-c", _BURST_PARENT, _BURST_CHILD, str(done)]
        parent = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=_env())
        child = int(parent.stdout.readline())
        parent.kill()
        parent.wait()
        outlived = bool(_outliving([child], 20))
        if outlived:
            os.kill(child, signal.SIGKILL)
        assert done.exists(), f"trial {trial}: the child {'outlived its parent' if outlived else 'died uncleanly'}"


# ----------------------------------------------------------------------------- crash-safe state
def _run_killed(cfg: RunConfig, patch: str) -> None:
    """Run ``cfg`` in a fresh process whose ``patch`` code SIGKILLs it at one exact point."""
    code = "\n".join(
        [
            "import os, signal",
            "import grpo_knobs.trainer as T",
            "from grpo_knobs.config import RunConfig",
            "def die():",
            "    os.kill(os.getpid(), signal.SIGKILL)",
            textwrap.dedent(patch),
            f"T.train(RunConfig.from_dict({cfg.to_dict()!r}), progress=False)",
        ]
    )
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]


KILL_AT_SECOND_SAVE_BEFORE_RENAME = """
real_replace, saves = T.os.replace, []
def replace(src, dst):
    if os.path.basename(dst).startswith("resume-"):
        saves.append(dst)
        if len(saves) == 2:
            die()  # the new state is complete but still named .resume-*.tmp
    return real_replace(src, dst)
T.os.replace = replace
"""

KILL_AT_SECOND_SAVE_AFTER_RENAME = """
real_prune, saves = T.RunDir.prune_resume_states, []
def prune(self, keep):
    if keep is not None:
        saves.append(keep)
        if len(saves) == 2:
            die()  # both the old and the new state are in place
    return real_prune(self, keep)
T.RunDir.prune_resume_states = prune
"""

KILL_AFTER_FINAL_CHECKPOINT = """
real_save = T.save_checkpoint
def save(*args):
    real_save(*args)
    die()  # final/ is written; state.json does not yet say complete
T.save_checkpoint = save
"""


@pytest.mark.parametrize(
    "patch, left",
    [(KILL_AT_SECOND_SAVE_BEFORE_RENAME, 1), (KILL_AT_SECOND_SAVE_AFTER_RENAME, 2)],
    ids=["before-rename", "after-rename"],
)
def test_a_kill_while_saving_state_resumes_from_the_newest_intact_state(reference, tmp_path, patch, left):
    ref_cfg, ref = reference
    cfg = RunConfig.from_dict(ref_cfg.to_dict() | {"output_dir": str(tmp_path)})
    _run_killed(cfg, patch)
    run = RunDir(cfg.run_dir)
    assert int(run.latest_resume_state().name.split("-")[1]) == left  # never back to zero
    train(RunConfig.from_dict(cfg.to_dict() | {"resume": True}), progress=False)
    assert run.is_complete() and run.resume_states() == [] and not list(run.path.glob(".resume-*"))
    _assert_same_records(run, ref)


def test_a_kill_while_finishing_finishes_on_resume(reference, tmp_path):
    ref_cfg, ref = reference
    cfg = RunConfig.from_dict(ref_cfg.to_dict() | {"output_dir": str(tmp_path)})
    _run_killed(cfg, KILL_AFTER_FINAL_CHECKPOINT)
    run = RunDir(cfg.run_dir)
    assert run.final_path.exists() and not run.is_complete()
    weights = (run.final_path / "model.safetensors").read_bytes()
    train(RunConfig.from_dict(cfg.to_dict() | {"resume": True}), progress=False)
    assert run.is_complete()
    assert (run.final_path / "model.safetensors").read_bytes() == weights
    assert weights == (ref.final_path / "model.safetensors").read_bytes()
    _assert_same_records(run, ref)
    timings = json.loads(run.timings_path.read_text())
    assert timings["generation"] > 0 and timings["trainer"] > 0  # the clock carried over, not restarted


# ----------------------------------------------------------------------------- resume rules
def test_resume_refuses_a_changed_config_naming_the_keys(tmp_path):
    cfg = tiny_cfg(tmp_path, resume_every_collections=1)
    with pytest.raises(_Crash):
        CrashingTrainer(cfg, progress=False).run_loop()
    recorded = RunDir(cfg.run_dir).config_path.read_bytes()
    changed = RunConfig.from_dict(cfg.to_dict() | {"resume": True, "lr": 0.01, "max_new_tokens": 6})
    with pytest.raises(ValueError, match=r"lr: recorded 0\.001, now 0\.01; max_new_tokens: recorded 8, now 6"):
        train(changed, progress=False)
    assert RunDir(cfg.run_dir).config_path.read_bytes() == recorded
    # Where and how it runs may change: the device and output paths are not what it learns.
    train(RunConfig.from_dict(cfg.to_dict() | {"resume": True, "device": "cpu"}), progress=False)
    assert RunDir(cfg.run_dir).is_complete()


def test_resume_counts_the_new_process_start_as_init(tmp_path):
    cfg = tiny_cfg(tmp_path, resume_every_collections=1)
    with pytest.raises(_Crash):
        CrashingTrainer(cfg, progress=False).run_loop()
    run = RunDir(cfg.run_dir)
    saved = json.loads((run.latest_resume_state() / "state.json").read_text())["seconds"]
    train(RunConfig.from_dict(cfg.to_dict() | {"resume": True}), progress=False)
    t = json.loads(run.timings_path.read_text())
    assert t["init"] > saved["init"]  # the second model load is init, not "other"
    assert t["generation"] >= saved["generation"] and t["trainer"] >= saved["trainer"]


def test_phase_clock_restore_keeps_this_process_init():
    clock = PhaseClock()
    clock.seconds["init"] = 2.0
    clock.restore(
        {"generation": 5.0, "trainer": 3.0, "sync": 0.1, "evaluation": 1.0, "checkpoint": 0.5, "init": 4.0},
        job_seconds=20.0,
    )
    assert clock.seconds["init"] == 6.0 and clock.seconds["generation"] == 5.0 and clock.offset == 20.0


def test_a_failed_setup_leaves_no_run_directory(tmp_path):
    bad = tiny_cfg(tmp_path, model="no-such-model-anywhere")
    with pytest.raises(Exception):
        train(bad, progress=False)
    assert not bad.run_dir.exists()
    good = RunConfig.from_dict(
        bad.to_dict() | {"model": "tiny-random", "response_budget": 16, "eval_every_responses": 16}
    )
    assert RunDir(train(good, progress=False)).is_complete()  # the corrected rerun is not refused


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "raw, expected",
    [
        ("resume=no", False),
        ("resume=off", False),
        ("resume=yes", True),
        ("resume=true", True),
        ("save_checkpoint=off", False),
        ("std_normalize_advantages=no", False),
        ("std_normalize_advantages=1", True),
        ("fast_rollout=on", "on"),
        ("num_steps_per_rollout=null", 1),
        ("lr=3e-6", 3e-6),
        ("seed=7", 7),
    ],
)
def test_values_are_parsed_to_their_declared_types(raw, expected):
    key = raw.split("=")[0]
    assert getattr(RunConfig.from_dict(parse_overrides([raw])), key) == expected


@pytest.mark.parametrize(
    "raw, message",
    [
        ("resume=maybe", "resume must be true or false"),
        ("seed=1.5", "seed must be an integer"),
        ("seed=abc", "seed must be an integer"),
        ("resume_every_collections=1.5", "must be an integer"),
        ("lr=abc", "lr must be a number"),
        ("temperature=abc", "temperature must be a number"),
        ("weight_decay=abc", "weight_decay must be a number"),
        ("micro_batch_size=2.0", "write 2"),
    ],
)
def test_bad_values_give_one_line_naming_the_field(raw, message):
    with pytest.raises(ValueError, match=message):
        RunConfig.from_dict(parse_overrides([raw]))


def test_direct_construction_checks_types_too():
    with pytest.raises(ValueError, match="lr must be float"):
        RunConfig(lr="abc")
    with pytest.raises(ValueError, match="seed must be int"):
        RunConfig(seed=1.5)


@pytest.mark.parametrize(
    "args, files, message",
    [
        (["train", "--config", "bad.yaml"], {"bad.yaml": "lr: [1\nseed: 2\n"}, r"bad\.yaml: line 2, column 5: .*fix"),
        (["train", "--config", "list.yaml"], {"list.yaml": "- 1\n"}, "expected a mapping"),
        (["train", "--config", "absent.yaml"], {}, "No such file or directory: absent.yaml"),
        (["train", "-p", "lr=abc"], {}, "lr must be a number, got 'abc'"),
        (["train", "-p", "seed=1.5"], {}, "seed must be an integer"),
        (["train", "-p", "lrr=1e-5"], {}, "did you mean 'lr'"),
        (
            ["train", "-p", "model=tiny-random", "-p", "device=cpu", "-p", "output_dir=/proc/no-such-dir"],
            {},
            "No such file or directory: /proc/no-such-dir",
        ),
        (
            ["train", "-p", "model=tiny-random", "-p", "device=cpu", "-p", "trainer_path=packed-liger"],
            {},
            "packed liger backend runs on CUDA only; use trainer_path=packed on cpu",
        ),
        (["plan", "no-such-preset"], {}, "no-such-preset"),
    ],
)
def test_the_cli_turns_expected_failures_into_one_line(tmp_path, args, files, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    proc = _cli(*args, cwd=tmp_path)
    assert proc.returncode == 2
    err = [line for line in proc.stderr.splitlines() if line.startswith("grpo-knobs") or "Traceback" in line]
    assert len(err) == 1 and err[0].startswith(f"grpo-knobs {args[0]}: error: "), proc.stderr
    assert re.search(message, err[0]), err[0]
    debug = _cli("--debug", *args, cwd=tmp_path)
    assert "Traceback" in debug.stderr and debug.returncode == 2


def _limit_file_size():
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


def test_a_full_disk_is_one_line_and_keeps_the_error(tmp_path):
    cfg = tiny_cfg(tmp_path)
    args = ["train", *[a for k, v in cfg.to_dict().items() if v is not None for a in ("-p", f"{k}={v}")]]
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_knobs.cli", *args],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_file_size,
    )
    assert proc.returncode == 2
    err = [line for line in proc.stderr.splitlines() if line.startswith("grpo-knobs") or "Traceback" in line]
    assert len(err) == 1 and "(File too large); free disk space" in err[0], proc.stderr[-3000:]


# The run is held at one point of its loop until the test's Ctrl-C arrives (so it cannot end first however
# loaded the machine is), or a finalizer swallows the KeyboardInterrupt there.
HOLD_AT_COLLECTION_2 = """
import os, time
import grpo_knobs.trainer as T
real = T.Trainer.collect
def collect(self, c):
    if c == 2:  # mid-training
        open(os.environ["HOLD_FILE"], "w").close()
        while True:
            time.sleep(0.05)
    return real(self, c)
T.Trainer.collect = collect
"""

SWALLOW_A_CTRL_C_AT_COLLECTION_2 = """
import os, signal
import grpo_knobs.trainer as T
real = T.Trainer.collect
class Finalized:
    def __del__(self):  # Python drops an exception raised in a finalizer, so the KeyboardInterrupt is lost
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))
def collect(self, c):
    if c == 2:
        Finalized()
    return real(self, c)
T.Trainer.collect = collect
"""


def _foreground_job() -> None:
    """What a terminal's foreground job has: its own process group, and Ctrl-C not ignored. (A job a
    shell starts in the background inherits SIGINT ignored, and Python keeps it ignored: that is how
    this test once saw exit 0 under `make test` run as a background job.)"""
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _train_in_foreground(cfg: RunConfig, code: str, cwd: Path, **env: str) -> subprocess.Popen:
    """``grpo-knobs train`` with ``code`` run first in the process (a test hook)."""
    params = [a for k, v in cfg.to_dict().items() if v is not None for a in ("-p", f"{k}={v}")]
    return _start_cli(["train", "--no-progress", *params], cwd, code, env, preexec_fn=_foreground_job)


def _interrupted_line(proc: subprocess.Popen) -> tuple[str, str]:
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, (proc.returncode, err[-3000:])
    lines = [line for line in err.strip().splitlines() if line.startswith("grpo-knobs")]
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith("grpo-knobs train: interrupted; to continue: grpo-knobs train "), lines[0]
    return lines[0], err


def test_ctrl_c_leaves_a_resumable_run_and_says_how_to_resume(reference, tmp_path):
    ref_cfg, ref = reference
    cfg = RunConfig.from_dict(ref_cfg.to_dict() | {"output_dir": str(tmp_path / "study")})
    hold = tmp_path / "held"
    proc = _train_in_foreground(cfg, HOLD_AT_COLLECTION_2, tmp_path, HOLD_FILE=str(hold))
    _wait_for(hold.exists, proc, "the run to reach collection 2")
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    line, err = _interrupted_line(proc)
    assert "Traceback" not in err, err
    run = RunDir(cfg.run_dir)
    assert run.state()["status"] == "failed" and run.state()["error"] == "interrupted"
    assert run.state()["collections_done"] == 2 and run.latest_resume_state().name == "resume-000002"
    resume_cmd = line.split("to continue: ")[1].split()
    assert resume_cmd[-1] == "resume=true"
    done = _cli(*resume_cmd[1:], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert run.is_complete()
    _assert_no_duplicates(run, cfg)
    _assert_same_records(run, ref)  # the interrupted and resumed run is the uninterrupted one


def test_a_ctrl_c_whose_keyboard_interrupt_is_lost_still_stops_the_run(tmp_path):
    """Python drops a KeyboardInterrupt raised inside a finalizer (printing "Exception ignored") and carries on;
    without the interrupt noted, this run went on to "complete" and exit 0."""
    cfg = tiny_cfg(tmp_path, response_budget=96, resume_every_collections=1)
    _, err = _interrupted_line(_train_in_foreground(cfg, SWALLOW_A_CTRL_C_AT_COLLECTION_2, tmp_path))
    assert "Exception ignored" in err  # Python did drop it
    state = RunDir(cfg.run_dir).state()
    assert state["status"] == "failed" and state["error"] == "interrupted"
    assert state["collections_done"] == 3  # collection 2 was finished and recorded, then the loop stopped

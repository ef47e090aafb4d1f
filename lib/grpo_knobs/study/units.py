"""One unit of a study, run in this process: a training run (papermill or in-process) or a terminal
test job. The local worker processes and the Ray tasks both call :func:`_execute_unit`."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from ..config import RunConfig, check_name, inside
from ..locations import notebook
from ..locks import LockedError, exclusive, run_lock_path
from ..records import RunDir
from ..runtime import DIE_WITH_PARENT_ENV, check_interrupted, interrupted, interrupts

EXECUTORS = ("auto", "papermill", "inprocess")
INTERRUPTED_EXIT = 130  # a worker whose unit was interrupted (it printed its JobResult first)


@dataclass
class JobResult:
    """What happened to one run or test job in one ``run_study`` call."""

    run_id: str
    phase: str
    status: str  # complete, skipped, failed, blocked, interrupted
    seconds: float = 0.0
    error: str | None = None
    record: str | None = None  # the failed notebook or failure file


def _resolve_executor(executor: str) -> str:
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}.")
    if executor != "auto":
        return executor
    try:
        import papermill  # noqa: F401
    except ImportError:
        return "inprocess"
    return "papermill" if notebook("10_train").exists() else "inprocess"


def _subprocess_env(threads: int | None) -> dict[str, str]:
    """The environment of kernels and workers: this library importable, threads bounded."""
    env = dict(os.environ)
    lib = str(Path(__file__).resolve().parents[2])
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if lib not in parts:
        env["PYTHONPATH"] = os.pathsep.join([lib, *parts])
    if threads:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[var] = str(threads)
    return env


def _error_text(exc: BaseException) -> str:
    ename, evalue = getattr(exc, "ename", None), getattr(exc, "evalue", None)
    text = f"{ename}: {evalue}" if ename else f"{type(exc).__name__}: {exc}"
    return text.strip().splitlines()[0][:500] if text.strip() else type(exc).__name__


def _staging_notebook(cfg: RunConfig) -> Path:
    """Where 10_train.ipynb is executed for a run: beside the run directory, which the trainer wants empty."""
    return inside(cfg.output_dir, ".running", f"{cfg.resolved_run_id}.ipynb")


class _StopBeforeCell(Exception):
    """Raised by papermill's cell hook after an interrupt: the kernel ignores SIGINT between cells."""


def _kernel_manager_class(started: list):
    """nbclient's kernel manager, noting each kernel it starts, so that a Ctrl-C can be passed on to it."""
    from jupyter_client import AsyncKernelManager

    class NotedKernelManager(AsyncKernelManager):
        async def start_kernel(self, **kwargs):
            await super().start_kernel(**kwargs)
            started.append(self)

    return NotedKernelManager


def _train_papermill(cfg: RunConfig) -> tuple[str | None, str | None]:
    """Execute 10_train.ipynb for one run; returns (error, failed notebook path).

    A Ctrl-C (or SIGTERM) here is passed on to the kernel, which jupyter_client starts in a session of
    its own: the trainer in it records the run as interrupted and the cell ends; then this process
    raises KeyboardInterrupt. A second one stops at once.
    """
    from .notebooks import execute_notebook

    run_dir = cfg.run_dir
    staging = _staging_notebook(cfg)
    staging.parent.mkdir(parents=True, exist_ok=True)
    # The kernel inherits this process's environment; it must import this same library, and it
    # dies with this process instead of training on behind a rerun's back.
    os.environ["PYTHONPATH"] = _subprocess_env(None)["PYTHONPATH"]
    os.environ[DIE_WITH_PARENT_ENV] = "1"
    source = notebook("10_train")  # the workspace's copy where there is one
    kernels: list = []

    def pass_on() -> bool:
        for km in kernels:
            with contextlib.suppress(OSError, TypeError):  # no pid (not started) or already gone
                os.killpg(km.provisioner.pid, signal.SIGINT)
        return True  # the cell hook stops a notebook that is between cells

    def stop_if_interrupted(cell, cell_index) -> None:
        if interrupted():
            raise _StopBeforeCell()

    try:
        with interrupts(on_first=pass_on):
            # The trainer refuses a non-empty new run directory, so the notebook is written beside
            # it while it runs and moved in afterwards.
            execute_notebook(
                source,
                staging,
                parameters=cfg.to_dict(),
                cwd=str(source.parent),
                progress_bar=False,
                kernel_manager_class=_kernel_manager_class(kernels),
                on_cell_start=stop_if_interrupted,
            )
    except BaseException as exc:  # papermill saved the partially executed notebook first
        run_dir.mkdir(parents=True, exist_ok=True)
        failed = run_dir / "10_train.failed.ipynb"
        if staging.exists():
            os.replace(staging, failed)
        if interrupted() or isinstance(exc, KeyboardInterrupt):
            raise KeyboardInterrupt("interrupted") from None  # whatever the kernel client raised on the way out
        if not isinstance(exc, Exception):
            raise
        return _error_text(exc), str(failed)
    os.replace(staging, run_dir / "10_train.ipynb")
    with contextlib.suppress(OSError):  # other workers may still be using it
        staging.parent.rmdir()
    return None, None


def _train_inprocess(cfg: RunConfig, progress: bool) -> tuple[str | None, str | None]:
    """Call trainer.train for one run; a failure's traceback goes to <run_dir>/failure.txt."""
    from ..trainer import train

    try:
        train(cfg, progress=progress)
    except Exception as exc:
        failure = cfg.run_dir / "failure.txt"
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        failure.write_text(traceback.format_exc())
        return _error_text(exc), str(failure)
    finally:
        _release_memory()
    return None, None


def _release_memory() -> None:
    """Free the finished run's tensors before the next run loads a model in this process."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _tidy_complete_run(cfg: RunConfig) -> None:
    """What a kill can leave beside a complete run: its resume states (killed between "complete" and
    their removal) and, from papermill, its executed notebook still in ``.running/`` (killed before the
    notebook was moved in). The states go; the notebook is moved in. Skipped while another process
    holds the run."""
    run = RunDir(cfg.run_dir)
    staging = _staging_notebook(cfg)
    if not run.resume_states() and not list(run.path.glob(".resume-*.tmp")) and not staging.exists():
        return
    try:
        with exclusive(run_lock_path(cfg.output_dir, cfg.resolved_run_id), f"run {run.path}"):
            run.prune_resume_states(keep=None)
            if staging.exists() and not (run.path / "10_train.ipynb").exists():
                os.replace(staging, run.path / "10_train.ipynb")
    except LockedError:
        pass


def _execute_training(config: dict, executor: str, progress: bool) -> JobResult:
    cfg = RunConfig.from_dict(config)
    run = RunDir(cfg.run_dir)
    t0 = time.perf_counter()
    if run.is_complete():
        _tidy_complete_run(cfg)
        return JobResult(cfg.run_id, cfg.phase, "skipped")
    check_interrupted()  # no run starts after a Ctrl-C
    cfg = dataclasses.replace(cfg, resume=run.path.exists() and any(run.path.iterdir()))
    if executor == "papermill":
        error, record = _train_papermill(cfg)
    else:
        error, record = _train_inprocess(cfg, progress)
    check_interrupted()  # a run ended by a Ctrl-C is interrupted, not failed
    if error is None and not run.is_complete():
        state = run.state() or {}
        error = f"the run ended without state.json status 'complete' (status: {state.get('status')})"
    return JobResult(cfg.run_id, cfg.phase, "failed" if error else "complete", time.perf_counter() - t0, error, record)


def _execute_test(study_dir: str, job: dict) -> JobResult:
    from ..evaluation import run_test_job

    run_dir = inside(study_dir, check_name("run_id", job["run_id"]))
    t0 = time.perf_counter()
    if RunDir(run_dir).test_path.exists():
        return JobResult(job["run_id"], "test", "skipped")
    check_interrupted()
    if not job["run_id"].startswith("initial-") and not RunDir(run_dir).is_complete():
        return JobResult(job["run_id"], "test", "blocked", 0.0, "its confirmation run is not complete")
    try:
        run_test_job(study_dir, job)
    except Exception as exc:
        failure = run_dir / "test.failure.txt"
        run_dir.mkdir(parents=True, exist_ok=True)
        failure.write_text(traceback.format_exc())
        return JobResult(job["run_id"], "test", "failed", time.perf_counter() - t0, _error_text(exc), str(failure))
    finally:
        _release_memory()
    return JobResult(job["run_id"], "test", "complete", time.perf_counter() - t0)


def _execute_unit(unit: dict) -> JobResult:
    """Run one unit (training run or test job) in this process.

    A training unit may carry its run's terminal test (``unit["test"]``), which then runs
    right after the run completes, while its final checkpoint is surely on this machine.
    """
    if unit["kind"] == "train":
        result = _execute_training(unit["config"], unit["executor"], unit.get("progress", False))
        if result.status in ("complete", "skipped") and "test" in unit:
            _execute_test(unit["test"]["study_dir"], unit["test"]["job"])  # the test phase reports its outcome
        return result
    return _execute_test(unit["study_dir"], unit["job"])


def unit_run_id(unit: dict) -> str:
    return unit["config"]["run_id"] if unit["kind"] == "train" else unit["job"]["run_id"]


def unit_id(unit: dict) -> tuple[str, str]:
    """(run_id, phase) of a unit."""
    return unit_run_id(unit), unit["config"]["phase"] if unit["kind"] == "train" else "test"


class ResultTally:
    """A phase's results as its units finish, on a progress bar that counts the failed and blocked."""

    def __init__(self, units: list[dict], desc: str, progress: bool):
        self.units = units
        self.results: list[JobResult] = []
        self.bar = tqdm(total=len(units), desc=desc, unit="run", disable=not progress)

    def add(self, result: JobResult) -> None:
        self.results.append(result)
        self.bar.update(1)
        self.bar.set_postfix(failed=sum(r.status in ("failed", "blocked") for r in self.results))

    def __enter__(self) -> "ResultTally":
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()  # also when a Ctrl-C cuts the phase short: the next message starts on a line of its own

    def finish(self) -> list[JobResult]:
        """Close the bar; the results in the order of ``units``."""
        self.bar.close()
        order = {unit_run_id(u): i for i, u in enumerate(self.units)}
        return sorted(self.results, key=lambda r: order[r.run_id])


def _worker_log(unit: dict) -> Path:
    """<study_dir>/.logs/<run_id>.log: a worker's progress bars and messages."""
    if unit["kind"] == "train":
        root, run_id = unit["config"]["output_dir"], unit["config"]["run_id"]
    else:
        root, run_id = unit["study_dir"], unit["job"]["run_id"]
    return inside(root, ".logs", f"{check_name('run_id', run_id)}.log")


def _unit_cost(unit: dict) -> float:
    """A training run's collection count (its generate calls dominate its time); test jobs are short."""
    if unit["kind"] != "train":
        return 0.0
    c = unit["config"]
    return c["response_budget"] / (c["rollout_batch_size"] * c["n_samples_per_prompt"])

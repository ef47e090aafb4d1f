"""Execution: ``run_study`` runs a plan's phases here or in worker processes, skipping completed
runs, resuming killed ones and recording failures."""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..config import RunConfig, config_drift
from ..locks import exclusive, study_lock_path
from ..provenance import git_commit, source_sha256
from ..records import RunDir, atomic_write_json, read_json
from ..runtime import DIE_WITH_PARENT_ENV, check_interrupted, die_with_parent, interrupts
from .planning import PHASE_ORDER, Plan, PlanError, PlannedRun, plan
from .preregistration import check_same_code, check_unchanged
from .presenting import plan_to_json
from .scheduling import check_scheduler, execute_on_ray
from .selection import select
from .units import (
    INTERRUPTED_EXIT,
    JobResult,
    ResultTally,
    _execute_unit,
    _resolve_executor,
    _subprocess_env,
    _unit_cost,
    _worker_log,
    unit_id,
    unit_run_id,
)
from .wall_time import call_times, describe_call, record_call


@dataclass
class StudyReport:
    """Outcome of ``run_study``: every job's status; ``summary()`` names each failure and its record."""

    study_dir: Path
    results: list[JobResult] = field(default_factory=list)
    selection: dict | None = None
    times: dict | None = None  # this call's wall time against its runs' job times (wall_time.call_times)

    @property
    def failed(self) -> list[JobResult]:
        return [r for r in self.results if r.status in ("failed", "blocked", "interrupted")]

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def deferred(self) -> list[JobResult]:
        """Runs ``time_limit`` left for a later call."""
        return [r for r in self.results if r.status == "deferred"]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.status] = out.get(r.status, 0) + 1
        return out

    def summary(self) -> str:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(self.counts().items())) or "nothing to do"
        lines = [f"Study {self.study_dir}: {counts}."]
        for r in self.failed:
            lines.append(
                f"  {r.status.upper()} {r.run_id} ({r.phase}): {r.error}"
                + (f"\n    see {r.record}" if r.record else "")
            )
        if self.deferred:
            runs = len({r.run_id for r in self.deferred})  # a run and its test job, once
            lines.append(f"  {runs} run(s) left for a later call: {self.deferred[0].error}")
        if self.times is not None:
            lines.append(describe_call(self.times))
        return "\n".join(lines)

    __str__ = summary

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([dataclasses.asdict(r) for r in self.results])

    def raise_on_failure(self) -> None:
        """Fail a driver notebook or command after the report has been shown."""
        if self.failed:
            raise RuntimeError(self.summary())


def _config_drift(cfg: RunConfig) -> list[str]:
    """Fields whose recorded value differs from the plan, for a run that already has records."""
    path = RunDir(cfg.run_dir).config_path
    return config_drift(read_json(path).get("config", {}), cfg) if path.exists() else []


def visible_gpus() -> list[str]:
    """CUDA device ids that worker processes may be placed on ([] without CUDA)."""
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return [d.strip() for d in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    try:
        import torch
    except ImportError:
        return []
    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


# Deterministic runs that may share one GPU: each fixes its packed micro-batch size from 35% of the GPU's total
# memory (``packing.memory_token_budget``), and holds its engine and weights beside that.
DETERMINISTIC_RUNS_PER_GPU = 2


def check_gpu_sharing(configs: list[RunConfig], jobs: int, gpus: int) -> None:
    """Refuse more deterministic runs side by side on one GPU than fit in its memory (``jobs`` workers over
    ``gpus`` devices; worker k on GPU k mod n), unless their micro-batch budget is set smaller by hand."""
    per_gpu = -(-jobs // gpus) if gpus else 1
    sized = [c for c in configs if c.deterministic and c.packed_tokens_per_micro_batch is None]
    if per_gpu > DETERMINISTIC_RUNS_PER_GPU and any(c.trainer_path != "padded" for c in sized):
        raise PlanError(
            f"--jobs {jobs} puts {per_gpu} runs side by side on a GPU ({gpus} visible); a deterministic run sizes "
            f"its packed micro-batches to 35% of its GPU's memory, so more than {DETERMINISTIC_RUNS_PER_GPU} run "
            f"out of it. Use --jobs {DETERMINISTIC_RUNS_PER_GPU * gpus}, or give the preset's runs a "
            "packed_tokens_per_micro_batch that fits."
        )


def _check_sharing(p: Plan, phases: list[str], only: list[str] | None, jobs: int, scheduler: str) -> None:
    """``check_gpu_sharing`` for the runs this call may train (Ray gives each run a GPU of its own)."""
    if scheduler == "local" and jobs > 1:
        chosen, complete = _filter([r for r in p.runs if not r.placeholder and r.phase in phases], only), _complete(p)
        left = [r.config for r in chosen if r.run_id not in complete]  # only runs left to train count
        check_gpu_sharing(left, jobs, len(visible_gpus()))


# Seconds a worker has to record its run as interrupted after a Ctrl-C, then after SIGTERM, before SIGKILL.
WORKER_STOP_SECONDS = (120, 30)


class _Workers:
    """The worker processes of one phase. Each runs in a session of its own, so a Ctrl-C in the
    terminal reaches only the study, which passes exactly one interrupt on to each worker."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stopping = False
        self.procs: set[subprocess.Popen] = set()

    def start(self, *args, **kwargs) -> subprocess.Popen | None:
        """Popen(...) unless the phase is stopping (then None: a queued run never starts)."""
        with self.lock:
            if self.stopping:
                return None
            proc = subprocess.Popen(*args, start_new_session=True, **kwargs)
            self.procs.add(proc)
            return proc

    def done(self, proc: subprocess.Popen) -> None:
        with self.lock:
            self.procs.discard(proc)

    def stop(self) -> None:
        """Start no more workers; interrupt the running ones and wait until they have recorded it."""
        with self.lock:
            self.stopping = True
            procs = list(self.procs)
        for sig, seconds in zip((signal.SIGINT, signal.SIGTERM), WORKER_STOP_SECONDS):
            for proc in procs:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)
            deadline = time.monotonic() + seconds
            for proc in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            procs = [proc for proc in procs if proc.poll() is None]
        for proc in procs:
            proc.kill()


def _execute_in_worker(unit: dict, threads: int, gpu: str | None = None, workers: _Workers | None = None) -> JobResult:
    """Run one unit in a fresh process with bounded threads, on one GPU when ``gpu`` is given.

    The worker's stderr (its progress bars, warnings, a crash's traceback) goes to
    :func:`_worker_log`; its last stdout line is the JobResult.
    """
    workers = workers or _Workers()
    run_id, phase = unit_id(unit)
    env = _subprocess_env(threads)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    log = _worker_log(unit)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as err:
        # A worker (and the notebook kernel it starts) dies with this process: a killed study
        # leaves no run going on behind a rerun's back.
        env[DIE_WITH_PARENT_ENV] = "1"
        proc = workers.start(
            [sys.executable, "-m", "grpo_knobs.study", "--worker", str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
            preexec_fn=die_with_parent,
        )
        if proc is None:
            return JobResult(run_id, phase, "interrupted", error="not started: the study was interrupted")
        err.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} worker start (pid {proc.pid}, GPU {gpu or 'none'}, ")
        err.write(f"{threads} threads)\n")
        err.flush()
        try:
            out, _ = proc.communicate(json.dumps(unit | {"progress": True}))
        finally:
            workers.done(proc)
    last = out.strip().splitlines()[-1:] if out.strip() else []
    if proc.returncode in (0, INTERRUPTED_EXIT) and last:
        return JobResult(**json.loads(last[0]))
    tail = " | ".join(line.strip() for line in log.read_text().splitlines()[-3:])
    return JobResult(run_id, phase, "failed", 0.0, f"worker exited with code {proc.returncode}: {tail}", str(log))


def _execute_all(units: list[dict], jobs: int, desc: str, progress: bool, budget: _TimeBudget | None = None):
    """Run units one at a time (jobs=1) or side by side in worker processes, with a progress bar.

    A Ctrl-C starts no further unit, ends the running ones as interrupted and resumable, and then
    raises KeyboardInterrupt. With ``budget``, a training run it cannot hold is not started (``deferred``).
    """
    with ResultTally(units, desc, progress) as tally:
        if jobs == 1:
            for unit in units:
                check_interrupted()  # one whose KeyboardInterrupt was lost between runs
                tally.bar.set_postfix_str(unit_run_id(unit))
                late = budget.refuse(unit) if budget else None
                tally.add(late or _execute_unit(unit | {"progress": progress}))
        else:
            _execute_in_workers(units, jobs, tally, budget)
        return tally.finish()


@dataclass
class _TimeBudget:
    """A call's time limit: a training run starts only if its recipe's longest finished run (x MARGIN, for its
    test and start-up) ends before the deadline. A recipe with no finished run to go by always starts."""

    deadline: float  # time.perf_counter() by which the call should be done
    longest: dict[tuple[str, str], float]  # (task, arm) -> longest recorded job seconds
    MARGIN = 1.2

    @classmethod
    def of(cls, p: Plan, deadline: float) -> "_TimeBudget":
        longest: dict[tuple[str, str], float] = {}
        complete = _complete(p)
        for r in p.runs:
            if r.run_id not in complete:
                continue
            try:
                job = RunDir(p.study_dir / r.run_id).job_seconds()
            except (OSError, ValueError, KeyError, TypeError):
                continue
            key = (r.config.task, r.config.arm)
            longest[key] = max(longest.get(key, 0.0), job)
        return cls(deadline, longest)

    def refuse(self, unit: dict) -> JobResult | None:
        """A ``deferred`` result for a training run that would end past the deadline, else None."""
        if unit["kind"] != "train":
            return None
        c = unit["config"]
        job = self.longest.get((c["task"], c["arm"]))
        if job is None or RunDir(Path(c["output_dir"]) / c["run_id"]).is_complete():
            return None  # nothing to go by, or skipped at once
        left = self.deadline - time.perf_counter()
        if job * self.MARGIN <= left:
            return None
        why = f"its recipe's longest run took {job:.0f} s and {max(left, 0.0):.0f} s of --time-limit were left"
        return JobResult(c["run_id"], c["phase"], "deferred", error=why)


def _execute_in_workers(units: list[dict], jobs: int, tally: ResultTally, budget: _TimeBudget | None = None) -> None:
    threads = max(1, (os.cpu_count() or 1) // jobs)
    # Worker slot k runs on GPU k mod n: with jobs equal to the GPU count each run has a GPU
    # to itself, so its phase times are not inflated by another run sharing the device.
    gpus = visible_gpus()
    slots: queue.Queue[int] = queue.Queue()
    for k in range(jobs):
        slots.put(k)
    workers = _Workers()

    def in_slot(unit: dict) -> JobResult:
        k = slots.get()
        try:
            if budget and (late := budget.refuse(unit)):
                return late
            return _execute_in_worker(unit, threads, gpus[k % len(gpus)] if gpus else None, workers)
        finally:
            slots.put(k)

    pool = ThreadPoolExecutor(jobs)
    try:
        # Longest first (most collections), so a long run does not start last and hold the
        # other workers idle at the end.
        for future in as_completed([pool.submit(in_slot, u) for u in sorted(units, key=_unit_cost, reverse=True)]):
            tally.add(future.result())
            check_interrupted()
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        workers.stop()
        raise
    finally:
        pool.shutdown(wait=True)


def _filter(items: Iterable, only: list[str] | None) -> list:
    return [x for x in items if not only or any(fnmatch.fnmatch(x.run_id, pat) for pat in only)]


def _check_drift(runs: list[PlannedRun]) -> None:
    problems = [f"{r.run_id}: {'; '.join(d)}" for r in runs if (d := _config_drift(r.config))]
    if problems:
        raise PlanError(
            "Existing run records disagree with the plan (records are never overwritten; use another "
            "study_dir or move these runs away):\n  " + "\n  ".join(problems)
        )


def _write_plan_snapshot(p: Plan) -> None:
    """<study_dir>/plan.json: the resolved plan, its targets, rule and registered analysis, for the analysis
    notebooks, and the code that runs it. A study with a registered analysis stops where the analysis, or
    the library source, differs from the one recorded there."""
    path = p.study_dir / "plan.json"
    recorded = read_json(path) if path.exists() else None
    check_unchanged(recorded, p.preregistration, str(path))
    code = {"source_sha256": source_sha256(), "git_commit": git_commit()}
    if p.preregistration is not None:
        check_same_code(recorded, code["source_sha256"], str(path))
    atomic_write_json(
        path,
        {
            "name": p.name,
            "source": str(p.source),
            "params": p.params,
            "targets": p.targets,
            "selection_rule": p.rule.describe() if p.candidates else None,
            "fixed_recipes": p.fixed_recipes,
            "preregistration": p.preregistration.to_json() if p.preregistration else None,
            "code": code,
            "runs": plan_to_json(p),
        },
    )


def run_study(
    preset: str | Path,
    phases: Iterable[str] | None = None,
    jobs: int = 1,
    study_dir: str | Path | None = None,
    executor: str = "auto",
    *,
    params: dict[str, Any] | None = None,
    only: list[str] | None = None,
    progress: bool = True,
    scheduler: str = "local",
    ray_address: str | None = None,
    time_limit: float | None = None,
) -> StudyReport:
    """Execute a study's phases in order, skipping completed work and recording failures.

    Args:
        preset: preset name or plan file.
        phases: subset of screening, lr-followup, selection, confirmation, test (default all).
        jobs: runs side by side in worker processes; 1 runs them here, one at a time. With
            CUDA, worker k uses GPU k mod n; more jobs than GPUs share devices, which
            inflates every sharing run's phase times.
        study_dir: where run directories go (default runs/<study name>).
        executor: papermill (10_train.ipynb per run), inprocess (trainer.train), or auto.
        params: values for the plan's ``params``.
        only: run-id glob patterns; other runs are left for a later call.
        scheduler: local (this machine, ``jobs`` workers) or ray (each run a Ray task holding the
            GPUs and CPUs it needs; ``scheduling.execute_on_ray``).
        ray_address: the Ray cluster for scheduler ray; None starts a local Ray instance.
        time_limit: seconds this call may take (a machine held for a limited time): a training run whose
            recipe's longest finished run would not end within them is left for a later call
            (``deferred``). Local scheduler only.
    """
    phases = list(phases or PHASE_ORDER)
    bad = [ph for ph in phases if ph not in PHASE_ORDER]
    if bad:
        raise ValueError(f"Unknown phase(s) {bad}; phases: {', '.join(PHASE_ORDER)}.")
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive integer, got {jobs!r}.")
    if time_limit is not None and not time_limit > 0:
        raise ValueError(f"time_limit must be a positive number of seconds, got {time_limit!r}.")
    if time_limit is not None and scheduler != "local":
        raise ValueError("time_limit is for scheduler 'local': Ray places every run at once. Drop --time-limit.")
    check_scheduler(scheduler, jobs, ray_address)
    executor = _resolve_executor(executor)
    p = plan(preset, study_dir=study_dir, params=params)
    _check_sharing(p, phases, only, jobs, scheduler)
    # One writer per study: a second study command on this directory stops here, at once. A Ctrl-C
    # (or SIGTERM) starts no further run and ends the running ones recorded as interrupted.
    with exclusive(study_lock_path(p.study_dir), f"study {p.study_dir}"), interrupts():
        started, t0 = time.time(), time.perf_counter()
        before = _finished(p)
        try:
            deadline = None if time_limit is None else t0 + time_limit
            how = (jobs, executor, params, only, progress, scheduler, ray_address, deadline)
            report = _run_phases(p, preset, phases, *how)
        except KeyboardInterrupt:
            # A call cut short (a Ctrl-C, or a machine's time limit sending SIGTERM) still records the runs
            # and tests it finished, read from their directories, so its GPU time is not lost from the log.
            done = _finished_since(p, before)
            times = call_times(p.study_dir, done, started, time.perf_counter() - t0, scheduler)
            record_call(p.study_dir, times | {"interrupted": True})
            raise
        times = call_times(p.study_dir, report.results, started, time.perf_counter() - t0, scheduler)
        report.times = record_call(p.study_dir, times)
        return report


def _tested(p: Plan) -> set[str]:
    """Run ids of the plan's test jobs whose terminal test rows exist."""
    return {t.run_id for t in p.tests if RunDir(p.study_dir / t.run_id).test_path.exists()}


def _complete(p: Plan) -> set[str]:
    """Run ids of the plan's complete runs, as their directories say."""
    return {r.run_id for r in p.runs if not r.placeholder and RunDir(p.study_dir / r.run_id).is_complete()}


def _finished(p: Plan) -> tuple[set[str], set[str]]:
    """``_complete`` and ``_tested``."""
    return _complete(p), _tested(p)


def _finished_since(p: Plan, before: tuple[set[str], set[str]]) -> list[JobResult]:
    """What finished after ``_finished`` returned ``before``, as this call's results (their seconds unknown)."""
    runs, tests = _finished(p)
    phase = {r.run_id: r.phase for r in p.runs}
    done = [JobResult(rid, phase[rid], "complete") for rid in sorted(runs - before[0])]
    return done + [JobResult(rid, "test", "complete") for rid in sorted(tests - before[1])]


def _run_phases(
    p: Plan,
    preset: str | Path,
    phases: list[str],
    jobs: int,
    executor: str,
    params: dict[str, Any] | None,
    only: list[str] | None,
    progress: bool,
    scheduler: str = "local",
    ray_address: str | None = None,
    deadline: float | None = None,
) -> StudyReport:
    _check_drift([r for r in p.runs if not r.placeholder and r.phase in phases])
    p.study_dir.mkdir(parents=True, exist_ok=True)
    _write_plan_snapshot(p)
    report = StudyReport(p.study_dir, selection=p.selection)
    tested_before = _tested(p)
    for phase in (ph for ph in PHASE_ORDER if ph in phases):
        if phase == "selection":
            if p.selected:  # frozen: an existing selection (computed or written by hand) is kept
                report.results.append(JobResult("selection", "selection", "skipped"))
                continue
            try:
                report.selection = select(p)
            except PlanError as exc:
                report.results.append(JobResult("selection", "selection", "blocked", error=str(exc)))
                continue
            report.results.append(JobResult("selection", "selection", "complete"))
            p = plan(preset, study_dir=p.study_dir, params=params)
            _check_drift([r for r in p.runs if not r.placeholder and r.phase in phases])
            _check_sharing(p, phases, only, jobs, scheduler)  # the confirmation runs are concrete now
            _write_plan_snapshot(p)
            continue
        if phase in ("confirmation", "test") and not p.selected:
            report.results.append(
                JobResult(
                    phase,
                    phase,
                    "blocked",
                    error=f"no {p.study_dir / 'selection.json'} yet; run the selection phase first",
                )
            )
            continue
        tests = {
            t.run_id: {"kind": "test", "study_dir": str(p.study_dir), "job": t.job()} for t in _filter(p.tests, only)
        }
        if phase == "test":
            # A run this call left for later is tested with it later, not reported as blocked now.
            later = {r.run_id for r in report.results if r.status == "deferred"}
            units = [u for rid, u in tests.items() if rid not in later]
            report.results += [
                JobResult(rid, "test", "deferred", error="its run was left for a later call")
                for rid in tests
                if rid in later
            ]
        else:
            units = [
                {"kind": "train", "executor": executor, "config": r.config.to_dict()}
                for r in _filter(p.phase(phase), only)
            ]
            if phase == "confirmation" and "test" in phases:
                # Test each run as soon as it finishes: a study cut short (or a GPU machine handed
                # back) then never leaves a finished checkpoint untested.
                units = [u | ({"test": tests[rid]} if (rid := u["config"]["run_id"]) in tests else {}) for u in units]
        if units:
            if scheduler == "ray":
                results = execute_on_ray(units, phase, progress, ray_address)
            else:
                budget = None if deadline is None else _TimeBudget.of(p, deadline)
                results = _execute_all(units, jobs, phase, progress, budget)
            if phase == "test":  # tests run right after their confirmation run count as this call's work
                results = [
                    dataclasses.replace(r, status="complete")
                    if r.status == "skipped" and r.run_id not in tested_before
                    else r
                    for r in results
                ]
            report.results += results
    return report


def terminal_test_results(
    preset_or_plan: str | Path | Plan, *, study_dir: str | Path | None = None, params: dict[str, Any] | None = None
):
    """Mean terminal-test accuracy per finished test job, as a DataFrame."""
    import pandas as pd

    p = (
        preset_or_plan
        if isinstance(preset_or_plan, Plan)
        else plan(preset_or_plan, study_dir=study_dir, params=params)
    )
    arms = {r.run_id: (r.arm, r.seed) for r in p.phase("confirmation")}
    rows = []
    for job in p.tests:
        path = RunDir(p.study_dir / job.run_id).test_path
        if path.exists():
            df = pd.read_parquet(path, columns=["correct", "truncated"])
            arm, seed = arms.get(job.run_id, ("initial", None))
            rows.append(
                {
                    "task": job.task,
                    "run_id": job.run_id,
                    "arm": arm,
                    "seed": seed,
                    "problems": len(df),
                    "accuracy": float(df["correct"].mean()),
                    "truncated": float(df["truncated"].mean()),
                }
            )
    return pd.DataFrame(rows)


def registered_analysis(study_dir: str | Path, preset: str | Path | None = None) -> tuple[dict | None, str | None]:
    """The analysis ``study_dir`` registered (its ``plan.json``), else the one ``preset`` registers, and a
    note when it is not the study's own (None, and why, where there is neither)."""
    path, name = Path(study_dir) / "plan.json", Path(study_dir).name
    recorded = read_json(path).get("preregistration") if path.is_file() else None
    if recorded:
        return recorded, None
    if preset is None:
        return None, f"{name} registered no analysis (no preregistration in its plan.json)"
    reg = plan(preset, study_dir=study_dir).preregistration
    if reg is None:
        return None, f"{name} registered no analysis, and neither does preset {preset}"
    return reg.to_json(), (
        f"{name} registered no analysis of its own; below, the comparisons preset {preset} registers, "
        "applied to its runs"
    )

"""Running a study's units as Ray tasks, on one host or a cluster (``run_study(scheduler="ray")``).

Each training run (with its terminal test, when it carries one) and each test job is one Ray
task that asks for the GPUs and CPUs its config needs (:func:`unit_resources`). A task runs the
unit exactly as a local worker process does (``units._execute_unit``): it skips a complete run,
resumes a partial one and records a failure beside the run. The study directory must be a path
that every node sees. A task whose worker process dies (killed, out of memory, node lost) is
retried by Ray up to ``RAY_MAX_RETRIES`` times; the retry finds the partial run and resumes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..locations import WORKSPACE_ENV, find_workspace
from ..provenance import RAY_NODE_ENV, RAY_TASK_ENV
from ..records import RunDir
from ..runtime import check_interrupted, interrupts

SCHEDULERS = ("local", "ray")
RAY_MAX_RETRIES = 3  # retries after a lost worker; an exception inside a run is a recorded failure, never retried
CANCEL_SECONDS = 120  # after a Ctrl-C, how long running tasks have to record their runs as interrupted
# CPU cores reserved per unit. A CPU-only run trains with this many torch threads, as a local
# worker does with --jobs equal to the cores; a GPU run needs a few for tokenizing, rewards and
# data; SGLang adds its tokenizer, scheduler and detokenizer processes.
CPUS_CPU_RUN = 1
CPUS_PER_GPU_RUN = 4
CPUS_SGLANG_RUN = 8
# Environment variables of the driver that every task sees (model cache, data, GGUF and wheel folders).
FORWARDED_ENV_PREFIX = "GRPO_KNOBS_"


@dataclass(frozen=True)
class Resources:
    """What one unit asks of a single node."""

    gpus: int  # 0 on CPU, 1 for the hf engine (or an attached SGLang server), 2 for a launched SGLang server + trainer
    cpus: int  # cores reserved; a CPU-only run uses this many torch threads

    def to_dict(self) -> dict[str, int]:
        return {"gpus": self.gpus, "cpus": self.cpus}


def _on_gpu(device: str, cluster_has_gpus: bool) -> bool:
    """``auto`` runs on CUDA wherever the cluster has GPUs, as it does on one machine."""
    return device.startswith("cuda") or (device == "auto" and cluster_has_gpus)


def config_resources(config: dict[str, Any], cluster_has_gpus: bool = True) -> Resources:
    """GPUs and CPUs of one training run, from its RunConfig fields.

    A launched SGLang server generates on one GPU while the trainer uses another; attached to a
    running server (``engine_url``) the run holds only the trainer's GPU.
    """
    if not _on_gpu(str(config.get("device", "auto")), cluster_has_gpus):
        return Resources(0, CPUS_CPU_RUN)
    if config.get("engine") == "sglang" and not config.get("engine_url"):
        return Resources(2, CPUS_SGLANG_RUN)
    return Resources(1, CPUS_PER_GPU_RUN)


def test_job_resources(job: dict[str, Any], cluster_has_gpus: bool = True) -> Resources:
    """A terminal test job generates with the hf engine on one GPU."""
    return (
        Resources(1, CPUS_PER_GPU_RUN)
        if _on_gpu(str(job.get("device", "auto")), cluster_has_gpus)
        else Resources(0, CPUS_CPU_RUN)
    )


def unit_resources(unit: dict[str, Any], cluster_has_gpus: bool = True) -> Resources:
    if unit["kind"] == "train":
        return config_resources(unit["config"], cluster_has_gpus)
    return test_job_resources(unit["job"], cluster_has_gpus)


def _already_done(unit: dict[str, Any]) -> bool:
    """Whether the unit would only report "skipped"; such units never wait for a worker."""
    if unit["kind"] == "train":
        run = RunDir(Path(unit["config"]["output_dir"]) / unit["config"]["run_id"])
        if not run.is_complete():
            return False
        test = unit.get("test")
        return test is None or RunDir(Path(test["study_dir"]) / test["job"]["run_id"]).test_path.exists()
    return RunDir(Path(unit["study_dir"]) / unit["job"]["run_id"]).test_path.exists()


def _import_ray():
    try:
        import ray
    except ImportError:
        raise RuntimeError(
            "scheduler 'ray' needs Ray: pip install -e '.[ray]' (on every node of the cluster)."
        ) from None
    return ray


def check_scheduler(scheduler: str, jobs: int, address: str | None) -> None:
    """Refuse a bad scheduler choice before any run starts."""
    if scheduler not in SCHEDULERS:
        raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {scheduler!r}.")
    if scheduler == "local":
        if address is not None:
            raise ValueError("ray_address is for scheduler 'ray'; add --scheduler ray or drop --ray-address.")
        return
    if jobs != 1:
        raise ValueError(
            "jobs is for scheduler 'local'; under 'ray' as many runs go side by side as the cluster's GPUs "
            "and CPUs hold. Drop --jobs."
        )
    _import_ray()


@contextlib.contextmanager
def _output_to(log: Path) -> Iterator[None]:
    """Send this process's stdout and stderr (progress bars, warnings, C-level messages) to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def _run_unit_in_task(unit: dict[str, Any], threads: int) -> dict[str, Any]:
    """The body of a Ray task: one unit in this worker process, as ``python -m grpo_knobs.study --worker``."""
    import ray

    from .units import _execute_unit, _worker_log

    try:
        import torch

        torch.set_num_threads(threads)
    except ImportError:
        pass
    log = _worker_log(unit)
    context = ray.get_runtime_context()  # recorded in the run's config.json (provenance.placement)
    os.environ[RAY_NODE_ENV], os.environ[RAY_TASK_ENV] = context.get_node_id(), context.get_task_id() or ""
    with _output_to(log):
        # The PID names this process for whoever needs to stop it; a retry appends its own header,
        # on a line of its own after a killed attempt's unfinished progress bar.
        print(
            f"\n--- {time.strftime('%Y-%m-%dT%H:%M:%S')} ray worker start (pid {os.getpid()}, node "
            f"{ray.util.get_node_ip_address()}, GPUs {ray.get_gpu_ids() or 'none'}, {threads} threads)",
            flush=True,
        )
        # ray.cancel interrupts the task as a Ctrl-C would: the run is recorded as interrupted.
        with interrupts(keep_ignored=False):
            result = _execute_unit(unit | {"progress": True})
    return dataclasses.asdict(result)


def _connect(ray, address: str | None) -> None:
    """Attach to ``address``, or start a local Ray instance; an existing connection is kept."""
    if ray.is_initialized():
        return
    if address is None:
        # Orphans of a killed worker (a papermill kernel, an SGLang server) die with it instead of
        # holding the GPUs its retry needs; a cluster takes it from `ray start` (docs/cluster.md).
        os.environ.setdefault("RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper", "true")
        ray.init(address="local", include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=address, log_to_driver=False)


def _node_sizes(ray) -> list[tuple[int, int]]:
    """(GPUs, CPUs) of every alive node."""
    return [(int(n["Resources"].get("GPU", 0)), int(n["Resources"].get("CPU", 0))) for n in ray.nodes() if n["Alive"]]


def _fit(need: Resources, nodes: list[tuple[int, int]], run_id: str) -> Resources:
    """The request as submitted: the GPUs it needs, and no more CPUs than a node can give per GPU.

    A GPU run's cores are capped at its GPUs' share of a node's cores, so a node with few cores
    per GPU still runs one job per GPU pair instead of leaving GPUs idle for want of cores.
    Raises ValueError when no node has the GPUs, instead of leaving the task queued forever.
    """
    if not nodes:
        raise ValueError("the Ray cluster has no alive nodes; start them with `ray start` (docs/cluster.md).")
    shares = [c if need.gpus == 0 else need.gpus * c // g for g, c in nodes if g >= need.gpus and c >= 1]
    if not shares:
        most = max((g for g, _ in nodes), default=0)
        raise ValueError(
            f"run {run_id} needs {need.gpus} GPU(s) on one node, and the Ray cluster's largest node has "
            f"{most}; add GPU nodes, or set device=cpu in the plan for a CPU-only cluster."
        )
    return Resources(need.gpus, max(1, min(need.cpus, max(shares))))


def _lost_task_error(ray, exc: Exception) -> str:
    """One line for a task that returned no result: its worker kept dying, or the task body itself raised."""
    lines = str(exc).strip().splitlines()
    if isinstance(exc, ray.exceptions.RayTaskError):  # not retried: the run's own failures are caught inside
        return f"the Ray task raised {type(exc.cause).__name__}: {exc.cause}"[:500]
    return f"{type(exc).__name__} after {RAY_MAX_RETRIES} retries: {lines[0][:300] if lines else ''}"


def _runtime_env() -> dict[str, Any]:
    """This library first on every task's path (a shared checkout), the driver's GRPO_KNOBS_* settings and
    its workspace."""
    lib = str(Path(__file__).resolve().parents[2])
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIX)}
    workspace = find_workspace()
    if workspace is not None:  # tasks start in another folder; they use the same notebooks
        env[WORKSPACE_ENV] = str(workspace)
    env["PYTHONPATH"] = lib + os.pathsep + "${PYTHONPATH}"
    return {"env_vars": env}


def execute_on_ray(units: list[dict[str, Any]], desc: str, progress: bool, address: str | None = None) -> list:
    """Run units as Ray tasks, longest first, with a progress bar here; returns JobResults in ``units`` order.

    Args:
        units: as ``run._execute_all`` takes them.
        desc: the progress bar's label (the phase).
        progress: show the bar.
        address: a Ray cluster (``ray start --head`` prints it; ``auto`` finds one started on this
            machine); None starts a local Ray instance with this machine's GPUs and CPUs.
    """
    from .units import ResultTally

    ray = _import_ray()
    _connect(ray, address)
    task = ray.remote(max_calls=1)(_run_unit_in_task)  # a fresh process per unit, as a local worker
    nodes = _node_sizes(ray)
    env = _runtime_env()
    with ResultTally(units, desc, progress) as tally:
        return _run_tasks(ray, task, units, tally, nodes, env)


def _run_tasks(ray, task, units: list[dict[str, Any]], tally, nodes: list[tuple[int, int]], env: dict) -> list:
    """Submit every unit not already done, longest first, and collect the results as they come."""
    from ..config import RunConfig
    from .units import JobResult, _tidy_complete_run, _unit_cost, _worker_log, unit_id, unit_run_id

    has_gpus = any(g > 0 for g, _ in nodes)
    pending: dict[Any, dict[str, Any]] = {}
    # Longest first (most collections); Ray starts queued tasks of one resource shape in the order submitted.
    todo = []
    for unit in sorted(units, key=_unit_cost, reverse=True):
        run_id, phase = unit_id(unit)
        if _already_done(unit):
            if unit["kind"] == "train":  # what a kill left beside the complete run
                _tidy_complete_run(RunConfig.from_dict(unit["config"]))
            tally.add(JobResult(run_id, phase, "skipped"))
        else:  # every request is checked before the first task starts
            todo.append((unit, _fit(unit_resources(unit, has_gpus), nodes, run_id)))
    try:
        for unit, need in todo:
            ref = task.options(
                num_gpus=need.gpus,
                num_cpus=need.cpus,
                max_retries=RAY_MAX_RETRIES,
                retry_exceptions=False,
                runtime_env=env,
                name=unit_run_id(unit),
            ).remote(unit, max(1, need.cpus))
            pending[ref] = unit | {"submitted": time.perf_counter()}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                unit = pending.pop(ref)
                try:
                    tally.add(JobResult(**ray.get(ref)))
                except ray.exceptions.RayError as exc:
                    run_id, phase = unit_id(unit)
                    seconds = time.perf_counter() - unit["submitted"]
                    tally.add(
                        JobResult(run_id, phase, "failed", seconds, _lost_task_error(ray, exc), str(_worker_log(unit)))
                    )
            check_interrupted()
    except KeyboardInterrupt:
        _cancel(ray, list(pending))
        raise
    return tally.finish()


def _cancel(ray, refs: list) -> None:
    """After a Ctrl-C: queued tasks never start, running ones get a KeyboardInterrupt (their runs are
    recorded as interrupted); wait for them to end, then force the rest."""
    for ref in refs:
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=False)
    _, left = ray.wait(refs, num_returns=len(refs), timeout=CANCEL_SECONDS) if refs else ([], [])
    for ref in left:
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=True)

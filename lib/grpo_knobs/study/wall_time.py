"""A study call's wall time against the job times of the runs it trained: how many GPUs' worth of
work the scheduler kept going. ``run_study`` appends one record per call to
``<study_dir>/study_times.json`` and its report prints it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterable

from ..provenance import placement_device
from ..records import RunDir, atomic_write_json, read_json
from .planning import TRAIN_PHASES
from .units import JobResult

STUDY_TIMES_FILE = "study_times.json"


def _where(run: RunDir) -> dict[str, Any]:
    """The host, GPU and Ray node of a run's last process (``config.json`` ``placements``)."""
    placements = read_json(run.config_path).get("placements") or [{}]
    last = placements[-1]
    gpu = last.get("gpu") or {}
    return {
        "hostname": last.get("hostname"),
        "gpu": placement_device(last) if gpu else None,
        "gpu_name": gpu.get("name"),
        "ray_node_id": last.get("ray_node_id"),
    }


def call_times(
    study_dir: Path, results: Iterable[JobResult], started: float, wall_seconds: float, scheduler: str
) -> dict[str, Any]:
    """One call of ``run_study``: its wall time, and the runs it trained with their job times and places.

    ``run_job_seconds`` sums the trained runs' job clocks (``timings.json`` ``job``: start to final
    checkpoint); ``parallelism`` is that sum over the wall time, about the number of GPUs kept busy
    (their tests, start-up and the scheduler's gaps are what it leaves out).
    """
    results = list(results)
    trained = [r for r in results if r.status == "complete" and r.phase in TRAIN_PHASES]
    runs = {}
    for r in trained:
        run = RunDir(study_dir / r.run_id)
        try:
            runs[r.run_id] = {"job_seconds": run.job_seconds(), **_where(run)}
        except (OSError, ValueError, KeyError, TypeError):  # a record to read, not to fail the report over
            runs[r.run_id] = {"job_seconds": None, "hostname": None, "gpu": None, "ray_node_id": None}
    job = sum(v["job_seconds"] or 0.0 for v in runs.values())
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "scheduler": scheduler,
        "wall_seconds": wall_seconds,
        "runs_trained": len(runs),
        "tests_run": sum(r.status == "complete" and r.phase == "test" for r in results),
        "run_job_seconds": job,
        "unit_seconds": sum(r.seconds for r in results if r.status == "complete"),  # workers' time, tests too
        "parallelism": job / wall_seconds if wall_seconds > 0 else None,
        "hosts": sorted({v["hostname"] for v in runs.values() if v["hostname"]}),
        "ray_nodes": sorted({v["ray_node_id"] for v in runs.values() if v["ray_node_id"]}),
        "gpus": sorted({v["gpu"] for v in runs.values() if v["gpu"]}),
        "runs": runs,
    }


def record_call(study_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
    """Append ``record`` to ``<study_dir>/study_times.json`` (its ``calls``, oldest first)."""
    path = study_dir / STUDY_TIMES_FILE
    calls = read_json(path)["calls"] if path.exists() else []
    atomic_write_json(path, {"calls": [*calls, record]})
    return record


def describe_call(record: dict[str, Any]) -> str:
    """One line for the study report."""
    wall = record["wall_seconds"] / 60
    if not record["runs_trained"]:
        return f"Wall time {wall:.1f} min; no run trained in this call ({record['tests_run']} test jobs)."
    gpus, hosts = len(record["gpus"]), len(record["hosts"])
    where = f"on {gpus} GPU{'s' * (gpus != 1)} of " if gpus else "on "
    where += f"{hosts} host{'s' * (hosts != 1)}"
    return (
        f"Wall time {wall:.1f} min for {record['runs_trained']} trained runs whose job times sum to "
        f"{record['run_job_seconds'] / 60:.1f} min ({record['parallelism']:.2f}x the wall time) {where}; "
        f"{record['tests_run']} test jobs (study_times.json)."
    )

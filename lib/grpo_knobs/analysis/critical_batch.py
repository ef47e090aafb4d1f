"""Critical batch sizes (notebook 56): generation and training batch boundaries, time-to-target prediction."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from grpo_knobs.analysis.constants import SHAPE_COLUMNS
from grpo_knobs.analysis.ordering import sort_tasks
from grpo_knobs.analysis.time_to_target import time_to_target_table


def critical_generation_batch(batch: Sequence[float], tokens_per_s: Sequence[float], fraction: float = 0.9) -> float:
    """Smallest measured batch whose generation throughput reaches ``fraction`` of the peak.

    Hunyuan ("When Do Larger Batches Help Scale LLM RL?") defines the
    critical generation batch as the system-efficiency boundary: for a fixed
    model, decoding engine, response-length distribution and hardware, the
    batch where generation throughput approaches its plateau. Below it more
    concurrent sequences share each weight read and raise throughput; above
    it a larger batch buys little. The measured "approaches" is operational
    here: ``fraction`` of the highest throughput seen. ``batch`` and
    ``tokens_per_s`` have shape [points].
    """
    b = np.asarray(batch, dtype=float)
    thr = np.asarray(tokens_per_s, dtype=float)
    if b.shape != thr.shape or b.size == 0:
        raise ValueError("batch and tokens_per_s must be non-empty and equally long")
    order = np.argsort(b)
    b, thr = b[order], thr[order]
    return float(b[np.flatnonzero(thr >= fraction * thr.max())[0]])


def critical_training_batch(
    batch: Sequence[float], responses_needed: Sequence[float], tolerance: float = 1.2
) -> float | None:
    """Largest training batch whose responses-to-target stay within ``tolerance`` x the smallest.

    Hunyuan defines the critical training batch as the sample-efficiency
    boundary: under the current tuning (e.g. square-root LR scaling), the
    upper end of approximate batch-size invariance, where a larger batch
    still needs about the same number of responses to reach a target. Past
    it, fewer updates are no longer compensated and the responses needed
    grow. Censored arms (NaN: target not reached) count as outside the
    tolerance. Returns None when no arm reached the target. Shapes [arms].
    """
    b = np.asarray(batch, dtype=float)
    need = np.asarray(responses_needed, dtype=float)
    if b.shape != need.shape:
        raise ValueError("batch and responses_needed must be equally long")
    reached = np.isfinite(need)
    if not reached.any():
        return None
    within = reached & (need <= tolerance * need[reached].min())
    return float(b[within].max())


def interpolate_throughput(
    batch: Sequence[float], tokens_per_s: Sequence[float], at: Sequence[float] | float
) -> np.ndarray:
    """Throughput at ``at``, linear in log2(batch) between measured points, clamped at the ends."""
    b = np.asarray(batch, dtype=float)
    order = np.argsort(b)
    return np.interp(
        np.log2(np.asarray(at, dtype=float)), np.log2(b[order]), np.asarray(tokens_per_s, dtype=float)[order]
    )


def responses_to_target(
    curves: pd.DataFrame, runs: pd.DataFrame, targets: Mapping[str, float], phase: str = "screening"
) -> pd.DataFrame:
    """Per run of ``phase``: the first evaluation at or above the task's target (NaN if censored)."""
    table = time_to_target_table(curves, runs[runs["phase"] == phase], {task: [t] for task, t in targets.items()})
    shape = runs[["run_id", "arm", *SHAPE_COLUMNS, "responses_per_collection"]]
    if "run_id" not in table:  # no task of these runs has a target
        return pd.DataFrame(columns=[*table.columns, "responses_needed", *shape.columns])
    table = table.merge(shape, on="run_id").rename(columns={"responses_high": "responses_needed"})
    return table


def predict_time_to_target(
    rt: pd.DataFrame,
    runs: pd.DataFrame,
    collections: pd.DataFrame,
    bench_batch: Sequence[float],
    bench_tokens_per_s: Sequence[float],
    concurrency_cap: int = 512,
) -> pd.DataFrame:
    """Predicted vs measured active seconds to target, per run that reached it.

    Hunyuan's decomposition, time = responses needed / throughput, is
    applied per component: with N responses needed, the run's mean output
    tokens per response L, collection size R and generation batch
    b = min(R, concurrency_cap),

        predicted = N * L / thr(b)                (generation, benchmark curve)
                  + N * L * c_train                (trainer, per output token)
                  + (N / R) * c_sync               (weight sync, per collection)

    where ``c_train`` and ``c_sync`` are medians over the task's runs in
    ``rt``, so only throughput, length and responses needed differ between
    arms. Measured is the active-phase seconds at the bracket's end (the
    first evaluation at or above target). ``rt`` comes from
    :func:`responses_to_target`; ``bench_*`` have shape [benchmark points].

    ``predicted_steps_active_s`` replaces the generation term with decode
    steps: an engine that keeps finished rows in its batch decodes each chunk
    of b responses until its longest response ends, so a collection costs
    ceil(R / b) chunks x Lmax steps x b / thr(b) seconds per step, with Lmax
    the run's mean longest response per collection. With a long tail of
    runaway responses this, not N * L / thr(b), is what a run pays.
    """
    per_run = (
        collections[collections["run_id"].isin(rt["run_id"])]
        .groupby("run_id")
        .agg(
            trainer=("trainer_seconds", "sum"),
            sync=("sync_seconds", "sum"),
            generation=("generation_seconds", "sum"),
            tokens=("output_tokens", "sum"),
            n=("collection", "size"),
            longest=("response_length_max", "mean"),
        )
    )
    per_run = per_run.join(rt.set_index("run_id")["task"])
    per_run["c_train"] = per_run["trainer"] / per_run["tokens"]
    per_run["c_sync"] = per_run["sync"] / per_run["n"]
    medians = per_run.groupby("task")[["c_train", "c_sync"]].median()
    reached = rt[rt["reached"]].merge(runs[["run_id", "mean_response_length"]], on="run_id")
    gen_batch = np.minimum(reached["responses_per_collection"], concurrency_cap)
    thr = interpolate_throughput(bench_batch, bench_tokens_per_s, gen_batch)
    n, length = reached["responses_needed"], reached["mean_response_length"]
    c_train = reached["task"].map(medians["c_train"])
    c_sync = reached["task"].map(medians["c_sync"])
    collections_needed = n / reached["responses_per_collection"]
    longest = per_run["longest"].reindex(reached["run_id"]).to_numpy()
    chunks = np.ceil(reached["responses_per_collection"] / gen_batch)
    rest = n * length * c_train + collections_needed * c_sync  # trainer + weight sync
    out = pd.DataFrame(
        {
            "task": reached["task"],
            "arm": reached["arm"],
            "B": reached["global_batch_size"],
            "collection": reached["responses_per_collection"],
            "generation_batch": gen_batch,
            "responses_needed": n,
            "benchmark_tokens_per_s": thr,
            "measured_tokens_per_s": (per_run["tokens"] / per_run["generation"]).reindex(reached["run_id"]).to_numpy(),
            "mean_length": length,
            "longest_mean": longest,
            "predicted_active_s": n * length / thr + rest,
            "predicted_steps_active_s": collections_needed * chunks * longest * gen_batch / thr + rest,
            "measured_active_s": reached["active_seconds_high"],
        }
    )
    out["ratio"] = out["predicted_active_s"] / out["measured_active_s"]
    out["ratio_steps"] = out["predicted_steps_active_s"] / out["measured_active_s"]
    return sort_tasks(out.sort_values(["collection", "B", "arm"]))


def measured_generation_throughput(
    collections: pd.DataFrame, runs: pd.DataFrame, concurrency_cap: int = 512
) -> pd.DataFrame:
    """Per run: output tokens per generation second at its generation batch min(P*G, cap)."""
    per_run = (
        collections.groupby("run_id")
        .agg(tokens=("output_tokens", "sum"), seconds=("generation_seconds", "sum"))
        .reset_index()
    )
    merged = per_run.merge(runs[["run_id", "task", "arm", "phase", "responses_per_collection"]], on="run_id")
    merged["generation_batch"] = np.minimum(merged["responses_per_collection"], concurrency_cap)
    merged["tokens_per_s"] = merged["tokens"] / merged["seconds"]
    return sort_tasks(merged.sort_values(["generation_batch", "arm"]))

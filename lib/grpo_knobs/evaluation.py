"""Greedy evaluation: one response per problem, graded per problem.

Used during training on the validation split and by the terminal test job, which
evaluates a saved checkpoint (or the initial model) on the test split.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from . import data as data_mod
from .prompts import render_prompt
from .verifiers import grade


def encode_prompts(problems: list, tokenizer) -> list[list[int]]:
    return [tokenizer(render_prompt(p, tokenizer), add_special_tokens=False)["input_ids"] for p in problems]


def evaluate(
    engine, tokenizer, problems: list, max_new_tokens: int, batch_size: int = 512, progress: bool = False
) -> list[dict[str, Any]]:
    """Greedy responses for ``problems``; one row per problem with both gradings.

    ``correct`` is the study's grading (flexible for GSM8K); ``correct_strict`` accepts
    only a ``#### N`` marker for GSM8K and equals ``correct`` for Countdown.
    """
    prompt_ids = encode_prompts(problems, tokenizer)
    rows: list[dict[str, Any]] = []
    chunks = range(0, len(problems), batch_size)
    for start in tqdm(chunks, desc="evaluate", disable=not progress, leave=False):
        gen = engine.generate(
            prompt_ids[start : start + batch_size], n=1, max_new_tokens=max_new_tokens, temperature=0.0, seed=0
        )
        for k, text in enumerate(gen.texts):
            problem = problems[start + k]
            correct = grade(problem, text)
            strict = grade(problem, text, mode="strict") if problem.task == "gsm8k" else correct
            rows.append(
                {
                    "problem_id": problem.id,
                    "correct": float(correct),
                    "correct_strict": float(strict),
                    "response_length": len(gen.token_ids[k]),
                    "truncated": gen.finish_reasons[k] == "length",
                    "response": text,
                }
            )
    return rows


def evaluate_model(
    model_name: str, problems: list, max_new_tokens: int, device: str = "auto", progress: bool = True
) -> tuple[list[dict[str, Any]], Any]:
    """Load a checkpoint or registry model, build its engine, and evaluate it greedily on ``problems``.

    Returns the per-problem rows of :func:`evaluate` and the model's provenance (``ModelInfo``).
    """
    from .models import load_model
    from .rollout import make_engine
    from .runtime import resolve_device

    dev = resolve_device(device)
    model, tokenizer, info = load_model(model_name, device=dev)
    engine = make_engine("hf", model, tokenizer, device=dev)
    return evaluate(engine, tokenizer, problems, max_new_tokens, progress=progress), info


def run_test_job(study_dir: str | Path, job: dict) -> Path:
    """The terminal test job: evaluate a checkpoint (or the initial model) on the test split.

    ``job`` holds ``run_id`` (a confirmation run, or ``initial-<task>``), ``task``,
    ``model`` (a checkpoint folder or registry name), ``max_new_tokens`` and optionally
    ``problems`` (None = the whole split), ``device``, ``data_dir``. Writes
    ``<study_dir>/<run_id>/test.parquet`` and never overwrites an existing one.
    """
    from .config import check_name, inside
    from .records import RunDir, atomic_write_json, atomic_write_parquet, evals_frame

    inside(study_dir, check_name("run_id", job["run_id"]))  # test rows land in the study, nowhere else
    run = RunDir(Path(study_dir) / job["run_id"])
    if run.test_path.exists():
        raise FileExistsError(f"{run.test_path} already exists; terminal test results are never overwritten.")
    t0 = time.perf_counter()
    problems = data_mod.load_split(job["task"], "test", data_dir=job.get("data_dir"))
    if job.get("problems"):
        problems = problems[: int(job["problems"])]
    rows, info = evaluate_model(job["model"], problems, int(job["max_new_tokens"]), job.get("device", "auto"))
    run.path.mkdir(parents=True, exist_ok=True)
    if not run.config_path.exists():  # the initial model's job has no training config
        atomic_write_json(
            run.config_path,
            {
                "run_id": job["run_id"],
                "study": Path(study_dir).name,
                "config": {
                    "phase": "initial",
                    "task": job["task"],
                    "arm": "initial",
                    "seed": 0,
                    "model": job["model"],
                },
                "model": info.__dict__ | {"path": str(info.path)},
            },
        )
    meta = {
        "run_id": job["run_id"],
        "split": "test",
        "collections": -1,
        "updates": -1,
        "responses": -1,
        "output_tokens": -1,
        "active_seconds": float("nan"),
        "job_seconds": time.perf_counter() - t0,
    }
    atomic_write_parquet(run.test_path, evals_frame([meta | r for r in rows]))
    return run.test_path

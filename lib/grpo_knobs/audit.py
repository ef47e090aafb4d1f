"""Reward audit of the initial model: the same greedy responses graded strict and flexible.

The study found that most of an apparent GSM8K gain was answer formatting (strict
``####`` grading: 60.9%; a flexible numeric verifier: 82.0% on the same responses), so
this runs before any comparison.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import data as data_mod
from .evaluation import evaluate_model
from .records import atomic_write_parquet
from .verifiers import grade


def run_reward_audit(
    task: str = "gsm8k",
    model: str = "smollm2-135m-instruct",
    problems: int = 16,
    max_new_tokens: int = 256,
    out_dir: Path = Path("runs/audit"),
    device: str = "auto",
    split: str = "validation",
) -> Path:
    """Writes ``<out_dir>/reward_audit-<task>.parquet`` and returns its path."""
    chosen = data_mod.load_split(task, split)[:problems]
    rows, _ = evaluate_model(model, chosen, max_new_tokens, device)
    df = pd.DataFrame(
        {
            "problem_id": [p.id for p in chosen],
            "answer": [p.answer for p in chosen],
            "response": [r["response"] for r in rows],
            "correct_strict": [
                grade(p, r["response"], mode="strict") if p.task == "gsm8k" else r["correct"]
                for p, r in zip(chosen, rows)
            ],
            "correct_flexible": [r["correct"] for r in rows],
            "response_length": [r["response_length"] for r in rows],
            "truncated": [r["truncated"] for r in rows],
        }
    )
    out = Path(out_dir) / f"reward_audit-{task}.parquet"
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        raise FileExistsError(f"{out} already exists; choose another --out-dir or remove it.")
    atomic_write_parquet(out, df)
    print(
        f"{task}: {len(df)} responses; strict accepts {df.correct_strict.mean():.1%}, "
        f"flexible accepts {df.correct_flexible.mean():.1%}"
    )
    return out

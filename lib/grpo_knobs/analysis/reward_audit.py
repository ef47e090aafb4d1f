"""Reward audit (notebook 54): strict versus flexible grading."""

from __future__ import annotations

from typing import Mapping

import pandas as pd

from grpo_knobs.analysis.ordering import order_tasks


def reward_audit_summary(audits: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Per task: problems, strict and flexible accuracy %, the gap and disagreements."""
    rows = []
    for task in order_tasks(audits):
        a = audits[task]
        strict, flexible = a["correct_strict"].astype(float), a["correct_flexible"].astype(float)
        rows.append(
            {
                "task": task,
                "problems": len(a),
                "strict_pct": 100 * strict.mean(),
                "flexible_pct": 100 * flexible.mean(),
                "gap_pp": 100 * (flexible.mean() - strict.mean()),
                "flexible_only": int(((flexible > 0) & (strict == 0)).sum()),
                "strict_only": int(((strict > 0) & (flexible == 0)).sum()),
            }
        )
    return pd.DataFrame(rows)


def reward_audit_examples(audit: pd.DataFrame, n: int = 3, max_chars: int = 160) -> pd.DataFrame:
    """The first ``n`` problems (by ID) where the graders disagree, responses shortened to their end."""
    disagree = audit[audit["correct_strict"].astype(float) != audit["correct_flexible"].astype(float)]
    ex = disagree.sort_values("problem_id").head(n)

    def tail(text: str) -> str:  # answers sit at the end of a response
        text = " ".join(str(text).split())
        return text if len(text) <= max_chars else "..." + text[-max_chars:]

    return pd.DataFrame(
        {
            "problem_id": ex["problem_id"],
            "answer": ex["answer"].astype(str),
            "strict": ex["correct_strict"].astype(int),
            "flexible": ex["correct_flexible"].astype(int),
            "response_end": ex["response"].map(tail),
        }
    ).reset_index(drop=True)


def initial_test_grading(initial_tests: pd.DataFrame) -> pd.DataFrame:
    """The initial model's terminal test accuracy %, strict and flexible, per task."""
    if initial_tests.empty:
        return pd.DataFrame(columns=["task", "problems", "strict_pct", "flexible_pct"])
    g = initial_tests.groupby("task")
    table = pd.DataFrame(
        {
            "problems": g["problem_id"].nunique(),
            "strict_pct": 100 * g["correct_strict"].mean(),
            "flexible_pct": 100 * g["correct"].mean(),
        }
    ).reset_index()
    return table.set_index("task").loc[order_tasks(table["task"])].reset_index()

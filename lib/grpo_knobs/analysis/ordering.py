"""Display order: tasks (GSM8K first) and recipe labels."""

from __future__ import annotations

from typing import Iterable, Sequence

import pandas as pd


def order_tasks(tasks: Iterable[str]) -> list[str]:
    """GSM8K, then Countdown, then any other task alphabetically."""
    known = ["gsm8k", "countdown"]
    tasks = set(tasks)
    return [t for t in known if t in tasks] + sorted(tasks - set(known))


def sort_tasks(table: pd.DataFrame) -> pd.DataFrame:
    """Stable sort of ``table`` by its ``task`` column in :func:`order_tasks` order."""
    rank = {task: i for i, task in enumerate(order_tasks(table["task"].unique()))}
    return table.sort_values("task", key=lambda col: col.map(rank), kind="stable", ignore_index=True)


def recipe_order(runs: pd.DataFrame, task: str, selection: dict | None = None) -> list[str]:
    """Recipe labels of ``task``: selection order (baseline first) when known, else sorted."""
    task_runs = runs[runs["task"] == task]
    labels = list(dict.fromkeys(task_runs.sort_values("label")["label"]))
    if selection and task in selection.get("recipes", {}):
        arm_to_label = dict(zip(task_runs["arm"], task_runs["label"]))
        chosen = [arm_to_label[a] for a in selection["recipes"][task] if a in arm_to_label]
        labels = chosen + [label for label in labels if label not in chosen]
    return labels


def _sort_by_labels(
    table: pd.DataFrame, labels: Sequence[str] | None, keys: list[str], column: str = "recipe"
) -> pd.DataFrame:
    """Sort ``table`` by ``keys``, with ``column`` in the given label order."""
    if labels is not None:
        rank = {label: i for i, label in enumerate(labels)}
        table = table.assign(_rank=table[column].map(lambda x: rank.get(x, len(rank))))
        keys = [k if k != column else "_rank" for k in keys]
        return table.sort_values(keys, ignore_index=True).drop(columns="_rank")
    return table.sort_values(keys, ignore_index=True)

"""What the policy wrote (notebooks 50, 54): sampled training responses and evaluation responses.

A run directory may hold ``samples.jsonl.gz``: per collection a few sampled
responses per reward outcome, one JSON object per line with ``collection``,
``responses``, ``prompt_id``, ``reward``, ``finish_reason``, ``length`` and
``text``. ``evals.parquet`` may hold a ``response`` column. Older runs have
neither; the functions then return an empty frame.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..records import SAMPLE_FIELDS, RunDir

SAMPLES_FILE = "samples.jsonl.gz"
SAMPLE_COLUMNS = SAMPLE_FIELDS
EXAMPLE_COLUMNS = ("stage", *SAMPLE_COLUMNS)


def _stage_points(points: np.ndarray) -> dict[str, int]:
    """First, middle and last of sorted ``points`` [n] (fewer names when n < 3)."""
    points = np.unique(points)
    picks = {"start": points[0], "middle": points[len(points) // 2], "end": points[-1]}
    seen, out = set(), {}
    for stage, value in picks.items():
        if value not in seen:
            seen.add(value)
            out[stage] = int(value)
    return out


def load_samples(run_dir: str | Path) -> pd.DataFrame:
    """Rows of ``samples.jsonl.gz`` (empty frame with its columns when the run has none).

    Read by the run directory's own reader (:meth:`RunDir.samples`), which drops
    a torn last gzip member left by a kill.
    """
    run = RunDir(run_dir)
    rows = run.samples()
    path = run.samples_path
    if not rows:
        return pd.DataFrame(columns=list(SAMPLE_COLUMNS))
    frame = pd.DataFrame(rows)
    missing = [c for c in SAMPLE_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"{path} lacks fields {missing}")
    return frame


def completion_examples(run_dir: str | Path, per_outcome: int = 1, max_chars: int | None = 400) -> pd.DataFrame:
    """Sampled training responses at the start, middle and end of a run, ``per_outcome`` per reward.

    Stages are the first, middle and last collection in ``samples.jsonl.gz``;
    within each, the first ``per_outcome`` rows of every reward value (e.g. one
    correct, one wrong). ``max_chars`` keeps the end of longer texts, where the
    answer sits. Empty when the run stored no samples.
    """
    samples = load_samples(run_dir)
    if samples.empty:
        return pd.DataFrame(columns=list(EXAMPLE_COLUMNS))
    parts = []
    for stage, collection in _stage_points(samples["collection"].to_numpy()).items():
        chosen = samples[samples["collection"] == collection].groupby("reward", sort=True).head(per_outcome)
        parts.append(chosen.assign(stage=stage))
    out = pd.concat(parts, ignore_index=True)[list(EXAMPLE_COLUMNS)]
    if max_chars is not None:
        out["text"] = out["text"].map(lambda t: t if len(t) <= max_chars else "..." + t[-max_chars:])
    return out


def eval_response_examples(
    evals: pd.DataFrame, run_id: str, per_outcome: int = 1, max_chars: int | None = 400
) -> pd.DataFrame:
    """Validation responses of one run at its first, middle and last evaluation, ``per_outcome``
    correct and wrong each. Empty when ``evals`` has no ``response`` column or no rows for the run."""
    columns = ["stage", "responses", "problem_id", "correct", "response_length", "truncated", "response"]
    if "response" not in evals.columns:
        return pd.DataFrame(columns=columns)
    rows = evals[(evals["run_id"] == run_id) & evals["response"].notna()]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    parts = []
    for stage, point in _stage_points(rows["responses"].to_numpy()).items():
        at = rows[rows["responses"] == point].sort_values("problem_id")
        parts.append(at.groupby("correct", sort=True).head(per_outcome).assign(stage=stage))
    out = pd.concat(parts, ignore_index=True)[columns]
    if max_chars is not None:
        out["response"] = out["response"].map(lambda t: t if len(t) <= max_chars else "..." + t[-max_chars:])
    return out


def print_examples(examples: pd.DataFrame, text_column: str = "text") -> None:
    """Print examples one per block: stage, point, outcome, then the text indented."""
    for row in examples.itertuples(index=False):
        r = row._asdict()
        head = "  ".join(f"{k}={r[k]}" for k in r if k not in (text_column,))
        print(head)
        print("    " + str(r[text_column]).replace("\n", "\n    "))

"""The run directory: the contract between training and analysis.

Every write is atomic (temporary file, fsync, rename), so a crash or a kill leaves each
file either as it was or complete. A run directory is never overwritten: a rerun needs a
new run id, or ``resume`` to continue from the last saved collection.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

COLLECTION_FIELDS = (
    "collection", "responses", "updates", "prompts", "distinct_prompts", "reward_mean",
    "mixed_group_fraction", "truncation_fraction", "response_length_mean", "response_length_max",
    "output_tokens", "output_tokens_cum", "logprob_mismatch", "per_update", "seconds",
    "active_seconds", "job_seconds", "peak_memory_gib",
)
UPDATE_FIELDS = ("update", "loss", "clip_fraction", "clip_low_fraction", "clip_high_fraction",
                 "approx_kl", "ratio_mean", "ratio_max", "grad_norm", "tokens", "micro_batches")
EVAL_COLUMNS = {
    "run_id": "string", "split": "string", "collections": "int64", "updates": "int64", "responses": "int64",
    "output_tokens": "int64", "active_seconds": "float64", "job_seconds": "float64", "problem_id": "string",
    "correct": "float64", "correct_strict": "float64", "response_length": "int64", "truncated": "bool",
}
TIMING_FIELDS = ("generation", "trainer", "sync", "evaluation", "checkpoint", "init", "job", "other", "active_phase")
STATUSES = ("running", "complete", "failed")


class RunExistsError(FileExistsError):
    """Raised instead of overwriting a finished or partial run."""


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())


def read_json(path: Path) -> Any:
    with open(path) as f:
        return json.load(f)


def evals_frame(rows: Iterable[dict]) -> pd.DataFrame:
    """Per-problem evaluation rows with the schema's column order and dtypes."""
    df = pd.DataFrame(list(rows), columns=list(EVAL_COLUMNS))
    missing = [c for c in EVAL_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"evaluation rows lack columns {missing}")
    return df.astype(EVAL_COLUMNS)


def atomic_write_parquet(path: Path, df: pd.DataFrame) -> None:
    import io
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    atomic_write_bytes(path, buf.getvalue())


class RunDir:
    """Reads and writes one run's records."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    # -- files
    @property
    def config_path(self) -> Path: return self.path / "config.json"
    @property
    def collections_path(self) -> Path: return self.path / "collections.jsonl"
    @property
    def evals_path(self) -> Path: return self.path / "evals.parquet"
    @property
    def timings_path(self) -> Path: return self.path / "timings.json"
    @property
    def state_path(self) -> Path: return self.path / "state.json"
    @property
    def resume_path(self) -> Path: return self.path / "resume"
    @property
    def final_path(self) -> Path: return self.path / "final"
    @property
    def test_path(self) -> Path: return self.path / "test.parquet"

    # -- lifecycle
    def state(self) -> dict | None:
        return read_json(self.state_path) if self.state_path.exists() else None

    def is_complete(self) -> bool:
        s = self.state()
        return bool(s and s.get("status") == "complete")

    def create(self, resume: bool) -> bool:
        """Prepare the directory. Returns True when an existing run is being resumed."""
        if self.path.exists() and any(self.path.iterdir()):
            state = self.state() or {"status": "unknown"}
            if not resume:
                raise RunExistsError(
                    f"Run directory {self.path} already exists (status: {state.get('status')}, "
                    f"{state.get('collections_done', 0)} collections recorded). Records are never overwritten: "
                    "choose a new run_id, or pass resume=True to continue it."
                )
            return True
        self.path.mkdir(parents=True, exist_ok=True)
        return False

    def write_state(self, status: str, collections_done: int, **extra: Any) -> None:
        assert status in STATUSES
        atomic_write_json(self.state_path, {"status": status, "collections_done": collections_done, **extra})

    # -- records
    def append_collection(self, row: dict) -> None:
        missing = [k for k in COLLECTION_FIELDS if k not in row]
        if missing:
            raise ValueError(f"collection record lacks {missing}")
        line = json.dumps(row, sort_keys=True, default=float) + "\n"
        with open(self.collections_path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def collections(self) -> list[dict]:
        if not self.collections_path.exists():
            return []
        rows = []
        with open(self.collections_path) as f:
            for line in f:
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        break  # a torn last line from a kill; everything before it is whole
        return rows

    def truncate_collections(self, keep: int) -> None:
        rows = self.collections()[:keep]
        atomic_write_bytes(self.collections_path,
                           "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode())

    def evals(self) -> pd.DataFrame:
        if not self.evals_path.exists():
            return evals_frame([])
        return pd.read_parquet(self.evals_path)

    def add_evals(self, rows: list[dict]) -> None:
        new = evals_frame(rows)
        old = self.evals()
        df = new if old.empty else pd.concat([old, new], ignore_index=True)
        atomic_write_parquet(self.evals_path, df)

    def truncate_evals(self, max_responses: int) -> None:
        df = self.evals()
        atomic_write_parquet(self.evals_path, df[df["responses"] <= max_responses].reset_index(drop=True))

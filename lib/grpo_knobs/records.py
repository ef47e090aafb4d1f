"""The run directory: the contract between training and analysis.

Every write is atomic (temporary file, fsync, rename), so a crash or a kill leaves each
file either as it was or complete. A run directory is never overwritten: a rerun needs a
new run id, or ``resume`` to continue from the last saved collection.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

COLLECTION_FIELDS = (
    "collection",
    "responses",
    "updates",
    "prompts",
    "distinct_prompts",
    "reward_mean",
    "mixed_group_fraction",
    "truncation_fraction",
    "response_length_mean",
    "response_length_max",
    "output_tokens",
    "output_tokens_cum",
    "logprob_mismatch",
    "per_update",
    "seconds",
    "active_seconds",
    "job_seconds",
    "peak_memory_gib",
    "entropy_mean",
    "zero_advantage_fraction",
    "group_reward_means",
)
UPDATE_FIELDS = (
    "update",
    "loss",
    "clip_fraction",
    "clip_low_fraction",
    "clip_high_fraction",
    "approx_kl",
    "ratio_mean",
    "ratio_max",
    "grad_norm",
    "tokens",
    "micro_batches",
)
EVAL_COLUMNS = {
    "run_id": "string",
    "split": "string",
    "collections": "int64",
    "updates": "int64",
    "responses": "int64",
    "output_tokens": "int64",
    "active_seconds": "float64",
    "job_seconds": "float64",
    "problem_id": "string",
    "correct": "float64",
    "correct_strict": "float64",
    "response_length": "int64",
    "truncated": "bool",
    "response": "string",
}
# Columns that records written before they existed lack.
OPTIONAL_EVAL_COLUMNS = ("response",)
SAMPLE_FIELDS = ("collection", "responses", "prompt_id", "reward", "finish_reason", "length", "text")
TIMING_FIELDS = ("generation", "trainer", "sync", "evaluation", "checkpoint", "init", "job", "other", "active_phase")
STATUSES = ("running", "complete", "failed")
_RESUME = re.compile(r"^resume-\d+$")


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


def fsync_tree(folder: Path) -> None:
    """Flush every file under ``folder`` and the folder itself to disk before it is renamed into place."""
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_json(path: Path) -> Any:
    with open(path) as f:
        return json.load(f)


def evals_frame(rows: Iterable[dict]) -> pd.DataFrame:
    """Per-problem evaluation rows with the schema's column order and dtypes."""
    rows = list(rows)
    missing = sorted({c for r in rows for c in EVAL_COLUMNS if c not in r and c not in OPTIONAL_EVAL_COLUMNS})
    if missing:
        raise ValueError(f"evaluation rows lack columns {missing}")
    return pd.DataFrame(rows, columns=list(EVAL_COLUMNS)).astype(EVAL_COLUMNS)


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
    def config_path(self) -> Path:
        return self.path / "config.json"

    @property
    def collections_path(self) -> Path:
        return self.path / "collections.jsonl"

    @property
    def evals_path(self) -> Path:
        return self.path / "evals.parquet"

    @property
    def timings_path(self) -> Path:
        return self.path / "timings.json"

    @property
    def state_path(self) -> Path:
        return self.path / "state.json"

    @property
    def samples_path(self) -> Path:
        return self.path / "samples.jsonl.gz"

    @property
    def final_path(self) -> Path:
        return self.path / "final"

    @property
    def test_path(self) -> Path:
        return self.path / "test.parquet"

    # -- lifecycle
    def state(self) -> dict | None:
        return read_json(self.state_path) if self.state_path.exists() else None

    def is_complete(self) -> bool:
        s = self.state()
        return bool(s and s.get("status") == "complete")

    def check_new(self, resume: bool) -> bool:
        """True when an existing run is to be resumed; refuses to overwrite one. Creates nothing."""
        if self.path.exists() and any(self.path.iterdir()):
            state = self.state() or {"status": "unknown"}
            if not resume:
                raise RunExistsError(
                    f"Run directory {self.path} already exists (status: {state.get('status')}, "
                    f"{state.get('collections_done', 0)} collections recorded). Records are never overwritten: "
                    "choose a new run_id, or pass resume=True to continue it."
                )
            return True
        return False

    def write_state(self, status: str, collections_done: int, **extra: Any) -> None:
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        atomic_write_json(self.state_path, {"status": status, "collections_done": collections_done, **extra})

    # -- resumable state: resume-<N>/ folders, each complete once its state.json exists
    def resume_dir(self, collections_done: int) -> Path:
        return self.path / f"resume-{collections_done:06d}"

    def resume_states(self) -> list[Path]:
        """Intact saved states, oldest first."""
        found = [p for p in self.path.glob("resume-*") if _RESUME.match(p.name) and (p / "state.json").is_file()]
        return sorted(found, key=lambda p: int(p.name.split("-")[1]))

    def latest_resume_state(self) -> Path | None:
        states = self.resume_states()
        return states[-1] if states else None

    def remove_partial_resume_states(self) -> None:
        """Folders a crash left half-written (their state.json was never written)."""
        for p in self.path.glob(".resume-*.tmp"):
            shutil.rmtree(p, ignore_errors=True)

    def prune_resume_states(self, keep: Path | None) -> None:
        for p in self.path.glob("resume-*"):
            if p != keep:
                shutil.rmtree(p, ignore_errors=True)
        self.remove_partial_resume_states()

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
        atomic_write_bytes(self.collections_path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode())

    def append_samples(self, rows: list[dict]) -> None:
        """Append sampled responses as one gzip member (a torn last member loses only itself)."""
        if not rows:
            return
        data = "".join(json.dumps({k: r[k] for k in SAMPLE_FIELDS}) + "\n" for r in rows).encode()
        with open(self.samples_path, "ab") as f:
            f.write(gzip.compress(data, mtime=0))
            f.flush()
            os.fsync(f.fileno())

    def samples(self) -> list[dict]:
        if not self.samples_path.exists():
            return []
        rows = []
        try:
            with gzip.open(self.samples_path, "rt") as f:
                for line in f:
                    rows.append(json.loads(line))
        except (EOFError, gzip.BadGzipFile, json.JSONDecodeError):
            pass  # a torn last member from a kill; every earlier member is whole
        return rows

    def truncate_samples(self, keep_collections: int) -> None:
        if not self.samples_path.exists():
            return
        rows = [r for r in self.samples() if r["collection"] < keep_collections]
        data = "".join(json.dumps(r) + "\n" for r in rows).encode()
        atomic_write_bytes(self.samples_path, gzip.compress(data, mtime=0) if rows else b"")

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

"""The run directory: the contract between training and analysis.

Every write is atomic (temporary file, fsync, rename), so a crash or a kill leaves each
file either as it was or complete. A run directory is never overwritten: a rerun needs a
new run id, or ``resume`` to continue from the last saved collection.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import json
import math
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterable, Iterator

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
# The collections.jsonl fields every record has held since the first run, and their kinds; fields added
# later (entropy_mean, zero_advantage_fraction, group_reward_means, engine) are checked where present.
COLLECTION_SCHEMA = {
    "collection": "count",
    "responses": "count",
    "updates": "count",
    "prompts": "count",
    "distinct_prompts": "count",
    "output_tokens": "count",
    "output_tokens_cum": "count",
    "response_length_max": "count",
    "reward_mean": "number",
    "mixed_group_fraction": "number",
    "truncation_fraction": "number",
    "response_length_mean": "number",
    "active_seconds": "number",
    "job_seconds": "number",
    "logprob_mismatch": "number or null",
    "peak_memory_gib": "number or null",
    "seconds": "object of numbers",
    "per_update": "list of objects of numbers",
}
OPTIONAL_COLLECTION_SCHEMA = {
    "entropy_mean": "number or null",
    "zero_advantage_fraction": "number or null",
    "group_reward_means": "list of numbers",
    "engine": "object",
}
# JSON integers beyond int64 are no count or id a run writes, and pandas and the trackers cannot hold them.
_INT_LIMIT = 2**63


class RunExistsError(FileExistsError):
    """Raised instead of overwriting a finished or partial run."""


class RecordsError(ValueError):
    """A record file that breaks the run-directory contract; the message names the file and line."""


class RecordsWarning(UserWarning):
    """Records read short: a torn last line (a kill while appending) was left out."""


class CollectionRows(list):
    """The rows of a ``collections.jsonl``; ``torn_line`` is the number of a torn last line that was left
    out (a kill while appending it), else None."""

    torn_line: int | None = None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number")


def _checked_int(text: str) -> int:
    value = int(text)
    if abs(value) >= _INT_LIMIT:
        raise ValueError(f"the integer {text[:20]}{'...' if len(text) > 20 else ''} is out of range")
    return value


def _checked_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} is not a finite number")
    return value


def loads_finite(text: str) -> Any:
    """``json.loads`` that refuses NaN, Infinity and integers beyond int64 (ValueError)."""
    return json.loads(text, parse_constant=_reject_constant, parse_int=_checked_int, parse_float=_checked_float)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kind_error(kind: str, value: Any) -> str | None:
    """Why ``value`` is not of ``kind`` (a COLLECTION_SCHEMA kind), or None."""
    ok = {
        "count": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "number": _is_number,
        "number or null": lambda v: v is None or _is_number(v),
        "object": lambda v: isinstance(v, dict),
        "object of numbers": lambda v: isinstance(v, dict) and all(_is_number(x) for x in v.values()),
        "list of numbers": lambda v: isinstance(v, list) and all(_is_number(x) for x in v),
        "list of objects of numbers": lambda v: (
            isinstance(v, list)
            and all(isinstance(u, dict) and all(x is None or _is_number(x) for x in u.values()) for u in v)
        ),
    }[kind](value)
    if ok:
        return None
    shown = json.dumps(value)
    return f"must be {'a non-negative integer' if kind == 'count' else 'a ' + kind}, got {shown[:60]}"


def check_collection_row(row: Any) -> str | None:
    """What is wrong with one parsed ``collections.jsonl`` row, or None when it follows the schema."""
    if not isinstance(row, dict):
        return f"expected a JSON object, got {json.dumps(row)[:60]}"
    missing = [k for k in COLLECTION_SCHEMA if k not in row]
    if missing:
        return f"lacks {', '.join(missing)}"
    for schema in (COLLECTION_SCHEMA, OPTIONAL_COLLECTION_SCHEMA):
        for key, kind in schema.items():
            if key in row and (error := _kind_error(kind, row[key])):
                return f"{key} {error}"
    return None


def read_collections(path: str | Path, torn_tail_ok: bool = False) -> CollectionRows:
    """Every row of a ``collections.jsonl``, each checked: a JSON object with the schema's keys and types
    and finite numbers, the collections numbered 0, 1, 2, ... Raises :class:`RecordsError` naming the
    file and line of the first bad row, so no reader silently stops early or reads a row twice.

    Args:
        path: the file; a missing file has no rows.
        torn_tail_ok: leave out a last line that lacks its newline and does not parse (the trainer
            appends each row in one write, so only a kill mid-write leaves one) and note its number in
            ``torn_line``; else it is an error too.
    """
    path = Path(path)
    rows = CollectionRows()
    if not path.exists():
        return rows
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    for number, raw in enumerate(lines, start=1):
        last = number == len(lines)  # the text after the final newline: "" for a whole file
        if not raw.strip():
            continue
        try:
            row = loads_finite(raw.decode("utf-8"))
            error = check_collection_row(row)
        except (ValueError, UnicodeDecodeError) as exc:
            row, error = None, f"not valid JSON ({' '.join(str(exc).split())[:80]})"
        if error is None and row["collection"] != len(rows):  # rows are collections 0, 1, 2, ... in order
            error = f"collection {row['collection']} where {len(rows)} is due (a row missing, repeated or moved)"
        if error is None:
            rows.append(row)
            continue
        if last and torn_tail_ok:
            rows.torn_line = number
            warnings.warn(
                f"{path} line {number} is a torn last line (cut by a kill while it was written); "
                f"read the {len(rows)} whole rows before it",
                RecordsWarning,
                stacklevel=2,
            )
            break
        if last:  # only a kill mid-write leaves one, and resuming redoes that collection
            raise RecordsError(f"{path} line {number}: a torn last line ({error}); resume the run to redo it")
        raise RecordsError(
            f"{path} line {number}: {error}; only the trainer writes records: restore the file from a copy, "
            "or move the run away and run it again"
        )
    return rows


class WriteError(OSError):
    """A writer of large files (safetensors, torch.save) had a write refused part-way (disk, quota, size limit)."""


# How safetensors ("... (os error 28)") and torch.save's zip writer ("unexpected pos ...", "... failed
# writing file ...") report a write the system refused.
_WRITE_FAILED = re.compile(r"os error \d+|unexpected pos \d+|failed writing file", re.IGNORECASE)


@contextlib.contextmanager
def writing_folder(folder: Path) -> Iterator[None]:
    """Write a temporary folder in the block; on an error the folder is removed (freeing what it took). A
    write the system refused (a full disk, a quota, a file-size limit), which safetensors and torch.save
    report in their own words, becomes the OSError it stands for (:class:`WriteError`)."""
    try:
        yield
    except Exception as exc:
        shutil.rmtree(folder, ignore_errors=True)
        text = " ".join(str(exc).split())
        if isinstance(exc, OSError) or not _WRITE_FAILED.search(text):
            raise
        code = re.search(r"os error (\d+)", text)
        if code:
            raise WriteError(int(code.group(1)), os.strerror(int(code.group(1))), str(folder)) from exc
        raise WriteError(errno.EIO, f"a write was cut short ({text[:100]})", str(folder)) from exc


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
        line = json.dumps(row, sort_keys=True, default=float, allow_nan=False) + "\n"  # readers refuse NaN
        with open(self.collections_path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def collections(self) -> CollectionRows:
        """Every row, checked (:func:`read_collections`); a torn last line from a kill is left out."""
        return read_collections(self.collections_path, torn_tail_ok=True)

    def truncate_collections(self, keep: int) -> None:
        with warnings.catch_warnings():  # a torn last line is dropped here on purpose: its collection is redone
            warnings.simplefilter("ignore", RecordsWarning)
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

    def job_seconds(self) -> float:
        """The training job's seconds as timings.json records them (raises if the file or entry is missing)."""
        return float(read_json(self.timings_path)["job"])

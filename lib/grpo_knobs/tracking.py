"""Run records as experiment-tracker scalars: TensorBoard event files or a local trackio project.

The run directory stays the only contract: trackers are written beside it (``<run_dir>/tracking/``
by default, or a chosen directory) from the same rows the records hold, live while a run trains
(:class:`Tracker`) or afterwards from any run or study directory (:func:`export`). Nothing here
changes a record.

Scalars per collection (x = responses, updates or seconds):
  ``train/*``   reward, mixed-group and truncation fractions, response lengths, output tokens, distinct
                prompts, log-prob mismatch, peak memory, and ``entropy_mean`` / ``zero_advantage_fraction``
                where the records hold them;
  ``update/*``  the collection's updates: mean clip fraction, approximate KL, gradient norm and loss, largest
                ratio; on the responses and updates axes also every update at its own x (``update/each/*``);
  ``time/*``    the collection's generation, trainer and sync seconds, cumulative active and job seconds.
Scalars per evaluation: ``<split>/accuracy`` (flexible grading), ``<split>/accuracy_strict``, mean response
length and truncated fraction.

The seconds axis is active phase seconds (generation + trainer + sync, the study's time axis) in
milliseconds, because both trackers need integer steps. Every point also carries a wall time (live,
when it was written; exported, the run's start plus its job seconds), so TensorBoard's Relative axis
shows elapsed seconds on any x.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import numpy as np
import pandas as pd

from .records import RecordsError, RunDir, loads_finite

KINDS = ("tensorboard", "trackio")
X_AXES = ("responses", "updates", "seconds")
TRAIN_FIELDS = (
    "reward_mean",
    "mixed_group_fraction",
    "truncation_fraction",
    "response_length_mean",
    "response_length_max",
    "output_tokens",
    "distinct_prompts",
    "logprob_mismatch",
    "peak_memory_gib",
    "entropy_mean",
    "zero_advantage_fraction",
)
UPDATE_MEANS = ("clip_fraction", "approx_kl", "grad_norm", "loss")
PHASES = ("generation", "trainer", "sync")


# ---------------------------------------------------------------------------------------------------------------------
# Rows -> scalars
# ---------------------------------------------------------------------------------------------------------------------
def _number(value: Any) -> float | None:
    """A finite float, or None for absent / None / NaN values (which are not logged)."""
    if value is None or isinstance(value, (dict, list, str)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def x_value(x: str, responses: int, updates: int, active_seconds: float) -> int:
    """The integer step of a point on axis ``x`` (seconds as milliseconds)."""
    if x == "responses":
        return int(responses)
    if x == "updates":
        return int(updates)
    if x == "seconds":
        return round(1000 * active_seconds)
    raise ValueError(f"x must be one of {X_AXES}, got {x!r}.")


def collection_points(row: dict, x: str, batch_size: int | None = None) -> list[tuple[int, dict[str, float]]]:
    """(step, {tag: value}) points of one ``collections.jsonl`` row.

    ``batch_size`` (B) places each update at the responses it had consumed; without it the
    per-update points are left out on the responses axis.
    """
    step = x_value(x, row["responses"], row["updates"], row["active_seconds"])
    values = {f"train/{k}": _number(row.get(k)) for k in TRAIN_FIELDS}
    per_update = row.get("per_update") or []
    for key in UPDATE_MEANS:
        vals = [u[key] for u in per_update if _number(u.get(key)) is not None]
        values[f"update/{key}_mean"] = float(np.mean(vals)) if vals else None
    ratios = [u["ratio_max"] for u in per_update if _number(u.get("ratio_max")) is not None]
    values["update/ratio_max"] = float(max(ratios)) if ratios else None
    seconds = row.get("seconds") or {}
    values.update({f"time/{k}_seconds": _number(seconds.get(k)) for k in PHASES})
    values.update(
        {
            "time/active_seconds": _number(row["active_seconds"]),
            "time/job_seconds": _number(row["job_seconds"]),
            "progress/responses": float(row["responses"]),
            "progress/updates": float(row["updates"]),
        }
    )
    points = [(step, {k: v for k, v in values.items() if v is not None})]
    if x == "updates" or (x == "responses" and batch_size):
        first_response = row["responses"] - batch_size * len(per_update) if batch_size else 0
        for k, u in enumerate(per_update):
            # the trainer numbers a collection's S updates up to its cumulative count
            at = row["updates"] - len(per_update) + k + 1 if x == "updates" else first_response + (k + 1) * batch_size
            each = {f"update/each/{key}": _number(u.get(key)) for key in (*UPDATE_MEANS, "ratio_max")}
            points.append((int(at), {t: v for t, v in each.items() if v is not None}))
    return points


def eval_points(rows: pd.DataFrame | Iterable[dict], x: str) -> list[tuple[int, dict[str, float]]]:
    """(step, {tag: value}) per evaluation in per-problem evaluation rows (``evals.parquet`` / ``test.parquet``)."""
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    if frame.empty:
        return []
    points = []
    for (split, responses), group in frame.groupby(["split", "responses"], sort=True):
        first = group.iloc[0]
        step = x_value(x, responses, first["updates"], first["active_seconds"])
        points.append(
            (
                step,
                {
                    f"{split}/accuracy": float(group["correct"].mean()),
                    f"{split}/accuracy_strict": float(group["correct_strict"].mean()),
                    f"{split}/response_length_mean": float(group["response_length"].mean()),
                    f"{split}/truncated_fraction": float(group["truncated"].mean()),
                    f"{split}/problems": float(len(group)),
                },
            )
        )
    return points


# ---------------------------------------------------------------------------------------------------------------------
# Writers
# ---------------------------------------------------------------------------------------------------------------------
class _TensorBoard:
    """One run's event files under ``directory`` (torch's SummaryWriter, which needs the tensorboard package)."""

    def __init__(self, directory: Path, run: str, project: str, config: dict | None):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(directory / run))
        if config:
            self.writer.add_text("config", "\n".join(f"    {k}: {v}" for k, v in sorted(config.items())), 0)

    def write(self, points: list[tuple[int, dict[str, float]]], wall_time: float | None) -> None:
        for step, values in points:
            for tag, value in values.items():
                self.writer.add_scalar(tag, value, global_step=step, walltime=wall_time)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


@contextlib.contextmanager
def trackio_directory(directory: str | Path) -> Iterator[Any]:
    """trackio's local storage (``trackio.sqlite_storage.SQLiteStorage``) reading and writing ``directory``.

    trackio takes its directory from ``TRACKIO_DIR`` once, when imported, and its SQLite storage
    reads the module globals ``trackio.sqlite_storage.TRACKIO_DIR`` / ``trackio.utils.TRACKIO_DIR``
    at each call (trackio 0.43.0); they point at ``directory`` inside this block and are restored
    after it, so one process can write several directories. Outside Python, the same project is
    read with ``TRACKIO_DIR=<directory> trackio show``.
    """
    import trackio.sqlite_storage as storage
    from trackio import utils

    directory = Path(directory).resolve()
    saved = storage.TRACKIO_DIR, utils.TRACKIO_DIR
    storage.TRACKIO_DIR = utils.TRACKIO_DIR = directory
    try:
        yield storage.SQLiteStorage
    finally:
        storage.TRACKIO_DIR, utils.TRACKIO_DIR = saved


class _Trackio:
    """One run of a trackio project in ``directory``, written through trackio's own SQLite storage
    (``SQLiteStorage.bulk_log``, as trackio's CSV and TensorBoard importers write).

    Live, each call is written at once; ``buffered`` (an export) keeps the points and writes them in one
    transaction at ``close``.
    """

    def __init__(self, directory: Path, run: str, project: str, config: dict | None, buffered: bool = False):
        self.directory, self.run, self.project, self.config, self.buffered = directory, run, project, config, buffered
        self.pending: list[tuple[int, dict[str, float], str]] = []

    def write(self, points: list[tuple[int, dict[str, float]]], wall_time: float | None) -> None:
        when = dt.datetime.fromtimestamp(wall_time, dt.UTC) if wall_time else dt.datetime.now(dt.UTC)
        self.pending.extend((step, values, when.isoformat()) for step, values in points)
        if not self.buffered:
            self._flush()

    def _flush(self) -> None:
        if not self.pending:
            return
        with trackio_directory(self.directory) as storage:
            storage.bulk_log(
                self.project,
                self.run,
                [values for _, values, _ in self.pending],
                steps=[step for step, _, _ in self.pending],
                timestamps=[when for _, _, when in self.pending],
                config=self.config,
            )
        self.pending, self.config = [], None  # the config goes with the first points

    def close(self) -> None:
        self._flush()


def _require(kind: str) -> None:
    """Fail at the start of a run, not at its first collection, when the tracker's package is missing."""
    if kind not in KINDS:
        raise ValueError(f"tracker must be one of none, {', '.join(KINDS)}; got {kind!r}.")
    try:
        if kind == "tensorboard":
            import tensorboard  # noqa: F401  (torch's SummaryWriter needs it)
        else:
            import trackio.sqlite_storage  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(
            f"{kind} is not installed ({exc}); install the tracking extra: pip install -e '.[tracking]'"
        ) from None


# ---------------------------------------------------------------------------------------------------------------------
# Live tracking
# ---------------------------------------------------------------------------------------------------------------------
class Tracker:
    """Scalars of one run, logged as its records are written.

    Args:
        kind: "tensorboard" or "trackio".
        directory: TensorBoard: event files go to ``directory/<run>``; trackio: the trackio directory
            (``TRACKIO_DIR``) holding ``<project>.db``.
        run: run name (the run id).
        project: trackio project (the study); TensorBoard ignores it.
        x: "responses", "updates" or "seconds" (see the module docstring).
        batch_size: B, to place every update on the responses axis.
        config: the run's settings, stored with the run.
        buffered: trackio only: keep the points until ``close`` and write them at once (for exports).
    """

    def __init__(
        self,
        kind: str,
        directory: str | Path,
        run: str,
        project: str = "grpo-knobs",
        x: str = "responses",
        batch_size: int | None = None,
        config: dict | None = None,
        buffered: bool = False,
    ):
        if x not in X_AXES:
            raise ValueError(f"x must be one of {X_AXES}, got {x!r}.")
        _require(kind)
        self.x, self.batch_size = x, batch_size
        # Opened at the first write: a new run's directory must still be empty when the trainer creates it.
        self._open = lambda: (
            _TensorBoard(Path(directory), run, project, config)
            if kind == "tensorboard"
            else _Trackio(Path(directory), run, project, config, buffered=buffered)
        )
        self._writer = None

    def log_collection(self, row: dict, wall_time: float | None = None) -> int:
        """One ``collections.jsonl`` row, as ``RunDir.append_collection`` receives it; returns the points written.
        ``wall_time`` (POSIX seconds) defaults to now."""
        return self.write(collection_points(row, self.x, self.batch_size), wall_time)

    def log_eval(self, rows: pd.DataFrame | Iterable[dict], wall_time: float | None = None) -> int:
        """The per-problem rows of one evaluation, as ``RunDir.add_evals`` receives them; returns the points."""
        return self.write(eval_points(rows, self.x), wall_time)

    def write(self, points: list[tuple[int, dict[str, float]]], wall_time: float | None = None) -> int:
        """(step, {tag: value}) points, all at ``wall_time``."""
        if self._writer is None:
            self._writer = self._open()
        self._writer.write(points, wall_time)
        return len(points)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NullTracker:
    """``tracker: none``: the same calls, nothing written."""

    def log_collection(self, row: dict, wall_time: float | None = None) -> int:
        return 0

    def log_eval(self, rows: Any, wall_time: float | None = None) -> int:
        return 0

    def close(self) -> None:
        pass


def writable_directory(path: str | Path, what: str) -> Path:
    """``path``, created if needed, after checking that a file can be written there; OSError naming ``what``
    otherwise. Run before a run's directory is made, so a bad setting leaves nothing behind."""
    import tempfile

    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise OSError(exc.errno, f"{what} {path} is not a writable directory ({exc.strerror or exc})") from None
    return path


def open_tracker(cfg: Any) -> Tracker | NullTracker:
    """The live tracker a ``RunConfig`` asks for (``tracker``, ``tracking_dir``), or a NullTracker."""
    if cfg.tracker == "none":
        return NullTracker()
    if cfg.tracking_dir:
        directory = writable_directory(cfg.tracking_dir, "tracking_dir")
    else:  # inside the run directory, made at the first write (a new run's directory starts empty)
        directory = cfg.run_dir / "tracking" / cfg.tracker
    return Tracker(
        cfg.tracker,
        directory,
        cfg.resolved_run_id,
        project=cfg.study,
        batch_size=cfg.global_batch_size,
        config=cfg.to_dict(),
    )


# ---------------------------------------------------------------------------------------------------------------------
# Export of recorded runs
# ---------------------------------------------------------------------------------------------------------------------
def run_directories(path: str | Path) -> list[Path]:
    """``path`` itself when it is a run directory, else the run directories in it (a study), sorted.

    A run directory here holds ``config.json`` and ``collections.jsonl`` (``initial-<task>`` folders, which
    hold only terminal test rows, are left out).
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a directory; give a run or study directory.")

    def is_run(p: Path) -> bool:
        return (p / "config.json").is_file() and (p / "collections.jsonl").is_file()

    if is_run(path):
        return [path]
    runs = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".") and is_run(p))
    if not runs:
        raise FileNotFoundError(f"{path} holds no run directories (folders with config.json and collections.jsonl).")
    return runs


def _start_time(meta: dict) -> float | None:
    """The run's creation time (config.json ``created``), as a POSIX timestamp."""
    try:
        return dt.datetime.strptime(meta["created"], "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except (KeyError, TypeError, ValueError):
        return None


def _read_json_object(path: Path) -> dict:
    """A JSON object file with finite numbers only, or RecordsError naming the file."""
    try:
        value = loads_finite(path.read_text())
    except ValueError as exc:
        raise RecordsError(f"{path}: not valid JSON ({' '.join(str(exc).split())[:80]})") from None
    if not isinstance(value, dict):
        raise RecordsError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def _read_frame(path: Path) -> pd.DataFrame:
    """Per-problem evaluation rows with the columns an export reads, or RecordsError naming the file."""
    try:
        frame = pd.read_parquet(path)
    except (OSError, ValueError) as exc:
        raise RecordsError(f"{path}: not a readable parquet file ({' '.join(str(exc).split())[:80]})") from None
    needed = ["split", "responses", "updates", "active_seconds", "job_seconds", "correct", "correct_strict"]
    missing = [c for c in needed + ["response_length", "truncated"] if c not in frame.columns]
    if missing:
        raise RecordsError(f"{path}: lacks columns {missing}")
    return frame


@dataclass
class _RunRecords:
    """Everything an export writes for one run, read and checked before anything is written."""

    run: RunDir
    meta: dict
    rows: list[dict]
    evals: list[pd.DataFrame]
    timings: dict | None


def _read_run(run_dir: str | Path) -> _RunRecords:
    run = RunDir(run_dir)
    meta = _read_json_object(run.config_path)
    if not isinstance(meta.get("config", {}), dict):
        raise RecordsError(f"{run.config_path}: 'config' must be a JSON object")
    evals = [_read_frame(p) for p in (run.evals_path, run.test_path) if p.is_file()]
    timings = _read_json_object(run.timings_path) if run.timings_path.is_file() else None
    return _RunRecords(run, meta, run.collections(), evals, timings)


def export_run(
    run_dir: str | Path | _RunRecords, kind: str, out: str | Path, x: str = "responses", project: str | None = None
) -> int:
    """Write one run's records to a tracker in ``out``; returns the number of points written."""
    rec = run_dir if isinstance(run_dir, _RunRecords) else _read_run(run_dir)
    meta, rows = rec.meta, rec.rows
    cfg = meta.get("config", {})
    batch = cfg.get("global_batch_size")
    start = _start_time(meta)

    def wall(job_seconds: float) -> float | None:
        return start + float(job_seconds) if start is not None else None

    written = 0
    with Tracker(
        kind,
        out,
        str(meta.get("run_id", rec.run.path.name)),
        project=str(project or meta.get("study") or "grpo-knobs"),
        x=x,
        batch_size=batch if isinstance(batch, int) and not isinstance(batch, bool) and batch > 0 else None,
        config=cfg,
        buffered=True,
    ) as tracker:
        for row in rows:
            written += tracker.log_collection(row, wall(row["job_seconds"]))
        for frame in rec.evals:
            for _, group in frame.groupby(["split", "responses"], sort=True):
                written += tracker.log_eval(group, wall(group["job_seconds"].iloc[0]))
        if rows and rec.timings is not None:
            # the run's totals, init / evaluation / checkpoint included, at its last point
            totals = {f"total/{k}_seconds": float(v) for k, v in sorted(rec.timings.items()) if _number(v) is not None}
            last = rows[-1]
            tracker.write(
                [(x_value(x, last["responses"], last["updates"], last["active_seconds"]), totals)],
                wall(last["job_seconds"]),
            )
            written += 1
    return written


def export(
    path: str | Path, kind: str, out: str | Path | None = None, x: str = "responses", project: str | None = None
) -> tuple[Path, list[str]]:
    """Export a run or study directory's records; returns the output directory and the runs written.

    ``out`` defaults to ``<path>/tracking/<kind>``; trackio's project defaults to the study's name.
    """
    if kind not in KINDS:
        raise ValueError(f"--to must be one of {', '.join(KINDS)}, got {kind!r}.")
    if x not in X_AXES:
        raise ValueError(f"--x must be one of {', '.join(X_AXES)}, got {x!r}.")
    runs = run_directories(path)
    # Every run's records are read and checked before anything is written: a bad line stops the export
    # whole, naming its file and line, instead of leaving it short. (A torn last line, cut by a kill, is
    # left out with a RecordsWarning.)
    records = [_read_run(run_dir) for run_dir in runs]
    _require(kind)
    out = Path(out) if out else Path(path) / "tracking" / kind
    out.mkdir(parents=True, exist_ok=True)
    for rec in records:
        export_run(rec, kind, out, x=x, project=project)
    return out, [r.name for r in runs]

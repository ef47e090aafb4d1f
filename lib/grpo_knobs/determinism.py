"""What makes two runs the same run: a digest of a run's deterministic content, and a comparison of two runs.

A run's records hold two kinds of values. Learning values (rewards, losses, gradient norms, tokens,
evaluation rows, sampled texts, the final weights) follow from the config, the data and the arithmetic;
clock and memory readings (phase seconds, memory peaks, SGLang's retry counters) do not. The digest
covers the first kind only, so two runs of one config with ``deterministic=true`` on one GPU model and
software stack have equal digests, and ``compare_runs`` says where two runs part when they do not.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .records import COLLECTION_FIELDS, UPDATE_FIELDS, RunDir, RunExistsError, atomic_write_json, read_json

# collections.jsonl fields that read a clock, the allocator or a server's retry counters
VOLATILE_COLLECTION_FIELDS = ("seconds", "active_seconds", "job_seconds", "peak_memory_gib", "engine")
VOLATILE_EVAL_COLUMNS = ("active_seconds", "job_seconds")
_NAME_COLUMNS = ("run_id",)  # names the run, so two runs of one config differ there by construction
# config.json keys that name where and when a run ran, not what it learned
_PLACEMENT_KEYS = ("run_id", "output_dir", "resume", "tracking_dir", "tracker", "study", "recipe", "arm", "phase")
DIGEST_FILE = "digest.json"
# Fields are compared in the order the records define them (the collection's outcome before its diagnostics).
_FIELD_ORDER = {name: i for i, name in enumerate(COLLECTION_FIELDS + UPDATE_FIELDS)}

if TYPE_CHECKING:
    from .config import RunConfig


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=float)


def _sha(lines) -> str:
    h = hashlib.sha256()
    for line in lines:
        h.update(line.encode())
        h.update(b"\n")
    return h.hexdigest()


def learning_rows(run: RunDir) -> list[dict]:
    """collections.jsonl without its clock and memory fields, one dict per collection."""
    return [{k: v for k, v in r.items() if k not in VOLATILE_COLLECTION_FIELDS} for r in run.collections()]


def eval_rows(run: RunDir) -> list[dict]:
    """evals.parquet rows without their clock columns, in the order they were written."""
    df = run.evals().drop(columns=[*VOLATILE_EVAL_COLUMNS, *_NAME_COLUMNS], errors="ignore")
    return [{k: _plain(v) for k, v in row.items()} for row in df.to_dict("records")]


def _plain(v: Any) -> Any:
    """numpy and pandas scalars as plain Python values (missing values as None), for JSON and equality."""
    if hasattr(v, "item"):
        v = v.item()
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return v


def weights_sha256(model, block: int = 4096) -> str:
    """sha256 of every parameter and buffer: name, dtype, shape and a fingerprint of its bits, in name order.

    The fingerprint is computed where the tensor lives, in exact integer arithmetic: the tensor's bytes as
    int32 words, in blocks of ``block``, each block's sum of word x (2j + 1) for its j-th word (below 2^56,
    so nothing wraps). Any single changed bit changes its block's sum; only the [n / block] sums travel to
    the host, so hashing a GPU model's weights takes milliseconds rather than a copy of every byte.
    """
    import torch

    h = hashlib.sha256()
    state = model.state_dict()
    for name in sorted(state):
        t = state[name].detach()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        raw = t.contiguous().view(-1).view(torch.uint8)  # [bytes]
        words = torch.nn.functional.pad(raw, (0, -raw.numel() % (4 * block))).view(torch.int32)  # [n]
        weights = torch.arange(1, 2 * block, 2, device=t.device, dtype=torch.int64)  # [block] odd
        sums = (words.view(-1, block).to(torch.int64) * weights).sum(1)  # [n / block]
        h.update(sums.cpu().numpy().tobytes())
    return h.hexdigest()


def content_digest(run: RunDir, weights: str | None = None) -> dict[str, str | None]:
    """sha256 of each part of a run's deterministic content, and of all of them together."""
    parts = {
        "collections": _sha(_canonical(r) for r in learning_rows(run)),
        "evaluations": _sha(_canonical(r) for r in eval_rows(run)),
        "samples": _sha(_canonical(r) for r in run.samples()),
        "weights": weights,
    }
    parts["all"] = _sha(f"{k}={v}" for k, v in parts.items())
    return parts


def write_digest(run: RunDir, deterministic: bool, weights: str | None) -> dict:
    """Record ``digest.json``: whether the run was deterministic and the digest of its content."""
    record = {
        "deterministic": deterministic,
        "sha256": content_digest(run, weights),
        "excluded": {"collections": list(VOLATILE_COLLECTION_FIELDS), "evaluations": list(VOLATILE_EVAL_COLUMNS)},
    }
    atomic_write_json(run.path / DIGEST_FILE, record)
    return record


# --------------------------------------------------------------------------------------------------- comparison
@dataclass
class Difference:
    """Where two runs' records first part."""

    collection: int | None  # the collection whose row differs first (None: the rows agree)
    field: str | None  # its dotted path (``per_update[0].loss``), or "rows" when one run has fewer rows
    a: Any = None
    b: Any = None


@dataclass
class RunComparison:
    a: Path
    b: Path
    config_differences: list[str]
    collections: Difference
    rows: tuple[int, int]  # collections recorded by A and B
    evaluations: str | None  # None when equal, else where they first part
    samples: str | None
    weights: str | None  # None when equal (or not recorded by both: see weights_known)
    weights_known: bool
    summary: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # headline values, A and B

    @property
    def identical(self) -> bool:
        return (
            self.collections.collection is None
            and self.rows[0] == self.rows[1]
            and self.evaluations is None
            and self.samples is None
            and self.weights is None
        )


def first_difference(a: Any, b: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """The dotted path of the first place two JSON-like values differ, with both values there; None if equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=lambda k: (_FIELD_ORDER.get(k, len(_FIELD_ORDER)), k)):
            if k not in a or k not in b:
                return (f"{path}.{k}".lstrip("."), a.get(k), b.get(k))
            found = first_difference(a[k], b[k], f"{path}.{k}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None if len(a) == len(b) else (f"{path} (length)".lstrip("."), len(a), len(b))
    same = a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))
    return None if same else (path.lstrip("."), a, b)


def compare_runs(a: str | Path, b: str | Path) -> RunComparison:
    """Compare two run directories' deterministic content (see the module docstring)."""
    run_a, run_b = _recorded_run(a), _recorded_run(b)
    wa, wb = _recorded_weights(run_a), _recorded_weights(run_b)
    rows_a, rows_b = learning_rows(run_a), learning_rows(run_b)
    diff = Difference(None, None)
    for ra, rb in zip(rows_a, rows_b):
        found = first_difference(ra, rb)
        if found:
            diff = Difference(ra.get("collection"), *found)
            break
    if diff.collection is None and len(rows_a) != len(rows_b):
        diff = Difference(min(len(rows_a), len(rows_b)), "rows", len(rows_a), len(rows_b))
    return RunComparison(
        a=run_a.path,
        b=run_b.path,
        config_differences=_config_differences(run_a, run_b),
        collections=diff,
        rows=(len(rows_a), len(rows_b)),
        evaluations=_evaluation_difference(eval_rows(run_a), eval_rows(run_b)),
        samples=_sample_difference(run_a.samples(), run_b.samples()),
        weights=_weights_difference(wa, wb),
        weights_known=wa is not None and wb is not None,
        summary=_summary(run_a, run_b, rows_a, rows_b),
    )


def _recorded_run(path: str | Path) -> RunDir:
    """The run at ``path``; refuses (one line) a folder without the run's config.json."""
    run = RunDir(path)
    if not run.config_path.exists():
        raise FileNotFoundError(f"{run.path} is not a run directory (no config.json); pass a run's folder.")
    return run


def rerun_config(run: str | Path, out: str | Path, *, resume: bool = False, other_source: bool = False) -> RunConfig:
    """The config a recorded run trained with, writing to ``out``/<its run_id>: what ``grpo-knobs rerun`` trains.

    Refuses (ValueError, one line) a rerun into the recorded run's own directory, and one on library source
    other than the run's unless ``other_source``: a rerun of other code is a new run, not a check of this one.
    """
    from .config import RunConfig
    from .provenance import source_sha256

    recorded = _recorded_run(run)
    meta = read_json(recorded.config_path)
    values = meta.get("config") or {}
    if not values:
        raise ValueError(f"{recorded.config_path} records no run parameters ('config'); it cannot be rerun.")
    destination = Path(out).resolve() / values["run_id"]
    if destination == recorded.path.resolve():
        raise ValueError(f"--out {out} would rerun into {recorded.path} itself; pass another --out directory.")
    try:
        RunDir(destination).check_new(resume)  # the trainer's own test, made here to name the command's flags
    except RunExistsError as exc:
        raise ValueError(
            f"{destination} already exists and is never overwritten; pass --resume, or another --out."
        ) from exc
    ours, theirs = source_sha256(), meta.get("source_sha256")
    if theirs and ours != theirs and not other_source:
        commit = meta.get("git_commit") or "the commit that wrote it"
        raise ValueError(
            f"{recorded.path} ran library source {theirs[:12]}, this library is {ours[:12]}: a rerun would train "
            f"other code. Install or check out {commit} (its lib/ is enough), or pass --other-source to train anyway."
        )
    return RunConfig.from_dict(values | {"output_dir": str(Path(out)), "resume": resume})


def _config_differences(a: RunDir, b: RunDir) -> list[str]:
    ca, cb = read_json(a.config_path).get("config", {}), read_json(b.config_path).get("config", {})
    return [
        f"{k}: {ca.get(k)!r} (A) vs {cb.get(k)!r} (B)"
        for k in sorted(set(ca) | set(cb))
        if k not in _PLACEMENT_KEYS and ca.get(k) != cb.get(k)
    ]


def _evaluation_difference(a: list[dict], b: list[dict]) -> str | None:
    for ra, rb in zip(a, b):
        found = first_difference(ra, rb)
        if found:
            where = f"at {ra['responses']:,} responses, problem {ra['problem_id']}"
            return f"{where}: {found[0]} {found[1]!r} vs {found[2]!r}"
    return None if len(a) == len(b) else f"{len(a)} vs {len(b)} rows"


def _sample_difference(a: list[dict], b: list[dict]) -> str | None:
    for ra, rb in zip(a, b):
        found = first_difference(ra, rb)
        if found:
            return f"collection {ra['collection']}, {found[0]}"
    return None if len(a) == len(b) else f"{len(a)} vs {len(b)} sampled responses"


def _weights_difference(wa: str | None, wb: str | None) -> str | None:
    return None if wa is None or wb is None or wa == wb else f"{wa[:12]} vs {wb[:12]}"


def _recorded_weights(run: RunDir) -> str | None:
    path = run.path / DIGEST_FILE
    return read_json(path).get("sha256", {}).get("weights") if path.exists() else None


def run_outcome(run: RunDir, rows: list[dict] | None = None) -> dict[str, Any]:
    """Where a run ended: mean reward over its last four collections, response tokens, and its last validation
    as (responses, accuracy); None where the records hold none. ``rows``: its collections, if already read."""
    rows = run.collections() if rows is None else rows
    tail = [r["reward_mean"] for r in rows[-4:]]
    evals = run.evals()
    evals = evals[evals["split"] == "validation"] if not evals.empty else evals
    last = evals[evals["responses"] == evals["responses"].max()] if not evals.empty else evals
    return {
        "reward_last4": sum(tail) / len(tail) if tail else None,
        "response_tokens": rows[-1]["output_tokens_cum"] if rows else None,
        "validation": (int(last["responses"].iloc[0]), float(last["correct"].mean())) if not last.empty else None,
    }


def _summary(a: RunDir, b: RunDir, rows_a: list[dict], rows_b: list[dict]) -> dict[str, tuple[Any, Any]]:
    """Where each run ended, side by side."""
    oa, ob = run_outcome(a, rows_a), run_outcome(b, rows_b)
    return {
        "reward_mean, last 4 collections": (oa["reward_last4"], ob["reward_last4"]),
        "output tokens": (oa["response_tokens"], ob["response_tokens"]),
        "last validation (responses, accuracy)": (oa["validation"], ob["validation"]),
    }


def _label(run: RunDir) -> str:
    config = read_json(run.config_path)
    deterministic = (config.get("config") or {}).get("deterministic", False)
    state = run.state() or {}
    return f"{run.path} ({'deterministic' if deterministic else 'default mode'}, {state.get('status', 'no state')})"


def format_comparison(c: RunComparison) -> str:
    """The comparison as lines for a terminal: identical, or the first collection and field where the runs part."""
    lines = [f"A: {_label(RunDir(c.a))}", f"B: {_label(RunDir(c.b))}"]
    if c.config_differences:
        lines.append("configs differ: " + "; ".join(c.config_differences))
    if c.identical:
        weights = "final weights" if c.weights_known else "(final weights not recorded by both runs)"
        lines.append(
            f"identical: {c.rows[0]} collections, evaluation rows, sampled responses, {weights}; "
            "clock and memory fields excluded"
        )
        return "\n".join(lines)
    d = c.collections
    if d.field == "rows":
        lines.append(f"differ: A has {d.a} collections, B {d.b} (identical before collection {d.collection})")
    elif d.collection is not None:
        lines.append(f"differ: first at collection {d.collection}, field {d.field}: {d.a!r} (A) vs {d.b!r} (B)")
    else:
        lines.append("differ: every collection row agrees")
    lines.append(f"  evaluations: {c.evaluations or 'identical'}")
    lines.append(f"  samples: {c.samples or 'identical'}")
    lines.append(f"  final weights: {c.weights or ('identical' if c.weights_known else 'not recorded by both runs')}")
    for name, (va, vb) in c.summary.items():
        lines.append(f"  {name}: {_fmt(va)} (A) vs {_fmt(vb)} (B)")
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    if isinstance(v, tuple):
        return f"{v[1]:.1%} at {v[0]:,}"
    if isinstance(v, float):
        return f"{v:.4f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def comparison_json(c: RunComparison) -> dict:
    """The comparison as a JSON-ready mapping (``grpo-knobs compare-runs --json``)."""
    return {
        "a": str(c.a),
        "b": str(c.b),
        "identical": c.identical,
        "config_differences": c.config_differences,
        "collections": {"rows": list(c.rows), "first_difference": vars(c.collections)},
        "evaluations": c.evaluations,
        "samples": c.samples,
        "weights": c.weights,
        "weights_known": c.weights_known,
        "summary": {k: list(v) for k, v in c.summary.items()},
    }

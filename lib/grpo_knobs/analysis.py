"""Study directories -> DataFrames -> the study's tables.

The analysis notebooks (``notebooks/5*.ipynb``) stay thin: they call
:func:`load_study` once and then the table builders below, which take and
return plain DataFrames so they can be tested on hand-made data. Statistics
live in :mod:`grpo_knobs.stats`, figures in :mod:`grpo_knobs.plots`.

Frames
------
``runs``
    One row per training run. Shape columns use Miles' names
    (``rollout_batch_size`` P, ``n_samples_per_prompt`` G,
    ``global_batch_size`` B, ``num_steps_per_rollout`` S); phase seconds are
    ``generation_seconds``, ``trainer_seconds``, ``sync_seconds``,
    ``active_phase_seconds`` (their sum) and ``job_seconds``; accuracies are
    fractions (``initial_accuracy``, ``final_accuracy``, ``test_accuracy``).
    :func:`load_reference` maps the study's published endpoints onto the same
    columns, so every run-level builder works on both.
``collections``
    One row per collection (``collections.jsonl``), ``seconds`` flattened.
``evals`` / ``tests``
    Per-problem rows of ``evals.parquet`` / ``test.parquet``.
``curves``
    One row per run and evaluation point (:func:`eval_curves`).

Real study directories may lack phases, arms, seeds, test rows, targets or a
matching rollout benchmark. :func:`phase_runs`, :func:`match_targets`,
:func:`screening_question_arms`, :func:`group_arms`,
:func:`training_batch_arms`, :func:`comparable_pairs` and
:func:`select_benchmark` say what exists (deriving arms from the runs' shapes
when the study's arm names are absent) and return one-line notes for what is
missing, so the notebooks skip a table or figure instead of failing.
"""

from __future__ import annotations

import glob
import json
import math
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from grpo_knobs import stats

EVAL_COLUMNS = (
    "run_id", "split", "collections", "updates", "responses", "output_tokens", "active_seconds",
    "job_seconds", "problem_id", "correct", "correct_strict", "response_length", "truncated",
)
COLLECTION_COLUMNS = (
    "collection", "responses", "updates", "prompts", "distinct_prompts", "reward_mean",
    "mixed_group_fraction", "truncation_fraction", "response_length_mean", "response_length_max",
    "output_tokens", "output_tokens_cum", "seconds", "active_seconds", "job_seconds",
)
AUDIT_COLUMNS = ("problem_id", "response", "answer", "correct_strict", "correct_flexible")
BENCHMARK_COLUMNS = (
    "gpu", "model", "batch", "new_tokens", "eager_tokens_per_s", "fast_tokens_per_s",
    "bandwidth_bound_tokens_per_s",
)
PHASES = ("screening", "lr-followup", "confirmation")  # study stages, in order
SHAPE_COLUMNS = ("rollout_batch_size", "n_samples_per_prompt", "global_batch_size", "num_steps_per_rollout")

# The study's display names for its confirmation recipes (seed article tables).
STUDY_RECIPE_NAMES = {
    "onpolicy-small": "Small one-update baseline",
    "onpolicy-large": "Large one-update batch",
    "batch-256-sqrt": "Two updates, retuned LR",
    "group-4": "Four answers, four updates",
}

# The screen's three questions: slug -> (title, arms in display order).
SCREENING_QUESTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "collection_size": ("Collection size at fixed B=128 (16/8/128/1 .. 128/8/128/8)",
                        ("onpolicy-small", "split-2", "split-4", "split-8")),
    "optimizer_batch": ("Optimizer batch B inside a fixed 512-response collection",
                        ("split-4", "batch-256", "onpolicy-large")),
    "group_size": ("Group size G at a fixed response budget (B=128, S=4)",
                   ("group-4", "split-4", "group-16", "group-32")),
}
# Arms whose group size varies at a fixed budget (the mixed-group comparison).
GROUP_ARMS = ("group-4", "split-4", "group-16", "group-32")


# ---------------------------------------------------------------------------
# Paths
# ---------------------------------------------------------------------------
def resolve_path(path: str | Path, root: Path) -> Path:
    """``path`` itself when absolute, else relative to the repository ``root``.

    Notebooks run with their own folder as cwd under nbval and with the
    caller's cwd under papermill; resolving parameters against the root makes
    both behave the same.
    """
    p = Path(path)
    return p if p.is_absolute() else root / p


# ---------------------------------------------------------------------------
# Incomplete studies: targets, phases and arms derived from what exists
# ---------------------------------------------------------------------------
# A real study directory may lack phases, arms, seeds, test rows or targets.
# The notebooks ask these helpers what to draw; each returns what it found and
# a one-line note saying what was missing or derived, so a notebook can print
# the note and skip a table or figure instead of failing.
TASK_FAMILIES = ("gsm8k", "countdown")

# Knob letter -> ``runs`` column.
KNOBS = {"P": "rollout_batch_size", "G": "n_samples_per_prompt", "B": "global_batch_size",
         "S": "num_steps_per_rollout"}
# Screening question -> (the knob that varies, the knobs held fixed). P x G = B x S, so
# fixing two shape knobs and the varying one determines the fourth.
QUESTION_KNOBS: dict[str, tuple[str, tuple[str, ...]]] = {
    "collection_size": ("P", ("G", "B", "lr")),   # more prompts per collection -> more updates S
    "optimizer_batch": ("B", ("P", "G", "lr")),   # one collection split into fewer, larger updates
    "group_size": ("G", ("B", "S", "lr")),        # same collection and updates, answers per prompt
}
# The critical-training-batch arms: B varies at a fixed G and learning rate.
TRAINING_BATCH_KNOBS: tuple[str, tuple[str, ...]] = ("B", ("G", "lr"))
TRAINING_BATCH_ARMS = ("onpolicy-small", "batch-256", "onpolicy-large")


def task_family(task: str) -> str | None:
    """``"gsm8k"`` or ``"countdown"`` for a task or one of its variants (``countdown-2x10``), else None."""
    for family in TASK_FAMILIES:
        if task == family or task.startswith(f"{family}-"):
            return family
    return None


def match_targets(targets: Mapping[str, object], tasks: Iterable[str]) -> tuple[dict[str, object], list[str]]:
    """Targets per task: the exact task key, else the task family's key (``countdown`` for
    ``countdown-2x10``), else none.

    Returns ``({task: targets}, notes)``; a note says which tasks use their
    family's targets and which have none (their target tables are skipped).
    """
    def given(key: str | None) -> bool:
        value = targets.get(key) if key is not None else None
        return value is not None and not (isinstance(value, (list, tuple)) and len(value) == 0)

    matched, notes = {}, []
    for task in tasks:
        family = task_family(task)
        if given(task):
            matched[task] = targets[task]
        elif given(family):
            matched[task] = targets[family]
            notes.append(f"{task}: no targets under {task!r}; using the {family!r} family's {targets[family]}")
        else:
            notes.append(f"{task}: no accuracy target given (targets has {sorted(targets) or 'no keys'}); "
                         "skipping its target tables and lines")
    return matched, notes


def choose_phase(runs: pd.DataFrame, preferred: str) -> tuple[str | None, str | None]:
    """``preferred`` when ``runs`` has it, else the first phase present (study order, then by
    name). Returns ``(phase, note)``; the note says when another phase stands in."""
    present = set(runs["phase"].dropna())
    if preferred in present:
        return preferred, None
    if not present:
        return None, f"no runs at all; nothing to draw for phase {preferred!r}"
    chosen = ([p for p in PHASES if p in present] + sorted(present - set(PHASES)))[0]
    return chosen, f"no {preferred!r} runs; using the {chosen!r} runs instead (phases present: {sorted(present)})"


@dataclass
class PhaseRuns:
    """The runs a notebook draws: ``phase`` (the one asked for, or its stand-in), its runs,
    the tasks that have runs in it, and notes on what was missing."""

    phase: str
    runs: pd.DataFrame
    tasks: list[str]
    notes: list[str]


def phase_runs(runs: pd.DataFrame, phase: str) -> PhaseRuns:
    """Runs of ``phase``, or of the phase :func:`choose_phase` picks when there are none."""
    chosen, note = choose_phase(runs, phase)
    chosen_runs = runs[runs["phase"] == chosen]
    tasks = order_tasks(chosen_runs["task"].unique())
    notes = [note] if note else []
    notes += [f"{task}: no {chosen!r} runs; skipping it" for task in order_tasks(runs["task"].unique())
              if task not in tasks]
    return PhaseRuns(chosen, chosen_runs, tasks, notes)


def phases_to_draw(runs: pd.DataFrame, phases: Sequence[str]) -> tuple[list[PhaseRuns], list[str]]:
    """:class:`PhaseRuns` for each of ``phases`` that has runs, in the given order.

    When none has runs, the phase :func:`choose_phase` picks for the first one stands in.
    Returns the selections and notes on what was skipped or replaced.
    """
    if isinstance(phases, str):
        raise TypeError(f"phases must be a list of phase names, got the string {phases!r}")
    present = set(runs["phase"].dropna())
    drawn = [phase_runs(runs, ph) for ph in phases if ph in present]
    notes = [f"no {ph!r} runs; skipping that phase" for ph in phases if ph not in present]
    if not drawn:
        fallback = phase_runs(runs, phases[0] if phases else "")
        return [fallback], fallback.notes
    return drawn, notes + [n for sel in drawn for n in sel.notes]


@dataclass
class ArmSet:
    """Arms chosen for one comparison, in display order.

    ``derived`` is True when the study's named arms were absent and the arms
    were classified from the runs' shapes instead; ``note`` says how, or why
    ``arms`` is empty.
    """

    arms: list[str]
    title: str
    derived: bool
    note: str | None = None


def _shape(row: Mapping) -> str:
    return "/".join(str(int(row[KNOBS[k]])) for k in "PGBS")


def _arm_shapes(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per arm: P, G, B, S, lr and its number of runs."""
    cols = [*SHAPE_COLUMNS, "lr"]
    shapes = runs.groupby("arm", sort=True)[cols].first()
    shapes["n_runs"] = runs.groupby("arm", sort=True).size()
    return shapes.reset_index()


def arms_varying(runs: pd.DataFrame, vary: str, fixed: Sequence[str]) -> tuple[list[str], dict]:
    """Arms of ``runs`` that differ in knob ``vary`` while every knob in ``fixed`` is shared.

    Knobs are :data:`KNOBS` letters or ``"lr"``. Arms are grouped by their
    fixed knobs; the group with the most distinct ``vary`` values wins (then
    the one with more runs, then the smallest fixed values). Within it, one
    arm per value: the fewest updates per collection S, then the fewest
    prompts P, then the name. Returns ``(arms ordered by the varying knob,
    the winning group's fixed values)``, or ``([], {})`` when no group has
    two values.
    """
    if runs.empty:
        return [], {}
    col = lambda k: KNOBS.get(k, k)  # noqa: E731
    shapes = _arm_shapes(runs)
    best = None
    for key, g in shapes.groupby([col(k) for k in fixed], sort=True, dropna=False):
        per_value = g.sort_values([col(vary), KNOBS["S"], KNOBS["P"], "arm"]).drop_duplicates(col(vary))
        score = (len(per_value), int(g["n_runs"].sum()))
        if len(per_value) >= 2 and (best is None or score > best[0]):
            best = (score, per_value, dict(zip(fixed, key if isinstance(key, tuple) else (key,))))
    if best is None:
        return [], {}
    return best[1]["arm"].tolist(), best[2]


def _fixed_text(fixed: Mapping) -> str:
    return ", ".join(f"{k}={v:.2g}" if k == "lr" else f"{k}={int(v)}" for k, v in fixed.items())


def _choose_arms(runs: pd.DataFrame, defaults: Sequence[str], vary: str, fixed: Sequence[str],
                 what: str, default_title: str, derived_title) -> ArmSet:
    """The named ``defaults`` present in ``runs`` when at least two are, else arms derived by
    :func:`arms_varying`."""
    present = [a for a in defaults if a in set(runs["arm"])]
    if len(present) >= 2:
        return ArmSet(present, default_title, derived=False)
    arms, fixed_values = arms_varying(runs, vary, fixed)
    if not arms:
        return ArmSet([], default_title, derived=False,
                      note=(f"no {what}: fewer than two of {list(defaults)} and no runs that differ in {vary} "
                            f"at a shared {', '.join(fixed)}"))
    shapes = _arm_shapes(runs[runs["arm"].isin(arms)]).set_index("arm").loc[arms].reset_index()
    listing = ", ".join(f"{a} ({_shape(r)})" for a, r in zip(arms, shapes.to_dict("records")))
    return ArmSet(arms, derived_title(fixed_values, shapes), derived=True,
                  note=f"{what} derived from the runs ({vary} varies at {_fixed_text(fixed_values)}): {listing}")


def _span(shapes: pd.DataFrame) -> str:
    """"P/G/B/S .. P/G/B/S" of the first and last arm."""
    first, last = shapes.iloc[0].to_dict(), shapes.iloc[-1].to_dict()
    return f"{_shape(first)} .. {_shape(last)}" if len(shapes) > 1 else _shape(first)


_DERIVED_TITLES = {
    "collection_size": lambda f, s: f"Collection size at fixed B={int(f['B'])}, G={int(f['G'])} ({_span(s)})",
    "optimizer_batch": lambda f, s: (f"Optimizer batch B inside a fixed {int(f['P'] * f['G'])}-response "
                                     f"collection ({_span(s)})"),
    "group_size": lambda f, s: f"Group size G at fixed B={int(f['B'])}, S={int(f['S'])} ({_span(s)})",
}


def screening_question_arms(runs: pd.DataFrame, slug: str, arms: Sequence[str] | None = None) -> ArmSet:
    """Arms answering screening question ``slug`` (a :data:`SCREENING_QUESTIONS` key) in ``runs``.

    ``runs`` holds one task's screening runs. The study's arms are used when
    at least two exist; otherwise runs are classified by which knob differs
    (:data:`QUESTION_KNOBS`), so a study with its own arm names (e.g. the
    smoke study's ``mini-*`` arms) still answers the question.
    """
    title, default_arms = SCREENING_QUESTIONS[slug]
    vary, fixed = QUESTION_KNOBS[slug]
    return _choose_arms(runs, default_arms if arms is None else arms, vary, fixed,
                        f"{slug.replace('_', ' ')} arms", title, _DERIVED_TITLES[slug])


def group_arms(runs: pd.DataFrame, arms: Sequence[str] = GROUP_ARMS) -> ArmSet:
    """The group-size arms of one task's runs: ``arms`` if two exist, else runs sharing B and S
    (and the learning rate) but differing in G."""
    return screening_question_arms(runs, "group_size", arms)


def training_batch_arms(runs: pd.DataFrame, arms: Sequence[str] = TRAINING_BATCH_ARMS) -> ArmSet:
    """The critical-training-batch arms of one task's runs: ``arms`` if two exist, else one arm
    per optimizer batch B at a shared G and learning rate (the fewest updates per collection)."""
    vary, fixed = TRAINING_BATCH_KNOBS
    return _choose_arms(runs, arms, vary, fixed, "training-batch arms", "Optimizer batch B",
                        lambda f, s: f"Optimizer batch B at G={int(f['G'])} ({_span(s)})")


def comparable_pairs(runs: pd.DataFrame, tests: pd.DataFrame, task: str,
                     pairs: Sequence[tuple[str, str]]) -> tuple[list[tuple[str, str]], list[str]]:
    """The pairs :func:`paired_comparisons` can compare, and a note per pair it cannot
    (one note when the task has no test rows at all).

    A pair needs terminal test rows for both recipes on the same seeds.
    """
    task_runs = runs[runs["task"] == task]
    tested = tests.merge(task_runs[["run_id", "label", "seed"]], on="run_id")
    seeds = tested.groupby("label")["seed"].agg(lambda s: sorted(set(s))).to_dict()
    if not seeds:
        return [], [f"{task}: no terminal test rows for any recipe; skipping the paired comparisons"]
    ok, notes = [], []
    for x, y in pairs:
        missing = [lab for lab in (x, y) if lab not in seeds]
        if missing:
            notes.append(f"{task}: {x} versus {y} skipped: no terminal test rows for {', '.join(missing)}")
        elif seeds[x] != seeds[y]:
            notes.append(f"{task}: {x} versus {y} skipped: tested seeds differ ({seeds[x]} vs {seeds[y]})")
        else:
            ok.append((x, y))
    return ok, notes


def select_benchmark(bench: pd.DataFrame | None, runs: pd.DataFrame,
                     gpu: str | None = None) -> tuple[pd.DataFrame | None, str | None]:
    """The benchmark rows describing ``runs``: their model on their GPU.

    With ``gpu`` those rows are used as asked. Otherwise rows must match a
    model of the runs and, where the runs recorded their device, the GPU
    they ran on (benchmark ``gpu`` "h200" matches "NVIDIA H200"); CPU runs
    have no matching benchmark. Runs recording no device (e.g. the
    synthetic fixture) match by model alone. Several matching GPUs: the
    first. Returns ``(rows or None, note)``.
    """
    if bench is None:
        return None, "no rollout benchmark file"
    if gpu:
        rows = bench[bench["gpu"] == gpu]
        return (rows, None) if not rows.empty else (None, f"the benchmark has no rows for gpu {gpu!r}")
    models = sorted(set(runs["model"].dropna()))
    rows = bench[bench["model"].isin(models)]
    if rows.empty:
        return None, f"no benchmark rows for model {', '.join(models)} (benchmarked: {sorted(set(bench['model']))})"
    devices = set(runs["device"].dropna()) if "device" in runs else set()
    run_gpus = sorted(set(runs["gpu"].dropna())) if "gpu" in runs else []
    norm = lambda text: "".join(ch for ch in str(text).lower() if ch.isalnum())  # noqa: E731
    if run_gpus:
        rows = rows[rows["gpu"].map(lambda g: any(norm(g) in norm(rg) for rg in run_gpus))]
        if rows.empty:
            return None, f"no benchmark rows for the runs' GPU ({', '.join(run_gpus)})"
    elif devices:
        return None, (f"the runs ran on {', '.join(sorted(devices))}, not on a benchmarked GPU "
                      f"({', '.join(sorted(set(bench['gpu'])))}); its throughput does not describe them")
    return rows[rows["gpu"] == rows["gpu"].iloc[0]], None


def throughput_column_for(runs: pd.DataFrame) -> str:
    """The benchmark column matching how the runs generated: ``eager_tokens_per_s`` when every
    run had ``fast_rollout`` off, ``fused_tokens_per_s`` when every run had it fused, else
    ``fast_tokens_per_s``."""
    modes = {str(m).lower() for m in runs["fast_rollout"].dropna()} if "fast_rollout" in runs else set()
    if modes and modes <= {"off", "false"}:
        return "eager_tokens_per_s"
    return "fused_tokens_per_s" if modes == {"fused"} else "fast_tokens_per_s"


# ---------------------------------------------------------------------------
# Loading a study directory
# ---------------------------------------------------------------------------
@dataclass
class Study:
    """All records of one study directory, ready for the table builders."""

    name: str
    runs: pd.DataFrame
    collections: pd.DataFrame
    evals: pd.DataFrame
    curves: pd.DataFrame
    tests: pd.DataFrame
    initial_tests: pd.DataFrame
    skipped: pd.DataFrame
    selection: dict | None = None
    audits: dict[str, pd.DataFrame] = field(default_factory=dict)

    @property
    def synthetic(self) -> bool:
        """True when any run was generated by the synthetic fixture, not trained."""
        return bool(self.runs["synthetic"].any()) if len(self.runs) else False

    @property
    def note(self) -> str | None:
        """A warning for every table written from synthetic records, else None."""
        return "SYNTHETIC DATA (test fixture, not training results)" if self.synthetic else None

    @property
    def tasks(self) -> list[str]:
        """Tasks in a fixed order: the study's (GSM8K first), then others sorted."""
        return order_tasks(self.runs["task"].unique())

    def describe(self) -> str:
        """One line per phase and task with run counts, plus skipped runs."""
        lines = [f"study {self.name!r}{' (SYNTHETIC fixture data)' if self.synthetic else ''}"]
        counts = self.runs.groupby(["task", "phase"]).size()
        phase_rank = {p: i for i, p in enumerate(PHASES)}
        for task in self.tasks:
            for phase, n in sorted(counts[task].items(), key=lambda kv: (phase_rank.get(kv[0], len(PHASES)), kv[0])):
                lines.append(f"  {task:<10} {phase:<13} {n:>3} runs")
        for row in self.skipped.itertuples():
            lines.append(f"  skipped {row.run_id} (status {row.status})")
        return "\n".join(lines)


def order_tasks(tasks: Iterable[str]) -> list[str]:
    """GSM8K, then Countdown, then any other task alphabetically."""
    known = ["gsm8k", "countdown"]
    tasks = set(tasks)
    return [t for t in known if t in tasks] + sorted(tasks - set(known))


def sort_tasks(table: pd.DataFrame) -> pd.DataFrame:
    """Stable sort of ``table`` by its ``task`` column in :func:`order_tasks` order."""
    rank = {task: i for i, task in enumerate(order_tasks(table["task"].unique()))}
    return table.sort_values("task", key=lambda col: col.map(rank), kind="stable", ignore_index=True)


def _read_json(path: Path) -> dict:
    with path.open() as fh:
        return json.load(fh)


def _require_columns(frame: pd.DataFrame, columns: Sequence[str], source: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{source} lacks columns {missing}")


def _run_config_row(meta: dict) -> dict:
    """Flatten ``config.json`` into one ``runs`` row (config + plan fields)."""
    cfg, plan = meta["config"], meta.get("plan", {})
    row = {
        "run_id": meta["run_id"],
        "study": meta.get("study", ""),
        **{k: cfg.get(k) for k in ("task", "model", "engine", "phase", "arm", "seed", "lr",
                                   "response_budget", "eval_every_responses", "max_new_tokens")},
        **{k: cfg[k] for k in SHAPE_COLUMNS},
        "recipe": cfg.get("recipe") or "",
        "responses_per_collection": plan.get("responses_per_collection",
                                             cfg["rollout_batch_size"] * cfg["n_samples_per_prompt"]),
        "prompts_exposed": plan.get("prompts_exposed"),
        "fast_rollout": cfg.get("fast_rollout"),
        "device": meta.get("device"),
        "gpu": meta.get("gpu"),
        "synthetic": bool(cfg.get("synthetic", False)) or str(meta.get("study", "")).startswith("synthetic"),
    }
    row["label"] = row["recipe"] or row["arm"]
    return row


def _load_collections(path: Path, run_id: str) -> pd.DataFrame:
    """``collections.jsonl`` -> frame; ``seconds`` and ``per_update`` flattened to scalars."""
    rows = []
    with path.open() as fh:
        for line in fh:
            if not line.strip():
                continue
            rec = json.loads(line)
            seconds = rec.pop("seconds")
            per_update = rec.pop("per_update", None) or []
            rec.update({f"{k}_seconds": seconds.get(k) for k in ("generation", "trainer", "sync")})
            for key in ("clip_fraction", "approx_kl", "grad_norm"):
                vals = [u[key] for u in per_update if u.get(key) is not None]
                rec[f"{key}_mean"] = float(np.mean(vals)) if vals else np.nan
            rec["run_id"] = run_id
            rows.append(rec)
    frame = pd.DataFrame(rows)
    _require_columns(frame, [c for c in COLLECTION_COLUMNS if c != "seconds"], f"{path.parent.name}/collections.jsonl")
    return frame


def _load_parquet(path: Path, run_id: str) -> pd.DataFrame:
    frame = pd.read_parquet(path)
    _require_columns(frame, EVAL_COLUMNS, f"{path.parent.name}/{path.name}")
    if set(frame["run_id"].unique()) - {run_id}:
        raise ValueError(f"{path.parent.name}/{path.name} holds rows of another run")
    return frame


def _timings_so_far(collections: pd.DataFrame) -> dict:
    """Phase seconds of an unfinished run (no ``timings.json`` yet), from its collections."""
    return {
        "generation": collections["generation_seconds"].sum(),
        "trainer": collections["trainer_seconds"].sum(),
        "sync": collections["sync_seconds"].sum(),
        "job": collections["job_seconds"].iloc[-1],
    }


def _run_totals(collections: pd.DataFrame, timings: dict) -> dict:
    """Run-level totals from collections and timings, named like the reference CSV."""
    last = collections.iloc[-1]
    gen, trainer, sync = (float(timings[k]) for k in ("generation", "trainer", "sync"))
    peak = pd.to_numeric(collections.get("peak_memory_gib"), errors="coerce")
    return {
        "responses": int(last["responses"]),
        "updates": int(last["updates"]),
        "distinct_prompts": int(last["distinct_prompts"]),
        "output_tokens": int(last["output_tokens_cum"]),
        "mean_response_length": float(last["output_tokens_cum"]) / float(last["responses"]),
        "truncation_fraction": float(collections["truncation_fraction"].mean()),
        "mixed_group_fraction": float(collections["mixed_group_fraction"].mean()),
        "mean_training_reward": float(collections["reward_mean"].mean()),
        "peak_memory_gib": float(peak.max()) if peak is not None and peak.notna().any() else np.nan,
        "generation_seconds": gen,
        "trainer_seconds": trainer,
        "sync_seconds": sync,
        "active_phase_seconds": gen + trainer + sync,
        "evaluation_seconds": float(timings.get("evaluation", np.nan)),
        "init_seconds": float(timings.get("init", np.nan)),
        "checkpoint_seconds": float(timings.get("checkpoint", np.nan)),
        "job_seconds": float(timings["job"]),
    }


# Files that mark a folder as a run directory (see docs/architecture.md).
RUN_FILES = ("config.json", "state.json", "collections.jsonl", "evals.parquet", "timings.json",
             "test.parquet", "10_train.ipynb")


def _is_run_folder(path: Path) -> bool:
    """A run directory, or an empty folder (a run that failed before writing anything).

    Folders holding files but none of :data:`RUN_FILES`, such as the
    analysis output ``figures/`` inside a study directory, are not runs.
    """
    names = {p.name for p in path.iterdir()}
    return not names or any(name in names for name in RUN_FILES)


def load_study(study_dir: str | Path, statuses: Sequence[str] = ("complete",)) -> Study:
    """Load every run directory under ``study_dir``.

    Runs whose ``state.json`` status is not in ``statuses``, folders without
    a ``config.json`` and runs lacking ``collections.jsonl`` or
    ``evals.parquet`` are left out and listed in ``Study.skipped``;
    ``initial-<task>`` folders (config phase "initial") contribute only their
    terminal test rows. Folders that are not runs (e.g. ``figures/``) are
    ignored.
    """
    root = Path(study_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"study directory {root} does not exist")
    runs, colls, evals, tests, initial, skipped = [], [], [], [], [], []
    for run_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if not _is_run_folder(run_dir):
            continue
        if not (run_dir / "config.json").is_file():  # e.g. a run that failed before writing its config
            skipped.append({"run_id": run_dir.name, "status": "no config.json"})
            continue
        meta = _read_json(run_dir / "config.json")
        if meta["config"].get("phase") == "initial":  # no training shape, only test rows
            if not (run_dir / "test.parquet").is_file():
                skipped.append({"run_id": meta["run_id"], "status": "initial model without test.parquet"})
                continue
            test = _load_parquet(run_dir / "test.parquet", meta["run_id"])
            initial.append(test.assign(task=meta["config"]["task"]))
            continue
        row = _run_config_row(meta)
        state_path = run_dir / "state.json"
        status = _read_json(state_path).get("status", "unknown") if state_path.is_file() else "missing state.json"
        if status not in statuses:
            skipped.append({"run_id": row["run_id"], "status": status})
            continue
        missing = [f for f in ("collections.jsonl", "evals.parquet") if not (run_dir / f).is_file()]
        if missing:
            skipped.append({"run_id": row["run_id"], "status": f"{status}, but no {' or '.join(missing)}"})
            continue
        c = _load_collections(run_dir / "collections.jsonl", row["run_id"])
        timings_path = run_dir / "timings.json"
        timings = _read_json(timings_path) if timings_path.is_file() else _timings_so_far(c)
        row.update(status=status, collections_done=len(c), **_run_totals(c, timings))
        runs.append(row)
        colls.append(c)
        evals.append(_load_parquet(run_dir / "evals.parquet", row["run_id"]))
        if (run_dir / "test.parquet").is_file():
            tests.append(_load_parquet(run_dir / "test.parquet", row["run_id"]))
    if not runs:
        raise ValueError(f"no runs with status in {list(statuses)} under {root}")

    runs_df = pd.DataFrame(runs)
    evals_df = pd.concat(evals, ignore_index=True)
    tests_df = pd.concat(tests, ignore_index=True) if tests else pd.DataFrame(columns=list(EVAL_COLUMNS))
    curves = eval_curves(evals_df)
    runs_df = runs_df.merge(_curve_endpoints(curves), on="run_id", how="left")
    runs_df = runs_df.merge(_test_endpoints(tests_df), on="run_id", how="left")
    selection_path = root / "selection.json"
    return Study(
        name=root.name,
        runs=runs_df.sort_values(["task", "phase", "arm", "seed"], ignore_index=True),
        collections=pd.concat(colls, ignore_index=True),
        evals=evals_df,
        curves=curves,
        tests=tests_df,
        initial_tests=pd.concat(initial, ignore_index=True) if initial else pd.DataFrame(),
        skipped=pd.DataFrame(skipped, columns=["run_id", "status"]),
        selection=_read_json(selection_path) if selection_path.is_file() else None,
        audits=load_reward_audits(root),
    )


def load_reward_audits(study_dir: str | Path) -> dict[str, pd.DataFrame]:
    """``reward_audit-<task>.parquet`` files keyed by task (empty when there are none)."""
    audits = {}
    for path in sorted(Path(study_dir).glob("reward_audit-*.parquet")):
        frame = pd.read_parquet(path)
        _require_columns(frame, AUDIT_COLUMNS, path.name)
        audits[path.stem.removeprefix("reward_audit-")] = frame
    return audits


# ---------------------------------------------------------------------------
# Curves and run endpoints
# ---------------------------------------------------------------------------
def eval_curves(evals: pd.DataFrame) -> pd.DataFrame:
    """Per-problem validation rows -> one row per run and evaluation point.

    ``accuracy``/``accuracy_strict`` are fractions of problems correct;
    ``n_problems`` lets callers check that every point graded the same set.
    """
    keys = ["run_id", "responses"]
    grouped = evals.groupby(keys, sort=True)
    curves = grouped.agg(
        collections=("collections", "first"),
        updates=("updates", "first"),
        output_tokens=("output_tokens", "first"),
        active_seconds=("active_seconds", "first"),
        job_seconds=("job_seconds", "first"),
        accuracy=("correct", "mean"),
        accuracy_strict=("correct_strict", "mean"),
        truncation_fraction=("truncated", "mean"),
        response_length_mean=("response_length", "mean"),
        n_problems=("problem_id", "nunique"),
    ).reset_index()
    return curves


def _curve_endpoints(curves: pd.DataFrame) -> pd.DataFrame:
    """Initial and final validation accuracy and sample AUC per run."""
    rows = []
    for run_id, c in curves.groupby("run_id", sort=True):
        resp, acc = c["responses"].to_numpy(), c["accuracy"].to_numpy()
        rows.append({
            "run_id": run_id,
            "initial_accuracy": acc[0],
            "final_accuracy": acc[-1],
            "sample_auc": stats.sample_auc(resp, acc) if len(c) > 1 else np.nan,
        })
    return pd.DataFrame(rows)


def _test_endpoints(tests: pd.DataFrame) -> pd.DataFrame:
    """Terminal test accuracy, length and truncation per run."""
    if tests.empty:
        return pd.DataFrame(columns=["run_id", "test_accuracy", "test_accuracy_strict",
                                     "test_response_length", "test_truncation_fraction"])
    return tests.groupby("run_id").agg(
        test_accuracy=("correct", "mean"),
        test_accuracy_strict=("correct_strict", "mean"),
        test_response_length=("response_length", "mean"),
        test_truncation_fraction=("truncated", "mean"),
    ).reset_index()


def recipe_order(runs: pd.DataFrame, task: str, selection: dict | None = None) -> list[str]:
    """Recipe labels of ``task``: selection order (baseline first) when known, else sorted."""
    task_runs = runs[runs["task"] == task]
    labels = list(dict.fromkeys(task_runs.sort_values("label")["label"]))
    if selection and task in selection.get("recipes", {}):
        arm_to_label = dict(zip(task_runs["arm"], task_runs["label"]))
        chosen = [arm_to_label[a] for a in selection["recipes"][task] if a in arm_to_label]
        labels = chosen + [label for label in labels if label not in chosen]
    return labels


def summarize_curves(curves: pd.DataFrame, runs: pd.DataFrame, x: str = "responses") -> pd.DataFrame:
    """Seed mean and observed range of validation accuracy per recipe and evaluation point.

    Points are matched across seeds by cumulative responses (the evaluation
    schedule) and only points every run of the recipe evaluated are kept;
    ``x`` is then averaged across seeds, since active seconds and output
    tokens differ by seed. Accuracy columns are in percent.
    """
    merged = curves.merge(runs[["run_id", "task", "label", "seed"]], on="run_id")
    rows = []
    for (task, label), g in merged.groupby(["task", "label"], sort=True):
        acc = g.pivot(index="run_id", columns="responses", values="accuracy")  # [seeds, points]
        acc = acc.loc[:, acc.notna().all()]  # points every seed evaluated (unequal budgets, unfinished runs)
        xs = g.pivot(index="run_id", columns="responses", values=x)
        summary = stats.seed_summary(100 * acc.to_numpy())
        for i, responses in enumerate(acc.columns):
            rows.append({
                "task": task, "label": label, "responses": responses,
                "x": float(xs[responses].mean()),
                "accuracy_mean_pct": summary.mean[i], "accuracy_min_pct": summary.min[i],
                "accuracy_max_pct": summary.max[i], "n_seeds": acc.shape[0],
            })
    return pd.DataFrame(rows)


def curve_endpoint_table(summary: pd.DataFrame, labels: Sequence[str] | None = None) -> pd.DataFrame:
    """The last evaluation point of each recipe in a :func:`summarize_curves` table."""
    last = summary.sort_values("responses").groupby(["task", "label"], sort=False).tail(1)
    table = last[["task", "label", "responses", "accuracy_mean_pct", "accuracy_min_pct",
                  "accuracy_max_pct", "n_seeds"]].rename(columns={"label": "recipe"})
    return sort_tasks(_sort_by_labels(table, labels, ["recipe"]))


# Per-collection training signals drawn beside the learning curves: column -> (title, scale).
TRAINING_SIGNALS = {
    "reward_mean": ("Training reward (%)", 100.0),
    "mixed_group_fraction": ("Mixed groups (%)", 100.0),
    "truncation_fraction": ("Truncated responses (%)", 100.0),
    "response_length_mean": ("Mean response length (tokens)", 1.0),
}


def training_signals(collections: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Seed mean and range of the per-collection training signals, in response windows.

    Collections are averaged within windows of W responses, W being the largest collection
    (P x G) among the task's runs, so every run has at least one collection in each window and
    runs with small collections are smoothed to the same resolution. Windows are matched
    across seeds by their end (``responses``); only windows every seed of a recipe finished
    are kept. Returns one row per task, recipe, signal and window, values scaled as in
    :data:`TRAINING_SIGNALS`.
    """
    meta = runs[["run_id", "task", "label"]]
    merged = collections.merge(meta, on="run_id")
    rows = []
    for task, t in merged.groupby("task", sort=True):
        per_collection = (t["responses"] // (t["collection"] + 1)).astype(int)  # [collections] P x G of each run
        width = int(per_collection.max())
        window_end = width * np.ceil(t["responses"] / width).astype(int)  # [collections]
        t = t.assign(window=window_end)
        for label, g in t.groupby("label", sort=True):
            for column, (_, scale) in TRAINING_SIGNALS.items():
                table = g.pivot_table(index="run_id", columns="window", values=column, aggfunc="mean")  # [seeds, windows]
                table = table.loc[:, table.notna().all()]
                if table.empty:
                    continue
                summary = stats.seed_summary(scale * table.to_numpy())
                for i, end in enumerate(table.columns):
                    rows.append({"task": task, "label": label, "signal": column, "responses": int(end),
                                 "mean": summary.mean[i], "min": summary.min[i], "max": summary.max[i],
                                 "n_seeds": table.shape[0]})
    return pd.DataFrame(rows, columns=["task", "label", "signal", "responses", "mean", "min", "max", "n_seeds"])


# ---------------------------------------------------------------------------
# Confirmation tables (notebook 51)
# ---------------------------------------------------------------------------
def confirmation_run_table(runs: pd.DataFrame, labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Per run: recipe, seed, final validation %, test %, active phase and job minutes."""
    table = pd.DataFrame({
        "task": runs["task"], "recipe": runs["label"], "seed": runs["seed"],
        "val_pct": 100 * runs["final_accuracy"],
        "test_pct": 100 * runs.get("test_accuracy", pd.Series(np.nan, index=runs.index)),
        "phase_min": runs["active_phase_seconds"] / 60,
        "job_min": runs["job_seconds"] / 60,
    })
    return _sort_by_labels(table, labels, ["task", "recipe", "seed"])


def _sort_by_labels(table: pd.DataFrame, labels: Sequence[str] | None, keys: list[str],
                    column: str = "recipe") -> pd.DataFrame:
    """Sort ``table`` by ``keys``, with ``column`` in the given label order."""
    if labels is not None:
        rank = {label: i for i, label in enumerate(labels)}
        table = table.assign(_rank=table[column].map(lambda x: rank.get(x, len(rank))))
        keys = [k if k != column else "_rank" for k in keys]
        return table.sort_values(keys, ignore_index=True).drop(columns="_rank")
    return table.sort_values(keys, ignore_index=True)


def recipe_test_scores(tests: pd.DataFrame, runs: pd.DataFrame, label: str, task: str,
                      column: str = "correct") -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Terminal test scores of one recipe as ([seeds, problems], seeds, problem IDs).

    Problem columns are sorted by ID; every seed must have graded the same
    problems exactly once.
    """
    chosen = runs[(runs["task"] == task) & (runs["label"] == label)][["run_id", "seed"]]
    rows = tests.merge(chosen, on="run_id")
    if rows.empty:
        raise ValueError(f"no terminal test rows for recipe {label!r} on {task}")
    if rows.duplicated(["seed", "problem_id"]).any():
        raise ValueError(f"recipe {label!r} on {task} has duplicated test rows per problem")
    wide = rows.pivot(index="seed", columns="problem_id", values=column).sort_index(axis=0).sort_index(axis=1)
    if wide.isna().any().any():
        raise ValueError(f"seeds of recipe {label!r} on {task} graded different test problems")
    return wide.to_numpy(dtype=float), wide.index.to_numpy(), [str(c) for c in wide.columns]


def default_comparisons(labels: Sequence[str]) -> list[tuple[str, str]]:
    """The study's comparison order: each alternative vs the baseline, then alternatives pairwise.

    ``labels[0]`` is the baseline; a pair ``(x, y)`` reads "x versus y".
    """
    base, *alts = labels
    return [(alt, base) for alt in alts] + [(y, x) for x, y in combinations(alts, 2)]


def paired_comparisons(runs: pd.DataFrame, tests: pd.DataFrame, task: str,
                       pairs: Sequence[tuple[str, str]], n_resamples: int = 10_000, seed: int = 0,
                       confidence: float = 0.95) -> pd.DataFrame:
    """Test-accuracy differences ``x - y`` per pair, via :func:`stats.paired_bootstrap`.

    Seeds are paired by seed number, so both recipes need the same seed set.
    """
    rows = []
    for x, y in pairs:
        a, seeds_a, ids_a = recipe_test_scores(tests, runs, x, task)
        b, seeds_b, ids_b = recipe_test_scores(tests, runs, y, task)
        if list(seeds_a) != list(seeds_b):
            raise ValueError(f"{x!r} and {y!r} on {task} have different seeds: {list(seeds_a)} vs {list(seeds_b)}")
        res = stats.paired_bootstrap(a, b, n_resamples=n_resamples, seed=seed, confidence=confidence,
                                     problem_ids_a=ids_a, problem_ids_b=ids_b)
        rows.append({
            "task": task, "comparison": f"{x} versus {y}", "mean_pp": res.mean_diff_pp,
            "ci_low_pp": res.ci_low_pp, "ci_high_pp": res.ci_high_pp,
            "seed_diffs_pp": tuple(float(d) for d in res.per_seed_diff_pp),
            "p_le_zero": res.p_le_zero, "n_seeds": a.shape[0], "n_problems": a.shape[1],
        })
    return pd.DataFrame(rows)


def format_comparisons(table: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """The study's display: signed pp, "[low, high]" interval, per-seed differences."""
    interval = f"Conditional {round(100 * confidence)}% interval"
    return pd.DataFrame({
        "Comparison": table["comparison"],
        "Mean pp": table["mean_pp"].map(lambda v: f"{v:+.2f}"),
        interval: [f"[{lo:+.2f}, {hi:+.2f}]" for lo, hi in zip(table["ci_low_pp"], table["ci_high_pp"])],
        "Seed differences pp": table["seed_diffs_pp"].map(lambda d: ", ".join(f"{v:+.2f}" for v in d)),
    })


def phase_cost_table(runs: pd.DataFrame, labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Seed-mean minutes per phase and output tokens per recipe.

    "Other" is job time minus the recorded phases (generation, trainer,
    sync), as in the study: it holds initialization, validation, checkpoint
    saving and orchestration.
    """
    per_run = pd.DataFrame({
        "task": runs["task"], "recipe": runs["label"],
        "generate_min": runs["generation_seconds"] / 60,
        "trainer_min": runs["trainer_seconds"] / 60,
        "sync_min": runs["sync_seconds"] / 60,
        "other_min": (runs["job_seconds"] - runs["generation_seconds"] - runs["trainer_seconds"]
                      - runs["sync_seconds"]) / 60,
        "output_million_tokens": runs["output_tokens"] / 1e6,
    })
    table = per_run.groupby(["task", "recipe"], sort=False).mean().reset_index()
    table["n_runs"] = per_run.groupby(["task", "recipe"], sort=False).size().to_numpy()
    return _sort_by_labels(table, labels, ["task", "recipe"])


def truncation_table(runs: pd.DataFrame, labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Per run: terminal test mean response length and truncation %."""
    table = pd.DataFrame({
        "task": runs["task"], "recipe": runs["label"], "seed": runs["seed"],
        "test_response_length": runs["test_response_length"],
        "test_truncation_pct": 100 * runs["test_truncation_fraction"],
    })
    return _sort_by_labels(table, labels, ["task", "recipe", "seed"])


def truncation_range(table: pd.DataFrame) -> pd.DataFrame:
    """Per task: min and max terminal-test truncation % across runs."""
    return table.groupby("task", sort=False)["test_truncation_pct"].agg(["min", "max", "count"]).reset_index()


# ---------------------------------------------------------------------------
# Time to target (notebook 52)
# ---------------------------------------------------------------------------
def time_to_target_table(curves: pd.DataFrame, runs: pd.DataFrame,
                         targets: Mapping[str, Sequence[float]]) -> pd.DataFrame:
    """One row per run and target (percent): the bracket in responses, active and job seconds.

    Censored runs keep ``reached=False`` and ``censored_at``; their bracket
    fields are NaN, never the budget.
    """
    rows = []
    for run in runs.itertuples():
        c = curves[curves["run_id"] == run.run_id].sort_values("responses")
        for target in targets.get(run.task, ()):
            res = stats.time_to_target(c["responses"], 100 * c["accuracy"], target,
                                       c["active_seconds"], c["job_seconds"])
            rows.append({
                "task": run.task, "recipe": run.label, "seed": run.seed, "run_id": run.run_id,
                "target_pct": target, "reached": res.reached,
                **{f"{u}_{side}": _none_to_nan(getattr(res, f"{u}_{side}"))
                   for u in ("responses", "active_seconds", "job_seconds") for side in ("low", "high")},
                "censored_at": _none_to_nan(res.censored_at),
                "responses_bracket": res.describe("responses"),
                "active_seconds_bracket": res.describe("active_seconds"),
                "job_seconds_bracket": res.describe("job_seconds"),
                "result": res,
            })
    return pd.DataFrame(rows)


def _none_to_nan(value: float | None) -> float:
    return np.nan if value is None else float(value)


def time_to_target_summary(table: pd.DataFrame, labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Per recipe and target: how many seeds reached it and the bracket ranges per unit."""
    rows = []
    for (task, recipe, target), g in table.groupby(["task", "recipe", "target_pct"], sort=False):
        summary = stats.summarize_time_to_target(list(g["result"]))
        rows.append({
            "task": task, "recipe": recipe, "target_pct": target,
            "reached": f"{summary.n_reached}/{summary.n_runs}",
            "responses": summary.describe("responses"),
            "active_seconds": summary.describe("active_seconds"),
            "job_seconds": summary.describe("job_seconds"),
        })
    return _sort_by_labels(pd.DataFrame(rows), labels, ["task", "target_pct", "recipe"])


# ---------------------------------------------------------------------------
# Group size (notebook 53)
# ---------------------------------------------------------------------------
def mixed_group_points(collections: pd.DataFrame, runs: pd.DataFrame,
                       arms: Sequence[str] = GROUP_ARMS, phase: str = "screening") -> pd.DataFrame:
    """Per collection of the group arms: mean training reward and measured mixed fraction."""
    chosen = runs[runs["arm"].isin(arms) & (runs["phase"] == phase)]
    cols = ["run_id", "task", "arm", "seed", "n_samples_per_prompt"]
    merged = collections.merge(chosen[cols], on="run_id")
    return merged[cols[1:] + ["collection", "reward_mean", "mixed_group_fraction"]].sort_values(
        ["task", "n_samples_per_prompt", "seed", "collection"], ignore_index=True)


def group_size_table(runs: pd.DataFrame, arms: Sequence[str] = GROUP_ARMS,
                     phase: str = "screening") -> pd.DataFrame:
    """Per group arm: G, prompts per collection, prompts exposed at the budget, measured mixing.

    ``formula_at_mean_reward`` evaluates the mixed-group formula at the
    run's mean training reward; because the formula is concave in p, the
    measured fraction (averaged over problems of different difficulty) is
    expected to lie at or below it.
    """
    chosen = runs[runs["arm"].isin(arms) & (runs["phase"] == phase)]
    table = pd.DataFrame({
        "task": chosen["task"], "arm": chosen["arm"], "seed": chosen["seed"],
        "G": chosen["n_samples_per_prompt"], "P": chosen["rollout_batch_size"],
        "responses": chosen["responses"],
        "prompts_exposed": chosen["responses"] // chosen["n_samples_per_prompt"],
        "distinct_prompts": chosen["distinct_prompts"],
        "mean_reward": chosen["mean_training_reward"],
        "mixed_fraction": chosen["mixed_group_fraction"],
        "formula_at_mean_reward": stats.mixed_group_probability(
            chosen["mean_training_reward"].to_numpy(), chosen["n_samples_per_prompt"].to_numpy()),
        "final_val_pct": 100 * chosen["final_accuracy"],
    })
    return sort_tasks(table.sort_values(["G", "seed"]))


# ---------------------------------------------------------------------------
# Reward audit (notebook 54)
# ---------------------------------------------------------------------------
def reward_audit_summary(audits: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Per task: problems, strict and flexible accuracy %, the gap and disagreements."""
    rows = []
    for task in order_tasks(audits):
        a = audits[task]
        strict, flexible = a["correct_strict"].astype(float), a["correct_flexible"].astype(float)
        rows.append({
            "task": task, "problems": len(a),
            "strict_pct": 100 * strict.mean(), "flexible_pct": 100 * flexible.mean(),
            "gap_pp": 100 * (flexible.mean() - strict.mean()),
            "flexible_only": int(((flexible > 0) & (strict == 0)).sum()),
            "strict_only": int(((strict > 0) & (flexible == 0)).sum()),
        })
    return pd.DataFrame(rows)


def reward_audit_examples(audit: pd.DataFrame, n: int = 3, max_chars: int = 160) -> pd.DataFrame:
    """The first ``n`` problems (by ID) where the graders disagree, responses shortened to their end."""
    disagree = audit[audit["correct_strict"].astype(float) != audit["correct_flexible"].astype(float)]
    ex = disagree.sort_values("problem_id").head(n)

    def tail(text: str) -> str:  # answers sit at the end of a response
        text = " ".join(str(text).split())
        return text if len(text) <= max_chars else "..." + text[-max_chars:]

    return pd.DataFrame({
        "problem_id": ex["problem_id"], "answer": ex["answer"].astype(str),
        "strict": ex["correct_strict"].astype(int), "flexible": ex["correct_flexible"].astype(int),
        "response_end": ex["response"].map(tail),
    }).reset_index(drop=True)


def initial_test_grading(initial_tests: pd.DataFrame) -> pd.DataFrame:
    """The initial model's terminal test accuracy %, strict and flexible, per task."""
    if initial_tests.empty:
        return pd.DataFrame(columns=["task", "problems", "strict_pct", "flexible_pct"])
    g = initial_tests.groupby("task")
    table = pd.DataFrame({
        "problems": g["problem_id"].nunique(),
        "strict_pct": 100 * g["correct_strict"].mean(),
        "flexible_pct": 100 * g["correct"].mean(),
    }).reset_index()
    return table.set_index("task").loc[order_tasks(table["task"])].reset_index()


# ---------------------------------------------------------------------------
# Screening (notebook 55) and the study's published endpoints
# ---------------------------------------------------------------------------
_REFERENCE_RENAMES = {
    "prompts": "rollout_batch_size", "group": "n_samples_per_prompt", "batch": "global_batch_size",
    "steps": "num_steps_per_rollout", "samples": "responses", "training_seconds": "trainer_seconds",
    "weight_sync_seconds": "sync_seconds", "distinct_training_prompts": "distinct_prompts",
    "prompt_exposures": "prompts_exposed", "peak_allocated_gib": "peak_memory_gib",
}
_REFERENCE_PHASES = {"screen": "screening", "confirm": "confirmation", "lr-followup": "lr-followup"}


def load_reference(csv_path: str | Path) -> pd.DataFrame:
    """The study's 41 published endpoints, mapped onto the ``runs`` columns.

    ``label`` uses the study's recipe names for confirmation runs and the arm
    elsewhere; ``source`` is "study" so mixed tables stay labelled.
    """
    ref = pd.read_csv(csv_path).rename(columns=_REFERENCE_RENAMES)
    ref["phase"] = ref["phase"].map(_REFERENCE_PHASES)
    confirm = ref["phase"] == "confirmation"
    ref["label"] = np.where(confirm, ref["arm"].map(STUDY_RECIPE_NAMES).fillna(ref["arm"]), ref["arm"])
    ref["source"] = "study"
    return ref


def screening_table(runs: pd.DataFrame, arms: Sequence[str] | None = None,
                    reference: pd.DataFrame | None = None,
                    phases: Sequence[str] = ("screening",)) -> pd.DataFrame:
    """Per task and arm: shape, final validation %, job minutes and mixed-group %.

    With ``reference`` the study's published numbers for the same task and
    arm are added as ``study_*`` columns (the study ran each screening arm
    once, on a different model and budget). ``arms`` fixes which arms appear
    and in which order; an arm absent from ``runs`` is left out.
    """
    chosen = runs[runs["phase"].isin(phases)]
    if arms is not None:
        chosen = chosen[chosen["arm"].isin(arms)]
    table = pd.DataFrame({
        "task": chosen["task"], "arm": chosen["arm"], "seed": chosen["seed"],
        "P": chosen["rollout_batch_size"], "G": chosen["n_samples_per_prompt"],
        "B": chosen["global_batch_size"], "S": chosen["num_steps_per_rollout"],
        "collection": chosen["rollout_batch_size"] * chosen["n_samples_per_prompt"],
        "lr": chosen["lr"], "val_pct": 100 * chosen["final_accuracy"],
        "job_min": chosen["job_seconds"] / 60, "mixed_pct": 100 * chosen["mixed_group_fraction"],
    })
    if reference is not None:
        ref = reference[reference["phase"].isin(phases)]
        study_cols = pd.DataFrame({
            "task": ref["task"], "arm": ref["arm"], "study_val_pct": 100 * ref["final_accuracy"],
            "study_job_min": ref["job_seconds"] / 60, "study_mixed_pct": 100 * ref["mixed_group_fraction"],
        })
        table = table.merge(study_cols, on=["task", "arm"], how="left")
    if arms is not None:
        return sort_tasks(_sort_by_labels(table, arms, ["task", "arm", "seed"], column="arm"))
    return sort_tasks(table.sort_values(["collection", "B", "arm", "seed"]))


# ---------------------------------------------------------------------------
# Critical batch sizes (notebook 56)
# ---------------------------------------------------------------------------
def load_rollout_benchmark(pattern: str | Path) -> pd.DataFrame | None:
    """Rows of every rollout benchmark JSON matching ``pattern``; None when there is none.

    A file holds a list of rows or an object with a ``rows`` list.
    """
    paths = sorted(glob.glob(str(pattern)))
    if not paths:
        return None
    frames = []
    for path in paths:
        with open(path) as fh:
            data = json.load(fh)
        rows = data.get("rows", data) if isinstance(data, dict) else data
        frame = pd.DataFrame(rows)
        _require_columns(frame, BENCHMARK_COLUMNS, Path(path).name)
        frames.append(frame.assign(source=Path(path).name))
    return pd.concat(frames, ignore_index=True).sort_values(["gpu", "model", "batch"], ignore_index=True)


def critical_generation_batch(batch: Sequence[float], tokens_per_s: Sequence[float],
                              fraction: float = 0.9) -> float:
    """Smallest measured batch whose generation throughput reaches ``fraction`` of the peak.

    Hunyuan ("When Do Larger Batches Help Scale LLM RL?") defines the
    critical generation batch as the system-efficiency boundary: for a fixed
    model, decoding engine, response-length distribution and hardware, the
    batch where generation throughput approaches its plateau. Below it more
    concurrent sequences share each weight read and raise throughput; above
    it a larger batch buys little. The measured "approaches" is operational
    here: ``fraction`` of the highest throughput seen. ``batch`` and
    ``tokens_per_s`` have shape [points].
    """
    b = np.asarray(batch, dtype=float)
    thr = np.asarray(tokens_per_s, dtype=float)
    if b.shape != thr.shape or b.size == 0:
        raise ValueError("batch and tokens_per_s must be non-empty and equally long")
    order = np.argsort(b)
    b, thr = b[order], thr[order]
    return float(b[np.flatnonzero(thr >= fraction * thr.max())[0]])


def critical_training_batch(batch: Sequence[float], responses_needed: Sequence[float],
                            tolerance: float = 1.2) -> float | None:
    """Largest training batch whose responses-to-target stay within ``tolerance`` x the smallest.

    Hunyuan defines the critical training batch as the sample-efficiency
    boundary: under the current tuning (e.g. square-root LR scaling), the
    upper end of approximate batch-size invariance, where a larger batch
    still needs about the same number of responses to reach a target. Past
    it, fewer updates are no longer compensated and the responses needed
    grow. Censored arms (NaN: target not reached) count as outside the
    tolerance. Returns None when no arm reached the target. Shapes [arms].
    """
    b = np.asarray(batch, dtype=float)
    need = np.asarray(responses_needed, dtype=float)
    if b.shape != need.shape:
        raise ValueError("batch and responses_needed must be equally long")
    reached = np.isfinite(need)
    if not reached.any():
        return None
    within = reached & (need <= tolerance * need[reached].min())
    return float(b[within].max())


def interpolate_throughput(batch: Sequence[float], tokens_per_s: Sequence[float],
                           at: Sequence[float] | float) -> np.ndarray:
    """Throughput at ``at``, linear in log2(batch) between measured points, clamped at the ends."""
    b = np.asarray(batch, dtype=float)
    order = np.argsort(b)
    return np.interp(np.log2(np.asarray(at, dtype=float)), np.log2(b[order]),
                     np.asarray(tokens_per_s, dtype=float)[order])


def responses_to_target(curves: pd.DataFrame, runs: pd.DataFrame, targets: Mapping[str, float],
                        phase: str = "screening") -> pd.DataFrame:
    """Per run of ``phase``: the first evaluation at or above the task's target (NaN if censored)."""
    table = time_to_target_table(curves, runs[runs["phase"] == phase],
                                 {task: [t] for task, t in targets.items()})
    shape = runs[["run_id", "arm", *SHAPE_COLUMNS, "responses_per_collection"]]
    if "run_id" not in table:  # no task of these runs has a target
        return pd.DataFrame(columns=[*table.columns, "responses_needed", *shape.columns])
    table = table.merge(shape, on="run_id").rename(columns={"responses_high": "responses_needed"})
    return table


def predict_time_to_target(rt: pd.DataFrame, runs: pd.DataFrame, collections: pd.DataFrame,
                           bench_batch: Sequence[float], bench_tokens_per_s: Sequence[float],
                           concurrency_cap: int = 512) -> pd.DataFrame:
    """Predicted vs measured active seconds to target, per run that reached it.

    Hunyuan's decomposition, time = responses needed / throughput, is
    applied per component: with N responses needed, the run's mean output
    tokens per response L, collection size R and generation batch
    b = min(R, concurrency_cap),

        predicted = N * L / thr(b)                (generation, benchmark curve)
                  + N * L * c_train                (trainer, per output token)
                  + (N / R) * c_sync               (weight sync, per collection)

    where ``c_train`` and ``c_sync`` are medians over the task's runs in
    ``rt``, so only throughput, length and responses needed differ between
    arms. Measured is the active-phase seconds at the bracket's end (the
    first evaluation at or above target). ``rt`` comes from
    :func:`responses_to_target`; ``bench_*`` have shape [benchmark points].

    ``predicted_steps_active_s`` replaces the generation term with decode
    steps: an engine that keeps finished rows in its batch decodes each chunk
    of b responses until its longest response ends, so a collection costs
    ceil(R / b) chunks x Lmax steps x b / thr(b) seconds per step, with Lmax
    the run's mean longest response per collection. With a long tail of
    runaway responses this, not N * L / thr(b), is what a run pays.
    """
    per_run = collections[collections["run_id"].isin(rt["run_id"])].groupby("run_id").agg(
        trainer=("trainer_seconds", "sum"), sync=("sync_seconds", "sum"),
        generation=("generation_seconds", "sum"), tokens=("output_tokens", "sum"), n=("collection", "size"),
        longest=("response_length_max", "mean"))
    per_run = per_run.join(rt.set_index("run_id")["task"])
    per_run["c_train"] = per_run["trainer"] / per_run["tokens"]
    per_run["c_sync"] = per_run["sync"] / per_run["n"]
    medians = per_run.groupby("task")[["c_train", "c_sync"]].median()
    reached = rt[rt["reached"]].merge(runs[["run_id", "mean_response_length"]], on="run_id")
    gen_batch = np.minimum(reached["responses_per_collection"], concurrency_cap)
    thr = interpolate_throughput(bench_batch, bench_tokens_per_s, gen_batch)
    n, length = reached["responses_needed"], reached["mean_response_length"]
    c_train = reached["task"].map(medians["c_train"])
    c_sync = reached["task"].map(medians["c_sync"])
    collections_needed = n / reached["responses_per_collection"]
    longest = per_run["longest"].reindex(reached["run_id"]).to_numpy()
    chunks = np.ceil(reached["responses_per_collection"] / gen_batch)
    rest = n * length * c_train + collections_needed * c_sync  # trainer + weight sync
    out = pd.DataFrame({
        "task": reached["task"], "arm": reached["arm"], "B": reached["global_batch_size"],
        "collection": reached["responses_per_collection"], "generation_batch": gen_batch,
        "responses_needed": n, "benchmark_tokens_per_s": thr,
        "measured_tokens_per_s": (per_run["tokens"] / per_run["generation"]).reindex(reached["run_id"]).to_numpy(),
        "mean_length": length, "longest_mean": longest,
        "predicted_active_s": n * length / thr + rest,
        "predicted_steps_active_s": collections_needed * chunks * longest * gen_batch / thr + rest,
        "measured_active_s": reached["active_seconds_high"],
    })
    out["ratio"] = out["predicted_active_s"] / out["measured_active_s"]
    out["ratio_steps"] = out["predicted_steps_active_s"] / out["measured_active_s"]
    return sort_tasks(out.sort_values(["collection", "B", "arm"]))


def measured_generation_throughput(collections: pd.DataFrame, runs: pd.DataFrame,
                                   concurrency_cap: int = 512) -> pd.DataFrame:
    """Per run: output tokens per generation second at its generation batch min(P*G, cap)."""
    per_run = collections.groupby("run_id").agg(tokens=("output_tokens", "sum"),
                                                 seconds=("generation_seconds", "sum")).reset_index()
    merged = per_run.merge(runs[["run_id", "task", "arm", "phase", "responses_per_collection"]], on="run_id")
    merged["generation_batch"] = np.minimum(merged["responses_per_collection"], concurrency_cap)
    merged["tokens_per_s"] = merged["tokens"] / merged["seconds"]
    return sort_tasks(merged.sort_values(["generation_batch", "arm"]))


# ---------------------------------------------------------------------------
# Writing tables
# ---------------------------------------------------------------------------
def format_frame(table: pd.DataFrame, decimals: int = 2, formats: Mapping[str, str] | None = None) -> pd.DataFrame:
    """Cells as display strings: floats to ``decimals`` places unless ``formats`` gives a
    column its own format spec (e.g. ``{"lr": ".1e"}``); NaN shows as "n/a"."""
    formats = dict(formats or {})

    def column(col: pd.Series) -> pd.Series:
        spec = formats.get(col.name, f".{decimals}f")

        def cell(v: object) -> str:
            if isinstance(v, (float, np.floating)):
                return "n/a" if math.isnan(v) else format(v, spec)
            if isinstance(v, (tuple, list)):  # e.g. per-seed differences
                return ", ".join(cell(x) for x in v)
            return str(v)

        return col.map(cell)

    return table.apply(column).astype(str)


def to_markdown(table: pd.DataFrame) -> str:
    """A GitHub pipe table of ``table`` as displayed (cells converted with ``str``)."""
    header = "| " + " | ".join(map(str, table.columns)) + " |"
    rule = "| " + " | ".join("---" for _ in table.columns) + " |"
    body = ["| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |"
            for row in table.itertuples(index=False)]
    return "\n".join([header, rule, *body]) + "\n"


def write_table(table: pd.DataFrame, out_dir: str | Path, name: str, decimals: int = 2,
                formats: Mapping[str, str] | None = None, note: str | None = None) -> list[Path]:
    """Write ``name.csv`` (values, floats rounded to 6 places) and ``name.md`` (as :func:`format_frame`).

    ``note`` (e.g. :attr:`Study.note`) opens the Markdown file in bold, so a
    table read on its own still says where its numbers come from. The
    ``result`` objects of :func:`time_to_target_table` are not written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out / f"{name}.csv", out / f"{name}.md"
    values = table.drop(columns=["result"], errors="ignore")
    # Sequence cells (per-seed values) as "a; b; c", rounded like the other floats.
    csv_values = values.round(6).apply(lambda col: col.map(
        lambda v: "; ".join(str(round(float(x), 6)) for x in v) if isinstance(v, (tuple, list)) else v))
    csv_values.to_csv(csv_path, index=False)
    header = f"**{note}**\n\n" if note else ""
    md_path.write_text(header + to_markdown(format_frame(values, decimals, formats)))
    return [csv_path, md_path]

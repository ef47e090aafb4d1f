"""Incomplete studies: targets, phases and arms derived from what exists.

A real study directory may lack phases, arms, seeds, test rows or targets.
The notebooks ask these helpers what to draw; each returns what it found and
a one-line note saying what was missing or derived, so a notebook can print
the note and skip a table or figure instead of failing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import pandas as pd

from grpo_knobs.analysis.constants import GROUP_ARMS, PHASES, SCREENING_QUESTIONS, SHAPE_COLUMNS
from grpo_knobs.analysis.ordering import order_tasks

TASK_FAMILIES = ("gsm8k", "countdown")

# Knob letter -> ``runs`` column.
KNOBS = {
    "P": "rollout_batch_size",
    "G": "n_samples_per_prompt",
    "B": "global_batch_size",
    "S": "num_steps_per_rollout",
}
# Screening question -> (the knob that varies, the knobs held fixed). P x G = B x S, so
# fixing two shape knobs and the varying one determines the fourth.
QUESTION_KNOBS: dict[str, tuple[str, tuple[str, ...]]] = {
    "collection_size": ("P", ("G", "B", "lr")),  # more prompts per collection -> more updates S
    "optimizer_batch": ("B", ("P", "G", "lr")),  # one collection split into fewer, larger updates
    "group_size": ("G", ("B", "S", "lr")),  # same collection and updates, answers per prompt
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
            notes.append(
                f"{task}: no accuracy target given (targets has {sorted(targets) or 'no keys'}); "
                "skipping its target tables and lines"
            )
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
    notes += [
        f"{task}: no {chosen!r} runs; skipping it" for task in order_tasks(runs["task"].unique()) if task not in tasks
    ]
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


def _choose_arms(
    runs: pd.DataFrame,
    defaults: Sequence[str],
    vary: str,
    fixed: Sequence[str],
    what: str,
    default_title: str,
    derived_title,
) -> ArmSet:
    """The named ``defaults`` present in ``runs`` when at least two are, else arms derived by
    :func:`arms_varying`."""
    present = [a for a in defaults if a in set(runs["arm"])]
    if len(present) >= 2:
        return ArmSet(present, default_title, derived=False)
    arms, fixed_values = arms_varying(runs, vary, fixed)
    if not arms:
        return ArmSet(
            [],
            default_title,
            derived=False,
            note=(
                f"no {what}: fewer than two of {list(defaults)} and no runs that differ in {vary} "
                f"at a shared {', '.join(fixed)}"
            ),
        )
    shapes = _arm_shapes(runs[runs["arm"].isin(arms)]).set_index("arm").loc[arms].reset_index()
    listing = ", ".join(f"{a} ({_shape(r)})" for a, r in zip(arms, shapes.to_dict("records")))
    return ArmSet(
        arms,
        derived_title(fixed_values, shapes),
        derived=True,
        note=f"{what} derived from the runs ({vary} varies at {_fixed_text(fixed_values)}): {listing}",
    )


def _span(shapes: pd.DataFrame) -> str:
    """ "P/G/B/S .. P/G/B/S" of the first and last arm."""
    first, last = shapes.iloc[0].to_dict(), shapes.iloc[-1].to_dict()
    return f"{_shape(first)} .. {_shape(last)}" if len(shapes) > 1 else _shape(first)


_DERIVED_TITLES = {
    "collection_size": lambda f, s: f"Collection size at fixed B={int(f['B'])}, G={int(f['G'])} ({_span(s)})",
    "optimizer_batch": lambda f, s: (
        f"Optimizer batch B inside a fixed {int(f['P'] * f['G'])}-response collection ({_span(s)})"
    ),
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
    return _choose_arms(
        runs,
        default_arms if arms is None else arms,
        vary,
        fixed,
        f"{slug.replace('_', ' ')} arms",
        title,
        _DERIVED_TITLES[slug],
    )


def group_arms(runs: pd.DataFrame, arms: Sequence[str] = GROUP_ARMS) -> ArmSet:
    """The group-size arms of one task's runs: ``arms`` if two exist, else runs sharing B and S
    (and the learning rate) but differing in G."""
    return screening_question_arms(runs, "group_size", arms)


def training_batch_arms(runs: pd.DataFrame, arms: Sequence[str] = TRAINING_BATCH_ARMS) -> ArmSet:
    """The critical-training-batch arms of one task's runs: ``arms`` if two exist, else one arm
    per optimizer batch B at a shared G and learning rate (the fewest updates per collection)."""
    vary, fixed = TRAINING_BATCH_KNOBS
    return _choose_arms(
        runs,
        arms,
        vary,
        fixed,
        "training-batch arms",
        "Optimizer batch B",
        lambda f, s: f"Optimizer batch B at G={int(f['G'])} ({_span(s)})",
    )


def comparable_pairs(
    runs: pd.DataFrame, tests: pd.DataFrame, task: str, pairs: Sequence[tuple[str, str]]
) -> tuple[list[tuple[str, str]], list[str]]:
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


def select_benchmark(
    bench: pd.DataFrame | None, runs: pd.DataFrame, gpu: str | None = None
) -> tuple[pd.DataFrame | None, str | None]:
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
        return None, (
            f"the runs ran on {', '.join(sorted(devices))}, not on a benchmarked GPU "
            f"({', '.join(sorted(set(bench['gpu'])))}); its throughput does not describe them"
        )
    return rows[rows["gpu"] == rows["gpu"].iloc[0]], None


def throughput_column_for(runs: pd.DataFrame) -> str:
    """The benchmark column matching how the runs generated: ``{path}_tokens_per_s`` when every run
    recorded one decode path (``rollout_path``: eager, fast or fused). Records without it say only
    their ``fast_rollout`` setting, which then meant: off = eager, fused = fused, auto or on = fast.
    Mixed runs get ``fast_tokens_per_s``."""
    paths = set(runs["rollout_path"].dropna()) if "rollout_path" in runs else set()
    if len(paths) == 1 and runs["rollout_path"].notna().all() and paths <= {"eager", "fast", "fused"}:
        return f"{paths.pop()}_tokens_per_s"
    modes = {str(m).lower() for m in runs["fast_rollout"].dropna()} if "fast_rollout" in runs else set()
    if modes and modes <= {"off", "false"}:
        return "eager_tokens_per_s"
    return "fused_tokens_per_s" if modes == {"fused"} else "fast_tokens_per_s"

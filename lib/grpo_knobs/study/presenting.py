"""Presenting a plan: the table of ``grpo-knobs plan``, its JSON form, and what the records say
about each run."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from ..knobs import KNOB_NAMES
from ..records import RunDir
from .planning import Plan, PlannedRun, TerminalTest
from .scheduling import config_resources, test_job_resources


def _span(lo: int, hi: int) -> str:
    return f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}"


def plan_to_json(plan: Plan, analysis: bool = False) -> list[dict[str, Any]]:
    """One object per run and per terminal test job, for ``grpo-knobs plan --json``; with ``analysis``,
    a last object ``{"phase": "analysis", "preregistration": {...}}`` where the preset registers its
    analysis (``preregistration.Preregistration.to_json``).

    A placeholder's knobs and lr are null (its arm is not chosen yet), as is each count
    that differs between candidate arms; ``range`` gives every count's (low, high). ``resources``
    is what the run asks of one node under ``--scheduler ray`` where GPUs exist (``device: auto``
    asks for none on a CPU-only cluster).
    """
    out = []
    for r in plan.runs:
        counts = r.counts()
        cfg = r.config
        row: dict[str, Any] = {
            "phase": r.phase,
            "run_id": r.run_id,
            "task": r.task,
            "arm": r.arm,
            "seed": r.seed,
            "placeholder": r.placeholder,
            "response_budget": cfg.response_budget,
            "eval_every_responses": cfg.eval_every_responses,
            "resources": config_resources(cfg.to_dict()).to_dict(),
        }
        if r.placeholder:
            row.update(
                {k: None for k in KNOB_NAMES},
                lr=None,
                candidates=[c.arm for c in r.candidates],
                **{k: lo if lo == hi else None for k, (lo, hi) in counts.items()},
                range={k: list(v) for k, v in counts.items()},
            )
        else:
            row.update(
                {k: getattr(cfg, k) for k in KNOB_NAMES},
                lr=cfg.lr,
                **{k: v[0] for k, v in counts.items()},
                config=cfg.to_dict(),
            )
        out.append(row)
    for job in plan.tests:
        out.append(
            {
                "phase": "test",
                "run_id": job.run_id,
                "task": job.task,
                "source": job.source,
                "model": job.model,
                "max_new_tokens": job.max_new_tokens,
                "problems": job.problems,
                "placeholder": job.placeholder,
                "resources": test_job_resources(job.job()).to_dict(),
            }
        )
    if analysis and plan.preregistration is not None:
        out.append({"phase": "analysis", "preregistration": plan.preregistration.to_json()})
    return out


_COUNTS = ("collections", "updates", "evaluations")


def run_progress(study_dir: Path, run_id: str, collections: int | None = None) -> str:
    """What the records under ``study_dir`` say about one run or test job: "-" (not started),
    "done", "done, tested", "12/16" (collections so far) or its failure status."""
    run = RunDir(study_dir / run_id)
    if run.test_path.exists() and run_id.startswith("initial-"):
        return "tested"
    state = run.state()
    if state is None:
        return "-"
    status = state.get("status", "unknown")
    if status == "complete":
        return "done, tested" if run.test_path.exists() else "done"
    done = state.get("collections_done", 0)
    return f"{done}/{collections}" + ("" if status == "running" else f" {status}") if collections else status


def _run_row(r: PlannedRun, study_dir: Path) -> tuple[str, ...]:
    c, counts = r.config, r.counts()
    knobs = ("?",) * 4 if r.placeholder else tuple(str(getattr(c, k)) for k in KNOB_NAMES)
    lr = "?" if r.placeholder else f"{c.lr:.3g}"
    progress = "-" if r.placeholder else run_progress(study_dir, r.run_id, c.collections)
    return (
        r.phase,
        r.task,
        r.arm,
        str(r.seed),
        *knobs,
        lr,
        f"{c.response_budget:,}",
        *(_span(*counts[k]) for k in _COUNTS),
        progress,
    )


def _total_line(label: str, runs: list[PlannedRun]) -> str:
    """Runs, responses and (low-high) counts summed over ``runs``."""
    lo = {k: sum(r.counts()[k][0] for r in runs) for k in _COUNTS}
    hi = {k: sum(r.counts()[k][1] for r in runs) for k in _COUNTS}
    responses = sum(r.config.response_budget for r in runs)
    return (
        f"  {label:<13} {len(runs):>3} runs  {responses:>10,} responses  "
        f"{_span(lo['collections'], hi['collections']):>13}"
        f" collections  {_span(lo['updates'], hi['updates']):>13} updates  "
        f"{_span(lo['evaluations'], hi['evaluations']):>9} evaluations"
    )


def _test_line(tests: list[TerminalTest], tasks: Iterable[str]) -> str:
    waiting = sum(j.placeholder for j in tests)
    by_task = ", ".join(f"{t}: {sum(j.task == t for j in tests)}" for t in tasks)
    problems = ", ".join(sorted({"all" if j.problems is None else str(j.problems) for j in tests}))
    return (
        f"  {'test':<13} {len(tests):>3} terminal test jobs ({by_task}; problems: {problems}"
        f"{f'; {waiting} await selection' if waiting else ''})"
    )


def format_plan_table(plan: Plan) -> str:
    """Runs, responses, collections, updates and evaluations per run, with totals per phase."""
    header = (
        "phase",
        "task",
        "arm",
        "seed",
        "P",
        "G",
        "B",
        "S",
        "lr",
        "responses",
        "collections",
        "updates",
        "evals",
        "records",
    )
    rows = [_run_row(r, plan.study_dir) for r in plan.runs]
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]

    def fmt(cells: Iterable[str]) -> str:
        return "  ".join(
            x.rjust(w) if 3 <= i < len(header) - 1 else x.ljust(w) for i, (x, w) in enumerate(zip(cells, widths))
        ).rstrip()

    lines = [
        f"Study {plan.name} ({plan.source.name}) -> {plan.study_dir}",
        fmt(header),
        fmt(["-" * w for w in widths]),
    ]
    lines += [fmt(row) for row in rows]
    lines += ["", "Totals by phase (a-b: range while confirmation arms are unselected):"]
    phases = dict.fromkeys(r.phase for r in plan.runs)
    lines += [_total_line(ph, plan.phase(ph)) for ph in phases]
    lines += [_total_line("all training", plan.runs), _test_line(plan.tests, plan.targets)]
    left = [r for r in plan.runs if not RunDir(plan.study_dir / r.run_id).is_complete()]
    untested = [j for j in plan.tests if not RunDir(plan.study_dir / j.run_id).test_path.exists()]
    lines.append(
        f"Left to run under {plan.study_dir}: {len(left)} of {len(plan.runs)} training runs, "
        f"{len(untested)} of {len(plan.tests)} terminal test jobs"
    )
    if plan.candidates:
        lines.append("Selection rule: " + plan.rule.describe())
    if plan.fixed_recipes:
        fixed = "; ".join(f"{t}: {', '.join(a)}" for t, a in plan.fixed_recipes.items())
        lines.append(f"Confirmation recipes fixed in the preset (not selected): {fixed}")
    if plan.selection:
        picks = "; ".join(f"{t}: {', '.join(a)}" for t, a in plan.selection["recipes"].items())
        lines.append(f"Selected recipes: {picks}")
    targets = "; ".join(f"{t}: {', '.join(f'{x:.8g}' for x in v)}" for t, v in plan.targets.items())
    lines.append(f"Targets (validation %): {targets}")
    if plan.preregistration is not None:
        lines += ["", plan.preregistration.describe()]
    return "\n".join(lines)

"""Study plans and the drivers that execute them.

A study plan (``studies/<preset>.yaml``) is compact: shared RunConfig defaults, the
tasks, a screening arm list, LR follow-up controls, a selection rule fixed in advance,
a confirmation spec and the terminal test spec. ``plan()`` expands it into one
validated ``RunConfig`` per run, so a bad shape or budget fails before any run starts.
Confirmation depends on the screening outcome: until ``<study_dir>/selection.json``
exists its runs are placeholders whose count and budgets are known (and validated for
every arm that could be selected) but whose arms are not.

``run_study()`` executes a plan phase by phase: each training run executes
``notebooks/10_train.ipynb`` through papermill (or ``trainer.train`` in-process where
Jupyter is absent, as on the GPU machine), completed runs are skipped, a killed run is
resumed from its last saved state, and a failed run is recorded while the others go on.

YAML schema (every key except ``name`` and ``tasks`` is optional)::

    name: paper                  # study name; default study dir runs/<name>
    params: {countdown: countdown-2x10}   # "${countdown}" anywhere below; plan(params=...) overrides
    defaults: {...}              # RunConfig fields shared by all runs; ``lr`` is the base rate
    arms: {name: {rollout_batch_size, n_samples_per_prompt, global_batch_size,
                  num_steps_per_rollout, lr_multiplier}}   # inline arms beside knobs.STUDY_ARMS
    tasks: {task: {targets: [pct, ...], defaults: {...}, screening: {...}, ...}}  # per-task overrides
    screening: {arms: [...], seeds: [0], <RunConfig fields>}
    lr_followup: [{task, arm, seeds, <RunConfig fields>}]
    selection: {recipes: 3, always_include: [onpolicy-small], rank_by: [final_accuracy, sample_auc, job_seconds]}
    confirmation: {seeds: [1, 2, 3], <RunConfig fields>}
    test: {problems: null, max_new_tokens: null, initial_model: true}
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import gc
import json
import os
import queue
import re
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml
from tqdm.auto import tqdm

from .config import RunConfig
from .knobs import KNOB_NAMES, LR_FOLLOWUP_ARM, STUDY_ARMS, Arm
from .provenance import REPO_ROOT
from .records import RunDir, atomic_write_json, read_json

STUDIES_DIR = REPO_ROOT / "studies"
TRAIN_NOTEBOOK = REPO_ROOT / "notebooks" / "10_train.ipynb"
TRAIN_PHASES = ("screening", "lr-followup", "confirmation")
PHASE_ORDER = ("screening", "lr-followup", "selection", "confirmation", "test")
EXECUTORS = ("auto", "papermill", "inprocess")
# Ranking metrics of the selection rule and whether higher is better.
RANK_METRICS = {"final_accuracy": True, "sample_auc": True, "job_seconds": False}
# Fields the plan sets per run; a preset may not set them in defaults or phase sections.
PLAN_OWNED = frozenset(KNOB_NAMES) | {"task", "phase", "arm", "seed", "run_id", "output_dir", "study", "resume"}
# Fields that may differ between a recorded run and its plan without changing what it learns.
LOCAL_FIELDS = frozenset({"resume", "output_dir", "device", "engine_url", "data_dir"})
_TOP_KEYS = {"name", "description", "params", "defaults", "arms", "tasks", "screening", "lr_followup",
             "selection", "confirmation", "test"}
_TASK_KEYS = {"targets", "defaults", "screening", "selection", "confirmation", "test"}
_PARAM = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class PlanError(ValueError):
    """A study plan that must not start: the message names the run (or key) and the problem."""


# ---------------------------------------------------------------------------------------
# Plan data
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlannedRun:
    """One training run of a study.

    A placeholder (a confirmation slot before selection) carries a stand-in config (the
    first candidate's shape) so that it validates, plus every candidate's config: its
    collections, updates and evaluations are only known as a range until selection.
    """

    phase: str
    task: str
    arm: str
    seed: int
    config: RunConfig
    placeholder: bool = False
    candidates: tuple[RunConfig, ...] = ()

    @property
    def run_id(self) -> str:
        return self.config.run_id

    def counts(self) -> dict[str, tuple[int, int]]:
        """(low, high) of collections, updates and evaluations; equal ends when concrete."""
        configs = self.candidates if self.placeholder else (self.config,)
        values = {
            "collections": [c.collections for c in configs],
            "updates": [c.plan.updates_for_budget(c.response_budget) for c in configs],
            "evaluations": [len(c.eval_points) for c in configs],
        }
        return {k: (min(v), max(v)) for k, v in values.items()}


@dataclass(frozen=True)
class TerminalTest:
    """A terminal test job: a confirmation checkpoint, or the initial model of a task."""

    run_id: str
    task: str
    model: str
    max_new_tokens: int
    problems: int | None
    source: str  # "initial" or "confirmation"
    placeholder: bool = False
    device: str = "auto"
    data_dir: str | None = None

    def job(self) -> dict[str, Any]:
        """The mapping ``evaluation.run_test_job`` takes."""
        return {"run_id": self.run_id, "task": self.task, "model": self.model, "max_new_tokens": self.max_new_tokens,
                "problems": self.problems, "device": self.device, "data_dir": self.data_dir}


@dataclass(frozen=True)
class SelectionRule:
    """How confirmation recipes are chosen from screening; fixed in the preset before screening."""

    recipes: dict[str, int]
    always_include: tuple[str, ...]
    rank_by: tuple[str, ...]

    def describe(self) -> str:
        order = {"final_accuracy": "final validation accuracy (higher first)",
                 "sample_auc": "validation sample AUC (higher first)",
                 "job_seconds": "complete job seconds (lower first)"}
        ranked = order[self.rank_by[0]] + "".join(f", then {order[k]}" for k in self.rank_by[1:])
        counts = ", ".join(f"{n} for {t}" for t, n in self.recipes.items())
        keep = (f"Always keep {', '.join(self.always_include)} (the baseline for paired comparisons) and "
                if self.always_include else "Take ")
        return (f"Per task, rank the screening arms by {ranked}, each averaged over screening seeds. {keep}"
                f"fill the remaining recipe slots with the top-ranked other arms (recipes: {counts}). "
                "Only validation rows of complete screening runs are read; test data is never opened.")


@dataclass
class Plan:
    """A resolved study: every run validated, plus terminal test jobs and analysis targets."""

    name: str
    source: Path
    study_dir: Path
    params: dict[str, Any]
    runs: list[PlannedRun]
    tests: list[TerminalTest]
    targets: dict[str, list[float]]
    rule: SelectionRule
    candidates: dict[str, list[str]]  # task -> screening arm names (the selection pool)
    selection: dict | None = None

    def phase(self, name: str) -> list[PlannedRun]:
        return [r for r in self.runs if r.phase == name]

    @property
    def selected(self) -> bool:
        return self.selection is not None


# ---------------------------------------------------------------------------------------
# Loading and expanding a preset
# ---------------------------------------------------------------------------------------
def preset_path(preset_or_path: str | Path) -> Path:
    """A preset name (``studies/<name>.yaml``) or a path to a plan file."""
    p = Path(preset_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.is_file():
            raise PlanError(f"Study plan file {p} does not exist.")
        return p
    candidate = STUDIES_DIR / f"{preset_or_path}.yaml"
    if not candidate.is_file():
        known = ", ".join(sorted(q.stem for q in STUDIES_DIR.glob("*.yaml"))) or "none"
        raise PlanError(f"Unknown study preset {preset_or_path!r}; presets in {STUDIES_DIR}: {known}.")
    return candidate


def _substitute(node: Any, params: dict[str, Any]) -> Any:
    """Replace ``${name}``: a whole-string reference keeps the parameter's type."""
    if isinstance(node, dict):
        return {_substitute(k, params): _substitute(v, params) for k, v in node.items()}
    if isinstance(node, list):
        return [_substitute(v, params) for v in node]
    if not isinstance(node, str):
        return node
    for name in _PARAM.findall(node):
        if name not in params:
            raise PlanError(f"'${{{name}}}' is used but not declared under params: (declared: {sorted(params)}).")
    whole = _PARAM.fullmatch(node)
    if whole:
        return params[whole.group(1)]
    return _PARAM.sub(lambda m: str(params[m.group(1)]), node)


def load_spec(preset_or_path: str | Path, params: dict[str, Any] | None = None) -> tuple[dict, Path, dict]:
    """Read a plan file and substitute its parameters. Returns (spec, path, params used)."""
    path = preset_path(preset_or_path)
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    if not isinstance(raw, dict):
        raise PlanError(f"{path}: a study plan is a mapping, got {type(raw).__name__}.")
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise PlanError(f"{path}: unknown top-level key(s) {sorted(unknown)}; valid keys: {sorted(_TOP_KEYS)}.")
    declared = dict(raw.pop("params", None) or {})
    extra = set(params or {}) - set(declared)
    if extra:
        raise PlanError(f"{path}: parameter(s) {sorted(extra)} are not declared under params: "
                        f"(declared: {sorted(declared)}).")
    used = {**declared, **(params or {})}
    spec = _substitute(raw, used)
    for key in ("name", "tasks"):
        if not spec.get(key):
            raise PlanError(f"{path}: the plan needs {key!r}.")
    return spec, path, used


def _arms(spec: dict) -> dict[str, Arm]:
    """Known arms: the study's grid, its LR follow-up arm, and the plan's inline arms."""
    arms = dict(STUDY_ARMS)
    arms[LR_FOLLOWUP_ARM.name] = LR_FOLLOWUP_ARM
    for name, fields in (spec.get("arms") or {}).items():
        if name in arms:
            raise PlanError(f"Inline arm {name!r} reuses the name of a built-in arm; choose another name.")
        try:
            arms[name] = Arm(name, **fields)
        except TypeError as exc:
            raise PlanError(f"Inline arm {name!r}: {exc}. Fields: {', '.join(KNOB_NAMES)}, lr_multiplier.") from None
    return arms


def _section(spec: dict, task: str, name: str) -> dict:
    """A phase section with the task's overrides merged over the study-wide one."""
    merged = dict(spec.get(name) or {})
    merged.update((spec["tasks"][task] or {}).get(name) or {})
    return merged


def _split(section: dict, own: set[str], where: str) -> tuple[dict, dict]:
    """Separate a section's own keys from the RunConfig fields it sets for its runs."""
    run_fields = {k: v for k, v in section.items() if k not in own}
    owned = sorted(set(run_fields) & PLAN_OWNED)
    if owned:
        raise PlanError(f"{where}: {owned} are set by the plan per run (the arm sets the knobs, 'seeds' the seed).")
    return {k: section[k] for k in own if k in section}, run_fields


def _check_task(task: str) -> None:
    from .data import TASKS
    if task not in TASKS:
        raise PlanError(f"Unknown task {task!r}; tasks: {', '.join(TASKS)}.")


def _make_config(run_id: str, values: dict) -> RunConfig:
    try:
        return RunConfig.from_dict(values)
    except (ValueError, TypeError) as exc:
        raise PlanError(f"Run {run_id}: {exc}") from None


@dataclass
class _Context:
    """What every run of one task shares while a plan is expanded."""

    spec: dict
    task: str
    arms: dict[str, Arm]
    study_dir: Path

    def arm(self, name: str, where: str) -> Arm:
        if name not in self.arms:
            raise PlanError(f"{where}: unknown arm {name!r}; known arms: {', '.join(self.arms)}.")
        return self.arms[name]

    def defaults(self) -> dict:
        """The study's defaults with the task's defaults merged over them."""
        values = dict(self.spec.get("defaults") or {})
        values.update((self.spec["tasks"][self.task] or {}).get("defaults") or {})
        owned = sorted(set(values) & PLAN_OWNED)
        if owned:
            raise PlanError(f"defaults ({self.task}): {owned} are set by the plan per run, not in defaults.")
        return values

    def default(self, name: str) -> Any:
        """One run parameter as the task's runs get it unless a phase overrides it."""
        return self.defaults().get(name, getattr(RunConfig, name))

    def config(self, phase: str, arm: Arm, seed: int, run_fields: dict, run_id: str | None = None) -> RunConfig:
        """The RunConfig of one run: defaults < task defaults < phase fields < plan-owned values."""
        values = self.defaults()
        values.update(run_fields)
        base_lr = values.get("lr", RunConfig.lr)
        run_id = run_id or f"{phase}-{self.task}-{arm.name}-s{seed}"
        values.update({name: getattr(arm, name) for name in KNOB_NAMES})
        values.update(task=self.task, phase=phase, arm=arm.name, seed=seed, run_id=run_id, study=self.spec["name"],
                      output_dir=str(self.study_dir), lr=base_lr * arm.lr_multiplier)
        return _make_config(run_id, values)


def _seeds(own: dict, default: list[int], where: str) -> list[int]:
    seeds = own.get("seeds", default)
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise PlanError(f"{where}: seeds must be a non-empty list of integers, got {seeds!r}.")
    return seeds


def _screening_runs(ctx: _Context) -> tuple[list[PlannedRun], list[str]]:
    own, fields = _split(_section(ctx.spec, ctx.task, "screening"), {"arms", "seeds"}, f"screening ({ctx.task})")
    names = list(own.get("arms") or [])
    if len(set(names)) != len(names):
        raise PlanError(f"screening ({ctx.task}): an arm is listed twice: {names}.")
    runs = [PlannedRun("screening", ctx.task, name, seed,
                       ctx.config("screening", ctx.arm(name, f"screening ({ctx.task})"), seed, fields))
            for name in names for seed in _seeds(own, [0], f"screening ({ctx.task})")]
    return runs, names


def _followup_runs(spec: dict, contexts: dict[str, _Context]) -> list[PlannedRun]:
    runs = []
    for i, entry in enumerate(spec.get("lr_followup") or []):
        own, fields = _split(dict(entry), {"task", "arm", "seeds"}, f"lr_followup[{i}]")
        task = own.get("task")
        if task not in contexts:
            raise PlanError(f"lr_followup[{i}]: task {task!r} is not one of the plan's tasks {list(contexts)}.")
        ctx = contexts[task]
        arm = ctx.arm(own.get("arm", ""), f"lr_followup[{i}]")
        runs += [PlannedRun("lr-followup", task, arm.name, seed, ctx.config("lr-followup", arm, seed, fields))
                 for seed in _seeds(own, [0], f"lr_followup[{i}]")]
    return runs


def _rule(spec: dict, candidates: dict[str, list[str]]) -> SelectionRule:
    counts, always, rank_by = {}, None, None
    for task, pool in candidates.items():
        own, extra = _split(_section(spec, task, "selection"), {"recipes", "always_include", "rank_by"},
                            f"selection ({task})")
        if extra:
            raise PlanError(f"selection ({task}): unknown key(s) {sorted(extra)}; keys: recipes, always_include, rank_by.")
        keep = tuple(own.get("always_include") or ())
        order = tuple(own.get("rank_by") or ("final_accuracy", "sample_auc", "job_seconds"))
        bad = [k for k in order if k not in RANK_METRICS]
        if bad:
            raise PlanError(f"selection ({task}): unknown rank_by metric(s) {bad}; metrics: {list(RANK_METRICS)}.")
        missing = [a for a in keep if a not in pool]
        if missing:
            raise PlanError(f"selection ({task}): always_include {missing} must be screened arms of {task} ({pool}).")
        n = own.get("recipes", 3)
        if not isinstance(n, int) or n < max(1, len(keep)):
            raise PlanError(f"selection ({task}): recipes must be an integer >= {max(1, len(keep))}, got {n!r}.")
        if (always, rank_by) not in ((None, None), (keep, order)):
            raise PlanError("selection: always_include and rank_by must be the same for every task "
                            "(only the number of recipes may differ per task).")
        always, rank_by = keep, order
        counts[task] = min(n, len(pool))
    return SelectionRule(counts, always or (), rank_by or tuple(RANK_METRICS))


def _confirmation_runs(ctx: _Context, pool: list[str], n_recipes: int, selection: dict | None) -> list[PlannedRun]:
    where = f"confirmation ({ctx.task})"
    own, fields = _split(_section(ctx.spec, ctx.task, "confirmation"), {"seeds"}, where)
    seeds = _seeds(own, [1, 2, 3], where)
    if selection is not None:
        recipes = selection["recipes"].get(ctx.task)
        if recipes is None:
            raise PlanError(f"selection.json has no recipes for task {ctx.task!r}.")
        return [PlannedRun("confirmation", ctx.task, name, seed,
                           ctx.config("confirmation", ctx.arm(name, f"selection.json ({ctx.task})"), seed, fields))
                for name in recipes for seed in seeds]
    runs = []
    for k in range(1, n_recipes + 1):
        for seed in seeds:
            # Every arm that could fill the slot must accept the budget and cadence.
            options = tuple(ctx.config("confirmation", ctx.arm(a, where), seed, fields,
                                       run_id=f"confirmation-{ctx.task}-{a}-s{seed}") for a in pool)
            stand_in = dataclasses.replace(options[0], arm=f"<selected-{k}>",
                                           run_id=f"confirmation-{ctx.task}-selected-{k}-s{seed}")
            runs.append(PlannedRun("confirmation", ctx.task, stand_in.arm, seed, stand_in, True, options))
    return runs


def _test_jobs(ctx: _Context, confirmation: list[PlannedRun]) -> list[TerminalTest]:
    own, extra = _split(_section(ctx.spec, ctx.task, "test"), {"problems", "max_new_tokens", "initial_model"},
                        f"test ({ctx.task})")
    if extra:
        raise PlanError(f"test ({ctx.task}): unknown key(s) {sorted(extra)}; keys: problems, max_new_tokens, initial_model.")
    problems = own.get("problems")
    if problems is not None and (not isinstance(problems, int) or problems <= 0):
        raise PlanError(f"test ({ctx.task}): problems must be a positive integer or null (all), got {problems!r}.")
    jobs = []
    cap = own.get("max_new_tokens") or ctx.default("eval_max_new_tokens") or ctx.default("max_new_tokens")
    if not isinstance(cap, int) or cap <= 0:
        raise PlanError(f"test ({ctx.task}): max_new_tokens must be a positive integer, got {cap!r}.")
    common = {"task": ctx.task, "max_new_tokens": cap, "problems": problems, "device": ctx.default("device"),
              "data_dir": ctx.default("data_dir")}
    if own.get("initial_model", True):
        jobs.append(TerminalTest(f"initial-{ctx.task}", model=ctx.default("model"), source="initial", **common))
    for run in confirmation:
        jobs.append(TerminalTest(run.run_id, model=str(ctx.study_dir / run.run_id / "final"),
                                 source="confirmation", placeholder=run.placeholder, **common))
    return jobs


def _targets(spec: dict, task: str) -> list[float]:
    targets = (spec["tasks"][task] or {}).get("targets") or []
    if not all(isinstance(t, (int, float)) and 0 <= t <= 100 for t in targets):
        raise PlanError(f"tasks.{task}.targets must be accuracies in percent, got {targets!r}.")
    return [float(t) for t in targets]


def default_study_dir(name: str) -> Path:
    return REPO_ROOT / "runs" / name


def plan(preset_or_path: str | Path, selection: dict | str | Path | None = None, *,
         study_dir: str | Path | None = None, params: dict[str, Any] | None = None) -> Plan:
    """Expand a preset into validated runs; raises PlanError naming the first bad run.

    ``selection``: a selection mapping or a path to one; when None, the study dir's
    ``selection.json`` is used if it exists, otherwise confirmation runs are placeholders.
    """
    spec, path, used = load_spec(preset_or_path, params)
    study_dir = Path(study_dir or default_study_dir(spec["name"])).resolve()
    arms = _arms(spec)
    tasks = list(spec["tasks"])
    for task in tasks:
        _check_task(task)
        unknown = set(spec["tasks"][task] or {}) - _TASK_KEYS
        if unknown:
            raise PlanError(f"tasks.{task}: unknown key(s) {sorted(unknown)}; keys: {sorted(_TASK_KEYS)}.")
    contexts = {t: _Context(spec, t, arms, study_dir) for t in tasks}
    screening, candidates = [], {}
    for task in tasks:
        runs, candidates[task] = _screening_runs(contexts[task])
        screening += runs
    rule = _rule(spec, candidates)
    chosen = _load_selection(selection, study_dir, candidates, arms)
    confirmation, tests = [], []
    for task in tasks:
        runs = _confirmation_runs(contexts[task], candidates[task], rule.recipes[task], chosen)
        confirmation += runs
        tests += _test_jobs(contexts[task], runs)
    runs = screening + _followup_runs(spec, contexts) + confirmation
    seen: set[str] = set()
    for r in runs:
        if r.run_id in seen:
            raise PlanError(f"Run {r.run_id} is planned twice; run ids must be unique within a study.")
        seen.add(r.run_id)
    return Plan(spec["name"], path, study_dir, used, runs, tests, {t: _targets(spec, t) for t in tasks},
                rule, candidates, chosen)


def _load_selection(selection: dict | str | Path | None, study_dir: Path, candidates: dict[str, list[str]],
                    arms: dict[str, Arm]) -> dict | None:
    if selection is None:
        path = study_dir / "selection.json"
        if not path.exists():
            return None
        selection = path
    if isinstance(selection, (str, Path)):
        selection = read_json(Path(selection))
    recipes = selection.get("recipes")
    if not isinstance(recipes, dict) or set(recipes) != set(candidates):
        raise PlanError(f"A selection needs recipes for exactly the plan's tasks {list(candidates)}; got {recipes!r}.")
    for task, names in recipes.items():
        unknown = [a for a in names if a not in arms]
        if unknown or len(set(names)) != len(names):
            raise PlanError(f"Selection for {task}: recipes {names} must be distinct known arms (unknown: {unknown}).")
    return selection


# ---------------------------------------------------------------------------------------
# Presenting a plan
# ---------------------------------------------------------------------------------------
def _span(lo: int, hi: int) -> str:
    return f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}"


def plan_to_json(plan: Plan) -> list[dict[str, Any]]:
    """One object per run and per terminal test job, for ``grpo-knobs plan --json``.

    A placeholder's knobs and lr are null (its arm is not chosen yet), as is each count
    that differs between candidate arms; ``range`` gives every count's (low, high).
    """
    out = []
    for r in plan.runs:
        counts = r.counts()
        cfg = r.config
        row: dict[str, Any] = {"phase": r.phase, "run_id": r.run_id, "task": r.task, "arm": r.arm, "seed": r.seed,
                               "placeholder": r.placeholder, "response_budget": cfg.response_budget,
                               "eval_every_responses": cfg.eval_every_responses}
        if r.placeholder:
            row.update({k: None for k in KNOB_NAMES}, lr=None, candidates=[c.arm for c in r.candidates],
                       **{k: lo if lo == hi else None for k, (lo, hi) in counts.items()},
                       range={k: list(v) for k, v in counts.items()})
        else:
            row.update({k: getattr(cfg, k) for k in KNOB_NAMES}, lr=cfg.lr,
                       **{k: v[0] for k, v in counts.items()}, config=cfg.to_dict())
        out.append(row)
    for job in plan.tests:
        out.append({"phase": "test", "run_id": job.run_id, "task": job.task, "source": job.source,
                    "model": job.model, "max_new_tokens": job.max_new_tokens, "problems": job.problems,
                    "placeholder": job.placeholder})
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
    return (r.phase, r.task, r.arm, str(r.seed), *knobs, lr, f"{c.response_budget:,}",
            *(_span(*counts[k]) for k in _COUNTS), progress)


def _total_line(label: str, runs: list[PlannedRun]) -> str:
    """Runs, responses and (low-high) counts summed over ``runs``."""
    lo = {k: sum(r.counts()[k][0] for r in runs) for k in _COUNTS}
    hi = {k: sum(r.counts()[k][1] for r in runs) for k in _COUNTS}
    responses = sum(r.config.response_budget for r in runs)
    return (f"  {label:<13} {len(runs):>3} runs  {responses:>10,} responses  {_span(lo['collections'], hi['collections']):>13}"
            f" collections  {_span(lo['updates'], hi['updates']):>13} updates  "
            f"{_span(lo['evaluations'], hi['evaluations']):>9} evaluations")


def _test_line(tests: list[TerminalTest], tasks: Iterable[str]) -> str:
    waiting = sum(j.placeholder for j in tests)
    by_task = ", ".join(f"{t}: {sum(j.task == t for j in tests)}" for t in tasks)
    problems = ", ".join(sorted({"all" if j.problems is None else str(j.problems) for j in tests}))
    return (f"  {'test':<13} {len(tests):>3} terminal test jobs ({by_task}; problems: {problems}"
            f"{f'; {waiting} await selection' if waiting else ''})")


def format_plan_table(plan: Plan) -> str:
    """Runs, responses, collections, updates and evaluations per run, with totals per phase."""
    header = ("phase", "task", "arm", "seed", "P", "G", "B", "S", "lr", "responses", "collections", "updates", "evals",
              "records")
    rows = [_run_row(r, plan.study_dir) for r in plan.runs]
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]

    def fmt(cells: Iterable[str]) -> str:
        return "  ".join(x.rjust(w) if 3 <= i < len(header) - 1 else x.ljust(w)
                         for i, (x, w) in enumerate(zip(cells, widths))).rstrip()

    lines = [f"Study {plan.name} ({plan.source.name}) -> {plan.study_dir}", fmt(header), fmt(["-" * w for w in widths])]
    lines += [fmt(row) for row in rows]
    lines += ["", "Totals by phase (a-b: range while confirmation arms are unselected):"]
    phases = dict.fromkeys(r.phase for r in plan.runs)
    lines += [_total_line(ph, plan.phase(ph)) for ph in phases]
    lines += [_total_line("all training", plan.runs), _test_line(plan.tests, plan.targets)]
    left = [r for r in plan.runs if not RunDir(plan.study_dir / r.run_id).is_complete()]
    untested = [j for j in plan.tests if not RunDir(plan.study_dir / j.run_id).test_path.exists()]
    lines.append(f"Left to run under {plan.study_dir}: {len(left)} of {len(plan.runs)} training runs, "
                 f"{len(untested)} of {len(plan.tests)} terminal test jobs")
    lines.append("Selection rule: " + plan.rule.describe())
    if plan.selection:
        picks = "; ".join(f"{t}: {', '.join(a)}" for t, a in plan.selection["recipes"].items())
        lines.append(f"Selected recipes: {picks}")
    targets = "; ".join(f"{t}: {', '.join(f'{x:.8g}' for x in v)}" for t, v in plan.targets.items())
    lines.append(f"Targets (validation %): {targets}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Selection
# ---------------------------------------------------------------------------------------
def _validation_scores(run_dir: Path) -> dict[str, float]:
    """Final accuracy, sample AUC and job seconds of one complete run, from validation rows only."""
    import pandas as pd
    from .stats import sample_auc

    run = RunDir(run_dir)
    evals = pd.read_parquet(run.evals_path, columns=["split", "responses", "correct"])
    curve = evals[evals["split"] == "validation"].groupby("responses")["correct"].mean().sort_index()
    if curve.empty:
        raise PlanError(f"{run_dir}: no validation rows in evals.parquet.")
    auc = sample_auc(curve.index.to_numpy(), curve.to_numpy()) if len(curve) > 1 else float(curve.iloc[-1])
    return {"final_accuracy": float(curve.iloc[-1]), "sample_auc": auc,
            "job_seconds": float(read_json(run.timings_path)["job"])}


def _rank(scores: dict[str, dict[str, float]], rank_by: tuple[str, ...]) -> list[str]:
    def key(arm: str) -> tuple:
        return tuple(-scores[arm][m] if RANK_METRICS[m] else scores[arm][m] for m in rank_by) + (arm,)
    return sorted(scores, key=key)


def compute_selection(plan: Plan) -> dict:
    """Apply the plan's selection rule to its complete screening runs.

    Raises PlanError listing the screening runs that are not complete: the rule ranks
    the whole screened pool, so selecting from a partial screen would change its meaning.
    """
    screening = plan.phase("screening")
    missing = [r.run_id for r in screening if not RunDir(plan.study_dir / r.run_id).is_complete()]
    if missing:
        raise PlanError(f"Selection needs every screening run complete; not complete: {', '.join(missing)}.")
    recipes, scores = {}, {}
    for task, pool in plan.candidates.items():
        per_arm: dict[str, dict[str, float]] = {}
        for arm in pool:
            seeds = [_validation_scores(plan.study_dir / r.run_id) for r in screening if r.task == task and r.arm == arm]
            per_arm[arm] = {m: sum(s[m] for s in seeds) / len(seeds) for m in RANK_METRICS}
        order = _rank(per_arm, plan.rule.rank_by)
        keep = list(plan.rule.always_include)
        recipes[task] = keep + [a for a in order if a not in keep][: plan.rule.recipes[task] - len(keep)]
        scores[task] = {a: per_arm[a] | {"rank": order.index(a) + 1} for a in order}
    return {"rule": plan.rule.describe(), "rank_by": list(plan.rule.rank_by), "recipes": recipes, "scores": scores}


def select(preset_or_plan: str | Path | Plan, *, study_dir: str | Path | None = None,
           params: dict[str, Any] | None = None) -> dict:
    """Write ``<study_dir>/selection.json`` once; afterwards the recipes are frozen.

    Rerunning returns the existing file when the rule still yields the same recipes and
    raises otherwise, so a changed screen can never silently change what was confirmed.
    """
    p = preset_or_plan if isinstance(preset_or_plan, Plan) else plan(preset_or_plan, study_dir=study_dir, params=params)
    fresh = compute_selection(p)
    path = p.study_dir / "selection.json"
    if path.exists():
        existing = read_json(path)
        if existing.get("recipes") != fresh["recipes"]:
            raise PlanError(f"{path} already holds recipes {existing.get('recipes')}, but the screening runs now give "
                            f"{fresh['recipes']}. Selection is frozen once written; move the file away to reselect.")
        return existing
    atomic_write_json(path, fresh | {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                     "screening_runs": [r.run_id for r in p.phase("screening")]})
    return read_json(path)


def validation_summary(p: Plan, phase: str):
    """Final validation accuracy, sample AUC and job seconds of the phase's complete runs."""
    import pandas as pd
    rows = [{"task": r.task, "arm": r.arm, "seed": r.seed, "run_id": r.run_id,
             **_validation_scores(p.study_dir / r.run_id)}
            for r in p.phase(phase) if not r.placeholder and RunDir(p.study_dir / r.run_id).is_complete()]
    return pd.DataFrame(rows, columns=["task", "arm", "seed", "run_id", *RANK_METRICS])


def selection_table(selection: dict):
    """The selection scores as a DataFrame (task, arm, rank, metrics, selected)."""
    import pandas as pd
    rows = [{"task": task, "arm": arm, **vals, "selected": arm in selection["recipes"][task]}
            for task, arms in selection["scores"].items() for arm, vals in arms.items()]
    return pd.DataFrame(rows).sort_values(["task", "rank"]).reset_index(drop=True)


# ---------------------------------------------------------------------------------------
# Execution
# ---------------------------------------------------------------------------------------
@dataclass
class JobResult:
    """What happened to one run or test job in one ``run_study`` call."""

    run_id: str
    phase: str
    status: str  # complete, skipped, failed, blocked
    seconds: float = 0.0
    error: str | None = None
    record: str | None = None  # the failed notebook or failure file


@dataclass
class StudyReport:
    """Outcome of ``run_study``: every job's status; ``summary()`` names each failure and its record."""

    study_dir: Path
    results: list[JobResult] = field(default_factory=list)
    selection: dict | None = None

    @property
    def failed(self) -> list[JobResult]:
        return [r for r in self.results if r.status in ("failed", "blocked")]

    @property
    def ok(self) -> bool:
        return not self.failed

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.status] = out.get(r.status, 0) + 1
        return out

    def summary(self) -> str:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(self.counts().items())) or "nothing to do"
        lines = [f"Study {self.study_dir}: {counts}."]
        for r in self.failed:
            lines.append(f"  {r.status.upper()} {r.run_id} ({r.phase}): {r.error}" + (f"\n    see {r.record}" if r.record else ""))
        return "\n".join(lines)

    __str__ = summary

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame([dataclasses.asdict(r) for r in self.results])

    def raise_on_failure(self) -> None:
        """Fail a driver notebook or command after the report has been shown."""
        if self.failed:
            raise RuntimeError(self.summary())


def _resolve_executor(executor: str) -> str:
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}.")
    if executor != "auto":
        return executor
    try:
        import papermill  # noqa: F401
    except ImportError:
        return "inprocess"
    return "papermill" if TRAIN_NOTEBOOK.exists() else "inprocess"


def _subprocess_env(threads: int | None) -> dict[str, str]:
    """The environment of kernels and workers: this library importable, threads bounded."""
    env = dict(os.environ)
    lib = str(Path(__file__).resolve().parents[1])
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if lib not in parts:
        env["PYTHONPATH"] = os.pathsep.join([lib, *parts])
    if threads:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[var] = str(threads)
    return env


def _config_drift(cfg: RunConfig) -> list[str]:
    """Fields whose recorded value differs from the plan, for a run that already has records."""
    path = RunDir(cfg.run_dir).config_path
    if not path.exists():
        return []
    recorded = read_json(path).get("config", {})
    planned = cfg.to_dict()
    # Fields newer than the record are not compared, so adding a RunConfig field keeps old runs resumable.
    return [f"{k}: recorded {recorded[k]!r}, planned {v!r}" for k, v in planned.items()
            if k not in LOCAL_FIELDS and k in recorded and recorded[k] != v]


def _error_text(exc: BaseException) -> str:
    ename, evalue = getattr(exc, "ename", None), getattr(exc, "evalue", None)
    text = f"{ename}: {evalue}" if ename else f"{type(exc).__name__}: {exc}"
    return text.strip().splitlines()[0][:500] if text.strip() else type(exc).__name__


def _train_papermill(cfg: RunConfig) -> tuple[str | None, str | None]:
    """Execute 10_train.ipynb for one run; returns (error, failed notebook path)."""
    import papermill as pm

    run_dir = cfg.run_dir
    staging = Path(cfg.output_dir) / ".running" / f"{cfg.run_id}.ipynb"
    staging.parent.mkdir(parents=True, exist_ok=True)
    # The kernel inherits this process's environment; it must import this same library.
    os.environ["PYTHONPATH"] = _subprocess_env(None)["PYTHONPATH"]
    try:
        # The trainer refuses a non-empty new run directory, so the notebook is written beside
        # it while it runs and moved in afterwards.
        pm.execute_notebook(str(TRAIN_NOTEBOOK), str(staging), parameters=cfg.to_dict(), cwd=str(TRAIN_NOTEBOOK.parent),
                            progress_bar=False)
    except Exception as exc:  # papermill saved the partially executed notebook first
        run_dir.mkdir(parents=True, exist_ok=True)
        failed = run_dir / "10_train.failed.ipynb"
        if staging.exists():
            os.replace(staging, failed)
        return _error_text(exc), str(failed)
    os.replace(staging, run_dir / "10_train.ipynb")
    with contextlib.suppress(OSError):  # other workers may still be using it
        staging.parent.rmdir()
    return None, None


def _train_inprocess(cfg: RunConfig, progress: bool) -> tuple[str | None, str | None]:
    """Call trainer.train for one run; a failure's traceback goes to <run_dir>/failure.txt."""
    from .trainer import train
    try:
        train(cfg, progress=progress)
    except Exception as exc:
        failure = cfg.run_dir / "failure.txt"
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        failure.write_text(traceback.format_exc())
        return _error_text(exc), str(failure)
    finally:
        _release_memory()
    return None, None


def _release_memory() -> None:
    """Free the finished run's tensors before the next run loads a model in this process."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _execute_training(config: dict, executor: str, progress: bool) -> JobResult:
    cfg = RunConfig.from_dict(config)
    run = RunDir(cfg.run_dir)
    t0 = time.perf_counter()
    if run.is_complete():
        return JobResult(cfg.run_id, cfg.phase, "skipped")
    cfg = dataclasses.replace(cfg, resume=run.path.exists() and any(run.path.iterdir()))
    if executor == "papermill":
        error, record = _train_papermill(cfg)
    else:
        error, record = _train_inprocess(cfg, progress)
    if error is None and not run.is_complete():
        state = run.state() or {}
        error = f"the run ended without state.json status 'complete' (status: {state.get('status')})"
    return JobResult(cfg.run_id, cfg.phase, "failed" if error else "complete", time.perf_counter() - t0, error, record)


def _execute_test(study_dir: str, job: dict) -> JobResult:
    from .evaluation import run_test_job

    run_dir = Path(study_dir) / job["run_id"]
    t0 = time.perf_counter()
    if RunDir(run_dir).test_path.exists():
        return JobResult(job["run_id"], "test", "skipped")
    if not job["run_id"].startswith("initial-") and not RunDir(run_dir).is_complete():
        return JobResult(job["run_id"], "test", "blocked", 0.0, "its confirmation run is not complete")
    try:
        run_test_job(study_dir, job)
    except Exception as exc:
        failure = run_dir / "test.failure.txt"
        run_dir.mkdir(parents=True, exist_ok=True)
        failure.write_text(traceback.format_exc())
        return JobResult(job["run_id"], "test", "failed", time.perf_counter() - t0, _error_text(exc), str(failure))
    finally:
        _release_memory()
    return JobResult(job["run_id"], "test", "complete", time.perf_counter() - t0)


def _execute_unit(unit: dict) -> JobResult:
    """Run one unit (training run or test job) in this process.

    A training unit may carry its run's terminal test (``unit["test"]``), which then runs
    right after the run completes, while its final checkpoint is surely on this machine.
    """
    if unit["kind"] == "train":
        result = _execute_training(unit["config"], unit["executor"], unit.get("progress", False))
        if result.status in ("complete", "skipped") and "test" in unit:
            _execute_test(unit["test"]["study_dir"], unit["test"]["job"])  # the test phase reports its outcome
        return result
    return _execute_test(unit["study_dir"], unit["job"])


def visible_gpus() -> list[str]:
    """CUDA device ids that worker processes may be placed on ([] without CUDA)."""
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return [d.strip() for d in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    try:
        import torch
    except ImportError:
        return []
    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def _worker_log(unit: dict) -> Path:
    """<study_dir>/.logs/<run_id>.log: a worker's progress bars and messages."""
    if unit["kind"] == "train":
        root, run_id = unit["config"]["output_dir"], unit["config"]["run_id"]
    else:
        root, run_id = unit["study_dir"], unit["job"]["run_id"]
    return Path(root) / ".logs" / f"{run_id}.log"


def _execute_in_worker(unit: dict, threads: int, gpu: str | None = None) -> JobResult:
    """Run one unit in a fresh process with bounded threads, on one GPU when ``gpu`` is given.

    The worker's stderr (its progress bars, warnings, a crash's traceback) goes to
    :func:`_worker_log`; its last stdout line is the JobResult.
    """
    env = _subprocess_env(threads)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    log = _worker_log(unit)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as err:
        err.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} worker start (GPU {gpu or 'none'}, {threads} threads)\n")
        err.flush()
        proc = subprocess.run([sys.executable, "-m", "grpo_knobs.study", "--worker", str(threads)],
                              input=json.dumps(unit | {"progress": True}), stdout=subprocess.PIPE, stderr=err,
                              text=True, env=env)
    last = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
    if proc.returncode == 0 and last:
        return JobResult(**json.loads(last[0]))
    run_id = unit["config"]["run_id"] if unit["kind"] == "train" else unit["job"]["run_id"]
    phase = unit["config"]["phase"] if unit["kind"] == "train" else "test"
    tail = " | ".join(line.strip() for line in log.read_text().splitlines()[-3:])
    return JobResult(run_id, phase, "failed", 0.0, f"worker exited with code {proc.returncode}: {tail}", str(log))


def _unit_cost(unit: dict) -> float:
    """A training run's collection count (its generate calls dominate its time); test jobs are short."""
    if unit["kind"] != "train":
        return 0.0
    c = unit["config"]
    return c["response_budget"] / (c["rollout_batch_size"] * c["n_samples_per_prompt"])


def _execute_all(units: list[dict], jobs: int, desc: str, progress: bool) -> list[JobResult]:
    """Run units one at a time (jobs=1) or side by side in worker processes, with a progress bar."""
    results: list[JobResult] = []
    bar = tqdm(total=len(units), desc=desc, unit="run", disable=not progress)

    def done(result: JobResult) -> None:
        results.append(result)
        bar.update(1)
        bar.set_postfix(failed=sum(r.status in ("failed", "blocked") for r in results))

    if jobs == 1:
        for unit in units:
            bar.set_postfix_str(unit["config"]["run_id"] if unit["kind"] == "train" else unit["job"]["run_id"])
            done(_execute_unit(unit | {"progress": progress}))
    else:
        threads = max(1, (os.cpu_count() or 1) // jobs)
        # Worker slot k runs on GPU k mod n: with jobs equal to the GPU count each run has a GPU
        # to itself, so its phase times are not inflated by another run sharing the device.
        gpus = visible_gpus()
        slots: queue.Queue[int] = queue.Queue()
        for k in range(jobs):
            slots.put(k)

        def in_slot(unit: dict) -> JobResult:
            k = slots.get()
            try:
                return _execute_in_worker(unit, threads, gpus[k % len(gpus)] if gpus else None)
            finally:
                slots.put(k)

        with ThreadPoolExecutor(jobs) as pool:
            # Longest first (most collections), so a long run does not start last and hold the
            # other workers idle at the end.
            for future in as_completed([pool.submit(in_slot, u) for u in sorted(units, key=_unit_cost, reverse=True)]):
                done(future.result())
    bar.close()
    order = {(u["config"]["run_id"] if u["kind"] == "train" else u["job"]["run_id"]): i for i, u in enumerate(units)}
    return sorted(results, key=lambda r: order[r.run_id])


def _filter(items: Iterable, only: list[str] | None) -> list:
    return [x for x in items if not only or any(fnmatch.fnmatch(x.run_id, pat) for pat in only)]


def _check_drift(runs: list[PlannedRun]) -> None:
    problems = [f"{r.run_id}: {'; '.join(d)}" for r in runs if (d := _config_drift(r.config))]
    if problems:
        raise PlanError("Existing run records disagree with the plan (records are never overwritten; use another "
                        "study_dir or move these runs away):\n  " + "\n  ".join(problems))


def _write_plan_snapshot(p: Plan) -> None:
    """<study_dir>/plan.json: the resolved plan, its targets and rule, for the analysis notebooks."""
    atomic_write_json(p.study_dir / "plan.json", {
        "name": p.name, "source": str(p.source), "params": p.params, "targets": p.targets,
        "selection_rule": p.rule.describe(), "runs": plan_to_json(p)})


def run_study(preset: str | Path, phases: Iterable[str] | None = None, jobs: int = 1,
              study_dir: str | Path | None = None, executor: str = "auto", *,
              params: dict[str, Any] | None = None, only: list[str] | None = None,
              progress: bool = True) -> StudyReport:
    """Execute a study's phases in order, skipping completed work and recording failures.

    Args:
        preset: preset name or plan file.
        phases: subset of screening, lr-followup, selection, confirmation, test (default all).
        jobs: runs side by side in worker processes; 1 runs them here, one at a time. With
            CUDA, worker k uses GPU k mod n; more jobs than GPUs share devices, which
            inflates every sharing run's phase times.
        study_dir: where run directories go (default runs/<study name>).
        executor: papermill (10_train.ipynb per run), inprocess (trainer.train), or auto.
        params: values for the plan's ``params``.
        only: run-id glob patterns; other runs are left for a later call.
    """
    phases = list(phases or PHASE_ORDER)
    bad = [ph for ph in phases if ph not in PHASE_ORDER]
    if bad:
        raise ValueError(f"Unknown phase(s) {bad}; phases: {', '.join(PHASE_ORDER)}.")
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive integer, got {jobs!r}.")
    executor = _resolve_executor(executor)
    p = plan(preset, study_dir=study_dir, params=params)
    _check_drift([r for r in p.runs if not r.placeholder and r.phase in phases])
    p.study_dir.mkdir(parents=True, exist_ok=True)
    _write_plan_snapshot(p)
    report = StudyReport(p.study_dir, selection=p.selection)
    tested_before = {t.run_id for t in p.tests if RunDir(p.study_dir / t.run_id).test_path.exists()}
    for phase in (ph for ph in PHASE_ORDER if ph in phases):
        if phase == "selection":
            if p.selected:  # frozen: an existing selection (computed or written by hand) is kept
                report.results.append(JobResult("selection", "selection", "skipped"))
                continue
            try:
                report.selection = select(p)
            except PlanError as exc:
                report.results.append(JobResult("selection", "selection", "blocked", error=str(exc)))
                continue
            report.results.append(JobResult("selection", "selection", "complete"))
            p = plan(preset, study_dir=p.study_dir, params=params)
            _check_drift([r for r in p.runs if not r.placeholder and r.phase in phases])
            _write_plan_snapshot(p)
            continue
        if phase in ("confirmation", "test") and not p.selected:
            report.results.append(JobResult(phase, phase, "blocked",
                                            error=f"no {p.study_dir / 'selection.json'} yet; run the selection phase first"))
            continue
        tests = {t.run_id: {"kind": "test", "study_dir": str(p.study_dir), "job": t.job()} for t in _filter(p.tests, only)}
        if phase == "test":
            units = list(tests.values())
        else:
            units = [{"kind": "train", "executor": executor, "config": r.config.to_dict()}
                     for r in _filter(p.phase(phase), only)]
            if phase == "confirmation" and "test" in phases:
                # Test each run as soon as it finishes: a study cut short (or a GPU machine handed
                # back) then never leaves a finished checkpoint untested.
                units = [u | ({"test": tests[rid]} if (rid := u["config"]["run_id"]) in tests else {}) for u in units]
        if units:
            results = _execute_all(units, jobs, phase, progress)
            if phase == "test":  # tests run right after their confirmation run count as this call's work
                results = [dataclasses.replace(r, status="complete") if r.status == "skipped"
                           and r.run_id not in tested_before else r for r in results]
            report.results += results
    return report


def terminal_test_results(preset_or_plan: str | Path | Plan, *, study_dir: str | Path | None = None,
                 params: dict[str, Any] | None = None):
    """Mean terminal-test accuracy per finished test job, as a DataFrame."""
    import pandas as pd
    p = preset_or_plan if isinstance(preset_or_plan, Plan) else plan(preset_or_plan, study_dir=study_dir, params=params)
    arms = {r.run_id: (r.arm, r.seed) for r in p.phase("confirmation")}
    rows = []
    for job in p.tests:
        path = RunDir(p.study_dir / job.run_id).test_path
        if path.exists():
            df = pd.read_parquet(path, columns=["correct", "truncated"])
            arm, seed = arms.get(job.run_id, ("initial", None))
            rows.append({"task": job.task, "run_id": job.run_id, "arm": arm, "seed": seed, "problems": len(df),
                         "accuracy": float(df["correct"].mean()), "truncated": float(df["truncated"].mean())})
    return pd.DataFrame(rows)


def _worker_main(threads: int) -> None:
    """``python -m grpo_knobs.study --worker N``: run the unit on stdin, print its JobResult as JSON."""
    try:
        import torch
        torch.set_num_threads(threads)
    except ImportError:
        pass
    unit = json.loads(sys.stdin.read())
    result = _execute_unit(unit)
    print(json.dumps(dataclasses.asdict(result)), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _worker_main(int(sys.argv[2]))
    else:
        sys.exit("usage: python -m grpo_knobs.study --worker THREADS  (internal; use `grpo-knobs study`)")


ANALYSIS_NOTEBOOKS = ("50_learning_curves", "51_confirmation", "52_time_to_target", "53_group_size",
                      "54_reward_audit", "55_screening", "56_critical_batch")


def run_analysis(study_dir: str | Path, out_dir: str | Path | None = None,
                 notebooks: Iterable[str] = ANALYSIS_NOTEBOOKS, progress: bool = True) -> list[Path]:
    """Execute the analysis notebooks on a study directory through papermill.

    Figures and tables go to ``out_dir`` (default ``<study_dir>/figures``); each executed
    notebook is kept there too, so a reader sees the numbers behind every figure. Targets
    come from the study's ``plan.json``.
    """
    import papermill as pm
    from tqdm.auto import tqdm

    study_dir = Path(study_dir).resolve()
    out = Path(out_dir).resolve() if out_dir else study_dir / "figures"
    out.mkdir(parents=True, exist_ok=True)
    plan_file = study_dir / "plan.json"
    targets = json.loads(plan_file.read_text()).get("targets", {}) if plan_file.exists() else {}
    written = []
    for name in tqdm(list(notebooks), desc="analysis notebooks", disable=not progress):
        params: dict[str, Any] = {"study_dir": str(study_dir), "out_dir": str(out)}
        if targets and name in ("50_learning_curves", "52_time_to_target"):
            params["targets"] = targets
        if targets and name == "56_critical_batch":
            params["targets"] = {task: values[0] for task, values in targets.items() if values}
        target = out / f"{name}.ipynb"
        pm.execute_notebook(str(REPO_ROOT / "notebooks" / f"{name}.ipynb"), str(target), parameters=params,
                            cwd=str(REPO_ROOT), progress_bar=False, kernel_name="python3")
        written.append(target)
    return written


def refresh_committed_notebooks(notebooks: Iterable[str] = ANALYSIS_NOTEBOOKS, progress: bool = True) -> list[Path]:
    """Re-execute the committed analysis notebooks in place, on their default records.

    Their parameter defaults read ``results/h200-mini`` and write ``figures/``; no parameters
    are injected, and papermill's run metadata is dropped so a refresh diffs only in outputs.
    """
    import nbformat
    import papermill as pm
    from tqdm.auto import tqdm

    written = []
    for name in tqdm(list(notebooks), desc="committed notebooks", disable=not progress):
        path = REPO_ROOT / "notebooks" / f"{name}.ipynb"
        pm.execute_notebook(str(path), str(path), cwd=str(REPO_ROOT), progress_bar=False, kernel_name="python3")
        nb = nbformat.read(path, as_version=4)
        nb.metadata.pop("papermill", None)
        for cell in nb.cells:
            cell.metadata.pop("papermill", None)
            cell.metadata.pop("execution", None)
            if cell.cell_type == "code":
                cell.outputs = merge_streams(cell.outputs)
        nbformat.write(nb, path)
        written.append(path)
    return written


def merge_streams(outputs: list) -> list:
    """Join consecutive stdout (or stderr) outputs into one, as a reader sees them.

    How a kernel splits printed text into stream messages depends on flush timing, so
    merged streams keep a refreshed notebook's diff down to real changes.
    """
    merged: list = []
    for out in outputs:
        prev = merged[-1] if merged else None
        if (out.get("output_type") == "stream" and prev is not None and prev.get("output_type") == "stream"
                and prev.get("name") == out.get("name")):
            prev["text"] = prev["text"] + out["text"]
        else:
            merged.append(out)
    return merged

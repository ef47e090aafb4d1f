"""Plans: a preset (``grpo_knobs/studies/<preset>.yaml``) expanded into validated runs, terminal test jobs
and the selection rule, before any run starts."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..config import RunConfig, check_name, yaml_error
from ..knobs import KNOB_NAMES, LR_FOLLOWUP_ARM, STUDY_ARMS, Arm
from ..locations import preset_dirs, project_root
from ..records import read_json
from .preregistration import Preregistration, PreregistrationError, preregistration

TRAIN_PHASES = ("screening", "lr-followup", "confirmation")
PHASE_ORDER = ("screening", "lr-followup", "selection", "confirmation", "test")
# Ranking metrics of the selection rule and whether higher is better.
RANK_METRICS = {"final_accuracy": True, "sample_auc": True, "job_seconds": False}
# Fields the plan sets per run; a preset may not set them in defaults or phase sections.
PLAN_OWNED = frozenset(KNOB_NAMES) | {"task", "phase", "arm", "seed", "run_id", "output_dir", "study", "resume"}
_TOP_KEYS = {
    "name",
    "description",
    "params",
    "defaults",
    "arms",
    "tasks",
    "screening",
    "lr_followup",
    "selection",
    "confirmation",
    "test",
    "analysis",
}
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
        return {
            "run_id": self.run_id,
            "task": self.task,
            "model": self.model,
            "max_new_tokens": self.max_new_tokens,
            "problems": self.problems,
            "device": self.device,
            "data_dir": self.data_dir,
        }


@dataclass(frozen=True)
class SelectionRule:
    """How confirmation recipes are chosen from screening; fixed in the preset before screening."""

    recipes: dict[str, int]
    always_include: tuple[str, ...]
    rank_by: tuple[str, ...]

    def describe(self) -> str:
        order = {
            "final_accuracy": "final validation accuracy (higher first)",
            "sample_auc": "validation sample AUC (higher first)",
            "job_seconds": "complete job seconds (lower first)",
        }
        ranked = order[self.rank_by[0]] + "".join(f", then {order[k]}" for k in self.rank_by[1:])
        counts = ", ".join(f"{n} for {t}" for t, n in self.recipes.items())
        keep = (
            f"Always keep {', '.join(self.always_include)} (the baseline for paired comparisons) and "
            if self.always_include
            else "Take "
        )
        return (
            f"Per task, rank the screening arms by {ranked}, each averaged over screening seeds. {keep}"
            f"fill the remaining recipe slots with the top-ranked other arms (recipes: {counts}). "
            "Only validation rows of complete screening runs are read; test data is never opened."
        )


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
    fixed_recipes: dict[str, list[str]] = field(default_factory=dict)  # task -> recipes the preset fixes
    preregistration: Preregistration | None = None  # the preset's analysis: section

    def phase(self, name: str) -> list[PlannedRun]:
        return [r for r in self.runs if r.phase == name]

    @property
    def selected(self) -> bool:
        """Whether every confirmation recipe is known: selected, or fixed in the preset for every task."""
        return self.selection is not None or not self.candidates


# ---------------------------------------------------------------------------------------
# Loading and expanding a preset
# ---------------------------------------------------------------------------------------
def preset_path(preset_or_path: str | Path) -> Path:
    """A path to a plan file, or a preset name: ``studies/<name>.yaml`` of the workspace, else of the package."""
    p = Path(preset_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.is_file():
            raise PlanError(f"Study plan file {p} does not exist.")
        return p
    folders = preset_dirs()
    for folder in folders:
        if (folder / f"{preset_or_path}.yaml").is_file():
            return folder / f"{preset_or_path}.yaml"
    known = ", ".join(sorted({q.stem for folder in folders for q in folder.glob("*.yaml")})) or "none"
    where = " and ".join(str(folder) for folder in folders)
    raise PlanError(f"Unknown study preset {preset_or_path!r}; presets in {where}: {known}.")


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
        try:
            raw = yaml.safe_load(f) or {}
        except yaml.YAMLError as error:
            raise PlanError(yaml_error(path, error)) from None
    if not isinstance(raw, dict):
        raise PlanError(f"{path}: a study plan is a mapping, got {type(raw).__name__}.")
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise PlanError(f"{path}: unknown top-level key(s) {sorted(unknown)}; valid keys: {sorted(_TOP_KEYS)}.")
    declared = dict(raw.pop("params", None) or {})
    extra = set(params or {}) - set(declared)
    if extra:
        raise PlanError(
            f"{path}: parameter(s) {sorted(extra)} are not declared under params: (declared: {sorted(declared)})."
        )
    used = {**declared, **(params or {})}
    spec = _substitute(raw, used)
    for key in ("name", "tasks"):
        if not spec.get(key):
            raise PlanError(f"{path}: the plan needs {key!r}.")
    try:  # the study's name is its default directory and every run's label
        check_name("the study name", spec["name"])
    except ValueError as exc:
        raise PlanError(f"{path}: {exc}") from None
    if not isinstance(spec["tasks"], dict):
        raise PlanError(f"{path}: 'tasks' must be a mapping of task names to their settings.")
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
    from ..data import TASKS

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
        values.update(
            task=self.task,
            phase=phase,
            arm=arm.name,
            seed=seed,
            run_id=run_id,
            study=self.spec["name"],
            output_dir=str(self.study_dir),
            lr=base_lr * arm.lr_multiplier,
        )
        return _make_config(run_id, values)


def _seeds(own: dict, default: list[int], where: str) -> list[int]:
    seeds = own.get("seeds", default)
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
    ):
        raise PlanError(f"{where}: seeds must be a non-empty list of integers, got {seeds!r}.")
    return seeds


def _screening_runs(ctx: _Context) -> tuple[list[PlannedRun], list[str]]:
    own, fields = _split(_section(ctx.spec, ctx.task, "screening"), {"arms", "seeds"}, f"screening ({ctx.task})")
    names = list(own.get("arms") or [])
    if len(set(names)) != len(names):
        raise PlanError(f"screening ({ctx.task}): an arm is listed twice: {names}.")
    runs = [
        PlannedRun(
            "screening",
            ctx.task,
            name,
            seed,
            ctx.config("screening", ctx.arm(name, f"screening ({ctx.task})"), seed, fields),
        )
        for name in names
        for seed in _seeds(own, [0], f"screening ({ctx.task})")
    ]
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
        runs += [
            PlannedRun("lr-followup", task, arm.name, seed, ctx.config("lr-followup", arm, seed, fields))
            for seed in _seeds(own, [0], f"lr_followup[{i}]")
        ]
    return runs


def _rule(spec: dict, candidates: dict[str, list[str]]) -> SelectionRule:
    counts, always, rank_by = {}, None, None
    for task, pool in candidates.items():
        own, extra = _split(
            _section(spec, task, "selection"), {"recipes", "always_include", "rank_by"}, f"selection ({task})"
        )
        if extra:
            raise PlanError(
                f"selection ({task}): unknown key(s) {sorted(extra)}; keys: recipes, always_include, rank_by."
            )
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
            raise PlanError(
                "selection: always_include and rank_by must be the same for every task "
                "(only the number of recipes may differ per task)."
            )
        always, rank_by = keep, order
        counts[task] = min(n, len(pool))
    return SelectionRule(counts, always or (), rank_by or tuple(RANK_METRICS))


def _fixed_recipes(ctx: _Context) -> list[str] | None:
    """The confirmation recipes a preset fixes for a task (``confirmation: {recipes: [...]}``), or None
    where selection picks them from screening."""
    names = _section(ctx.spec, ctx.task, "confirmation").get("recipes")
    if names is None:
        return None
    where = f"confirmation ({ctx.task})"
    if not isinstance(names, list) or not names or len(set(map(str, names))) != len(names):
        raise PlanError(f"{where}: recipes must be a non-empty list of distinct arm names, got {names!r}.")
    for name in names:
        ctx.arm(name, where)
    return names


def _confirmation_runs(
    ctx: _Context, pool: list[str], n_recipes: int, selection: dict | None, fixed: list[str] | None = None
) -> list[PlannedRun]:
    where = f"confirmation ({ctx.task})"
    own, fields = _split(_section(ctx.spec, ctx.task, "confirmation"), {"seeds", "recipes"}, where)
    seeds = _seeds(own, [1, 2, 3], where)
    if fixed is not None or selection is not None:
        recipes = fixed if fixed is not None else selection["recipes"].get(ctx.task)
        if recipes is None:
            raise PlanError(f"selection.json has no recipes for task {ctx.task!r}.")
        source = where if fixed is not None else f"selection.json ({ctx.task})"
        return [
            PlannedRun(
                "confirmation",
                ctx.task,
                name,
                seed,
                ctx.config("confirmation", ctx.arm(name, source), seed, fields),
            )
            for name in recipes
            for seed in seeds
        ]
    runs = []
    for k in range(1, n_recipes + 1):
        for seed in seeds:
            # Every arm that could fill the slot must accept the budget and cadence.
            options = tuple(
                ctx.config(
                    "confirmation", ctx.arm(a, where), seed, fields, run_id=f"confirmation-{ctx.task}-{a}-s{seed}"
                )
                for a in pool
            )
            stand_in = dataclasses.replace(
                options[0], arm=f"<selected-{k}>", run_id=f"confirmation-{ctx.task}-selected-{k}-s{seed}"
            )
            runs.append(PlannedRun("confirmation", ctx.task, stand_in.arm, seed, stand_in, True, options))
    return runs


def _test_jobs(ctx: _Context, confirmation: list[PlannedRun]) -> list[TerminalTest]:
    own, extra = _split(
        _section(ctx.spec, ctx.task, "test"), {"problems", "max_new_tokens", "initial_model"}, f"test ({ctx.task})"
    )
    if extra:
        raise PlanError(
            f"test ({ctx.task}): unknown key(s) {sorted(extra)}; keys: problems, max_new_tokens, initial_model."
        )
    problems = own.get("problems")
    if problems is not None and (not isinstance(problems, int) or problems <= 0):
        raise PlanError(f"test ({ctx.task}): problems must be a positive integer or null (all), got {problems!r}.")
    jobs = []
    cap = own.get("max_new_tokens") or ctx.default("eval_max_new_tokens") or ctx.default("max_new_tokens")
    if not isinstance(cap, int) or cap <= 0:
        raise PlanError(f"test ({ctx.task}): max_new_tokens must be a positive integer, got {cap!r}.")
    common = {
        "task": ctx.task,
        "max_new_tokens": cap,
        "problems": problems,
        "device": ctx.default("device"),
        "data_dir": ctx.default("data_dir"),
    }
    if own.get("initial_model", True):
        jobs.append(TerminalTest(f"initial-{ctx.task}", model=ctx.default("model"), source="initial", **common))
    for run in confirmation:
        jobs.append(
            TerminalTest(
                run.run_id,
                model=str(ctx.study_dir / run.run_id / "final"),
                source="confirmation",
                placeholder=run.placeholder,
                **common,
            )
        )
    return jobs


def _targets(spec: dict, task: str) -> list[float]:
    targets = (spec["tasks"][task] or {}).get("targets") or []
    if not all(isinstance(t, (int, float)) and 0 <= t <= 100 for t in targets):
        raise PlanError(f"tasks.{task}.targets must be accuracies in percent, got {targets!r}.")
    return [float(t) for t in targets]


def default_study_dir(name: str) -> Path:
    """``runs/<name>`` in the workspace, else in the checkout, else in the current directory."""
    return project_root() / "runs" / name


def plan(
    preset_or_path: str | Path,
    selection: dict | str | Path | None = None,
    *,
    study_dir: str | Path | None = None,
    params: dict[str, Any] | None = None,
) -> Plan:
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
    fixed = {t: names for t in tasks if (names := _fixed_recipes(contexts[t])) is not None}
    screening, candidates = [], {}
    for task in tasks:
        runs, pool = _screening_runs(contexts[task])
        if task in fixed and pool:
            raise PlanError(
                f"tasks.{task}: its confirmation recipes are fixed ({', '.join(fixed[task])}), so nothing is "
                "selected from its screening; drop its screening arms (screening: {arms: []}) or the fixed recipes."
            )
        if task not in fixed:
            candidates[task] = pool
        screening += runs
    rule = _rule(spec, candidates)
    # Without a task to select for, a selection.json (of another plan) is no part of this one.
    chosen = _load_selection(selection, study_dir, candidates, arms) if candidates else None
    confirmation, tests = [], []
    for task in tasks:
        n = rule.recipes.get(task, 0)
        runs = _confirmation_runs(contexts[task], candidates.get(task, []), n, chosen, fixed.get(task))
        confirmation += runs
        tests += _test_jobs(contexts[task], runs)
    runs = screening + _followup_runs(spec, contexts) + confirmation
    seen: set[str] = set()
    for r in runs:
        if r.run_id in seen:
            raise PlanError(f"Run {r.run_id} is planned twice; run ids must be unique within a study.")
        seen.add(r.run_id)
    return Plan(
        spec["name"],
        path,
        study_dir,
        used,
        runs,
        tests,
        {t: _targets(spec, t) for t in tasks},
        rule,
        candidates,
        chosen,
        fixed_recipes=fixed,
        preregistration=_preregistration(spec, path, confirmation, fixed, tests),
    )


def _preregistration(
    spec: dict, path: Path, confirmation: list[PlannedRun], fixed: dict[str, list[str]], tests: list[TerminalTest]
) -> Preregistration | None:
    if "analysis" not in spec:
        return None
    problems = {t.task: t.problems for t in tests if t.source == "confirmation"}
    seeds: dict[str, list[int]] = {}
    budgets: dict[str, list[int]] = {}
    for r in confirmation:
        seeds.setdefault(r.task, []).append(r.seed)
        budgets.setdefault(r.task, []).append(r.config.response_budget)
    try:
        return preregistration(
            spec["analysis"], {t: sorted(set(s)) for t, s in seeds.items()}, budgets, fixed, problems
        )
    except PreregistrationError as exc:
        raise PlanError(f"{path.name}: {exc}") from None


def _load_selection(
    selection: dict | str | Path | None, study_dir: Path, candidates: dict[str, list[str]], arms: dict[str, Arm]
) -> dict | None:
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

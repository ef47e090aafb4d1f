"""Study plans and the drivers that execute them.

A study plan (``grpo_knobs/studies/<preset>.yaml``) is compact: shared RunConfig defaults, the
tasks, a screening arm list, LR follow-up controls, a selection rule fixed in advance,
a confirmation spec and the terminal test spec. ``plan()`` expands it into one
validated ``RunConfig`` per run, so a bad shape or budget fails before any run starts.
Confirmation depends on the screening outcome: until ``<study_dir>/selection.json``
exists its runs are placeholders whose count and budgets are known (and validated for
every arm that could be selected) but whose arms are not.

``run_study()`` executes a plan phase by phase: each training run executes
``grpo_knobs/notebooks/10_train.ipynb`` through papermill (or ``trainer.train`` in-process where
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
    confirmation: {seeds: [1, 2, 3], <RunConfig fields>}   # recipes: [arm, ...] fixes them (no screening)
    test: {problems: null, max_new_tokens: null, initial_model: true}
    analysis: {endpoint, responses, comparisons, ...}   # the registered analysis (preregistration)

Modules, one job each (this package re-exports their names):

- ``planning``: the plan's data classes, loading and expanding a preset, ``plan()``
- ``presenting``: ``format_plan_table``, ``plan_to_json``, ``run_progress``
- ``preregistration``: a preset's registered analysis, checked against its plan
- ``selection``: the selection rule's scores, ``select()``, validation summaries
- ``run``: ``run_study()``, its executors and worker processes, terminal test results
- ``__main__``: the worker process, ``python -m grpo_knobs.study --worker N``
- ``scheduling``: ``--scheduler ray``, each run a Ray task holding the GPUs and CPUs it needs
- ``notebooks``: ``run_analysis()`` and refreshing the committed analysis notebooks
"""

from __future__ import annotations

from .notebooks import ANALYSIS_NOTEBOOKS, PREREGISTERED_NOTEBOOKS, refresh_committed_notebooks, run_analysis
from .planning import (
    PHASE_ORDER,
    PLAN_OWNED,
    RANK_METRICS,
    TRAIN_PHASES,
    Plan,
    PlanError,
    PlannedRun,
    SelectionRule,
    TerminalTest,
    default_study_dir,
    load_spec,
    plan,
    preset_path,
)
from .presenting import format_plan_table, plan_to_json, run_progress
from .run import StudyReport, _execute_all, registered_analysis, run_study, terminal_test_results, visible_gpus
from .selection import compute_selection, select, selection_table, validation_summary
from .units import EXECUTORS, JobResult, _subprocess_env

__all__ = [
    # planning
    "PHASE_ORDER",
    "PLAN_OWNED",
    "RANK_METRICS",
    "TRAIN_PHASES",
    "Plan",
    "PlanError",
    "PlannedRun",
    "SelectionRule",
    "TerminalTest",
    "default_study_dir",
    "load_spec",
    "plan",
    "preset_path",
    # presenting
    "format_plan_table",
    "plan_to_json",
    "run_progress",
    # selection
    "compute_selection",
    "select",
    "selection_table",
    "validation_summary",
    # run (the underscore names are used by tests/test_study.py)
    "EXECUTORS",
    "JobResult",
    "StudyReport",
    "_execute_all",
    "_subprocess_env",
    "registered_analysis",
    "run_study",
    "terminal_test_results",
    "visible_gpus",
    # notebooks
    "ANALYSIS_NOTEBOOKS",
    "PREREGISTERED_NOTEBOOKS",
    "refresh_committed_notebooks",
    "run_analysis",
]

"""Study directories -> DataFrames -> the study's tables.

The analysis notebooks (``grpo_knobs/notebooks/5*.ipynb``) stay thin: they call
:func:`load_study` once and then the table builders below, which take and
return plain DataFrames so they can be tested on hand-made data. Statistics
live in :mod:`grpo_knobs.stats`, figures in :mod:`grpo_knobs.plots`.

Every name is importable from this package (``from grpo_knobs import analysis
as an``); each lives in the module for its job:

- :mod:`.constants`: the study's vocabulary (phases, shape columns, recipe
  names, screening questions, group arms)
- :mod:`.paths`: notebook setup; parameters resolved against the repository root
- :mod:`.ordering`: display order of tasks and recipe labels
- :mod:`.selection`: what an incomplete study has (phases, arms, targets,
  comparable pairs, a matching benchmark)
- :mod:`.loading`: study directories, reward audits, the study's published
  endpoints and rollout benchmarks
- :mod:`.curves`: validation curves, their seed summaries and endpoints,
  training signals
- :mod:`.confirmation`, :mod:`.time_to_target`, :mod:`.group_size`,
  :mod:`.reward_audit`, :mod:`.screening`, :mod:`.critical_batch`: the
  tables of notebooks 51 to 56
- :mod:`.categories`: problem categories (notebook 57)
- :mod:`.preregistered`: a study's registered comparisons, Holm-adjusted, and the
  rerun-versus-seed variance split (notebook 59)
- :mod:`.collapse`: zero-advantage share, collapse points, per-group mixing prediction
- :mod:`.completions`: sampled training responses and evaluation responses
- :mod:`.tables`: display formatting and writing tables to CSV and Markdown

Frames
------
``runs``
    One row per training run. Shape columns use Miles' names
    (``rollout_batch_size`` P, ``n_samples_per_prompt`` G,
    ``global_batch_size`` B, ``num_steps_per_rollout`` S); phase seconds are
    ``generation_seconds``, ``trainer_seconds``, ``sync_seconds``,
    ``active_phase_seconds`` (their sum) and ``job_seconds``; ``device_use`` is
    "shared" where a run trained beside other runs on its device (its times
    include waiting for them; time comparisons leave it out), else "alone";
    ``trained_on`` names the device that last trained it (its GPU's UUID;
    None for records without placements);
    accuracies are fractions (``initial_accuracy``, ``final_accuracy``, ``test_accuracy``).
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

from grpo_knobs.analysis.categories import (
    category_curves,
    category_decomposition,
    category_order,
    category_sizes,
    category_test_table,
    exact_category_solutions,
    one_category_plateaus,
    pool_coverage,
    problem_categories,
    shared_numbers,
    tag_categories,
)
from grpo_knobs.analysis.collapse import (
    COLLAPSE_MIN_RESPONSES,
    COLLAPSE_THRESHOLD,
    CollapseRule,
    add_collapse_column,
    collapse_points,
    describe_collapse,
    group_mixing_prediction,
    mixing_prediction_summary,
    plateau_outcomes,
    zero_advantage_series,
)
from grpo_knobs.analysis.completions import (
    SAMPLES_FILE,
    completion_examples,
    eval_response_examples,
    load_samples,
    print_examples,
)
from grpo_knobs.analysis.confirmation import (
    INTERVAL_MEANINGS,
    comparison_side_by_side,
    confirmation_run_table,
    default_comparisons,
    format_comparisons,
    format_seed_level,
    job_time_path_notes,
    paired_comparisons,
    paired_job_times,
    phase_cost_table,
    recipe_test_scores,
    run_path_note,
    seed_count_change,
    seed_level_comparisons,
    tested_pairs,
    tested_seeds,
    trainer_path_note,
    truncation_range,
    truncation_table,
)
from grpo_knobs.analysis.constants import (
    GROUP_ARMS,
    PHASES,
    SCREENING_QUESTIONS,
    SHAPE_COLUMNS,
    STUDY_RECIPE_NAMES,
)
from grpo_knobs.analysis.critical_batch import (
    critical_generation_batch,
    critical_training_batch,
    interpolate_throughput,
    measured_generation_throughput,
    predict_time_to_target,
    responses_to_target,
)
from grpo_knobs.analysis.curves import (
    TRAINING_SIGNALS,
    curve_endpoint_table,
    eval_curves,
    final_evaluation_rows,
    summarize_curves,
    training_signals,
)
from grpo_knobs.analysis.group_size import group_size_table, mixed_group_points
from grpo_knobs.analysis.loading import (
    AUDIT_COLUMNS,
    BENCHMARK_COLUMNS,
    COLLECTION_COLUMNS,
    EVAL_COLUMNS,
    REFERENCE_CSV,
    RUN_FILES,
    Study,
    load_reference,
    load_reward_audits,
    load_rollout_benchmark,
    load_study,
    shared_device,
    study_summary,
)
from grpo_knobs.analysis.ordering import order_tasks, recipe_order, sort_tasks
from grpo_knobs.analysis.paths import notebook_setup, resolve_path
from grpo_knobs.analysis.preregistered import (
    code_versions_note,
    coverage_notes,
    decision_lines,
    format_preregistered,
    preregistered_comparisons,
    rerun_groups,
    rerun_matrix,
    seed_test_scores,
    variance_split_of_folders,
    variance_split_table,
)
from grpo_knobs.analysis.reward_audit import initial_test_grading, reward_audit_examples, reward_audit_summary
from grpo_knobs.analysis.screening import screening_table
from grpo_knobs.analysis.selection import (
    KNOBS,
    QUESTION_KNOBS,
    TASK_FAMILIES,
    TRAINING_BATCH_ARMS,
    TRAINING_BATCH_KNOBS,
    ArmSet,
    PhaseRuns,
    arms_varying,
    choose_phase,
    comparable_pairs,
    group_arms,
    match_targets,
    phase_runs,
    phases_to_draw,
    screening_question_arms,
    select_benchmark,
    task_family,
    throughput_column_for,
    training_batch_arms,
)
from grpo_knobs.analysis.tables import format_frame, to_markdown, write_table
from grpo_knobs.analysis.time_to_target import time_to_target_summary, time_to_target_table

__all__ = [
    # constants
    "GROUP_ARMS",
    "PHASES",
    "SCREENING_QUESTIONS",
    "SHAPE_COLUMNS",
    "STUDY_RECIPE_NAMES",
    # paths
    "notebook_setup",
    "resolve_path",
    # categories
    "category_curves",
    "category_decomposition",
    "category_order",
    "category_sizes",
    "category_test_table",
    "exact_category_solutions",
    "one_category_plateaus",
    "pool_coverage",
    "problem_categories",
    "shared_numbers",
    "tag_categories",
    # collapse
    "COLLAPSE_MIN_RESPONSES",
    "COLLAPSE_THRESHOLD",
    "CollapseRule",
    "add_collapse_column",
    "collapse_points",
    "describe_collapse",
    "group_mixing_prediction",
    "mixing_prediction_summary",
    "plateau_outcomes",
    "zero_advantage_series",
    # completions
    "SAMPLES_FILE",
    "completion_examples",
    "eval_response_examples",
    "load_samples",
    "print_examples",
    # ordering
    "order_tasks",
    "recipe_order",
    "sort_tasks",
    # selection
    "KNOBS",
    "QUESTION_KNOBS",
    "TASK_FAMILIES",
    "TRAINING_BATCH_ARMS",
    "TRAINING_BATCH_KNOBS",
    "ArmSet",
    "PhaseRuns",
    "arms_varying",
    "choose_phase",
    "comparable_pairs",
    "group_arms",
    "match_targets",
    "phase_runs",
    "phases_to_draw",
    "screening_question_arms",
    "select_benchmark",
    "task_family",
    "throughput_column_for",
    "training_batch_arms",
    # loading
    "AUDIT_COLUMNS",
    "BENCHMARK_COLUMNS",
    "COLLECTION_COLUMNS",
    "EVAL_COLUMNS",
    "REFERENCE_CSV",
    "RUN_FILES",
    "Study",
    "load_reference",
    "load_reward_audits",
    "load_rollout_benchmark",
    "load_study",
    "shared_device",
    "study_summary",
    # curves
    "TRAINING_SIGNALS",
    "curve_endpoint_table",
    "eval_curves",
    "final_evaluation_rows",
    "summarize_curves",
    "training_signals",
    # confirmation
    "confirmation_run_table",
    "default_comparisons",
    "format_comparisons",
    "paired_comparisons",
    "paired_job_times",
    "phase_cost_table",
    "recipe_test_scores",
    "truncation_range",
    "truncation_table",
    "INTERVAL_MEANINGS",
    "comparison_side_by_side",
    "seed_count_change",
    "seed_level_comparisons",
    "run_path_note",
    "format_seed_level",
    "job_time_path_notes",
    "tested_pairs",
    "tested_seeds",
    "trainer_path_note",
    # preregistered
    "code_versions_note",
    "coverage_notes",
    "decision_lines",
    "format_preregistered",
    "preregistered_comparisons",
    "rerun_groups",
    "rerun_matrix",
    "seed_test_scores",
    "variance_split_of_folders",
    "variance_split_table",
    # time_to_target
    "time_to_target_summary",
    "time_to_target_table",
    # group_size
    "group_size_table",
    "mixed_group_points",
    # reward_audit
    "initial_test_grading",
    "reward_audit_examples",
    "reward_audit_summary",
    # screening
    "screening_table",
    # critical_batch
    "critical_generation_batch",
    "critical_training_batch",
    "interpolate_throughput",
    "measured_generation_throughput",
    "predict_time_to_target",
    "responses_to_target",
    # tables
    "format_frame",
    "to_markdown",
    "write_table",
]

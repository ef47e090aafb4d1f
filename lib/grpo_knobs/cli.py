"""Command-line entry point: ``grpo-knobs SUBCOMMAND``.

The commands call the same library functions as the notebooks; on machines without
Jupyter (the GPU machine) they are the way to run training and studies.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import textwrap
import traceback
from pathlib import Path

# Set to 1 (or pass --debug) to see the traceback behind an error message.
DEBUG_ENV = "GRPO_KNOBS_DEBUG"


def _cmd_knobs(a: argparse.Namespace) -> int:
    from .knobs import BatchPlan

    plan = BatchPlan(a.rollout_batch_size, a.n_samples_per_prompt, a.global_batch_size, a.num_steps_per_rollout)
    summary = plan.summary(a.response_budget, a.eval_every_responses if a.response_budget else None)
    from .conventions import format_settings, shape_settings

    peers = shape_settings(plan, a.response_budget)
    if a.json:
        print(json.dumps(summary | peers, indent=2))
        return 0
    print(plan.describe())
    for k, v in summary.items():
        print(f"  {k:<26} {v}")
    for name, label in (("trl", "TRL GRPOConfig (one process)"), ("verl", "verl")):
        settings = peers[name]
        print(f"{label}: {format_settings(settings) if isinstance(settings, dict) else settings}")
    return 0


def _cmd_init(a: argparse.Namespace) -> int:
    from .workspace import init_workspace

    root = init_workspace(a.directory, a.preset)
    print(f"workspace {root}: notebooks/, studies/{a.preset}.yaml (to edit), README.md")
    print(f"next: cd {a.directory} && grpo-knobs plan {a.preset}")
    return 0


def _cmd_fetch_model(a: argparse.Namespace) -> int:
    from .models import fetch_model

    print(fetch_model(a.name))
    return 0


def _cmd_prepare(a: argparse.Namespace) -> int:
    from .prepare import prepare

    done = prepare(_prepare_values(a))
    if done is None:
        print("grpo-knobs prepare: nothing to compile on CPU (runs there use no compiled kernels)")
        return 0
    print(f"prepared on {done['gpu']} in {done['seconds']:.1f} s; bytecode of {done['modules']} run modules written")
    for run in done["runs"]:
        print(
            f"  {run['model']}, deterministic={str(run['deterministic']).lower()}: decode path "
            f"{run['rollout_path']}, trainer path {run['trainer_path']}, attended caches up to "
            f"{run['longest_prompt']} prompt + {run['decode_steps'] - run['longest_prompt'] + 1} response tokens"
        )
    for name, (folder, added) in done["caches"].items():
        print(f"  {name}: {folder} (+{added} files)" if folder else f"  {name}: unset, its own default (not counted)")
    return 0


def _prepare_values(a: argparse.Namespace) -> dict:
    """The run parameters prepare warms, from the arguments train takes (--config, -p) and its own."""
    from .config import parse_overrides, read_run_values

    values = (read_run_values(a.config) if a.config else {}) | parse_overrides(a.param or [])
    for key, given in (("model", a.model), ("max_new_tokens", a.max_new_tokens)):
        if given is None:
            continue
        if key in values and str(values[key]) != str(given):
            raise ValueError(f"{key} is given twice ({values[key]} and {given}); give it once.")
        values[key] = given
    return values


def _cmd_data(a: argparse.Namespace) -> int:
    from . import data

    if a.action == "build":
        for path in data.build_manifests(tasks=a.tasks or None):
            print(f"wrote {path}")
    else:
        for task in data.list_tasks():
            info = data.task_info(task)
            print(f"{task}: {json.dumps(info, default=str)}")
    return 0


def _cmd_train(a: argparse.Namespace) -> int:
    from .config import RunConfig, parse_overrides
    from .trainer import train

    overrides = parse_overrides(a.param or [])
    cfg = RunConfig.from_yaml(a.config, overrides) if a.config else RunConfig.from_dict(overrides)
    a.resume_hint = "grpo-knobs train " + " ".join(
        ([f"--config {a.config}"] if a.config else [])
        + [f"-p {p}" for p in (a.param or []) if not p.startswith("resume=")]
        + ["-p resume=true"]
    )
    print(cfg.plan.describe())
    print(
        f"  budget {cfg.response_budget} responses = {cfg.collections} collections, "
        f"{cfg.plan.updates_for_budget(cfg.response_budget)} updates; evaluations at {cfg.eval_points}"
    )
    run_dir = train(cfg, progress=not a.no_progress)
    print(f"run complete: {run_dir}")
    return 0


def _cmd_test_eval(a: argparse.Namespace) -> int:
    from .evaluation import run_test_job

    job = {
        "run_id": a.run_id,
        "task": a.task,
        "model": a.model,
        "max_new_tokens": a.max_new_tokens,
        "problems": a.problems,
        "device": a.device,
    }
    print(run_test_job(Path(a.study_dir), job))
    return 0


def _cmd_plan(a: argparse.Namespace) -> int:
    from . import study
    from .config import parse_plan_params

    plan = study.plan(a.preset, study_dir=a.study_dir, params=parse_plan_params(a.param or []))
    if a.json:
        print(json.dumps(study.plan_to_json(plan, analysis=True), indent=2))
    else:
        print(study.format_plan_table(plan))
    return 0


def _cmd_study(a: argparse.Namespace) -> int:
    from . import study
    from .config import parse_plan_params

    a.resume_hint = f"run the same `grpo-knobs study {a.preset}` command again (complete runs are skipped)"
    report = study.run_study(
        a.preset,
        phases=a.phase or None,
        jobs=a.jobs,
        study_dir=a.study_dir,
        executor=a.executor,
        params=parse_plan_params(a.param or []),
        only=a.only or None,
        scheduler=a.scheduler,
        ray_address=a.ray_address,
        time_limit=a.time_limit,
    )
    print(report.summary())
    if report.failed:
        return 1
    if not a.phase and not a.only and not a.no_analysis and not report.deferred:
        for path in study.run_analysis(report.study_dir):
            print(f"analysis: {path}")
        print(f"figures and tables: {report.study_dir / 'figures'}")
    return 0


def _cmd_analyze(a: argparse.Namespace) -> int:
    from . import study

    if a.committed:
        if a.study_dir or a.out_dir:
            raise SystemExit(
                "--committed re-executes the committed notebooks 5*.ipynb in place; drop STUDY_DIR and --out-dir."
            )
        for path in study.refresh_committed_notebooks():
            print(f"refreshed: {path}")
        return 0
    if not a.study_dir:
        raise SystemExit("analyze needs a STUDY_DIR (or --committed to refresh the committed notebooks).")
    for path in study.run_analysis(a.study_dir, a.out_dir):
        print(f"analysis: {path}")
    return 0


def _cmd_notebook_params(a: argparse.Namespace) -> int:
    from .locations import notebook
    from .study.notebooks import write_parameters_cell

    path = notebook("10_train")
    matched = write_parameters_cell(path, check=a.check)
    if a.check and not matched:
        raise ValueError(
            f"the parameters cell of {path} differs from RunConfig; run `grpo-knobs notebook-params` to rewrite it"
        )
    print(f"{path}: parameters cell " + ("matches RunConfig" if matched else "rewritten from RunConfig"))
    return 0


def _cmd_report(a: argparse.Namespace) -> int:
    from .report import write_report

    print(f"report: {write_report(a.study_dir, a.out, a.notebooks)}")
    return 0


def _cmd_audit(a: argparse.Namespace) -> int:
    from .audit import run_reward_audit

    out = run_reward_audit(
        task=a.task,
        model=a.model,
        problems=a.problems,
        max_new_tokens=a.max_new_tokens,
        out_dir=Path(a.out_dir),
        device=a.device,
    )
    print(out)
    return 0


def _cmd_export(a: argparse.Namespace) -> int:
    from .tracking import export

    out, runs = export(a.dir, a.to, out=a.out, x=a.x, project=a.project)
    print(f"{len(runs)} run(s) written to {out} ({a.to}, x = {a.x})")
    if a.to == "tensorboard":
        print(f"view: tensorboard --logdir {out}")
    else:
        print(f"view: TRACKIO_DIR={out} trackio show")
    return 0


def _cmd_compare_runs(a: argparse.Namespace) -> int:
    from .determinism import compare_runs, comparison_json, format_comparison

    comparison = compare_runs(a.run_a, a.run_b)
    print(json.dumps(comparison_json(comparison), indent=2, default=str) if a.json else format_comparison(comparison))
    return 0 if comparison.identical else 1


def _cmd_rerun(a: argparse.Namespace) -> int:
    from .determinism import compare_runs, format_comparison, rerun_config
    from .trainer import train

    cfg = rerun_config(a.run, a.out, resume=a.resume, other_source=a.other_source)
    a.resume_hint = f"grpo-knobs rerun {a.run} --out {a.out} --resume"
    if not cfg.deterministic:
        print("the run trained in default mode (deterministic=false): its rerun is not expected to be identical")
    run_dir = train(cfg, progress=not a.no_progress)
    comparison = compare_runs(a.run, run_dir)
    print(format_comparison(comparison))
    return 0 if comparison.identical else 1


DESCRIPTION = """\
Study how GRPO's four batch knobs change what a model learns and how fast: P prompts a collection
(rollout_batch_size) x G responses a prompt (n_samples_per_prompt) = B responses an update
(global_batch_size) x S updates a collection (num_steps_per_rollout)."""
EPILOG = """\
a first session:
  grpo-knobs knobs --rollout-batch-size 64 --n-samples-per-prompt 8 --global-batch-size 256
  grpo-knobs train -p task=countdown-2x10 -p rollout_batch_size=64 -p global_batch_size=256
  grpo-knobs plan smoke                # a study preset's runs, checked before any trains
  grpo-knobs study smoke               # screening -> selection -> confirmation -> test -> analysis
  grpo-knobs report runs/smoke         # the analysis notebooks as one offline HTML page

`grpo-knobs COMMAND --help` lists a command's options; `grpo-knobs init DIR` writes a workspace with the
notebooks and a README."""


PRESET_HELP = (
    "A preset's name (the shipped ones: h200-mini, paper, seeds20, smoke; a workspace's studies/NAME.yaml "
    "comes first) or a path to a plan YAML."
)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose epilog may be a function, called only when help is printed (a command's
    help can then list what only a heavier import knows, without every command paying for it)."""

    def __init__(self, *args, epilog_fn=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.epilog_fn = epilog_fn

    def format_help(self) -> str:
        if self.epilog_fn is not None:
            self.epilog = self.epilog_fn()
        return super().format_help()


def _run_parameters() -> str:
    from .config import run_parameters_help

    return run_parameters_help()


def _command(sub, name: str, help: str, **kwargs) -> argparse.ArgumentParser:
    """A subcommand whose own --help opens with the line that the list of commands shows for it."""
    return sub.add_parser(name, help=help, description=textwrap.fill(help, 100), **kwargs)


def build_parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    p = _Parser(prog="grpo-knobs", description=DESCRIPTION, epilog=EPILOG, formatter_class=raw)
    p.add_argument("--debug", action="store_true", help=f"Show tracebacks (also: {DEBUG_ENV}=1).")
    sub = p.add_subparsers(dest="command", required=True)

    k = _command(sub, "knobs", help="Derive and check a batch plan (P x G = B x S).")
    k.add_argument("--rollout-batch-size", type=int, required=True, metavar="P", help="Prompts a collection.")
    k.add_argument("--n-samples-per-prompt", type=int, required=True, metavar="G", help="Responses a prompt.")
    k.add_argument("--global-batch-size", type=int, required=True, metavar="B", help="Responses an update.")
    k.add_argument(
        "--num-steps-per-rollout",
        type=int,
        default=None,
        metavar="S",
        help="Updates a collection (default: P x G / B).",
    )
    k.add_argument("--response-budget", type=int, default=None, help="A run's responses: its collections and updates.")
    k.add_argument(
        "--eval-every-responses", type=int, default=None, help="With --response-budget: the evaluation points."
    )
    k.add_argument("--json", action="store_true", help="Print the plan as JSON.")
    k.set_defaults(func=_cmd_knobs)

    i = _command(sub, "init", help="Write a workspace: the notebooks, a study preset to edit and a README.")
    i.add_argument("directory", help="A new or empty folder.")
    i.add_argument("--preset", default="smoke", help="The shipped preset copied into studies/ (default: smoke).")
    i.set_defaults(func=_cmd_init)

    f = _command(sub, "fetch-model", help="Fetch, verify and cache a model.")
    f.add_argument("name")
    f.set_defaults(func=_cmd_fetch_model)

    pr = _command(
        sub,
        "prepare",
        help="Compile the kernels a run of MODEL uses into the on-disk caches, once per machine "
        "(on CUDA; nothing to do on CPU).",
        epilog_fn=_run_parameters,
        formatter_class=raw,
    )
    pr.add_argument("model", nargs="?", help="Registry name, hub id or local path (default: RunConfig's).")
    pr.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="Cover attended caches up to this response length (as -p max_new_tokens=N; default RunConfig's).",
    )
    pr.add_argument("--config", help="YAML file of run parameters, as for train.")
    pr.add_argument(
        "-p",
        "--param",
        action="append",
        metavar="KEY=VALUE",
        help="A run parameter, as for train (repeatable). Both trainer modes are warmed unless deterministic is set.",
    )
    pr.set_defaults(func=_cmd_prepare)

    d = _command(sub, "data", help="Build or show the data manifests.")
    d.add_argument("action", choices=["build", "show"])
    d.add_argument("tasks", nargs="*")
    d.set_defaults(func=_cmd_data)

    t = _command(
        sub,
        "train",
        help="Run one training run (same code path as the notebook 10_train.ipynb).",
        epilog_fn=_run_parameters,
        formatter_class=raw,
    )
    t.add_argument("--config", help="YAML file of run parameters.")
    t.add_argument("-p", "--param", action="append", metavar="KEY=VALUE", help="Override one parameter (repeatable).")
    t.add_argument("--no-progress", action="store_true", help="No progress bars.")
    t.set_defaults(func=_cmd_train)

    te = _command(sub, "test-eval", help="Terminal test job: evaluate a checkpoint on the test split.")
    te.add_argument("--study-dir", required=True)
    te.add_argument("--run-id", required=True, help="A run directory, or initial-<task> for the initial model.")
    te.add_argument("--task", required=True)
    te.add_argument("--model", required=True, help="Checkpoint folder (<run>/final) or registry name.")
    te.add_argument("--max-new-tokens", type=int, default=256)
    te.add_argument("--problems", type=int, default=None)
    te.add_argument("--device", default="auto")
    te.set_defaults(func=_cmd_test_eval)

    pl = _command(sub, "plan", help="Validate a study preset and print its runs.")
    pl.add_argument("preset", help=PRESET_HELP)
    pl.add_argument("--json", action="store_true")
    pl.add_argument(
        "--study-dir", default=None, help="Show concrete confirmation runs once this study has a selection."
    )
    pl.add_argument("--param", action="append", metavar="KEY=VALUE", help="Set one of the plan's params (repeatable).")
    pl.set_defaults(func=_cmd_plan)

    st = _command(
        sub, "study", help="Run a study preset (skips complete runs, resumes partial ones), then its analysis."
    )
    st.add_argument("preset", help=PRESET_HELP)
    st.add_argument(
        "--phase",
        action="append",
        help="Only these phases (repeatable): screening, lr-followup, selection, confirmation, test.",
    )
    st.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="Runs side by side in worker processes; on GPUs, worker k uses GPU k mod n "
        "(use one job per GPU for clean phase times).",
    )
    st.add_argument("--study-dir", default=None, help="Default: runs/<preset>.")
    st.add_argument("--executor", choices=["auto", "papermill", "inprocess"], default="auto")
    st.add_argument("--param", action="append", metavar="KEY=VALUE", help="Set one of the plan's params (repeatable).")
    st.add_argument("--only", action="append", metavar="GLOB", help="Only runs whose id matches (repeatable).")
    st.add_argument("--no-analysis", action="store_true", help="Skip the analysis notebooks at the end.")
    st.add_argument(
        "--time-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="On a machine held for a limited time: start no training run whose recipe's longest finished run "
        "(x1.2) would end past SECONDS from now; those are left for the next call.",
    )
    st.add_argument(
        "--scheduler",
        choices=["local", "ray"],
        default="local",
        help="local: this machine (--jobs workers); ray: each run a Ray task holding the GPUs and CPUs "
        "it needs (docs/cluster.md).",
    )
    st.add_argument(
        "--ray-address",
        default=None,
        help="Ray cluster to run on (e.g. HEAD_IP:6379, or auto); default: start a local Ray instance.",
    )
    st.set_defaults(func=_cmd_study)

    an = _command(
        sub,
        "analyze",
        help="Execute the analysis notebooks (50-57; 59 where the study registered an analysis) on a study directory.",
    )
    an.add_argument("study_dir", nargs="?")
    an.add_argument("--out-dir", default=None, help="Default: <study_dir>/figures.")
    an.add_argument(
        "--committed",
        action="store_true",
        help="Re-execute the committed notebooks in place (their committed records -> figures/).",
    )
    an.set_defaults(func=_cmd_analyze)

    nbp = _command(
        sub, "notebook-params", help="Rewrite the parameters cell of 10_train.ipynb (the workspace's, else shipped)."
    )
    nbp.add_argument("--check", action="store_true", help="Only check; exit 2 when the cell differs.")
    nbp.set_defaults(func=_cmd_notebook_params)

    rp = _command(sub, "report", help="One self-contained HTML page from a study's executed analysis notebooks.")
    rp.add_argument("study_dir", help="A study directory analysed by `grpo-knobs analyze` (or results/h200-mini).")
    rp.add_argument("--out", default=None, help="Default: report.html beside the notebooks' figures.")
    rp.add_argument("--notebooks", default=None, help="Folder of executed notebooks; default: <study_dir>/figures.")
    rp.set_defaults(func=_cmd_report)

    au = _command(sub, "audit", help="Reward audit: grade the initial model strict and flexible.")
    au.add_argument("--task", default="gsm8k")
    au.add_argument("--model", default="smollm2-135m-instruct")
    au.add_argument("--problems", type=int, default=16)
    au.add_argument("--max-new-tokens", type=int, default=256)
    au.add_argument("--out-dir", default="runs/audit")
    au.add_argument("--device", default="auto")
    au.set_defaults(func=_cmd_audit)
    ex = _command(
        sub, "export", help="Write a run's or study's records as TensorBoard event files or a trackio project."
    )
    ex.add_argument("dir", help="A run directory or a study directory.")
    ex.add_argument("--to", required=True, choices=["tensorboard", "trackio"])
    ex.add_argument(
        "--x",
        default="responses",
        choices=["responses", "updates", "seconds"],
        help="Horizontal axis: training responses, optimizer updates, or active seconds (as milliseconds).",
    )
    ex.add_argument("--out", default=None, help="Default: DIR/tracking/<tracker>.")
    ex.add_argument("--project", default=None, help="trackio project (default: the study's name).")
    ex.set_defaults(func=_cmd_export)

    cr = _command(
        sub,
        "compare-runs",
        help="Whether two runs' records are identical (clock and memory fields aside); if not, where they part. "
        "Exit 0 identical, 1 different.",
    )
    cr.add_argument("run_a", help="A run directory.")
    cr.add_argument("run_b", help="Another run directory.")
    cr.add_argument("--json", action="store_true")
    cr.set_defaults(func=_cmd_compare_runs)

    rr = _command(
        sub,
        "rerun",
        help="Train a recorded run again from its config.json into another directory, then compare the two "
        "(compare-runs). Exit 0 identical, 1 different.",
    )
    rr.add_argument("run", help="A run directory (its config.json names the parameters).")
    rr.add_argument("--out", default="runs/reruns", help="Where the rerun writes OUT/<run_id> (default: runs/reruns).")
    rr.add_argument("--resume", action="store_true", help="Continue a rerun that was cut short.")
    rr.add_argument(
        "--other-source", action="store_true", help="Train even if this library's source differs from the run's."
    )
    rr.add_argument("--no-progress", action="store_true", help="No progress bars.")
    rr.set_defaults(func=_cmd_rerun)
    return p


def _one_line(exc: BaseException) -> str:
    """The error as one line that says what went wrong (and, from our own errors, how to fix it)."""
    write_failed = type(exc).__name__ == "WriteError"  # records.WriteError: a large file's writer cut short
    if isinstance(exc, OSError) and (write_failed or exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)):
        where = exc.filename or "records"
        return f"could not write {where} ({exc.strerror}); free disk space (or raise the limit) and resume the run"
    if isinstance(exc, PermissionError):
        return f"permission denied: {exc.filename}; choose a writable output_dir"
    if isinstance(exc, OSError) and exc.filename and exc.strerror:
        return f"{exc.strerror}: {exc.filename}"
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if isinstance(exc, (ValueError, OSError, RuntimeError)) else f"{type(exc).__name__}: {text}"


def _note_printer(command: str, default):
    """``warnings.showwarning`` that shows ``records.RecordsWarning`` (records read short, e.g. a torn
    last line) as one line, and any other warning as before."""

    def show(message, category, filename, lineno, file=None, line=None):
        if category.__name__ == "RecordsWarning":
            print(f"grpo-knobs {command}: note: {' '.join(str(message).split())}", file=sys.stderr)
        else:
            default(message, category, filename, lineno, file, line)

    return show


def main(argv: list[str] | None = None) -> int:
    import warnings

    args = build_parser().parse_args(argv)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _note_printer(args.command, warnings.showwarning)
            code = _run(args, debug=args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0"))
        sys.stdout.flush()  # output still buffered meets a closed pipe here
        return code
    except BrokenPipeError:
        return _stdout_closed()


def _reader_gone() -> bool:
    """Whether stdout is a pipe nobody reads any more (poll says so with POLLERR)."""
    import select

    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # not a file (captured, or closed): no pipe of ours
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _stdout_closed() -> int:
    """The reader of stdout went away (``grpo-knobs compare-runs A B | head -1``): end quietly, with the
    shell's exit status for a process ended by SIGPIPE. stdout goes to devnull so that the interpreter's
    last flush at exit does not fail again (the recipe in Python's signal module docs)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 128 + 13  # SIGPIPE


def _run(args: argparse.Namespace, debug: bool) -> int:
    """The command, with every failure as one line on stderr and a non-zero exit."""
    try:
        return args.func(args)
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        hint = getattr(args, "resume_hint", None)
        print(f"grpo-knobs {args.command}: interrupted" + (f"; to continue: {hint}" if hint else ""), file=sys.stderr)
        return 130
    except (ValueError, OSError, RuntimeError, ImportError) as exc:
        if isinstance(exc, BrokenPipeError) and _reader_gone():
            raise  # stdout's reader left: main ends quietly; another pipe's is a failure, reported below
        if debug:
            traceback.print_exc()
        print(f"grpo-knobs {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # a failure no check foresaw: still one line, and the way to the traceback
        if debug:
            traceback.print_exc()
        text = " ".join(str(exc).split())[:300]
        print(
            f"grpo-knobs {args.command}: unexpected error {type(exc).__name__}: {text} "
            f"(a bug: rerun with --debug for the traceback and report it)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())

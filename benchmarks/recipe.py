"""The batch-256 recipe's phase times, several settings side by side in one run.

Each arm is one `grpo-knobs train` of the recipe (64/8/256/2, LR 2e-5, 256-token cap, 16,384 responses,
countdown-2x10) in a fresh process, as a study's worker runs it, with the arm's overrides; with ``--in-process``
the arms train one after another in this process, as the study's inprocess executor runs them (only the first
pays the imports in its ``init``); an arm's ``process=here`` or ``process=fresh`` overrides that for the arm, so
one call can interleave the two on one machine. An arm in this process can set ``gc=freeze`` (the objects alive
before its run left out of the garbage collector's walks). The table gives each phase's seconds per arm and its
ratio to the first arm, then what each run learned (so a faster setting is seen to learn within the same
spread) and, for runs in this process, the time their garbage collections took. ``--compare A,B`` runs
``grpo-knobs compare-runs`` on two arms; ``--archive`` adds each run's records (not its checkpoint) to a tar
file as soon as it finishes.
An arm can run another code revision (benchmarks/revisions.py): ``code=DIR``, a folder holding that
revision's ``lib/``, or ``rev=GITREV``, exported from this checkout's git with ``git archive`` under
``--out``; each run's recorded source hash is checked against the library the arm was given.

    python -m benchmarks.recipe --out runs/recipe --arm det-s1:deterministic=true,seed=1 \\
        --arm default-s1:seed=1 --compare det-s1,default-s1
    python -m benchmarks.recipe --out runs/before-after --arm before:rev=main,seed=1 --arm after:seed=1
    python -m benchmarks.recipe --out runs/where --arm fresh-s2:process=fresh,seed=2 --arm here-s2:process=here,seed=2
    python -m benchmarks.recipe --out runs/gc --in-process --arm warm:seed=1 --arm on-s2:seed=2 \\
        --arm freeze-s2:gc=freeze,seed=2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from benchmarks.revisions import Code, code_for_arm, parse_arm

RECIPE = {
    "task": "countdown-2x10",
    "rollout_batch_size": 64,
    "n_samples_per_prompt": 8,
    "global_batch_size": 256,
    "lr": 2e-5,
    "max_new_tokens": 256,
    "response_budget": 16384,
    "eval_every_responses": 2048,
    "resume_every_collections": 32,
}
PHASES = ("generation", "trainer", "init", "evaluation", "checkpoint", "sync", "other", "job")
RECORDS = (
    "config.json",
    "collections.jsonl",
    "evals.parquet",
    "samples.jsonl.gz",
    "timings.json",
    "state.json",
    "digest.json",
)


def run_arm(
    name: str,
    overrides: dict[str, str],
    out: Path,
    base: dict,
    code: Code,
    in_process: bool = False,
    freeze: bool = False,
) -> dict:
    from grpo_knobs.provenance import source_sha256

    params = {k: str(v) for k, v in base.items()} | overrides | {"output_dir": str(out), "run_id": name}
    start = time.perf_counter()
    collections = None  # Python's garbage collections during the run: timed in this process only
    if in_process:
        returncode, collections = train_here(params, out / f"{name}.log", freeze)
    else:
        returncode = train_process(params, out, name, code)
    wall = time.perf_counter() - start
    run = out / name
    row = {"arm": name, "overrides": overrides, "returncode": returncode, "process_seconds": wall}
    row["in_process"] = in_process
    row["gc"] = None if collections is None else {"freeze": freeze} | collections
    row["code"] = {"label": code.label, "lib": str(code.lib or ""), "commit": code.commit}
    row["code"]["source_sha256"] = source_sha256(code.package_dir())
    if returncode == 0:
        row |= run_record(run)
        recorded = json.loads((run / "config.json").read_text()).get("source_sha256")
        # None: a revision that records no source hash
        row["code"]["ran"] = None if recorded is None else recorded == row["code"]["source_sha256"]
    print(
        f"{name} ({code.label}{', in this process' if in_process else ''}): exit {returncode}, {wall:.1f} s"
        + (f", job {row['timings']['job']:.1f} s" if "timings" in row else "")
        + ("; its recorded source hash is not that code's: PYTHONPATH?" if row["code"].get("ran") is False else "")
    )
    return row


def _in_process(name: str, settings: dict[str, str], default: bool) -> bool:
    """Take ``process`` (here | fresh) out of an arm's settings: whether the arm trains in this process."""
    where = settings.pop("process", "here" if default else "fresh")
    if where not in ("here", "fresh"):
        raise SystemExit(f"--arm {name}: process={where}: give process=here (this process) or process=fresh")
    return where == "here"


def train_process(params: dict[str, str], out: Path, name: str, code: Code) -> int:
    """``grpo-knobs train`` in a fresh process (its imports and set-up count in its ``init``); its exit code."""
    with open(out / f"{name}.log", "w") as log:
        return subprocess.run(train_command(params), stdout=log, stderr=subprocess.STDOUT, env=code.env()).returncode


def _gc_mode(name: str, settings: dict[str, str], in_process: bool) -> bool:
    """Take ``gc`` (on | freeze) out of an arm's settings: whether the arm's run starts with the objects this
    process holds moved out of the collector's walk (``gc.freeze``), which only an arm in this process can."""
    mode = settings.pop("gc", "on")
    if mode not in ("on", "freeze"):
        raise SystemExit(f"--arm {name}: gc={mode}: give gc=on (the default) or gc=freeze")
    if mode == "freeze" and not in_process:
        raise SystemExit(f"--arm {name}: gc=freeze acts on this process; give it with process=here")
    return mode == "freeze"


def train_here(params: dict[str, str], log: Path, freeze: bool = False) -> tuple[int, dict]:
    """The run in this process, as a study's inprocess executor trains its runs one after another: only the
    first run in the process pays the imports. (0, or 1 with the traceback in ``log``; Python's garbage
    collections during the run: milliseconds and full ones). ``freeze``: every object alive before the run is
    left out of the collector's walks during it (``gc.freeze`` after a collection; undone after the run)."""
    import gc
    import traceback

    from grpo_knobs.config import RunConfig
    from grpo_knobs.trainer import train

    from benchmarks.timeline import garbage_collections

    if freeze:
        gc.collect()
        gc.freeze()
    try:
        with garbage_collections() as seen:
            train(RunConfig.from_dict(params), progress=False)  # parses the strings as `-p key=value` does
    except Exception:
        log.write_text(traceback.format_exc())
        return 1, seen
    finally:
        if freeze:
            gc.unfreeze()
    return 0, seen


def train_command(params: dict[str, str]) -> list[str]:
    """``grpo-knobs train`` in a fresh process, as a study runs it, with run parameters ``params``."""
    cmd = [sys.executable, "-m", "grpo_knobs.cli", "train", "--no-progress"]
    return cmd + [a for k, v in params.items() for a in ("-p", f"{k}={v}")]


def run_record(run: Path) -> dict:
    """What a finished run recorded: its phase seconds (``timings``, keys ``PHASES`` among them), learning, and
    its trainer's pace."""
    from grpo_knobs.records import RunDir

    rows = RunDir(run).collections()
    return {
        "timings": json.loads((run / "timings.json").read_text()),
        "learning": learning(run, rows),
        "trainer_ms_per_1k_tokens": trainer_pace(rows),
    }


def trainer_pace(rows: list[dict]) -> float | None:
    """Trainer-phase milliseconds per 1,000 response tokens over a run's collections (``rows``) after the first
    (which holds first-use costs: compilation, allocator growth). Runs in default mode draw different
    responses, so their trainer phases differ by how much they generated; this compares the trainers' speed.
    None with one collection."""
    later = rows[1:]
    tokens = sum(r["output_tokens"] for r in later)
    return 1e6 * sum(r["seconds"]["trainer"] for r in later) / tokens if tokens else None


def learning(run: Path, rows: list[dict] | None = None) -> dict:
    """Reward over the last four collections, response tokens, final validation accuracy; ``rows``: the run's
    collections, if already read."""
    from grpo_knobs.determinism import run_outcome
    from grpo_knobs.records import RunDir

    outcome = run_outcome(RunDir(run), rows)
    return {
        "reward_last4": outcome["reward_last4"],
        "response_tokens": outcome["response_tokens"],
        "validation_final": outcome["validation"][1],
    }


def archive(run: Path, tar_path: Path) -> None:
    """Append a run's records (never its checkpoint) to an uncompressed tar, which can grow file by file."""
    with tarfile.open(tar_path, "a") as tar:
        for name in RECORDS:
            if (run / name).exists():
                tar.add(run / name, arcname=f"{run.name}/{name}")
        log = run.with_name(f"{run.name}.log")
        if log.exists():
            tar.add(log, arcname=f"{run.name}/train.log")


def table(rows: list[dict]) -> str:
    done = [r for r in rows if "timings" in r]
    if not done:
        return "no arm finished"
    base = done[0]["timings"]
    width = max(12, *(len(r["arm"]) for r in done))
    lines = [f"{'phase (s)':<16}" + "".join(f"{r['arm']:>{width + 8}}" for r in done)]
    for phase in PHASES:
        cells = []
        for r in done:
            v = r["timings"][phase]
            ratio = f" ({v / base[phase]:.2f}x)" if base[phase] > 0 and r is not done[0] else ""
            cells.append(f"{v:.1f}{ratio}".rjust(width + 8))
        lines.append(f"{phase:<16}" + "".join(cells))
    for key, fmt in (("reward_last4", "{:.3f}"), ("validation_final", "{:.0%}"), ("response_tokens", "{:,}")):
        lines.append(f"{key:<16}" + "".join(fmt.format(r["learning"][key]).rjust(width + 8) for r in done))
    pace = [r["trainer_ms_per_1k_tokens"] for r in done]
    lines.append(f"{'trainer ms/1k':<16}" + "".join(("-" if v is None else f"{v:.2f}").rjust(width + 8) for v in pace))
    collected = [r["gc"] for r in done]
    cells = ["-" if c is None else f"{c['ms'] / 1e3:.2f} ({c['full']})" for c in collected]
    lines.append(f"{'gc s (full)':<16}" + "".join(cell.rjust(width + 8) for cell in cells))
    lines.append("trainer ms/1k: trainer-phase ms per 1,000 response tokens, collections after the first")
    lines.append("gc s (full): Python's garbage collections during a run in this process, seconds (full ones)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="Study directory the runs are written to.")
    p.add_argument("--arm", action="append", required=True, metavar="NAME:key=value,...")
    p.add_argument("--base", action="append", default=[], metavar="KEY=VALUE", help="Change the recipe for every arm.")
    p.add_argument("--compare", action="append", default=[], metavar="A,B", help="compare-runs on two arms.")
    p.add_argument("--archive", type=Path, default=None, help="tar file each finished run's records are added to.")
    p.add_argument("--json", type=Path, default=None, help="Write the rows as JSON.")
    p.add_argument(
        "--in-process",
        action="store_true",
        help="Train the arms one after another in this process, as a study's inprocess executor does (the first "
        "arm pays the imports); arms of this checkout only.",
    )
    a = p.parse_args(argv)
    base = RECIPE | dict(kv.split("=", 1) for kv in a.base)
    arms = [parse_arm(x) for x in a.arm]
    here = [_in_process(name, overrides, a.in_process) for name, overrides in arms]
    frozen = [_gc_mode(name, overrides, inside) for (name, overrides), inside in zip(arms, here)]
    a.out.mkdir(parents=True, exist_ok=True)
    codes = [code_for_arm(name, overrides, a.out) for name, overrides in arms]  # every arm checked first
    for (name, _), code, inside in zip(arms, codes, here):
        if inside and code.lib:
            p.error(
                f"--arm {name}: an arm in this process runs this checkout's library; code= or rev= needs "
                "a process of its own (process=fresh)"
            )
    rows = []
    for (name, overrides), code, inside, freeze in zip(arms, codes, here, frozen):
        rows.append(run_arm(name, overrides, a.out, base, code, inside, freeze))
        if a.archive:
            archive(a.out / name, a.archive)
        if a.json:
            a.json.write_text(json.dumps(rows, indent=2) + "\n")
    print(table(rows))
    for pair in a.compare:
        x, y = pair.split(",")
        proc = subprocess.run(
            [sys.executable, "-m", "grpo_knobs.cli", "compare-runs", str(a.out / x), str(a.out / y)],
            capture_output=True,
            text=True,
        )
        print(f"\ncompare-runs {x} {y} (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}", end="")
    return 0 if all(r["returncode"] == 0 and r["code"]["ran"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Runs side by side on one GPU: the same runs trained one at a time, then several at a time, in one call.

Each arm trains the recipe (benchmarks.recipe's batch-256 recipe, deterministic by default) for seeds
1..``--runs``, each as `grpo-knobs train` in a fresh process as a study worker does, with at most
``jobs`` processes at once. The table gives each arm's wall time, runs per minute and its ratio to the
first arm, and the runs' mean job time against the first arm's (how much sharing slows each run). A
deterministic run does not depend on what runs beside it: each seed's records are compared across arms
(``grpo-knobs compare-runs``) and the table says whether every seed is identical.

    python -m benchmarks.side_by_side --out runs/side --runs 6 --jobs 1,2,3 --json side.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.recipe import RECIPE, train_command


def run_arm(jobs: int, seeds: list[int], out: Path, params: dict[str, str]) -> dict:
    """Train one run per seed under ``out``, at most ``jobs`` at once; wall time and each run's job time."""
    out.mkdir(parents=True, exist_ok=True)
    waiting, running, codes = list(seeds), {}, {}
    start = time.perf_counter()
    while waiting or running:
        while waiting and len(running) < jobs:  # keep ``jobs`` processes going, seeds in order
            seed = waiting.pop(0)
            run = params | {"seed": str(seed), "output_dir": str(out), "run_id": f"s{seed}"}
            with open(out / f"s{seed}.log", "w") as log:
                running[seed] = subprocess.Popen(train_command(run), stdout=log, stderr=subprocess.STDOUT)
        for seed, proc in list(running.items()):
            if proc.poll() is not None:
                codes[seed] = running.pop(seed).returncode
        time.sleep(0.2)
    wall = time.perf_counter() - start
    job = {s: json.loads((out / f"s{s}" / "timings.json").read_text())["job"] for s in seeds if codes[s] == 0}
    return {"jobs": jobs, "wall_seconds": wall, "returncodes": codes, "job_seconds": job}


def identical(a: Path, b: Path) -> bool:
    """Whether ``grpo-knobs compare-runs`` finds two runs' records identical."""
    cmd = [sys.executable, "-m", "grpo_knobs.cli", "compare-runs", str(a), str(b)]
    return subprocess.run(cmd, capture_output=True, text=True).returncode == 0


def summarize(arms: list[dict], out: Path) -> list[dict]:
    """Per arm: runs per minute and mean job time, each as a ratio to the first arm; seeds identical to it."""
    first = arms[0]
    base_rate = len(first["job_seconds"]) / first["wall_seconds"] * 60
    base_job = sum(first["job_seconds"].values()) / max(1, len(first["job_seconds"]))
    rows = []
    for arm in arms:
        done = arm["job_seconds"]
        rate = len(done) / arm["wall_seconds"] * 60
        mean_job = sum(done.values()) / max(1, len(done))
        pairs = [(out / f"jobs-{first['jobs']}" / f"s{s}", out / f"jobs-{arm['jobs']}" / f"s{s}") for s in done]
        same = [identical(a, b) for a, b in pairs] if arm is not first else []
        rows.append(
            arm
            | {
                "runs_per_minute": rate,
                "throughput_ratio": rate / base_rate if base_rate else None,
                "mean_job_seconds": mean_job,
                "job_ratio": mean_job / base_job if base_job else None,
                "identical_to_first": all(same) if arm is not first else None,
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    head = f"{'jobs':>4} {'runs':>5} {'wall s':>8} {'runs/min':>9} {'ratio':>6} {'job s':>7} {'ratio':>6}"
    lines = [head + "  identical"]
    for r in rows:
        same = "-" if r["identical_to_first"] is None else ("yes" if r["identical_to_first"] else "NO")
        lines.append(
            f"{r['jobs']:>4} {len(r['job_seconds']):>5} {r['wall_seconds']:>8.1f} {r['runs_per_minute']:>9.2f} "
            f"{r['throughput_ratio']:>5.2f}x {r['mean_job_seconds']:>7.1f} {r['job_ratio']:>5.2f}x  {same}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="Folder the arms' runs are written to (jobs-K/sS).")
    p.add_argument("--runs", type=int, default=6, help="Runs per arm: seeds 1..runs.")
    p.add_argument("--jobs", default="1,2", help="Runs at once per arm, comma-separated; the first is the baseline.")
    p.add_argument("--base", action="append", default=[], metavar="KEY=VALUE", help="Change the recipe.")
    p.add_argument("--json", type=Path, default=None, help="Write the arms as JSON.")
    a = p.parse_args(argv)
    try:
        jobs = [int(j) for j in a.jobs.split(",")]
        if not jobs or min(jobs) < 1 or a.runs < 1:
            raise ValueError
    except ValueError:
        p.error(f"--jobs takes positive integers like 1,2,3 and --runs a positive integer (got {a.jobs!r}, {a.runs})")
    if a.out.exists() and any(a.out.iterdir()):
        p.error(f"{a.out} is not empty; give a new --out (runs are never overwritten)")
    params = {k: str(v) for k, v in (RECIPE | {"deterministic": "true"}).items()}
    params |= dict(kv.split("=", 1) for kv in a.base)
    seeds = list(range(1, a.runs + 1))
    arms = []
    for k in jobs:
        arms.append(run_arm(k, seeds, a.out / f"jobs-{k}", params))
        print(f"jobs {k}: {arms[-1]['wall_seconds']:.1f} s for {len(arms[-1]['job_seconds'])} of {a.runs} runs")
    rows = summarize(arms, a.out)
    print(table(rows))
    if a.json:
        a.json.write_text(json.dumps({"params": params, "arms": rows}, indent=1, default=str))
    return 0 if all(len(r["job_seconds"]) == a.runs for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""A run's first process against a later one: phase seconds of two identical runs side by side.

Two `grpo-knobs train` runs of the same settings (the batch-256 recipe of benchmarks/recipe.py, with
``-p`` overrides on top), each in a fresh process, the first straight after ``grpo-knobs prepare`` of
the same settings when ``--prepare`` is given. The table gives each phase's seconds in the first and
the second run, read from their records, and the difference: what a cold process still pays that a
warm one does not. Before each run a fresh process times ``import grpo_knobs.cli`` with
``python -X importtime``; its slowest imports (cumulative) are listed for both.

    python -m benchmarks.cold_start --out runs/cold --prepare --json cold.json -p deterministic=true -p seed=1
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.recipe import PHASES, RECIPE, run_record, train_command

RUNS = ("first", "second")
TOP_IMPORTS = 10  # slowest imports listed


def run(cmd: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    """``cmd`` in a fresh process, its output kept (a failure's last lines go to stderr), and its seconds."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).splitlines()[-20:]
        print("\n".join([f"{' '.join(cmd[:5])} ... exited {proc.returncode}:", *tail]), file=sys.stderr)
    return proc, seconds


def import_times() -> dict[str, float]:
    """Milliseconds (cumulative) of each import ``import grpo_knobs.cli`` makes, in a fresh process."""
    proc, _ = run([sys.executable, "-X", "importtime", "-c", "import grpo_knobs.cli"])
    times = {}
    for line in proc.stderr.splitlines():
        fields = line.removeprefix("import time:").split("|")  # self [us] | cumulative | imported package
        if len(fields) == 3 and fields[1].strip().isdigit():
            times[fields[2].strip()] = int(fields[1]) / 1e3
    return times


def train_twice(params: dict[str, str], out: Path) -> dict:
    """Each run after its own import timing: {"runs": {name: row}, "imports": {name: ms by module}}."""
    rows, imports = {}, {}
    for name in RUNS:
        imports[name] = import_times()
        proc, seconds = run(train_command(params | {"output_dir": str(out), "run_id": name}))
        rows[name] = {"returncode": proc.returncode, "process_seconds": seconds}
        if proc.returncode == 0:
            rows[name] |= run_record(out / name)
    return {"runs": rows, "imports": imports}


def table(result: dict) -> str:
    """Phase seconds first, second and first - second; then the slowest imports of each process."""
    first, second = (result["runs"][name]["timings"] for name in RUNS)
    lines = [f"{'phase (s)':<12}{'first':>10}{'second':>10}{'first-second':>14}"]
    for phase in PHASES:
        lines.append(f"{phase:<12}{first[phase]:>10.2f}{second[phase]:>10.2f}{first[phase] - second[phase]:>+14.2f}")
    a, b = (result["imports"][name] for name in RUNS)
    lines.append(f"\n{'import grpo_knobs.cli (ms)':<40}{'first':>10}{'second':>10}")
    for module in sorted(a, key=a.get, reverse=True)[:TOP_IMPORTS]:
        lines.append(f"{module:<40}{a[module]:>10.1f}{b.get(module, 0.0):>10.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="A new folder for the two runs.")
    p.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE", help="Change the recipe.")
    p.add_argument("--prepare", action="store_true", help="Run `grpo-knobs prepare` of these settings first.")
    p.add_argument("--json", type=Path, default=None, help="Write the runs' records and import times as JSON.")
    a = p.parse_args(argv)
    bad = [kv for kv in a.param if "=" not in kv]
    if bad:
        raise SystemExit(f"-p {bad[0]}: expected KEY=VALUE")
    params = {k: str(v) for k, v in RECIPE.items()} | dict(kv.split("=", 1) for kv in a.param)
    taken = [name for name in RUNS if (a.out / name).exists()]
    if taken:
        raise SystemExit(f"{a.out} already holds run {taken[0]}; give --out a new folder")
    a.out.mkdir(parents=True, exist_ok=True)
    result = {"params": params, "prepare": None}
    if a.prepare:
        cmd = [
            sys.executable,
            "-m",
            "grpo_knobs.cli",
            "prepare",
            *(x for kv in params.items() for x in ("-p", "=".join(kv))),
        ]
        proc, seconds = run(cmd)
        result["prepare"] = {"returncode": proc.returncode, "seconds": seconds, "output": proc.stdout}
        print(proc.stdout, end="")
        if proc.returncode != 0:
            return 1
    result |= train_twice(params, a.out)
    if a.json:
        a.json.write_text(json.dumps(result, indent=2) + "\n")
    failed = [name for name, row in result["runs"].items() if row["returncode"] != 0]
    if failed:
        print(f"run {failed[0]} failed (exit {result['runs'][failed[0]]['returncode']}); no table")
        return 1
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

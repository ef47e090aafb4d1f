"""Hardware counters of one decode step's kernels, read by Nsight Compute, a row per kernel.

``benchmarks.rollout`` says how long a 512-row fused decode step takes; ``decode_profile`` which kernels the
time goes to. This says how each kernel uses the GPU: the share of DRAM bandwidth and of the SMs' issue
rate it reached, its occupancy, how many waves its grid makes, how often a scheduler found a warp ready.
It builds the fused engine as the rollout benchmark does, turns CUDA graphs off (so every kernel of a step
is its own launch), warms it with one call, then runs the call again with the profiler's window open
around decode step ``--step`` only: ``ncu --profile-from-start off`` measures every kernel of that one step,
at the cache length a row has that far into the call.

Nsight Compute replays each kernel alone, with the caches flushed before each replay and the clocks as the
GPU sets them, so the kernels' durations add up to more than the graphed step's time: read the counters
for how a kernel runs, the rollout benchmark for how long a step takes.

    python -m benchmarks.step_counters --batch 512 --step 128 --raw step.txt   # runs ncu on this module
    python -m benchmarks.step_counters --from-raw step.txt                     # the table of an earlier run
    python -m benchmarks.step_counters --from-raw step.txt --plot step-time.png \
        --mark "the bandwidth bound=0.50" --mark "the graphed step=1.446"          # and its step as one bar
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import shutil
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

NCU_PLACES = ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu")
SECTIONS = (
    "SpeedOfLight",
    "MemoryWorkloadAnalysis",
    "Occupancy",
    "LaunchStats",
    "WarpStateStats",
    "SchedulerStats",
    "ComputeWorkloadAnalysis",
)
# (column, Nsight Compute's metric name): the medians printed for a kernel's launches
COLUMNS = (
    ("DRAM %", "DRAM Throughput"),
    ("SM %", "Compute (SM) Throughput"),
    ("L2 hit %", "L2 Hit Rate"),
    ("occupancy %", "Achieved Occupancy"),
    ("waves", "Waves Per SM"),
    ("issued/cycle", "Issued Warp Per Scheduler"),
)


def find_ncu(places=NCU_PLACES) -> str:
    """The ncu executable on PATH or in one of ``places``; SystemExit saying what to do where there is none."""
    found = shutil.which("ncu") or next((p for p in places if Path(p).is_file()), None)
    if found is None:
        raise SystemExit(
            f"Nsight Compute's ncu is not on PATH nor in {', '.join(places)}: install Nsight Compute on the GPU "
            "machine, or print the table of an earlier profile with --from-raw FILE"
        )
    return found


def read_raw(path: Path) -> dict[str, dict]:
    """ncu's ``--csv --page details`` output (plain or .gz; the program's own lines among it are skipped) ->
    {launch id: {"name", "grid", "block", "metrics": {metric name: float}}}, in launch order."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        lines = [line for line in f if line.startswith('"')]
    if not lines or not lines[0].startswith('"ID"'):
        raise SystemExit(f"{path} holds no ncu --csv --page details table (its lines start with '\"ID\",...')")
    kernels: dict[str, dict] = {}
    for row in csv.DictReader(lines):
        k = kernels.setdefault(
            row["ID"],
            {"name": row["Kernel Name"], "grid": row["Grid Size"], "block": row["Block Size"], "metrics": {}},
        )
        if row["Metric Name"]:
            try:
                k["metrics"][row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
            except ValueError:  # a text value (a cache configuration, a policy's name)
                pass
    return kernels


def short_name(name: str) -> str:
    """A kernel's name without its parameter list and return type: '_rotary_attention_kernel', or cuBLAS's
    'nvjet_sm90_tst_96x128_64x7_2x1_v_bz_TNN', whose name is its tile shape."""
    return name.split("(")[0].removeprefix("void ").strip()


def summarize(kernels: dict[str, dict]) -> list[dict]:
    """One row per kernel name and grid, longest total first: launches, total microseconds, the share of the
    step's kernel time, and the median of each of COLUMNS over the launches."""
    groups = defaultdict(list)
    for k in kernels.values():
        groups[(short_name(k["name"]), k["grid"], k["block"])].append(k["metrics"])
    total = sum(k["metrics"].get("Duration", 0.0) for k in kernels.values()) / 1e3  # ns -> us
    rows = []
    for (name, grid, block), ms in groups.items():
        us = sum(m.get("Duration", 0.0) for m in ms) / 1e3
        row = {"kernel": name, "grid": grid, "block": block, "launches": len(ms), "us": us, "share": us / total}
        for column, metric in COLUMNS:
            values = [m[metric] for m in ms if metric in m]
            row[column] = statistics.median(values) if values else None
        rows.append(row)
    return sorted(rows, key=lambda r: -r["us"])


def print_table(rows: list[dict], source: str) -> None:
    kernels, total = sum(r["launches"] for r in rows), sum(r["us"] for r in rows)
    print(f"{source}: {kernels} kernels, {total:.1f} us of kernel time (each replayed alone, caches flushed)")
    head = f"{'kernel':<44} {'grid':>12} {'n':>3} {'us':>8} {'share':>6}"
    print(head + "".join(f" {c:>12}" for c, _ in COLUMNS))
    for r in rows:
        cells = "".join(f" {'' if r[c] is None else format(r[c], '.3g'):>12}" for c, _ in COLUMNS)
        print(f"{r['kernel'][:44]:<44} {r['grid']:>12} {r['launches']:>3} {r['us']:8.1f} {r['share']:6.1%}{cells}")


def part_of(row: dict) -> str:
    """The part of a decode step a kernel row belongs to. A cuBLAS product launched once a step is lm_head;
    the layers' products are launched once or twice a layer."""
    name = row["kernel"]
    if name.startswith("_rotary_attention"):
        return "attention"
    if name.startswith(("nvjet", "sm90_", "cutlass")):
        return "lm_head" if row["launches"] == 1 else "layer products (cuBLAS)"
    if "silu" in name:
        return "SiLU-gate"
    if "sample" in name:
        return "sampler"
    return "other"


PART_COLORS = {
    "attention": "#4C72B0",
    "layer products (cuBLAS)": "#DD8452",
    "SiLU-gate": "#55A868",
    "lm_head": "#C44E52",
    "sampler": "#8172B3",
    "other": "#937860",
}


def plot_step(rows: list[dict], marks: list[tuple[str, float]], path: Path, title: str) -> list[Path]:
    """One horizontal bar of the step's kernel time by part (ms), with a dashed line at each (label, ms) mark;
    written as PNG and SVG beside ``path``."""
    import matplotlib.pyplot as plt
    from grpo_knobs.plots import configure, save_figure

    configure()
    parts = defaultdict(float)
    for r in rows:
        parts[part_of(r)] += r["us"] / 1e3
    fig, ax = plt.subplots(figsize=(9, 3.2))
    left = 0.0
    for part, color in PART_COLORS.items():
        ms = parts.get(part, 0.0)
        if ms == 0:
            continue
        ax.barh(0, ms, left=left, height=0.5, color=color, edgecolor="white", label=f"{part}: {ms:.2f} ms")
        if ms > 0.2:
            ax.text(left + ms / 2, 0, f"{part}\n{ms:.2f} ms", ha="center", va="center", fontsize=8, color="white")
        left += ms
    for i, (label, ms) in enumerate(marks):
        ax.axvline(ms, color="black", linestyle="--", linewidth=1)
        ax.text(ms, 0.3 + 0.13 * i, f"{label}: {ms:g} ms ", fontsize=8, va="bottom", ha="right")
    ax.set_xlim(0, max([left, *(ms for _, ms in marks)]) * 1.03)
    ax.set_ylim(-0.35, 0.35 + 0.13 * len(marks))
    ax.set_yticks([])
    ax.set_xlabel(f"ms of one decode step (the kernels' sum: {left:.2f} ms)")
    ax.set_title(title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3, frameon=False)
    paths = save_figure(fig, path.parent, path.stem)
    plt.close(fig)
    return paths


def parse_mark(text: str) -> tuple[str, float]:
    """'the graphed step=1.446' -> ('the graphed step', 1.446); SystemExit saying how to write one."""
    label, _, ms = text.rpartition("=")
    try:
        if label:
            return label, float(ms)
    except ValueError:
        pass
    raise SystemExit(f"--mark {text!r}: write it as LABEL=MS, e.g. --mark 'the graphed step=1.446'")


def profile(args) -> Path:
    """Run ncu over this module's --target mode; its stdout (the table among the program's lines) to --raw."""
    ncu = find_ncu()
    cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off"]
    cmd += [a for s in SECTIONS for a in ("--section", s)] + ["--csv", "--page", "details"]
    cmd += [sys.executable, "-m", "benchmarks.step_counters", "--target", "--model", args.model]
    cmd += ["--batch", str(args.batch), "--new-tokens", str(args.new_tokens), "--step", str(args.step)]
    args.raw.parent.mkdir(parents=True, exist_ok=True)
    with open(args.raw, "w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"ncu exited with {proc.returncode}; its output and the program's are in {args.raw}")
    return args.raw


def target(args) -> None:
    """The profiled program: decode step ``args.step`` of a fixed-length fused call, between
    cudaProfilerStart and cudaProfilerStop."""
    import torch
    from grpo_knobs.models import load_model
    from grpo_knobs.rollout.hf import HFEngine

    from benchmarks.rollout import cycled, fixed_length, question_prompts

    if not torch.cuda.is_available():
        raise SystemExit("--target profiles the fused CUDA path: run it on a GPU machine")
    device = torch.device("cuda")
    model, tokenizer, _ = load_model(args.model, device=device)
    prompts = cycled(question_prompts(tokenizer), args.batch)
    engine = HFEngine(model, tokenizer, device=device, max_batch_size=args.batch, fast="fused")
    engine.decoder.use_graphs = False  # every kernel its own launch, as ncu measures them
    engine.generate(prompts, **fixed_length(args.new_tokens))  # Triton compiles, cuBLAS picks its kernels
    decode, seen = engine.decoder._decode, [0]

    def bracketed(*a, **kw):
        seen[0] += 1
        if seen[0] == args.step:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
        decode(*a, **kw)
        if seen[0] == args.step:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()

    engine.decoder._decode = bracketed
    engine.generate(prompts, **fixed_length(args.new_tokens))
    print(f"profiled decode step {args.step} of {seen[0]}")


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--step", type=int, default=128, help="the decode step profiled (1 is the first)")
    ap.add_argument("--raw", type=Path, default=Path("step-counters.txt"), help="where ncu's output goes")
    ap.add_argument("--from-raw", type=Path, default=None, help="print the table of an earlier --raw file")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--plot",
        type=Path,
        default=None,
        help="draw the step's kernel time by part: PNG and SVG named after this path",
    )
    ap.add_argument("--mark", action="append", default=[], help="LABEL=MS: a dashed line on the plot (repeatable)")
    ap.add_argument("--title", default="Where a decode step's kernel time goes (each kernel replayed alone)")
    ap.add_argument("--target", action="store_true", help=argparse.SUPPRESS)  # the program ncu runs
    args = ap.parse_args(argv)
    if not 1 <= args.step < args.new_tokens:
        raise SystemExit(f"--step {args.step} is not a decode step of the call: take 1 to {args.new_tokens - 1}")
    marks = [parse_mark(m) for m in args.mark]
    if args.target:
        target(args)
        return []
    raw = args.from_raw or profile(args)
    if not raw.is_file():
        raise SystemExit(f"--from-raw {raw}: no such file")
    rows = summarize(read_raw(raw))
    print_table(rows, str(raw))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    if args.plot:
        for path in plot_step(rows, marks, args.plot, args.title):
            print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()

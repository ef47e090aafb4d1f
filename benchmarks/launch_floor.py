"""What a launch costs inside a CUDA graph when its kernel does nothing, against the decode step's kernels.

A 512-row fused decode step replays about 270 kernels in one graph; its graphed wall time is about 0.7 ms
above the sum of its kernels' own times (``benchmarks.decode_profile``). This times graphs of kernels that
do (almost) nothing, so the part of a step that is the cost of having so many kernels has a number: one
program storing one value, a program per SM doing the same, and the step's own small products (the o_proj
GEMM, 512 x 576 x 576, through cuBLAS) for comparison. Each is ``--reps`` launches captured in one graph
and replayed ``--iters`` times; on CPU the kernels run in Triton's interpreter and the times only show
that the code runs.

    python -m benchmarks.launch_floor --out launch-floor.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from grpo_knobs.rollout import kernels as K
from grpo_knobs.rollout.kernels import tl, triton  # as kernels imported them: interpreted on CPU

from benchmarks.decode_kernels import per_launch_us
from benchmarks.rollout import gpu_slug


@triton.jit
def _store_one(out_ptr):
    tl.store(out_ptr + tl.program_id(0), 1.0)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=270, help="launches per graph (a 512-row decode step's count)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rows", type=int, default=512, help="rows of the GEMM timed beside the empty kernels")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    device = torch.device(args.device)
    sms = K.sm_count(device)
    out = torch.zeros(sms, device=device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(args.rows, 576, device=device, dtype=dtype)  # [rows, H] as the decoder's o_proj input
    w = torch.randn(576, 576, device=device, dtype=dtype)  # [H, H]
    y = torch.empty(args.rows, 576, device=device, dtype=dtype)  # [rows, H]
    cases = {
        "one program": lambda: _store_one[(1,)](out),
        f"{sms} programs (one per SM)": lambda: _store_one[(sms,)](out),
        f"torch.mm {args.rows} x 576 x 576": lambda: torch.mm(a, w.t(), out=y),  # cuBLAS on CUDA
    }
    print(f"{gpu_slug(device)}: {args.reps} launches per graph, {args.iters} replays; us per launch")
    rows = []
    for name, fn in cases.items():
        us = per_launch_us(fn, args.reps, args.iters, device)
        rows.append({"case": name, "us_per_launch": us, "reps": args.reps, "device": gpu_slug(device)})
        print(f"  {name:<32} {us:8.2f}")
    floor = rows[0]["us_per_launch"]
    for row in rows[1:]:
        print(f"  {row['case']:<32} {row['us_per_launch'] / floor:7.2f}x one program")
    print(
        f"{args.reps} launches at one program's cost: {args.reps * floor / 1e3:.3f} ms of graph replay before any work"
    )
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
        print(f"wrote {args.out}")
    return rows


if __name__ == "__main__":
    main()

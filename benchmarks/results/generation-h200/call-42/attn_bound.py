"""Decode attention at 512 rows: held up by memory, or by each program's own chain of work?

The library's rotary_attention at SmolLM2-135M's shapes (9 query heads over 3 KV heads of 64, 57-slot prompts
shared by groups of 8 rows), 30 layers' caches, one launch a layer in one CUDA graph. Arms:
  hbm    every row its own cache (as the decoder): the reads come from HBM
  l2     every row reads one row's cache (row stride 0): the same loop and instructions, every read an L2 hit
  block1 a one-slot prompt and the token in slot 1: one 16-slot block a program (the launch and its ends)
If l2 is close to hbm, the loop's own latency sets the time and more bandwidth would not help; if it is far
below, the reads are what wait. With --ncu, one hbm launch under the profiler's window instead.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from grpo_knobs.rollout import kernels as K

N_Q, N_KV, D, C, LAYERS, GROUP = 9, 3, 64, 320, 30, 8


def setup(rows: int, prompt: int, slot: int, arm: str):
    dev = torch.device("cuda")
    g = torch.Generator(dev).manual_seed(0)
    qkv = torch.randn(rows, (N_Q + 2 * N_KV) * D, generator=g, device=dev).bfloat16()  # [B, 15 * D]
    cos = torch.randn(C, D, device=dev, generator=g)  # [positions, D]
    sin = torch.randn(C, D, device=dev, generator=g)
    if arm == "l2":  # [2, B, Hkv, C, D] views of one row's cache
        caches = [
            torch.randn(2, 1, N_KV, C, D, generator=g, device=dev).bfloat16().expand(2, rows, N_KV, C, D)
            for _ in range(LAYERS)
        ]
    else:
        caches = [torch.randn(2, rows, N_KV, C, D, generator=g, device=dev).bfloat16() for _ in range(LAYERS)]
    if arm == "block1":
        prompt, slot = 1, 1
    share = (torch.arange(rows, device=dev) // GROUP) * GROUP  # a group's first row holds its prompt
    out = torch.empty(rows, N_Q * D, device=dev, dtype=torch.bfloat16)  # [B, Hq * D]
    pos0 = torch.full((rows,), prompt - 1, dtype=torch.long, device=dev)  # left-padded from slot 0
    slot0 = torch.tensor([prompt - 1], device=dev)
    step = torch.tensor([slot - prompt + 1], device=dev)
    return qkv, cos, sin, pos0, slot0, step, caches, share, out


def launch(inputs, bucket: int, layers=None):
    qkv, cos, sin, pos0, slot0, step, caches, share, out = inputs
    for kv in caches[:layers]:
        K.rotary_attention(qkv, cos, sin, pos0, slot0, step, kv[0], kv[1], bucket, 0.125, out, share=share)


def time_graph(inputs, bucket: int, replays: int) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        launch(inputs, bucket)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(inputs, bucket)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / replays / LAYERS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="512,1024")
    ap.add_argument("--slots", default="64:64,184:192,300:320", help="token slot:bucket pairs")
    ap.add_argument("--arms", default="hbm,l2,block1")
    ap.add_argument("--prompt", type=int, default=57)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--ncu", action="store_true", help="one hbm launch at the first rows and slot, profiled")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]
    slots = [tuple(int(x) for x in s.split(":")) for s in args.slots.split(",")]
    if args.ncu:
        slot, bucket = slots[0]
        inputs = setup(rows_list[0], args.prompt, slot, "hbm")
        launch(inputs, bucket, layers=2)  # compiled and warm
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        launch(inputs, bucket, layers=1)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        return
    name = torch.cuda.get_device_name()
    print(
        f"{name}, torch {torch.__version__}; {args.prompt}-slot prompts shared by {GROUP} rows; "
        f"{LAYERS} layers' caches in one graph"
    )
    arms = args.arms.split(",")
    times = {(r, s, a): [] for r in rows_list for s in slots for a in arms}
    for _ in range(args.rounds):
        for r in rows_list:
            for s in slots:
                for a in arms:
                    if a == "block1" and s != slots[0]:
                        continue
                    inputs = setup(r, args.prompt, s[0], a)
                    times[(r, s, a)].append(time_graph(inputs, s[1], args.replays))
                    del inputs
                    torch.cuda.empty_cache()
    print(f"{'rows':>5} {'slot':>5} {'arm':<7} {'us a launch':>11} {'/ hbm':>7}")
    report = []
    for r in rows_list:
        for s in slots:
            base = statistics.median(times[(r, s, arms[0])])
            for a in arms:
                if not times[(r, s, a)]:
                    continue
                us = statistics.median(times[(r, s, a)])
                print(f"{r:>5} {s[0]:>5} {a:<7} {us:11.2f} {us / base:7.3f}")
                report.append(
                    {"rows": r, "slot": s[0], "bucket": s[1], "arm": a, "us": us, "runs_us": times[(r, s, a)]}
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "args": vars(args), "rows": report}, f, indent=1)


if __name__ == "__main__":
    main()

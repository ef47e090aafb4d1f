"""Decode attention's first reads moved earlier (attn_probe.py), timed against the library's launch by rows.

Call 38 (attention_rows.py) found a launch's time linear in its rows with about 6 us that do not scale: the
launch and each program's chain of dependent reads before its loop. This times attn_probe.py's switches
(``early``: the prompt holder and the first block's addresses first; ``peel``: the first block's keys and
values read beside the token's own q|k|v; ``prefetch64``: the first 64 slots asked into L2 at the top)
against the library's kernel and against the probe with neither (``plain``), with the residual stream's
1 / rms as the decoder applies it, and checks every arm's output and cache writes for the library's bits.

The library's rotary_attention at the rollout's mid-call shapes (SmolLM2-135M's 9 query heads over 3 KV heads
of 64; a 192-slot bucket with the token in slot 184; 57-slot prompts left-padded from slot 0 and read from the
first row of each group of 8, as the rollout's groups do), 30 layers' caches, one launch a layer in one CUDA
graph, at 256-2048 rows. The bytes a launch must read from memory: each row's decoded slots (keys and values
of its 3 KV heads) and each group's prompt once.

    python3 attention_reads.py --rows 256,512,1024,2048 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import statistics

import attn_probe
import torch
from grpo_knobs.rollout import kernels as K

N_Q, N_KV, D, C, LAYERS, GROUP = 9, 3, 64, 320, 30, 8
PEAK = {"H100": 3.35e12, "H200": 4.8e12}


ARMS = {
    "lib": None,
    "plain": (False, False, 0),
    "early": (True, False, 0),
    "peel": (True, True, 0),
    "prefetch64": (True, False, 64),
    "peel-prefetch64": (True, True, 64),
}


def launch(arm: str, qkv, cos, sin, pos0, slot0, step, kv, share, out, stream, bucket: int) -> None:
    args = (qkv, cos, sin, pos0, slot0, step, kv[0], kv[1], bucket, 0.125, out)
    if ARMS[arm] is None:
        K.rotary_attention(*args, share=share, stream=stream, eps=1e-5)
    else:
        early, peel, prefetch = ARMS[arm]
        attn_probe.rotary_attention(
            *args, share=share, stream=stream, eps=1e-5, early=early, peel=peel, prefetch=prefetch
        )


def setup(rows: int, prompt: int, slot: int):
    dev = torch.device("cuda")
    g = torch.Generator(dev).manual_seed(0)
    qkv = torch.randn(rows, (N_Q + 2 * N_KV) * D, generator=g, device=dev).bfloat16()  # [B, 15 * D]
    cos = torch.randn(C, D, device=dev, generator=g)  # [positions, D]
    sin = torch.randn(C, D, device=dev, generator=g)
    caches = [torch.randn(2, rows, N_KV, C, D, generator=g, device=dev).bfloat16() for _ in range(LAYERS)]
    share = (torch.arange(rows, device=dev) // GROUP) * GROUP  # a group's first row holds its prompt
    out = torch.empty(rows, N_Q * D, device=dev, dtype=torch.bfloat16)  # [B, Hq * D]
    stream = torch.randn(rows, 576, generator=g, device=dev).bfloat16()  # [B, H]: the residual stream
    pos0 = torch.full((rows,), prompt - 1, dtype=torch.long, device=dev)  # left-padded from slot 0
    slot0 = torch.tensor([prompt - 1], device=dev)
    step = torch.tensor([slot - prompt + 1], device=dev)
    return qkv, cos, sin, pos0, slot0, step, caches, share, out, stream


def bytes_read(rows: int, prompt: int, slot: int) -> int:
    """Keys and values each row must read: its decoded slots before the token, and its group's prompt once."""
    per_slot = N_KV * D * 2 * 2  # 3 KV heads x 64 x (key, value) x bf16
    return rows * (slot - prompt) * per_slot + rows // GROUP * prompt * per_slot


def time_arm(inputs: tuple, arm: str, bucket: int, replays: int) -> float:
    qkv, cos, sin, pos0, slot0, step, caches, share, out, stream = inputs

    def work():
        for kv in caches:
            launch(arm, qkv, cos, sin, pos0, slot0, step, kv, share, out, stream, bucket)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        work()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        work()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / replays / LAYERS


def same_bits(inputs: tuple, arms: list[str], bucket: int) -> dict:
    """Each arm's output and cache writes on a copy of layer 0's cache, against the library's."""
    qkv, cos, sin, pos0, slot0, step, caches, share, out, stream = inputs
    got = {}
    for arm in arms:
        kv = caches[0].clone()
        o = torch.empty_like(out)
        launch(arm, qkv, cos, sin, pos0, slot0, step, kv, share, o, stream, bucket)
        got[arm] = (o, kv)
    ref = got["lib"]
    return {a: bool(torch.equal(o, ref[0]) and torch.equal(kv, ref[1])) for a, (o, kv) in got.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="256,512,1024,2048")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--prompt", type=int, default=57)
    ap.add_argument("--slot", type=int, default=184)
    ap.add_argument("--bucket", type=int, default=192)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK.items() if k in name), None)
    print(
        f"{name}, torch {torch.__version__}; token in slot {args.slot} of a {args.bucket}-slot bucket, "
        f"{args.prompt}-slot prompts shared by {GROUP} rows; {LAYERS} layers' caches in one graph",
        flush=True,
    )
    rows_list = [int(r) for r in args.rows.split(",")]
    arms = args.arms.split(",")
    times = {(r, a): [] for r in rows_list for a in arms}
    for _ in range(args.rounds):
        for r in rows_list:
            inputs = setup(r, args.prompt, args.slot)
            if _ == 0:
                print(f"{r} rows: the library's bits? {same_bits(inputs, arms, args.bucket)}", flush=True)
            for a in arms:
                times[(r, a)].append(time_arm(inputs, a, args.bucket, args.replays))
            del inputs
            torch.cuda.empty_cache()
    print(
        f"{'rows':>5} {'arm':<10} {'us a launch':>11} {'ns a row':>9} {'GB/s':>7} {'of peak':>8} {'/ ' + arms[0]:>9}"
    )
    report = []
    for r in rows_list:
        nbytes = bytes_read(r, args.prompt, args.slot)
        base = statistics.median(times[(r, arms[0])])
        for a in arms:
            us = statistics.median(times[(r, a)])
            rate = nbytes / (us * 1e-6)
            frac = f"{rate / peak:.1%}" if peak else "-"
            print(f"{r:>5} {a:<10} {us:11.2f} {us / r * 1e3:9.2f} {rate / 1e9:7.0f} {frac:>8} {us / base:9.3f}")
            report.append({"rows": r, "arm": a, "us": us, "runs_us": times[(r, a)], "bytes": nbytes})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "args": vars(args), "rows": report}, f, indent=1)


if __name__ == "__main__":
    main()

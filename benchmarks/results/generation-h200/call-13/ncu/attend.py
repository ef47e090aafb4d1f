"""One decode-attention launch at the rollout's shapes, for Nsight Compute: 512 rows of SmolLM2-135M's heads
(9 query heads over 3 KV heads of 64), a 192-slot bucket with the token in slot 150, prompt slots 0-51 read
from the first of each 8 rows that share a prompt (as benchmarks.rollout's prompts do). Launches the kernel
``--launches`` times; profile the last with ``ncu -k regex:rotary_attention --launch-skip N-1 -c 1``.
``--before`` launches the previous kernel (../arms/kernels_before.py, which also reads a validity map).

    ncu --clock-control none --set full -k regex:rotary_attention --launch-skip 4 -c 1 python3 attend.py
"""

import argparse
import importlib.util
from pathlib import Path

import torch
from grpo_knobs.rollout import kernels as K

ap = argparse.ArgumentParser()
ap.add_argument("--rows", type=int, default=512)
ap.add_argument("--kv-len", type=int, default=192)
ap.add_argument("--slot", type=int, default=150)
ap.add_argument("--prompt", type=int, default=52)
ap.add_argument("--launches", type=int, default=5)
ap.add_argument("--before", action="store_true")
args = ap.parse_args()
if args.before:
    spec = importlib.util.spec_from_file_location(
        "kernels_before", Path(__file__).parents[1] / "arms/kernels_before.py"
    )
    K = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(K)
dev = torch.device("cuda")
B, n_q, n_kv, D, C, P = args.rows, 9, 3, 64, 320, args.prompt
g = torch.Generator(dev).manual_seed(0)
qkv = torch.randn(B, (n_q + 2 * n_kv) * D, generator=g, device=dev).bfloat16()
cos, sin = torch.randn(C, D, device=dev, generator=g), torch.randn(C, D, device=dev, generator=g)
kv = torch.randn(2, B, n_kv, C, D, generator=g, device=dev).bfloat16()
share = torch.arange(B, device=dev) % 8  # row r reads its prompt from row r % 8
out = torch.empty(B, n_q * D, device=dev, dtype=torch.bfloat16)
args_ = (
    qkv,
    cos,
    sin,
    torch.zeros(B, dtype=torch.long, device=dev) + P - 1,
    torch.tensor([P - 1], device=dev),
    torch.tensor([args.slot - P + 1], device=dev),
    kv[0],
    kv[1],
    *([torch.ones(B, C, dtype=torch.bool, device=dev)] if args.before else []),  # the previous kernel's validity map
    args.kv_len,
    0.125,
    out,
)
for _ in range(args.launches):
    K.rotary_attention(*args_, share=share)
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(100):
    K.rotary_attention(*args_, share=share)
end.record()
torch.cuda.synchronize()
us = start.elapsed_time(end) * 10
print(f"rotary_attention at {B} rows, bucket {args.kv_len}, slot {args.slot}: {us:.1f} us a launch (eager)")

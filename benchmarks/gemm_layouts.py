"""The decode step's products through cuBLAS, by weight layout and BLAS library, side by side.

A wide decode step's layer products (q|k|v, o_proj, gate|up, down_proj; ``--rows`` rows) take 3-5 us each
through ``F.linear``, most of it a kernel's fixed cost rather than its FLOPs (``benchmarks.launch_floor``).
cuBLAS picks a kernel by heuristics from the problem's shape and layout, so the same product may get a
different kernel with the weight stored transposed (``x @ W_t``, W_t [K, N] contiguous) or through cuBLASLt
(``torch.backends.cuda.preferred_blas_library``). This times each product each way, ``--reps`` launches
in one CUDA graph as the decoder replays them, and prints each arm's ratio to ``F.linear`` with cuBLAS.

    python -m benchmarks.gemm_layouts --rows 256,512 --out gemm-layouts.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from grpo_knobs.models import load_model

from benchmarks.decode_kernels import layer_products, per_launch_us
from benchmarks.rollout import gpu_slug

ARMS = ("linear/cublas", "x@Wt/cublas", "linear/cublaslt", "x@Wt/cublaslt")


def time_arm(arm: str, x, w, w_t, reps: int, iters: int, device) -> float:
    """us per product: x [M, K] times w [N, K] (or w_t [K, N]) with the arm's layout and library."""
    layout, library = arm.split("/")
    torch.backends.cuda.preferred_blas_library(library)
    try:
        if layout == "linear":
            return per_launch_us(lambda: torch.nn.functional.linear(x, w), reps, iters, device)
        return per_launch_us(lambda: x @ w_t, reps, iters, device)
    finally:
        torch.backends.cuda.preferred_blas_library("cublas")


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--rows", default="256,512", help="decoder rows (M) of each product")
    ap.add_argument("--reps", type=int, default=30, help="launches per graph (a model's layer count is typical)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    device = torch.device(args.device)
    model, _, info = load_model(args.model, device=device)
    dtype = model.get_input_embeddings().weight.dtype
    arms = ARMS if device.type == "cuda" else ARMS[:2]  # cuBLASLt is a CUDA library
    g = torch.Generator(device).manual_seed(0)
    print(f"{info.name} on {gpu_slug(device)}: {dtype}, {args.reps} launches per graph; us per product")
    print(f"{'rows':>5} {'product':<10} " + " ".join(f"{a:>16}" for a in arms) + "   best / linear-cublas")
    rows = []
    for M in (int(m) for m in args.rows.split(",")):
        for name, (N, K) in layer_products(model.config).items():
            x = torch.randn(M, K, generator=g, device=device).to(dtype)  # [M, K]
            w = torch.randn(N, K, generator=g, device=device).to(dtype)  # [N, K]
            w_t = w.t().contiguous()  # [K, N]
            us = {arm: time_arm(arm, x, w, w_t, args.reps, args.iters, device) for arm in arms}
            best = min(us, key=us.get)
            print(
                f"{M:>5} {name:<10} "
                + " ".join(f"{us[a]:>16.2f}" for a in arms)
                + f"   {best} {us[best] / us[arms[0]]:.2f}x",
                flush=True,
            )
            rows.append({"gpu": gpu_slug(device), "rows": M, "product": name, "K": K, "N": N} | {"us": us})
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
        print(f"wrote {args.out}")
    return rows


if __name__ == "__main__":
    main()

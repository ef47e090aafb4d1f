"""Where a decode step's GPU time goes: kernel time per step of the static decoder, by kernel and by kind.

The rollout benchmark gives wall time per decode step; this one runs the same decoder without CUDA
graphs under torch.profiler and sums the GPU time of each kernel, so the two side by side say how much
of a step is kernel work (and which kernels) and how much is launch overhead that graphs remove.

    python -m benchmarks.decode_profile --batch 512 --paths fast,fused \
        --out benchmarks/results/decode-profile-h200.json
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch
from grpo_knobs.models import load_model
from grpo_knobs.rollout.hf import HFEngine
from torch.profiler import ProfilerActivity, profile

from benchmarks.rollout import cycled, fixed_length, gpu_slug, question_prompts, timed_generate

PATHS = {"fast": True, "fused": "fused"}
KINDS = [  # first match wins; kernel names are lower-cased
    (
        "fused (Triton)",
        (
            "_add_rms_norm_kernel",
            "_linear_kernel",
            "_rotary_attention_kernel",
            "_silu_mul_kernel",
            "_sample_partial_kernel",
            "_sample_combine_kernel",
        ),
    ),
    ("gemm", ("gemm", "cutlass", "nvjet", "sm90_", "cublas", "gemv", "aten::mm", "aten::addmm", "aten::bmm")),
    ("sampling", ("exponential", "argmax", "logsumexp", "reduce", "gather", "log_kernel", "clamp")),
    ("softmax", ("softmax",)),
    ("copy/index", ("copy", "index", "cat", "fill")),
]


def kind_of(name: str) -> str:
    low = name.lower()
    return next((kind for kind, keys in KINDS if any(k in low for k in keys)), "elementwise/other")


def kernel_times(engine: HFEngine, prompts, steps: int) -> tuple[dict[str, float], int]:
    """Microseconds per kernel name over one generate() of `steps` tokens, graphs off: GPU kernel time
    on CUDA; on CPU, where there are no kernels, the self time of each aten operator. Also returns
    how many kernels (operators on CPU) ran."""
    engine.decoder.use_graphs = False
    engine.generate(prompts, **fixed_length(steps))  # warm-up: allocation, cuBLAS handles, Triton compilation
    cuda = engine.device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        timed_generate(engine, prompts, engine.device, **fixed_length(steps))  # synchronizes on CUDA
    times, launches = defaultdict(float), 0
    for e in prof.key_averages():
        if cuda and str(e.device_type).endswith("CUDA"):
            times[e.key] += e.self_device_time_total
            launches += e.count
        elif not cuda and e.key.startswith("aten::"):
            times[e.key] += e.self_cpu_time_total
            launches += e.count
    return {k: v for k, v in times.items() if v > 0}, launches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=64, help="decode steps profiled (prefill included once)")
    ap.add_argument("--paths", default="fast,fused")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    device = torch.device(args.device)
    model, tokenizer, _ = load_model(args.model, device=device)
    prompts = cycled(question_prompts(tokenizer), args.batch)
    rows = []
    for path in args.paths.split(","):
        graphed = HFEngine(model, tokenizer, device=device, max_batch_size=args.batch, fast=PATHS[path])
        timed_generate(graphed, prompts, device, **fixed_length(args.steps))  # capture
        wall, _ = timed_generate(graphed, prompts, device, **fixed_length(args.steps))
        del graphed
        engine = HFEngine(model, tokenizer, device=device, max_batch_size=args.batch, fast=PATHS[path])
        times, launches = kernel_times(engine, prompts, args.steps)
        del engine
        per_step = {k: v / 1e3 / args.steps for k, v in times.items()}  # ms per decode step
        by_kind = defaultdict(float)
        for k, v in per_step.items():
            by_kind[kind_of(k)] += v
        top = sorted(per_step.items(), key=lambda kv: -kv[1])[: args.top]
        row = {
            "gpu": gpu_slug(device),
            "model": args.model,
            "path": path,
            "batch": args.batch,
            "steps": args.steps,
            "graphed_wall_ms_per_step": 1e3 * wall / args.steps,
            "kernel_ms_per_step": sum(per_step.values()),
            "kernels_per_step": launches / args.steps,
            "kernel_ms_per_step_by_kind": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
            "top_kernels_ms_per_step": dict(top),
        }
        rows.append(row)
        print(
            f"\n{path}: batch {args.batch}, {args.steps} steps; "
            f"graphed wall {row['graphed_wall_ms_per_step']:.2f} ms/step, "
            f"GPU kernel time {row['kernel_ms_per_step']:.2f} ms/step in {row['kernels_per_step']:.0f} kernels"
        )
        for kind, ms in row["kernel_ms_per_step_by_kind"].items():
            print(f"  {kind:<18} {ms:8.3f} ms")
        for name, ms in top:
            print(f"    {ms:8.3f} ms  {name[:110]}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

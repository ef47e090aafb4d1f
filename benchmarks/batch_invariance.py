"""Is a response independent of the batch it is generated in? Noise and arithmetic, measured apart.

Keyed sampling (``HFEngine(keyed_sampling=True)``; always on the fused path) makes a response's random
draws depend on (seed, prompt position, sample index, token position) alone. Whether its tokens then
depend on the batch is a question about arithmetic: a row's logits may change with the rows beside it
(left padding to the longest prompt, the attended-cache bucket, matrix kernels chosen by batch size).
For each decode path this generates one target prompt alone and inside batches of other make-up
(other prompts, other lengths, more rows), greedy and sampled, and reports how often the target's
response is unchanged and the largest gap between its log-probs over the shared prefix.

On a GPU it also prices the matrix products: a row of ``x @ W.T`` computed inside a batch of M rows,
against the same row alone, through cuBLAS and through a Triton kernel with one fixed tile
configuration and no split of the reduction (batch-invariant by construction), with each one's time at
the decode step's shapes.

    python -m benchmarks.batch_invariance --out benchmarks/results/determinism-h200/batch-invariance.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from grpo_knobs.models import load_model
from grpo_knobs.rollout.hf import HFEngine

from .rollout import QUESTIONS, gpu_slug, question_prompts

PATHS = {"eager": False, "fast": True, "fused": "fused"}


def contexts(prompts: list[list[int]], target: list[int], rows: list[int]) -> dict[str, list[list[int]]]:
    """Batches that start with ``target`` (so its response key is the same in each) followed by others: none,
    three of other lengths, three twice as long (more left padding, a larger cache bucket), and ``rows`` - 1."""
    longer = [p + p for p in prompts]
    out = {"alone": [target], "with 3 others": [target, *prompts[:3]], "with 3 longer": [target, *longer[:3]]}
    for n in rows:
        out[f"with {n - 1} others"] = [target] + [prompts[i % len(prompts)] for i in range(n - 1)]
    return out


def measure_path(engine: HFEngine, batches: dict[str, list[list[int]]], temperature: float, steps: int) -> dict:
    """Per context: whether the first prompt's response equals its response alone, and the largest log-prob
    gap over their shared prefix."""
    results, alone = {}, None
    for name, batch in batches.items():
        gen = engine.generate(batch, n=1, max_new_tokens=steps, temperature=temperature, seed=11)
        tokens, logprobs = gen.token_ids[0], gen.logprobs[0]
        if alone is None:
            alone = (tokens, logprobs)
        shared = next((i for i, (x, y) in enumerate(zip(tokens, alone[0])) if x != y), min(len(tokens), len(alone[0])))
        gap = max((abs(a - b) for a, b in zip(logprobs[:shared], alone[1][:shared])), default=0.0)
        results[name] = {"identical": tokens == alone[0], "shared_prefix": shared, "max_logprob_gap": gap}
    return results


def response_invariance(model, tokenizer, device, steps: int, rows: list[int]) -> list[dict]:
    prompts = question_prompts(tokenizer)
    target = prompts[len(QUESTIONS) // 2]
    batches = contexts([p for p in prompts if p != target], target, rows)
    out = []
    for path, fast in PATHS.items():
        if path == "fused" and device.type != "cuda":
            continue  # Triton's interpreter: correct but far too slow for batches of this size
        engine = HFEngine(
            model,
            tokenizer,
            device=device,
            fast=fast,
            return_logprobs=True,
            keyed_sampling=True,
            max_batch_size=max(rows),
        )
        for temperature in (0.0, 1.0):
            res = measure_path(engine, batches, temperature, steps)
            out.append({"path": path, "temperature": temperature, "steps": steps, "contexts": res})
            same = sum(r["identical"] for r in res.values())
            worst = max(r["max_logprob_gap"] for r in res.values())
            print(
                f"{path:>6} T={temperature:.0f}: {same}/{len(res)} contexts give the target's response alone; "
                f"largest log-prob gap on shared prefixes {worst:.2e}"
            )
    return out


# ------------------------------------------------------------------------------------------ matrix products
def fixed_tile_matmul():
    """A Triton x @ W.T with one tile configuration for every M and the whole K in one program: each output
    element sums K in the same order whatever the batch, so a row's result never depends on the others."""
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(x_ptr, w_ptr, y_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        pid_m, pid_n = tl.program_id(0), tl.program_id(1)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros([BM, BN], tl.float32)
        for k0 in range(0, K, BK):
            a = tl.load(
                x_ptr + rm[:, None] * K + (k0 + rk)[None, :],
                mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K),
                other=0.0,
            )
            b = tl.load(
                w_ptr + rn[None, :] * K + (k0 + rk)[:, None],
                mask=(rn[None, :] < N) & ((k0 + rk)[:, None] < K),
                other=0.0,
            )
            acc += tl.dot(a, b)
        tl.store(
            y_ptr + rm[:, None] * N + rn[None, :],
            acc.to(y_ptr.dtype.element_ty),
            mask=(rm[:, None] < M) & (rn[None, :] < N),
        )

    def matmul(x, w):
        M, K = x.shape
        N = w.shape[0]
        y = x.new_empty(M, N)
        kernel[(triton.cdiv(M, 64), triton.cdiv(N, 64))](
            x, w, y, M, N, K, BM=64, BN=64, BK=64, num_warps=4, num_stages=3
        )
        return y

    return matmul


def time_ms(fn, reps: int = 50) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps * 1e3


def matmul_invariance(model, device, batches: list[int]) -> list[dict]:
    """For each decode GEMM shape: does row 0 of an M-row product equal the 1-row product? And the time of
    the step's GEMMs (every layer's, plus the head) through each kernel."""
    cfg = model.config
    h, inter = cfg.hidden_size, cfg.intermediate_size
    kv = cfg.num_key_value_heads * (getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads)
    shapes = {
        "qkv": (h + 2 * kv, h),
        "o": (h, h),
        "gate_up": (2 * inter, h),
        "down": (h, inter),
        "head": (cfg.vocab_size, h),
    }
    triton_mm = fixed_tile_matmul()
    g = torch.Generator(device).manual_seed(0)
    weights = {
        k: torch.randn(n, kk, generator=g, device=device, dtype=torch.bfloat16) * kk**-0.5
        for k, (n, kk) in shapes.items()
    }
    rows = []
    for m in batches:
        x = torch.randn(m, max(kk for _, kk in shapes.values()), generator=g, device=device, dtype=torch.bfloat16)
        row = {"batch": m}
        for name, fn in (("cublas", lambda a, w: a @ w.T), ("triton_fixed_tile", triton_mm)):
            same = all(
                torch.equal(fn(x[:, : w.shape[1]].contiguous(), w)[:1], fn(x[:1, : w.shape[1]].contiguous(), w))
                for w in weights.values()
            )
            per_layer = sum(
                time_ms(lambda w=w: fn(x[:, : w.shape[1]].contiguous(), w)) for k, w in weights.items() if k != "head"
            )
            step = per_layer * cfg.num_hidden_layers + time_ms(lambda: fn(x[:, :h].contiguous(), weights["head"]))
            row[f"{name}_row_invariant"] = same
            row[f"{name}_step_gemm_ms"] = step
        row["triton_over_cublas"] = row["triton_fixed_tile_step_gemm_ms"] / row["cublas_step_gemm_ms"]
        print(
            f"batch {m:>4}: cuBLAS {row['cublas_step_gemm_ms']:.3f} ms/step "
            f"(row-invariant {row['cublas_row_invariant']}), "
            f"fixed-tile Triton {row['triton_fixed_tile_step_gemm_ms']:.3f} ms/step "
            f"(row-invariant {row['triton_fixed_tile_row_invariant']}), ratio {row['triton_over_cublas']:.2f}"
        )
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=48, help="Tokens generated per response.")
    p.add_argument("--rows", default="16,64", help="Batch sizes the target sits in (besides the small batches).")
    p.add_argument("--gemm-batches", default="16,64,256,512")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    device = torch.device(a.device)
    model, tokenizer, _ = load_model(a.model, device=device)
    rows = [int(r) for r in a.rows.split(",")]
    result = {
        "gpu": gpu_slug(device),
        "model": a.model,
        "torch": torch.__version__,
        "responses": response_invariance(model, tokenizer, device, a.steps, rows),
    }
    if device.type == "cuda":
        result["matmul"] = matmul_invariance(model, device, [int(b) for b in a.gemm_batches.split(",")])
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()

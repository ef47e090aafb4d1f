"""Trainer throughput: tokens/s and model FLOP utilisation for packed micro-batches.

Times the trainer's own update path (token log-probs, clipped surrogate, backward) over
one optimizer batch of responses packed into micro-batches by token budget, and beside it
the no-grad scoring pass that computes the old-policy log-probs. A collection pays scoring
plus S updates, or the update alone with S=1 and ``reuse_on_policy_logprobs``. Prints one
row per budget and writes them as JSON.

    python -m benchmarks.train --budgets 4096,8192,16384 --responses 512 --out benchmarks/results/train-h200.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from grpo_knobs.grpo import Sequence, clipped_surrogate_loss, collate, pack_micro_batches, token_logprobs
from grpo_knobs.models import load_model
from grpo_knobs.runtime import resolve_device

# Dense bf16 peak by GPU name (vendor datasheets); MFU is reported against this.
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "B200": 2250e12}


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


def model_flops_per_token(model: torch.nn.Module, seq_len: int) -> float:
    """Forward + backward FLOPs per token: 6N for the weights plus 12 L d T for attention."""
    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    c = model.config
    return 6.0 * n + 12.0 * c.num_hidden_layers * c.hidden_size * seq_len


def synthetic_batch(n: int, prompt_len: int, response_len: int, vocab: int, seed: int = 0) -> list[Sequence]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(response_len // 4, response_len + 1, (n,), generator=g)  # varied, like real rollouts
    return [Sequence(torch.randint(10, vocab, (prompt_len,), generator=g).tolist(),
                     torch.randint(10, vocab, (int(r),), generator=g).tolist()) for r in lengths]


def bench_budget(model, seqs, budget: int, device: torch.device, repeats: int) -> dict:
    adv = torch.randn(len(seqs))
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
    micro = pack_micro_batches([len(s) for s in seqs], max_tokens=budget)
    batches = [collate([seqs[i] for i in mb], 0, device) for mb in micro]
    n_tokens = sum(len(s) for s in seqs)

    def one_update() -> None:
        model.zero_grad(set_to_none=True)
        for mb, idx in zip(batches, micro):
            with autocast:
                logp = token_logprobs(model, mb)  # [m, R]
            terms = clipped_surrogate_loss(logp, logp.detach(), adv[idx].to(device), mb.response_mask, clip_low=0.2,
                                           clip_high=0.28, aggregation="sequence-mean", global_batch_size=len(seqs),
                                           global_batch_tokens=float(n_tokens))
            terms.loss.backward()

    @torch.no_grad()
    def one_scoring() -> None:
        for mb in batches:
            with autocast:
                token_logprobs(model, mb)  # [m, R]

    def timed(fn) -> float:
        fn()  # warm-up: allocator, kernels
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(repeats):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t) / repeats

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    seconds = timed(one_update)
    scoring = timed(one_scoring)
    mean_len = n_tokens / len(seqs)
    flops = model_flops_per_token(model, int(mean_len)) * n_tokens
    peak = peak_flops(device)
    return {
        "max_tokens_per_micro_batch": budget, "responses": len(seqs), "micro_batches": len(micro),
        "tokens": n_tokens, "padded_tokens": sum(b.input_ids.numel() for b in batches),
        "seconds_per_update": seconds, "seconds_per_scoring": scoring,
        "scoring_plus_update_over_update": (scoring + seconds) / seconds, "tokens_per_s": n_tokens / seconds,
        "model_tflops_per_s": flops / seconds / 1e12, "mfu": (flops / seconds / peak) if peak else None,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--budgets", default="4096,8192,16384")
    ap.add_argument("--responses", type=int, default=512)
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--response-len", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    device = resolve_device(a.device)
    model, tok, info = load_model(a.model, device=device, dtype=torch.float32)
    model.eval()
    seqs = synthetic_batch(a.responses, a.prompt_len, a.response_len, len(tok))
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    rows = []
    print(f"{'budget':>8} {'micro':>6} {'tokens/s':>12} {'TFLOP/s':>9} {'MFU':>7} {'s/update':>9} {'s/scoring':>9} "
          f"{'(scoring+update)/update':>23}")
    for budget in (int(b) for b in a.budgets.split(",")):
        r = {"gpu": gpu, "model": info.name} | bench_budget(model, seqs, budget, device, a.repeats)
        rows.append(r)
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        print(f"{budget:>8} {r['micro_batches']:>6} {r['tokens_per_s']:>12,.0f} {r['model_tflops_per_s']:>9.2f} {mfu:>7} "
              f"{r['seconds_per_update']:>9.3f} {r['seconds_per_scoring']:>9.3f} {r['scoring_plus_update_over_update']:>22.2f}x")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(rows, indent=2) + "\n")
        print(f"wrote {a.out}")
    return rows


if __name__ == "__main__":
    main()

"""Decode attention as at 88524f8 (64-bit offsets, the loop over the whole bucket with the blocks past the
token masked; ./kernels_before.py) against the checkout's (32-bit offsets, the loop over the blocks from the
row's first real prompt slot to the token's) on the same inputs: bf16, rows whose left-padded prompts of
20-60 tokens are shared by 8 rows each, buckets of 64-320 slots, 512 rows (one program per row and KV head)
and 32 rows (the cache split into pieces). Are the outputs and the cache writes the same bits?"""

import importlib.util
from pathlib import Path

import torch
from grpo_knobs.rollout import kernels as K

spec = importlib.util.spec_from_file_location("kernels_before", Path(__file__).parent / "kernels_before.py")
before = importlib.util.module_from_spec(spec)
spec.loader.exec_module(before)
dev = torch.device("cuda")
g = torch.Generator(dev).manual_seed(0)
n_q, n_kv, D, C, P = 9, 3, 64, 320, 60
same = True
for B in (512, 32):
    lens = torch.randint(20, P + 1, (B // 8,), generator=g, device=dev).repeat_interleave(8)  # [B]
    share = torch.arange(B, device=dev) // 8 * 8  # the first row of each group of 8
    for step, kv_len in ((1, 64), (3, 64), (90, 192), (200, 320), (259, 320)):
        qkv = torch.randn(B, (n_q + 2 * n_kv) * D, generator=g, device=dev).bfloat16()
        cos, sin = torch.randn(C, D, device=dev, generator=g), torch.randn(C, D, device=dev, generator=g)
        kv = torch.randn(2, B, n_kv, C, D, generator=g, device=dev).bfloat16()
        common = (torch.tensor([P - 1], device=dev), torch.tensor([step], device=dev))
        for sh in (share, None):
            outs, caches = [], []
            for mod in (before, K):
                out, cache = torch.empty(B, n_q * D, device=dev, dtype=torch.bfloat16), kv.clone()
                mod.rotary_attention(
                    qkv, cos, sin, lens - 1, *common, cache[0], cache[1], kv_len, 0.125, out, share=sh
                )
                outs.append(out)
                caches.append(cache)
            eq = torch.equal(*outs) and torch.equal(*caches)
            same &= eq
            diff = (outs[0].float() - outs[1].float()).abs().max().item()
            print(
                f"{B} rows, step {step}, bucket {kv_len}, shared prompts {sh is not None}: outputs equal "
                f"{torch.equal(*outs)} (max |diff| {diff:.3g}), caches equal {torch.equal(*caches)}"
            )
print("all the same bits" if same else "BITS DIFFER")

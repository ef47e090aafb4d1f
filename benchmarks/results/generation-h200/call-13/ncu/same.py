"""The previous decode attention (../arms/kernels_before.py, reading a validity map) and the checkout's (reading
validity off each row's position) on the same inputs: bf16, 512 rows whose left-padded prompts of 20-60 tokens
are shared by 8 rows each, a 192-slot bucket; are the outputs and cache writes the same bits?"""

import importlib.util
from pathlib import Path

import torch
from grpo_knobs.rollout import kernels as K

spec = importlib.util.spec_from_file_location("kernels_before", Path(__file__).parents[1] / "arms/kernels_before.py")
before = importlib.util.module_from_spec(spec)
spec.loader.exec_module(before)
dev = torch.device("cuda")
g = torch.Generator(dev).manual_seed(0)
B, n_q, n_kv, D, C, P = 512, 9, 3, 64, 320, 60
lens = torch.randint(20, P + 1, (B // 8,), generator=g, device=dev).repeat_interleave(8)  # [B]
valid = torch.arange(C, device=dev)[None] >= (P - lens)[:, None]  # [B, C]: the prompt's tokens (and decodes)
share = torch.arange(B, device=dev) // 8 * 8  # the first row of each group of 8
for step, kv_len in ((1, 64), (90, 192), (200, 320)):
    qkv = torch.randn(B, (n_q + 2 * n_kv) * D, generator=g, device=dev).bfloat16()
    cos, sin = torch.randn(C, D, device=dev, generator=g), torch.randn(C, D, device=dev, generator=g)
    kv = torch.randn(2, B, n_kv, C, D, generator=g, device=dev).bfloat16()
    common = (torch.tensor([P - 1], device=dev), torch.tensor([step], device=dev))
    outs, caches = [], []
    for mod, extra in ((before, [valid]), (K, [])):
        out, cache = torch.empty(B, n_q * D, device=dev, dtype=torch.bfloat16), kv.clone()
        mod.rotary_attention(
            qkv, cos, sin, lens - 1, *common, cache[0], cache[1], *extra, kv_len, 0.125, out, share=share
        )
        outs.append(out)
        caches.append(cache)
    diff = (outs[0].float() - outs[1].float()).abs().max().item()
    print(
        f"step {step}, bucket {kv_len}: outputs equal {torch.equal(*outs)} (max |diff| {diff:.3g}), "
        f"caches equal {torch.equal(*caches)}"
    )

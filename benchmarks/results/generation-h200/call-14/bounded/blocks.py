"""The checkout's decode attention with 32-slot blocks (the default) and with 16-slot blocks, 4 stages: the
same bits? Inputs as same.py's (bf16, 512 and 32 rows, prompts shared by groups of 8)."""

import torch
from grpo_knobs.rollout import kernels as K

dev = torch.device("cuda")
g = torch.Generator(dev).manual_seed(0)
n_q, n_kv, D, C, P = 9, 3, 64, 320, 60
for B in (512, 32):
    lens = torch.randint(20, P + 1, (B // 8,), generator=g, device=dev).repeat_interleave(8)
    share = torch.arange(B, device=dev) // 8 * 8
    for step, kv_len in ((3, 64), (90, 192), (259, 320)):
        qkv = torch.randn(B, (n_q + 2 * n_kv) * D, generator=g, device=dev).bfloat16()
        cos, sin = torch.randn(C, D, device=dev, generator=g), torch.randn(C, D, device=dev, generator=g)
        kv = torch.randn(2, B, n_kv, C, D, generator=g, device=dev).bfloat16()
        common = (torch.tensor([P - 1], device=dev), torch.tensor([step], device=dev))
        outs = []
        for kw in ({}, dict(block_k=16, num_stages=4)):
            out, cache = torch.empty(B, n_q * D, device=dev, dtype=torch.bfloat16), kv.clone()
            K.rotary_attention(
                qkv, cos, sin, lens - 1, *common, cache[0], cache[1], kv_len, 0.125, out, share=share, **kw
            )
            outs.append(out)
        diff = (outs[0].float() - outs[1].float()).abs()
        print(
            f"{B} rows, step {step}, bucket {kv_len}: equal {torch.equal(*outs)}, elements differing "
            f"{(diff > 0).float().mean().item():.1%}, max |diff| {diff.max().item():.3g}"
        )

"""Decode attention before (probe/base_kernels.py) and after (lib/): the same inputs, how many output bits move?

Whole-cache launches (wide steps) and split ones (narrow steps), SmolLM2-135M's heads, random operands, the
prompt shared by groups of 8 rows and the stream's 1 / rms applied; the token at the prompt's last slot (step 0),
inside the first decoded block, and deep in the cache. Outputs and cache writes compared bitwise.
"""

import importlib.util
import sys

import torch

sys.path.insert(0, "lib")
from grpo_knobs.rollout import kernels as new  # noqa: E402

spec = importlib.util.spec_from_file_location("base_kernels", "probe/base_kernels.py")
base = importlib.util.module_from_spec(spec)
spec.loader.exec_module(base)

N_Q, N_KV, D, C, H = 9, 3, 64, 320, 576
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def run(mod, rows, prompt, slot, bucket, split):
    g = torch.Generator(DEV).manual_seed(rows + slot)
    qkv = torch.randn(rows, (N_Q + 2 * N_KV) * D, generator=g, device=DEV).bfloat16()
    cos = torch.randn(C, D, device=DEV, generator=g)
    sin = torch.randn(C, D, device=DEV, generator=g)
    kv = torch.randn(2, rows, N_KV, C, D, generator=g, device=DEV).bfloat16()
    stream = torch.randn(rows, H, generator=g, device=DEV).bfloat16()
    share = (torch.arange(rows, device=DEV) // 8) * 8
    pos0 = torch.randint(prompt // 2, prompt, (rows,), generator=g, device=DEV)
    out = torch.empty(rows, N_Q * D, device=DEV, dtype=torch.bfloat16)
    slot0, step = torch.tensor([prompt - 1], device=DEV), torch.tensor([slot - prompt + 1], device=DEV)
    mod.rotary_attention(qkv, cos, sin, pos0, slot0, step, kv[0], kv[1], bucket, 0.125, out, share=share,
                         stream=stream, eps=1e-5, split=split)  # fmt: skip
    return out, kv


cases = [(512, None), (256, None), (128, None), (64, None), (32, None), (8, None), (512, True), (64, False)]
if DEV.type == "cpu":
    cases = [(8, False), (8, True)]
worst = 0.0
for rows, split in cases:
    for slot, bucket in [(56, 64), (70, 128), (184, 192), (300, 320)]:
        a, b = run(base, rows, 57, slot, bucket, split), run(new, rows, 57, slot, bucket, split)
        n = (a[0] != b[0]).sum().item()
        rel = ((a[0].float() - b[0].float()).abs() / a[0].float().abs().clamp_min(1e-3)).max().item()
        worst = max(worst, rel)
        print(
            f"rows {rows:>4} split {split!s:>5} slot {slot:>3}: {n:>6} of {a[0].numel()} outputs differ "
            f"(largest relative {rel:.2e}); caches equal {torch.equal(a[1], b[1])}",
            flush=True,
        )
print(f"largest relative difference of any output: {worst:.2e} (a bf16 step is 3.9e-3 to 7.8e-3)")

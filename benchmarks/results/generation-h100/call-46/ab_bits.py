"""Decode attention of the library before and after: the same inputs, the same bits? probe/base_kernels.py is
lib/grpo_knobs/rollout/kernels.py at c2bc808; probe/variant_kernels.py the library's with the value product's
accumulator passed to tl.dot (acc = tl.dot(p^T, v, acc * alpha)).

Whole-cache launches (wide steps) and split ones (narrow steps), SmolLM2-135M's heads, random operands, the
prompt shared by groups of 8 rows and the stream's 1 / rms applied: outputs and cache writes compared bitwise.
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


def run(mod, rows, prompt, slot, bucket, split):
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g = torch.Generator(dev).manual_seed(rows + slot)
    qkv = torch.randn(rows, (N_Q + 2 * N_KV) * D, generator=g, device=dev).bfloat16()
    cos = torch.randn(C, D, device=dev, generator=g)
    sin = torch.randn(C, D, device=dev, generator=g)
    kv = torch.randn(2, rows, N_KV, C, D, generator=g, device=dev).bfloat16()
    stream = torch.randn(rows, H, generator=g, device=dev).bfloat16()
    share = (torch.arange(rows, device=dev) // 8) * 8
    pos0 = torch.randint(prompt // 2, prompt, (rows,), generator=g, device=dev)
    out = torch.empty(rows, N_Q * D, device=dev, dtype=torch.bfloat16)
    slot0, step = torch.tensor([prompt - 1], device=dev), torch.tensor([slot - prompt + 1], device=dev)
    mod.rotary_attention(qkv, cos, sin, pos0, slot0, step, kv[0], kv[1], bucket, 0.125, out, share=share,
                         stream=stream, eps=1e-5, split=split)  # fmt: skip
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return out, kv


spec = importlib.util.spec_from_file_location("variant_kernels", "probe/variant_kernels.py")
variant = importlib.util.module_from_spec(spec)
spec.loader.exec_module(variant)
ok = True
for rows, split in [
    (512, None),
    (256, None),
    (128, None),
    (64, None),
    (32, None),
    (8, None),
    (512, True),
    (64, False),
]:
    for slot, bucket in [(70, 128), (184, 192), (300, 320)]:
        a, b = run(base, rows, 57, slot, bucket, split), run(new, rows, 57, slot, bucket, split)
        c = run(variant, rows, 57, slot, bucket, split)
        n_lib = (a[0] != b[0]).sum().item()
        n_var = (a[0] != c[0]).sum().item()
        print(
            f"  of {a[0].numel()} outputs: lib differs in {n_lib}, explicit-acc variant in {n_var}; caches equal "
            f"{torch.equal(a[1], b[1])} {torch.equal(a[1], c[1])}"
        )
        same = torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        ok &= same
        diff = (a[0].float() - b[0].float()).abs().max().item()
        print(
            f"rows {rows:>4} split {split!s:>5} slot {slot:>3}: {'same bits' if same else f'DIFFER (max {diff:.3g})'}"
        )
print("all the same bits" if ok else "SOME DIFFER")

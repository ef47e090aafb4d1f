"""Where the first reads of decode attention's loop are issued, in the sm_90 machine code of two kernels."""

import importlib.util
import sys
import types

import grpo_knobs.rollout.kernels as K
import torch

import benchmarks.kernel_resources as KR


def load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    available, torch.cuda.is_available = torch.cuda.is_available, lambda: True  # compiled mode, no GPU needed
    try:
        spec.loader.exec_module(mod)
    finally:
        torch.cuda.is_available = available
    return mod


def memory_ops(mod) -> tuple[int, list[str], list[tuple[int, str]]]:
    cfg = types.SimpleNamespace(num_attention_heads=9, num_key_value_heads=3, hidden_size=576)
    arm = KR.on_h200(KR.parse_arms("default")[0], 512, 3)
    KR.K, orig = mod, KR.K
    try:
        ((fn, args, kw),) = KR.launches([arm], cfg, 512, 192)
        compiled = KR.compile_sm90(fn, args, kw)
    finally:
        KR.K = orig
    registers, lines = KR.sass_of(compiled.asm["cubin"])
    keep = ("LDG", "STG", "LDGSTS", "LDGDEPBAR", "DEPBAR", "BAR", "EXIT")
    ops = [
        (i, line) for i, line in enumerate(lines) if line.split()[1 if line.startswith("@") else 0].startswith(keep)
    ]
    return registers, lines, ops


for label, mod in (("library", K), ("early", load(sys.argv[1], "kernels_early"))):
    registers, lines, ops = memory_ops(mod)
    first_async = next(i for i, line in ops if "LDGSTS" in line)
    print(f"== {label}: {registers} registers, {len(lines)} instructions; first LDGSTS at {first_async}")
    for i, line in ops:
        if i <= first_async:
            print(f"{i:5d} {line[:100]}")


def probe_ops(path: str, early: bool, peel: bool, prefetch: int = 0):
    mod = load(path, "attn_probe")
    recorded = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kw: recorded.append((args, kw))

    kernel, mod._probe_kernel = mod._probe_kernel, Recorder()
    bf16 = lambda *shape: torch.zeros(*shape, dtype=torch.bfloat16)  # noqa: E731
    long1, rows = torch.zeros(1, dtype=torch.long), torch.zeros(512, dtype=torch.long)
    kv = bf16(2, 512, 3, 256, 64)
    mod.rotary_attention(
        bf16(512, 15 * 64),
        bf16(256, 64),
        bf16(256, 64),
        rows,
        long1,
        long1,
        kv[0],
        kv[1],
        192,
        0.125,
        bf16(512, 576),
        share=rows,
        early=early,
        peel=peel,
        prefetch=prefetch,
        stream=bf16(512, 576),
        eps=1e-5,
    )
    ((args, kw),) = recorded
    registers, lines = KR.sass_of(KR.compile_sm90(kernel, args, kw).asm["cubin"])
    keep = ("LDG", "STG", "LDGSTS", "BAR", "CCTL")
    ops = [
        (i, line) for i, line in enumerate(lines) if line.split()[1 if line.startswith("@") else 0].startswith(keep)
    ]
    first_async = next(i for i, line in ops if "LDGSTS" in line)
    print(f"== probe early={early} peel={peel} prefetch={prefetch}: {registers} registers, {len(lines)} instructions")
    for i, line in ops:
        if i <= first_async:
            print(f"{i:5d} {line[:100]}")


if len(sys.argv) > 2:
    for early, peel, prefetch in ((False, False, 0), (True, False, 0), (True, True, 0), (True, False, 64)):
        probe_ops(sys.argv[2], early, peel, prefetch)

"""The fused decode kernels compile for a GPU, checked on a machine without one.

Triton's interpreter (which tests/test_kernels.py uses on CPU) runs kernels as Python and skips the
compiler's type checks, so a kernel can pass there and still fail to compile on the GPU (a name bound
to tensors of two shapes in the branches of an `if` did exactly that). Triton compiles ahead of time
for a named target without a driver, so these tests take each kernel through the real compiler down
to a cubin for an H100/H200 (sm_90), with the shapes SmolLM2-135M, Qwen2.5-1.5B and the tests' tiny model
give it.
"""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

# head_dim D, query heads Hq, KV heads Hkv, hidden H, MLP width I, vocabulary V (config.json of each model)
MODELS = {
    "tiny-random": dict(D=16, n_q=4, n_kv=2, H=64, I=128, V=49152),  # the CUDA tests' model: products of K = 16
    "smollm2-135m": dict(D=64, n_q=9, n_kv=3, H=576, I=1536, V=49152),
    "qwen2.5-1.5b": dict(D=128, n_q=12, n_kv=2, H=1536, I=8960, V=151936),
}

SCRIPT = textwrap.dedent("""
    import json, sys
    from grpo_knobs.rollout import kernels as K  # first: it decides interpreted or compiled
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    # Each launch wrapper runs as the decoder calls it, with a recorder in place of its kernel, so the
    # constexprs and argument types compiled below are the wrappers' own.
    launches = []

    class Recorder:
        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append((self.fn, args, kw))

    for name in ("_add_rms_norm_kernel", "_rotary_attention_kernel", "_silu_mul_kernel", "_sample_partial_kernel",
                 "_sample_combine_kernel", "_linear_kernel"):
        setattr(K, name, Recorder(getattr(K, name)))

    m = json.loads(sys.argv[1])
    B, D, n_q, n_kv, H, I, V, C = 4, m["D"], m["n_q"], m["n_kv"], m["H"], m["I"], m["V"], 320
    bf16 = lambda *shape: torch.zeros(*shape, dtype=torch.bfloat16)  # noqa: E731
    long1 = torch.zeros(1, dtype=torch.long)
    x = bf16(B, H)
    K.add_rms_norm(x, bf16(B, H), bf16(H), 1e-5, bf16(B, H))
    kv = bf16(2, B, n_kv, C, D)
    counts = torch.zeros(4096, dtype=torch.int32)
    for kv_len in (64, C):
        for split in (False, True):  # at C, split attention: five 64-slot pieces and the in-order combine
            K.rotary_attention(bf16(B, (n_q + 2 * n_kv) * D), bf16(C, D), bf16(C, D), torch.zeros(B, dtype=torch.long),
                               long1, long1, kv[0], kv[1], kv_len, 0.125,
                               bf16(B, n_q * D), split=split, counts=counts)
    for split in (False, True):  # rotary_attention with 64-bit cache offsets and prompts shared between rows
        K.rotary_attention(bf16(B, (n_q + 2 * n_kv) * D), bf16(C, D), bf16(C, D), torch.zeros(B, dtype=torch.long),
                           long1, long1, kv[0], kv[1], C, 0.125, bf16(B, n_q * D), split=split, counts=counts,
                           share=torch.zeros(B, dtype=torch.long), wide=True)
    K.silu_mul(bf16(B, 2 * I), bf16(B, I))
    keys, tok, lp = torch.zeros(B, dtype=torch.long), torch.zeros(B, dtype=torch.long), torch.zeros(B)
    for greedy in (False, True):
        K.sample(bf16(B, V), torch.ones(1), keys, long1, greedy, tok, lp)
    K.sample_and_record(bf16(B, V), torch.ones(1), keys, long1, False, tok, lp, torch.zeros(B, dtype=torch.bool),
                        torch.zeros(2, dtype=torch.long), 2, torch.zeros(B, C, dtype=torch.long), torch.zeros(B, C))
    wqkv = bf16((n_q + 2 * n_kv) * D, H)
    K.embed_norm_linear(torch.zeros(B, dtype=torch.long), bf16(V, H), x, bf16(H), 1e-5, wqkv, None,
                        bf16(B, wqkv.shape[0]), counts)
    K.norm_linear(x, bf16(H), 1e-5, wqkv, bf16(wqkv.shape[0]), bf16(B, wqkv.shape[0]), counts)  # a q|k|v bias
    K.linear_add(bf16(B, n_q * D), bf16(H, n_q * D), x, counts=counts)
    K.linear_add(bf16(B, I), bf16(H, I), x, counts=counts, SPLIT_K=4)  # K split, the in-order combine

    TYPES = {torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.int64: "*i64", torch.int32: "*i32",
             torch.bool: "*i1"}
    LAUNCH_OPTIONS = ("num_warps", "num_stages")

    def arg_type(value):
        if isinstance(value, torch.Tensor):
            return TYPES[value.dtype]
        return "i1" if isinstance(value, bool) else "i32" if isinstance(value, int) else "fp32"

    target = GPUTarget("cuda", 90, 32)
    for fn, args, kw in launches:
        constexprs = {k: v for k, v in kw.items() if k not in LAUNCH_OPTIONS}
        options = {k: v for k, v in kw.items() if k in LAUNCH_OPTIONS}
        signature = dict(zip(fn.arg_names, map(arg_type, args)), **{k: "constexpr" for k in constexprs})
        compiled = triton.compile(ASTSource(fn, signature, constexprs=constexprs), target=target, options=options)
        assert "cubin" in compiled.asm, fn.__name__
        print(fn.__name__, "ok")
""")


@pytest.mark.parametrize("model", sorted(MODELS))
def test_fused_kernels_compile_for_sm90(model):
    import json

    env = dict(os.environ, TRITON_INTERPRET="0")  # the real compiler, not the interpreter conftest selects
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(MODELS[model])], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [
        f"{name} ok"
        for name in ("_add_rms_norm_kernel",)
        + ("_rotary_attention_kernel",) * 6
        + ("_silu_mul_kernel",)
        + ("_sample_partial_kernel", "_sample_combine_kernel") * 3
        + ("_linear_kernel",) * 4
    ]

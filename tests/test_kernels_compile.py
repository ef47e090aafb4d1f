"""The fused decode kernels compile for a GPU, checked on a machine without one.

Triton's interpreter (which tests/test_kernels.py uses on CPU) runs kernels as Python and skips the
compiler's type checks, so a kernel can pass there and still fail to compile on the GPU (a name bound
to tensors of two shapes in the branches of an `if` did exactly that). Triton compiles ahead of time
for a named target without a driver, so these tests take each kernel through the real compiler down
to a cubin for an H100/H200 (sm_90), with the shapes SmolLM2-135M and Qwen2.5-1.5B give it.
"""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

# head_dim D, query heads Hq, KV heads Hkv, hidden H, MLP width I, vocabulary V (config.json of each model)
MODELS = {"smollm2-135m": dict(D=64, n_q=9, n_kv=3, H=576, I=1536, V=49152),
          "qwen2.5-1.5b": dict(D=128, n_q=12, n_kv=2, H=1536, I=8960, V=151936)}

SCRIPT = textwrap.dedent("""
    import json, sys
    from grpo_knobs.rollout import kernels as K  # first: it decides interpreted or compiled
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    m = json.loads(sys.argv[1])
    D, G = m["D"], m["n_q"] // m["n_kv"]
    p, i32 = "*bf16", "i32"
    cases = {
        "add_rms_norm": (K._add_rms_norm_kernel,
                         dict(x_ptr=p, delta_ptr=p, w_ptr=p, h_ptr=p, n_cols=i32, eps="fp32"),
                         [dict(HAS_DELTA=d, BLOCK=triton.next_power_of_2(m["H"])) for d in (False, True)]),
        "rotary_cache_write": (K._rotary_cache_kernel,
                               dict(qkv_ptr=p, cos_ptr=p, sin_ptr=p, q_ptr=p, k_ptr=p, v_ptr=p, slot_ptr="*i64",
                                    stride_row=i32, stride_head=i32, stride_slot=i32, n_q=i32, n_kv=i32),
                               [dict(D=D, HALF=D // 2)]),
        "decode_attention": (K._decode_attention_kernel,
                             dict(q_ptr=p, k_ptr=p, v_ptr=p, valid_ptr="*i1", o_ptr=p, scale="fp32",
                                  stride_row=i32, stride_head=i32, stride_slot=i32, stride_valid=i32, n_q=i32),
                             [dict(KV_LEN=kv, G=G, G_PAD=max(triton.next_power_of_2(G), 16), D=D, BLOCK_K=64,
                                   PRECISION="tf32") for kv in (64, 320)]),
        "silu_mul": (K._silu_mul_kernel, dict(gu_ptr=p, out_ptr=p, n=i32), [dict(BLOCK=1024)]),
        "sample": (K._sample_kernel, dict(logits_ptr=p, inv_temp_ptr="*fp32", seed_ptr="*i64", step_ptr="*i64",
                                          tok_ptr="*i64", lp_ptr="*fp32", stride_row=i32),
                   [dict(V=m["V"], GREEDY=g, BLOCK=4096) for g in (False, True)]),
    }
    target = GPUTarget("cuda", 90, 32)
    for name, (fn, sig, variants) in cases.items():
        for constexprs in variants:
            full = dict(sig, **{k: "constexpr" for k in constexprs})
            compiled = triton.compile(ASTSource(fn, full, constexprs=constexprs), target=target)
            assert "cubin" in compiled.asm, name
        print(name, "ok")
""")


@pytest.mark.parametrize("model", sorted(MODELS))
def test_fused_kernels_compile_for_sm90(model):
    import json

    env = dict(os.environ, TRITON_INTERPRET="0")  # the real compiler, not the interpreter conftest selects
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(MODELS[model])], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["add_rms_norm", "ok", "rotary_cache_write", "ok", "decode_attention", "ok",
                                   "silu_mul", "ok", "sample", "ok"]

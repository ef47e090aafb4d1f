"""Compile the prefetch variants of decode attention and silu_mul for sm_90 on a machine without a GPU."""

import os
import sys

os.environ["TRITON_INTERPRET"] = "0"  # the real compiler, for a named target
sys.path.insert(0, "probe")

import pf_kernels as K  # noqa: E402
import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

TYPES = {torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.int64: "*i64", torch.int32: "*i32"}


def compile90(fn, args, kw):
    params = {p.name: p for p in fn.params}
    options = {k: v for k, v in kw.items() if k in ("num_warps", "num_stages")}
    named = dict(zip(fn.arg_names, args)) | {k: v for k, v in kw.items() if k not in options}
    sig, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        if name not in named:
            named[name] = params[name].default
        v = named[name]
        if params[name].is_constexpr or v is None:
            sig[name] = "constexpr"
            constexprs[name] = v
        else:
            sig[name] = TYPES[v.dtype] if isinstance(v, torch.Tensor) else "i32" if isinstance(v, int) else "fp32"
            if isinstance(v, torch.Tensor) or (type(v) is int and v % 16 == 0):
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn, sig, constexprs=constexprs, attrs=attrs)
    return K.triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


rec = []


class R:
    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        return lambda *a, **k: rec.append((self.fn, a, k))


def bf(*shape):
    return torch.zeros(*shape, dtype=torch.bfloat16)


B, nq, nkv, D, C, kv_len = 512, 9, 3, 64, 512, 320
long1, rows = torch.zeros(1, dtype=torch.long), torch.zeros(B, dtype=torch.long)
kv = bf(2, B, nkv, C, D)
wo, wgu, wd, wqkv = bf(576, 576), bf(3072, 576), bf(576, 1536), bf(960, 576)
ra, sm = K._rotary_attention_kernel, K._silu_mul_kernel
K._rotary_attention_kernel, K._silu_mul_kernel = R(ra), R(sm)
for where in (0, 1, 2):
    for pol in (0, 1):
        K.rotary_attention(
            bf(B, (nq + 2 * nkv) * D),
            bf(C, D),
            bf(C, D),
            rows,
            long1,
            long1,
            kv[0],
            kv[1],
            kv_len,
            0.125,
            bf(B, nq * D),
            share=rows,
            split=False,
            stream=bf(B, 576),
            eps=1e-5,
            bias=None,
            prefetch=(wo, wgu, wd),
            pf_where=where,
            pf_policy=pol,
        )
        K.silu_mul(
            bf(B, 3072),
            bf(B, 1536),
            stream=bf(B, 576),
            eps=1e-5,
            prefetch=(wqkv,),
            pf_where=min(where, 1),
            pf_policy=pol,
        )
for fn, a, k in rec:
    c = compile90(fn, a, k)
    ptx = c.asm["ptx"]
    pf = {kk: v for kk, v in k.items() if kk.startswith("PF_")}
    print(fn.__name__, pf, "prefetch instrs:", ptx.count("prefetch.global"), "shared:", c.metadata.shared)

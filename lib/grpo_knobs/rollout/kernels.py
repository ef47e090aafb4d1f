"""Fused Triton kernels for one decode step of a llama-style layer (the static decoder's `fused` mode).

A decode step of a small model is a few hundred tiny kernels; their count, not bytes moved, sets
its time (../shared/DEVICE.md). Per layer these kernels replace the norm, rotary, cache-write,
attention and activation chains with five launches around four GEMMs:

    add_rms_norm -> qkv GEMM -> rotary_cache_write -> decode_attention -> o GEMM
    -> add_rms_norm -> gate_up GEMM -> silu_mul -> down GEMM

and after the last layer, the lm_head GEMM -> sample (one pass over the logits).

Every kernel reads its scalars (cache slot) from device memory, so one CUDA graph replays it.
Arithmetic is float32 inside a kernel; values are rounded to the storage dtype where the
transformers modules round them (the residual stream, the normalised hidden state, the
activation), so the fused step tracks the modules' numerics closely.

Without CUDA the kernels run in Triton's interpreter, which is how the CPU tests check them.
"""

from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available():
    # Triton picks compiled or interpreted kernels when it is first imported.
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("the fused decode kernels need a GPU, or Triton's interpreter on CPU: set "
                           "TRITON_INTERPRET=1 before anything imports triton (tests/conftest.py does), "
                           "or use fast=True, which runs the same decoder without these kernels.")
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _add_rms_norm_kernel(x_ptr, delta_ptr, w_ptr, h_ptr, n_cols, eps,
                         HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    if HAS_DELTA:
        d = tl.load(delta_ptr + row * n_cols + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(x_ptr.dtype.element_ty)  # the residual stream is stored
        tl.store(x_ptr + row * n_cols + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    normed = (xf * inv).to(h_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(h_ptr + row * n_cols + cols, (normed * w).to(h_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float,
                 out: torch.Tensor) -> torch.Tensor:
    """x += delta (in place, when given); out = RMSNorm(x) * weight. x, delta, out: [B, H] contiguous."""
    rows, cols = x.shape
    _add_rms_norm_kernel[(rows,)](x, delta if delta is not None else x, weight, out, cols, eps,
                                  HAS_DELTA=delta is not None, BLOCK=triton.next_power_of_2(cols))
    return out


@triton.jit
def _rotary_cache_kernel(qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, slot_ptr,
                         stride_row, stride_head, stride_slot, n_q, n_kv,
                         D: tl.constexpr, HALF: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(slot_ptr)
    src = qkv_ptr + b * (n_q + 2 * n_kv) * D + h * D
    # Triton needs a name bound in both branches of an `if` to have one type, so each branch
    # has its own names: the rotated halves are [HALF] wide, the copied value head [D].
    if h < n_q + n_kv:  # query or key head: rotate (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)
        half = tl.arange(0, HALF)
        x1 = tl.load(src + half).to(tl.float32)
        x2 = tl.load(src + HALF + half).to(tl.float32)
        c1 = tl.load(cos_ptr + b * D + half).to(tl.float32)
        c2 = tl.load(cos_ptr + b * D + HALF + half).to(tl.float32)
        s1 = tl.load(sin_ptr + b * D + half).to(tl.float32)
        s2 = tl.load(sin_ptr + b * D + HALF + half).to(tl.float32)
        o1 = x1 * c1 - x2 * s1
        o2 = x2 * c2 + x1 * s2
        if h < n_q:
            q_dst = q_ptr + (b * n_q + h) * D
            tl.store(q_dst + half, o1.to(q_ptr.dtype.element_ty))
            tl.store(q_dst + HALF + half, o2.to(q_ptr.dtype.element_ty))
        else:
            k_dst = k_ptr + b * stride_row + (h - n_q) * stride_head + slot * stride_slot
            tl.store(k_dst + half, o1.to(k_ptr.dtype.element_ty))
            tl.store(k_dst + HALF + half, o2.to(k_ptr.dtype.element_ty))
    else:  # value head: copied into the cache unchanged
        full = tl.arange(0, D)
        v_dst = v_ptr + b * stride_row + (h - n_q - n_kv) * stride_head + slot * stride_slot
        tl.store(v_dst + full, tl.load(src + full).to(v_ptr.dtype.element_ty))


def rotary_cache_write(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_out: torch.Tensor,
                       k_cache: torch.Tensor, v_cache: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """Rotate q and k of one decode token and write k, v into cache slot ``slot``.

    qkv: [B, (Hq + 2 Hkv) * D]; cos, sin: [B, D]; q_out: [B, Hq, D];
    k_cache, v_cache: [rows >= B, Hkv, C, D] with a contiguous last dimension; slot: [1] long.
    """
    B, n_q, D = q_out.shape
    n_kv = k_cache.shape[1]
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    _rotary_cache_kernel[(B, n_q + 2 * n_kv)](qkv, cos, sin, q_out, k_cache, v_cache, slot,
                                              k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                                              n_q, n_kv, D=D, HALF=D // 2)
    return q_out


@triton.jit
def _decode_attention_kernel(q_ptr, k_ptr, v_ptr, valid_ptr, o_ptr, scale,
                             stride_row, stride_head, stride_slot, stride_valid, n_q, KV_LEN: tl.constexpr,
                             G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BLOCK_K: tl.constexpr,
                             PRECISION: tl.constexpr):
    b = tl.program_id(0)
    j = tl.program_id(1)  # KV head; it serves query heads j*G .. j*G + G - 1
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D)
    # The G query heads of one KV head form the rows of a [G_PAD, D] tile, padded to the 16 rows a
    # tensor-core product needs, so both products below are tl.dot: MMA instructions with their
    # accumulators in registers, rather than broadcast [G, K, D] products that spill.
    q = tl.load(q_ptr + (b * n_q + j * G + g[:, None]) * D + d[None, :],
                mask=(g < G)[:, None], other=0.0)  # [G_PAD, D], storage dtype
    m_i = tl.full([G_PAD], -1.0e30, tl.float32)  # running max (finite: a fully masked block stays harmless)
    l_i = tl.zeros([G_PAD], tl.float32)  # running softmax denominator
    acc = tl.zeros([G_PAD, D], tl.float32)
    k_base = k_ptr + b * stride_row + j * stride_head
    v_base = v_ptr + b * stride_row + j * stride_head
    for start in range(0, KV_LEN, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        in_range = ks < KV_LEN
        ok = (tl.load(valid_ptr + b * stride_valid + ks, mask=in_range, other=0) != 0) & in_range  # [BLOCK_K]
        k = tl.load(k_base + ks[:, None] * stride_slot + d[None, :], mask=in_range[:, None], other=0.0)  # [BLOCK_K, D]
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [G_PAD, BLOCK_K] float32
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])  # [G_PAD, BLOCK_K]
        v = tl.load(v_base + ks[:, None] * stride_slot + d[None, :], mask=in_range[:, None], other=0.0)  # [BLOCK_K, D]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)  # [G_PAD, D]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + (b * n_q + j * G + g[:, None]) * D + d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=(g < G)[:, None])


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, valid: torch.Tensor,
                     kv_len: int, scale: float, out: torch.Tensor, block_k: int = 64) -> torch.Tensor:
    """Grouped-query attention of one decode token over cache slots < kv_len whose ``valid`` is set.

    q: [B, Hq, D]; k_cache, v_cache: [rows >= B, Hkv, C, D]; valid: [rows, C] bool;
    out: [B, Hq * D] (heads concatenated, as o_proj expects). The token's own slot must be valid.
    Probabilities are rounded to the cache dtype before the value product, as flash attention does;
    float32 inputs multiply in full precision (no TF32), so the CPU and GPU tests compare exactly.
    """
    B, n_q, D = q.shape
    n_kv = k_cache.shape[1]
    G = n_q // n_kv
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1 and valid.stride(-1) == 1
    # kv_len is a compile-time constant: the decoder uses a few cache-length buckets, each
    # captured in its own graph, so each compiles once.
    _decode_attention_kernel[(B, n_kv)](q, k_cache, v_cache, valid, out, scale,
                                        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), valid.stride(0),
                                        n_q, KV_LEN=kv_len, G=G, G_PAD=max(triton.next_power_of_2(G), 16), D=D, BLOCK_K=block_k,
                                        PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
    return out


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    gate = tl.load(gu_ptr + row * 2 * n + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * 2 * n + n + cols, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * n + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor, out: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """out = silu(gate) * up for gate_up = [gate | up]: [B, 2I] -> [B, I]."""
    B, n = out.shape
    _silu_mul_kernel[(B, triton.cdiv(n, block))](gate_up, out, n, BLOCK=block)
    return out


@triton.jit
def _sample_kernel(logits_ptr, inv_temp_ptr, seed_ptr, step_ptr, tok_ptr, lp_ptr, stride_row,
                   V: tl.constexpr, GREEDY: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    inv_t = tl.load(inv_temp_ptr)
    seed = tl.load(seed_ptr) + tl.load(step_ptr)  # a fresh Philox key per step, read from device memory
    m = -float("inf")  # running max of z
    total = 0.0  # running sum of exp(z - m)
    best_key = -float("inf")
    best_idx = 0
    best_z = 0.0
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        z = tl.load(logits_ptr + row * stride_row + cols, mask=cols < V, other=-float("inf")).to(tl.float32) * inv_t
        m_new = tl.maximum(m, tl.max(z, axis=0))
        total = total * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), axis=0)
        m = m_new
        if GREEDY:
            key = z
        else:
            # Gumbel-max: argmax(z - log E), E = -log U ~ Exp(1), is an exact draw from softmax(z).
            # U = 0 gives E = inf and a key of -inf: that token is not drawn, at probability 2^-32.
            key = z - tl.log(-tl.log(tl.rand(seed, row * V + cols)))
        i = tl.argmax(key, axis=0)
        k = tl.max(key, axis=0)
        better = k > best_key
        best_z = tl.where(better, tl.sum(tl.where(cols == start + i, z, 0.0), axis=0), best_z)
        best_idx = tl.where(better, start + i, best_idx)
        best_key = tl.where(better, k, best_key)
    tl.store(tok_ptr + row, best_idx.to(tl.int64))
    tl.store(lp_ptr + row, best_z - m - tl.log(total))


def sample(logits: torch.Tensor, inv_temperature: torch.Tensor, seed: torch.Tensor, step: torch.Tensor,
           greedy: bool, tokens: torch.Tensor, logprobs: torch.Tensor, block: int | None = None):
    """One token per row from softmax(logits * inv_temperature), and its log-prob, in one pass over the logits.

    logits: [B, V] (any float dtype; read once, math in float32); inv_temperature, seed, step: [1] on the
    device (read by the kernel, so a captured graph replays with new values); tokens: [B] long,
    logprobs: [B] float32 outputs. The draw is Gumbel-max with Philox noise keyed by seed + step: the same
    distribution as ``hf.sample_tokens``, from a different random stream. Greedy takes argmax(z) and
    reports log-probs at the given temperature (the decoder sets it to 1).
    """
    B, V = logits.shape
    assert logits.stride(-1) == 1
    if block is None:  # the interpreter's cost is per operation, not per element: one block per row there
        block = triton.next_power_of_2(V) if os.environ.get("TRITON_INTERPRET") == "1" else 4096
    # V is a compile-time constant (one vocabulary per model): Triton's interpreter, which the CPU
    # tests use, cannot loop to a runtime bound.
    _sample_kernel[(B,)](logits, inv_temperature, seed, step, tokens, logprobs, logits.stride(0),
                         V=V, GREEDY=greedy, BLOCK=min(block, triton.next_power_of_2(V)))
    return tokens, logprobs

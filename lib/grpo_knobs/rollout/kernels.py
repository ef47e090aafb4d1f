"""Fused Triton kernels for one decode step of a llama-style layer (the static decoder's `fused` mode).

A decode step of a small model is a few hundred tiny kernels; their count, not the bytes they move,
sets its time, most of all in a collection's tail, where a few long responses keep the step going at
a narrow width and every launch costs the same whatever the width. Per layer these kernels replace
the norm, rotary, cache-write, attention and activation chains with four launches around four GEMMs:

    qkv GEMM -> rotary_attention (rotary, cache write, attention) -> o GEMM
    -> add_rms_norm -> gate_up GEMM -> silu_mul -> down GEMM -> add_rms_norm

The step opens with embed_rms_norm (the token's embedding row and the first norm) and closes with the
lm_head GEMM and sample_and_record: one pass over the logits split across programs, then a combine
that also keeps the decoder's books (pad for finished rows, the output column, the stop check).
Rotary cos/sin come from a per-position table built once per cache.

Every kernel reads its scalars (the step, the slot and position it implies) from device memory, so
one CUDA graph replays it. Arithmetic is float32 inside a kernel; values are rounded to the storage
dtype where the transformers modules round them (the residual stream, the normalised hidden state,
q and k, the activation), so the fused step tracks the modules' numerics closely.

Without CUDA the kernels run in Triton's interpreter, which is how the CPU tests check them.
"""

from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available():
    # Triton picks compiled or interpreted kernels when it is first imported.
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "the fused decode kernels need a GPU, or Triton's interpreter on CPU: set "
            "TRITON_INTERPRET=1 before anything imports triton (tests/conftest.py does), "
            "or use fast=True, which runs the same decoder without these kernels."
        )
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _add_rms_norm_kernel(
    x_ptr,
    delta_ptr,
    w_ptr,
    h_ptr,
    tok_ptr,
    emb_ptr,
    n_cols,
    eps,
    HAS_DELTA: tl.constexpr,
    GATHER: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    if GATHER:  # the residual stream starts as the token's embedding row
        tok = tl.load(tok_ptr + row)
        x = tl.load(emb_ptr + tok * n_cols + cols, mask=mask, other=0.0).to(x_ptr.dtype.element_ty)
        tl.store(x_ptr + row * n_cols + cols, x, mask=mask)
    else:
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


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float, out: torch.Tensor
) -> torch.Tensor:
    """x += delta (in place, when given); out = RMSNorm(x) * weight. x, delta, out: [B, H] contiguous."""
    rows, cols = x.shape
    _add_rms_norm_kernel[(rows,)](
        x,
        delta if delta is not None else x,
        weight,
        out,
        x,  # no token ids: GATHER is off
        x,
        cols,
        eps,
        HAS_DELTA=delta is not None,
        GATHER=False,
        BLOCK=triton.next_power_of_2(cols),
    )
    return out


def embed_rms_norm(
    tokens: torch.Tensor, embedding: torch.Tensor, weight: torch.Tensor, eps: float, x: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """x = embedding[tokens] (the residual stream); out = RMSNorm(x) * weight: one launch for the lookup and the
    first layer's norm. tokens: [>= B] long; embedding: [V, H]; x, out: [B, H] contiguous."""
    rows, cols = x.shape
    _add_rms_norm_kernel[(rows,)](
        x,
        x,
        weight,
        out,
        tokens,
        embedding,
        cols,
        eps,
        HAS_DELTA=False,
        GATHER=True,
        BLOCK=triton.next_power_of_2(cols),
    )
    return out


@triton.jit
def _rotary_attention_kernel(
    qkv_ptr,
    cos_ptr,
    sin_ptr,
    pos0_ptr,
    slot0_ptr,
    step_ptr,
    k_ptr,
    v_ptr,
    valid_ptr,
    o_ptr,
    scale,
    stride_row,
    stride_head,
    stride_slot,
    stride_valid,
    KV_LEN: tl.constexpr,
    N_Q: tl.constexpr,
    N_KV: tl.constexpr,
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    D: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # Program (b, j): row b's KV head j and the G query heads it serves. It rotates them at the row's
    # position, writes this token's key and value into the cache, attends over the cache before it, and
    # adds this token's own term from registers (so nothing it wrote needs to be read back).
    b = tl.program_id(0)
    j = tl.program_id(1)
    step = tl.load(step_ptr)
    prompt_end = tl.load(slot0_ptr) + 1  # slots below hold the left-padded prompt; `valid` marks its tokens
    slot = prompt_end - 1 + step  # this token's cache slot
    pos = tl.load(pos0_ptr + b) + step  # its rotary position
    d = tl.arange(0, D)
    # rotate_half pairs element d with d +- D/2, negated in the first half: x cos + (+-x[partner]) sin
    partner = (d + HALF) % D
    sign = tl.where(d < HALF, -1.0, 1.0)[None, :]  # [1, D]
    cos = tl.load(cos_ptr + pos * D + d).to(tl.float32)[None, :]  # [1, D]
    sin = tl.load(sin_ptr + pos * D + d).to(tl.float32)[None, :]
    src = qkv_ptr + b * (N_Q + 2 * N_KV) * D
    g = tl.arange(0, G_PAD)[:, None]
    is_q = g < G
    # q of the G query heads and k of head j, rotated and rounded to the storage dtype as stored q and k are
    x = tl.load(src + (j * G + g) * D + d[None, :], mask=is_q, other=0.0).to(tl.float32)  # [G_PAD, D]
    x_p = tl.load(src + (j * G + g) * D + partner[None, :], mask=is_q, other=0.0).to(tl.float32)
    q = (x * cos + sign * x_p * sin).to(k_ptr.dtype.element_ty)  # [G_PAD, D]
    y = tl.load(src + (N_Q + j) * D + d[None, :]).to(tl.float32)  # [1, D]
    y_p = tl.load(src + (N_Q + j) * D + partner[None, :]).to(tl.float32)
    k_new = (y * cos + sign * y_p * sin).to(k_ptr.dtype.element_ty)  # [1, D]
    v_new = tl.load(src + (N_Q + N_KV + j) * D + d).to(v_ptr.dtype.element_ty)  # [D]
    k_base = k_ptr + b * stride_row + j * stride_head
    v_base = v_ptr + b * stride_row + j * stride_head
    tl.store(k_base + slot * stride_slot + d[None, :], k_new)
    tl.store(v_base + slot * stride_slot + d, v_new)
    m_i = tl.full([G_PAD], -1.0e30, tl.float32)  # running max (finite: a fully masked block stays harmless)
    l_i = tl.zeros([G_PAD], tl.float32)  # running softmax denominator
    acc = tl.zeros([G_PAD, D], tl.float32)
    for start in range(0, KV_LEN, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        in_range = ks < KV_LEN
        in_prompt = ks < prompt_end
        marked = tl.load(valid_ptr + b * stride_valid + ks, mask=in_range & in_prompt, other=0) != 0
        ok = in_range & (ks < slot) & (marked | ~in_prompt)  # [BLOCK_K]: real prompt tokens and earlier decodes
        k = tl.load(k_base + ks[:, None] * stride_slot + d[None, :], mask=in_range[:, None], other=0.0)  # [BLOCK_K, D]
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # [G_PAD, BLOCK_K] float32
        s = tl.where(ok[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])  # [G_PAD, BLOCK_K]
        v = tl.load(v_base + ks[:, None] * stride_slot + d[None, :], mask=in_range[:, None], other=0.0)  # [BLOCK_K, D]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)  # [G_PAD, D]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    # this token attends to itself
    s_self = tl.sum(q.to(tl.float32) * k_new.to(tl.float32), axis=1) * scale  # [G_PAD]
    m_new = tl.maximum(m_i, s_self)
    alpha = tl.exp(m_i - m_new)
    p_self = tl.exp(s_self - m_new).to(v_ptr.dtype.element_ty).to(tl.float32)  # rounded as the block products' p
    acc = acc * alpha[:, None] + p_self[:, None] * v_new.to(tl.float32)[None, :]
    l_i = l_i * alpha + tl.exp(s_self - m_new)
    out = acc / l_i[:, None]
    tl.store(o_ptr + (b * N_Q + j * G + g) * D + d[None, :], out.to(o_ptr.dtype.element_ty), mask=is_q)


def rotary_attention(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    pos0: torch.Tensor,
    slot0: torch.Tensor,
    step: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    valid: torch.Tensor,
    kv_len: int,
    scale: float,
    out: torch.Tensor,
    block_k: int = 32,
    num_warps: int | None = None,
    num_stages: int = 2,
) -> torch.Tensor:
    """One decode token's rotary embedding, cache write and grouped-query attention, in one launch.

    qkv: [B, (Hq + 2 Hkv) * D], the token's projections; cos, sin: [positions, D] tables; pos0: [>= B] long,
    slot0: [1] long, step: [1] long (on the device): the token of step ``step`` sits at rotary position
    pos0[b] + step and cache slot slot0 + step. k_cache, v_cache: [rows >= B, Hkv, C, D] with a contiguous
    last dimension. It attends to slots < kv_len that hold a real prompt token (slots <= slot0, where
    ``valid`` [rows, C] marks them) or an earlier decoded token, then to itself. out: [B, Hq * D] (heads
    concatenated, as o_proj expects). Scores and softmax in float32; q and k rounded to the cache dtype, and
    probabilities before the value product, as flash attention does; float32 inputs multiply in full
    precision, so the CPU and GPU tests compare exactly.
    """
    B = qkv.shape[0]
    n_kv, C, D = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    n_q = out.shape[1] // D
    G = n_q // n_kv
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1 and valid.stride(-1) == 1
    assert cos.is_contiguous() and sin.is_contiguous() and cos.shape[-1] == D and kv_len <= C
    # kv_len is a compile-time constant (Triton's interpreter, which the CPU tests use, cannot loop to a
    # run-time bound): the decoder uses a few cache-length buckets, each captured in its own graph, so each
    # compiles once (and Triton's on-disk cache keeps it). Launch shape: the fastest of a sweep on an H200
    # at SmolLM2-135M's shapes (benchmarks/decode_kernels.py): one warp per 64-wide head and 32-slot
    # blocks, double-buffered.
    _rotary_attention_kernel[(B, n_kv)](
        qkv,
        cos,
        sin,
        pos0,
        slot0,
        step,
        k_cache,
        v_cache,
        valid,
        out,
        scale,
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        valid.stride(0),
        KV_LEN=kv_len,
        N_Q=n_q,
        N_KV=n_kv,
        G=G,
        G_PAD=max(triton.next_power_of_2(G), 16),
        D=D,
        HALF=D // 2,
        BLOCK_K=block_k,
        PRECISION="ieee" if qkv.dtype == torch.float32 else "tf32",
        num_warps=num_warps or max(1, D // 64),
        num_stages=num_stages,
    )
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
def _race_tile(row_ptr, start, j, inv_t, u, m, s, key, idx, z, V: tl.constexpr, GREEDY: tl.constexpr):
    """Fold columns start + j into per-lane race state: running max m and sum s of exp(z - m), and the
    best Gumbel key with its column and z. All elementwise: the block reduces once, at the end."""
    cols = start + j
    z_new = tl.load(row_ptr + cols, mask=cols < V, other=-float("inf")).to(tl.float32) * inv_t
    if GREEDY:
        key_new = z_new
    else:
        # argmax(z - log E), E = -log U ~ Exp(1), is an exact draw from softmax(z). U = 0 gives
        # E = inf and a key of -inf: that token is not drawn, at probability 2^-32.
        key_new = z_new - tl.log(-tl.log(u))
    m_new = tl.maximum(m, z_new)  # m starts finite, so masked columns add exp(-inf) = 0
    s = s * tl.exp(m - m_new) + tl.exp(z_new - m_new)
    better = key_new > key  # a lane's earlier tile keeps ties: its lower column
    return m_new, s, tl.where(better, key_new, key), tl.where(better, cols, idx), tl.where(better, z_new, z)


@triton.jit
def _sample_partial_kernel(
    logits_ptr,
    inv_temp_ptr,
    keys_ptr,
    step_ptr,
    part_ptr,
    part_idx_ptr,
    stride_row,
    V: tl.constexpr,
    N_BLOCKS: tl.constexpr,
    GREEDY: tl.constexpr,
    QUARTER: tl.constexpr,
):
    # Program (row, blk) races columns blk * 4Q .. blk * 4Q + 4Q - 1 as four quarter tiles. Splitting
    # each row over many programs keeps every SM busy, and one Philox evaluation (rand4x) gives all
    # four quarters their uniforms.
    row = tl.program_id(0)
    blk = tl.program_id(1)
    inv_t = tl.load(inv_temp_ptr)
    j = tl.arange(0, QUARTER)
    if GREEDY:
        u0 = tl.zeros([QUARTER], tl.float32)
        u1 = u0
        u2 = u0
        u3 = u0
    else:
        # Philox keyed by the row's own response key; the counter is (column group, token position).
        # So a draw depends on (response, position, column) alone, never on the row's place in the batch.
        philox_key = tl.load(keys_ptr + row)
        step = tl.load(step_ptr)
        u0, u1, u2, u3 = tl.rand4x(philox_key, (step << 32) + blk * QUARTER + j)
    row_ptr = logits_ptr + row * stride_row
    first = blk * 4 * QUARTER
    m = tl.full([QUARTER], -3.0e38, tl.float32)
    s = tl.zeros([QUARTER], tl.float32)
    key = tl.full([QUARTER], -float("inf"), tl.float32)
    idx = tl.zeros([QUARTER], tl.int32) + first + j
    z = tl.zeros([QUARTER], tl.float32)
    m, s, key, idx, z = _race_tile(row_ptr, first, j, inv_t, u0, m, s, key, idx, z, V, GREEDY)
    m, s, key, idx, z = _race_tile(row_ptr, first + QUARTER, j, inv_t, u1, m, s, key, idx, z, V, GREEDY)
    m, s, key, idx, z = _race_tile(row_ptr, first + 2 * QUARTER, j, inv_t, u2, m, s, key, idx, z, V, GREEDY)
    m, s, key, idx, z = _race_tile(row_ptr, first + 3 * QUARTER, j, inv_t, u3, m, s, key, idx, z, V, GREEDY)
    m_max = tl.max(m, axis=0)
    best_key = tl.max(key, axis=0)
    best_idx = tl.min(tl.where(key == best_key, idx, 2147483647), axis=0)  # the lowest column among equal keys
    out = part_ptr + (row * N_BLOCKS + blk) * 4
    tl.store(out, m_max)
    tl.store(out + 1, tl.sum(s * tl.exp(m - m_max), axis=0))
    tl.store(out + 2, best_key)
    tl.store(out + 3, tl.sum(tl.where(idx == best_idx, z, 0.0), axis=0))
    tl.store(part_idx_ptr + row * N_BLOCKS + blk, best_idx)


@triton.jit
def _sample_combine_kernel(
    part_ptr,
    part_idx_ptr,
    tok_ptr,
    lp_ptr,
    done_ptr,
    stop_ptr,
    out_tok_ptr,
    out_lp_ptr,
    step_ptr,
    stride_out,
    pad_id,
    N_BLOCKS: tl.constexpr,
    BLOCKS_PAD: tl.constexpr,
    N_STOP: tl.constexpr,
    RECORD: tl.constexpr,
):
    row = tl.program_id(0)
    k = tl.arange(0, BLOCKS_PAD)
    ok = k < N_BLOCKS
    part = part_ptr + (row * N_BLOCKS + k) * 4
    m = tl.load(part, mask=ok, other=-3.0e38)  # [BLOCKS_PAD]
    s = tl.load(part + 1, mask=ok, other=0.0)
    key = tl.load(part + 2, mask=ok, other=-float("inf"))
    z = tl.load(part + 3, mask=ok, other=0.0)
    idx = tl.load(part_idx_ptr + row * N_BLOCKS + k, mask=ok, other=0)
    m_max = tl.max(m, axis=0)
    total = tl.sum(s * tl.exp(m - m_max), axis=0)
    best = tl.argmax(key, axis=0)  # first of equal keys: the lowest block
    tok = tl.sum(tl.where(k == best, idx, 0), axis=0).to(tl.int64)
    lp = tl.sum(tl.where(k == best, z, 0.0), axis=0) - m_max - tl.log(total)
    if RECORD:
        # The decoder's bookkeeping for this row, in the same launch: a row that already stopped emits pad
        # (log-prob 0); the token goes to output column `step` and is fed to the next step; a stop token ends
        # the row.
        finished = tl.load(done_ptr + row) != 0
        tok = tl.where(finished, pad_id, tok)
        lp = tl.where(finished, 0.0, lp)
        col = tl.load(step_ptr)
        tl.store(out_tok_ptr + row * stride_out + col, tok)
        tl.store(out_lp_ptr + row * stride_out + col, lp)
        stops = tl.load(stop_ptr + tl.arange(0, N_STOP))  # [N_STOP]
        tl.store(done_ptr + row, finished | (tl.sum((stops == tok).to(tl.int32), axis=0) > 0))
    tl.store(tok_ptr + row, tok)
    tl.store(lp_ptr + row, lp)


def sample(
    logits: torch.Tensor,
    inv_temperature: torch.Tensor,
    keys: torch.Tensor,
    step: torch.Tensor,
    greedy: bool,
    tokens: torch.Tensor,
    logprobs: torch.Tensor,
    block: int | None = None,
):
    """One token per row from softmax(logits * inv_temperature), and its log-prob, in one pass over the logits.

    logits: [B, V] (any float dtype; read once, math in float32); keys: [>= B] int64, one Philox key per
    row (``hf.response_keys``: a response's identity, not its row); inv_temperature, step: [1] on the
    device (read by the kernels, so a captured graph replays with new values); tokens: [B] long,
    logprobs: [B] float32 outputs. The draw is Gumbel-max with Philox noise at counter (column, step)
    under the row's key: the same distribution as ``hf.sample_tokens``, from a different random stream
    (fixed by the key, the step and ``block``). Greedy takes argmax(z) and reports
    log-probs at the given temperature (the decoder sets it to 1). Two launches: each row is raced in
    blocks of ``block`` columns by separate programs, then their partial results are combined.
    """
    part, part_idx = _race(logits, inv_temperature, keys, step, greedy, block)
    B, n_blocks = part_idx.shape
    dummy = tokens  # the bookkeeping arguments are not read when RECORD is off
    _sample_combine_kernel[(B,)](
        part,
        part_idx,
        tokens,
        logprobs,
        dummy,
        dummy,
        dummy,
        logprobs,
        step,
        0,
        0,
        N_BLOCKS=n_blocks,
        BLOCKS_PAD=triton.next_power_of_2(n_blocks),
        N_STOP=1,
        RECORD=False,
    )
    return tokens, logprobs


def sample_and_record(
    logits: torch.Tensor,
    inv_temperature: torch.Tensor,
    keys: torch.Tensor,
    step: torch.Tensor,
    greedy: bool,
    tokens: torch.Tensor,
    logprobs: torch.Tensor,
    done: torch.Tensor,
    stop: torch.Tensor,
    pad_id: int,
    out_tokens: torch.Tensor,
    out_logprobs: torch.Tensor,
    block: int | None = None,
):
    """``sample``, plus the decoder's bookkeeping in the combining launch: rows whose ``done`` [>= B] bool is set
    emit ``pad_id`` with log-prob 0; token and log-prob go to column ``step`` of ``out_tokens`` [>= B, C] long and
    ``out_logprobs`` [>= B, C] float32 (one row stride); ``done`` is set where the token is one of ``stop``
    ([S] long, S a power of two; repeat an id to pad). ``tokens`` [>= B] receives the tokens fed to the next step."""
    part, part_idx = _race(logits, inv_temperature, keys, step, greedy, block)
    B, n_blocks = part_idx.shape
    assert out_tokens.stride() == out_logprobs.stride() and out_tokens.stride(-1) == 1
    assert stop.numel() == triton.next_power_of_2(stop.numel())
    _sample_combine_kernel[(B,)](
        part,
        part_idx,
        tokens,
        logprobs,
        done,
        stop,
        out_tokens,
        out_logprobs,
        step,
        out_tokens.stride(0),
        pad_id,
        N_BLOCKS=n_blocks,
        BLOCKS_PAD=triton.next_power_of_2(n_blocks),
        N_STOP=stop.numel(),
        RECORD=True,
    )
    return tokens, logprobs


def _race(logits, inv_temperature, keys, step, greedy: bool, block: int | None):
    """The first launch of a draw: per-block partial races of every row. Returns (part [B, N, 4], part_idx [B, N])."""
    B, V = logits.shape
    assert logits.stride(-1) == 1 and keys.dtype == torch.int64
    if block is None:  # the interpreter's cost is per operation, not per element: one block per row there
        block = triton.next_power_of_2(V) if os.environ.get("TRITON_INTERPRET") == "1" else 2048
    quarter = max(min(block, triton.next_power_of_2(V)) // 4, 1)
    n_blocks = triton.cdiv(V, 4 * quarter)
    part = torch.empty(B, n_blocks, 4, dtype=torch.float32, device=logits.device)  # [B, N, (m, s, key, z)]
    part_idx = torch.empty(B, n_blocks, dtype=torch.int32, device=logits.device)  # [B, N] each block's winner
    # V is a compile-time constant (one vocabulary per model): Triton's interpreter, which the CPU
    # tests use, cannot loop to a runtime bound.
    _sample_partial_kernel[(B, n_blocks)](
        logits,
        inv_temperature,
        keys,
        step,
        part,
        part_idx,
        logits.stride(0),
        V=V,
        N_BLOCKS=n_blocks,
        GREEDY=greedy,
        QUARTER=quarter,
    )
    return part, part_idx

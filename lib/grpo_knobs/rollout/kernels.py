"""Fused Triton kernels for one decode step of a llama-style layer (the static decoder's `fused` mode).

A decode step of a small model is a few hundred tiny kernels; their count and latency, not the bytes they
move, set its time, most of all in a collection's tail, where a few long responses keep the step going at
a narrow width. Per layer, at a wide step, where cuBLAS's products read the residual stream itself (each
norm's weight folded into the product's weights) and the next kernel divides by the row's rms:

    qkv GEMM -> rotary_attention (the row's norm, rotary, cache write, attention) -> o GEMM adding into the
    stream -> gate_up GEMM -> silu_mul (the row's norm, the gate) -> down GEMM adding into the stream

and at a narrow one, where the own GEMMs below (norm_linear, linear_add) take the norms and residual
adds inside them and attention is split over the cache:

    norm_linear (qkv) -> rotary_attention -> linear_add (o) -> norm_linear (gate_up) -> silu_mul
    -> down GEMM adding into the stream

The step opens with the embedding lookup (an index_select at a wide step, inside the first norm_linear at a
narrow one) and closes with the final norm, the lm_head GEMM and sample_and_record: one pass over the logits
split across programs, then a combine that also keeps the decoder's books (pad for finished rows, the output
column, the stop check). Rotary cos/sin come from a per-position table built once per cache. Split launches
(attention over the cache, GEMMs over K) are combined by the last program to finish, in a fixed order, so
results do not depend on scheduling.

Every kernel reads its scalars (the step, the slot and position it implies) from device memory, so
one CUDA graph replays it. Arithmetic is float32 inside a kernel; values are rounded to the storage
dtype where the transformers modules round them (the residual stream, the normalised hidden state,
q and k, the activation, a projection's output before its residual add), so the fused step tracks the
modules' numerics closely. Exceptions: a product added into the stream by cuBLAS's addmm (down_proj at
narrow widths, o_proj and down_proj at wide ones) is rounded once (the sum) rather than twice (the product,
then the sum); and at wide widths the normalised hidden state is never stored, so it is not rounded (the
folded weights are, once each).

Without CUDA the kernels run in Triton's interpreter, which is how the CPU tests check them.
"""

from __future__ import annotations

import functools
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

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # fixed once triton is imported: numpy runs the kernels


def _interpreter_loop_bounds() -> None:
    """Let the interpreter loop to a run-time bound. It holds every scalar as a one-element array and reads a
    ``range`` bound with ``int()`` of it, which numpy 2.4 refuses; this reads the element instead."""
    from triton.runtime import interpreter

    patch = interpreter._patch_lang_tensor
    if getattr(patch, "reads_one_element", False):
        return

    def index(self):
        data = self.handle.data
        if data.size != 1:
            raise TypeError(f"only a scalar can be an index, not a block of shape {data.shape}")
        return int(data.reshape(-1)[0])

    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", index)

    patched.reads_one_element = True
    interpreter._patch_lang_tensor = patched


if INTERPRETED:
    _interpreter_loop_bounds()


@triton.jit
def _add_rms_norm_kernel(x_ptr, delta_ptr, w_ptr, h_ptr, n_cols, eps, HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    if HAS_DELTA:
        d = tl.load(delta_ptr + row * n_cols + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(x_ptr.dtype.element_ty)  # the residual stream is stored
        tl.store(x_ptr + row * n_cols + cols, x, mask=mask)
    xf = x.to(tl.float32)
    normed = (xf * _inv_rms_of(xf, n_cols, eps)).to(h_ptr.dtype.element_ty).to(tl.float32)
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
        cols,
        eps,
        HAS_DELTA=delta is not None,
        BLOCK=triton.next_power_of_2(cols),
    )
    return out


SPLIT_CHUNK = 64  # cache slots per program of split decode attention


@triton.jit
def _linear_kernel(
    a_ptr,
    w_ptr,
    bias_ptr,
    gamma_ptr,
    tok_ptr,
    x_ptr,
    out_ptr,
    part_ptr,
    count_ptr,
    M,
    N,
    stride_a,
    stride_out,
    eps,
    K: tl.constexpr,
    K_PER: tl.constexpr,
    SPLIT_K: tl.constexpr,
    NORM: tl.constexpr,
    GATHER: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RESIDUAL: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # Program (m, n, s): output tile rows m*BM.., columns n*BN.. of A @ W^T over K_PER of the K columns
    # from s * K_PER. With NORM, A is RMSNorm(A) * gamma, built as it is read (a first pass over the row
    # sums its squares) and rounded where the module rounds, so the product sees the operand a separate
    # norm kernel would have written. With SPLIT_K > 1 the last program of a tile to finish adds the splits.
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    dtype = w_ptr.dtype.element_ty
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    m_ok = rm < M
    n_ok = rn < N
    if GATHER:  # A's rows are embedding rows: the residual stream starts as each token's embedding
        src = tl.load(tok_ptr + rm, mask=m_ok, other=0)
    else:
        src = rm
    a_rows = a_ptr + src.to(tl.int64)[:, None] * stride_a  # [BM, 1]
    if NORM:
        ss = tl.zeros([BM], tl.float32)
        for k0 in range(0, K, BK):
            ks = k0 + rk
            ok = m_ok[:, None] & (ks < K)[None, :]
            xa = tl.load(a_rows + ks[None, :], mask=ok, other=0.0)  # [BM, BK]
            if GATHER:
                if (pid_n == 0) & (pid_k == 0):  # one program per row tile writes the stream
                    tl.store(x_ptr + rm[:, None] * K + ks[None, :], xa.to(x_ptr.dtype.element_ty), mask=ok)
            xf = xa.to(x_ptr.dtype.element_ty).to(tl.float32)
            ss += tl.sum(xf * xf, axis=1)
        inv = 1.0 / tl.sqrt(ss / K + eps)  # [BM]
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K_PER, BK):
        ks = pid_k * K_PER + k0 + rk
        k_ok = ks < K
        ok = m_ok[:, None] & k_ok[None, :]
        if NORM:
            xf = tl.load(a_rows + ks[None, :], mask=ok, other=0.0).to(x_ptr.dtype.element_ty).to(tl.float32)
            normed = (xf * inv[:, None]).to(dtype).to(tl.float32)
            gamma = tl.load(gamma_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
            a = (normed * gamma[None, :]).to(dtype)  # [BM, BK]
        else:
            a = tl.load(a_rows + ks[None, :], mask=ok, other=0.0).to(dtype)
        w = tl.load(w_ptr + rn[:, None] * K + ks[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)  # [BN, BK]
        acc = tl.dot(a, tl.trans(w), acc, input_precision=PRECISION)  # [BM, BN] float32
    if SPLIT_K == 1:
        _linear_store(acc, bias_ptr, out_ptr, rm, rn, m_ok, n_ok, stride_out, dtype, HAS_BIAS, RESIDUAL)
    else:
        # As split attention: publish this split's sum, count it in, and the last program of the tile
        # adds the splits in order, so the sum does not depend on which one it is.
        tile = pid_m * tl.num_programs(1) + pid_n
        cell = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]  # [BM, BN]
        tl.store(part_ptr + (tile * SPLIT_K + pid_k) * BM * BN + cell, acc)
        tl.debug_barrier()  # every thread's share of the tile is stored before one thread counts it in
        if tl.atomic_add(count_ptr + tile, 1) == SPLIT_K - 1:
            acc = tl.zeros([BM, BN], tl.float32)
            for t in range(SPLIT_K):
                acc += tl.load(part_ptr + (tile * SPLIT_K + t) * BM * BN + cell, cache_modifier=".cg")
            tl.store(count_ptr + tile, 0)
            _linear_store(acc, bias_ptr, out_ptr, rm, rn, m_ok, n_ok, stride_out, dtype, HAS_BIAS, RESIDUAL)


@triton.jit
def _linear_store(acc, bias_ptr, out_ptr, rm, rn, m_ok, n_ok, stride_out, dtype, HAS_BIAS, RESIDUAL):
    """Bias, rounding and (RESIDUAL) the add to the stream, for a finished [BM, BN] float32 tile."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y = acc.to(dtype)
    out = out_ptr + rm[:, None] * stride_out + rn[None, :]
    ok = m_ok[:, None] & n_ok[None, :]
    if RESIDUAL:  # out is the residual stream: x + (A @ W^T), the product rounded first as a module's output is
        y = (tl.load(out, mask=ok, other=0.0).to(tl.float32) + y.to(tl.float32)).to(dtype)
    tl.store(out, y, mask=ok)


def _linear_tiles(M: int, N: int, K: int, device: torch.device) -> dict:
    """Launch shape of _linear_kernel. The decoder calls it at narrow widths, where a GEMM's time is the
    latency of its K loop, not its FLOPs: 16-row tiles and narrow column tiles give the most programs
    (the best of a sweep at 16-64 rows on an H200, benchmarks/decode_kernels.py --widths --tile-sweep),
    and a long K is split while the tiles alone leave SMs idle."""
    bn = 16 if M <= 32 and N <= 1024 else 32
    tiles = triton.cdiv(M, 16) * triton.cdiv(N, bn)
    split_k = 4 if K >= 1024 and tiles < sm_count(device) else 1
    return {"BM": 16, "BN": bn, "BK": 64, "SPLIT_K": split_k, "num_warps": 4, "num_stages": 4}


def _linear(
    a,
    weight,
    out,
    *,
    norm: bool,
    bias=None,
    gamma=None,
    eps=0.0,
    tokens=None,
    x=None,
    residual=False,
    counts=None,
    **tiles,
):
    """One launch of _linear_kernel: out [M, N] from a and weight [N, K] (see the public wrappers)."""
    M, (N, K) = out.shape[0], weight.shape
    assert weight.is_contiguous() and out.stride(-1) == 1 and a.stride(-1) == 1
    assert tokens is None or norm, "the gathered stream is written in the norm's first pass"
    launch = _linear_tiles(M, N, K, weight.device) | tiles
    bm, bn, bk, split_k = launch["BM"], launch["BN"], launch["BK"], launch.pop("SPLIT_K")
    grid = (triton.cdiv(M, bm), triton.cdiv(N, bn), split_k)
    k_per = triton.cdiv(triton.cdiv(K, split_k), bk) * bk  # K columns per split, whole BK blocks
    part = count_buf = out  # not read with one split
    if split_k > 1:  # [tiles * splits * BM * BN]: each split's partial tile; one tally per tile
        part, count_buf = _split_buffers(
            (grid[0] * grid[1] * split_k * bm * bn,), grid[0] * grid[1], counts, out.device
        )
    _linear_kernel[grid](
        a,
        weight,
        bias if bias is not None else weight,
        gamma if gamma is not None else weight,
        tokens if tokens is not None else out,
        x if x is not None else out,
        out,
        part,
        count_buf,
        M,
        N,
        a.stride(0),
        out.stride(0),
        eps,
        K=K,
        K_PER=k_per,
        SPLIT_K=split_k,
        NORM=norm,
        GATHER=tokens is not None,
        HAS_BIAS=bias is not None,
        RESIDUAL=residual,
        PRECISION="ieee" if weight.dtype == torch.float32 else "tf32",
        **launch,
    )
    return out


def norm_linear(
    x: torch.Tensor,
    gamma: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    counts: torch.Tensor | None = None,
    **tiles,
) -> torch.Tensor:
    """out = (RMSNorm(x) * gamma) @ weight^T + bias in one launch, the norm computed as the operand is read.

    x: [B, K] the residual stream; gamma: [K]; weight: [N, K] contiguous; bias: [N] or None; out: [B, N].
    A long K is split across programs whose last adds the parts in order; ``counts`` (int32, zero, one per
    output tile, left zero) keeps their tally in a buffer a CUDA graph holds. ``tiles`` overrides the launch
    shape (BM, BN, BK, SPLIT_K, num_warps, num_stages; benchmarks sweep it).
    """
    return _linear(x, weight, out, norm=True, bias=bias, gamma=gamma, eps=eps, x=x, counts=counts, **tiles)


def embed_norm_linear(
    tokens: torch.Tensor,
    embedding: torch.Tensor,
    x: torch.Tensor,
    gamma: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    counts: torch.Tensor | None = None,
    **tiles,
) -> torch.Tensor:
    """``norm_linear`` of the tokens' embedding rows, which are also written to x (the residual stream).

    tokens: [>= B] long; embedding: [V, K]; x: [B, K] contiguous; out: [B, N].
    """
    assert x.is_contiguous() and x.shape[1] == embedding.shape[1]
    return _linear(
        embedding, weight, out, norm=True, bias=bias, gamma=gamma, eps=eps, tokens=tokens, x=x, counts=counts, **tiles
    )


def linear_add(
    a: torch.Tensor,
    weight: torch.Tensor,
    x: torch.Tensor,
    bias: torch.Tensor | None = None,
    counts: torch.Tensor | None = None,
    **tiles,
) -> torch.Tensor:
    """x += a @ weight^T + bias in place: a projection and the residual add in one launch. a: [B, K];
    weight: [N, K] contiguous; bias: [N] or None; x: [B, N]; counts as for ``norm_linear``. The product is
    rounded to x's dtype before the add, as a module's output is."""
    return _linear(a, weight, x, norm=False, bias=bias, x=x, residual=True, counts=counts, **tiles)


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
    share_ptr,
    o_ptr,
    part_ptr,
    count_ptr,
    stream_ptr,
    bias_ptr,
    scale,
    eps,
    stride_row,
    stride_head,
    stride_slot,
    KV_LEN: tl.constexpr,
    CHUNK: tl.constexpr,
    SPLITS: tl.constexpr,
    RAGGED: tl.constexpr,
    N_Q: tl.constexpr,
    N_KV: tl.constexpr,
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    D: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    SHARED: tl.constexpr,
    WIDE: tl.constexpr,
    ROW_NORM: tl.constexpr,
    HIDDEN: tl.constexpr,
    HIDDEN_PAD: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    # Program (b, j, c): row b's KV head j and the G query heads it serves, over cache slots
    # c * CHUNK .. (c + 1) * CHUNK - 1. It rotates them at the row's position, writes this token's key and
    # value into the cache (split 0), attends over its slots before this token, and the program that
    # finishes last for (b, j) combines the splits and adds this token's own term from registers (so
    # nothing written in this launch needs to be read back from the cache).
    b = tl.program_id(0)
    j = tl.program_id(1)
    c = tl.program_id(2)
    # Slot and position arithmetic in int32 (a cache is far below 2^31 slots): the masks below are
    # per-slot compares, twice the instructions in int64.
    step = tl.load(step_ptr).to(tl.int32)
    prompt_end = tl.load(slot0_ptr).to(tl.int32) + 1  # slots below hold the left-padded prompt
    pos0 = tl.load(pos0_ptr + b).to(tl.int32)  # the prompt's last position: its length less one
    first = prompt_end - 1 - pos0  # the first real prompt slot; the left padding lies before it
    slot = prompt_end - 1 + step  # this token's cache slot
    pos = pos0 + step  # its rotary position
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
    inv = 1.0  # qkv as given; with ROW_NORM it is x @ (W * norm weight)^T and the input norm's 1 / rms(x) applies
    if ROW_NORM:
        inv = _inv_rms(stream_ptr + b * HIDDEN, HIDDEN, HIDDEN_PAD, eps)
    x = _qkv_part(src, bias_ptr, (j * G + g) * D + d[None, :], is_q, 0.0, inv, HAS_BIAS)  # [G_PAD, D]
    x_p = _qkv_part(src, bias_ptr, (j * G + g) * D + partner[None, :], is_q, 0.0, inv, HAS_BIAS)
    y = _qkv_part(src, bias_ptr, (N_Q + j) * D + d[None, :], None, None, inv, HAS_BIAS)  # [1, D]
    y_p = _qkv_part(src, bias_ptr, (N_Q + j) * D + partner[None, :], None, None, inv, HAS_BIAS)
    v_new = _qkv_part(src, bias_ptr, (N_Q + N_KV + j) * D + d, None, None, inv, HAS_BIAS)  # [D]
    q = (x * cos + sign * x_p * sin).to(k_ptr.dtype.element_ty)  # [G_PAD, D]
    k_new = (y * cos + sign * y_p * sin).to(k_ptr.dtype.element_ty)  # [1, D]
    v_new = v_new.to(v_ptr.dtype.element_ty)  # [D]
    # Offsets into the cache in int32 where it holds fewer than 2^31 elements (WIDE otherwise): every block's
    # addresses, and the choice of row each slot is read from, are per-slot integer work.
    if WIDE:
        own = b.to(tl.int64) * stride_row + j * stride_head  # this row's cache for head j
    else:
        own = b * stride_row + j * stride_head
    if c == 0:
        tl.store(k_ptr + own + slot * stride_slot + d[None, :], k_new)
        tl.store(v_ptr + own + slot * stride_slot + d, v_new)
    # The prompt slots come from row share[b], which holds the same prompt: the rows of a group then read
    # one copy, which stays in L2 while they run, instead of one copy each from HBM.
    shared = own
    if SHARED:
        holder = tl.load(share_ptr + b)  # the row that holds this row's prompt
        if not WIDE:
            holder = holder.to(tl.int32)
        shared = holder * stride_row + j * stride_head
    m_i = tl.full([G_PAD], -1.0e30, tl.float32)  # running max (finite: a piece with no slots stays harmless)
    l_i = tl.zeros([G_PAD], tl.float32)  # running softmax denominator
    acc = tl.zeros([G_PAD, D], tl.float32)
    q_t = tl.trans(q)  # [D, G_PAD]
    # Only the blocks from the one holding the row's first real prompt slot to the one holding this token, a
    # run-time range (the interpreter walks it through _interpreter_loop_bounds): the left padding's blocks
    # and the bucket's tail would add exactly nothing, so the output bits are a whole piece's.
    lo = tl.maximum(c * CHUNK, (first // BLOCK_K) * BLOCK_K)
    hi = tl.minimum(c * CHUNK + CHUNK, slot + 1)
    for start in range(lo, hi, BLOCK_K):
        # (the body is written out here, not in a helper: Triton's interpreter re-patches the language at
        # every call of a helper, a tenth of a fused CPU test's time at a few calls a block)
        ks = start + tl.arange(0, BLOCK_K)  # [BLOCK_K] int32
        # Real prompt tokens and earlier decodes: the decoder left-pads each prompt, so the slots that count
        # are one range, computed from the row's position (a validity load here would hold up every block)
        ok = (ks >= first) & (ks < slot)  # [BLOCK_K]
        rows = tl.where(ks < prompt_end, shared, own)  # [BLOCK_K]: where each slot is read from
        at = rows[:, None] + (ks * stride_slot)[:, None] + d[None, :]  # [BLOCK_K, D]
        live = None  # the range ends at the token's block: only a ragged bucket masks its loads
        other = None
        if RAGGED:  # the last block or split runs past the bucket
            ok = ok & (ks < KV_LEN)
            live = (ks < KV_LEN)[:, None]
            other = 0.0
        k = tl.load(k_ptr + at, mask=live, other=other)  # [BLOCK_K, D]
        # Scores as keys x queries: the block's slots on the mma's long side, the G query heads padded to G_PAD
        # on its short one; half the products and padded softmax rows of queries x keys. (Some sums run in another
        # order than theirs: about one output in 10^5 lands one bf16 step apart.)
        s = tl.dot(k, q_t, input_precision=PRECISION)  # [BLOCK_K, G_PAD] float32
        s = tl.where(ok[:, None], s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))  # [G_PAD]
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[None, :])  # [BLOCK_K, G_PAD]
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
        v = tl.load(v_ptr + at, mask=live, other=other)  # [BLOCK_K, D]
        acc = acc * alpha[:, None] + tl.dot(tl.trans(p.to(v.dtype)), v, input_precision=PRECISION)  # [G_PAD, D]
    o_rows = o_ptr + (b * N_Q + j * G + g) * D + d[None, :]  # [G_PAD, D]
    if SPLITS == 1:
        _attend_self(q, k_new, v_new, m_i, l_i, acc, scale, o_rows, is_q)
    else:
        # Publish this split's running max, denominator and sum, then count it in: a block-wide barrier
        # orders all its threads' stores before the count (one thread makes the atomic, acquire-release
        # at GPU scope), so the program that counts last sees every split's partial. It folds them in
        # split order (the result does not depend on which program that is) and resets the count.
        part = part_ptr + ((b * N_KV + j) * SPLITS) * G_PAD * (D + 2)
        row = g * (D + 2)  # [G_PAD, 1]
        tl.store(part + c * G_PAD * (D + 2) + row + d[None, :], acc, mask=is_q)
        tl.store(part + c * G_PAD * (D + 2) + row + D, m_i[:, None], mask=is_q)
        tl.store(part + c * G_PAD * (D + 2) + row + D + 1, l_i[:, None], mask=is_q)
        tl.debug_barrier()
        if tl.atomic_add(count_ptr + b * N_KV + j, 1) == SPLITS - 1:
            m_i = tl.full([G_PAD], -1.0e30, tl.float32)
            l_i = tl.zeros([G_PAD], tl.float32)
            acc = tl.zeros([G_PAD, D], tl.float32)
            for t in range(SPLITS):  # a loop, not unrolled: long caches have many splits
                base = part + t * G_PAD * (D + 2) + row
                m_t = tl.sum(tl.load(base + D, mask=is_q, other=-1.0e30, cache_modifier=".cg"), axis=1)  # [G_PAD]
                l_t = tl.sum(tl.load(base + D + 1, mask=is_q, other=0.0, cache_modifier=".cg"), axis=1)
                acc_t = tl.load(base + d[None, :], mask=is_q, other=0.0, cache_modifier=".cg")  # [G_PAD, D]
                m_new = tl.maximum(m_i, m_t)
                a_old, a_t = tl.exp(m_i - m_new), tl.exp(m_t - m_new)
                acc = acc * a_old[:, None] + acc_t * a_t[:, None]
                l_i = l_i * a_old + l_t * a_t
                m_i = m_new
            tl.store(count_ptr + b * N_KV + j, 0)
            _attend_self(q, k_new, v_new, m_i, l_i, acc, scale, o_rows, is_q)


@triton.jit
def _qkv_part(src, bias_ptr, off, mask, other, inv, HAS_BIAS: tl.constexpr):
    """Elements ``off`` of a row's q|k|v in float32: times the row's 1 / rms (``inv``, 1 without the stream),
    then plus the projection's bias at the same offsets."""
    val = tl.load(src + off, mask=mask, other=other).to(tl.float32) * inv
    if HAS_BIAS:
        val += tl.load(bias_ptr + off, mask=mask, other=other).to(tl.float32)
    return val


@triton.jit
def _inv_rms(row_ptr, HIDDEN: tl.constexpr, HIDDEN_PAD: tl.constexpr, eps):
    """1 / sqrt(mean(x^2) + eps) of one row of the residual stream, in float32, as RMSNorm computes it."""
    cols = tl.arange(0, HIDDEN_PAD)
    return _inv_rms_of(tl.load(row_ptr + cols, mask=cols < HIDDEN, other=0.0).to(tl.float32), HIDDEN, eps)


@triton.jit
def _inv_rms_of(xf, n_cols, eps):
    """1 / sqrt(mean(xf^2) + eps) of a row held in float32 (its padding zero), as RMSNorm computes it."""
    return 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)


@triton.jit
def _attend_self(q, k_new, v_new, m_i, l_i, acc, scale, o_rows, is_q):
    """Fold this token's own score into the softmax state and store the normalised output."""
    s_self = tl.sum(q.to(tl.float32) * k_new.to(tl.float32), axis=1) * scale  # [G_PAD]
    m_new = tl.maximum(m_i, s_self)
    alpha = tl.exp(m_i - m_new)
    p_self = tl.exp(s_self - m_new).to(v_new.dtype).to(tl.float32)  # rounded as the block products' p
    acc = acc * alpha[:, None] + p_self[:, None] * v_new.to(tl.float32)[None, :]
    l_i = l_i * alpha + tl.exp(s_self - m_new)
    tl.store(o_rows, (acc / l_i[:, None]).to(o_rows.dtype.element_ty), mask=is_q)


def rotary_attention(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    pos0: torch.Tensor,
    slot0: torch.Tensor,
    step: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_len: int,
    scale: float,
    out: torch.Tensor,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    counts: torch.Tensor | None = None,
    split: bool | None = None,
    chunk: int | None = None,
    share: torch.Tensor | None = None,
    wide: bool | None = None,
    stream: torch.Tensor | None = None,
    eps: float = 0.0,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """One decode token's rotary embedding, cache write and grouped-query attention, in one launch.

    qkv: [B, (Hq + 2 Hkv) * D], the token's projections; cos, sin: [positions, D] tables; pos0: [>= B] long,
    slot0: [1] long, step: [1] long (on the device): the token of step ``step`` sits at rotary position
    pos0[b] + step and cache slot slot0 + step. k_cache, v_cache: [rows >= B, Hkv, C, D] with a contiguous
    last dimension. Each row's prompt is left-padded into slots <= slot0, so its real tokens are slots
    slot0 - pos0[b] .. slot0; it attends to those and to the decoded slots before this token's, then to itself;
    only the blocks from its first real prompt slot to this token's are read. out: [B, Hq * D] (heads concatenated, as
    o_proj expects). share: [>= B] long or None: row b reads its prompt slots (keys and values; slots <= slot0)
    from row share[b], which holds the same prompt. Scores and softmax in float32;
    q and k rounded to the cache dtype, and probabilities before the value product, as flash attention does;
    float32 inputs multiply in full precision, so the CPU and GPU tests compare exactly.

    At a narrow width there are too few (row, KV head) programs to fill the GPU, and each would walk the
    whole cache alone: with ``split`` (default: when rows x KV heads < 2 x SMs) the cache is cut into
    ``chunk``-slot pieces (default SPLIT_CHUNK), one program each, combined by the last to finish.
    ``counts`` ([>= B * Hkv] int32, zero; left zero after the launch) lets a caller keep that tally in a
    buffer a CUDA graph holds.

    ``block_k`` (cache slots a loop pass), ``num_warps`` and ``num_stages`` override the launch shape
    (``launch_shape``).

    Offsets into the cache are int32 where the cache view spans fewer than 2^31 elements; ``wide`` forces
    int64 (the output bits are the same either way).

    With ``stream`` ([B, H], the residual stream), qkv is the product of the stream itself with the weights
    scaled by the input norm's weight, and each row's 1 / sqrt(mean(stream^2) + eps) is applied here, then
    ``bias`` ([(Hq + 2 Hkv) * D] or None), before rotation: the norm costs no launch of its own.
    """
    B = qkv.shape[0]
    n_kv, C, D = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    n_q = out.shape[1] // D
    G = n_q // n_kv
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    assert cos.is_contiguous() and sin.is_contiguous() and cos.shape[-1] == D and kv_len <= C
    # kv_len is a compile-time constant: the decoder uses a few cache-length buckets, each captured in its own
    # graph, so each compiles once (and Triton's on-disk cache keeps it).
    g_pad = max(triton.next_power_of_2(G), 4)  # the score product's short side (an mma pads it to 8)
    if split is None:
        split = B * n_kv < 2 * sm_count(qkv.device)
    shape = launch_shape(split)
    block_k, num_stages = block_k or shape["block_k"], num_stages or shape["num_stages"]
    whole = triton.cdiv(kv_len, block_k) * block_k
    piece = min(triton.cdiv(chunk or SPLIT_CHUNK, block_k) * block_k, whole) if split else whole
    splits = triton.cdiv(kv_len, piece)
    part = count_buf = out  # not read with one split
    if splits > 1:  # [B, Hkv, splits, G_PAD, D + 2]: each split's sum, running max and denominator per query head
        part, count_buf = _split_buffers((B, n_kv, splits, g_pad, D + 2), B * n_kv, counts, qkv.device)
    _rotary_attention_kernel[(B, n_kv, splits)](
        qkv,
        cos,
        sin,
        pos0,
        slot0,
        step,
        k_cache,
        v_cache,
        share if share is not None else pos0,  # not read unless SHARED
        out,
        part,
        count_buf,
        stream if stream is not None else qkv,  # not read unless ROW_NORM
        bias if bias is not None else qkv,  # not read unless HAS_BIAS
        scale,
        eps,
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        KV_LEN=kv_len,
        CHUNK=piece,
        SPLITS=splits,
        RAGGED=piece * splits != kv_len,
        N_Q=n_q,
        N_KV=n_kv,
        G=G,
        G_PAD=g_pad,
        D=D,
        HALF=D // 2,
        BLOCK_K=block_k,
        PRECISION="ieee" if qkv.dtype == torch.float32 else "tf32",
        SHARED=share is not None,
        WIDE=wide if wide is not None else _elements(k_cache) >= 2**31,
        ROW_NORM=stream is not None,
        HIDDEN=stream.shape[1] if stream is not None else 1,
        HIDDEN_PAD=triton.next_power_of_2(stream.shape[1]) if stream is not None else 1,
        HAS_BIAS=bias is not None,
        num_warps=num_warps or max(1, D // 64),  # one warp per 64-wide head
        num_stages=num_stages,
    )
    return out


def launch_shape(split: bool) -> dict:
    """Decode attention's default block and pipeline depth: the fastest inside the rollout's decode steps on an
    H200 at SmolLM2-135M's shapes (benchmarks/attention_shapes.py at 512 rows, collection_timeline.py at every
    width a collection passes through). A program over a row's whole cache (wide steps) reads 16-slot blocks
    four deep: more reads in flight, and the twelve programs an SM gets at 512 rows still fit their 16 KB of
    stages in its shared memory, where 32-slot blocks three or four deep (24-32 KB) would not. Split pieces
    (narrow steps) are short, and 16-slot blocks there were slower: 32-slot blocks, double-buffered."""
    return {"block_k": 32, "num_stages": 2} if split else {"block_k": 16, "num_stages": 4}


def _elements(t: torch.Tensor) -> int:
    """How far past its first element a view reaches, in elements (its extent in the storage it views)."""
    return 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))


def _split_buffers(part_shape: tuple, tallies: int, counts: torch.Tensor | None, device: torch.device):
    """A split launch's float32 workspace for its partial results, and its tally buffer: ``counts`` (int32, zero,
    at least ``tallies`` long; left zero by the launch) or, without it, a fresh zeroed one."""
    counts = counts if counts is not None else torch.zeros(tallies, dtype=torch.int32, device=device)
    assert counts.dtype == torch.int32 and counts.numel() >= tallies
    return torch.empty(part_shape, dtype=torch.float32, device=device), counts


@functools.cache
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (4 elsewhere: the interpreter runs programs one by one)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


@triton.jit
def _silu_mul_kernel(
    gu_ptr, out_ptr, stream_ptr, n, eps, BLOCK: tl.constexpr, HIDDEN: tl.constexpr, HIDDEN_PAD: tl.constexpr
):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    gate = tl.load(gu_ptr + row * 2 * n + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * 2 * n + n + cols, mask=mask, other=0.0).to(tl.float32)
    if HIDDEN > 0:  # gate|up is the stream's product with norm-scaled weights: apply the row's 1 / rms here
        inv = _inv_rms(stream_ptr + row * HIDDEN, HIDDEN, HIDDEN_PAD, eps)
        gate, up = gate * inv, up * inv
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * n + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(
    gate_up: torch.Tensor,
    out: torch.Tensor,
    block: int = 1024,
    stream: torch.Tensor | None = None,
    eps: float = 0.0,
) -> torch.Tensor:
    """out = silu(gate) * up for gate_up = [gate | up]: [B, 2I] -> [B, I]. With ``stream`` ([B, H]), gate|up
    is the stream's product with weights scaled by the post-attention norm's weight, and gate and up are
    first multiplied by the row's 1 / sqrt(mean(stream^2) + eps): the norm costs no launch of its own."""
    B, n = out.shape
    hidden = stream.shape[1] if stream is not None else 0
    _silu_mul_kernel[(B, triton.cdiv(n, block))](
        gate_up,
        out,
        stream if stream is not None else gate_up,  # not read without a stream
        n,
        eps,
        BLOCK=block,
        HIDDEN=hidden,
        HIDDEN_PAD=triton.next_power_of_2(max(hidden, 1)),
    )
    return out


@triton.jit
def _ln(x, FAST: tl.constexpr):
    """Natural log: the hardware's approximate log2 and a multiply (relative error near 2^-22) where compiled,
    numpy's in the interpreter. tl.log is libdevice's exact logf, a range reduction and a polynomial; at two
    logs a column that was 40% of sampling's time (102 -> 61 us for 512 x 49,152 logits on an H200)."""
    if FAST:
        return tl.extra.cuda.libdevice.fast_logf(x)
    return tl.log(x)


@triton.jit
def _race_tile(
    row_ptr, start, j, inv_t, u, m, s, key, idx, z, V: tl.constexpr, GREEDY: tl.constexpr, FAST_LOG: tl.constexpr
):
    """Fold columns start + j into per-lane race state: running max m and sum s of exp(z - m), and the
    best Gumbel key with its column and z. All elementwise: the block reduces once, at the end."""
    cols = start + j
    z_new = tl.load(row_ptr + cols, mask=cols < V, other=-float("inf")).to(tl.float32) * inv_t
    if GREEDY:
        key_new = z_new
    else:
        # argmax(z - log E), E = -log U ~ Exp(1), is an exact draw from softmax(z). U = 0 gives
        # E = inf and a key of -inf: that token is not drawn, at probability 2^-32.
        key_new = z_new - _ln(-_ln(u, FAST_LOG), FAST_LOG)
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
    FAST_LOG: tl.constexpr,
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
    m, s, key, idx, z = _race_tile(row_ptr, first, j, inv_t, u0, m, s, key, idx, z, V, GREEDY, FAST_LOG)
    m, s, key, idx, z = _race_tile(row_ptr, first + QUARTER, j, inv_t, u1, m, s, key, idx, z, V, GREEDY, FAST_LOG)
    m, s, key, idx, z = _race_tile(row_ptr, first + 2 * QUARTER, j, inv_t, u2, m, s, key, idx, z, V, GREEDY, FAST_LOG)
    m, s, key, idx, z = _race_tile(row_ptr, first + 3 * QUARTER, j, inv_t, u3, m, s, key, idx, z, V, GREEDY, FAST_LOG)
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
    (fixed by the key, the step and ``block``; compiled, the noise's logs are the hardware's approximate
    ones, so a compiled draw and an interpreted one may part where two keys are within ~1e-6). Greedy takes
    argmax(z) and reports log-probs at the given temperature (the decoder sets it to 1). Two launches: each
    row is raced in blocks of ``block`` columns by separate programs, then their partial results are combined.
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
        block = triton.next_power_of_2(V) if INTERPRETED else 2048
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
        FAST_LOG=not INTERPRETED,
    )
    return part, part_idx

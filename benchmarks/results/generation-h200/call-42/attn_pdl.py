"""Decode attention launched dependent on the q|k|v product, with the work that needs nothing it writes first.

A copy of kernels._rotary_attention_kernel's whole-cache path (share, the stream's 1 / rms, no bias). With PDL
the kernel is launched with programmatic dependent launch and waits for the product (griddepcontrol.wait) only
before it reads the token's q|k|v: the row's positions, its prompt holder, the rotary tables and the stream's
1 / rms (the stream is the product's input, not its output) come before the wait, and with PREFETCH so does
a request for the first PREFETCH slots of keys and values into L2. Whether any of that overlaps the product
depends on when the product lets its dependents start (pdl_cublas.py). Timed as the decoder runs it: 30 layers
of (cuBLAS q|k|v product of the stream, attention) in one CUDA graph, every arm's outputs and cache writes
checked against the library's bits.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import triton
import triton.language as tl
from grpo_knobs.rollout import kernels as K
from grpo_knobs.rollout.kernels import _attend_self, _inv_rms, _qkv_part
from triton.language.extra.cuda import gdc_wait

N_Q, N_KV, D, C, LAYERS, GROUP, HIDDEN = 9, 3, 64, 320, 30, 8, 576


@triton.jit
def _pdl_kernel(
    qkv_ptr, cos_ptr, sin_ptr, pos0_ptr, slot0_ptr, step_ptr, k_ptr, v_ptr, share_ptr, o_ptr, stream_ptr,
    scale, eps, stride_row, stride_head, stride_slot,
    N_Q: tl.constexpr, N_KV: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr,
    HALF: tl.constexpr, BLOCK_K: tl.constexpr, HIDDEN: tl.constexpr, HIDDEN_PAD: tl.constexpr,
    PDL: tl.constexpr, PREFETCH: tl.constexpr, TRANS: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    j = tl.program_id(1)
    # Before the wait: nothing the product writes.
    step = tl.load(step_ptr).to(tl.int32)
    prompt_end = tl.load(slot0_ptr).to(tl.int32) + 1
    pos0 = tl.load(pos0_ptr + b).to(tl.int32)
    first = prompt_end - 1 - pos0
    slot = prompt_end - 1 + step
    pos = pos0 + step
    d = tl.arange(0, D)
    own = b * stride_row + j * stride_head
    shared = tl.load(share_ptr + b).to(tl.int32) * stride_row + j * stride_head
    lo = (first // BLOCK_K) * BLOCK_K
    if PREFETCH > 0:  # one 128-byte line a slot, keys and values
        ksp = lo + tl.arange(0, PREFETCH)
        line = tl.where(ksp < prompt_end, shared, own) + ksp * stride_slot  # [PREFETCH]
        for cache in tl.static_range(2):
            base = k_ptr if cache == 0 else v_ptr
            tl.inline_asm_elementwise(
                "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [base + line], dtype=tl.int32, is_pure=False, pack=1
            )
    partner = (d + HALF) % D
    sign = tl.where(d < HALF, -1.0, 1.0)[None, :]  # [1, D]
    cos = tl.load(cos_ptr + pos * D + d).to(tl.float32)[None, :]  # [1, D]
    sin = tl.load(sin_ptr + pos * D + d).to(tl.float32)[None, :]
    inv = _inv_rms(stream_ptr + b * HIDDEN, HIDDEN, HIDDEN_PAD, eps)
    if PDL:
        gdc_wait()
    # After it: the token's q|k|v, its rotation and cache write, the loop (as the library's kernel).
    src = qkv_ptr + b * (N_Q + 2 * N_KV) * D
    g = tl.arange(0, G_PAD)[:, None]
    is_q = g < G
    x = _qkv_part(src, qkv_ptr, (j * G + g) * D + d[None, :], is_q, 0.0, inv, False)  # [G_PAD, D]
    x_p = _qkv_part(src, qkv_ptr, (j * G + g) * D + partner[None, :], is_q, 0.0, inv, False)
    y = _qkv_part(src, qkv_ptr, (N_Q + j) * D + d[None, :], None, None, inv, False)  # [1, D]
    y_p = _qkv_part(src, qkv_ptr, (N_Q + j) * D + partner[None, :], None, None, inv, False)
    v_new = _qkv_part(src, qkv_ptr, (N_Q + N_KV + j) * D + d, None, None, inv, False)  # [D]
    q = (x * cos + sign * x_p * sin).to(k_ptr.dtype.element_ty)  # [G_PAD, D]
    k_new = (y * cos + sign * y_p * sin).to(k_ptr.dtype.element_ty)  # [1, D]
    v_new = v_new.to(v_ptr.dtype.element_ty)  # [D]
    tl.store(k_ptr + own + slot * stride_slot + d[None, :], k_new)
    tl.store(v_ptr + own + slot * stride_slot + d, v_new)
    m_i = tl.full([G_PAD], -1.0e30, tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    if TRANS:
        # Slots on the products' long side and the G query heads on the short one: s^T = k q^T is
        # [BLOCK_K, G_PAD] and acc^T = v^T p^T is [D, G_PAD], with G_PAD = 4 instead of 16 rows of an mma.
        q_t = tl.trans(q)  # [D, G_PAD]
        acc = tl.zeros([G_PAD, D], tl.float32)
        for start in range(lo, slot + 1, BLOCK_K):
            ks = start + tl.arange(0, BLOCK_K)  # [BLOCK_K] int32
            ok = (ks >= first) & (ks < slot)  # [BLOCK_K]
            rows = tl.where(ks < prompt_end, shared, own)  # [BLOCK_K]
            at = rows[:, None] + (ks * stride_slot)[:, None] + d[None, :]  # [BLOCK_K, D]
            k = tl.load(k_ptr + at)  # [BLOCK_K, D]
            s_t = tl.dot(k, q_t, input_precision="tf32")  # [BLOCK_K, G_PAD] float32
            s_t = tl.where(ok[:, None], s_t * scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s_t, axis=0))  # [G_PAD]
            alpha = tl.exp(m_i - m_new)
            p_t = tl.exp(s_t - m_new[None, :])  # [BLOCK_K, G_PAD]
            l_i = l_i * alpha + tl.sum(p_t, axis=0)
            m_i = m_new
            v = tl.load(v_ptr + at)  # [BLOCK_K, D]
            p = tl.trans(p_t.to(v.dtype))  # [G_PAD, BLOCK_K]
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="tf32")  # [G_PAD, D]
    else:
        acc = tl.zeros([G_PAD, D], tl.float32)
        for start in range(lo, slot + 1, BLOCK_K):
            ks = start + tl.arange(0, BLOCK_K)  # [BLOCK_K] int32
            ok = (ks >= first) & (ks < slot)  # [BLOCK_K]
            rows = tl.where(ks < prompt_end, shared, own)  # [BLOCK_K]
            at = rows[:, None] + (ks * stride_slot)[:, None] + d[None, :]  # [BLOCK_K, D]
            k = tl.load(k_ptr + at)  # [BLOCK_K, D]
            s = tl.dot(q, tl.trans(k), input_precision="tf32")  # [G_PAD, BLOCK_K] float32
            s = tl.where(ok[None, :], s * scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))  # [G_PAD]
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])  # [G_PAD, BLOCK_K]
            acc = acc * alpha[:, None]
            l_i = l_i * alpha
            m_i = m_new
            v = tl.load(v_ptr + at)  # [BLOCK_K, D]
            acc += tl.dot(p.to(v.dtype), v, input_precision="tf32")  # [G_PAD, D]
            l_i += tl.sum(p, axis=1)
    o_rows = o_ptr + (b * N_Q + j * G + g) * D + d[None, :]  # [G_PAD, D]
    _attend_self(q, k_new, v_new, m_i, l_i, acc, scale, o_rows, is_q)


ARMS = {
    "lib": None,
    "copy": (False, 0, False),
    "pdl": (True, 0, False),
    "pdl-pf32": (True, 32, False),
    "pdl-pf64": (True, 64, False),
    "trans": (False, 0, True),
    "trans-pdl": (True, 0, True),
}


def attend(arm, qkv, cos, sin, pos0, slot0, step, kv, share, out, stream, bucket):
    if ARMS[arm] is None:
        return K.rotary_attention(qkv, cos, sin, pos0, slot0, step, kv[0], kv[1], bucket, 0.125, out, share=share,
                                  stream=stream, eps=1e-5)  # fmt: skip
    pdl, prefetch, trans = ARMS[arm]
    st = kv[0].stride()
    _pdl_kernel[(qkv.shape[0], N_KV)](
        qkv, cos, sin, pos0, slot0, step, kv[0], kv[1], share, out, stream, 0.125, 1e-5, st[0], st[1], st[2],
        N_Q=N_Q, N_KV=N_KV, G=N_Q // N_KV, G_PAD=4 if trans else 16, D=D, HALF=D // 2, BLOCK_K=16, HIDDEN=HIDDEN,
        HIDDEN_PAD=triton.next_power_of_2(HIDDEN), PDL=pdl, PREFETCH=prefetch, TRANS=trans, num_warps=1, num_stages=4,
        launch_pdl=pdl,
    )  # fmt: skip
    return out


def setup(rows: int, prompt: int, slot: int):
    dev = torch.device("cuda")
    g = torch.Generator(dev).manual_seed(0)
    stream = torch.randn(rows, HIDDEN, generator=g, device=dev).bfloat16()  # [B, H]
    wqkv = (torch.randn((N_Q + 2 * N_KV) * D, HIDDEN, generator=g, device=dev) * 0.05).bfloat16()  # [15 D, H]
    qkv = torch.empty(rows, (N_Q + 2 * N_KV) * D, device=dev, dtype=torch.bfloat16)  # [B, 15 D]
    cos = torch.randn(C, D, device=dev, generator=g)  # [positions, D]
    sin = torch.randn(C, D, device=dev, generator=g)
    caches = [torch.randn(2, rows, N_KV, C, D, generator=g, device=dev).bfloat16() for _ in range(LAYERS)]
    share = (torch.arange(rows, device=dev) // GROUP) * GROUP  # a group's first row holds its prompt
    out = torch.empty(rows, N_Q * D, device=dev, dtype=torch.bfloat16)  # [B, Hq * D]
    pos0 = torch.full((rows,), prompt - 1, dtype=torch.long, device=dev)
    slot0 = torch.tensor([prompt - 1], device=dev)
    step = torch.tensor([slot - prompt + 1], device=dev)
    return stream, wqkv, qkv, cos, sin, pos0, slot0, step, caches, share, out


def work(arm, inputs, bucket, product=True):
    stream, wqkv, qkv, cos, sin, pos0, slot0, step, caches, share, out = inputs
    for kv in caches:
        if product:
            torch.mm(stream, wqkv.t(), out=qkv)
        if arm == "product":
            continue
        attend(arm, qkv, cos, sin, pos0, slot0, step, kv, share, out, stream, bucket)


def time_arm(arm, inputs, bucket, replays, product=True) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        work(arm, inputs, bucket, product)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        work(arm, inputs, bucket, product)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / replays / LAYERS


def bits(arm, rows, prompt, slot, bucket):
    inputs = setup(rows, prompt, slot)
    stream, wqkv, qkv, *_ = inputs
    torch.mm(stream, wqkv.t(), out=qkv)
    out = attend(arm, qkv, *inputs[3:8], inputs[8][0], inputs[9], inputs[10], stream, bucket).clone()
    return out, inputs[8][0].clone()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="512")
    ap.add_argument("--slots", default="184:192,300:320")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--prompt", type=int, default=57)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--replays", type=int, default=20)
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    arms = args.arms.split(",")
    slots = [tuple(int(x) for x in s.split(":")) for s in args.slots.split(",")]
    for r in [int(x) for x in args.rows.split(",")]:
        ref = bits("lib", r, args.prompt, *slots[0])
        for a in arms[1:]:
            got = bits(a, r, args.prompt, *slots[0])
            same = all(torch.equal(x, y) for x, y in zip(ref, got))
            print(f"{r} rows, {a}: output and cache {'the library bits' if same else 'DIFFER'}", flush=True)
    times = {}
    for _ in range(args.rounds):
        for r in [int(x) for x in args.rows.split(",")]:
            for slot, bucket in slots:
                inputs = setup(r, args.prompt, slot)
                times.setdefault((r, slot, "product alone"), []).append(
                    time_arm("lib", inputs, bucket, args.replays, False) * 0
                )
                for a in arms:
                    times.setdefault((r, slot, a), []).append(time_arm(a, inputs, bucket, args.replays))
                times.setdefault((r, slot, "lib, no product"), []).append(
                    time_arm("lib", inputs, bucket, args.replays, False)
                )
                del inputs
                torch.cuda.empty_cache()
    print(f"{'rows':>5} {'slot':>5} {'arm':<16} {'us a layer':>10} {'/ lib':>7}  runs")
    for (r, slot, a), v in times.items():
        base = statistics.median(times[(r, slot, "lib")])
        med = statistics.median(v)
        print(f"{r:>5} {slot:>5} {a:<16} {med:10.2f} {med / base:7.3f}  {' '.join(f'{x:.2f}' for x in v)}", flush=True)


if __name__ == "__main__":
    main()

"""gate|up and the SiLU-gate in one launch at a wide step: x [M, H] (the residual stream) times the folded gate|up
weights [2I, H], each row's 1 / rms applied, silu(gate) * up stored as act [M, I]; the [M, 2I] product is never
written."""

import triton
import triton.language as tl


@triton.jit
def _gate_up_act_kernel(
    x_ptr, w_ptr, out_ptr, M, eps,
    H: tl.constexpr, INTER: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, ROUND: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    m_ok = rm < M
    acc_g = tl.zeros([BM, BN], tl.float32)
    acc_u = tl.zeros([BM, BN], tl.float32)
    ss = tl.zeros([BM], tl.float32)
    for k0 in range(0, H, BK):
        ks = k0 + rk
        a = tl.load(x_ptr + rm[:, None] * H + ks[None, :], mask=m_ok[:, None], other=0.0)  # [BM, BK]
        wg = tl.load(w_ptr + rn[:, None] * H + ks[None, :])  # [BN, BK]
        wu = tl.load(w_ptr + (INTER + rn)[:, None] * H + ks[None, :])
        acc_g = tl.dot(a, tl.trans(wg), acc_g)
        acc_u = tl.dot(a, tl.trans(wu), acc_u)
        af = a.to(tl.float32)
        ss += tl.sum(af * af, axis=1)
    inv = (1.0 / tl.sqrt(ss / H + eps))[:, None]  # [BM, 1]
    if ROUND:  # as cuBLAS's product is stored: rounded to bf16 before the row's 1 / rms
        acc_g = acc_g.to(out_ptr.dtype.element_ty).to(tl.float32)
        acc_u = acc_u.to(out_ptr.dtype.element_ty).to(tl.float32)
    gate = acc_g * inv
    up = acc_u * inv
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + rm[:, None] * INTER + rn[None, :], (act * up).to(out_ptr.dtype.element_ty), mask=m_ok[:, None])


def gate_up_act(x, w, out, eps, bm=64, bn=64, bk=64, warps=4, stages=4, round_=True):
    M, H = x.shape
    inter = out.shape[1]
    grid = (triton.cdiv(M, bm), inter // bn)
    _gate_up_act_kernel[grid](
        x, w, out, M, eps, H=H, INTER=inter, BM=bm, BN=bn, BK=bk, ROUND=round_, num_warps=warps, num_stages=stages
    )
    return out

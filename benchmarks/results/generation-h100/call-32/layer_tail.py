"""A wide layer's tail (o_proj, gate|up with its SiLU-gate, down_proj) as one persistent kernel against the decoder's
four launches (cuBLAS o_proj adding into the stream, cuBLAS gate|up, the library's SiLU-gate, cuBLAS down_proj
adding into the stream), 512 rows of SmolLM2-135M's shapes, random operands.

The persistent kernel runs one program an SM; each walks the tiles of a phase, then waits at a grid-wide barrier
(an atomic count at GPU scope) until every program has finished the phase, since the next phase reads what all of
them wrote: x += a @ Wo^T; act = silu(g / rms(x)) * (u / rms(x)) for [g | u] = x @ Wgu^T; x += act @ Wd^T. Each
output tile is one program's, so the sums do not depend on timing. This is a measurement, not the library: it
sizes what the grid-wide waits cost against the launches they replace.

    python3 layer_tail.py
"""

import torch
import triton
import triton.language as tl
from grpo_knobs.rollout.kernels import silu_mul

from benchmarks.decode_kernels import per_launch_us

ROWS, H, INTER, EPS, REPS, ITERS = 512, 576, 1536, 1e-5, 30, 50
BM, BN, BK = 64, 64, 64


@triton.jit
def _grid_wait(bar_ptr, n_progs):
    """Count this program in at the barrier and wait until the count reaches the next multiple of n_progs."""
    tl.debug_barrier()  # every thread's stores issued before the count
    old = tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    target = (old // n_progs + 1) * n_progs
    while tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu") < target:
        pass
    tl.debug_barrier()


@triton.jit
def _tile_dot(a_ptr, lda, w_ptr, ldw, rows, cols, K: tl.constexpr, BK: tl.constexpr, acc):
    """acc += a[rows, :K] @ w[cols, :K]^T, a and w read past L1 (other programs wrote them this launch)."""
    k = tl.arange(0, BK)
    for k0 in range(0, K, BK):
        a = tl.load(a_ptr + rows[:, None] * lda + (k0 + k)[None, :], cache_modifier=".cg")  # [BM, BK]
        w = tl.load(w_ptr + cols[:, None] * ldw + (k0 + k)[None, :], cache_modifier=".cg")  # [BN, BK]
        acc = tl.dot(a, tl.trans(w), acc)
    return acc


@triton.jit
def _row_inv_rms(x_ptr, rows, H: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, eps):
    """1 / sqrt(mean(x^2) + eps) of x's rows, read BK columns at a time past L1."""
    k = tl.arange(0, BK)
    sq = tl.zeros([BM], tl.float32)
    for k0 in range(0, H, BK):
        xr = tl.load(x_ptr + rows[:, None] * H + (k0 + k)[None, :], cache_modifier=".cg").to(tl.float32)  # [BM, BK]
        sq += tl.sum(xr * xr, axis=1)
    return 1.0 / tl.sqrt(sq / H + eps)


@triton.jit
def _layer_tail_kernel(
    a_ptr, x_ptr, wo_ptr, wgu_ptr, wd_ptr, act_ptr, bar_ptr, eps, n_progs,
    M: tl.constexpr, H: tl.constexpr, INTER: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    rm, rn = tl.arange(0, BM), tl.arange(0, BN)
    tiles_h = (M // BM) * (H // BN)
    # o_proj: x += a @ Wo^T
    for t in range(pid, tiles_h, n_progs):
        rows, cols = (t // (H // BN)) * BM + rm, (t % (H // BN)) * BN + rn
        acc = _tile_dot(a_ptr, H, wo_ptr, H, rows, cols, H, BK, tl.zeros([BM, BN], tl.float32))
        at = x_ptr + rows[:, None] * H + cols[None, :]
        tl.store(at, (tl.load(at, cache_modifier=".cg").to(tl.float32) + acc).to(x_ptr.dtype.element_ty))
    _grid_wait(bar_ptr, n_progs)
    # gate|up and the SiLU-gate, the row's 1 / rms applied to both
    tiles_i = (M // BM) * (INTER // BN)
    for t in range(pid, tiles_i, n_progs):
        rows, cols = (t // (INTER // BN)) * BM + rm, (t % (INTER // BN)) * BN + rn
        inv = _row_inv_rms(x_ptr, rows, H, BM, BK, eps)  # [BM]
        g = _tile_dot(x_ptr, H, wgu_ptr, H, rows, cols, H, BK, tl.zeros([BM, BN], tl.float32)) * inv[:, None]
        u = _tile_dot(x_ptr, H, wgu_ptr, H, rows, INTER + cols, H, BK, tl.zeros([BM, BN], tl.float32)) * inv[:, None]
        act = (g / (1.0 + tl.exp(-g))) * u
        tl.store(act_ptr + rows[:, None] * INTER + cols[None, :], act.to(act_ptr.dtype.element_ty))
    _grid_wait(bar_ptr, n_progs)
    # down_proj: x += act @ Wd^T
    for t in range(pid, tiles_h, n_progs):
        rows, cols = (t // (H // BN)) * BM + rm, (t % (H // BN)) * BN + rn
        acc = _tile_dot(act_ptr, INTER, wd_ptr, INTER, rows, cols, INTER, BK, tl.zeros([BM, BN], tl.float32))
        at = x_ptr + rows[:, None] * H + cols[None, :]
        tl.store(at, (tl.load(at, cache_modifier=".cg").to(tl.float32) + acc).to(x_ptr.dtype.element_ty))


def persistent_tail(a, x, wo, wgu, wd, act, bar, n_progs, stages):
    _layer_tail_kernel[(n_progs,)](
        a, x, wo, wgu, wd, act, bar, EPS, n_progs, M=x.shape[0], H=H, INTER=INTER, BM=BM, BN=BN, BK=BK,
        num_warps=4, num_stages=stages,
    )  # fmt: skip


def launched_tail(a, x, wo, wgu, wd, act):
    x.addmm_(a, wo.t())
    gate_up = torch.nn.functional.linear(x, wgu)  # [M, 2I]
    silu_mul(gate_up, act, stream=x, eps=EPS)
    x.addmm_(act, wd.t())


def main() -> None:
    device = torch.device("cuda")
    bf16 = dict(device=device, dtype=torch.bfloat16)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    a, x0 = torch.randn(ROWS, H, **bf16), torch.randn(ROWS, H, **bf16)  # [M, H] attention output, residual stream
    wo, wgu, wd = (torch.randn(n, k, **bf16) / k**0.5 for n, k in ((H, H), (2 * INTER, H), (H, INTER)))  # [N, K]
    bar = torch.zeros(1, device=device, dtype=torch.int32)
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, triton {triton.__version__}, {sms} SMs")

    ref, act_ref = x0.clone(), torch.empty(ROWS, INTER, **bf16)
    launched_tail(a, ref, wo, wgu, wd, act_ref)
    for stages in (2, 3):
        for n_progs in (sms, sms // 2):
            x, act = x0.clone(), torch.empty(ROWS, INTER, **bf16)
            persistent_tail(a, x, wo, wgu, wd, act, bar, n_progs, stages)
            torch.cuda.synchronize()
            err = ((x.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            act_err = ((act.float() - act_ref.float()).abs().max() / act_ref.float().abs().max()).item()
            print(f"  persistent, {n_progs} programs, {stages} stages: |x - launched| {err:.2e}, act {act_err:.2e}")

    x, act = x0.clone(), torch.empty(ROWS, INTER, **bf16)
    arms = {"four launches (cuBLAS, SiLU-gate, cuBLAS, cuBLAS)": lambda: launched_tail(a, x, wo, wgu, wd, act)}
    for stages in (2, 3):
        for n_progs in (sms, sms // 2):
            arms[f"one persistent launch, {n_progs} programs, {stages} stages"] = lambda n=n_progs, s=stages: (
                persistent_tail(a, x, wo, wgu, wd, act, bar, n, s)
            )
    first = None
    for name, fn in arms.items():
        us = min(per_launch_us(fn, REPS, ITERS, device) for _ in range(3))
        first = first or us
        print(f"{name:<58} {us:7.2f} us a layer  {us / first:.3f}x")


if __name__ == "__main__":
    main()

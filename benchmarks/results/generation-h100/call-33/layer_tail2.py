"""A wide layer's tail (o_proj, gate|up with its SiLU-gate, down_proj) as one persistent Triton launch, second form,
taken apart: what the grid-wide barriers cost alone, what the same Triton tiles cost as three ordinary launches,
and the persistent launch over a small sweep of tile shapes, against the decoder's four launches (cuBLAS o_proj
adding into the stream, cuBLAS gate|up, the library's SiLU-gate, cuBLAS down_proj adding into the stream).
512 rows of SmolLM2-135M's shapes, random operands, 30 layers' worth in one CUDA graph.

Against the first form (call 32): gate and up share one loop over K (one load of the stream's tile feeds both
products), the row's sum of squares for 1 / rms is taken from the same tiles, and tile shapes are per phase.

    python3 layer_tail2.py            # on a GPU
    TRITON_INTERPRET=1 python3 layer_tail2.py --check   # the arithmetic, one program, no barriers (CPU)
"""

import argparse
import itertools

import torch
import triton
import triton.language as tl
from grpo_knobs.rollout import kernels  # noqa: F401  (mends run-time loop bounds in Triton's interpreter)

ROWS, H, INTER, EPS, REPS, ITERS = 512, 576, 1536, 1e-5, 30, 50


@triton.jit
def _grid_wait(bar_ptr, n_progs):
    """Count this program in and wait until the count reaches the next multiple of n_progs (GPU scope)."""
    tl.debug_barrier()  # every thread's stores issued before the count
    old = tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    target = (old // n_progs + 1) * n_progs
    while tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu") < target:
        pass
    tl.debug_barrier()


@triton.jit
def _add_product(a_ptr, w_ptr, x_ptr, pid, n_progs, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """x[M, N] += a[M, K] @ w[N, K]^T, one BM x BN output tile a program at a time."""
    k = tl.arange(0, BK)
    for t in range(pid, (M // BM) * (N // BN), n_progs):
        rows = (t // (N // BN)) * BM + tl.arange(0, BM)
        cols = (t % (N // BN)) * BN + tl.arange(0, BN)
        acc = tl.zeros([BM, BN], tl.float32)
        for k0 in range(0, K, BK):
            a = tl.load(a_ptr + rows[:, None] * K + (k0 + k)[None, :], cache_modifier=".cg")  # [BM, BK]
            w = tl.load(w_ptr + cols[:, None] * K + (k0 + k)[None, :])  # [BN, BK]
            acc = tl.dot(a, tl.trans(w), acc)
        at = x_ptr + rows[:, None] * N + cols[None, :]
        tl.store(at, (tl.load(at, cache_modifier=".cg").to(tl.float32) + acc).to(x_ptr.dtype.element_ty))


@triton.jit
def _gate_up(x_ptr, w_ptr, act_ptr, eps, pid, n_progs, M: tl.constexpr, H: tl.constexpr, INTER: tl.constexpr,
             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """act = silu(g / rms(x)) * (u / rms(x)) for [g | u] = x @ w^T: gate and up tiles and the rows' sum of
    squares from one pass over x's tiles."""
    k = tl.arange(0, BK)
    for t in range(pid, (M // BM) * (INTER // BN), n_progs):
        rows = (t // (INTER // BN)) * BM + tl.arange(0, BM)
        cols = (t % (INTER // BN)) * BN + tl.arange(0, BN)
        g, u = tl.zeros([BM, BN], tl.float32), tl.zeros([BM, BN], tl.float32)
        sq = tl.zeros([BM], tl.float32)
        for k0 in range(0, H, BK):
            xa = tl.load(x_ptr + rows[:, None] * H + (k0 + k)[None, :], cache_modifier=".cg")  # [BM, BK]
            wg = tl.load(w_ptr + cols[:, None] * H + (k0 + k)[None, :])  # [BN, BK]
            wu = tl.load(w_ptr + (INTER + cols)[:, None] * H + (k0 + k)[None, :])  # [BN, BK]
            g = tl.dot(xa, tl.trans(wg), g)
            u = tl.dot(xa, tl.trans(wu), u)
            xf = xa.to(tl.float32)
            sq += tl.sum(xf * xf, axis=1)
        inv = 1.0 / tl.sqrt(sq / H + eps)  # [BM]
        g, u = g * inv[:, None], u * inv[:, None]
        act = (g / (1.0 + tl.exp(-g))) * u
        tl.store(act_ptr + rows[:, None] * INTER + cols[None, :], act.to(act_ptr.dtype.element_ty))


@triton.jit
def _tail_kernel(
    a_ptr, x_ptr, wo_ptr, wgu_ptr, wd_ptr, act_ptr, bar_ptr, eps, n_progs,
    M: tl.constexpr, H: tl.constexpr, INTER: tl.constexpr, BK: tl.constexpr,
    BM1: tl.constexpr, BN1: tl.constexpr, BM2: tl.constexpr, BN2: tl.constexpr, BM3: tl.constexpr, BN3: tl.constexpr,
    PHASES: tl.constexpr, BARRIER: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    if PHASES & 1:
        _add_product(a_ptr, wo_ptr, x_ptr, pid, n_progs, M, H, H, BM1, BN1, BK)  # x += a @ Wo^T
    if BARRIER:
        _grid_wait(bar_ptr, n_progs)
    if PHASES & 2:
        _gate_up(x_ptr, wgu_ptr, act_ptr, eps, pid, n_progs, M, H, INTER, BM2, BN2, BK)
    if BARRIER:
        _grid_wait(bar_ptr, n_progs)
    if PHASES & 4:
        _add_product(act_ptr, wd_ptr, x_ptr, pid, n_progs, M, H, INTER, BM3, BN3, BK)  # x += act @ Wd^T


def tail(ops, n_progs, cfg, phases=7, barrier=True):
    a, x, wo, wgu, wd, act, bar = ops
    bm1, bn1, bm2, bn2, bm3, bn3, warps, stages = cfg
    _tail_kernel[(n_progs,)](
        a, x, wo, wgu, wd, act, bar, EPS, n_progs, M=x.shape[0], H=H, INTER=INTER, BK=64,
        BM1=bm1, BN1=bn1, BM2=bm2, BN2=bn2, BM3=bm3, BN3=bn3, PHASES=phases, BARRIER=barrier,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip


def tiles(cfg):
    bm1, bn1, bm2, bn2, bm3, bn3 = cfg[:6]
    return (ROWS // bm1) * (H // bn1), (ROWS // bm2) * (INTER // bn2), (ROWS // bm3) * (H // bn3)


def three_launches(ops, cfg):
    for phase, n in zip((1, 2, 4), tiles(cfg)):
        tail(ops, n, cfg, phases=phase, barrier=False)


def reference(a, x, wo, wgu, wd):
    """The tail in float32 from the bf16 operands."""
    x = x.float() + a.float() @ wo.float().t()
    inv = torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS)
    g, u = (x @ wgu.float().t() * inv).chunk(2, dim=-1)
    act = (torch.nn.functional.silu(g) * u).to(wd.dtype).float()
    return x + act @ wd.float().t(), act


def operands(rows, device, dtype=torch.bfloat16):
    bf16 = dict(device=device, dtype=dtype)
    a, x = torch.randn(rows, H, **bf16), torch.randn(rows, H, **bf16)  # [M, H] attention output, stream
    wo, wgu, wd = (torch.randn(n, k, **bf16) / k**0.5 for n, k in ((H, H), (2 * INTER, H), (H, INTER)))  # [N, K]
    act = torch.empty(rows, INTER, **bf16)
    return [a, x, wo, wgu, wd, act, torch.zeros(1, device=device, dtype=torch.int32)]


def rel_err(got, want):
    return ((got.float() - want).abs().max() / want.abs().max()).item()


def check() -> None:
    """The arithmetic in Triton's interpreter (float32: its dot reads no bf16): one program walks every tile
    of each phase in order."""
    global ROWS
    ROWS = 64
    ops = operands(ROWS, torch.device("cpu"), torch.float32)
    x0 = ops[1].clone()
    want_x, want_act = reference(*ops[:5])
    for cfg in ((64, 64, 64, 64, 64, 64, 4, 1), (32, 32, 64, 32, 32, 64, 4, 1)):
        ops[1].copy_(x0)
        tail(ops, 1, cfg, barrier=False)
        print(f"{cfg}: x {rel_err(ops[1], want_x):.2e}, act {rel_err(ops[5], want_act):.2e}")
        assert rel_err(ops[1], want_x) < 1e-5 and rel_err(ops[5], want_act) < 1e-5


def launched(ops):
    from grpo_knobs.rollout.kernels import silu_mul

    a, x, wo, wgu, wd, act, _ = ops
    x.addmm_(a, wo.t())
    silu_mul(torch.nn.functional.linear(x, wgu), act, stream=x, eps=EPS)
    x.addmm_(act, wd.t())


def main() -> None:
    from benchmarks.decode_kernels import per_launch_us

    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, triton {triton.__version__}, {sms} SMs")
    ops = operands(ROWS, device)
    x0 = ops[1].clone()
    want_x, want_act = reference(*ops[:5])
    launched(ops)
    print(f"four launches: |x - float32| {rel_err(ops[1], want_x):.2e}, act {rel_err(ops[5], want_act):.2e}")

    def timed(fn):
        return min(per_launch_us(fn, REPS, ITERS, device) for _ in range(3))

    base = timed(lambda: launched(ops))
    rows = [("four launches (cuBLAS o_proj, cuBLAS gate|up, SiLU-gate, cuBLAS down_proj)", base)]
    nothing = (64, 64, 64, 64, 64, 64, 4, 1)
    rows.append(("an empty launch, 132 programs", timed(lambda: tail(ops, sms, nothing, phases=0, barrier=False))))
    rows.append(("two grid-wide barriers alone, one launch", timed(lambda: tail(ops, sms, nothing, phases=0))))
    for name, row in rows:
        print(f"{name:<80} {row:7.2f} us  {row / base:.3f}x", flush=True)
    shapes = [
        (64, 64, 64, 64, 64, 64),
        (64, 64, 128, 64, 64, 64),
        (64, 32, 64, 64, 64, 32),
        (128, 64, 128, 64, 128, 32),
    ]
    for shape, warps, stages in itertools.product(shapes, (4, 8), (3, 4)):
        cfg = (*shape, warps, stages)
        ops[1].copy_(x0)
        try:
            tail(ops, sms, cfg)
            torch.cuda.synchronize()
        except Exception as exc:  # a shape that does not fit the SM's shared memory
            print(f"{cfg}: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}", flush=True)
            continue
        err = rel_err(ops[1], want_x)
        persistent = timed(lambda c=cfg: tail(ops, sms, c))
        apart = timed(lambda c=cfg: three_launches(ops, c))
        print(
            f"tiles {shape} (tiles a phase {tiles(cfg)}), {warps} warps, {stages} stages: |x - float32| {err:.2e}; "
            f"persistent {persistent:6.2f} us {persistent / base:.3f}x; three launches {apart:6.2f} us "
            f"{apart / base:.3f}x",
            flush=True,
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    check() if ap.parse_args().check else main()

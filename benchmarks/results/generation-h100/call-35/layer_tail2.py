"""A wide layer's tail (o_proj, gate|up with its SiLU-gate, down_proj) as one persistent Triton launch, second form,
taken apart, against the decoder's four launches (cuBLAS o_proj adding into the stream, cuBLAS gate|up, the
library's SiLU-gate, cuBLAS down_proj adding into the stream). 512 rows of SmolLM2-135M's shapes, random operands,
30 layers' worth in one CUDA graph. Arms:

- an empty launch of one program an SM, and one holding only two grid-wide barriers: what a barrier costs;
- the same Triton tiles as three ordinary launches, one a phase: what the tiles cost;
- `barrier`: one launch, the phases separated by grid-wide barriers (the first form's structure, call 32);
- `flow`: one launch, no grid-wide barrier: the tiles of all three phases form one list, each program takes
  every n-th, and a tile waits only for the tiles it reads (a gate|up tile for the o_proj tiles of its 64 rows,
  a down_proj tile for the gate|up tiles of its rows), counted per row block. The list is in dependency order
  and every program is resident, so the lowest unfinished tile can always run.

Every output tile is one program's, so no sum depends on timing. Against the first form, gate and up share one
loop over K (one load of the stream's tile feeds both products).

    python3 layer_tail2.py                               # on a GPU
    TRITON_INTERPRET=1 python3 layer_tail2.py --check    # the arithmetic on CPU, one program, no waits
"""

import argparse
import os

import torch
import triton
import triton.language as tl

if os.environ.get("TRITON_INTERPRET") == "1":
    from grpo_knobs.rollout import kernels  # noqa: F401  (mends run-time loop bounds in Triton's interpreter)

ROWS, H, INTER, EPS, REPS, ITERS = 512, 576, 1536, 1e-5, 30, 50
# (BM, o_proj's BN, gate|up's BN, down_proj's BN, warps, stages, BK)
CONFIGS = [
    (64, 64, 64, 64, 8, 4, 64),
    (64, 32, 64, 32, 8, 4, 64),
    (64, 32, 64, 32, 4, 3, 64),
    (64, 64, 64, 64, 4, 4, 128),
    (64, 64, 64, 64, 8, 3, 128),
]


@triton.jit
def _signal(cnt_ptr):
    """Count one finished tile in, after every thread's stores."""
    tl.debug_barrier()
    tl.atomic_add(cnt_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _wait(cnt_ptr, target):
    """Wait until the count reaches target (GPU scope; the reads that follow go past L1)."""
    while tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu") < target:
        pass
    tl.debug_barrier()


@triton.jit
def _grid_wait(bar_ptr, n_progs):
    """Count this program in and wait until the count reaches the next multiple of n_progs."""
    tl.debug_barrier()
    old = tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    _wait(bar_ptr, (old // n_progs + 1) * n_progs)


@triton.jit
def _add_tile(a_ptr, w_ptr, x_ptr, r0, c0, N: tl.constexpr, K: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """x[r0:r0+BM, c0:c0+BN] += a[rows, :K] @ w[cols, :K]^T."""
    rows, cols, k = r0 + tl.arange(0, BM), c0 + tl.arange(0, BN), tl.arange(0, BK)
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        ks = (k0 + k)[None, :]
        a = tl.load(a_ptr + rows[:, None] * K + ks, mask=ks < K, other=0.0, cache_modifier=".cg")  # [BM, BK]
        w = tl.load(w_ptr + cols[:, None] * K + ks, mask=ks < K, other=0.0)  # [BN, BK]
        acc = tl.dot(a, tl.trans(w), acc)
    at = x_ptr + rows[:, None] * N + cols[None, :]
    tl.store(at, (tl.load(at, cache_modifier=".cg").to(tl.float32) + acc).to(x_ptr.dtype.element_ty))


@triton.jit
def _gate_up_tile(x_ptr, w_ptr, act_ptr, eps, r0, c0, H: tl.constexpr, INTER: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """act[rows, cols] = silu(g / rms(x)) * (u / rms(x)) for [g | u] = x @ w^T: gate and up from one loop."""
    rows, cols, k = r0 + tl.arange(0, BM), c0 + tl.arange(0, BN), tl.arange(0, BK)
    sq = tl.zeros([BM], tl.float32)
    for k0 in range(0, H, BK):  # the rows' sum of squares first: x's tiles read twice, from L2
        ks = (k0 + k)[None, :]
        xf = tl.load(x_ptr + rows[:, None] * H + ks, mask=ks < H, other=0.0, cache_modifier=".cg").to(tl.float32)
        sq += tl.sum(xf * xf, axis=1)
    g, u = tl.zeros([BM, BN], tl.float32), tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, H, BK):
        ks = (k0 + k)[None, :]
        xa = tl.load(x_ptr + rows[:, None] * H + ks, mask=ks < H, other=0.0, cache_modifier=".cg")  # [BM, BK]
        wg = tl.load(w_ptr + cols[:, None] * H + ks, mask=ks < H, other=0.0)  # [BN, BK]
        wu = tl.load(w_ptr + (INTER + cols)[:, None] * H + ks, mask=ks < H, other=0.0)  # [BN, BK]
        g = tl.dot(xa, tl.trans(wg), g)
        u = tl.dot(xa, tl.trans(wu), u)
    inv = 1.0 / tl.sqrt(sq / H + eps)  # [BM]
    g, u = g * inv[:, None], u * inv[:, None]
    act = (g / (1.0 + tl.exp(-g))) * u
    tl.store(act_ptr + rows[:, None] * INTER + cols[None, :], act.to(act_ptr.dtype.element_ty))


@triton.jit
def _barrier_kernel(
    a_ptr, x_ptr, wo_ptr, wgu_ptr, wd_ptr, act_ptr, bar_ptr, eps, n_progs,
    M: tl.constexpr, H: tl.constexpr, INTER: tl.constexpr, BK: tl.constexpr,
    BM: tl.constexpr, BN1: tl.constexpr, BN2: tl.constexpr, BN3: tl.constexpr,
    PHASES: tl.constexpr, BARRIER: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    if PHASES & 1:
        for t in range(pid, (M // BM) * (H // BN1), n_progs):  # x += a @ Wo^T
            _add_tile(a_ptr, wo_ptr, x_ptr, (t // (H // BN1)) * BM, (t % (H // BN1)) * BN1, H, H, BM, BN1, BK)
    if BARRIER:
        _grid_wait(bar_ptr, n_progs)
    if PHASES & 2:
        for t in range(pid, (M // BM) * (INTER // BN2), n_progs):
            r0, c0 = (t // (INTER // BN2)) * BM, (t % (INTER // BN2)) * BN2
            _gate_up_tile(x_ptr, wgu_ptr, act_ptr, eps, r0, c0, H, INTER, BM, BN2, BK)
    if BARRIER:
        _grid_wait(bar_ptr, n_progs)
    if PHASES & 4:
        for t in range(pid, (M // BM) * (H // BN3), n_progs):  # x += act @ Wd^T
            _add_tile(act_ptr, wd_ptr, x_ptr, (t // (H // BN3)) * BM, (t % (H // BN3)) * BN3, H, INTER, BM, BN3, BK)


@triton.jit
def _flow_kernel(
    a_ptr, x_ptr, wo_ptr, wgu_ptr, wd_ptr, act_ptr, cnt_ptr, eps, n_progs,
    M: tl.constexpr, H: tl.constexpr, INTER: tl.constexpr, BK: tl.constexpr,
    BM: tl.constexpr, BN1: tl.constexpr, BN2: tl.constexpr, BN3: tl.constexpr, QUEUE: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    RB: tl.constexpr = M // BM
    T1: tl.constexpr = RB * (H // BN1)
    T2: tl.constexpr = RB * (INTER // BN2)
    # cnt_ptr: [2 RB + 2] int32: o_proj tiles done by row block, gate|up tiles done by row block, programs done,
    # tickets taken.
    # Counts only grow; the launch's number (programs done // n_progs: every earlier launch has ended, and at
    # most n_progs - 1 programs of this one) tells each wait its target.
    launch = tl.atomic_add(cnt_ptr + 2 * RB, 0, sem="acquire", scope="gpu") // n_progs
    TOTAL: tl.constexpr = T1 + T2 + RB * (H // BN3)
    # QUEUE: a program takes the next untaken tile when it is free (a ticket count, which every program
    # also overshoots once a launch) instead of every n-th tile.
    t = pid
    if QUEUE:
        t = tl.atomic_add(cnt_ptr + 2 * RB + 1, 1, sem="relaxed", scope="gpu") - launch * (TOTAL + n_progs)
    while t < TOTAL:
        if t < T1:
            rb = t // (H // BN1)
            _add_tile(a_ptr, wo_ptr, x_ptr, rb * BM, (t % (H // BN1)) * BN1, H, H, BM, BN1, BK)
            _signal(cnt_ptr + rb)
        elif t < T1 + T2:
            rb = (t - T1) // (INTER // BN2)
            _wait(cnt_ptr + rb, (launch + 1) * (H // BN1))
            c0 = ((t - T1) % (INTER // BN2)) * BN2
            _gate_up_tile(x_ptr, wgu_ptr, act_ptr, eps, rb * BM, c0, H, INTER, BM, BN2, BK)
            _signal(cnt_ptr + RB + rb)
        else:
            rb = (t - T1 - T2) // (H // BN3)
            _wait(cnt_ptr + RB + rb, (launch + 1) * (INTER // BN2))
            c0 = ((t - T1 - T2) % (H // BN3)) * BN3
            _add_tile(act_ptr, wd_ptr, x_ptr, rb * BM, c0, H, INTER, BM, BN3, BK)
        if QUEUE:
            t = tl.atomic_add(cnt_ptr + 2 * RB + 1, 1, sem="relaxed", scope="gpu") - launch * (TOTAL + n_progs)
        else:
            t += n_progs
    tl.atomic_add(cnt_ptr + 2 * RB, 1, sem="release", scope="gpu")


def phase_tiles(cfg):
    bm, bn1, bn2, bn3 = cfg[:4]
    return (ROWS // bm) * (H // bn1), (ROWS // bm) * (INTER // bn2), (ROWS // bm) * (H // bn3)


def consts(ops, cfg):
    bm, bn1, bn2, bn3, warps, stages, bk = cfg
    return dict(M=ops[1].shape[0], H=H, INTER=INTER, BK=bk, BM=bm, BN1=bn1, BN2=bn2, BN3=bn3,
                num_warps=warps, num_stages=stages)  # fmt: skip


def barrier(ops, n_progs, cfg, phases=7, wait=True):
    _barrier_kernel[(n_progs,)](*ops[:7], EPS, n_progs, **consts(ops, cfg), PHASES=phases, BARRIER=wait)


def three_launches(ops, cfg):
    for phase, n in zip((1, 2, 4), phase_tiles(cfg)):
        barrier(ops, n, cfg, phases=phase, wait=False)


def flow(ops, n_progs, cfg, queue=False):
    _flow_kernel[(n_progs,)](*ops[:6], ops[7], EPS, n_progs, **consts(ops, cfg), QUEUE=queue)


def reference(a, x, wo, wgu, wd):
    """The tail in float32 from the operands."""
    x = x.float() + a.float() @ wo.float().t()
    inv = torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS)
    g, u = (x @ wgu.float().t() * inv).chunk(2, dim=-1)
    act = (torch.nn.functional.silu(g) * u).to(wd.dtype).float()
    return x + act @ wd.float().t(), act


def operands(rows, device, dtype=torch.bfloat16):
    """a, x [M, H]; Wo, Wgu, Wd [N, K]; act [M, I]; the barrier's count; the flow's counts."""
    kw = dict(device=device, dtype=dtype)
    a, x = torch.randn(rows, H, **kw), torch.randn(rows, H, **kw)
    wo, wgu, wd = (torch.randn(n, k, **kw) / k**0.5 for n, k in ((H, H), (2 * INTER, H), (H, INTER)))
    counts = torch.zeros(2 * rows // 32 + 2, device=device, dtype=torch.int32)
    bar = torch.zeros(1, device=device, dtype=torch.int32)
    return [a, x, wo, wgu, wd, torch.empty(rows, INTER, **kw), bar, counts]


def rel_err(got, want):
    return ((got.float() - want).abs().max() / want.abs().max()).item()


def check() -> None:
    """The arithmetic in Triton's interpreter (float32: its dot reads no bf16); one program walks every tile in
    order, so no wait ever waits."""
    global ROWS
    ROWS = 64
    ops = operands(ROWS, torch.device("cpu"), torch.float32)
    x0 = ops[1].clone()
    want_x, want_act = reference(*ops[:5])
    for cfg in ((64, 64, 64, 64, 4, 1, 64), (32, 32, 64, 32, 4, 1, 128)):
        for name, fn in (
            ("barrier", lambda c=cfg: barrier(ops, 1, c, wait=False)),
            ("flow", lambda c=cfg: flow(ops, 1, c)),
            ("flow, queue", lambda c=cfg: flow(ops, 1, c, queue=True)),
        ):
            ops[1].copy_(x0)
            ops[7].zero_()
            fn()
            print(f"{name} {cfg}: x {rel_err(ops[1], want_x):.2e}, act {rel_err(ops[5], want_act):.2e}")
            assert rel_err(ops[1], want_x) < 1e-5 and rel_err(ops[5], want_act) < 1e-5


def launched(ops):
    from grpo_knobs.rollout.kernels import silu_mul

    a, x, wo, wgu, wd, act = ops[:6]
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
    want_x, _ = reference(*ops[:5])

    def err(fn):
        ops[1].copy_(x0)
        fn()
        torch.cuda.synchronize()
        return rel_err(ops[1], want_x)

    def timed(fn):
        return min(per_launch_us(fn, REPS, ITERS, device) for _ in range(3))

    e = err(lambda: launched(ops))
    base = timed(lambda: launched(ops))
    print(f"{'four launches (cuBLAS o_proj, cuBLAS gate|up, SiLU-gate, cuBLAS down_proj)':<78} {base:6.2f} us  "
          f"|x - float32| {e:.2e}")  # fmt: skip
    nothing = (64, 64, 64, 64, 4, 1, 64)
    for name, fn in (
        ("an empty launch, one program an SM", lambda: barrier(ops, sms, nothing, phases=0, wait=False)),
        ("two grid-wide barriers alone, one launch", lambda: barrier(ops, sms, nothing, phases=0)),
    ):
        us = timed(fn)
        print(f"{name:<78} {us:6.2f} us  {us / base:.3f}x", flush=True)
    for cfg in CONFIGS:
        arms = {
            "three launches": lambda c=cfg: three_launches(ops, c),
            "barrier": lambda c=cfg: barrier(ops, sms, c),
            "flow": lambda c=cfg: flow(ops, sms, c),
            "flow, queue": lambda c=cfg: flow(ops, sms, c, queue=True),
        }
        cells = []
        for name, fn in arms.items():
            ops[7].zero_()  # the flow's counts, which each arm's launches must start from zero
            try:
                e = err(fn)
            except Exception as exc:  # a shape that does not fit an SM's shared memory
                cells.append(f"{name} {type(exc).__name__}")
                continue
            us = timed(fn)
            cells.append(f"{name} {us:6.2f} us {us / base:.3f}x (err {e:.1e})")
        print(f"tiles {cfg[:4]} {phase_tiles(cfg)}, {cfg[4]}w {cfg[5]}s BK {cfg[6]}: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    check() if ap.parse_args().check else main()

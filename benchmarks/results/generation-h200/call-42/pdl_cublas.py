"""Does a cuBLAS product at the decode step's shapes let a kernel launched after it start before it ends?

Programmatic dependent launch: a kernel launched with the attribute may start once every program of the kernel
before it has called griddepcontrol.launch_dependents (or ended), and waits for that kernel's writes only at
griddepcontrol.wait. Work before its wait (decode attention's cache reads, which need nothing the product
writes) overlaps the product only if the product triggers before it ends. Here a stamp kernel of one program
an SM, launched after each product with PDL, records %globaltimer at its start (t0) and after its wait (t1).
A control product in Triton that triggers at its start shows what an early trigger looks like.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait, globaltimer

SHAPES = {"qkv": (960, 576), "o_proj": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}


@triton.jit
def stamp(t_ptr, WAIT: tl.constexpr):
    pid = tl.program_id(0)
    t0 = globaltimer()
    if WAIT:
        gdc_wait()
    t1 = globaltimer()
    tl.store(t_ptr + pid * 2, t0)
    tl.store(t_ptr + pid * 2 + 1, t1)


@triton.jit
def busy(x_ptr, n_iter, TRIGGER: tl.constexpr):
    # A stand-in product that triggers its dependents at its start, then works for a while.
    if TRIGGER:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    acc = tl.load(x_ptr + pid).to(tl.float32)
    for _ in range(n_iter):
        acc = acc * 1.0000001 + 1e-7
    tl.store(x_ptr + pid, acc)


def trial(shape: str, x, ws, before, after, pdl: bool, sms: int, spin):
    stamp[(sms,)](before, WAIT=False)
    if shape == "busy":
        busy[(sms,)](spin, 20000, TRIGGER=True)
    else:
        torch.nn.functional.linear(x, ws[shape])
    stamp[(sms,)](after, WAIT=pdl, launch_pdl=pdl)


def summarize(before, after) -> tuple[float, float, float]:
    b = before.view(-1, 2).double()
    a = after.view(-1, 2).double()
    gemm_start = b[:, 1].max()
    return (
        ((a[:, 0].min() - gemm_start) / 1e3).item(),  # the first stamp program's start, after the product's
        ((a[:, 1].min() - gemm_start) / 1e3).item(),  # the first wait's return
        ((a[:, 1].min() - a[:, 0].min()) / 1e3).item(),  # how long before the wait returned a program stood
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, {sms} SMs")
    x = torch.randn(args.rows, 576, device=dev).bfloat16()
    xd = torch.randn(args.rows, 1536, device=dev).bfloat16()
    ws = {k: torch.randn(n, k_, device=dev).bfloat16() * 0.02 for k, (n, k_) in SHAPES.items()}
    before = torch.zeros(sms * 2, dtype=torch.int64, device=dev)
    after = torch.zeros_like(before)
    spin = torch.zeros(sms, device=dev)
    print(
        f"{'product':<8} {'launch':<6} {'mode':<6} {'start us':>9} {'wait ends us':>13} {'stood us':>9}"
        f"  (after the product's start; medians of {args.reps})"
    )
    for shape in [*SHAPES, "busy"]:
        inp = xd if shape == "down" else x
        for pdl in (False, True):
            for mode in ("eager", "graph"):
                rows = []
                if mode == "graph":
                    side = torch.cuda.Stream()
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        trial(shape, inp, ws, before, after, pdl, sms, spin)
                    torch.cuda.current_stream().wait_stream(side)
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        trial(shape, inp, ws, before, after, pdl, sms, spin)
                for _ in range(args.reps):
                    if mode == "graph":
                        g.replay()
                    else:
                        trial(shape, inp, ws, before, after, pdl, sms, spin)
                    torch.cuda.synchronize()
                    rows.append(summarize(before, after))
                med = [statistics.median(r[i] for r in rows) for i in range(3)]
                launch = "pdl" if pdl else "plain"
                print(f"{shape:<8} {launch:<6} {mode:<6} {med[0]:9.2f} {med[1]:13.2f} {med[2]:9.2f}", flush=True)


if __name__ == "__main__":
    main()

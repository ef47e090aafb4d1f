"""A wide decode step with the next layer's reads asked into L2 while the products run.

A 512-row step's products and small kernels leave HBM nearly idle (7-28% of its bandwidth under Nsight Compute),
while decode attention waits on HBM. This probe builds the wide step as the library runs it (cuBLAS q|k|v over the
stream, the library's rotary_attention with the row norm, o_proj adding into the stream, gate|up, the library's
silu_mul, down_proj adding into the stream; 30 layers; the final norm and lm_head), with random operands of
SmolLM2-135M's shapes, and adds a launch that asks HBM for bytes a later kernel will read
(cp.async.bulk.prefetch.L2: one instruction a contiguous range, nothing comes back to the SM):

- kvN: layer i+1's keys and values, each row's first decoded slots up to N MB a layer (``all``: every decoded
  slot), and each group's prompt slots from the row that holds them;
- w: layer i's o_proj, gate|up and down_proj weights and layer i+1's q|k|v weights.

Where: ``A`` after layer i's attention, ``B`` after its SiLU-gate; a side stream forked from the step (``s``,
joined at the step's end) or the step's own stream (``m``). Layer 0's ranges are asked for after lm_head. The
outputs must be the same bits in every arm (a prefetch moves no data the kernels see). Arms are timed
interleaved, one CUDA graph a step.

    python3 l2_prefetch.py --slot 184 --arms base,As-kv16,As-kv32,As-kvall,Bs-kv32,As-w,As-kv32w,Am-kv32
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from grpo_knobs.rollout import kernels as K

N_Q, N_KV, D, H, INTER, LAYERS, GROUP, VOCAB = 9, 3, 64, 576, 1536, 30, 8, 49152
QKV = (N_Q + 2 * N_KV) * D
PIECE = 1 << 16  # bytes a weight-range prefetch instruction asks for


@triton.jit
def _prefetch(addr, nbytes):
    """cp.async.bulk.prefetch.L2 of nbytes at addr (elementwise; nothing asked where nbytes is 0)."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.u32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r",
        [addr, nbytes],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _prefetch_kernel(
    k_ptr,
    v_ptr,
    share_ptr,
    slot0_ptr,
    step_ptr,
    w_ptr,
    w_bytes,
    rows,
    stride_row,
    stride_head,
    stride_slot,
    SLOTS: tl.constexpr,
    KV_PROGRAMS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < KV_PROGRAMS:  # (row, KV head) ranges: the first SLOTS decoded slots; a holder's prompt slots
        seg = pid * BLOCK + tl.arange(0, BLOCK)
        ok = seg < rows * 3
        b = seg // 3
        j = seg % 3
        prompt_end = tl.load(slot0_ptr).to(tl.int32) + 1
        slot = prompt_end - 1 + tl.load(step_ptr).to(tl.int32)
        n = tl.minimum(slot - prompt_end, SLOTS)
        n = tl.where(ok & (n > 0), n, 0)
        base = b * stride_row + j * stride_head
        at = base + prompt_end * stride_slot
        size = (n * stride_slot * 2).to(tl.uint32)
        t0 = _prefetch(k_ptr + at, size)
        t1 = _prefetch(v_ptr + at, size)
        holder = tl.load(share_ptr + b, mask=ok, other=-1) == b
        psize = tl.where(ok & holder, prompt_end * stride_slot * 2, 0).to(tl.uint32)
        t2 = _prefetch(k_ptr + base, psize)
        t3 = _prefetch(v_ptr + base, psize)
        tl.store(share_ptr + b, t0 + t1 + t2 + t3, mask=(t0 + t1 + t2 + t3) == 12345)  # never: keeps the asm live
    else:
        piece = (pid - KV_PROGRAMS) * BLOCK + tl.arange(0, BLOCK)
        off = piece.to(tl.int64) * 65536
        size = tl.minimum(tl.maximum(w_bytes - off, 0), 65536).to(tl.uint32)
        t = _prefetch(w_ptr.to(tl.pointer_type(tl.int8)) + off, size)
        tl.store(w_ptr + piece, t.to(w_ptr.dtype.element_ty), mask=t == 12345)


class Step:
    def __init__(self, rows: int, prompt: int, slot: int, bucket: int, cap: int):
        dev = torch.device("cuda")
        g = torch.Generator(dev).manual_seed(0)

        def rnd(*shape, scale=1.0):
            return (torch.randn(*shape, generator=g, device=dev) * scale).bfloat16()

        self.rows, self.bucket = rows, bucket
        self.kv = rnd(LAYERS, 2, rows, N_KV, cap, D)  # [L, 2, R, Hkv, C, D] as the decoder's cache
        # each layer's weights in one buffer (q|k|v, o, gate|up, down), so a layer's are one range
        sizes = [QKV * H, H * N_Q * D, 2 * INTER * H, H * INTER]
        self.wbuf = rnd(LAYERS, sum(sizes), scale=0.02)
        parts = [list(torch.split(self.wbuf[i], sizes)) for i in range(LAYERS)]
        self.wqkv = [p[0].view(QKV, H) for p in parts]
        self.wo = [p[1].view(H, N_Q * D) for p in parts]
        self.wgu = [p[2].view(2 * INTER, H) for p in parts]
        self.wd = [p[3].view(H, INTER) for p in parts]
        self.lm_head = rnd(VOCAB, H, scale=0.02)
        self.norm = rnd(H, scale=0.1) + 1
        cos = torch.randn(cap, D, device=dev, generator=g)
        self.cos, self.sin = cos.cos().contiguous(), cos.sin().contiguous()
        self.x0 = rnd(rows, H)
        self.x = torch.empty_like(self.x0)
        self.h = torch.empty_like(self.x0)
        self.o = torch.empty(rows, N_Q * D, device=dev, dtype=torch.bfloat16)
        self.act = torch.empty(rows, INTER, device=dev, dtype=torch.bfloat16)
        self.share = (torch.arange(rows, device=dev) // GROUP) * GROUP
        self.pos0 = torch.full((rows,), prompt - 1, dtype=torch.long, device=dev)
        self.slot0 = torch.tensor([prompt - 1], device=dev)
        self.step = torch.tensor([slot - prompt + 1], device=dev)
        self.logits = None
        self.side = torch.cuda.Stream()
        self.decoded = slot - prompt

    def prefetch(self, layer: int, mb: float | None, weights: tuple, stream: torch.cuda.Stream):
        """Ask for layer ``layer``'s keys and values (mb a layer; None: none) and the ``weights`` ranges."""
        kv = self.kv[layer]
        per_slot = self.rows * N_KV * 2 * D * 2
        slots = 0 if mb is None else self.decoded if mb == float("inf") else int(mb * 2**20 // per_slot)
        block = 32
        kv_programs = triton.cdiv(self.rows * N_KV, block) if mb is not None else 0
        w_start, w_bytes = weights if weights else (self.wbuf[0], 0)
        w_programs = triton.cdiv(triton.cdiv(w_bytes, PIECE), block)
        if kv_programs + w_programs == 0:
            return
        with torch.cuda.stream(stream):
            _prefetch_kernel[(kv_programs + w_programs,)](
                kv[0],
                kv[1],
                self.share,
                self.slot0,
                self.step,
                w_start,
                w_bytes,
                self.rows,
                kv.stride(1),
                kv.stride(2),
                kv.stride(3),
                SLOTS=max(slots, 1) if mb is not None else 0,
                KV_PROGRAMS=kv_programs,
                BLOCK=block,
                num_warps=1,
            )

    def weights_after_attention(self, i: int) -> tuple:
        """(start, bytes): layer i's o, gate|up and down weights and layer i+1's q|k|v, one range when i+1 follows."""
        start = self.wo[i]
        end = self.wbuf[i].numel() * 2 - QKV * H * 2
        if i + 1 < LAYERS:
            end += QKV * H * 2  # layer i+1's q|k|v starts right after layer i's down_proj
        return (start, end)

    def run(self, arm: str) -> None:
        where, _, what = arm.partition("-")
        mb = None
        if "kv" in what:
            tail = what.split("kv")[1].rstrip("w")
            mb = float("inf") if tail == "all" else float(tail)
        use_w = what.endswith("w") or what == "w"
        main = torch.cuda.current_stream()
        stream = self.side if where.endswith("s") else main
        forked = False

        def ask(layer, weights):
            nonlocal forked
            if stream is not main:
                stream.wait_stream(main)
                forked = True
            self.prefetch(layer, mb, weights, stream)

        x = self.x
        x.copy_(self.x0)
        for i in range(LAYERS):
            qkv = F.linear(x, self.wqkv[i])  # [B, QKV]
            K.rotary_attention(
                qkv, self.cos, self.sin, self.pos0, self.slot0, self.step, self.kv[i, 0], self.kv[i, 1],
                self.bucket, 0.125, self.o, share=self.share, stream=x, eps=1e-5,
            )  # fmt: skip
            if arm != "base" and where.startswith("A") and i + 1 < LAYERS:
                ask(i + 1, self.weights_after_attention(i) if use_w else ())
            x.addmm_(self.o, self.wo[i].t())
            gu = F.linear(x, self.wgu[i])  # [B, 2I]
            K.silu_mul(gu, self.act, stream=x, eps=1e-5)
            if arm != "base" and where.startswith("B") and i + 1 < LAYERS:
                ask(i + 1, ((self.wd[i], (H * INTER + QKV * H) * 2) if i + 1 < LAYERS else ()) if use_w else ())
            x.addmm_(self.act, self.wd[i].t())
        K.add_rms_norm(x, None, self.norm, 1e-5, self.h)
        self.logits = F.linear(self.h, self.lm_head)  # [B, V]
        if arm != "base":
            ask(0, (self.wbuf[0], QKV * H * 2) if use_w else ())
        if forked:
            main.wait_stream(stream)


def graph_of(step: Step, arm: str) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step.run(arm)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step.run(arm)
    return graph


def time_graph(graph: torch.cuda.CUDAGraph, replays: int) -> float:
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arms", default="base,As-kv16,As-kv32,As-kvall,Bs-kv32,As-w,As-kv32w,Am-kv32")
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--prompt", type=int, default=57)
    ap.add_argument("--slot", type=int, default=184)
    ap.add_argument("--bucket", type=int, default=192)
    ap.add_argument("--cap", type=int, default=320)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--json")
    args = ap.parse_args()
    name = torch.cuda.get_device_name()
    print(
        f"{name}, torch {torch.__version__}, triton {triton.__version__}; {args.rows} rows, token in slot "
        f"{args.slot} of a {args.bucket}-slot bucket, {args.prompt}-slot prompts shared by {GROUP}",
        flush=True,
    )
    step = Step(args.rows, args.prompt, args.slot, args.bucket, args.cap)
    arms = args.arms.split(",")
    graphs, ref = {}, None
    for a in arms:
        graphs[a] = graph_of(step, a)
        graphs[a].replay()
        torch.cuda.synchronize()
        if ref is None:
            ref = step.logits.clone()
        same = torch.equal(step.logits, ref)
        print(f"  {a}: captured; logits {'the same bits' if same else 'DIFFER'} as {arms[0]}", flush=True)
    times = {a: [] for a in arms}
    for _ in range(args.rounds):
        for a in arms:
            times[a].append(time_graph(graphs[a], args.replays))
    base = statistics.median(times[arms[0]])
    print(f"{'arm':<12} {'ms a step':>9} {'/ ' + arms[0]:>9}  runs")
    for a in arms:
        ms = statistics.median(times[a])
        runs = " ".join(f"{t:.3f}" for t in times[a])
        print(f"{a:<12} {ms:9.3f} {ms / base:9.3f}  {runs}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "args": vars(args), "times_ms": times}, f, indent=1)


if __name__ == "__main__":
    main()

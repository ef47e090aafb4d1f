"""Each fused decode kernel at a model's decode shapes, timed against the bytes it must move.

A decode step is a few hundred short kernels, so each one's distance from its memory floor says where a
step's time goes. Every kernel runs through its launch wrapper in kernels.py with the decoder's shapes
(batch rows, the model's heads and widths), `--reps` launches captured in one CUDA graph as the decoder
runs them; the layer GEMMs are timed the same way. Decode attention (with its rotary embedding and cache
write) is also swept over launch shapes (cache block, warps, pipeline stages) at several cache lengths:
its default is the best of this sweep on an H200. On CPU the kernels run in Triton's interpreter and the
times only show that the code runs.

    python -m benchmarks.decode_kernels --batch 512 --out benchmarks/results/decode-kernels-h200.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch
from grpo_knobs.models import load_model
from grpo_knobs.rollout import kernels as K

from benchmarks.rollout import bandwidth, gpu_slug


def layer_products(config) -> dict[str, tuple[int, int]]:
    """name -> (out features, in features) of one layer's products, as the fused decoder stacks them."""
    H, n_q, n_kv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    D = getattr(config, "head_dim", None) or H // n_q
    return {
        "qkv": ((n_q + 2 * n_kv) * D, H),
        "o_proj": (H, n_q * D),
        "gate_up": (2 * config.intermediate_size, H),
        "down_proj": (H, config.intermediate_size),
    }


def per_launch_us(fn, reps: int, iters: int, device: torch.device) -> float:
    """Microseconds per call of fn: reps calls captured in one CUDA graph, replayed iters times (CPU: a loop)."""
    if device.type != "cuda":
        fn()
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - start) / reps * 1e6
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and warm up outside the capture
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) * 1e3 / iters / reps


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--kv-lens", default="128,192,320", help="attended cache lengths for decode attention")
    ap.add_argument(
        "--sweep",
        default="32,64,128:1,2,4:1,2,3",
        help="decode attention launch shapes: cache blocks:warps:stages, each a comma list",
    )
    ap.add_argument("--widths", default="", help="also time one layer's launches by route at these row counts")
    ap.add_argument("--layer-kv-len", type=int, default=192, help="attended cache length for --widths")
    ap.add_argument("--tile-sweep", action="store_true", help="with --widths, also sweep the own GEMMs' tiles")
    ap.add_argument("--reps", type=int, default=30, help="launches per graph (a model's layer count is typical)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--bandwidth", type=float, default=None, help="bytes/s; default: datasheet table or measured")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    device = torch.device(args.device)
    model, _, _ = load_model(args.model, device=device)
    c = model.config
    dtype = model.get_input_embeddings().weight.dtype
    B, H, I, V = args.batch, c.hidden_size, c.intermediate_size, c.vocab_size  # noqa: E741 - the paper's names
    n_q, n_kv = c.num_attention_heads, c.num_key_value_heads
    D = getattr(c, "head_dim", None) or H // n_q
    kv_lens = [int(x) for x in args.kv_lens.split(",")]
    C = max(kv_lens)
    bw, bw_source = bandwidth(device, args.bandwidth)
    el = torch.finfo(dtype).bits // 8
    g = torch.Generator(device).manual_seed(0)
    t = lambda *shape: torch.randn(*shape, generator=g, device=device).to(dtype)  # noqa: E731
    time_us = lambda fn: per_launch_us(fn, args.reps, args.iters, device)  # noqa: E731
    floor_us = lambda nbytes: nbytes / bw * 1e6  # noqa: E731
    base = {
        "gpu": gpu_slug(device),
        "model": args.model,
        "batch": B,
        "dtype": str(dtype).removeprefix("torch."),
        "bandwidth_bytes_per_s": bw,
        "bandwidth_source": bw_source,
    }
    rows = []

    def report(kernel: str, us: float, nbytes: int | None = None, flops: int | None = None, **extra):
        row = base | {"kernel": kernel, "us_per_launch": us} | extra
        note = ""
        if nbytes is not None:
            row["floor_us"] = floor_us(nbytes)
            row["fraction_of_floor"] = row["floor_us"] / us
            note = f"floor {row['floor_us']:7.1f} us  {row['fraction_of_floor']:6.1%} of it"
        if flops is not None:
            row["tflops"] = flops / us / 1e6
            note = f"{row['tflops']:7.0f} TFLOP/s"
        rows.append(row)
        print(f"{kernel:<34} {us:8.1f} us  {note}", flush=True)

    print(
        f"{args.model} on {base['gpu']}: batch {B}, {dtype}, {args.reps} launches per graph; "
        f"bandwidth {bw / 1e12:.2f} TB/s ({bw_source})"
    )
    x, delta, h, w = t(B, H), t(B, H), t(B, H), t(H)
    report("add_rms_norm", time_us(lambda: K.add_rms_norm(x, delta, w, 1e-5, h)), 5 * B * H * el)
    qkv = t(B, (n_q + 2 * n_kv) * D)
    cos, sin = t(C, D), t(C, D)
    kv = t(2, B, n_kv, C, D)
    gate_up, act = t(B, 2 * I), t(B, I)
    report("silu_mul", time_us(lambda: K.silu_mul(gate_up, act)), 3 * B * I * el)
    logits = t(B, V)
    one, zero = torch.ones(1, device=device), torch.zeros(1, dtype=torch.long, device=device)
    keys = torch.arange(B, device=device)  # one response key per row
    tok, lp = torch.empty(B, dtype=torch.long, device=device), torch.empty(B, device=device)
    for greedy in (False, True):
        report(
            f"sample ({'greedy' if greedy else 'T > 0'})",
            time_us(lambda: K.sample(logits, one, keys, zero, greedy, tok, lp)),
            B * V * el,
        )
    for name, (n_out, n_in) in (layer_products(c) | {"lm_head": (V, H)}).items():
        weight, inp = t(n_out, n_in), t(B, n_in)
        report(
            f"gemm {name} [{B}x{n_in}]x[{n_in}x{n_out}]",
            time_us(lambda: torch.nn.functional.linear(inp, weight)),
            flops=2 * B * n_in * n_out,
        )

    out = t(B, n_q * D)
    zero_step = torch.zeros(1, dtype=torch.long, device=device)
    blocks, warps, stages = ([int(v) for v in part.split(",")] for part in args.sweep.split(":"))
    for kv_len in kv_lens:
        # the token sits in the bucket's last slot, so it attends to the whole bucket: a prompt of kv_len - 1
        slot0 = torch.tensor([kv_len - 1], device=device)
        pos0 = torch.full((B,), kv_len - 1, device=device)  # prompts that fill every slot before the token's
        nbytes = 2 * B * n_kv * kv_len * D * el + B * (n_q + 2 * n_kv) * D * el + B * n_q * D * el

        def attend(**launch):
            args_ = (qkv, cos, sin, pos0, slot0, zero_step, kv[0], kv[1], kv_len, 0.125, out)
            return K.rotary_attention(*args_, **launch)

        default = time_us(attend)
        report(f"rotary_attention kv_len {kv_len}", default, nbytes, kv_len=kv_len, launch="default")
        sweep = []
        for block_k, num_warps, num_stages in itertools.product(blocks, warps, stages):
            if block_k > kv_len:
                continue
            us = time_us(lambda: attend(block_k=block_k, num_warps=num_warps, num_stages=num_stages))
            sweep.append({"block_k": block_k, "num_warps": num_warps, "num_stages": num_stages, "us_per_launch": us})
        sweep.sort(key=lambda r: r["us_per_launch"])
        rows[-1]["sweep"] = sweep
        best = sweep[0]
        print(
            f"  sweep of {len(sweep)}: best block {best['block_k']}, {best['num_warps']} warps, "
            f"{best['num_stages']} stages at {best['us_per_launch']:.1f} us; default/best "
            f"{default / best['us_per_launch']:.2f}",
            flush=True,
        )
    if args.widths:
        rows += layer_routes(
            model, [int(w) for w in args.widths.split(",")], args.layer_kv_len, time_us, base, args.tile_sweep
        )
    print("floor: bytes read and written once at the bandwidth; GEMMs are compared with peak FLOP/s instead.")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
        print(f"wrote {args.out}")
    return rows


TILE_SWEEP = [  # launch shapes tried for kernels.py's GEMMs (BM is also capped by the width, at least 16)
    {"BM": bm, "BN": bn, "BK": bk, "SPLIT_K": sk, "num_warps": 4, "num_stages": 4}
    for bm, bn in [(16, 16), (16, 32), (16, 64), (32, 32), (64, 64)]
    for bk in (64, 128)
    for sk in (1, 2, 4)
]
WIDE_TILE_SWEEP = [  # from 128 rows: larger tiles, eight warps for a 128-wide side
    {"BM": bm, "BN": bn, "BK": 64, "SPLIT_K": sk, "num_warps": 8 if max(bm, bn) >= 128 else 4, "num_stages": 4}
    for bm in (32, 64, 128)
    for bn in (32, 64, 128)
    for sk in (1, 2, 4)
]


def layer_routes(model, widths: list[int], kv_len: int, time_us, base: dict, tile_sweep: bool) -> list[dict]:
    """One decode layer's launches by route, at each width, as the decoder runs them: cuBLAS GEMMs on the stream
    with the norms folded into their weights, attention and the SiLU-gate dividing by the row's rms, attention
    whole (6 launches), against kernels.py's GEMMs with the norms and residual add inside and attention split
    (6 launches); attention whole and split alone; each own GEMM against cuBLAS's alone, and with
    ``tile_sweep`` over TILE_SWEEP."""
    c, dev = model.config, model.device
    dtype = model.get_input_embeddings().weight.dtype
    H, I = c.hidden_size, c.intermediate_size  # noqa: E741 - the paper's names
    n_q, n_kv = c.num_attention_heads, c.num_key_value_heads
    D = getattr(c, "head_dim", None) or H // n_q
    g = torch.Generator(dev).manual_seed(1)
    t = lambda *shape: (torch.randn(*shape, generator=g, device=dev) * 0.1).to(dtype)  # noqa: E731
    wqkv, wo, wgu, wd = (t(*shape) for shape in layer_products(c).values())  # [out, in] each
    gamma = t(H)
    cos, sin, scale = t(kv_len, D), t(kv_len, D), D**-0.5
    rows, linear = [], torch.nn.functional.linear
    print(f"\none layer at {kv_len} cached slots, us per layer (x{c.num_hidden_layers} layers per step):")
    print(f"{'width':>6} {'cublas 6':>9} {'own 6':>9} {'own/cublas':>10} {'attn whole':>11} {'attn split':>11}")
    for B in widths:
        x, h, qkv, o, gu, act = t(B, H), t(B, H), t(B, wqkv.shape[0]), t(B, n_q * D), t(B, 2 * I), t(B, I)
        kv = t(2, B, n_kv, kv_len, D)
        pos0, step = torch.full((B,), kv_len - 1, device=dev), torch.zeros(1, dtype=torch.long, device=dev)
        slot0, counts = torch.tensor([kv_len - 1], device=dev), torch.zeros(1 << 16, dtype=torch.int32, device=dev)

        def attend(split, **norm):
            K.rotary_attention(
                qkv, cos, sin, pos0, slot0, step, kv[0], kv[1], kv_len, scale, o, split=split, counts=counts, **norm
            )

        def cublas():
            q = linear(x, wqkv)
            attend(False, stream=x, eps=1e-5)
            x.addmm_(o, wo.t())
            K.silu_mul(linear(x, wgu), act, stream=x, eps=1e-5)
            x.addmm_(act, wd.t())
            return q

        def own():
            K.norm_linear(x, gamma, 1e-5, wqkv, None, qkv, counts)
            attend(None)
            K.linear_add(o, wo, x, counts=counts)
            K.norm_linear(x, gamma, 1e-5, wgu, None, gu, counts)
            x.addmm_(K.silu_mul(gu, act), wd.t())

        r = {"width": B, "kv_len": kv_len}
        r |= {"cublas_us": time_us(cublas), "own_us": time_us(own)}
        r |= {
            "attention_whole_us": time_us(lambda: attend(False)),
            "attention_split_us": time_us(lambda: attend(True)),
        }
        print(
            f"{B:>6} {r['cublas_us']:>9.1f} {r['own_us']:>9.1f} {r['own_us'] / r['cublas_us']:>9.2f}x "
            f"{r['attention_whole_us']:>11.1f} {r['attention_split_us']:>11.1f}",
            flush=True,
        )
        gemms = {
            "qkv (norm)": (
                lambda **k: K.norm_linear(x, gamma, 1e-5, wqkv, None, qkv, counts, **k),
                lambda: linear(h, wqkv),
            ),
            "o (+x)": (lambda **k: K.linear_add(o, wo, x, counts=counts, **k), lambda: x.add_(linear(o, wo))),
            "gate_up (norm)": (
                lambda **k: K.norm_linear(x, gamma, 1e-5, wgu, None, gu, counts, **k),
                lambda: linear(h, wgu),
            ),
            "down (+x)": (lambda **k: K.linear_add(act, wd, x, counts=counts, **k), lambda: x.addmm_(act, wd.t())),
        }
        for name, (mine, theirs) in gemms.items():
            entry = r[f"gemm {name}"] = {"default_us": time_us(mine), "cublas_us": time_us(theirs), "sweep": []}
            for tiles in (WIDE_TILE_SWEEP if B >= 128 else TILE_SWEEP) if tile_sweep else []:
                if tiles["BM"] <= max(16, 1 << (B - 1).bit_length()):  # row tiles up to the width
                    entry["sweep"].append(tiles | {"us": time_us(lambda: mine(**tiles))})
            entry["sweep"].sort(key=lambda e: e["us"])
            line = f"       {name:<16} own {entry['default_us']:6.1f}  cuBLAS {entry['cublas_us']:6.1f}"
            if entry["sweep"]:
                best = entry["sweep"][0]
                line += f"  best tiles {best['us']:6.1f} (BM {best['BM']} BN {best['BN']} BK {best['BK']}"
                line += f" split {best['SPLIT_K']})"
            print(line, flush=True)
        rows.append(base | {"kernel": "layer routes"} | r)
    return rows


if __name__ == "__main__":
    main()

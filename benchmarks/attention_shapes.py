"""Decode attention's launch shape timed where it runs: inside the rollout's fused decode steps.

``benchmarks.decode_kernels`` sweeps the attention kernel's launch shape alone (every row its own prompt,
the token in the bucket's last slot). In the rollout the rows of a prompt read one copy of its cache, the
token moves through its 64-slot bucket, and the other kernels of the step run around it, so the fastest
shape alone need not be the fastest there. For each shape (slots per block, warps, pipeline stages, and
optionally the cache split into pieces across programs at every width) this builds a fused engine whose
attention launches with it, and times the decode steps of ``benchmarks.rollout``'s fixed-length call split
into its parts. Rounds of all shapes are interleaved, so drift in clocks falls on every shape.

    python -m benchmarks.attention_shapes --batch 512 --new-tokens 256 --rounds 2 --json attention-shapes.json
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from pathlib import Path

import torch
from grpo_knobs.models import load_model
from grpo_knobs.rollout import kernels
from grpo_knobs.rollout.hf import HFEngine

from benchmarks.rollout import fixed_length, question_prompts, split_call, timed_generate

# (slots per block, warps, stages, pieces of the cache per (row, KV head) program: 0 = whole cache)
DEFAULT_SHAPE = (32, 1, 2, 0)
SHAPES = [
    DEFAULT_SHAPE,
    (32, 1, 3, 0),
    (32, 1, 4, 0),
    (16, 1, 2, 0),
    (16, 1, 4, 0),
    (64, 1, 2, 0),
    (64, 2, 2, 0),
    (32, 2, 2, 0),
    (32, 1, 2, 128),
    (32, 1, 2, 64),
]


def shape_name(shape: tuple) -> str:
    block_k, warps, stages, chunk = shape
    return f"k{block_k}-w{warps}-s{stages}" + (f"-split{chunk}" if chunk else "")


def parse_shapes(text: str) -> list[tuple]:
    """'32:1:2:0,64:2:2:0' -> [(32, 1, 2, 0), (64, 2, 2, 0)]; the default shape is put first if missing."""
    shapes = []
    for item in text.split(","):
        parts = item.split(":")
        if len(parts) != 4 or not all(p.isdigit() for p in parts):
            raise SystemExit(f"--shapes takes block:warps:stages:chunk items, comma-separated, got {item!r}")
        shapes.append(tuple(int(p) for p in parts))
    return shapes if DEFAULT_SHAPE in shapes else [DEFAULT_SHAPE, *shapes]


_ORIGINAL = kernels.rotary_attention


def shaped_attention(shape: tuple):
    """kernels.rotary_attention with its launch shape fixed to ``shape`` (callers' own arguments win)."""
    block_k, warps, stages, chunk = shape
    extra = dict(block_k=block_k, num_warps=warps, num_stages=stages)
    if chunk:
        extra |= dict(split=True, chunk=chunk)
    return functools.partial(_ORIGINAL, **extra)  # a partial's keywords give way to the call's


def timed_shape(engine: HFEngine, shape: tuple, prompts, device, new_tokens: int) -> dict:
    """The split call (benchmarks.rollout.split_call) of one engine with attention launched at ``shape``; the
    first call of an engine compiles and captures its shapes and is not timed."""
    kernels.rotary_attention = shaped_attention(shape)
    try:
        if not engine.decoder.graphs:
            timed_generate(engine, prompts, device, **fixed_length(new_tokens))
        return split_call(engine, prompts, device, new_tokens)
    finally:
        kernels.rotary_attention = _ORIGINAL


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2, help="timed calls per shape, the shapes interleaved")
    ap.add_argument(
        "--shapes",
        default=None,
        help="block:warps:stages:chunk items (chunk 0: the whole cache per program); default: a fixed list",
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    shapes = parse_shapes(args.shapes) if args.shapes else SHAPES

    device = torch.device(args.device)
    model, tokenizer, info = load_model(args.model, device=device)
    prompt_ids = question_prompts(tokenizer)
    prompts = [prompt_ids[i % len(prompt_ids)] for i in range(args.batch)]
    kw = dict(device=device, max_batch_size=args.batch, fast="fused", return_logprobs=False)
    engines = {shape: HFEngine(model, tokenizer, **kw) for shape in shapes}
    calls: dict[tuple, list[dict]] = {shape: [] for shape in shapes}
    for _ in range(args.rounds):
        for shape, engine in engines.items():
            calls[shape].append(timed_shape(engine, shape, prompts, device, args.new_tokens))
    print(
        f"{info.name} on {device}, fused path, {args.batch} rows x {args.new_tokens} steps of the rollout "
        f"benchmark's prompts; decode ms per step over {args.rounds} interleaved calls per shape"
    )
    print(f"{'shape':<22} {'ms/step (median)':>17} {'calls':>22} {'/ default':>10}")
    base = statistics.median(c["decode_ms_per_step"] for c in calls[DEFAULT_SHAPE])
    rows = []
    for shape in shapes:
        per_step = [c["decode_ms_per_step"] for c in calls[shape]]
        row = {
            "shape": shape_name(shape),
            "block_k": shape[0],
            "num_warps": shape[1],
            "num_stages": shape[2],
            "split_chunk": shape[3],
            "decode_ms_per_step": statistics.median(per_step),
            "calls_ms_per_step": per_step,
            "over_default": statistics.median(per_step) / base,
            "batch": args.batch,
            "new_tokens": args.new_tokens,
            "device": str(device),
        }
        rows.append(row)
        spread = " ".join(f"{v:.3f}" for v in per_step)
        print(f"{row['shape']:<22} {row['decode_ms_per_step']:>17.3f} {spread:>22} {row['over_default']:>10.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
        print(f"wrote {args.json}")
    return rows


if __name__ == "__main__":
    main()

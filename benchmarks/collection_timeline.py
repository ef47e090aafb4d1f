"""Where a collection's generation time goes: prefill, decode steps by live width, row compaction, and the
host work after decoding, for collections as a run draws them.

The batch-256 recipe's generation phase comes to about 2 ms per decode step (generation seconds over the
steps its collections ran), while ``benchmarks.decode_widths`` gives 0.9-1.9 ms for the widths a
collection passes through. This splits whole collections so that the difference has a name. CUDA events
are recorded on the stream around each piece of ``StaticDecoder.run`` (no host syncs are added), so a
span is GPU time including any gap in which the GPU waited for the host; the host work after decoding
(token lists, log-probs, text) is wall time. On CPU every span is wall time.

    python -m benchmarks.collection_timeline --task countdown-2x10 --prompts 64 --group 8 --collections 4 \
        --json timeline.json

``--arms default,eager-prefill`` times variants of the decoder in one run, their collections interleaved:
``own-reads`` (the fused attention reads each row's own copy of its prompt's cache, not the group's first
row's), ``eager-prefill`` (the prefill's launches run eagerly on every call instead of replaying a graph), ``block-32``
(the attended cache length grows in 32-slot buckets instead of 64: less of the cache read past the token, twice
the captured step shapes), ``own-wide`` (kernels.py's GEMMs, with the norms and residual adds inside, at every
width instead of cuBLAS's from ``LINEAR_ROWS`` rows up), ``outputs-after`` (responses cut and decoded to text after
the last step, not block by block while the steps after each block run). An arm may also be a launch shape of
decode attention in ``benchmarks.attention_shapes``' names (``k16-w1-s4``): that module times shapes at one
width, this one at every width a collection passes through, the split launches of narrow steps included.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import torch
from grpo_knobs.data import load_split
from grpo_knobs.evaluation import encode_prompts
from grpo_knobs.models import load_model
from grpo_knobs.rollout.hf import HFEngine

from benchmarks.attention_shapes import launched_as, parse_arm
from benchmarks.rollout import gpu_slug
from benchmarks.timeline import Timeline, instrument

PATHS = {"fused": "fused", "fast": True}
ARMS = {  # decoder variants: StaticDecoder attributes set on an arm's engine
    "default": {},
    "own-reads": {"share_reads": False},
    "eager-prefill": {"graph_prefill": False},
    "block-32": {"block": 32},
    "own-wide": {"linear_rows": 1 << 16},
    "outputs-after": {"stream_outputs": False},
}


def one_collection(engine, timeline: Timeline, prompts, group: int, max_new_tokens: int, seed: int) -> dict:
    """Generate one collection (decoder instrumented); returns its spans summed by label, the host work after
    decoding, and wall time."""
    if timeline.cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    gen = engine.generate(prompts, n=group, max_new_tokens=max_new_tokens, temperature=1.0, seed=seed)
    wall = time.perf_counter() - start
    ms, steps = timeline.by_label()
    lengths = [len(t) for t in gen.token_ids]
    return {
        "ms": ms,
        "steps": steps,
        "host_after_ms": (wall - timeline.run_seconds) * 1e3,
        "wall_ms": wall * 1e3,
        "responses": len(lengths),
        "response_length_mean": sum(lengths) / len(lengths),
        "response_length_max": max(lengths),
        "truncated": sum(n >= max_new_tokens for n in lengths),
    }


def table(collections: list[dict]) -> str:
    """Milliseconds per collection by span, averaged over the collections, with steps and ms per step."""
    n = len(collections)
    labels = sorted({k for c in collections for k in c["ms"]}, key=_order)
    lines = [f"{'span':<18} {'ms':>9} {'steps':>7} {'ms/step':>8} {'share':>6}"]
    wall = sum(c["wall_ms"] for c in collections) / n
    for label in labels + ["host after decoding"]:
        if label == "host after decoding":
            ms, steps = sum(c["host_after_ms"] for c in collections) / n, 0
        else:
            ms = sum(c["ms"].get(label, 0.0) for c in collections) / n
            steps = sum(c["steps"].get(label, 0) for c in collections) / n
        per_step = f"{ms / steps:8.3f}" if steps else f"{'':>8}"
        lines.append(f"{label:<18} {ms:9.1f} {steps:7.0f} {per_step} {ms / wall:6.1%}")
    lines.append(f"{'wall':<18} {wall:9.1f}")
    return "\n".join(lines)


def _order(label: str) -> tuple:
    if label.startswith("step "):
        return (1, -int(label.split()[1]))
    return ({"prefill": 0, "between steps": 2, "compaction": 3, "after the steps": 4}.get(label, 5), 0)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--task", default="countdown-2x10")
    ap.add_argument("--prompts", type=int, default=64, help="prompts per collection (P)")
    ap.add_argument("--group", type=int, default=8, help="samples per prompt (G)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--collections", type=int, default=4, help="timed collections, after one untimed warm-up")
    ap.add_argument("--path", choices=sorted(PATHS), default="fused", help="static decoder path")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--arms",
        default="default",
        help=f"comma list of decoder variants, of {', '.join(ARMS)}, or attention launch shapes (k16-w1-s4)",
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    names = args.arms.split(",")
    if len(set(names)) < len(names) or not all(n in ARMS or n.startswith("k") for n in names):
        raise SystemExit(
            f"--arms takes distinct names of {', '.join(ARMS)} or attention launch shapes (k16-w1-s4), "
            f"comma-separated, got {args.arms!r}"
        )
    shapes = {n: parse_arm(n) for n in names if n not in ARMS}  # SystemExit naming a malformed shape

    device = torch.device(args.device)
    model, tokenizer, info = load_model(args.model, device=device)
    batch = args.prompts * args.group
    arms = {}
    for name in names:
        engine = HFEngine(
            model, tokenizer, device=device, fast=PATHS[args.path], max_batch_size=batch, return_logprobs=True
        )
        for attribute, value in ARMS.get(name, {}).items():
            setattr(engine.decoder, attribute, value)
        arms[name] = (engine, Timeline(device))
        instrument(engine.decoder, arms[name][1])
    problems = load_split(args.task, "train")
    collections: dict[str, list[dict]] = {name: [] for name in names}
    for c in range(args.collections + 1):  # the first is a warm-up: kernels compiled, graphs captured
        chosen = [problems[(c * args.prompts + i) % len(problems)] for i in range(args.prompts)]
        prompts = encode_prompts(chosen, tokenizer)
        for name, (engine, timeline) in arms.items():  # interleaved: drift in clocks falls on every arm
            with launched_as(shapes[name]) if name in shapes else contextlib.nullcontext():
                result = one_collection(engine, timeline, prompts, args.group, args.max_new_tokens, seed=c)
            if c:
                collections[name].append(result)
    for name, done in collections.items():
        print(
            f"{info.name} on {gpu_slug(device)}, {args.path} path, {name}: {args.task}, "
            f"{args.prompts} prompts x {args.group}, up to {args.max_new_tokens} tokens, T = 1; mean of "
            f"{len(done)} collections (mean length {sum(c['response_length_mean'] for c in done) / len(done):.0f}, "
            f"{sum(c['truncated'] for c in done) / len(done):.0f} responses at the cap)"
        )
        print(table(done))
    for name in names[1:]:
        print(step_ratios(collections[names[0]], collections[name], f"{names[0]} / {name}"))
    print("spans are GPU time between stream marks (wall time on CPU); host after decoding is wall time.")
    if args.json:
        saved = {"settings": vars(args) | {"json": str(args.json)}, "collections": collections[names[0]]}
        args.json.write_text(json.dumps(saved | {"arms": collections}))
        print(f"wrote {args.json}")
    return collections[names[0]]


def step_ratios(a: list[dict], b: list[dict], name: str) -> str:
    """ms per decode step of arm a over arm b at each width both ran, and of the whole collection."""

    def per_step(cs: list[dict], label: str) -> float:
        return sum(c["ms"].get(label, 0.0) for c in cs) / max(1, sum(c["steps"].get(label, 0) for c in cs))

    widths = sorted({k for c in a for k in c["steps"]} & {k for c in b for k in c["steps"]}, key=_order)
    parts = [f"{w}: {per_step(a, w) / per_step(b, w):.3f}" for w in widths]
    wall = sum(c["wall_ms"] for c in a) / sum(c["wall_ms"] for c in b)
    return f"ms per step, {name}: " + ", ".join(parts) + f"; wall {wall:.3f}"


if __name__ == "__main__":
    main()

"""Decode attention's arms timed where they run: inside the rollout's fused decode steps.

``benchmarks.decode_kernels`` sweeps the attention kernel's launch shape alone (every row its own prompt,
the token in the bucket's last slot). In the rollout the rows of a prompt read one copy of its cache, the
token moves through its 64-slot bucket, and the other kernels of the step run around it, so the fastest
arm alone need not be the fastest there. An arm is ``default`` (the library's launch, whose shape depends
on the width: ``kernels.launch_shape``) or a launch shape and a variant of the loop over cache blocks, named
as ``k{slots per block}-w{warps}-s{stages}`` followed by any of ``-split{slots}`` (the cache split into
pieces across programs at every width) and ``-wide`` (64-bit offsets into the cache, which the default takes
only for caches spanning 2^31 elements); ``kernels.rotary_attention`` documents each. For
each arm this builds a fused engine whose attention launches with it, and times the decode steps of
``benchmarks.rollout``'s fixed-length call split into its parts. Rounds of all arms are interleaved, so
drift in clocks falls on every arm. ``benchmarks.kernel_resources`` compiles the same arms for sm_90 on any
machine and reports their registers, shared memory and loop instructions.

    python -m benchmarks.attention_shapes --batch 512 --new-tokens 256 --rounds 2 --json attention-shapes.json
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import re
import statistics
from pathlib import Path

import torch
from grpo_knobs.models import load_model
from grpo_knobs.rollout import kernels
from grpo_knobs.rollout.hf import HFEngine

from benchmarks.rollout import cycled, fixed_length, question_prompts, split_call, timed_generate

DEFAULT_ARM = "default"  # kernels.rotary_attention as the decoder calls it: its shape by width (launch_shape)
FLAGS = ("wide",)


def parse_arm(name: str) -> dict:
    """An arm's name -> {"name", "kwargs" for kernels.rotary_attention}; SystemExit naming what is wrong."""
    if name == DEFAULT_ARM:
        return {"name": name, "kwargs": {}}
    head = re.fullmatch(r"k(\d+)-w(\d+)-s(\d+)((?:-[a-z0-9]+)*)", name)
    if head is None:
        raise SystemExit(f"an arm is default or k<slots>-w<warps>-s<stages>[-split<n>][-wide], got {name!r}")
    block_k, warps, stages = map(int, head.groups()[:3])
    kwargs = dict(block_k=block_k, num_warps=warps, num_stages=stages)
    for part in filter(None, head.group(4).split("-")):
        if m := re.fullmatch(r"split(\d+)", part):
            kwargs |= dict(split=True, chunk=int(m.group(1)))
        elif part in FLAGS:
            kwargs[part] = True
        else:
            raise SystemExit(f"arm {name!r}: unknown part {part!r} (split<n>, wide)")
    return {"name": name, "kwargs": kwargs}


def parse_arms(text: str) -> list[dict]:
    """'k16-w1-s4,k32-w1-s2-wide' -> their arms, the default first (added if missing)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    return [parse_arm(n) for n in ([] if DEFAULT_ARM in names else [DEFAULT_ARM]) + names]


# The default, its shape with 64-bit offsets at 512 rows, and the runner-up launch shape (the launch shapes alone
# were swept in earlier calls, benchmarks/results/generation-h200/call-12/; variants of the block loop in call-14/)
ARMS = parse_arms("k16-w1-s4-wide,k32-w1-s2")


_ORIGINAL = kernels.rotary_attention


@contextlib.contextmanager
def launched_as(arm: dict):
    """Within the block, kernels.rotary_attention launches as ``arm`` says (callers' own arguments win: a
    partial's keywords give way to the call's). A captured graph keeps the launches it was captured with."""
    kernels.rotary_attention = functools.partial(_ORIGINAL, **arm["kwargs"])
    try:
        yield
    finally:
        kernels.rotary_attention = _ORIGINAL


def timed_arm(engine: HFEngine, arm: dict, prompts, device, new_tokens: int) -> dict:
    """The split call (benchmarks.rollout.split_call) of one engine with attention launched as ``arm``; the
    first call of an engine compiles and captures its shapes and is not timed."""
    with launched_as(arm):
        if not engine.decoder.graphs:
            timed_generate(engine, prompts, device, **fixed_length(new_tokens))
        return split_call(engine, prompts, device, new_tokens)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2, help="timed calls per arm, the arms interleaved")
    ap.add_argument("--arms", default=None, help="arm names, comma-separated (see above); default: a fixed list")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    arms = parse_arms(args.arms) if args.arms else ARMS

    device = torch.device(args.device)
    model, tokenizer, info = load_model(args.model, device=device)
    prompts = cycled(question_prompts(tokenizer), args.batch)
    kw = dict(device=device, max_batch_size=args.batch, fast="fused", return_logprobs=False)
    engines = {arm["name"]: HFEngine(model, tokenizer, **kw) for arm in arms}
    calls: dict[str, list[dict]] = {arm["name"]: [] for arm in arms}
    for _ in range(args.rounds):
        for arm in arms:
            calls[arm["name"]].append(timed_arm(engines[arm["name"]], arm, prompts, device, args.new_tokens))
    print(
        f"{info.name} on {device}, fused path, {args.batch} rows x {args.new_tokens} steps of the rollout "
        f"benchmark's prompts; decode ms per step over {args.rounds} interleaved calls per arm"
    )
    print(f"{'arm':<36} {'ms/step (median)':>17} {'calls':>22} {'/ default':>10}")
    base = statistics.median(c["decode_ms_per_step"] for c in calls[arms[0]["name"]])
    rows = []
    for arm in arms:
        per_step = [c["decode_ms_per_step"] for c in calls[arm["name"]]]
        row = {
            "arm": arm["name"],
            "kwargs": arm["kwargs"],
            "decode_ms_per_step": statistics.median(per_step),
            "calls_ms_per_step": per_step,
            "over_default": statistics.median(per_step) / base,
            "batch": args.batch,
            "new_tokens": args.new_tokens,
            "device": str(device),
        }
        rows.append(row)
        spread = " ".join(f"{v:.3f}" for v in per_step)
        print(f"{row['arm']:<36} {row['decode_ms_per_step']:>17.3f} {spread:>22} {row['over_default']:>10.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
        print(f"wrote {args.json}")
    return rows


if __name__ == "__main__":
    main()

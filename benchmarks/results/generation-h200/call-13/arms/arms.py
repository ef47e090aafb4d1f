"""Decode attention before and after reading prompt validity off each row's position, inside the rollout's
fused 512-row steps, and whether the two give the same tokens.

``before`` is the library's previous kernels.py (``git show 33eab91:lib/grpo_knobs/rollout/kernels.py`` saved
beside this file as kernels_before.py, which loads each block's validity bytes from the decoder's ``valid``);
the other arms are the checkout's kernel at launch shapes (slots per block, warps, stages). Each arm is
swapped in for kernels.rotary_attention while its engine runs, as benchmarks.attention_shapes does; rounds
interleaved; the split call of benchmarks.rollout. First, greedy and sampled (T = 1, keyed) responses of
before and after are compared token for token.

    python3 benchmarks/results/generation-h200/call-13/arms/arms.py --rounds 2
"""

import argparse
import functools
import importlib.util
import json
import statistics
from pathlib import Path

import torch
from grpo_knobs.models import load_model
from grpo_knobs.rollout import kernels
from grpo_knobs.rollout.hf import HFEngine

from benchmarks.rollout import fixed_length, question_prompts, split_call, timed_generate

HERE = Path(__file__).parent
spec = importlib.util.spec_from_file_location("kernels_before", HERE / "kernels_before.py")
before = importlib.util.module_from_spec(spec)
spec.loader.exec_module(before)
AFTER = kernels.rotary_attention
SHAPES = {"after": {}, "after-s3": {"num_stages": 3}, "after-k16s4": {"block_k": 16, "num_stages": 4}}


def before_for(engine):
    """The previous kernel, handed the decoder's validity map that it reads."""

    def attend(qkv, cos, sin, pos0, slot0, step, k, v, kv_len, scale, out, **kw):
        return before.rotary_attention(
            qkv, cos, sin, pos0, slot0, step, k, v, engine.decoder.valid, kv_len, scale, out, **kw
        )

    return attend


def swapped(fn, work):
    kernels.rotary_attention = fn
    try:
        return work()
    finally:
        kernels.rotary_attention = AFTER


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default="arms.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    model, tok, info = load_model("smollm2-135m-instruct", device=dev)
    ids = question_prompts(tok)
    prompts = [ids[i % len(ids)] for i in range(args.batch)]
    kw = dict(device=dev, max_batch_size=args.batch, fast="fused", return_logprobs=True)
    engines = {n: HFEngine(model, tok, **kw) for n in ["before", *SHAPES]}
    fns = {"before": before_for(engines["before"])} | {n: functools.partial(AFTER, **s) for n, s in SHAPES.items()}
    same = {}
    for t in (0.0, 1.0):
        gens = {
            n: swapped(
                fns[n], lambda n=n: engines[n].generate(prompts, n=1, max_new_tokens=128, temperature=t, seed=3)
            )
            for n in ("before", "after")
        }
        a, b = gens["before"], gens["after"]
        same[f"T={t:g}"] = {
            "identical_responses": sum(x == y for x, y in zip(a.token_ids, b.token_ids)),
            "responses": len(a.token_ids),
            "identical_logprobs": sum(x == y for x, y in zip(a.logprobs, b.logprobs)),
        }
    print(f"before vs after, {args.batch} responses of up to 128 tokens: {same}", flush=True)
    calls = {n: [] for n in engines}
    for r in range(args.rounds + 1):
        for n, engine in engines.items():
            if r == 0:
                swapped(fns[n], lambda: timed_generate(engine, prompts, dev, **fixed_length(args.new_tokens)))
            else:
                calls[n].append(swapped(fns[n], lambda: split_call(engine, prompts, dev, args.new_tokens)))
    base = statistics.median(c["decode_ms_per_step"] for c in calls["before"])
    print(
        f"{info.name}, fused, {args.batch} rows x {args.new_tokens} steps; decode ms per step over {args.rounds} calls"
    )
    for n, cs in calls.items():
        per = [c["decode_ms_per_step"] for c in cs]
        print(
            f"{n:<12} {statistics.median(per):.3f}  ({' '.join(f'{v:.3f}' for v in per)})  / before "
            f"{statistics.median(per) / base:.3f}; host {statistics.median(c['host_ms'] for c in cs):.1f} ms"
        )
    Path(args.json).write_text(json.dumps({"same": same, "calls": calls}, indent=2))


if __name__ == "__main__":
    main()

"""Norms folded into the wide step's products (fold_norms, six launches a layer) against a norm launch before
each product (eight): the rollout benchmark's 512-row, 256-step fused call split into its parts, the two arms
on their own engines, calls interleaved; then greedy agreement of each arm with the fast path at 512 rows."""

import argparse
import json
import statistics
import sys

import torch
from grpo_knobs.models import load_model
from grpo_knobs.rollout.hf import HFEngine

from benchmarks.rollout import fixed_length, question_prompts, split_call, timed_generate

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--batch", type=int, default=512)
ap.add_argument("--new-tokens", type=int, default=256)
args = ap.parse_args()
device = torch.device("cuda")
model, tokenizer, info = load_model("smollm2-135m-instruct", device=device)
ids = question_prompts(tokenizer)
prompts = [ids[i % len(ids)] for i in range(args.batch)]
arms = {"unfolded": False, "folded": True}
engines = {}
for name, fold in arms.items():
    e = HFEngine(model, tokenizer, device=device, max_batch_size=args.batch, fast="fused", return_logprobs=False)
    e.decoder.fold_norms = fold
    timed_generate(e, prompts, device, **fixed_length(args.new_tokens))  # compile and capture
    engines[name] = e
calls = {name: [] for name in arms}
for _ in range(args.rounds):
    for name in arms:
        calls[name].append(split_call(engines[name], prompts, device, args.new_tokens))
out = {"device": torch.cuda.get_device_name(), "rounds": args.rounds, "arms": {}}
print(f"{info.name} on {torch.cuda.get_device_name()}: {args.batch} rows x {args.new_tokens} steps, fused")
for name in arms:
    steps = [c["decode_ms_per_step"] for c in calls[name]]
    wall = [c["wall_ms"] / args.new_tokens for c in calls[name]]
    out["arms"][name] = {
        "calls": calls[name],
        "steps_ms": statistics.median(steps),
        "wall_ms_per_step": statistics.median(wall),
    }
    print(
        f"{name:>9}: decode steps {' '.join(f'{v:.3f}' for v in steps)} ms (median {statistics.median(steps):.3f}); "
        f"wall/step {' '.join(f'{v:.3f}' for v in wall)}"
    )
print(f"folded / unfolded steps: {out['arms']['folded']['steps_ms'] / out['arms']['unfolded']['steps_ms']:.3f}")
sys.stdout.flush()

kw = dict(n=1, max_new_tokens=64, temperature=0, seed=0)


def greedy(fast, fold=None):
    e = HFEngine(model, tokenizer, device=device, max_batch_size=args.batch, fast=fast, return_logprobs=True)
    if fold is not None:
        e.decoder.fold_norms = fold
    return e.generate(prompts, **kw)


ref = greedy(True)
for name, fold in arms.items():
    g = greedy("fused", fold)
    same, diffs = 0, []
    for a, b, la, lb in zip(ref.token_ids, g.token_ids, ref.logprobs, g.logprobs):
        same += a == b
        k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        diffs += [abs(x - y) for x, y in zip(la[:k], lb[:k])]
    agree = {"identical": same / len(prompts), "mean_abs_lp_diff": sum(diffs) / max(len(diffs), 1)}
    out["arms"][name]["greedy_vs_fast"] = agree
    print(
        f"{name:>9} vs fast, greedy, {len(prompts)} x 64: {agree['identical']:.1%} identical, "
        f"mean |log-prob diff| {agree['mean_abs_lp_diff']:.2e}"
    )
json.dump(out, open("fold.json", "w"), indent=1)

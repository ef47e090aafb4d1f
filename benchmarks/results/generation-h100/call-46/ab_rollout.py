"""The library's decode attention against HEAD's (probe/base_kernels.py), and launch shapes of the library's, timed
inside the rollout's fused decode steps (benchmarks.attention_shapes' method: one engine an arm, its graphs captured
with the arm's launch, rounds of all arms interleaved).

    python probe/ab_rollout.py --rounds 3 --shapes k32-w1-s2,k32-w1-s3,k64-w1-s2,k16-w1-s3 --json ab.json
"""

import argparse
import contextlib
import functools
import importlib.util
import json
import statistics

import torch
from grpo_knobs.models import load_model
from grpo_knobs.rollout import kernels
from grpo_knobs.rollout.hf import HFEngine

from benchmarks.attention_shapes import parse_arm
from benchmarks.rollout import cycled, fixed_length, question_prompts, split_call, timed_generate

spec = importlib.util.spec_from_file_location("base_kernels", "probe/base_kernels.py")
base = importlib.util.module_from_spec(spec)
spec.loader.exec_module(base)
LIB = kernels.rotary_attention


@contextlib.contextmanager
def launched(fn, kwargs):
    kernels.rotary_attention = functools.partial(fn, **kwargs)
    try:
        yield
    finally:
        kernels.rotary_attention = LIB


def timed(engine, fn, kwargs, prompts, device, new_tokens):
    with launched(fn, kwargs):
        if not engine.decoder.graphs:
            timed_generate(engine, prompts, device, **fixed_length(new_tokens))
        return split_call(engine, prompts, device, new_tokens)


ap = argparse.ArgumentParser()
ap.add_argument("--batch", type=int, default=512)
ap.add_argument("--new-tokens", type=int, default=256)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--shapes", default="")
ap.add_argument("--json", default=None)
args = ap.parse_args()
device = torch.device("cuda")
model, tokenizer, info = load_model("smollm2-135m-instruct", device=device)
prompts = cycled(question_prompts(tokenizer), args.batch)
arms = [("head", base.rotary_attention, {}), ("lib", LIB, {})]
arms += [(f"lib {n}", LIB, parse_arm(n)["kwargs"]) for n in args.shapes.split(",") if n]
kw = dict(device=device, max_batch_size=args.batch, fast="fused", return_logprobs=False)
engines = {name: HFEngine(model, tokenizer, **kw) for name, _, _ in arms}
calls = {name: [] for name, _, _ in arms}
for r in range(args.rounds):
    for name, fn, kwargs in arms:
        calls[name].append(timed(engines[name], fn, kwargs, prompts, device, args.new_tokens))
        print(f"round {r} {name}: {calls[name][-1]['decode_ms_per_step']:.4f} ms/step", flush=True)
print(f"{info.name}, {args.batch} rows x {args.new_tokens} steps, fused decode ms per step, {args.rounds} rounds")
head = statistics.median(c["decode_ms_per_step"] for c in calls["head"])
rows = []
for name, _, kwargs in arms:
    per = [c["decode_ms_per_step"] for c in calls[name]]
    wall = [c["wall_ms"] for c in calls[name]]
    med = statistics.median(per)
    rows.append(dict(arm=name, kwargs=kwargs, ms_per_step=per, wall_ms=wall, over_head=med / head))
    spread = " ".join(f"{v:.4f}" for v in per)
    print(f"{name:<22} {med:8.4f} [{spread}]  {med / head:.4f}x head  wall {statistics.median(wall):.1f} ms")
if args.json:
    open(args.json, "w").write(json.dumps(rows, indent=2) + "\n")

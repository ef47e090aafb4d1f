"""Where the host time of a 512-row, 256-token fused generate() goes outside the decoder: each piece timed by
wrapping it, five calls each with the garbage collector on, off, and on again. Needs a GPU."""

import gc
import statistics
import sys
import time
from collections import defaultdict

import torch
from grpo_knobs.models import load_model
from grpo_knobs.rollout import hf
from grpo_knobs.rollout.hf import HFEngine

from benchmarks.rollout import fixed_length, question_prompts

dev = torch.device("cuda")
model, tok, info = load_model("smollm2-135m-instruct", device=dev)
eng = HFEngine(model, tok, device=dev, max_batch_size=512, fast="fused", return_logprobs=False)
ids = question_prompts(tok)
prompts = [ids[i % len(ids)] for i in range(512)]
times = defaultdict(list)


def wrap(owner, name):
    f = getattr(owner, name)

    def g(*a, **k):
        t = time.perf_counter()
        r = f(*a, **k)
        times[name].append(time.perf_counter() - t)
        return r

    setattr(owner, name, g)


for name in ["cut_rows", "decode_texts", "prompt_rows", "repeat_prompts", "response_keys"]:
    wrap(hf, name)
wrap(eng.decoder, "run")
kw = fixed_length(256)
eng.generate(prompts, **kw)
for mode in ["gc on", "gc off", "gc on"]:
    times.clear()
    walls = []
    if mode == "gc off":
        gc.collect()
        gc.disable()
    for _ in range(5):
        torch.cuda.synchronize()
        t = time.perf_counter()
        eng.generate(prompts, **kw)
        walls.append(time.perf_counter() - t)
    gc.enable()
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    wall = statistics.median(walls) * 1e3
    print(
        f"{mode}: wall {wall:.1f} ms, run {med['run']:.1f}, outside run {wall - med['run']:.1f}; "
        + ", ".join(f"{k} {v:.2f}" for k, v in med.items() if k != "run"),
        flush=True,
    )
print("gc thresholds", gc.get_threshold(), "objects", len(gc.get_objects()), file=sys.stderr)

"""One 512-row fused decode step of the rollout benchmark's call, bracketed for Nsight Compute.

Builds the fused engine as benchmarks.rollout does, turns CUDA graphs off (so that every kernel of a step is
its own launch), warms it with one 256-step call, then runs the call again and opens the profiler's window
around decode step STEP only (cudaProfilerStart / Stop): under ``ncu --profile-from-start off`` every kernel
of that one step is measured, at the cache length a row has halfway through the call.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight ... python3 ncu_step.py
"""

import sys

import torch
from grpo_knobs.models import load_model
from grpo_knobs.rollout.hf import HFEngine

from benchmarks.rollout import fixed_length, question_prompts

BATCH, NEW_TOKENS = 512, 256
STEP = int(sys.argv[1]) if len(sys.argv) > 1 else 128

device = torch.device("cuda")
model, tokenizer, _ = load_model("smollm2-135m-instruct", device=device)
ids = question_prompts(tokenizer)
prompts = [ids[i % len(ids)] for i in range(BATCH)]
engine = HFEngine(model, tokenizer, device=device, max_batch_size=BATCH, fast="fused")
engine.decoder.use_graphs = False
engine.generate(prompts, **fixed_length(NEW_TOKENS))  # Triton compiles, cuBLAS handles

decode, seen = engine.decoder._decode, [0]


def bracketed(*args, **kwargs):
    seen[0] += 1
    if seen[0] == STEP:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
    decode(*args, **kwargs)
    if seen[0] == STEP:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


engine.decoder._decode = bracketed
engine.generate(prompts, **fixed_length(NEW_TOKENS))
print(f"profiled decode step {STEP} of {seen[0]}")

"""The prefill and first token of a 64 x 8 countdown-2x10 collection, eagerly (graphs off), under torch.profiler:
its wall time and its kernels by CUDA time (prof-prefill.log)."""

import time

import torch
from grpo_knobs.data import load_split
from grpo_knobs.evaluation import encode_prompts
from grpo_knobs.models import load_model
from grpo_knobs.rollout.hf import HFEngine
from torch.profiler import ProfilerActivity, profile

model, tok, _ = load_model("smollm2-135m-instruct", device=torch.device("cuda"))
prompts = encode_prompts(load_split("countdown-2x10", "train")[:64], tok)
eng = HFEngine(model, tok, device="cuda", fast="fused", max_batch_size=512, return_logprobs=True)
eng.decoder.use_graphs = False
kw = dict(n=8, max_new_tokens=1, temperature=1.0, seed=0)  # one token: the prefill and the first draw
for _ in range(3):
    eng.generate(prompts, **kw)
torch.cuda.synchronize()
start = time.perf_counter()
eng.generate(prompts, **kw)
torch.cuda.synchronize()
print("eager prefill call ms", 1e3 * (time.perf_counter() - start))
with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as p:
    eng.generate(prompts, **kw)
    torch.cuda.synchronize()
print(p.key_averages().table(sort_by="cuda_time_total", row_limit=22, max_name_column_width=60))

"""The recipe on the compiled trainer, 8 collections, in this process; prints dynamo's compile times and counters.

Run as ``TORCH_LOGS=recompiles python ctime.py TAG`` from the checkout (commands.sh): once on a fresh
machine (cold caches), then again in a new process (warm caches).
"""

import sys
import time

from grpo_knobs.config import RunConfig
from grpo_knobs.trainer import train
from torch._dynamo.utils import compile_times, counters

from benchmarks.recipe import RECIPE

tag = sys.argv[1]
short = {"response_budget": 4096, "eval_every_responses": 2048, "trainer_path": "packed-compiled", "seed": 5}
place = {"deterministic": False, "output_dir": "runs/ctime", "run_id": f"ctime-{tag}"}
cfg = RunConfig.from_dict(RECIPE | short | place)
t = time.perf_counter()
train(cfg, progress=False)
print(f"{tag}: run {time.perf_counter() - t:.1f} s")
print(compile_times(repr="str"))
for k, v in counters.items():
    if v:
        print(k, dict(v))

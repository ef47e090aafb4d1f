"""Python's garbage collections over one small CPU run of the recipe's shape (P=8, G=4, B=16, 128 responses,
48-token cap, 16 validation problems), timed by generation through gc.callbacks.

    PYTHONPATH=.:lib python benchmarks/results/host-streamed-cpu/gc_run.py
"""

import gc
import time
from collections import defaultdict

stats = defaultdict(lambda: [0, 0.0, 0.0])  # generation -> count, total s, longest s
started = {}


def callback(phase, info):
    if phase == "start":
        started["t"] = time.perf_counter()
    else:
        took, s = time.perf_counter() - started["t"], stats[info["generation"]]
        s[0], s[1], s[2] = s[0] + 1, s[1] + took, max(s[2], took)


gc.callbacks.append(callback)
from grpo_knobs.cli import main  # noqa: E402  (imports count too)

start = time.perf_counter()
overrides = dict(
    task="countdown-2x10", rollout_batch_size=8, n_samples_per_prompt=4, global_batch_size=16, response_budget=128,
    eval_every_responses=64, eval_problems=16, max_new_tokens=48, output_dir="/tmp/gcruns",
    run_id=f"r{int(time.time())}", device="cpu",
)  # fmt: skip
rc = main(["train", *[a for k, v in overrides.items() for a in ("-p", f"{k}={v}")]])
print("rc", rc, "wall s", round(time.perf_counter() - start, 1), "objects tracked", len(gc.get_objects()))
for g, (n, total, longest) in sorted(stats.items()):
    print(f"generation {g}: {n} collections, {total * 1e3:.0f} ms in all, longest {longest * 1e3:.1f} ms")

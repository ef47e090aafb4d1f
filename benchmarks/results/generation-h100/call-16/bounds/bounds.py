"""Upper bounds on decode attention's loop in the rollout's 512-row steps: the fused engine with its attention
kernel's loop range rewritten (the outputs are then wrong: these arms time what they leave out, nothing else).
It edits the source of the library at the commit where it ran (the bounded loop over a row's own blocks).

  prompt-skip   the loop starts at the first block after the prompt's slots: each row's program walks only
                its decoded tokens' blocks. The most that attending a group's prompt once, outside the rows'
                loops (cascade attention), could save, if that part itself came for free.
  no-loop       the loop runs no block at all: the launch, the rotation, the cache write and the token's own
                term alone. What the whole loop over the cache costs in the step.

Call 13's `prompt-free` arm left the loop's passes over the prompt blocks in place and only dropped their
loads (0.004 ms a step: L2 serves a group's one copy); `prompt-skip` takes the passes themselves out.
Each arm is a copy of rollout/kernels.py with the range rewritten, swapped in for kernels.rotary_attention
while its engine runs (as benchmarks.attention_shapes swaps launch shapes); rounds interleaved; the split call
of benchmarks.rollout.

    python3 benchmarks/results/generation-h100/call-16/bounds/bounds.py --rounds 2
"""

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from grpo_knobs.models import load_model
from grpo_knobs.rollout import kernels
from grpo_knobs.rollout.hf import HFEngine

from benchmarks.rollout import fixed_length, question_prompts, split_call, timed_generate

SRC = Path(kernels.__file__).read_text()
LO = "lo = tl.maximum(c * CHUNK, (first // BLOCK_K) * BLOCK_K)"
HI = "hi = tl.minimum(c * CHUNK + CHUNK, slot + 1)"
EDITS = {
    "prompt-skip": [(LO, "lo = tl.maximum(c * CHUNK, (prompt_end // BLOCK_K) * BLOCK_K)")],
    "no-loop": [(HI, "hi = lo")],
}


def variant(name: str):
    text = SRC
    for old, new in EDITS[name]:
        assert text.count(old) == 1, (name, old)
        text = text.replace(old, new)
    path = Path(tempfile.mkdtemp()) / f"kernels_{name.replace('-', '_')}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module.rotary_attention


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default="bounds.json")
    ap.add_argument("--arms", default=",".join(EDITS), help="arms beside default")
    args = ap.parse_args()
    dev = torch.device("cuda")
    model, tok, info = load_model("smollm2-135m-instruct", device=dev)
    ids = question_prompts(tok)
    prompts = [ids[i % len(ids)] for i in range(args.batch)]
    print(f"prompt lengths {sorted({len(p) for p in ids})}", flush=True)
    arms = {"default": kernels.rotary_attention} | {n: variant(n) for n in args.arms.split(",")}
    kw = dict(device=dev, max_batch_size=args.batch, fast="fused", return_logprobs=False)
    engines = {n: HFEngine(model, tok, **kw) for n in arms}
    calls = {n: [] for n in arms}
    original = kernels.rotary_attention
    for r in range(args.rounds + 1):
        for n, engine in engines.items():
            kernels.rotary_attention = arms[n]
            try:
                if r == 0:  # compiles and captures
                    timed_generate(engine, prompts, dev, **fixed_length(args.new_tokens))
                else:
                    calls[n].append(split_call(engine, prompts, dev, args.new_tokens))
            finally:
                kernels.rotary_attention = original
    base_ms = statistics.median(c["decode_ms_per_step"] for c in calls["default"])
    print(f"{info.name}, fused, {args.batch} rows x {args.new_tokens} steps; decode ms per step, {args.rounds} calls")
    for n, cs in calls.items():
        per = [c["decode_ms_per_step"] for c in cs]
        print(
            f"{n:<12} {statistics.median(per):.3f}  ({' '.join(f'{v:.3f}' for v in per)})  "
            f"saves {base_ms - statistics.median(per):.3f} ms/step; "
            f"host {statistics.median(c['host_ms'] for c in cs):.1f} ms"
        )
    Path(args.json).write_text(json.dumps(calls, indent=2))


if __name__ == "__main__":
    main()

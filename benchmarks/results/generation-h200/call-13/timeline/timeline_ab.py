"""Whole collections before and after this call's two changes, as a run draws them: 64 prompts x 8 of
countdown-2x10 at T = 1, EOS on, up to 256 tokens, fused path, the arms' collections interleaved, with
benchmarks.collection_timeline's spans. ``before`` launches the previous decode attention
(../arms/kernels_before.py: ``git show 33eab91:lib/grpo_knobs/rollout/kernels.py``, handed the decoder's
``valid``) and decodes texts as before (a byte table only for a plain ByteLevel decoder); ``after`` is the
checkout.

    python3 benchmarks/results/generation-h200/call-13/timeline/timeline_ab.py --collections 4
"""

import argparse
import importlib.util
import json
from pathlib import Path

import torch
from grpo_knobs.data import load_split
from grpo_knobs.evaluation import encode_prompts
from grpo_knobs.models import load_model
from grpo_knobs.rollout import base, kernels
from grpo_knobs.rollout.hf import HFEngine

from benchmarks.collection_timeline import one_collection, step_ratios, table
from benchmarks.timeline import Timeline, instrument

spec = importlib.util.spec_from_file_location("kernels_before", Path(__file__).parents[1] / "arms/kernels_before.py")
before = importlib.util.module_from_spec(spec)
spec.loader.exec_module(before)
AFTER, BYTE_TABLE = kernels.rotary_attention, base.byte_table


def old_byte_table(tokenizer):
    return BYTE_TABLE(tokenizer) if type(tokenizer.backend_tokenizer.decoder).__name__ == "ByteLevel" else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--collections", type=int, default=4)
    ap.add_argument("--json", default="timeline-ab.json")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    dev = torch.device(args.device)
    model, tok, _ = load_model(args.model, device=dev)
    kw = dict(device=dev, max_batch_size=args.prompts * args.group, fast="fused", return_logprobs=True)
    arms = {name: (HFEngine(model, tok, **kw), Timeline(dev)) for name in ("before", "after")}
    for engine, timeline in arms.values():
        instrument(engine.decoder, timeline)
    decoder = arms["before"][0].decoder

    def attend_before(qkv, cos, sin, pos0, slot0, step, k, v, kv_len, scale, out, **kw):
        return before.rotary_attention(qkv, cos, sin, pos0, slot0, step, k, v, decoder.valid, kv_len, scale, out, **kw)

    problems = load_split("countdown-2x10", "train")
    done = {name: [] for name in arms}
    for c in range(args.collections + 1):  # the first is a warm-up: kernels compiled, graphs captured
        chosen = [problems[(c * args.prompts + i) % len(problems)] for i in range(args.prompts)]
        prompts = encode_prompts(chosen, tok)
        for name, (engine, timeline) in arms.items():
            kernels.rotary_attention = attend_before if name == "before" else AFTER
            base.byte_table = old_byte_table if name == "before" else BYTE_TABLE
            try:
                result = one_collection(engine, timeline, prompts, args.group, args.max_new_tokens, seed=c)
            finally:
                kernels.rotary_attention, base.byte_table = AFTER, BYTE_TABLE
            if c:
                done[name].append(result)
    for name, cs in done.items():
        mean = sum(c["response_length_mean"] for c in cs) / len(cs)
        print(f"{name}: {args.prompts} prompts x {args.group}, T = 1; {len(cs)} collections, mean length {mean:.0f}")
        print(table(cs))
    print(step_ratios(done["after"], done["before"], "after / before"))
    Path(args.json).write_text(json.dumps(done, indent=2))


if __name__ == "__main__":
    main()

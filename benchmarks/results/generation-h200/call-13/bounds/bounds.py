"""Upper bounds on decode attention in the rollout's 512-row steps: the fused engine with its attention kernel
rewritten (the outputs are then wrong: these arms time what the rewritten parts cost, nothing else). It edits
the source of the library at 33eab91 (the kernel that loaded each block's validity bytes), where it ran.

  prompt-free   no key, value or validity load of a prompt slot (slots <= slot0): what attention would cost if
                the prompt's part came for free (the most that computing a group's prompt part once could save)
  no-reads      no key or value load at all: attention's arithmetic, launches and the cache write alone
  no-exp        the loop's two exponentials left out (the scores themselves stand in): what they cost

Each arm is a copy of rollout/kernels.py with the loads' masks rewritten, swapped in for
kernels.rotary_attention while its engine runs (as benchmarks.attention_shapes swaps launch shapes). Rounds
interleaved; the split call of benchmarks.rollout. Also prints what decode_texts does with this tokenizer.

    python3 benchmarks/results/generation-h200/call-13/bounds/bounds.py --rounds 2
"""

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers
from grpo_knobs.models import load_model
from grpo_knobs.rollout import base, kernels
from grpo_knobs.rollout.hf import HFEngine

from benchmarks.rollout import fixed_length, question_prompts, split_call, timed_generate

SRC = Path(kernels.__file__).read_text()
K_MASK = "mask=in_range[:, None] & live, other=0.0"
V_MARK = "mask=in_range & in_prompt, other=0"
EDITS = {
    "prompt-free": [
        (K_MASK, "mask=(in_range & ~in_prompt)[:, None] & live, other=0.0"),
        (V_MARK, "mask=in_range & (ks < 0), other=0"),
    ],
    "no-reads": [
        (K_MASK, "mask=in_range[:, None] & (ks < 0)[:, None], other=0.0"),
        (V_MARK, "mask=in_range & (ks < 0), other=0"),
    ],
    "no-exp": [
        (
            "alpha = tl.exp(m_i - m_new)\n        p = tl.exp(s - m_new[:, None])",
            "alpha = m_i - m_new\n        p = s - m_new[:, None]",
        )
    ],
}


def variant(name: str):
    text = SRC
    for old, new in EDITS[name]:
        assert old in text, (name, old)
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
    backend = tok.backend_tokenizer
    table = base.byte_table(tok)
    print(
        f"transformers {transformers.__version__}; tokenizer {type(tok).__name__}, decoder "
        f"{type(backend.decoder).__name__}, model {type(backend.model).__name__}; byte table "
        f"{'none' if table is None else f'{sum(t is None for t in table)} ids left to the decoder'}",
        flush=True,
    )
    print("decoder:", json.loads(backend.to_str())["decoder"], flush=True)
    ids = question_prompts(tok)
    prompts = [ids[i % len(ids)] for i in range(args.batch)]
    arms = {"default": kernels.rotary_attention} | {n: variant(n) for n in args.arms.split(",")}
    kw = dict(device=dev, max_batch_size=args.batch, fast="fused", return_logprobs=False)
    engines = {n: HFEngine(model, tok, **kw) for n in arms}
    calls = {n: [] for n in arms}
    original = kernels.rotary_attention
    for r in range(args.rounds + 1):
        for n, engine in engines.items():
            kernels.rotary_attention = arms[n]
            try:
                if r == 0:
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
    gen = engines["default"].generate(prompts, **fixed_length(args.new_tokens))
    t = time.perf_counter()
    for _ in range(5):
        base.decode_texts(tok, gen.token_ids)
    ms = (time.perf_counter() - t) / 5 * 1e3
    print(f"decode_texts of {len(gen.token_ids)} x {args.new_tokens} tokens: {ms:.2f} ms")
    Path(args.json).write_text(json.dumps(calls, indent=2))


if __name__ == "__main__":
    main()

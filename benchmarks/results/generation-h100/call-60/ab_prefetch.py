"""The library's wide decode layer against the same layer whose kernels ask L2 for the weights of the products
that follow them (decode attention: this layer's o_proj, gate|up and down_proj; the SiLU-gate: the next layer's
q|k|v), timed inside the rollout's fused decode steps: one engine an arm, its graphs captured with the arm's
kernels, rounds of all arms interleaved. Every arm's tokens are checked against the library's, bit for bit.

    python probe/ab_prefetch.py --rounds 3 --arms s0,s1,e0,e1 --json ab.json
"""

import argparse
import contextlib
import json
import statistics
import sys

import torch
from grpo_knobs.models import load_model
from grpo_knobs.rollout.hf import HFEngine, StaticDecoder

from benchmarks.rollout import cycled, fixed_length, question_prompts, split_call, timed_generate

sys.path.insert(0, "probe")
import pf_kernels as PK  # noqa: E402

LIB = StaticDecoder._cublas_layer


def variant(where: int, policy: int):
    def layer(self, i, layer, x, kv_len):
        f, attn, mlp, B = self.fused, layer.self_attn, layer.mlp, x.shape[0]
        qkv = torch.nn.functional.linear(x, f.wqkv_folded[i])
        o = qkv.new_empty(B, self.n_heads * self.head_dim)
        args = (self.cos, self.sin, self.pos0, self.slot0, self.step, self.kv[i, 0], self.kv[i, 1])
        share = self.share if self.share_reads else None
        PK.rotary_attention(
            qkv, *args, kv_len, attn.scaling, o, counts=self.counts, share=share, stream=x, eps=f.eps,
            bias=f.bqkv[i], prefetch=(attn.o_proj.weight, f.wgu_folded[i], mlp.down_proj.weight),
            pf_where=where, pf_policy=policy,
        )  # fmt: skip
        self._add_product(x, o, attn.o_proj)
        gate_up = torch.nn.functional.linear(x, f.wgu_folded[i])
        nxt = (f.wqkv_folded[i + 1],) if i + 1 < len(self.layers) else ()
        act = PK.silu_mul(
            gate_up, x.new_empty(B, gate_up.shape[1] // 2), stream=x, eps=f.eps, prefetch=nxt,
            pf_where=1 if (where and nxt) else 0, pf_policy=policy,
        )  # fmt: skip
        self._add_product(x, act, mlp.down_proj)

    return layer


ARMS = {"lib": None, "copy": (0, 0), "s0": (1, 0), "s1": (1, 1), "e0": (2, 0), "e1": (2, 1)}


@contextlib.contextmanager
def arm_layer(name):
    if ARMS[name] is not None:
        StaticDecoder._cublas_layer = variant(*ARMS[name])
    try:
        yield
    finally:
        StaticDecoder._cublas_layer = LIB


ap = argparse.ArgumentParser()
ap.add_argument("--batch", type=int, default=512)
ap.add_argument("--new-tokens", type=int, default=256)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--arms", default="s0,s1,e0,e1")
ap.add_argument("--json", default=None)
ap.add_argument("--device", default="cuda")
ap.add_argument("--model", default="smollm2-135m-instruct")
args = ap.parse_args()
device = torch.device(args.device)
model, tokenizer, info = load_model(args.model, device=device)
prompts = cycled(question_prompts(tokenizer), args.batch)
names = ["lib"] + [a for a in args.arms.split(",") if a]
kw = dict(device=device, max_batch_size=args.batch, fast="fused", return_logprobs=False)
engines = {n: HFEngine(model, tokenizer, **kw) for n in names}
tokens = {}
for n in names:  # warm-up: compile, capture; the tokens of a fixed-length sampled call
    with arm_layer(n):
        _, gen = timed_generate(engines[n], prompts, device, **fixed_length(args.new_tokens))
    tokens[n] = gen.token_ids
    same = tokens[n] == tokens["lib"]
    print(f"{n}: tokens {'identical to' if same else 'DIFFER from'} lib's", flush=True)
calls = {n: [] for n in names}
for r in range(args.rounds):
    for n in names:
        with arm_layer(n):
            calls[n].append(split_call(engines[n], prompts, device, args.new_tokens))
        print(f"round {r} {n}: {calls[n][-1]['decode_ms_per_step']:.4f} ms/step", flush=True)
gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
print(f"{info.name} on {gpu}, {args.batch} rows x {args.new_tokens} steps, fused decode ms a step")
base = statistics.median(c["decode_ms_per_step"] for c in calls["lib"])
rows = []
for n in names:
    per = [c["decode_ms_per_step"] for c in calls[n]]
    wall = [c["wall_ms"] for c in calls[n]]
    med = statistics.median(per)
    rows.append(
        dict(arm=n, spec=ARMS[n], ms_per_step=per, wall_ms=wall, over_lib=med / base, same=tokens[n] == tokens["lib"])
    )
    spread = " ".join(f"{v:.4f}" for v in per)
    print(f"{n:<5} {med:8.4f} [{spread}]  {med / base:.4f}x lib  wall {statistics.median(wall):.1f} ms")
if args.json:
    open(args.json, "w").write(json.dumps(rows, indent=2) + "\n")

"""The library's wide decode layer against the same layer with gate|up and the SiLU-gate in one Triton launch
(probe/gus.py), timed inside the rollout's fused decode steps: one engine an arm, rounds interleaved. First the
kernel alone against cuBLAS's gate|up and the library's SiLU-gate, 30 layers in one CUDA graph, with its outputs
against theirs.

    python probe/ab_gus.py --rounds 3 --arms 64-64-64-4-4,128-64-64-8-3 --json ab.json
"""

import argparse
import contextlib
import json
import statistics
import sys

import torch
from grpo_knobs.models import load_model
from grpo_knobs.rollout.hf import HFEngine, StaticDecoder
from grpo_knobs.rollout.kernels import silu_mul

from benchmarks.rollout import cycled, fixed_length, question_prompts, split_call, timed_generate

sys.path.insert(0, "probe")
from gus import gate_up_act  # noqa: E402

LIB = StaticDecoder._cublas_layer


def parse(name):
    bm, bn, bk, w, s = (int(v) for v in name.split("-")[:5])
    return dict(bm=bm, bn=bn, bk=bk, warps=w, stages=s, round_="raw" not in name)


def variant(shape):
    def layer(self, i, layer, x, kv_len):
        f, attn, mlp, B = self.fused, layer.self_attn, layer.mlp, x.shape[0]
        qkv = torch.nn.functional.linear(x, f.wqkv_folded[i])
        o = self._attend(i, layer, qkv, kv_len, stream=x, eps=f.eps, bias=f.bqkv[i])
        self._add_product(x, o, attn.o_proj)
        act = gate_up_act(x, f.wgu_folded[i], x.new_empty(B, f.wgu_folded[i].shape[0] // 2), f.eps, **shape)
        self._add_product(x, act, mlp.down_proj)

    return layer


@contextlib.contextmanager
def arm_layer(name):
    if name != "lib":
        StaticDecoder._cublas_layer = variant(parse(name))
    try:
        yield
    finally:
        StaticDecoder._cublas_layer = LIB


def graph_us(fn, reps=30):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return statistics.median(out)


def kernel_alone(engine, names, rows):
    """us a layer over 30 layers' weights in one graph, and outputs against the library's two launches."""
    f = engine.decoder.fused
    x = (torch.randn(rows, f.wgu_folded[0].shape[1], device="cuda") * 0.5).to(torch.bfloat16)
    inter = f.wgu_folded[0].shape[0] // 2
    gu = x.new_empty(rows, 2 * inter)
    act_lib, act = x.new_empty(rows, inter), x.new_empty(rows, inter)

    def lib():
        for w in f.wgu_folded:
            torch.mm(x, w.t(), out=gu)
            silu_mul(gu, act_lib, stream=x, eps=f.eps)

    ref = lib() or act_lib.clone()
    res = {"lib": graph_us(lib) / len(f.wgu_folded)}
    print(f"alone: lib (cuBLAS gate|up + SiLU-gate) {res['lib']:.2f} us a layer", flush=True)
    for n in names:
        shape = parse(n)

        def fused():
            for w in f.wgu_folded:
                gate_up_act(x, w, act, f.eps, **shape)

        fused()
        same = (act == ref).float().mean().item()
        err = (act.float() - ref.float()).abs().max().item()
        res[n] = graph_us(fused) / len(f.wgu_folded)
        print(f"alone: {n:<18} {res[n]:.2f} us a layer ({res[n] / res['lib']:.3f}x), {same:.4f} of outputs equal, "
              f"max |diff| {err:.2e}", flush=True)  # fmt: skip
    return res


ap = argparse.ArgumentParser()
ap.add_argument("--batch", type=int, default=512)
ap.add_argument("--new-tokens", type=int, default=256)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--arms", default="64-64-64-4-4")
ap.add_argument("--json", default=None)
args = ap.parse_args()
device = torch.device("cuda")
model, tokenizer, info = load_model("smollm2-135m-instruct", device=device)
prompts = cycled(question_prompts(tokenizer), args.batch)
names = ["lib"] + [a for a in args.arms.split(",") if a]
kw = dict(device=device, max_batch_size=args.batch, fast="fused", return_logprobs=False)
engines = {n: HFEngine(model, tokenizer, **kw) for n in names}
alone = kernel_alone(engines["lib"], names[1:], args.batch)
tokens = {}
for n in names:  # warm-up: compile, capture; the tokens of a fixed-length sampled call
    with arm_layer(n):
        _, gen = timed_generate(engines[n], prompts, device, **fixed_length(args.new_tokens))
    tokens[n] = gen.token_ids
    same = sum(a == b for a, b in zip(tokens[n], tokens["lib"])) / len(tokens["lib"])
    print(f"{n}: {same:.3f} of responses identical to lib's", flush=True)
calls = {n: [] for n in names}
for r in range(args.rounds):
    for n in names:
        with arm_layer(n):
            calls[n].append(split_call(engines[n], prompts, device, args.new_tokens))
        print(f"round {r} {n}: {calls[n][-1]['decode_ms_per_step']:.4f} ms/step", flush=True)
gpu = torch.cuda.get_device_name()
print(f"{info.name} on {gpu}, {args.batch} rows x {args.new_tokens} steps, fused decode ms a step")
base = statistics.median(c["decode_ms_per_step"] for c in calls["lib"])
rows = []
for n in names:
    per = [c["decode_ms_per_step"] for c in calls[n]]
    med = statistics.median(per)
    same = sum(a == b for a, b in zip(tokens[n], tokens["lib"])) / len(tokens["lib"])
    rows.append(dict(arm=n, ms_per_step=per, over_lib=med / base, identical=same, alone_us=alone.get(n)))
    spread = " ".join(f"{v:.4f}" for v in per)
    print(f"{n:<18} {med:8.4f} [{spread}]  {med / base:.4f}x lib")
if args.json:
    open(args.json, "w").write(json.dumps(rows, indent=2) + "\n")

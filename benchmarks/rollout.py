"""Rollout throughput: eager `generate` against the static-cache fast paths, and all against the memory bound.

For each batch size the same prompts run through each HF engine path (eager, fast, fused), each for exactly
`new_tokens` decode steps (EOS ignored) so the rates compare. A decode step must read every weight and each row's
KV cache once, so bandwidth / bytes-per-step bounds the step rate; the fast path's fraction of that bound says
how much is left to gain. Each path's timed call runs `--repeats` times after a warm-up call of the same length
and the median counts (a single call's host work varies by tens of ms between calls; the calls' own figures, and
the warm-up's, are kept in the JSON).
Prints a table and writes the rows as JSON. Under each row, one more call of each static-decoder path split into
its parts (before the first step, the decode steps, between them, the host work) gives the decode steps' own
fraction of the bound beside the call's.

    python -m benchmarks.rollout --batches 64,128,256,512,1024 --new-tokens 256 \
        --out lib/grpo_knobs/datasets/rollout-benchmarks/rollout-h200.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from pathlib import Path

import torch
from grpo_knobs.models import load_model
from grpo_knobs.rollout.hf import HFEngine

from benchmarks.timeline import Timeline, garbage_collections, instrument

# Peak HBM bandwidth by GPU name, bytes/s (vendor datasheets). Unknown GPUs are measured.
BANDWIDTH = {
    "H200": 4.8e12,
    "H100": 3.35e12,
    "B200": 8.0e12,
    "A100-SXM4-80GB": 2.04e12,
    "A100": 1.555e12,
    "L40S": 0.864e12,
    "4090": 1.008e12,
}
CPU_BANDWIDTH = 20e9  # a flag value, not a measurement: CPU rows only exercise the code

QUESTIONS = [
    "A baker made 48 muffins and sold 3/4 of them. How many muffins are left?",
    "Tom has 12 marbles. He gives 5 to Ann and buys 9 more. How many marbles does he have now?",
    "A train travels 60 km per hour for 2.5 hours. How far does it go?",
    "Sara reads 15 pages a day. How many days does she need for a 210-page book?",
    "A shirt costs $25 and is discounted by 20%. What is the new price?",
    "There are 7 rows of 8 chairs and 13 chairs are taken. How many are free?",
    "Mia saves $4 a week. How many weeks until she has $92?",
    "A rectangle is 9 cm wide and 14 cm long. What is its perimeter?",
]


def question_prompts(tokenizer) -> list[list[int]]:
    """Token ids of QUESTIONS as chat prompts, the benchmarks' fixed-length inputs."""
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        for q in QUESTIONS
    ]


def cycled(prompt_ids: list[list[int]], rows: int) -> list[list[int]]:
    """``rows`` prompts, the given ones in turn: a batch of the benchmarks' prompts at any width."""
    return [prompt_ids[i % len(prompt_ids)] for i in range(rows)]


def gpu_slug(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device)
    return re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "")).strip("-") or "gpu"


def measured_bandwidth(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy rate, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    torch.cuda.synchronize(device)
    return 2 * nbytes * 10 / (time.perf_counter() - start)


def bandwidth(device: torch.device, override: float | None) -> tuple[float, str]:
    if override:
        return override, "flag"
    if device.type != "cuda":
        return CPU_BANDWIDTH, "cpu flag value (not measured)"
    name = torch.cuda.get_device_name(device)
    for key, value in BANDWIDTH.items():
        if key in name:
            return value, f"datasheet ({key})"
    return measured_bandwidth(device), "measured device-to-device copy"


def bound_tokens_per_s(model, batch: int, prompt_tokens: float, new_tokens: int, bw: float, kv_bytes: int) -> float:
    """Tokens/s if each decode step only read the weights once and each row's cache once at bandwidth bw."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    param_bytes = sum(p.numel() for p in model.parameters()) * kv_bytes  # tied weights counted once
    kv_per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * kv_bytes
    mean_context = prompt_tokens + (new_tokens - 1) / 2
    seconds_per_step = (param_bytes + batch * mean_context * kv_per_token) / bw
    return batch / seconds_per_step


def timed_generate(engine: HFEngine, prompts, device: torch.device, **kw):
    """(seconds, Generation) of one ``engine.generate(prompts, **kw)``, GPU work included."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    gen = engine.generate(prompts, **kw)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, gen


def fixed_length(new_tokens: int) -> dict:
    """generate() arguments of the fixed-length table: every row decodes exactly new_tokens steps."""
    return dict(n=1, max_new_tokens=new_tokens, temperature=1.0, seed=0, ignore_eos=True)


def split_call(engine: HFEngine, prompts, device: torch.device, new_tokens: int) -> dict:
    """Where one fixed-length ``generate`` of a static-decoder path spends its time, in milliseconds: before
    the first decode step (prefill and the first token), the decode steps (and their count), between steps,
    gathering the outputs, and the host work outside the decoder (padding prompts, cutting responses,
    text). The parts add up to the call's wall time; Python's garbage collections, wherever they fell, are
    counted beside them."""
    timeline = Timeline(device)
    restore = instrument(engine.decoder, timeline)
    try:
        with garbage_collections() as gc_seen:
            seconds, _ = timed_generate(engine, prompts, device, **fixed_length(new_tokens))
    finally:
        restore()  # later timed calls run without the marks
    ms, steps = timeline.by_label()
    n_steps = sum(steps.values())
    return {
        "prefill_ms": ms.get("prefill", 0.0),
        "decode_steps": n_steps,
        "decode_ms_per_step": sum(ms[label] for label in steps) / max(n_steps, 1),
        "between_steps_ms": ms.get("between steps", 0.0) + ms.get("compaction", 0.0),
        "after_steps_ms": ms.get("after the steps", 0.0),
        "host_ms": (seconds - timeline.run_seconds) * 1e3,
        "wall_ms": seconds * 1e3,
        "gc_ms": gc_seen["ms"],  # Python's garbage collections anywhere in the call (part of the parts above)
        "gc_full": gc_seen["full"],
    }


def fused_agreement(model, tokenizer, device, prompt_ids, batch: int, max_new_tokens: int = 64) -> dict:
    """Greedy responses of the fast and fused paths side by side: the kernels' rounding differs, so
    responses may part after a near-tie, but log-probs on their shared prefix should agree closely."""
    prompts = cycled(prompt_ids, min(batch, 64))
    gens = {
        path: HFEngine(
            model, tokenizer, device=device, max_batch_size=len(prompts), fast=fast, return_logprobs=True
        ).generate(prompts, n=1, max_new_tokens=max_new_tokens, temperature=0, seed=0)
        for path, fast in (("fast", True), ("fused", "fused"))
    }
    diffs, same = [], 0
    for a, b, la, lb in zip(
        gens["fast"].token_ids, gens["fused"].token_ids, gens["fast"].logprobs, gens["fused"].logprobs
    ):
        same += a == b
        shared = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        diffs += [abs(x - y) for x, y in zip(la[:shared], lb[:shared])]
    return {
        "responses": len(prompts),
        "max_new_tokens": max_new_tokens,
        "identical_fraction": same / len(prompts),
        "mean_abs_logprob_diff": sum(diffs) / max(len(diffs), 1),
    }


STUDY_PATHS = {
    "fast": dict(fast=True, compact=False),
    "compact": dict(fast=True, compact=True),
    "fused": dict(fast="fused", compact=True),
}


def study_rollouts(
    model,
    tokenizer,
    device,
    task: str,
    batches: list[int],
    group: int,
    max_new_tokens: int,
    gpu: str,
    model_name: str,
    out: Path | None = None,
    repeats: int = 1,
) -> list[dict]:
    """Collections as a run generates them: train prompts of ``task`` x ``group`` samples at T = 1, stopping
    at EOS. Response lengths are then uneven (a few run to the cap), which is where dropping finished
    rows pays; the fixed-length table above cannot show it. Each path's collection is timed ``repeats``
    times with one seed (the same responses each time) and the median counts."""
    from grpo_knobs.data import load_split
    from grpo_knobs.evaluation import encode_prompts

    problems = load_split(task, "train")
    engines = {
        name: HFEngine(model, tokenizer, device=device, max_batch_size=max(batches), return_logprobs=True, **kw)
        for name, kw in STUDY_PATHS.items()
    }
    print(f"\n{task} collections: train prompts x {group} samples, T = 1, up to {max_new_tokens} tokens, EOS on")
    print(
        f"{'responses':>9} {'mean len':>8} {'max len':>7} "
        + " ".join(f"{n + ' tok/s':>13}" for n in engines)
        + " "
        + " ".join(f"{n + '/fast':>12}" for n in list(engines)[1:])
    )
    rows = []
    for batch in batches:
        prompts = encode_prompts([problems[i % len(problems)] for i in range(max(1, batch // group))], tokenizer)
        row = {
            "gpu": gpu,
            "model": model_name,
            "task": task,
            "responses": len(prompts) * group,
            "group": group,
            "max_new_tokens": max_new_tokens,
            "temperature": 1.0,
        }
        for name, engine in engines.items():
            kw = dict(n=group, max_new_tokens=max_new_tokens, temperature=1.0, seed=batch)
            engine.generate(prompts, **kw)  # warm-up with the timed shapes (graph capture)
            calls = []
            for _ in range(repeats):
                before = engine.decoder.compactions
                seconds, gen = timed_generate(engine, prompts, device, **kw)
                calls.append(seconds)
            seconds = statistics.median(calls)
            lengths = [len(t) for t in gen.token_ids]
            row |= {
                f"{name}_tokens_per_s": sum(lengths) / seconds,
                f"{name}_seconds": seconds,
                f"{name}_calls_seconds": calls,
                f"{name}_compactions": engine.decoder.compactions - before,  # in one collection
                f"{name}_response_length_mean": sum(lengths) / len(lengths),
                f"{name}_response_length_max": max(lengths),
            }
        for name in list(engines)[1:]:
            row[f"{name}_over_fast"] = row["fast_seconds"] / row[f"{name}_seconds"]
        rows.append(row)
        if out is not None:  # after every row: a run cut short by a time limit keeps what it measured
            out.write_text(json.dumps(rows, indent=2) + "\n")
        print(
            f"{row['responses']:>9} {row['fast_response_length_mean']:>8.0f} {row['fast_response_length_max']:>7} "
            + " ".join(f"{row[n + '_tokens_per_s']:>13,.0f}" for n in engines)
            + " "
            + " ".join(f"{row[n + '_over_fast']:>12.2f}" for n in list(engines)[1:])
        )
    print("tok/s counts generated tokens only; each path samples its own responses (lengths differ by chance).")
    return rows


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="64,128,256,512,1024")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--bandwidth", type=float, default=None, help="bytes/s; default: datasheet table or measured")
    ap.add_argument(
        "--paths",
        default="eager,fast,fused",
        help="engine paths side by side: eager (generate), fast (static cache + CUDA graphs), "
        "fused (fast plus the Triton decode kernels)",
    )
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/rollout-<gpu>.json)")
    ap.add_argument(
        "--task",
        default=None,
        help="also time collections of this task (EOS on, uneven lengths): fast, compact and fused paths; "
        "written to <out stem>-<task>.json",
    )
    ap.add_argument("--group", type=int, default=8, help="samples per prompt in --task collections")
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="timed calls per path and batch (and --task collection); the median counts",
    )
    args = ap.parse_args(argv)
    if args.repeats < 1:
        raise SystemExit(f"--repeats must be at least 1, got {args.repeats}")

    device = torch.device(args.device)
    batches = [int(b) for b in args.batches.split(",")]
    model, tokenizer, info = load_model(args.model, device=device)
    prompt_ids = question_prompts(tokenizer)
    prompt_tokens = sum(len(p) for p in prompt_ids) / len(prompt_ids)
    bw, bw_source = bandwidth(device, args.bandwidth)
    kv_bytes = 2 if device.type == "cuda" else 4  # the engines run bf16 on CUDA, float32 on CPU
    gpu = gpu_slug(device)
    paths = [p for p in args.paths.split(",") if p]
    if paths[:2] != ["eager", "fast"] or not set(paths) <= {"eager", "fast", "fused"}:
        raise SystemExit(f"--paths must start with eager,fast and may add fused, got {args.paths!r}")
    engines = {
        path: HFEngine(
            model,
            tokenizer,
            device=device,
            max_batch_size=max(batches),
            fast={"eager": False, "fast": True, "fused": "fused"}[path],
            return_logprobs=False,
        )
        for path in paths
    }
    print(
        f"{info.name} on {gpu} ({device}); {args.new_tokens} decode steps per run, prompts of "
        f"{prompt_tokens:.0f} tokens; bandwidth {bw / 1e12:.2f} TB/s from {bw_source}"
    )
    print(
        f"{'batch':>6} "
        + " ".join(f"{p + ' tok/s':>12} {p + ' ms/step':>14}" for p in paths)
        + " "
        + " ".join(f"{p + '/eager':>12}" for p in paths[1:])
        + f" {'bound tok/s':>12} "
        + " ".join(f"{p + '/bound':>11}" for p in paths[1:])
    )
    rows = []
    for batch in batches:
        prompts = cycled(prompt_ids, batch)
        seconds, calls, warmups = {}, {}, {}
        for path, engine in engines.items():
            # the first call is the warm-up, of the timed length: the fast paths capture their graphs (and
            # compile their kernels); eager's cache grows to its full length, so the allocator holds those blocks
            # (after a 4-token warm-up, eager's first timed call at 512 rows took 2.7-2.8x its next on two H100s)
            times = [
                timed_generate(engine, prompts, device, **fixed_length(args.new_tokens))[0]
                for _ in range(1 + args.repeats)
            ]
            warmups[path], calls[path] = times[0], times[1:]
            seconds[path] = statistics.median(calls[path])
        tokens = batch * args.new_tokens
        bound = bound_tokens_per_s(engines["fast"].model, batch, prompt_tokens, args.new_tokens, bw, kv_bytes)
        row = {
            "gpu": gpu,
            "model": info.name,
            "batch": batch,
            "new_tokens": args.new_tokens,
            "bandwidth_bound_tokens_per_s": bound,
        }
        for path in paths:
            row[f"{path}_tokens_per_s"] = tokens / seconds[path]
            row[f"{path}_ms_per_step"] = 1e3 * seconds[path] / args.new_tokens
            row[f"{path}_calls_ms_per_step"] = [1e3 * t / args.new_tokens for t in calls[path]]
            row[f"{path}_warmup_ms_per_step"] = 1e3 * warmups[path] / args.new_tokens
        for path in paths[1:]:
            row[f"{path}_over_eager"] = seconds["eager"] / seconds[path]
            row[f"{path}_fraction_of_bound"] = tokens / seconds[path] / bound
            # the same call again, split into its parts: how much of ms/step is the decode steps themselves
            split = split_call(engines[path], prompts, device, args.new_tokens)
            row[f"{path}_split"] = split
            row[f"{path}_decode_fraction_of_bound"] = batch / (split["decode_ms_per_step"] / 1e3) / bound
        if "fused" in paths:
            row["fused_over_fast"] = seconds["fast"] / seconds["fused"]
        row.update(
            {
                "prompt_tokens_mean": prompt_tokens,
                "bandwidth_bytes_per_s": bw,
                "bandwidth_source": bw_source,
                "fast_cuda_graphs": engines["fast"].decoder.use_graphs,
                "device": str(device),
                "torch": torch.__version__,
            }
        )
        rows.append(row)
        print(
            f"{batch:>6} "
            + " ".join(f"{row[p + '_tokens_per_s']:>12,.0f} {row[p + '_ms_per_step']:>14.2f}" for p in paths)
            + " "
            + " ".join(f"{row[p + '_over_eager']:>12.2f}" for p in paths[1:])
            + f" {bound:>12,.0f} "
            + " ".join(f"{row[p + '_fraction_of_bound']:>11.1%}" for p in paths[1:])
        )
        if args.repeats > 1:
            print(
                f"{'':>6} ms/step over {args.repeats} calls, lowest-highest (the warm-up call): "
                + ", ".join(
                    f"{p} {min(row[p + '_calls_ms_per_step']):.2f}-{max(row[p + '_calls_ms_per_step']):.2f}"
                    f" ({row[p + '_warmup_ms_per_step']:.2f})"
                    for p in paths
                )
            )
        for p in paths[1:]:
            sp = row[f"{p}_split"]
            print(
                f"{'':>6} {p}: before the first step {sp['prefill_ms']:.1f} ms, {sp['decode_steps']} steps at "
                f"{sp['decode_ms_per_step']:.3f} ms ({row[p + '_decode_fraction_of_bound']:.1%} of the bound), "
                f"between steps {sp['between_steps_ms']:.1f} ms, gathering {sp['after_steps_ms']:.1f} ms, "
                f"host {sp['host_ms']:.1f} ms; wall {sp['wall_ms']:.1f} ms, of which garbage collection "
                f"{sp['gc_ms']:.1f} ms ({sp['gc_full']} full)"
            )
    if "fused" in paths:
        agreement = fused_agreement(model, tokenizer, device, prompt_ids, max(batches), min(64, args.new_tokens))
        print(
            f"fused vs fast, greedy, {agreement['responses']} responses of up to {agreement['max_new_tokens']} "
            f"tokens: {agreement['identical_fraction']:.0%} identical, mean |log-prob difference| "
            f"{agreement['mean_abs_logprob_diff']:.2e} over shared prefixes"
        )
        for row in rows:
            row["fused_agreement"] = agreement
    print(
        f"ms/step is wall time / decode steps, prefill included, the median of {args.repeats} call(s); the bound "
        "counts weights + KV reads only. "
        "The indented lines split one more call of each path (CUDA events on the stream, host work as wall time)."
    )
    out = Path(args.out or f"benchmarks/results/rollout-{gpu}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {out}")
    if args.task:
        study_out = out.with_name(f"{out.stem}-{args.task}.json")
        study_rollouts(
            model,
            tokenizer,
            device,
            args.task,
            batches,
            args.group,
            args.new_tokens,
            gpu,
            info.name,
            out=study_out,
            repeats=args.repeats,
        )
        print(f"wrote {study_out}")
    return rows


if __name__ == "__main__":
    main()

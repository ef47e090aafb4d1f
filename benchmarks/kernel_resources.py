"""Decode attention's arms compiled for an H100/H200 (sm_90) on any machine: registers, shared memory,
programs an SM can hold, and the machine instructions of the loop over cache blocks, side by side.

Triton compiles ahead of time for a named target without a GPU, and ships cuobjdump and nvdisasm, so what
a change to the kernel costs in resources and instructions can be read before GPU time is spent timing it
(``benchmarks.attention_shapes`` times the same arms inside the rollout's decode steps). The launch goes
through ``kernels.rotary_attention`` at the decoder's shapes for ``--batch`` rows, so the constexprs are the
wrapper's own, and pointers and strides carry the 16-byte divisibility the JIT would give them (without it
no load is vectorised). At SmolLM2-135M's shapes the kernel as Nsight Compute profiled it on an H200
(``88524f8``, call-13/ncu/details-after.txt) compiled here to its 162 registers and 10,240 bytes of shared
memory (arm ``k32-w1-s2-wide`` at ``341394b``, benchmarks/results/kernel-resources-sm90/).

An SM holds 65,536 registers (allocated per warp in units of 256), 228 KiB of shared memory (1 KiB of it
reserved per program), 32 programs and 64 warps; the program count is the least those allow. The loop is
the span from the block loop's label to its backward branch.

A kernel's instructions in a decode call follow from where its loop runs: ``--new-tokens`` also walks the
rollout benchmark's fixed-length call (its prompts over ``--batch`` rows, left-padded to the longest, the
decoder's 64-slot cache buckets) and counts the blocks each (row, KV head) program passes over at every step,
from the block of the row's first real prompt slot to the token's. Those passes times the loop's
instructions, plus the instructions outside the loop once a program, estimate the instructions attention
issues a step: an estimate of issue work, not of time, which the GPU measures
(``benchmarks.attention_shapes``). On an H200 the two parted: block-loop variants with up to 36% fewer
instructions took 0.5-1.7% off the decode step (``docs/performance.md``).

    python -m benchmarks.kernel_resources --arms k32-w1-s2 --json resources.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# The real compiler, not the interpreter: set before kernels.py imports triton (nothing above imports it).
if "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "0"

import torch  # noqa: E402
from grpo_knobs.models import fetch_model  # noqa: E402
from grpo_knobs.rollout import kernels as K  # noqa: E402  (imports triton in the mode set above)
from transformers import AutoConfig, AutoTokenizer  # noqa: E402

from benchmarks.attention_shapes import ARMS, parse_arms  # noqa: E402
from benchmarks.rollout import cycled, question_prompts  # noqa: E402

BUCKET = 64  # StaticDecoder's cache-length buckets

SM_REGISTERS, SM_SHARED, SM_PROGRAMS, SM_WARPS, RESERVED = 65536, 228 * 1024, 32, 64, 1024
H200_SMS = 132  # rotary_attention splits the cache while rows x KV heads < 2 x SMs
# instruction groups counted in the loop (SASS opcodes, before the first dot)
GROUPS = {
    "mma": ("HMMA",),
    "exp": ("MUFU",),
    "async copy": ("LDGSTS",),
    "global load": ("LDG",),
    "shared": ("LDS", "LDSM", "STS"),
    "float": ("FADD", "FMUL", "FFMA", "FMNMX", "FSEL", "FSETP"),
    "integer": ("IADD3", "IMAD", "ISETP", "SEL", "LOP3", "SHF", "LEA", "IABS", "IMNMX"),
}
TYPES = {torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.int64: "*i64", torch.int32: "*i32"}


def launches(arms: list[dict], config, batch: int, kv_len: int) -> list[tuple]:
    """(kernel, args, keywords) of each arm's attention launch at the decoder's shapes, recorded, not run."""
    recorded = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kw: recorded.append((original, args, kw))

    n_q, n_kv = config.num_attention_heads, config.num_key_value_heads
    D = getattr(config, "head_dim", None) or config.hidden_size // n_q
    C = -(-(kv_len + 1) // 256) * 256  # the decoder's cache: whole 256-slot pieces
    bf16 = lambda *shape: torch.zeros(*shape, dtype=torch.bfloat16)  # noqa: E731
    long1, rows = torch.zeros(1, dtype=torch.long), torch.zeros(batch, dtype=torch.long)
    kv = bf16(2, batch, n_kv, C, D)
    original, K._rotary_attention_kernel = K._rotary_attention_kernel, Recorder()
    try:
        for arm in arms:
            K.rotary_attention(
                bf16(batch, (n_q + 2 * n_kv) * D), bf16(C, D), bf16(C, D), rows, long1, long1, kv[0], kv[1],
                kv_len, 1.0 / D**0.5, bf16(batch, n_q * D), share=rows,
                **(dict(split=split_on_h200(arm["kwargs"], batch, n_kv)) | arm["kwargs"]),
            )  # fmt: skip
    finally:
        K._rotary_attention_kernel = original
    return recorded


def split_on_h200(kwargs: dict, batch: int, n_kv: int) -> bool:
    """Whether the launch splits the cache on an H200: as the arm says, else as rotary_attention decides there."""
    return kwargs.get("split", batch * n_kv < 2 * H200_SMS)


def on_h200(arm: dict, batch: int, n_kv: int) -> dict:
    """The arm with the block and stages rotary_attention launches with on an H200 where the arm leaves them."""
    return arm | {"kwargs": K.launch_shape(split_on_h200(arm["kwargs"], batch, n_kv)) | arm["kwargs"]}


def compile_sm90(fn, args, kw):
    """One launch compiled for sm_90 as the JIT would: pointers, and integers divisible by 16, marked so."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    options = {k: v for k, v in kw.items() if k in ("num_warps", "num_stages")}
    constexprs = {k: v for k, v in kw.items() if k not in options}

    def arg_type(v):
        return TYPES[v.dtype] if isinstance(v, torch.Tensor) else "i32" if isinstance(v, int) else "fp32"

    signature = dict(zip(fn.arg_names, map(arg_type, args)), **{k: "constexpr" for k in constexprs})
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, a in enumerate(args)
        if isinstance(a, torch.Tensor) or (type(a) is int and a % 16 == 0)
    }
    source = ASTSource(fn, signature, constexprs=constexprs, attrs=attrs)
    return K.triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def tool(name: str) -> str:
    """One of the CUDA binary tools Triton ships."""
    return str(Path(K.triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def sass_of(cubin: bytes) -> tuple[int, list[str]]:
    """(registers a thread, the SASS instructions in order) of a cubin."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        usage = subprocess.run([tool("cuobjdump"), "-res-usage", str(path)], capture_output=True, text=True)
        listing = subprocess.run([tool("nvdisasm"), "-c", str(path)], capture_output=True, text=True)
    registers = int(re.search(r"REG:(\d+)", usage.stdout).group(1))
    lines = []  # instructions, and ".L_x_N:" labels in place
    for line in listing.stdout.splitlines():
        label = re.match(r"\s*(\.L_x_\d+):", line)
        if label:
            lines.append(label.group(1))
        elif ins := re.match(r"\s+/\*[0-9a-f]{4}\*/\s+(.*?)\s*;", line):
            lines.append(ins.group(1))
    return registers, lines


def opcode(instruction: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", instruction).split()[0].split(".")[0]


def block_loop(lines: list[str]) -> list[str]:
    """The instructions of the loop that holds the most tensor-core products (label to backward branch)."""
    body, label_at, branches = [], {}, []  # instructions; label -> index of the next one; (index, target)
    for line in lines:
        if line.startswith(".L_x_"):
            label_at[line] = len(body)
            continue
        if target := re.search(r"BRA\s+`?\(?(\.L_x_\d+)", line):
            branches.append((len(body), target.group(1)))
        body.append(line)
    loops = [(label_at[t], b + 1) for b, t in branches if label_at.get(t, len(body)) <= b]
    start, end = max(loops or [(0, 0)], key=lambda span: sum(opcode(i) == "HMMA" for i in body[span[0] : span[1]]))
    return body[start:end]


def programs_per_sm(registers: int, shared: int, warps: int) -> int:
    per_warp = -(-registers * 32 // 256) * 256
    return min(
        SM_REGISTERS // (per_warp * warps),
        SM_SHARED // (shared + RESERVED),
        SM_PROGRAMS,
        SM_WARPS // warps,
    )


def report(arm: dict, compiled) -> dict:
    """One arm's figures; ``loop_per_slot`` divides the loop by the cache slots one pass folds in."""
    registers, lines = sass_of(compiled.asm["cubin"])
    loop = block_loop(lines)
    warps = compiled.metadata.num_warps
    shared = compiled.metadata.shared
    counts = {g: sum(opcode(i) in ops for i in loop) for g, ops in GROUPS.items()}
    return {
        "arm": arm["name"],
        "registers": registers,
        "shared_bytes": shared,
        "warps": warps,
        "programs_per_sm": programs_per_sm(registers, shared, warps),
        "instructions": sum(not line.startswith(".L_x_") for line in lines),
        "loop_instructions": len(loop),
        "loop_per_slot": len(loop) / arm["kwargs"]["block_k"],
        "loop_counts": counts,
    }


def block_passes(lengths: list[int], new_tokens: int, block_k: int, piece: int | None) -> tuple:
    """(block passes, programs) of one KV head's launches over a fixed-length call of prompts with these token
    counts, one row each: at decode step t the token sits in slot P + t of a bucket of round_up(P + t + 1, 64)
    slots (P the longest prompt), a row's real prompt starts at slot P - length, and with ``piece`` the bucket is
    split into pieces of that many slots (whole blocks), a program each, as ``rotary_attention`` splits it."""
    P, passes, programs = max(lengths), 0, 0
    for t in range(new_tokens - 1):
        kv_len = -(-(P + t + 1) // BUCKET) * BUCKET
        whole = -(-kv_len // block_k) * block_k
        size = min(-(-piece // block_k) * block_k, whole) if piece else whole
        splits = -(-kv_len // size)
        programs += len(lengths) * splits
        passes += sum((P + t) // block_k - (P - n) // block_k + 1 for n in lengths)  # the pieces partition them
    return passes, programs


def walk_estimate(rows: list[dict], arms: list[dict], folder, config, args) -> None:
    """Add each arm's block passes and estimated attention instructions a decode step of the rollout's call."""
    prompts = question_prompts(AutoTokenizer.from_pretrained(folder))
    lengths = [len(p) for p in cycled(prompts, args.batch)]
    steps, n_kv = args.new_tokens - 1, config.num_key_value_heads
    print(
        f"\nthe rollout benchmark's call: {args.batch} rows of its {len(prompts)} prompts ({min(lengths)}-"
        f"{max(lengths)} tokens), {args.new_tokens} tokens, {BUCKET}-slot buckets; one layer's launch, mean of the "
        f"steps: block passes a (row, KV head) program, warp instructions issued"
    )
    print(f"{'arm':<36} {'passes':>8} {'M instructions':>14} {'/ default':>9}")
    for row, arm in zip(rows, arms):
        kw = arm["kwargs"]
        piece = (kw.get("chunk") or K.SPLIT_CHUNK) if split_on_h200(kw, args.batch, n_kv) else None
        passes, programs = block_passes(lengths, args.new_tokens, kw["block_k"], piece)
        outside, loop = row["instructions"] - row["loop_instructions"], row["loop_instructions"]
        row["passes_per_program_step"] = passes / programs
        row["instructions_per_launch"] = n_kv * (programs * outside + passes * loop) * row["warps"] / steps
    for row in rows:
        row["instructions_over_default"] = row["instructions_per_launch"] / rows[0]["instructions_per_launch"]
        print(
            f"{row['arm']:<36} {row['passes_per_program_step']:>8.2f} {row['instructions_per_launch'] / 1e6:>14.2f} "
            f"{row['instructions_over_default']:>9.3f}"
        )


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--kv-len", type=int, default=192, help="the cache bucket attended (a compile-time constant)")
    ap.add_argument("--arms", default=None, help="arm names, comma-separated (benchmarks.attention_shapes)")
    ap.add_argument(
        "--new-tokens", type=int, default=256, help="steps of the rollout call walked for the estimate (0: none)"
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    folder = fetch_model(args.model)
    config = AutoConfig.from_pretrained(folder)
    chosen = parse_arms(args.arms) if args.arms else ARMS
    arms = [on_h200(arm, args.batch, config.num_key_value_heads) for arm in chosen]
    rows = [
        report(arm, compile_sm90(*launch))
        | dict(model=args.model, batch=args.batch, kv_len=args.kv_len, target="sm_90", triton=K.triton.__version__)
        for arm, launch in zip(arms, launches(arms, config, args.batch, args.kv_len))
    ]
    base = rows[0]
    print(
        f"decode attention for sm_90 at {args.model}'s shapes, {args.batch} rows, a {args.kv_len}-slot bucket; "
        f"outside: instructions outside the block loop; loop: in one pass of it; '/ default': per cache slot, "
        f"over {base['arm']}'s"
    )
    groups = list(GROUPS)
    columns = ("regs", "shared", "per SM", "outside", "loop", "per slot", "/ default")
    widths = (5, 7, 7, 7, 5, 8, 9)
    head = "".join(f" {c:>{w}}" for c, w in zip(columns, widths))
    print(f"{'arm':<36}" + head + "".join(f" {g:>12}" for g in groups))
    for row in rows:
        row["per_slot_over_default"] = row["loop_per_slot"] / base["loop_per_slot"]
        values = (
            row["registers"],
            row["shared_bytes"],
            row["programs_per_sm"],
            row["instructions"] - row["loop_instructions"],
            row["loop_instructions"],
            f"{row['loop_per_slot']:.1f}",
            f"{row['per_slot_over_default']:.3f}",
        )
        cells = "".join(f" {v:>{w}}" for v, w in zip(values, widths))
        print(f"{row['arm']:<36}" + cells + "".join(f" {row['loop_counts'][g]:>12}" for g in groups))
    if args.new_tokens:
        walk_estimate(rows, arms, folder, config, args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
        print(f"wrote {args.json}")
    return rows


if __name__ == "__main__":
    main()

"""Milliseconds per decode step by live batch width, for several code revisions side by side.

A collection decodes at its full width, then ever narrower as rows finish (compaction drops to the next
power of two, at least 16 rows), so its tail runs at 16-64 live rows. Each width here decodes a fixed
number of tokens per row (EOS ignored), greedy and sampled, through the public ``HFEngine`` API on the
engine's default decode path. A step's cost is (time for N tokens - time for 1 token) / (N - 1): the
prefill and the call's fixed costs drop out; the per-token host work of ``generate`` (cutting rows,
decoding text) stays in, and ``text_ms_per_step`` says how much of it is text decoding.

Each arm (benchmarks/revisions.py: ``code=DIR``, ``rev=GITREV``, or neither for this checkout) is
measured in its own process with that revision's ``lib/`` first on PYTHONPATH, after a warm-up call
of the same shapes (kernels compiled, CUDA graphs captured). Ratios are to the first arm.

    python -m benchmarks.decode_widths --out runs/decode-widths.json --arm before:rev=main --arm after
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.revisions import Code, code_for_arm, parse_arm

WIDTHS = "16,32,64,128,256,512"
MODES = {"greedy": 0.0, "sampled": 1.0}


def measure(settings: dict) -> dict:
    """In the arm's process: ms per decode step for every width and mode."""
    import grpo_knobs
    import torch
    from grpo_knobs.models import load_model
    from grpo_knobs.rollout.hf import HFEngine

    from benchmarks.rollout import gpu_slug, question_prompts

    device = torch.device(settings["device"])
    model, tokenizer, info = load_model(settings["model"], device=device)
    engine = HFEngine(model, tokenizer, device=device, max_batch_size=max(settings["widths"]))
    prompts = question_prompts(tokenizer)
    n = settings["new_tokens"]

    def timed(rows, tokens: int, temperature: float):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        gen = engine.generate(rows, n=1, max_new_tokens=tokens, temperature=temperature, seed=0, ignore_eos=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start, gen

    rows = []
    for width in settings["widths"]:
        batch = [prompts[i % len(prompts)] for i in range(width)]
        for mode, temperature in MODES.items():
            timed(batch, n, temperature)  # warm-up with the timed shapes
            timed(batch, 1, temperature)
            full, one = [], []
            for _ in range(settings["repeats"]):
                seconds, gen = timed(batch, n, temperature)
                full.append(seconds)
                one.append(timed(batch, 1, temperature)[0])
            start = time.perf_counter()
            tokenizer.batch_decode(gen.token_ids, skip_special_tokens=True)
            text = time.perf_counter() - start
            rows.append(
                {
                    "width": width,
                    "mode": mode,
                    "ms_per_step": 1e3 * statistics.median(f - o for f, o in zip(full, one)) / max(n - 1, 1),
                    "text_ms_per_step": 1e3 * text / max(n - 1, 1),
                    "seconds_new_tokens": full,
                    "seconds_one_token": one,
                }
            )
    return {
        "grpo_knobs": str(Path(grpo_knobs.__file__).resolve().parent),
        "path": getattr(engine, "path", None),  # the decode path that ran (fused, fast, eager)
        "gpu": gpu_slug(device),
        "model": info.name,
        "torch": torch.__version__,
        "rows": rows,
    }


def run_arm(name: str, code: Code, settings: dict, out: Path, logs: Path | None = None) -> dict:
    """Measure one arm in a process of its own; its output goes to ``logs/NAME.log`` when asked for, and
    its last lines to stderr when it fails."""
    result = out.with_name(f"{out.stem}-{name}.result.json")
    result.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "benchmarks.decode_widths", "--measure", json.dumps(settings), str(result)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=code.env())
    output = proc.stdout + proc.stderr
    if logs:
        (logs / f"{name}.log").write_text(output)
    if proc.returncode != 0:
        print("\n".join(output.splitlines()[-20:]), file=sys.stderr)
    arm = {"arm": name, "code": code.label, "lib": str(code.lib or ""), "commit": code.commit}
    arm["returncode"] = proc.returncode
    if proc.returncode == 0:
        arm |= json.loads(result.read_text())
        result.unlink()
        arm["ran"] = Path(arm["grpo_knobs"]) == code.package_dir().resolve()
    print(
        f"{name} ({code.label}): exit {proc.returncode}"
        + (f", decode path {arm['path']}" if "path" in arm else "; its output's last lines are above")
        + ("; it imported another grpo_knobs: PYTHONPATH?" if arm.get("ran") is False else "")
    )
    return arm


def table(arms: list[dict], settings: dict) -> tuple[str, list[dict]]:
    """The side-by-side table and its flat JSON rows (one per arm, width and mode)."""
    done = [a for a in arms if "rows" in a]
    if not done:
        return "no arm finished", []
    first = {(r["width"], r["mode"]): r["ms_per_step"] for r in done[0]["rows"]}
    flat = []
    for a in done:
        for r in a["rows"]:
            base = first[r["width"], r["mode"]]
            flat.append(
                {k: a[k] for k in ("arm", "code", "commit", "ran", "path", "gpu", "model")}
                | {"new_tokens": settings["new_tokens"], "repeats": settings["repeats"]}
                | r
                | {"over_first": r["ms_per_step"] / base}
            )
    cell = max(10, *(len(a["arm"]) + 2 for a in done))
    lines = [
        f"ms per decode step by live width: {done[0]['model']} on {done[0]['gpu']}, "
        f"{settings['new_tokens']} tokens per row, EOS ignored",
        f"{'width':>6} {'mode':<8}"
        + "".join(f"{a['arm']:>{cell}}" for a in done)
        + "".join(f"{a['arm'] + '/' + done[0]['arm']:>{cell + 6}}" for a in done[1:]),
    ]
    by_key = {(f["arm"], f["width"], f["mode"]): f for f in flat}  # every finished arm measured every cell
    for width in settings["widths"]:
        for mode in MODES:
            cells = [by_key[a["arm"], width, mode] for a in done]
            lines.append(
                f"{width:>6} {mode:<8}"
                + "".join(f"{c['ms_per_step']:>{cell}.3f}" for c in cells)
                + "".join(f"{c['over_first']:>{cell + 5}.2f}x" for c in cells[1:])
            )
    lines.append(
        "text decoding, included above, costs "
        + ", ".join(f"{a['arm']} {max(r['text_ms_per_step'] for r in a['rows']):.3f}" for a in done)
        + " ms per step at most"
    )
    return "\n".join(lines), flat


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file of the rows (exported revisions beside it).")
    p.add_argument("--logs", type=Path, default=None, help="Folder for each arm's output, NAME.log (default: none).")
    p.add_argument(
        "--arm", action="append", default=[], metavar="NAME[:code=DIR|rev=GITREV]", help="Default: this checkout."
    )
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--widths", default=WIDTHS, help="Live batch widths (rows decoding at once).")
    p.add_argument("--new-tokens", type=int, default=256, help="Tokens each row decodes (EOS ignored).")
    p.add_argument("--repeats", type=int, default=3, help="Timed calls per width and mode; the median is kept.")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda[:n].")
    a = p.parse_args(argv)
    if a.new_tokens < 2 or a.repeats < 1:
        raise SystemExit("--new-tokens must be at least 2 and --repeats at least 1")
    device = a.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    settings = {
        "model": a.model,
        "widths": [int(w) for w in a.widths.split(",") if w],
        "new_tokens": a.new_tokens,
        "repeats": a.repeats,
        "device": device,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    if a.logs:
        a.logs.mkdir(parents=True, exist_ok=True)
    specs = [parse_arm(x) for x in a.arm or ["here"]]
    for name, rest in specs:
        if set(rest) - {"code", "rev"}:
            raise SystemExit(f"--arm {name}: an arm here takes only code=DIR or rev=GITREV, got {', '.join(rest)}")
    codes = [code_for_arm(name, rest, a.out.parent) for name, rest in specs]  # every arm checked first
    arms = []
    for (name, _), code in zip(specs, codes):
        arms.append(run_arm(name, code, settings, a.out, a.logs))
        text, flat = table(arms, settings)
        a.out.write_text(json.dumps(flat, indent=2) + "\n")  # after every arm: a run cut short keeps its rows
    print(text)
    print(f"wrote {a.out}")
    return 0 if all(x["returncode"] == 0 and x["ran"] for x in arms) else 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--measure":  # the arm's own process
        Path(sys.argv[3]).write_text(json.dumps(measure(json.loads(sys.argv[2]))))
        sys.exit(0)
    sys.exit(main())

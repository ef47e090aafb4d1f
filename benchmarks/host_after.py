"""The host work of a collection outside the decoder, before and after: padding the prompts into the decoder's
rows, and from its [rows, steps] token and log-prob tensors to a Generation's per-row lists and texts.

``benchmarks.collection_timeline`` counts 49 ms of a 584 ms collection on the H200 host as host work after
decoding (its wall time outside ``StaticDecoder.run``, so the prompt padding before it too; 64 prompts x 8,
mean length 133). Here each piece runs on CPU tensors shaped like such a collection: the task's prompts, each
repeated ``group`` times; response tokens cut from those prompts (special tokens left out), a fraction of rows
at the length cap and the others ending in a stop token at lengths drawn around the mean, pad and zero
log-probs after it. The previous code (a tensor per prompt row; a Python pass per response: ``tolist``,
``cut_at_stop``, a log-prob slice; ``batch_decode``) is timed against ``prompt_rows``, ``cut_rows`` and
``decode_texts``, after checking that the responses' lists and texts are the same. The middle column ("per row")
is the current code with each text from the Rust decoder, one call per row, as ``decode_texts`` did before it
read byte-level tokens from its byte table. Last, the responses are streamed as the decoder now hands them over
(``ResponseStream``, ``--block`` columns at a time): the work done while later blocks decode, and what is left
after the last step.

    python -m benchmarks.host_after --prompts 64 --group 8 --steps 256 --mean-length 133
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from grpo_knobs.data import load_split
from grpo_knobs.evaluation import encode_prompts
from grpo_knobs.models import load_model
from grpo_knobs.rollout.base import ResponseStream, cut_at_stop, cut_rows, decode_texts, repeat_prompts
from grpo_knobs.rollout.hf import prompt_rows


def synthetic_outputs(tokenizer, pad: int, prompts, steps: int, mean_length: float, capped: float, seed: int):
    """(tokens [rows, steps], log-probs [rows, steps], stop ids) as ``StaticDecoder.run`` returns them."""
    rows = len(prompts)
    stop_ids = {tokenizer.eos_token_id}
    special = set(tokenizer.all_special_ids) | stop_ids
    pool = torch.tensor([t for p in prompts for t in p if t not in special])  # [tokens]
    g = torch.Generator().manual_seed(seed)
    # lengths: `capped` of the rows run to the cap; the others stop (the stop token counted) at an exponential
    # length whose mean brings the whole to mean_length
    at_cap = torch.rand(rows, generator=g) < capped  # [rows]
    rest_mean = max((mean_length - capped * steps) / max(1 - capped, 1e-9), 1.0)
    drawn = torch.empty(rows).exponential_(1 / rest_mean, generator=g).ceil().clamp(1, steps - 1).long()  # [rows]
    lengths = torch.where(at_cap, steps, drawn)  # [rows]
    starts = torch.randint(0, len(pool) - steps, (rows,), generator=g)  # [rows]
    tokens = pool[starts[:, None] + torch.arange(steps)]  # [rows, steps]
    col = torch.arange(steps)[None]  # [1, steps]
    tokens = torch.where(col < lengths[:, None], tokens, pad)  # [rows, steps]
    stopped = ~at_cap
    tokens[stopped, lengths[stopped] - 1] = tokenizer.eos_token_id
    logprobs = -torch.rand(rows, steps, generator=g) * (col < lengths[:, None])  # [rows, steps]
    return tokens, logprobs, stop_ids


def pad_per_row(rows: list[list[int]], pad_id: int):
    """The prompt padding as ``HFEngine._pad`` did it before ``left_pad``: a tensor per row, every row prefilled."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # [B, P]
    mask = torch.zeros((len(rows), width), dtype=torch.bool)  # [B, P]
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = True
    return ids, mask


def before(rows, tokens, logprobs, stop_ids, tokenizer, pad: int):
    """The host work as ``HFEngine.generate`` did it before ``prompt_rows``, ``cut_rows`` and ``decode_texts``.
    Returns the padded prompts, the Generation's lists and texts, and perf_counter after the first two pieces."""
    ids, mask = pad_per_row(rows, pad)
    padded = time.perf_counter()
    token_ids, finish, lps = [], [], []
    for i, row in enumerate(tokens.tolist()):
        kept, reason = cut_at_stop(row, stop_ids)
        token_ids.append(kept)
        finish.append(reason)
        lps.append(logprobs[i, : len(kept)].tolist())
    cut = time.perf_counter()
    texts = tokenizer.batch_decode(token_ids, skip_special_tokens=True)
    return (ids, mask), (token_ids, finish, lps, texts), (padded, cut)


def after(rows, tokens, logprobs, stop_ids, tokenizer, pad: int, texts=decode_texts):
    ids, mask, expand = prompt_rows(rows, len(rows), pad)  # [U, P], [U, P], [B]
    padded = time.perf_counter()
    token_ids, finish, lps = cut_rows(tokens, logprobs, stop_ids)
    cut = time.perf_counter()
    rows = (ids, mask) if expand is None else (ids[expand], mask[expand])  # [B, P] each; None: no prompt repeats
    return rows, (token_ids, finish, lps, texts(tokenizer, token_ids)), (padded, cut)


def rows_decoded(rows, tokens, logprobs, stop_ids, tokenizer, pad: int):
    """``after`` with each text from the Rust decoder, a call per row (``decode_texts`` before its byte table)."""

    def per_row(tokenizer, token_ids):
        decode = tokenizer.backend_tokenizer.decode
        return [decode(t, skip_special_tokens=True) for t in token_ids]

    return after(rows, tokens, logprobs, stop_ids, tokenizer, pad, texts=per_row)


ARMS = {"before": before, "per row": rows_decoded, "after": after}


def streamed(tokens, logprobs, stop_ids, tokenizer, block: int):
    """The responses as the decoder streams them (``ResponseStream``): ``block`` columns at a time, each while
    the GPU would run the next block's steps, then the last block and ``finish`` after the last step. Returns
    (token_ids, finish, log-probs, texts), and seconds: the blocks before the last, the slowest of them, and
    what is left after the last step."""
    stream = ResponseStream(tokenizer, tokens.shape[0], stop_ids, logprobs=True)
    origin = np.arange(tokens.shape[0])  # [R] no rows dropped: each decoder row carries its own response
    starts = list(range(0, tokens.shape[1], block))
    spans = []
    for start in starts[:-1]:
        t = time.perf_counter()
        stream.add(tokens[:, start : start + block].numpy(), logprobs[:, start : start + block].numpy(), origin)
        spans.append(time.perf_counter() - t)
    t = time.perf_counter()
    stream.add(tokens[:, starts[-1] :].numpy(), logprobs[:, starts[-1] :].numpy(), origin)
    out = stream.finish()
    return out, (sum(spans), max(spans, default=0.0), time.perf_counter() - t)


def timed(fn, reps: int, *args) -> dict[str, float]:
    """Median milliseconds over reps calls of each piece, and of the three together."""
    parts = {"prompt rows": [], "cut rows": [], "decode texts": [], "total": []}
    for _ in range(reps):
        start = time.perf_counter()
        *_, (padded, cut) = fn(*args)
        end = time.perf_counter()
        parts["prompt rows"].append(padded - start)
        parts["cut rows"].append(cut - padded)
        parts["decode texts"].append(end - cut)
        parts["total"].append(end - start)
    return {k: statistics.median(v) * 1e3 for k, v in parts.items()}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="its tokenizer decodes the texts")
    ap.add_argument("--task", default="countdown-2x10", help="whose prompts the response tokens are cut from")
    ap.add_argument("--prompts", type=int, default=64, help="prompts per collection (P)")
    ap.add_argument("--group", type=int, default=8, help="samples per prompt (G)")
    ap.add_argument("--steps", type=int, default=256, help="decode steps (the length cap)")
    ap.add_argument("--mean-length", type=float, default=133)
    ap.add_argument("--capped", type=float, default=1 / 3, help="fraction of rows that reach the cap")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--block", type=int, default=16, help="columns per streamed block (the decoder's check_every)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    _, tokenizer, info = load_model(args.model, device="cpu")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rows, _ = repeat_prompts(encode_prompts(load_split(args.task, "train")[: args.prompts], tokenizer), args.group)
    tokens, logprobs, stop_ids = synthetic_outputs(
        tokenizer, pad, rows, args.steps, args.mean_length, args.capped, args.seed
    )
    work = (rows, tokens, logprobs, stop_ids, tokenizer, pad)
    old_prompts, old, _ = before(*work)
    for name, fn in list(ARMS.items())[1:]:
        new_prompts, new, _ = fn(*work)
        if not all(torch.equal(a, b) for a, b in zip(old_prompts, new_prompts)) or old != new:
            raise SystemExit(f"the host work {name} gives other prompt rows, lists or texts than before")
    lengths = [len(t) for t in new[0]]
    if streamed(tokens, logprobs, stop_ids, tokenizer, args.block)[0] != tuple(new):
        raise SystemExit("the streamed responses differ from the lists and texts cut and decoded at the end")
    ms = {name: timed(fn, args.reps, *work) for name, fn in ARMS.items()}
    spans = [streamed(tokens, logprobs, stop_ids, tokenizer, args.block)[1] for _ in range(args.reps)]
    ms["streamed"] = {
        k: statistics.median(s[i] for s in spans) * 1e3 for i, k in enumerate(("blocks", "slowest block", "left"))
    }
    print(
        f"{args.prompts} prompts x {args.group}, {args.steps} steps, mean length {sum(lengths) / len(lengths):.0f}, "
        f"{new[1].count('length')} at the cap; {info.name}'s tokenizer; median of {args.reps}, ms"
    )
    print(f"{'part':<14} {'before':>8} {'per row':>8} {'after':>8} {'before/after':>13} {'per row/after':>14}")
    for part in ms["before"]:
        b, r, a = ms["before"][part], ms["per row"][part], ms["after"][part]
        print(f"{part:<14} {b:8.2f} {r:8.2f} {a:8.2f} {b / a:12.1f}x {r / a:13.1f}x")
    st, at_end = ms["streamed"], ms["after"]["cut rows"] + ms["after"]["decode texts"]
    print(
        f"streamed in {args.block}-column blocks: {st['blocks']:.2f} ms while decoding (slowest block "
        f"{st['slowest block']:.2f}), {st['left']:.2f} ms left after the last step, against {at_end:.2f} ms of "
        f"cut rows + decode texts after it ({at_end / st['left']:.1f}x)"
    )
    result = {
        "settings": vars(args) | {"json": str(args.json)},
        "ms": ms,
        "response_length_mean": sum(lengths) / len(lengths),
        "at_cap": new[1].count("length"),
    }
    if args.json:
        args.json.write_text(json.dumps(result))
        print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main()

"""``grpo-knobs prepare``: compile every kernel a run of a model uses, once per machine, into the disk caches.

On CUDA a run compiles Triton kernels the first time it needs them: the fused decode step's (the
attention kernel once per attended-cache length, the sampler once greedy and once sampled) and
liger-kernel's trainer kernels (torch.compile's too, on that trainer path). On a fresh machine the
first run pays for that inside its timed phases. This runs a short piece of a run through the entry
points a run uses, and nothing below them (``Trainer.setup``, the engine's ``generate``,
``Trainer.collect``, ``Trainer.train_on_collection``), so it keeps covering the kernels as they change;
they land in the caches of :mod:`grpo_knobs.caches`, which later processes read. CUDA graphs cannot
be kept on disk: each process still captures its own, on first use. A CPU run compiles nothing.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from .caches import COMPILE_CACHES
from .config import RunConfig


def _entries(folder: str | None) -> int:
    """Files in a cache folder (0 when it does not exist yet)."""
    if not folder or not Path(folder).is_dir():
        return 0
    return sum(len(files) for _, _, files in os.walk(folder))


def prepare(
    overrides: dict[str, Any], max_new_tokens: int = 256, say: Callable[[str], None] = print
) -> dict[str, Any] | None:
    """Compile what a run with ``overrides`` (RunConfig fields, raw strings allowed) uses; None on CPU.

    Returns what ran (``warm_up``), the GPU, and how many files each compile cache gained.
    """
    import torch

    from .runtime import resolve_device

    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be a positive number of tokens, got {max_new_tokens}.")
    if "max_new_tokens" in overrides:
        raise ValueError("set the response length with --max-new-tokens, not -p max_new_tokens.")
    cfg = RunConfig.from_dict({**overrides, "max_new_tokens": max_new_tokens})
    if resolve_device(cfg.device).type != "cuda":
        return None
    if cfg.engine != "hf":
        raise ValueError(
            f"prepare compiles the hf engine's kernels; an {cfg.engine} server compiles and caches its own."
        )
    folders = {name: os.environ.get(name) for name in COMPILE_CACHES}
    before = {name: _entries(path) for name, path in folders.items()}
    start = time.perf_counter()
    done = warm_up(cfg, say)
    return done | {
        "gpu": torch.cuda.get_device_name(),
        "seconds": time.perf_counter() - start,
        "caches": {name: (folders[name], _entries(folders[name]) - before[name]) for name in COMPILE_CACHES},
    }


def warm_up(cfg: RunConfig, say: Callable[[str], None] = print) -> dict[str, Any]:
    """A short piece of the run ``cfg`` on its device, records written nowhere.

    Generation covers every attended-cache length a run with responses up to ``cfg.max_new_tokens``
    (or ``eval_max_new_tokens``) reaches: a one-token prompt decoded with EOS ignored for the task's
    longest prompt plus that many steps, greedy at an evaluation's width and sampled at a collection's.
    Then one collection (EOS on, so it narrows as rows finish), its updates and the weight sync.
    """
    from .evaluation import encode_prompts
    from .runtime import deterministic_mode, sync_cuda
    from .trainer import Trainer

    with tempfile.TemporaryDirectory() as out, deterministic_mode(cfg.deterministic):
        # setup(), collect() and train_on_collection() write no records; the folder only gives them a run_dir
        cfg = RunConfig.from_dict({**cfg.to_dict(), "output_dir": out, "run_id": "prepare"})
        trainer = Trainer(cfg, progress=False)
        trainer.setup()
        prompts = encode_prompts(trainer.train_pool + trainer.val_problems, trainer.tokenizer)
        longest = max(len(p) for p in prompts)
        # A one-token prompt attends to the first cache block; longest + max_new_tokens - 1 steps reach
        # the longest cache any batch of this task attends to, in training or evaluation.
        steps = longest + max(cfg.max_new_tokens, cfg.eval_max_new_tokens or 0) - 1
        # at the widths a run starts them at: an evaluation's (greedy, one row per problem) and a collection's
        widths = {
            0.0: min(len(trainer.val_problems), cfg.max_concurrent_sequences),
            cfg.temperature: min(cfg.rollout_batch_size * cfg.n_samples_per_prompt, cfg.max_concurrent_sequences),
        }
        for temperature, rows in widths.items():
            t = time.perf_counter()
            trainer.engine.generate(
                [prompts[0][:1]], n=rows, max_new_tokens=steps, temperature=temperature, seed=cfg.seed, ignore_eos=True
            )
            sync_cuda()
            kind = "greedy" if temperature == 0 else f"sampled (T={temperature:g})"
            say(f"  {kind} decode, {rows} rows x {steps} tokens: {time.perf_counter() - t:.1f} s")
        t = time.perf_counter()
        batch = trainer.collect(0)
        trainer.train_on_collection(batch)
        trainer.sync_weights()
        sync_cuda()
        say(f"  one collection ({len(batch.seqs)} responses), updates, weight sync: {time.perf_counter() - t:.1f} s")
    return {
        "model": cfg.model,
        "rollout_path": trainer.engine.path,
        "trainer_path": trainer.trainer_path,
        "longest_prompt": longest,
        "decode_steps": steps,
    }

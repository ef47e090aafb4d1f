"""``grpo-knobs prepare``: compile every kernel a run of a model uses, once per machine, into the disk caches.

On CUDA a run compiles Triton kernels the first time it needs them: the fused decode step's (the
attention kernel once per attended-cache length, the sampler once greedy and once sampled) and
liger-kernel's trainer kernels (torch.compile's too, on that trainer path). On a fresh machine the
first run pays for that inside its timed phases. This runs a short piece of a run through the entry
points a run uses, and nothing below them (``Trainer.setup``, the engine's ``generate``,
``Trainer.collect``, ``Trainer.train_on_collection``), so it keeps covering the kernels as they change;
they land in the caches of :mod:`grpo_knobs.caches`, which later processes read. CUDA graphs cannot
be kept on disk: each process still captures its own, on first use. A CPU run compiles nothing.

Unless the run parameters pin ``deterministic``, both trainer modes are warmed: deterministic mode
fixes the packed token budget from the GPU's memory, so its packed shapes (and kernels) are not the
default mode's. Then it imports what a ``grpo-knobs train`` process imports, so Python's bytecode
(under ``PYTHONPYCACHEPREFIX`` when set) is written before the first run rather than inside it.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import importlib
import importlib.util
import io
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


def warm_up_configs(values: dict[str, Any]) -> list[RunConfig]:
    """The runs prepare warms for run parameters ``values`` (raw strings allowed): those, in both trainer
    modes unless they pin ``deterministic`` (the packed shapes of one mode are not the other's)."""
    if "deterministic" in values:
        return [RunConfig.from_dict(values)]
    return [RunConfig.from_dict(values | {"deterministic": mode}) for mode in (False, True)]


def prepare(values: dict[str, Any], say: Callable[[str], None] = print) -> dict[str, Any] | None:
    """Compile what a run with ``values`` (RunConfig fields, raw strings allowed) uses; None on CPU.

    Returns what ran in each trainer mode (``runs``, one :func:`warm_up` result each), the GPU, how many
    modules were imported for their bytecode, and how many files each compile cache gained.
    """
    import torch

    from .runtime import resolve_device

    configs = warm_up_configs(values)
    if resolve_device(configs[0].device).type != "cuda":
        return None
    if configs[0].engine != "hf":
        raise ValueError(
            f"prepare compiles the hf engine's kernels; an {configs[0].engine} server compiles and caches its own."
        )
    folders = {name: os.environ.get(name) for name in COMPILE_CACHES}
    before = {name: _entries(path) for name, path in folders.items()}
    start = time.perf_counter()
    runs = []
    for cfg in configs:
        say(f"deterministic={str(cfg.deterministic).lower()}:")
        runs.append(warm_up(cfg, say) | {"deterministic": cfg.deterministic})
        gc.collect()  # the warmed model, engine and graphs go before the next mode loads its own
        torch.cuda.empty_cache()
    return {
        "runs": runs,
        "modules": len(import_run_modules()),
        "gpu": torch.cuda.get_device_name(),
        "seconds": time.perf_counter() - start,
        "caches": {name: (folders[name], _entries(folders[name]) - before[name]) for name in COMPILE_CACHES},
    }


# The train command's modules (cli.py's _cmd_train imports these two): what they import when called is
# found from their source, so the list follows the code.
RUN_ENTRY_MODULES = ("grpo_knobs.config", "grpo_knobs.trainer")


def run_modules(entries: tuple[str, ...] = RUN_ENTRY_MODULES) -> list[str]:
    """The grpo_knobs modules ``entries`` reach through any import statement, inside functions too."""
    seen: set[str] = set()
    todo = list(entries)
    while todo:
        name = todo.pop()
        if name in seen or not _is_module(name):
            continue
        seen.add(name)
        todo += [n for n in _imported_names(name) if n.partition(".")[0] == "grpo_knobs"]
    return sorted(seen)


def _is_module(name: str) -> bool:
    """Whether ``name`` is a module (``from .records import RunDir`` also names ``grpo_knobs.records.RunDir``)."""
    parent = name.rpartition(".")[0]
    if parent and (not _is_module(parent) or importlib.util.find_spec(parent).submodule_search_locations is None):
        return False
    return importlib.util.find_spec(name) is not None


def _imported_names(module: str) -> list[str]:
    """Every name an import statement of ``module``'s source names: ``x.y`` and, for ``from x import y``, both."""
    spec = importlib.util.find_spec(module)
    package = module if spec.submodule_search_locations is not None else module.rpartition(".")[0]
    names = []
    for node in ast.walk(ast.parse(spec.loader.get_source(module))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            names += [base] + [f"{base}.{a.name}" for a in node.names]
    return names


def import_run_modules() -> list[str]:
    """Import what a ``grpo-knobs train`` process imports, so its bytecode is written now; returns them."""
    modules = ["grpo_knobs.cli", *run_modules()]
    for name in modules:
        with contextlib.suppress(ImportError):  # an optional dependency missing here: a run cannot import it either
            importlib.import_module(name)
    import pandas as pd
    import torch

    from .records import evals_frame

    # What a run's records import on first use: pandas' parquet engine (evals.parquet, written and read
    # back) and the resume state's writers (torch's serializer, safetensors).
    buf = io.BytesIO()
    evals_frame([]).to_parquet(buf, index=False)
    pd.read_parquet(buf).to_dict("records")
    torch.save({}, io.BytesIO())
    importlib.import_module("safetensors.torch")
    return modules


def warm_up_widths(cfg: RunConfig, validation_problems: int) -> dict[float, int]:
    """Rows per decode, by temperature, at the widths a run starts them at: an evaluation's (greedy, one
    row per problem) and a collection's (P x G), each capped at ``max_concurrent_sequences``."""
    return {
        0.0: min(validation_problems, cfg.max_concurrent_sequences),
        cfg.temperature: min(cfg.rollout_batch_size * cfg.n_samples_per_prompt, cfg.max_concurrent_sequences),
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
        for temperature, rows in warm_up_widths(cfg, len(trainer.val_problems)).items():
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

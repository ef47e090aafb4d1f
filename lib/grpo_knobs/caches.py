"""The project's cache directory, and the compiled-kernel caches kept in it.

Layout (root: $GRPO_KNOBS_CACHE, default ~/.cache/grpo-knobs):
    models/, downloads/   fetched and converted models (grpo_knobs.models)
    triton/               Triton's compiled kernels: the fused decode kernels, liger-kernel's trainer kernels
    inductor/             torch.compile's (Inductor's) generated code and compiled graphs

Triton and Inductor compile on first use and keep what they built on disk, by default in ~/.triton/cache
and a temporary folder. Importing grpo_knobs points both here (``use_compile_caches``), unless the user
set TRITON_CACHE_DIR or TORCHINDUCTOR_CACHE_DIR, so every entry point (CLI, study workers, the papermill
kernel, benchmarks) and the processes it starts share one cache beside the models, which
``grpo-knobs prepare`` fills once per machine. Both read their variable when they compile, not when
they are imported (``triton.knobs.cache.dir`` reads the environment at every cache lookup; Inductor's
``cache_dir()`` at every call), so this takes effect even where triton or torch was imported first.
Entries are keyed by source, compile-time constants, compiler version and GPU, so code revisions,
Triton versions and GPU models can share one cache.

No heavy imports here: the package imports this module first.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

CACHE_ENV = "GRPO_KNOBS_CACHE"
# variable -> folder under cache_dir()
COMPILE_CACHES = {"TRITON_CACHE_DIR": "triton", "TORCHINDUCTOR_CACHE_DIR": "inductor"}


def cache_dir(environ: MutableMapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    return Path(environ.get(CACHE_ENV) or Path.home() / ".cache" / "grpo-knobs").expanduser()


def _writable(path: Path) -> bool:
    """Whether ``path`` exists writable, or could be created (its nearest existing ancestor is writable)."""
    while not path.exists():
        if path.parent == path:
            return False
        path = path.parent
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def use_compile_caches(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Point Triton's and Inductor's caches at folders under ``cache_dir()``; returns the variables it set.

    A variable the user set is left alone. Where the cache directory cannot be written (a read-only
    shared cache), nothing is set and both keep their own defaults: a compile must never fail on it.
    """
    environ = os.environ if environ is None else environ
    unset = [name for name in COMPILE_CACHES if not environ.get(name)]
    if not unset:
        return {}
    root = cache_dir(environ).absolute()  # absolute: processes started elsewhere find the same folders
    if not _writable(root):
        return {}
    chosen = {name: str(root / COMPILE_CACHES[name]) for name in unset}
    environ.update(chosen)
    return chosen

"""Process-level set-up shared by training, evaluation and studies: device, seeds, CUDA sync,
and tying a worker's life to its parent's."""

from __future__ import annotations

import ctypes
import os
import random
import signal
import sys

import numpy as np
import torch

# Set in a study's worker processes and the notebook kernels they start: each process so marked
# dies with its parent, so a killed study leaves no run going on behind a rerun's back.
DIE_WITH_PARENT_ENV = "GRPO_KNOBS_DIE_WITH_PARENT"
_PR_SET_PDEATHSIG = 1


def resolve_device(device: str) -> torch.device:
    """``auto`` picks CUDA when present; an explicit CUDA device must exist."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was requested but CUDA is not available here; use device=cpu or auto.")
    return torch.device(device)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def sync_cuda() -> None:
    """Wait for queued CUDA work, so wall-clock readings include it."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def die_with_parent() -> None:
    """Ask Linux to send this process SIGTERM when its parent exits (no-op elsewhere).

    Used as ``preexec_fn`` of study workers, and by processes that find ``DIE_WITH_PARENT_ENV``
    set (a papermill kernel started by such a worker).
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() == 1:  # the parent is already gone: the signal would never come
        os.kill(os.getpid(), signal.SIGTERM)

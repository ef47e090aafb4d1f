"""Process-level set-up shared by training, evaluation and studies: device, seeds, CUDA sync,
and tying a worker's life to its parent's.

torch and numpy are imported where they are used: a study's driver and ``grpo-knobs plan`` import
this module for ``die_with_parent`` and never need either.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# Set in a study's worker processes and the notebook kernels they start: each process so marked
# dies with its parent, so a killed study leaves no run going on behind a rerun's back.
DIE_WITH_PARENT_ENV = "GRPO_KNOBS_DIE_WITH_PARENT"
_PR_SET_PDEATHSIG = 1


def resolve_device(device: str) -> torch.device:
    """``auto`` picks CUDA when present; an explicit CUDA device must exist."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was requested but CUDA is not available here; use device=cpu or auto.")
    return torch.device(device)


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# cuBLAS reproduces its results run to run only with one of these workspace settings (NVIDIA's cuBLAS
# documentation, "Results reproducibility"); torch refuses a GEMM in deterministic mode without it.
CUBLAS_WORKSPACE_ENV = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")


@contextlib.contextmanager
def deterministic_mode(enabled: bool = True):
    """Run the block with a fixed reduction order in every kernel torch launches; yields what was set.

    torch's deterministic algorithms (index_add, scatter_add and gather backward without atomics, flash and
    memory-efficient attention's deterministic backward), cuBLAS's reproducible workspace, cuDNN without
    autotuning. Uninitialised memory is left unfilled: the run never reads it, and filling every
    ``torch.empty`` would slow decoding. The previous settings come back afterwards, so one process can run
    deterministic and default runs one after another. With ``enabled`` False this changes nothing and
    yields an empty mapping.
    """
    if not enabled:
        yield {}
        return
    import torch.utils.deterministic

    saved_env = os.environ.get(CUBLAS_WORKSPACE_ENV)
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    if saved_env not in CUBLAS_DETERMINISTIC:
        os.environ[CUBLAS_WORKSPACE_ENV] = CUBLAS_DETERMINISTIC[0]
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield {
            "torch_deterministic_algorithms": True,
            CUBLAS_WORKSPACE_ENV: os.environ[CUBLAS_WORKSPACE_ENV],
            "cudnn_deterministic": True,
            "cudnn_benchmark": False,
        }
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.utils.deterministic.fill_uninitialized_memory = saved[2]
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[3], saved[4]
        if saved_env is None:
            os.environ.pop(CUBLAS_WORKSPACE_ENV, None)
        else:
            os.environ[CUBLAS_WORKSPACE_ENV] = saved_env


@contextlib.contextmanager
def without_deterministic_algorithms():
    """Suspend torch's deterministic algorithms for the block (cuBLAS's workspace setting stays).

    For code whose kernels are deterministic already, where torch's replacements only cost: the decoder
    runs forward passes with no atomic reductions, and torch's deterministic ``index_copy_`` would sort
    its indices on every decode step, inside the captured CUDA graphs.
    """
    import torch

    enabled, warn_only = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    if not enabled:
        yield
        return
    torch.use_deterministic_algorithms(False)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(True, warn_only=warn_only)


def sync_cuda() -> None:
    """Wait for queued CUDA work, so wall-clock readings include it."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def die_with_parent() -> None:
    """Ask Linux to send this process SIGTERM when its parent exits (no-op elsewhere). Linux sends it
    again for each thread of the parent that this process is handed to on the parent's way out.

    Used as ``preexec_fn`` of study workers, and by processes that find ``DIE_WITH_PARENT_ENV``
    set (a papermill kernel started by such a worker).
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() == 1:  # the parent is already gone: the signal would never come
        os.kill(os.getpid(), signal.SIGTERM)


# When the first SIGINT or SIGTERM inside ``interrupts()`` arrived (time.monotonic()), or None. The
# KeyboardInterrupt the handler raises can be lost: Python drops an exception raised inside a finalizer
# (``__del__``, a generator being collected) and carries on. The flag is not lost, and long loops call
# ``check_interrupted()`` at their safe points. A plain value, not a threading.Event: setting an Event takes
# a lock, and a signal arriving while the handler holds it runs the handler again, which then waits on that
# lock forever.
_first_signal: float | None = None
_depth = 0
# Signals within this many seconds of the first are the same event: a parent that dies sends its
# children's parent-death signal once for each of its threads, a burst within microseconds.
SAME_EVENT_SECONDS = 0.5


def interrupted() -> bool:
    """Whether an interrupt arrived inside the current ``interrupts()`` block."""
    return _first_signal is not None


def check_interrupted() -> None:
    """Raise KeyboardInterrupt if an interrupt arrived, even one whose own exception was swallowed."""
    if _first_signal is not None:
        raise KeyboardInterrupt("interrupted")


@contextlib.contextmanager
def interrupts(on_first: Callable[[], bool] | None = None, keep_ignored: bool = True) -> Iterator[None]:
    """SIGINT (Ctrl-C) and SIGTERM in this block are noted (see :func:`check_interrupted`) and raise
    KeyboardInterrupt; SIGTERM so that a stopped study or a scheduler's kill ends a run as an
    interrupted, resumable one.

    Args:
        on_first: called at the first signal instead of raising, when it returns True (it passed the
            interrupt on, e.g. to a notebook kernel that then stops by itself); a second signal raises.
            Signals within ``SAME_EVENT_SECONDS`` of the first count as the first: they neither raise
            again nor interrupt the clean-up the first one started.
        keep_ignored: leave SIGINT ignored where this process inherited it ignored, as Python does (a
            shell starts background jobs so: the terminal's Ctrl-C is not theirs). A study's workers pass
            False: their study sends them SIGINT on purpose.

    A no-op outside the main thread (only it receives signals). Nested blocks share the flag, which the
    outermost block clears on entry.
    """
    global _depth, _first_signal
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        global _first_signal
        now = time.monotonic()
        if _first_signal is None:
            _first_signal = now
            if on_first is not None and on_first():
                return
        elif now - _first_signal < SAME_EVENT_SECONDS:
            return
        raise KeyboardInterrupt("terminated" if signum == signal.SIGTERM else "interrupted")

    if _depth == 0:
        _first_signal = None
    sigs = [signal.SIGTERM]
    if not (keep_ignored and signal.getsignal(signal.SIGINT) == signal.SIG_IGN):
        sigs.append(signal.SIGINT)
    previous = {sig: signal.signal(sig, handler) for sig in sigs}
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        for sig, old in previous.items():
            signal.signal(sig, old)

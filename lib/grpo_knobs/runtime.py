"""Process-level set-up shared by training, evaluation and studies: device, seeds, CUDA sync,
and tying a worker's life to its parent's."""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import sys
import threading
from collections.abc import Callable, Iterator

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


# Set by the first SIGINT or SIGTERM inside ``interrupts()``. The KeyboardInterrupt the handler raises can be
# lost: Python drops an exception raised inside a finalizer (``__del__``, a generator being collected) and
# carries on. The flag is not lost, and long loops call ``check_interrupted()`` at their safe points.
_INTERRUPTED = threading.Event()
_depth = 0


def interrupted() -> bool:
    """Whether an interrupt arrived inside the current ``interrupts()`` block."""
    return _INTERRUPTED.is_set()


def check_interrupted() -> None:
    """Raise KeyboardInterrupt if an interrupt arrived, even one whose own exception was swallowed."""
    if _INTERRUPTED.is_set():
        raise KeyboardInterrupt("interrupted")


@contextlib.contextmanager
def interrupts(on_first: Callable[[], bool] | None = None, keep_ignored: bool = True) -> Iterator[None]:
    """SIGINT (Ctrl-C) and SIGTERM in this block are noted (see :func:`check_interrupted`) and raise
    KeyboardInterrupt; SIGTERM so that a stopped study or a scheduler's kill ends a run as an
    interrupted, resumable one.

    Args:
        on_first: called at the first signal instead of raising, when it returns True (it passed the
            interrupt on, e.g. to a notebook kernel that then stops by itself); a second signal raises.
        keep_ignored: leave SIGINT ignored where this process inherited it ignored, as Python does (a
            shell starts background jobs so: the terminal's Ctrl-C is not theirs). A study's workers pass
            False: their study sends them SIGINT on purpose.

    A no-op outside the main thread (only it receives signals). Nested blocks share the flag, which the
    outermost block clears on entry.
    """
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        first = not _INTERRUPTED.is_set()
        _INTERRUPTED.set()
        if first and on_first is not None and on_first():
            return
        raise KeyboardInterrupt("terminated" if signum == signal.SIGTERM else "interrupted")

    if _depth == 0:
        _INTERRUPTED.clear()
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

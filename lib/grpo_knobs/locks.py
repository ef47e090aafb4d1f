"""One writer per run and per study: advisory locks that name their holder.

``fcntl.flock`` is released by the kernel when its holder exits, however it exits, so a lock
left by a dead process is simply taken by the next one; the PID and host written into the file
are only there to name the holder in the error a second writer gets.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from pathlib import Path
from typing import Iterator


class LockedError(RuntimeError):
    """Another live process holds the lock."""


@contextlib.contextmanager
def exclusive(path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if needed) for the block, or raise at once.

    Args:
        path: the lock file (kept; only its lock matters).
        what: what the lock guards, for the error message (``run runs/x/y``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "an unknown process"
            raise LockedError(
                f"{what} is in use by {holder} (lock {path}); wait for it to finish or stop it, then run again."
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"PID {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def run_lock_path(output_dir: str | Path, run_id: str) -> Path:
    """Beside the run directory, so that taking it creates nothing inside the run; in a folder of its own,
    so that no run id names the study's lock."""
    from .config import check_name

    return Path(output_dir) / ".locks" / "runs" / f"{check_name('run_id', run_id)}.lock"


def study_lock_path(study_dir: str | Path) -> Path:
    return Path(study_dir) / ".locks" / "study.lock"

"""What a run depends on, recorded beside its results: package versions, the git commit, the library source."""

from __future__ import annotations

import hashlib
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from .locations import checkout_root

PACKAGES = (
    "grpo-knobs",
    "torch",
    "transformers",
    "safetensors",
    "gguf",
    "accelerate",
    "numpy",
    "pandas",
    "pyarrow",
    "scipy",
    "papermill",
    "triton",
    "liger-kernel",
    "sglang",
)


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit(root: Path | None = None) -> str | None:
    """The commit of the checkout this package is imported from (or of ``root``), with ``+dirty`` when
    tracked files differ from it; None for an installed package, whose version is recorded instead."""
    root = root or checkout_root()
    if root is None:
        return None
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def source_sha256(package_dir: Path = Path(__file__).resolve().parent) -> str:
    """One hash over the library's Python sources (relative paths and contents).

    It identifies the training code even where git metadata is missing or stale, as in a
    copy of the working tree sent to a GPU machine.
    """
    h = hashlib.sha256()
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir).as_posix()
        if "__pycache__" in rel:
            continue
        h.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()

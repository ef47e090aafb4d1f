"""Paths: notebook parameters resolved against the repository root."""

from __future__ import annotations

from pathlib import Path


def resolve_path(path: str | Path, root: Path) -> Path:
    """``path`` itself when absolute, else relative to the repository ``root``.

    Notebooks run with their own folder as cwd under nbval and with the
    caller's cwd under papermill; resolving parameters against the root makes
    both behave the same.
    """
    p = Path(path)
    return p if p.is_absolute() else root / p

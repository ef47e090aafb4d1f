"""Where the product's files are: shipped inside the package, in a user's workspace, in a checkout.

The package carries everything it reads besides code: the study presets (``studies/``), the
notebooks (``notebooks/``), the data manifests (``data_manifests/``) and the shipped data
(``datasets/``: GSM8K, the published study's endpoints and rollout benchmarks). They are found through
:mod:`importlib.resources`, so a checkout (``PYTHONPATH=lib`` or an editable install) and an
installed wheel read the same files from the same place.

A workspace (``grpo-knobs init DIR``) holds a user's own copies of the notebooks and a preset.
Inside one (the current directory or a folder above it, or ``$GRPO_KNOBS_WORKSPACE``), its
presets and notebooks come before the shipped ones, and studies write ``runs/`` there.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

WORKSPACE_FILE = "grpo-knobs-workspace.json"
WORKSPACE_ENV = "GRPO_KNOBS_WORKSPACE"


def shipped(*parts: str) -> Path:
    """A file or folder shipped inside the ``grpo_knobs`` package, as a filesystem path."""
    root = resources.files(__package__)
    if not isinstance(root, Path):  # papermill and the data loaders need real files
        raise RuntimeError(f"grpo_knobs is imported from {root}, not from files; install it with pip")
    return root.joinpath(*parts)


STUDIES = shipped("studies")
NOTEBOOKS = shipped("notebooks")
MANIFESTS = shipped("data_manifests")
DATASETS = shipped("datasets")
# The published study's endpoints (Table 2 and the screening figures' values; see its SOURCE.md).
REFERENCE_CSV = DATASETS / "reference" / "study_endpoints.csv"
# Rollout throughput by batch size measured on a GPU (benchmarks/rollout.py; see its SOURCE.md).
ROLLOUT_BENCHMARKS = DATASETS / "rollout-benchmarks"


def package_relative(path: Path) -> str:
    """``grpo_knobs/...`` for a shipped file (the same in a checkout and an install), else the absolute path."""
    path = path.resolve()
    base = shipped().parent
    return path.relative_to(base).as_posix() if path.is_relative_to(base) else str(path)


def checkout_root() -> Path | None:
    """The repository this package is imported from (``<root>/lib/grpo_knobs``), or None for an installed one."""
    root = shipped().parent.parent
    return root if (root / "pyproject.toml").is_file() and shipped().parent.name == "lib" else None


def find_workspace(start: str | os.PathLike | None = None) -> Path | None:
    """The workspace this process works in: ``$GRPO_KNOBS_WORKSPACE``, else the nearest folder at or
    above ``start`` (default: the current directory) that holds ``grpo-knobs-workspace.json``."""
    named = os.environ.get(WORKSPACE_ENV)
    if named:
        root = Path(named).expanduser().resolve()
        if not (root / WORKSPACE_FILE).is_file():
            raise FileNotFoundError(
                f"${WORKSPACE_ENV}={named} is not a workspace (no {WORKSPACE_FILE}); "
                f"unset it, or write one there with `grpo-knobs init {named}`"
            )
        return root
    here = Path(start or Path.cwd()).resolve()
    return next((folder for folder in (here, *here.parents) if (folder / WORKSPACE_FILE).is_file()), None)


def project_root() -> Path:
    """Where ``runs/`` and the notebooks' relative paths resolve: the workspace, else the checkout, else the cwd."""
    return find_workspace() or checkout_root() or Path.cwd()


def project_relative(path: str | os.PathLike, root: Path | None = None) -> str:
    """``path`` relative to ``root`` (default: :func:`project_root`) where it lies under it, else whole: how
    executed notebooks and reports name folders, so they can be shared without this machine's paths."""
    path, root = Path(path).resolve(), (root or project_root()).resolve()
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def notebook(name: str) -> Path:
    """The notebook ``name`` (e.g. ``10_train``): the workspace's copy where it has one, else the shipped one."""
    workspace = find_workspace()
    if workspace is not None and (workspace / "notebooks" / f"{name}.ipynb").is_file():
        return workspace / "notebooks" / f"{name}.ipynb"
    return NOTEBOOKS / f"{name}.ipynb"


def preset_dirs() -> list[Path]:
    """Where study presets are looked up by name, in order: the workspace's ``studies/``, then the shipped ones."""
    workspace = find_workspace()
    return ([workspace / "studies"] if workspace is not None else []) + [STUDIES]

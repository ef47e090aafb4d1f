"""Where the product's files are.

The package carries everything it reads besides code: the study presets (``studies/``), the
notebooks (``notebooks/``), the data manifests (``data_manifests/``) and the shipped data
(``datasets/``: GSM8K and the published study's endpoints). They are found through
:mod:`importlib.resources`, so a checkout (``PYTHONPATH=lib`` or an editable install) and an
installed wheel read the same files from the same place.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


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


def package_relative(path: Path) -> str:
    """``grpo_knobs/...`` for a shipped file (the same in a checkout and an install), else the absolute path."""
    path = path.resolve()
    base = shipped().parent
    return path.relative_to(base).as_posix() if path.is_relative_to(base) else str(path)

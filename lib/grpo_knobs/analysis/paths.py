"""Paths: notebook parameters resolved against the project root (the workspace or the checkout)."""

from __future__ import annotations

from pathlib import Path


def resolve_path(path: str | Path, root: Path) -> Path:
    """``path`` itself when absolute, else relative to ``root`` (:func:`notebook_setup`'s).

    Notebooks run with their own folder as cwd under nbval and with the
    caller's cwd under papermill; resolving parameters against the root makes
    both behave the same.
    """
    p = Path(path)
    return p if p.is_absolute() else root / p


def notebook_setup() -> Path:
    """Set up an analysis notebook and return the root to resolve its parameters against.

    Configures the figures (:func:`grpo_knobs.plots.configure`, inline
    display under IPython) and pandas' display width. The root is the
    workspace the notebook runs in (``grpo-knobs init``), else the checkout
    whose ``grpo_knobs`` is imported, else the current directory
    (:func:`grpo_knobs.locations.project_root`), so papermill (cwd: that root)
    and nbval or Jupyter (cwd: the notebook's folder) resolve ``study_dir``
    and ``out_dir`` the same way.
    """
    import pandas as pd

    from grpo_knobs import plots
    from grpo_knobs.locations import project_root

    try:
        from IPython import get_ipython
    except ImportError:  # plain Python: figures are only saved
        get_ipython = None
    shell = get_ipython() if get_ipython else None
    if shell is not None:
        shell.run_line_magic("matplotlib", "inline")
    plots.configure()
    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 40)
    return project_root()

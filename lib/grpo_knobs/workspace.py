"""``grpo-knobs init DIR``: a workspace to run and change a study without a checkout.

A workspace holds the notebooks (outputs cleared; the study drivers default to the preset copied
here, the analysis notebooks to that study's ``runs/`` folder), one study preset to edit and a
README. Commands run inside it use these before the shipped copies and write ``runs/`` there
(:mod:`grpo_knobs.locations`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from . import __version__
from .locations import NOTEBOOKS, STUDIES, WORKSPACE_FILE

# Notebooks that read the committed records of the repository (results/), which a workspace lacks.
CHECKOUT_ONLY_NOTEBOOKS = ("58_task_room",)
DRIVER_NOTEBOOKS = ("20_screening", "30_select", "40_confirmation", "45_test_eval")


def init_workspace(directory: str | os.PathLike, preset: str = "smoke") -> Path:
    """Write a workspace into ``directory`` (new or empty) with ``studies/<preset>.yaml``; returns its path.

    Nothing is overwritten: a non-empty ``directory`` is refused. The files are written to a
    temporary folder beside it and moved into place at the end, so a failure leaves no half workspace.
    """
    import yaml

    target = Path(directory).expanduser().resolve()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ValueError(f"{directory} exists and is not empty; give `grpo-knobs init` a new or empty folder")
    source = STUDIES / f"{preset}.yaml"
    if not source.is_file():
        known = ", ".join(sorted(p.stem for p in STUDIES.glob("*.yaml")))
        raise ValueError(f"no shipped study preset {preset!r}; choose one of {known} (--preset)")
    study = yaml.safe_load(source.read_text())["name"]
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        staging.chmod(0o755)  # mkdtemp's 0700 is meant for temporary files, not a user's folder
        (staging / "studies").mkdir()
        shutil.copyfile(source, staging / "studies" / source.name)
        (staging / "notebooks").mkdir()
        for path in sorted(NOTEBOOKS.glob("*.ipynb")):
            if path.stem not in CHECKOUT_ONLY_NOTEBOOKS:
                _write_notebook(path, staging / "notebooks" / path.name, preset, study)
        (staging / "README.md").write_text(_readme(preset, study))
        marker = {"written_by": f"grpo-knobs {__version__}", "preset": preset, "study": study}
        (staging / WORKSPACE_FILE).write_text(json.dumps(marker, indent=1) + "\n")
        os.replace(staging, target)  # onto a missing or empty folder
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _write_notebook(source: Path, target: Path, preset: str, study: str) -> None:
    """``source`` without outputs, its parameter defaults pointed at this workspace's preset and runs."""
    import nbformat

    from .study.notebooks import ANALYSIS_NOTEBOOKS, PREREGISTERED_NOTEBOOKS

    nb = nbformat.read(source, as_version=4)
    nb.metadata.pop("papermill", None)
    for cell in nb.cells:
        cell.metadata.pop("papermill", None)
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    defaults: dict[str, str] = {}
    if source.stem in DRIVER_NOTEBOOKS:
        defaults["preset"] = f'"{preset}"  # studies/{preset}.yaml here, another shipped preset, or a plan YAML path'
    if source.stem in ANALYSIS_NOTEBOOKS + PREREGISTERED_NOTEBOOKS:
        defaults["study_dir"] = f'"runs/{study}"  # a study directory (run folders), relative to this workspace'
        defaults["out_dir"] = f'"runs/{study}/figures"  # where figures (PNG, SVG) and tables (CSV, Markdown) go'
    if defaults:
        (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        for name, value in defaults.items():
            cell.source, found = re.subn(rf"^{name} = .*$", f"{name} = {value}", cell.source, flags=re.MULTILINE)
            if found != 1:
                raise ValueError(f"{source}: expected one `{name} = ...` line in the parameters cell, found {found}")
    nbformat.write(nb, target)


def _readme(preset: str, study: str) -> str:
    return f"""# A grpo-knobs workspace

Written by `grpo-knobs init` (grpo-knobs {__version__}). Commands run in this folder, or in a
folder below it, use the preset in `studies/` and the notebooks in `notebooks/` before the
copies shipped with the package, and write studies to `runs/`.

- `studies/{preset}.yaml`: the study to edit (arms, tasks, budgets, seeds, selection rule).
- `notebooks/`: `10_train` (one run; its parameters cell lists every run setting),
  `20`-`45` (the study's phases, on `{preset}`), `50`-`57` (the analysis of `runs/{study}`).

```
grpo-knobs plan {preset}           # check the preset and list its runs
grpo-knobs study {preset}          # run them (complete runs are skipped), then the analysis notebooks
grpo-knobs report runs/{study}     # the study on one HTML page
grpo-knobs train -p lr=1e-5       # one run: RunConfig's defaults but these, into runs/adhoc
jupyter lab notebooks/             # the same, notebook by notebook
```

`grpo-knobs --help` lists every command; `grpo-knobs plan {preset} --param budget=64` tries other
values of the preset's `params:` without editing it.
"""

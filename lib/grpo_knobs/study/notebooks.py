"""The analysis notebooks (50-57) executed through papermill: on a study directory, or the
committed ones (50-58) in place."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from ..provenance import REPO_ROOT

ANALYSIS_NOTEBOOKS = (
    "50_learning_curves",
    "51_confirmation",
    "52_time_to_target",
    "53_group_size",
    "54_reward_audit",
    "55_screening",
    "56_critical_batch",
    "57_categories",
)
# Notebooks about a fixed set of committed records rather than one study directory.
FINDINGS_NOTEBOOKS = ("58_task_room",)


def run_analysis(
    study_dir: str | Path,
    out_dir: str | Path | None = None,
    notebooks: Iterable[str] = ANALYSIS_NOTEBOOKS,
    progress: bool = True,
) -> list[Path]:
    """Execute the analysis notebooks on a study directory through papermill.

    Figures and tables go to ``out_dir`` (default ``<study_dir>/figures``); each executed
    notebook is kept there too, so a reader sees the numbers behind every figure. Targets
    come from the study's ``plan.json``.
    """
    import papermill as pm
    from tqdm.auto import tqdm

    from ..runtime import interrupted, interrupts

    study_dir = Path(study_dir).resolve()
    if not study_dir.is_dir():
        raise FileNotFoundError(f"no study directory at {study_dir}; give the folder a study wrote its runs to")
    out = Path(out_dir).resolve() if out_dir else study_dir / "figures"
    out.mkdir(parents=True, exist_ok=True)
    plan_file = study_dir / "plan.json"
    targets = json.loads(plan_file.read_text()).get("targets", {}) if plan_file.exists() else {}
    written = []
    for name in tqdm(list(notebooks), desc="analysis notebooks", disable=not progress):
        params: dict[str, Any] = {"study_dir": str(study_dir), "out_dir": str(out)}
        if targets and name in ("50_learning_curves", "52_time_to_target"):
            params["targets"] = targets
        if targets and name == "56_critical_batch":
            params["targets"] = {task: values[0] for task, values in targets.items() if values}
        target = out / f"{name}.ipynb"
        try:
            with interrupts():
                pm.execute_notebook(
                    str(REPO_ROOT / "notebooks" / f"{name}.ipynb"),
                    str(target),
                    parameters=params,
                    cwd=str(REPO_ROOT),
                    progress_bar=False,
                    kernel_name="python3",
                )
        except pm.PapermillExecutionError as exc:  # the executed notebook, with its traceback, is kept
            error = " ".join(f"{exc.ename}: {exc.evalue}".split())[:300]
            raise RuntimeError(f"{name} failed: {error} (see {target})") from None
        except Exception:
            if interrupted():  # a Ctrl-C, whatever the kernel client raised on its way out
                raise KeyboardInterrupt("interrupted") from None
            raise
        written.append(target)
    return written


def refresh_committed_notebooks(
    notebooks: Iterable[str] = ANALYSIS_NOTEBOOKS + FINDINGS_NOTEBOOKS, progress: bool = True
) -> list[Path]:
    """Re-execute the committed analysis notebooks in place, on their default records.

    Their parameter defaults read ``results/`` (``results/h200-mini`` for 50-57) and write ``figures/``; no parameters
    are injected, and papermill's run metadata is dropped so a refresh diffs only in outputs.
    Consecutive stream outputs are merged too: how a kernel splits printed text into
    messages depends on flush timing.
    """
    import nbformat
    import papermill as pm
    from nbconvert.preprocessors import CoalesceStreamsPreprocessor
    from tqdm.auto import tqdm

    written = []
    for name in tqdm(list(notebooks), desc="committed notebooks", disable=not progress):
        path = REPO_ROOT / "notebooks" / f"{name}.ipynb"
        pm.execute_notebook(str(path), str(path), cwd=str(REPO_ROOT), progress_bar=False, kernel_name="python3")
        nb = nbformat.read(path, as_version=4)
        nb.metadata.pop("papermill", None)
        for cell in nb.cells:
            cell.metadata.pop("papermill", None)
            cell.metadata.pop("execution", None)
        nb, _ = CoalesceStreamsPreprocessor().preprocess(nb, {})
        nbformat.write(nb, path)
        written.append(path)
    return written


def write_parameters_cell(path: Path = REPO_ROOT / "notebooks" / "10_train.ipynb", check: bool = False) -> bool:
    """Rewrite the ``parameters`` cell of the training notebook from RunConfig.

    Returns True when the cell already matched; with ``check`` nothing is written.
    """
    import json

    from ..config import parameters_cell

    notebook = json.loads(Path(path).read_text())
    cells = [c for c in notebook["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise ValueError(f"{path} must have exactly one cell tagged 'parameters', found {len(cells)}.")
    source = parameters_cell()
    current = "".join(cells[0]["source"])
    if current == source or check:
        return current == source
    cells[0]["source"] = source.splitlines(keepends=True)
    Path(path).write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
    return False

"""Notebooks executed through papermill: the analysis notebooks (50-57) on a study directory, the
committed ones (50-58) in place, and the kernel settings every papermill run here uses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable

from ..locations import NOTEBOOKS, checkout_root, notebook, project_relative, project_root

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
# Run on a study whose plan.json registers an analysis. Not refreshed with the committed notebooks
# until results/seeds20, the records its committed copy reads, exist.
PREREGISTERED_NOTEBOOKS = ("59_preregistered",)


def execute_notebook(source: str | Path, target: str | Path, **kwargs: Any) -> None:
    """``papermill.execute_notebook`` with the kernel manager's CurveZMQ keys.

    The kernel talks to this process over local TCP; with the keys that link is encrypted and
    ipykernel has no reason to warn that it is not. (IPC sockets would also do, but their paths
    under the Jupyter runtime folder can exceed the 107-byte limit of a Unix socket path.)
    """
    import papermill as pm
    import zmq
    from traitlets.config import Config

    settings = {"KernelManager": {"transport_encryption": "auto"}} if zmq.has("curve") else {}
    pm.execute_notebook(str(source), str(target), config=Config(settings), **kwargs)


def run_analysis(
    study_dir: str | Path,
    out_dir: str | Path | None = None,
    notebooks: Iterable[str] | None = None,
    progress: bool = True,
) -> list[Path]:
    """Execute the analysis notebooks on a study directory through papermill.

    Figures and tables go to ``out_dir`` (default ``<study_dir>/figures``); each executed
    notebook is kept there too, so a reader sees the numbers behind every figure. Targets
    come from the study's ``plan.json``. ``notebooks`` defaults to ``ANALYSIS_NOTEBOOKS``, and
    ``PREREGISTERED_NOTEBOOKS`` after them where ``plan.json`` registers an analysis.
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
    recorded = json.loads(plan_file.read_text()) if plan_file.exists() else {}
    targets = recorded.get("targets", {})
    if notebooks is None:
        notebooks = ANALYSIS_NOTEBOOKS + (PREREGISTERED_NOTEBOOKS if recorded.get("preregistration") else ())
    root = project_root()  # the kernel's cwd: paths under it are passed relative to it
    written = []
    for name in tqdm(list(notebooks), desc="analysis notebooks", disable=not progress):
        params: dict[str, Any] = {
            "study_dir": project_relative(study_dir, root),
            "out_dir": project_relative(out, root),
        }
        if targets and name in ("50_learning_curves", "52_time_to_target"):
            params["targets"] = targets
        if targets and name == "56_critical_batch":
            params["targets"] = {task: values[0] for task, values in targets.items() if values}
        target = out / f"{name}.ipynb"
        try:
            with interrupts():
                execute_notebook(
                    notebook(name),  # the workspace's copy where there is one
                    target,
                    parameters=params,
                    cwd=str(root),
                    progress_bar=False,
                    kernel_name="python3",
                )
            _tidy_executed(target, root)
        except pm.PapermillExecutionError as exc:  # the executed notebook, with its traceback, is kept
            error = " ".join(f"{exc.ename}: {exc.evalue}".split())[:300]
            raise RuntimeError(f"{name} failed: {error} (see {target})") from None
        except Exception:
            if interrupted():  # a Ctrl-C, whatever the kernel client raised on its way out
                raise KeyboardInterrupt("interrupted") from None
            raise
        written.append(target)
    return written


def _rewrite_executed(path: Path, edit: Callable[[Any], None]) -> None:
    """Apply ``edit`` to the executed notebook at ``path`` and merge consecutive stream outputs (how a kernel splits
    printed text into messages depends on flush timing), so that executing it again diffs only where its results
    changed."""
    import nbformat
    from nbconvert.preprocessors import CoalesceStreamsPreprocessor

    nb = nbformat.read(path, as_version=4)
    edit(nb)
    nb, _ = CoalesceStreamsPreprocessor().preprocess(nb, {})
    nbformat.write(nb, path)


def _tidy_executed(path: Path, root: Path) -> None:
    """Papermill's record of the notebook's input and output paths made relative to ``root`` where they lie under
    it; stream outputs merged."""

    def relative_paths(nb: Any) -> None:
        record = nb.metadata.get("papermill", {})
        for key in ("input_path", "output_path"):
            if record.get(key):
                record[key] = project_relative(record[key], root)

    _rewrite_executed(path, relative_paths)


def _drop_run_metadata(nb: Any) -> None:
    nb.metadata.pop("papermill", None)
    for cell in nb.cells:
        cell.metadata.pop("papermill", None)
        cell.metadata.pop("execution", None)


def refresh_committed_notebooks(
    notebooks: Iterable[str] = ANALYSIS_NOTEBOOKS + FINDINGS_NOTEBOOKS, progress: bool = True
) -> list[Path]:
    """Re-execute the committed analysis notebooks in place, on their default records.

    Their parameter defaults read ``results/`` (``results/h200-mini`` for 50-57) and write ``figures/``; no parameters
    are injected, and papermill's run metadata is dropped and stream outputs merged so a refresh diffs only in
    outputs.
    """
    from tqdm.auto import tqdm

    root = checkout_root()
    if root is None:
        raise RuntimeError(
            "the committed notebooks and the records they read (results/) are in a checkout of the repository; "
            "an installed package has none to refresh: run `grpo-knobs analyze STUDY_DIR` on a study instead"
        )
    written = []
    for name in tqdm(list(notebooks), desc="committed notebooks", disable=not progress):
        path = NOTEBOOKS / f"{name}.ipynb"
        execute_notebook(path, path, cwd=str(root), progress_bar=False, kernel_name="python3")
        _rewrite_executed(path, _drop_run_metadata)
        written.append(path)
    return written


def write_parameters_cell(path: str | Path | None = None, check: bool = False) -> bool:
    """Rewrite the ``parameters`` cell of the training notebook (default: the workspace's copy where
    there is one, else the shipped one) from RunConfig.

    Returns True when the cell already matched; with ``check`` nothing is written.
    """
    from ..config import parameters_cell

    path = Path(path or notebook("10_train"))
    nb = json.loads(path.read_text())
    cells = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise ValueError(f"{path} must have exactly one cell tagged 'parameters', found {len(cells)}.")
    source = parameters_cell()
    current = "".join(cells[0]["source"])
    if current == source or check:
        return current == source
    cells[0]["source"] = source.splitlines(keepends=True)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return False

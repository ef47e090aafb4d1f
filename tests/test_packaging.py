"""The package as a user installs it: the wheel carries every file the package reads, an install works from
any directory, and `grpo-knobs init` writes a workspace whose preset and notebooks the commands use."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
import yaml
from grpo_knobs import locations
from grpo_knobs.study.notebooks import run_analysis

ROOT = Path(__file__).resolve().parents[1]
SYNTHETIC_STUDY = ROOT / "tests" / "fixtures" / "synthetic_study"


def _cli(*args: str, cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != locations.WORKSPACE_ENV}
    if pythonpath is not None:  # ahead of the checkout's editable install
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        [sys.executable, "-m", "grpo_knobs.cli", *args], cwd=cwd, env=env, capture_output=True, text=True
    )


# ----------------------------------------------------------------------------- the wheel
@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from the tracked files (in a copy, so the checkout gets no build/ folder)."""
    pytest.importorskip("setuptools")
    src = tmp_path_factory.mktemp("src")
    listing = ["git", "ls-files", "lib", "pyproject.toml", "README.md", "LICENSE"]
    tracked = subprocess.run(listing, cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in tracked:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
    )
    (path,) = out.glob("grpo_knobs-*.whl")
    return path


def test_the_wheel_carries_every_file_of_the_package(wheel):
    tracked = subprocess.run(
        ["git", "ls-files", "lib/grpo_knobs"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    in_wheel = {n for n in zipfile.ZipFile(wheel).namelist() if not n.startswith("grpo_knobs-")}
    assert in_wheel == {name.removeprefix("lib/") for name in tracked}
    assert {"grpo_knobs/studies/smoke.yaml", "grpo_knobs/notebooks/10_train.ipynb"} <= in_wheel


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The wheel installed into a folder of its own (its requirements come from this environment)."""
    site = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    return site


def test_an_installed_package_reads_its_own_files_from_any_directory(installed, tmp_path):
    probe = (
        "import grpo_knobs, json\n"
        "from grpo_knobs import data, locations, provenance\n"
        "from grpo_knobs.analysis import load_rollout_benchmark\n"
        "print(json.dumps({'package': grpo_knobs.__file__, 'checkout': str(locations.checkout_root()),\n"
        "    'commit': provenance.git_commit(), 'test_rows': len(data.load_split('gsm8k', 'test')),\n"
        "    'reference': locations.REFERENCE_CSV.is_file(),\n"
        "    'rollout': sorted(load_rollout_benchmark(locations.ROLLOUT_BENCHMARKS / 'rollout-*.json').gpu.unique()),"
        "    'rollout_in': str(locations.ROLLOUT_BENCHMARKS)}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(installed)}
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert Path(found["package"]).is_relative_to(installed)
    # no checkout, so no git commit of some enclosing repository; the shipped GSM8K passes its manifest's hash
    assert found == found | {"checkout": "None", "commit": None, "test_rows": 1319, "reference": True}
    # the critical-batch notebook's throughput panel reads the shipped rollout benchmarks
    assert found["rollout"] == ["h100-80gb-hbm3", "h200"] and Path(found["rollout_in"]).is_relative_to(installed)

    plan = _cli("plan", "smoke", "--json", cwd=tmp_path, pythonpath=installed)
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)[0]["config"]["output_dir"] == str(tmp_path.resolve() / "runs" / "smoke")
    assert "countdown-2x10" in _cli("data", "show", cwd=tmp_path, pythonpath=installed).stdout
    committed = _cli("analyze", "--committed", cwd=tmp_path, pythonpath=installed)
    assert committed.returncode == 2 and "checkout" in committed.stderr and len(committed.stderr.splitlines()) == 1


# ----------------------------------------------------------------------------- grpo-knobs init
def test_init_writes_a_workspace_and_never_overwrites_one(tmp_path):
    done = _cli("init", "ws", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    ws = tmp_path / "ws"
    assert json.loads((ws / locations.WORKSPACE_FILE).read_text())["preset"] == "smoke"
    assert (ws / "studies" / "smoke.yaml").read_text() == (locations.STUDIES / "smoke.yaml").read_text()
    assert "grpo-knobs study smoke" in (ws / "README.md").read_text()
    shipped = sorted(p.name for p in locations.NOTEBOOKS.glob("*.ipynb"))
    assert sorted(p.name for p in (ws / "notebooks").glob("*.ipynb")) == [
        n for n in shipped if n != "58_task_room.ipynb"
    ]
    params = {}
    for path in (ws / "notebooks").glob("*.ipynb"):
        nb = nbformat.read(path, as_version=4)
        assert not any(c.get("outputs") for c in nb.cells), path.name  # the user's study fills them
        params[path.stem] = "".join(c.source for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    assert 'study_dir = "runs/smoke"' in params["50_learning_curves"]
    assert 'out_dir = "runs/smoke/figures"' in params["56_critical_batch"]
    assert 'preset = "smoke"' in params["20_screening"]

    again = _cli("init", "ws", cwd=tmp_path)
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "not empty" in again.stderr
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert _cli("init", str(mine), cwd=tmp_path).returncode == 2
    assert [p.name for p in mine.iterdir()] == ["notes.txt"] and (mine / "notes.txt").read_text() == "keep"
    unknown = _cli("init", "other", "--preset", "nope", cwd=tmp_path)
    assert unknown.returncode == 2 and "h200-mini, paper, seeds20, smoke" in unknown.stderr
    assert not (tmp_path / "other").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["mine", "ws"]


def test_commands_in_a_workspace_use_its_preset_and_runs_folder(tmp_path):
    assert _cli("init", "ws", "--preset", "h200-mini", cwd=tmp_path).returncode == 0
    ws = tmp_path / "ws"
    preset = ws / "studies" / "h200-mini.yaml"
    spec = yaml.safe_load(preset.read_text())
    spec["screening"]["seeds"] = [0, 1]  # the user's change
    preset.write_text(yaml.safe_dump(spec))
    # from a folder inside the workspace, as Jupyter runs the notebooks
    plan = _cli("plan", "h200-mini", "--json", cwd=ws / "notebooks")
    assert plan.returncode == 0, plan.stderr
    planned = json.loads(plan.stdout)
    assert {r["config"]["output_dir"] for r in planned if "config" in r} == {str(ws.resolve() / "runs" / "h200-mini")}
    assert {r["seed"] for r in planned if r["phase"] == "screening"} == {0, 1}
    # a shipped preset the workspace does not copy is still found; outside the workspace the shipped one is used
    assert _cli("plan", "smoke", cwd=ws).returncode == 0
    outside = json.loads(_cli("plan", "h200-mini", "--json", cwd=tmp_path).stdout)
    assert {r["seed"] for r in outside if r["phase"] == "screening"} == {0}


def test_a_named_workspace_must_be_one(tmp_path, monkeypatch):
    monkeypatch.setenv(locations.WORKSPACE_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="is not a workspace"):
        locations.find_workspace()


def test_analysis_in_a_workspace_runs_its_notebooks_without_kernel_warnings(tmp_path, monkeypatch, capfd):
    """`grpo-knobs analyze` (run_analysis) executes the workspace's copy of a notebook, and the kernel it
    starts prints no warning a user cannot act on."""
    assert _cli("init", "ws", cwd=tmp_path).returncode == 0
    copy = tmp_path / "ws" / "notebooks" / "51_confirmation.ipynb"
    nb = nbformat.read(copy, as_version=4)
    nb.cells.insert(1, nbformat.v4.new_code_cell('print("the workspace copy ran")'))
    nbformat.write(nb, copy)
    monkeypatch.chdir(tmp_path / "ws" / "notebooks")
    capfd.readouterr()
    (written,) = run_analysis(SYNTHETIC_STUDY, tmp_path / "figures", notebooks=["51_confirmation"], progress=False)
    executed = nbformat.read(written, as_version=4)
    assert any("the workspace copy ran" in o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    stderr = capfd.readouterr().err
    assert "without encryption" not in stderr and "WARNING" not in stderr, stderr


def test_analysis_names_folders_under_the_project_relative_to_it(tmp_path, monkeypatch):
    """Executed notebooks are committed and shared: a study and figures inside the project are named by their
    paths relative to it (the kernel's cwd), not by this machine's absolute folders."""
    assert _cli("init", "ws", cwd=tmp_path).returncode == 0
    ws = tmp_path / "ws"
    shutil.copytree(SYNTHETIC_STUDY, ws / "results" / "study")
    monkeypatch.chdir(ws)
    (written,) = run_analysis("results/study", "figures/study", notebooks=["51_confirmation"], progress=False)
    assert written == ws / "figures" / "study" / "51_confirmation.ipynb"
    executed = nbformat.read(written, as_version=4)
    record = executed.metadata["papermill"]
    assert record["parameters"] == {"study_dir": "results/study", "out_dir": "figures/study"}
    assert record["input_path"] == "notebooks/51_confirmation.ipynb"  # the workspace's copy
    assert record["output_path"] == "figures/study/51_confirmation.ipynb"
    assert str(tmp_path) not in json.dumps(executed)
    assert (ws / "figures" / "study" / "confirmation_runs_countdown.csv").is_file()  # written where out_dir names


def test_ray_tasks_use_the_drivers_workspace(tmp_path, monkeypatch):
    """A Ray task starts in another folder: the driver passes its workspace, where the task finds the notebook."""
    from grpo_knobs.study.scheduling import _runtime_env
    from grpo_knobs.workspace import init_workspace

    ws = init_workspace(tmp_path / "ws")
    monkeypatch.delenv(locations.WORKSPACE_ENV, raising=False)
    monkeypatch.chdir(ws / "notebooks")
    passed = _runtime_env()["env_vars"][locations.WORKSPACE_ENV]
    assert passed == str(ws)
    monkeypatch.chdir(tmp_path)
    assert locations.notebook("10_train") == locations.NOTEBOOKS / "10_train.ipynb"
    monkeypatch.setenv(locations.WORKSPACE_ENV, passed)
    assert locations.notebook("10_train") == ws / "notebooks" / "10_train.ipynb"

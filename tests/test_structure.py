"""The code's own shape: one declaration of a run, and no import cycles in the library."""

import ast
import dataclasses
import json
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from grpo_knobs.config import RunConfig, field_types
from grpo_knobs.study.notebooks import write_parameters_cell

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "lib" / "grpo_knobs"


def _parameters_cell() -> str:
    nb = json.loads((LIB / "notebooks" / "10_train.ipynb").read_text())
    (cell,) = [c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", [])]
    return "".join(cell["source"])


def test_the_parameters_cell_is_runconfig():
    """Names, defaults and types of the notebook's typed block equal RunConfig's, field for field."""
    tree = ast.parse(_parameters_cell())
    assigned = [n for n in tree.body if isinstance(n, ast.AnnAssign)]
    names = [n.target.id for n in assigned]
    assert names == RunConfig.field_names(), "run `grpo-knobs notebook-params` after changing RunConfig"
    namespace: dict = {}
    exec(compile(tree, "parameters", "exec"), namespace)  # noqa: S102 - the repository's own notebook cell
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    assert {k: namespace[k] for k in names} == defaults
    declared = field_types()
    for node in assigned:
        annotation = eval(ast.unparse(node.annotation), {"Optional": typing.Optional}, {})  # noqa: S307
        assert annotation == declared[node.target.id], node.target.id
    assert write_parameters_cell(check=True)


def test_papermill_reads_every_parameter_with_its_type_and_default():
    """papermill's own parser (what --help-notebook prints, and what it checks injected names against) sees
    every RunConfig field, in order, with its type and default."""
    out = subprocess.run(
        [sys.executable, "-m", "papermill", "--help-notebook", str(LIB / "notebooks" / "10_train.ipynb")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "Unable to parse" not in out.stdout + out.stderr
    listed = re.findall(r"^  (\w+): (\S+) \(default (.*?)\)(?:\s|$)", out.stdout, flags=re.MULTILINE)
    assert [name for name, _, _ in listed] == RunConfig.field_names()
    declared = field_types()
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    for name, type_name, default in listed:
        assert eval(type_name, {"Optional": typing.Optional}, {}) == declared[name], name  # noqa: S307
        value = ast.literal_eval(default)
        assert (type(value), value) == (type(defaults[name]), defaults[name]), name


def test_the_notebook_builds_its_config_from_the_parameters_alone():
    nb = json.loads((LIB / "notebooks" / "10_train.ipynb").read_text())
    sources = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    assert "cfg = RunConfig.from_parameters(dict(globals()))" in sources[1]


def _imports(path: Path, package: str, modules: set[str]) -> tuple[set[str], set[str]]:
    """What ``path`` imports anywhere (top level or inside functions), among ``modules``: the modules it
    names, and the packages it reads a name from (``from pkg import NAME``, NAME not a submodule)."""
    named: set[str] = set()
    read_from: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            named |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for alias in node.names:
                if f"{mod}.{alias.name}" in modules:  # ``from . import data``, ``from pkg.sub import mod``
                    named.add(f"{mod}.{alias.name}")
                elif mod in modules:
                    (named if mod != package else read_from).add(mod)
    return named, read_from


def _ancestors(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _module_graph(lib: Path = LIB) -> dict[str, set[str]]:
    """Import edges between the modules of the package at ``lib``, as Python runs them.

    Importing ``a.b.c`` first runs ``a/__init__.py`` and ``a/b/__init__.py``: an import of a
    submodule is also an edge to every package above it, except the packages above the importer
    (already initialising when it runs) unless it reads a name from one of them. A package's
    ``__init__.py`` that imports its own submodules has edges to them too, so a cycle through an
    ``__init__.py`` shows.
    """
    modules = {}
    for path in lib.rglob("*.py"):
        parts = path.relative_to(lib.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = name if parts[-1] == "__init__" else ".".join(parts[:-1])
        modules[name] = (path, package)
    graph = {}
    for name, (path, package) in modules.items():
        named, read_from = _imports(path, package, set(modules))
        above = _ancestors(name) | ({name} if path.name == "__init__.py" else set())
        implied = {a for target in named for a in _ancestors(target) if a in modules} - above
        graph[name] = (named | implied | read_from) - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path (first node repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return stack[stack.index(dep) :] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycles_in_the_library():
    graph = _module_graph()
    assert {"grpo_knobs.trainer", "grpo_knobs.runtime", "grpo_knobs.evaluation"} <= set(graph)
    assert "grpo_knobs.evaluation" in graph["grpo_knobs.trainer"]  # the walk sees real edges
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_cycle_check_finds_a_cycle_through_a_function_level_import():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root / "pkg"


@pytest.mark.parametrize(
    "plots",
    [
        "from pkg.analysis import SIGNALS\n",  # a name read from the package's __init__
        "from pkg.analysis.curves import SIGNALS\n",  # a submodule, which runs the package's __init__ first
        "import pkg.analysis.curves\n",
    ],
)
def test_the_cycle_check_finds_a_cycle_through_a_package_init(tmp_path, plots):
    """The shape the analysis package once had: __init__ -> paths -> (in a function) plots -> the package."""
    lib = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/analysis/__init__.py": "from pkg.analysis.curves import SIGNALS\nfrom .paths import setup\n",
            "pkg/analysis/curves.py": "from pkg.analysis.ordering import order\nSIGNALS = {}\n",
            "pkg/analysis/ordering.py": "def order(): ...\n",
            "pkg/analysis/paths.py": "def setup():\n    from pkg import plots\n",
            "pkg/plots.py": plots,
        },
    )
    cycle = find_cycle(_module_graph(lib))
    assert cycle is not None and {"pkg.analysis", "pkg.analysis.paths", "pkg.plots"} <= set(cycle)


def test_imports_between_a_packages_own_modules_are_no_cycle(tmp_path):
    lib = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/analysis/__init__.py": "from pkg.analysis.curves import SIGNALS\nfrom .ordering import order\n",
            "pkg/analysis/curves.py": "from pkg.analysis.ordering import order\nfrom . import ordering\nSIGNALS = 1\n",
            "pkg/analysis/ordering.py": "from pkg import stats\ndef order(): ...\n",
            "pkg/stats.py": "",
            "pkg/plots.py": "from pkg.analysis.curves import SIGNALS\n",
        },
    )
    graph = _module_graph(lib)
    assert graph["pkg.plots"] == {"pkg.analysis", "pkg.analysis.curves"}
    assert graph["pkg.analysis"] == {"pkg.analysis.curves", "pkg.analysis.ordering"}
    assert find_cycle(graph) is None


def test_planning_a_study_imports_no_torch():
    """`grpo-knobs plan` and a study's driver start without torch (about 1.5 s of imports); runs import it."""
    import subprocess
    import sys

    probe = "import sys, grpo_knobs.cli, grpo_knobs.study; print(sorted({'torch', 'numpy'} & set(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert proc.stdout.split() == ["['numpy']"]  # numpy: the batch plan's arithmetic

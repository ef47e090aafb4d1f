"""The code's own shape: one declaration of a run, and no import cycles in the library."""

import ast
import dataclasses
import json
from pathlib import Path

from grpo_knobs.config import RunConfig, field_types
from grpo_knobs.study.notebooks import write_parameters_cell

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "lib" / "grpo_knobs"


def _parameters_cell() -> str:
    nb = json.loads((ROOT / "notebooks" / "10_train.ipynb").read_text())
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
        assert eval(ast.unparse(node.annotation), {}, {}) == declared[node.target.id], node.target.id  # noqa: S307
    assert write_parameters_cell(check=True)


def test_the_notebook_builds_its_config_from_the_parameters_alone():
    nb = json.loads((ROOT / "notebooks" / "10_train.ipynb").read_text())
    sources = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    assert "cfg = RunConfig.from_parameters(dict(globals()))" in sources[1]


def _imports(path: Path, package: str) -> set[str]:
    """Modules of ``grpo_knobs`` imported anywhere in ``path`` (top level or inside functions)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("grpo_knobs")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.startswith("grpo_knobs"):
                # ``from . import data`` names a module; ``from .x import y`` names x.
                out |= {f"{mod}.{a.name}" for a in node.names} | {mod}
    return out


def _module_graph() -> dict[str, set[str]]:
    modules = {}
    for path in LIB.rglob("*.py"):
        parts = path.relative_to(LIB.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = name if parts[-1] == "__init__" else ".".join(parts[:-1])
        modules[name] = (path, package)
    graph = {}
    for name, (path, package) in modules.items():
        # A package's __init__ re-exports its own submodules; importing the package is not a cycle edge.
        deps = {d for d in _imports(path, package) if d in modules and d != name}
        if path.name == "__init__.py":
            deps = {d for d in deps if not d.startswith(name + ".")}
        graph[name] = {d for d in deps if not name.startswith(d + ".")}
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


def test_planning_a_study_imports_no_torch():
    """`grpo-knobs plan` and a study's driver start without torch (about 1.5 s of imports); runs import it."""
    import subprocess
    import sys

    probe = "import sys, grpo_knobs.cli, grpo_knobs.study; print(sorted({'torch', 'numpy'} & set(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert proc.stdout.split() == ["['numpy']"]  # numpy: the batch plan's arithmetic

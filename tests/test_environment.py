"""What a user reads first: environment.yml and pyproject.toml agree, CI runs the README's test
command, and the links of the docs resolve."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_conda_pip_section_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = set(project["dependencies"]) | set(project["optional-dependencies"]["test"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert set(pip) - {"-e ."} == wanted
    assert "-e ." in pip
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python"))
    assert python.replace("python", "") == project["requires-python"]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make study" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci
    # A fresh clone with nothing beside it: what a user who clones the repository has.
    assert "git clone" in ci and "test ! -e ../shared" in ci


def test_ci_uses_the_installed_wheel_from_an_empty_folder():
    ci = (ROOT / ".ci" / "run").read_text()
    # torch pinned before the wheel, so that installing its requirements pulls no CUDA build
    assert ci.index("install -q torch==2.13.0") < ci.index("pip wheel") < ci.index('install -q "$work"/dist/')
    for command in ("grpo-knobs init ws", "grpo-knobs plan smoke", "grpo-knobs train", "$pip check"):
        assert ci.index('cd "$work/empty"') < ci.index(command), command


def test_the_test_command_lints_and_checks_formatting():
    make = (ROOT / "Makefile").read_text()
    target = make[make.index("\ntest: setup") :].split("\n\n")[0]
    assert "ruff check ." in target and "ruff format --check ." in target


def _heading_anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_of_the_docs_resolves():
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and anchor not in {
                _heading_anchor(h) for h in re.findall(r"^#+ (.*)$", linked.read_text(), re.M)
            }:
                broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == []


def test_the_product_points_at_nothing_beside_the_checkout():
    """A clone stands alone: the library (its notebooks and data included), the docs, the benchmarks, the
    executed analysis notebooks under figures/ and the build files never send a reader or a path to a folder
    beside the checkout, which a user does not have."""
    files = [ROOT / name for name in ("README.md", "Makefile", "pyproject.toml", "environment.yml")]
    files += [*(ROOT / "lib").rglob("*"), *(ROOT / "docs").rglob("*"), *(ROOT / "benchmarks").glob("*.py")]
    files += (ROOT / "figures").rglob("*.ipynb")
    pointing = [str(f.relative_to(ROOT)) for f in files if f.is_file() and b"../shared" in f.read_bytes()]
    assert pointing == []

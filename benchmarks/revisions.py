"""Code revisions side by side: a benchmark arm runs a folder's ``lib/`` (``code=DIR``) or a git revision's
(``rev=GITREV``, exported with ``git archive`` under the benchmark's output folder), in a process of its own
whose PYTHONPATH puts that ``lib/`` first. An arm with neither runs the library this process imports.

The library ships its presets, manifests and data inside ``lib/grpo_knobs``; revisions from before that
read ``data_manifests/`` and ``data/`` beside their ``lib/``, so a ``code=DIR`` of such a revision must hold
them too (``git archive REV lib data_manifests data``), and ``rev=`` exports them where the revision has them.
"""

from __future__ import annotations

import importlib.util
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout holding these benchmarks
BESIDE_LIB = ("data", "data_manifests")  # what older revisions read next to their lib/


@dataclass(frozen=True)
class Code:
    """The library an arm runs: ``lib`` first on its PYTHONPATH, or None for this process's own."""

    label: str  # how tables name it: "this checkout", "code=DIR", "rev=REV (commit)"
    lib: Path | None = None
    commit: str | None = None  # the revision's commit, when it came from git

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of the arm's process."""
        env = dict(os.environ if base is None else base)
        if self.lib is None:
            return env
        rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([str(self.lib), str(ROOT), *rest])  # ROOT: the benchmarks package
        # The run records the commit of the checkout around its lib/; an exported revision sits inside this
        # checkout, whose commit would be recorded instead. git stops at the revision's own folder.
        env["GIT_CEILING_DIRECTORIES"] = str(self.lib.parent.parent)
        return env

    def package_dir(self) -> Path:
        """The grpo_knobs folder the arm imports."""
        if self.lib is not None:
            return self.lib / "grpo_knobs"
        spec = importlib.util.find_spec("grpo_knobs")  # found, not imported: importing it sets variables
        return Path(spec.origin).resolve().parent


def parse_arm(text: str) -> tuple[str, dict[str, str]]:
    """``name:key=value,key=value`` -> (name, settings)."""
    name, _, rest = text.partition(":")
    pairs = [p for p in rest.split(",") if p]
    bad = [p for p in pairs if "=" not in p]
    if not name or bad:
        raise SystemExit(f"--arm {text!r}: expected NAME:key=value,key=value")
    return name, dict(p.split("=", 1) for p in pairs)


def code_for_arm(name: str, settings: dict[str, str], out: Path) -> Code:
    """Take ``code`` / ``rev`` out of an arm's settings and return the library it runs."""
    code, rev = settings.pop("code", None), settings.pop("rev", None)
    out = out.resolve()  # the arm's process may start elsewhere; git's ceiling must be absolute
    if code and rev:
        raise SystemExit(f"--arm {name}: give code=DIR or rev=GITREV, not both")
    if rev:
        lib, commit = export_rev(name, rev, out)
        return Code(f"rev={rev} ({commit[:12]})", lib, commit)
    if code:
        folder = Path(code).expanduser().resolve()
        if not (folder / "lib" / "grpo_knobs" / "__init__.py").is_file():
            raise SystemExit(
                f"--arm {name}: code={code} holds no lib/grpo_knobs; code=DIR takes a folder holding a revision's "
                "lib/ (e.g. made by `git archive REV lib | tar -x -C DIR`)"
            )
        return Code(f"code={code}", folder / "lib")
    return Code("this checkout")


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True)


def export_rev(name: str, rev: str, out: Path) -> tuple[Path, str]:
    """``git archive REV lib data data_manifests`` into ``out/code/<commit>/`` (kept for reuse); returns
    (its lib, commit)."""

    def fail(reason: str) -> SystemExit:
        return SystemExit(
            f"--arm {name}: rev={rev}: {reason}; pass code=DIR instead, a folder holding that revision's lib/"
        )

    try:
        found = _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except FileNotFoundError:
        raise fail("git is not installed here") from None
    if found.returncode != 0:
        reason = found.stderr.decode().strip().splitlines()[:1] or ["no such revision in this checkout"]
        raise fail(reason[0])
    commit = found.stdout.decode().strip()
    folder = out / "code" / commit[:12]
    if (folder / "lib" / "grpo_knobs").is_dir():
        return folder / "lib", commit
    present = _git("ls-tree", "--name-only", commit, "--", "lib", *BESIDE_LIB).stdout.decode().split()
    if "lib" not in present:
        raise fail("that revision has no lib/")
    archive = _git("archive", "--format=tar", commit, *present)
    if archive.returncode != 0:
        raise fail(" ".join(archive.stderr.decode().split()) or "git archive failed")
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{commit[:12]}-", dir=folder.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would hide the export from other users of the output folder
    try:
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(tmp, filter="data")
        if not (tmp / "lib" / "grpo_knobs").is_dir():
            raise fail("that revision has no lib/grpo_knobs")
        os.replace(tmp, folder)  # whole or not at all
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder / "lib", commit

"""The CLI's exit conventions that no single command owns."""

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

from grpo_knobs import cli

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "results" / "h200-mini"


def test_a_closed_stdout_ends_the_command_quietly():
    """``grpo-knobs compare-runs A B | head -1``: the reader leaves before the rest is written."""
    read, write = os.pipe()
    os.close(read)  # nobody reads: the first write fails with EPIPE
    a, b = (RUNS / f"confirmation-countdown-2x10-batch-256-s{seed}" for seed in (1, 2))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib")}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "grpo_knobs.cli", "compare-runs", str(a), str(b)],
            stdout=write,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
            timeout=300,
        )
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (141, "")  # 128 + SIGPIPE, as a shell reports `yes | head -1`


def test_a_broken_pipe_that_is_not_stdout_is_an_error(capsys):
    """A command's own pipe (a worker, a server) breaking is a failure, reported as one."""

    def command(_):
        raise BrokenPipeError(32, "Broken pipe")

    args = cli.build_parser().parse_args(
        ["knobs", *("--rollout-batch-size", "1", "--n-samples-per-prompt", "1", "--global-batch-size", "1")]
    )
    args.func = command
    assert cli._run(args, debug=False) == 2
    assert capsys.readouterr().err == "grpo-knobs knobs: error: [Errno 32] Broken pipe\n"


def _python(code: str) -> str:
    """What ``code`` prints in a fresh interpreter on the checkout's library (imports are part of what is tested)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib"), "COLUMNS": "100"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _help(*command: str) -> str:
    """What ``grpo-knobs COMMAND --help`` prints."""
    return _python(f"from grpo_knobs import cli\ncli.build_parser().parse_args({list(command)!r} + ['--help'])")


def test_train_help_lists_every_run_parameter_with_its_default():
    """``grpo-knobs train --help`` is where a user finds the -p keys: every RunConfig field, grouped as in the
    notebook's parameters cell, with the default as it is typed after ``-p KEY=``."""
    from grpo_knobs.config import SECTIONS, RunConfig

    text = _help("train")
    for f in dataclasses.fields(RunConfig):
        default = str(f.default).lower() if f.default is None or isinstance(f.default, bool) else str(f.default)
        assert f"\n    {f.name} [{default}]\n" in text, f.name
    assert all(f"\n  {title}\n" in text for title in SECTIONS.values())
    assert "    task [countdown-2x10]\n        Task variant" in text
    assert _help("prepare").endswith(text[text.index("run parameters (") :])


def test_a_command_help_opens_with_its_line_in_the_command_list():
    overview = _help()
    assert "a first session:\n  grpo-knobs knobs --rollout-batch-size 64" in overview
    for command in ("knobs", "compare-runs", "study"):
        listed = " ".join(re.search(rf"\n    {command} +(.*?)(?=\n    \S|\n\n)", overview, re.S).group(1).split())
        opening = " ".join(_help(command).split("\n\n")[1].split())
        assert opening == listed, command


def test_the_command_list_imports_no_run_configuration():
    """The parser is built on every command, so it leaves the heavy imports (numpy through the config) to
    the commands and to the help texts that need them."""
    code = (
        "import sys\nfrom grpo_knobs import cli\ncli.build_parser().format_help()\n"
        "print(sorted(m for m in ('grpo_knobs.config', 'numpy', 'torch') if m in sys.modules))"
    )
    assert _python(code).strip() == "[]"


def test_the_preset_help_names_every_shipped_preset():
    from grpo_knobs.locations import STUDIES

    shipped = sorted(path.stem for path in STUDIES.glob("*.yaml"))
    assert f"the shipped ones: {', '.join(shipped)};" in cli.PRESET_HELP

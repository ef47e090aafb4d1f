"""The CLI's exit conventions that no single command owns."""

import os
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

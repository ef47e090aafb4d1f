"""The worker process of ``run_study(jobs > 1)``: one unit in, its JobResult out."""

from __future__ import annotations

import dataclasses
import json
import sys

from .units import _execute_unit


def _worker_main(threads: int) -> None:
    """``python -m grpo_knobs.study --worker N``: run the unit on stdin, print its JobResult as JSON."""
    try:
        import torch

        torch.set_num_threads(threads)
    except ImportError:
        pass
    unit = json.loads(sys.stdin.read())
    result = _execute_unit(unit)
    print(json.dumps(dataclasses.asdict(result)), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _worker_main(int(sys.argv[2]))
    else:
        sys.exit("usage: python -m grpo_knobs.study --worker THREADS  (internal; use `grpo-knobs study`)")

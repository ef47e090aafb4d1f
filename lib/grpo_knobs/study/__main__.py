"""The worker process of ``run_study(jobs > 1)``: one unit in, its JobResult out."""

from __future__ import annotations

import dataclasses
import json
import sys

from ..runtime import interrupts
from .units import INTERRUPTED_EXIT, JobResult, _execute_unit, unit_id


def _worker_main(threads: int) -> int:
    """``python -m grpo_knobs.study --worker N``: run the unit on stdin, print its JobResult as JSON.

    An interrupt (the study passes a Ctrl-C on as SIGINT; SIGTERM when the study dies) ends the run
    recorded as interrupted; the worker then reports it and exits with ``INTERRUPTED_EXIT``.
    """
    try:
        import torch

        torch.set_num_threads(threads)
    except ImportError:
        pass
    unit = json.loads(sys.stdin.read())
    try:
        with interrupts(keep_ignored=False):  # the study passes a Ctrl-C on as SIGINT, on purpose
            result = _execute_unit(unit)
    except KeyboardInterrupt:
        print(json.dumps(dataclasses.asdict(JobResult(*unit_id(unit), "interrupted"))), flush=True)
        return INTERRUPTED_EXIT
    print(json.dumps(dataclasses.asdict(result)), flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        sys.exit(_worker_main(int(sys.argv[2])))
    else:
        sys.exit("usage: python -m grpo_knobs.study --worker THREADS  (internal; use `grpo-knobs study`)")

"""Where a run's ``init`` phase goes: the batch-256 recipe's ``Trainer.setup()`` in this (fresh) process,
under cProfile, with the seconds ``PhaseClock`` charged to ``init`` beside the profile.

``init`` is model, data and engine set-up, and the imports those pull in on first use; the profile's
cumulative list names which. Profiler overhead is included, so read its shares, not its seconds.

    python -m benchmarks.init_profile --out runs/initprof
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="output_dir of the (never trained) run")
    ap.add_argument("--model", default=None, help="model name (default: the recipe's)")
    ap.add_argument("--top", type=int, default=45, help="functions listed by cumulative time")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    import torch  # noqa: F401  (timed: the first import of torch in this process)

    torch_s = time.perf_counter() - start
    from grpo_knobs.config import RunConfig
    from grpo_knobs.runtime import sync_cuda
    from grpo_knobs.trainer import Trainer

    from benchmarks.recipe import RECIPE

    trainer_s = time.perf_counter() - start - torch_s
    extra = {"model": args.model} if args.model else {}
    cfg = RunConfig(**RECIPE, **extra, output_dir=str(args.out), run_id="init-profile", seed=1)
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    trainer = Trainer(cfg, progress=False)
    trainer.setup()
    sync_cuda()
    profile.disable()
    setup_s = time.perf_counter() - start
    init_s = trainer.clock.seconds["init"]
    print(
        f"import torch {torch_s:.2f} s, import the trainer {trainer_s:.2f} s, set-up {setup_s:.2f} s "
        f"(init phase {init_s:.2f} s)"
    )
    pstats.Stats(profile).sort_stats("cumulative").print_stats(args.top)
    return init_s


if __name__ == "__main__":
    main()

"""Test-session set-up that must happen before any test module imports its libraries."""

import os
import sys
from pathlib import Path

import torch

# SGLang's argument parser and API types (tests/test_sglang.py) lie beside the environment, in
# <environment>/sglang-api (`make setup`): SGLang pins its own torch and transformers, so their
# metadata stays out of the environment that `pip check` checks. Appended: the environment wins.
SGLANG_API = Path(sys.prefix) / "sglang-api"
if SGLANG_API.is_dir():
    sys.path.append(str(SGLANG_API))

# The fused decode kernels (grpo_knobs.rollout.kernels) run in Triton's interpreter without a
# GPU. Triton reads this when it is first imported, and transformers imports it while loading
# a model, so it is set here, ahead of every import.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

"""Test-session set-up that must happen before any test module imports its libraries."""

import os

import torch

# The fused decode kernels (grpo_knobs.rollout.kernels) run in Triton's interpreter without a
# GPU. Triton reads this when it is first imported, and transformers imports it while loading
# a model, so it is set here, ahead of every import.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

"""grpo-knobs: a reproducible study of GRPO's four batch knobs."""

from .caches import use_compile_caches

__version__ = "0.1.0"

# Before anything compiles: Triton's and Inductor's kernels are cached beside the models (caches.py).
use_compile_caches()

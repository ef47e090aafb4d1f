"""grpo-knobs: a reproducible study of GRPO's four batch knobs."""

__version__ = "0.1.0"

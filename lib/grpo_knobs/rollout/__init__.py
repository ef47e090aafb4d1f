"""Rollout engines: one interface (base.py), transformers eager and fast paths (hf.py), SGLang (sglang.py)."""

from .base import Generation, RolloutEngine, cut_at_stop, repeat_prompts

ENGINES = ("hf", "hf-eager", "hf-fast", "sglang")


def make_engine(name: str, model, tokenizer, **kw) -> RolloutEngine:
    """Build an engine by name: "hf" (fast path where supported), "hf-eager", "hf-fast", "sglang".

    SGLang loads weights from disk: it takes `model_path` (default: the folder `model` was loaded from),
    and `device` is the trainer's, which the server avoids where another GPU is visible.
    """
    if name in ("hf", "hf-eager", "hf-fast"):
        from .hf import HFEngine

        fast = kw.pop("fast", "auto")
        if name != "hf":  # the name decides
            fast = name == "hf-fast"
        return HFEngine(model, tokenizer, fast=fast, **kw)
    if name == "sglang":
        from .sglang import SGLangEngine

        trainer_device = kw.pop("device", None)
        model_path = kw.pop("model_path", None) or getattr(model, "name_or_path", None)
        return SGLangEngine(model_path, tokenizer=tokenizer, trainer_device=trainer_device, **kw)
    raise ValueError(f"unknown rollout engine {name!r}; choose one of {', '.join(ENGINES)}")


__all__ = ["ENGINES", "Generation", "RolloutEngine", "cut_at_stop", "make_engine", "repeat_prompts"]

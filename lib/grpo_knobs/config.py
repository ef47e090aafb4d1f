"""RunConfig: every parameter of one training run, typed, documented and validated.

The same fields are the papermill parameters of ``notebooks/10_train.ipynb`` and the keys
of ``grpo-knobs train --config run.yaml`` / ``-p key=value``, so the notebook and the
command run exactly the same code path.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .knobs import BatchPlan

LOSS_AGGREGATIONS = ("sequence-mean", "token-mean")
ENGINES = ("hf", "sglang")
PHASES = ("adhoc", "screening", "lr-followup", "confirmation", "pilot")
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass
class RunConfig:
    # --- what is trained, on what
    task: str = field(default="countdown-2x10", metadata={"help": "Task variant (grpo_knobs.data.TASKS)."})
    model: str = field(default="smollm2-135m-instruct", metadata={"help": "Registry name, hub id or local path."})
    # --- the four batch knobs (P x G = B x S exactly)
    rollout_batch_size: int = field(default=16, metadata={"help": "P: prompts drawn per collection."})
    n_samples_per_prompt: int = field(default=8, metadata={"help": "G: responses per prompt (group size)."})
    global_batch_size: int = field(default=128, metadata={"help": "B: responses per optimizer update."})
    num_steps_per_rollout: int | None = field(default=None, metadata={"help": "S: updates per collection; derived when None."})
    # --- optimisation
    lr: float = field(default=3e-6, metadata={"help": "Constant AdamW learning rate."})
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    weight_decay: float = 0.1
    grad_clip: float = field(default=1.0, metadata={"help": "Global gradient-norm clip."})
    clip_low: float = field(default=0.2, metadata={"help": "PPO ratio clip below: 1 - clip_low."})
    clip_high: float = field(default=0.28, metadata={"help": "PPO ratio clip above: 1 + clip_high."})
    std_normalize_advantages: bool = field(default=True, metadata={"help": "Divide by the group's sample std (False: Dr. GRPO)."})
    loss_aggregation: str = field(default="sequence-mean", metadata={"help": "sequence-mean or token-mean."})
    kl_coef: float = field(default=0.0, metadata={"help": "k3 KL penalty to the initial policy (0 = off)."})
    reuse_on_policy_logprobs: bool = field(default=False, metadata={
        "help": "With one update per collection (S=1) the old policy is the current one: take the old log-probs "
                "from the update's own forward pass, detached, instead of a separate scoring pass. Same loss "
                "and gradients, one forward pass fewer; no effect when S > 1. Off by default: the study's "
                "trainer time includes old-policy scoring in every arm, and saving it only where S=1 would "
                "tilt the job-time comparison between knob shapes."})
    # --- budget and evaluation
    seed: int = field(default=1, metadata={"help": "Fixes data draws, sampling and initialisation of a run."})
    response_budget: int = field(default=1024, metadata={"help": "Training responses in the run (whole collections)."})
    eval_every_responses: int = field(default=512, metadata={"help": "Evaluate every N responses (whole collections)."})
    eval_problems: int | None = field(default=None, metadata={"help": "Validation problems evaluated; None = all."})
    max_new_tokens: int = field(default=256, metadata={"help": "Response-token cap for training rollouts."})
    eval_max_new_tokens: int | None = field(default=None, metadata={"help": "Cap for evaluation; None = max_new_tokens."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature of training rollouts."})
    # --- memory and speed (never change the learning algorithm)
    micro_batch_size: int | None = field(default=None, metadata={"help": "Responses per micro-batch (alternative to the token budget)."})
    max_tokens_per_micro_batch: int | None = field(default=8192, metadata={"help": "Token budget per micro-batch (packing)."})
    trainer_path: str = field(default="auto", metadata={
        "help": "Trainer forward/backward: packed (sequences back to back, no padding, variable-length attention, "
                "chunked log-prob head), packed-compiled (the same through torch.compile on CUDA), padded "
                "(right-padded micro-batches), or auto: packed where the model supports it. Same loss and "
                "gradients up to rounding."})
    packed_tokens_per_micro_batch: int | None = field(default=None, metadata={
        "help": "Token budget of a packed micro-batch; None: sized to free GPU memory on CUDA, "
                "max_tokens_per_micro_batch elsewhere."})
    generation_batch_size: int = field(default=512, metadata={"help": "Most sequences generated at once (concurrency cap)."})
    engine: str = field(default="hf", metadata={"help": "Rollout engine: hf or sglang."})
    engine_url: str | None = field(default=None, metadata={"help": "sglang: attach to this server instead of launching one."})
    fast_rollout: str = field(default="auto", metadata={
        "help": "hf engine decode path: on (static cache, CUDA graphs on GPU), fused (on, plus the Triton "
                "decode kernels), off (model.generate), or auto: fused on GPU where the model allows, else on; off on CPU."})
    device: str = field(default="auto", metadata={"help": "auto, cpu or cuda[:n]."})
    # --- records
    output_dir: str = field(default="runs/adhoc", metadata={"help": "Study directory; the run lives in output_dir/run_id."})
    run_id: str = field(default="", metadata={"help": "Run directory name; derived from the arm, task and seed when empty."})
    resume: bool = field(default=False, metadata={"help": "Continue an existing run from its last saved collection."})
    save_checkpoint: bool = field(default=True, metadata={"help": "Save final/ safetensors at the end."})
    resume_every_collections: int = field(default=0, metadata={"help": "Save resumable state every N collections (0: at evaluations)."})
    data_dir: str | None = field(default=None, metadata={"help": "GSM8K directory (else GRPO_KNOBS_DATA or ../shared/data/gsm8k)."})
    # --- labels used by studies and analysis
    study: str = field(default="adhoc", metadata={"help": "Study name recorded with the run."})
    phase: str = field(default="adhoc", metadata={"help": "screening, lr-followup, confirmation, pilot or adhoc."})
    arm: str = field(default="custom", metadata={"help": "Arm name (knob shape and LR multiplier)."})
    recipe: str = field(default="", metadata={"help": "Display name of the recipe in tables."})

    def __post_init__(self) -> None:
        self.validate()

    # Derived values, computed from the typed block above.
    @property
    def plan(self) -> BatchPlan:
        return BatchPlan(self.rollout_batch_size, self.n_samples_per_prompt,
                         self.global_batch_size, self.num_steps_per_rollout)

    @property
    def collections(self) -> int:
        return self.plan.collections_for_budget(self.response_budget)

    @property
    def eval_points(self) -> list[int]:
        return self.plan.eval_points(self.response_budget, self.eval_every_responses)

    @property
    def resolved_run_id(self) -> str:
        return self.run_id or f"{self.task}-{self.arm}-s{self.seed}"

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.resolved_run_id

    def validate(self) -> None:
        """Fail fast, with the field name and a fix, on any bad value."""
        plan = self.plan  # raises on a bad knob shape
        plan.eval_points(self.response_budget, self.eval_every_responses)
        if self.num_steps_per_rollout is None:
            self.num_steps_per_rollout = plan.num_steps_per_rollout
        from .data import list_tasks
        if self.task not in list_tasks():
            raise ValueError(f"Unknown task {self.task!r}; valid tasks: {', '.join(list_tasks())}.")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}.")
        for name in ("adam_beta1", "adam_beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must lie in [0, 1), got {getattr(self, name)}.")
        if not 0.0 < self.clip_low < 1.0:
            raise ValueError(f"clip_low must lie in (0, 1): the ratio is clipped below at 1 - clip_low; got {self.clip_low}.")
        if not self.clip_high > 0.0:
            raise ValueError(f"clip_high must be positive: the ratio is clipped above at 1 + clip_high; got {self.clip_high}.")
        if self.weight_decay < 0 or self.grad_clip <= 0 or self.kl_coef < 0:
            raise ValueError("weight_decay and kl_coef must be >= 0 and grad_clip > 0.")
        if self.loss_aggregation not in LOSS_AGGREGATIONS:
            raise ValueError(f"loss_aggregation must be one of {LOSS_AGGREGATIONS}, got {self.loss_aggregation!r}.")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}.")
        if self.fast_rollout not in ("auto", "on", "off", "fused"):
            raise ValueError(f"fast_rollout must be auto, on, off or fused, got {self.fast_rollout!r}.")
        if self.trainer_path not in ("auto", "packed", "packed-compiled", "padded"):
            raise ValueError(f"trainer_path must be auto, packed, packed-compiled or padded, got {self.trainer_path!r}.")
        if self.phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {self.phase!r}.")
        if self.micro_batch_size is not None and self.max_tokens_per_micro_batch is not None:
            raise ValueError("Set micro_batch_size or max_tokens_per_micro_batch, not both (set the other to None).")
        if self.micro_batch_size is None and self.max_tokens_per_micro_batch is None:
            raise ValueError("Set one of micro_batch_size or max_tokens_per_micro_batch.")
        for name in ("micro_batch_size", "max_tokens_per_micro_batch", "packed_tokens_per_micro_batch", "eval_problems",
                     "eval_max_new_tokens"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise ValueError(f"{name} must be a positive integer or None, got {v!r}.")
        for name in ("max_new_tokens", "generation_batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}.")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive for training rollouts, got {self.temperature}.")
        if self.run_id and not _RUN_ID.match(self.run_id):
            raise ValueError(f"run_id {self.run_id!r} must be letters, digits, '.', '_' or '-' (at most 128).")
        if self.resume_every_collections < 0:
            raise ValueError("resume_every_collections must be >= 0.")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "RunConfig":
        """Build from a mapping, refusing unknown keys with the closest valid names."""
        known = set(cls.field_names())
        unknown = sorted(set(values) - known)
        if unknown:
            import difflib
            hints = {k: difflib.get_close_matches(k, known, n=1) for k in unknown}
            detail = ", ".join(f"{k!r}" + (f" (did you mean {h[0]!r}?)" if h else "") for k, h in hints.items())
            raise ValueError(f"Unknown run parameter(s): {detail}. Valid names: {', '.join(sorted(known))}.")
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> "RunConfig":
        import yaml
        with open(path) as f:
            values = yaml.safe_load(f) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{path}: expected a mapping of run parameters, got {type(values).__name__}.")
        values.update(overrides or {})
        return cls.from_dict(values)


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """Parse ``key=value`` strings; values are read as YAML scalars (1e-5, true, null, 64)."""
    import yaml
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"Expected key=value, got {pair!r}.")
        key, raw = pair.split("=", 1)
        # YAML 1.1 reads on/off/yes/no as booleans; here they are the words (fast_rollout=on).
        value = raw if raw.lower() in ("on", "off", "yes", "no", "y", "n") else (yaml.safe_load(raw) if raw else "")
        # YAML reads 3e-6 as a string (no dot); accept plain float spellings too.
        if isinstance(value, str):
            try:
                value = float(value) if any(c in value for c in ".eE") else value
            except ValueError:
                pass
        out[key.strip()] = value
    return out

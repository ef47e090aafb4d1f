"""RunConfig: every parameter of one training run, typed, documented and validated.

The same fields are the papermill parameters of ``grpo_knobs/notebooks/10_train.ipynb`` and the keys
of ``grpo-knobs train --config run.yaml`` / ``-p key=value``, so the notebook and the
command run exactly the same code path.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import textwrap
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .knobs import BatchPlan

LOSS_AGGREGATIONS = ("sequence-mean", "token-mean")
ENGINES = ("hf", "sglang")
TRACKERS = ("none", "tensorboard", "trackio")
PHASES = ("adhoc", "screening", "lr-followup", "confirmation", "pilot")
# A name that becomes a directory or file name (run ids, study names): no separators, no "..", no leading dot.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# A label shown in tables (an arm named in a run_id-less run is also checked as a name).
_LABEL = re.compile(r"^[^\x00-\x1f\x7f/\\]{1,128}$")
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")
# Integers beyond int64 fit no counter, seed or tensor the suite hands them to.
INT_LIMIT = 2**63
# Old parameter names still read (with a DeprecationWarning) from mappings, YAML, papermill and recorded configs.
DEPRECATED_NAMES = {"generation_batch_size": "max_concurrent_sequences"}


@dataclass(frozen=True)
class RunConfig:
    # --- what is trained, on what
    task: str = field(default="countdown-2x10", metadata={"help": "Task variant (grpo_knobs.data.TASKS)."})
    model: str = field(default="smollm2-135m-instruct", metadata={"help": "Registry name, hub id or local path."})
    # --- the four batch knobs (P x G = B x S exactly)
    rollout_batch_size: int = field(default=16, metadata={"help": "P: prompts drawn per collection."})
    n_samples_per_prompt: int = field(default=8, metadata={"help": "G: responses per prompt (group size)."})
    global_batch_size: int = field(default=128, metadata={"help": "B: responses per optimizer update."})
    num_steps_per_rollout: int | None = field(
        default=None, metadata={"help": "S: updates per collection; derived when None."}
    )
    # --- optimisation
    lr: float = field(default=3e-6, metadata={"help": "Constant AdamW learning rate."})
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1."})
    adam_beta2: float = field(default=0.98, metadata={"help": "AdamW beta2."})
    weight_decay: float = field(default=0.1, metadata={"help": "AdamW decoupled weight decay."})
    grad_clip: float = field(default=1.0, metadata={"help": "Global gradient-norm clip."})
    clip_low: float = field(default=0.2, metadata={"help": "PPO ratio clip below: 1 - clip_low."})
    clip_high: float = field(default=0.28, metadata={"help": "PPO ratio clip above: 1 + clip_high."})
    std_normalize_advantages: bool = field(
        default=True, metadata={"help": "Divide by the group's sample std (False: Dr. GRPO)."}
    )
    loss_aggregation: str = field(default="sequence-mean", metadata={"help": "sequence-mean or token-mean."})
    kl_coef: float = field(default=0.0, metadata={"help": "k3 KL penalty to the initial policy (0 = off)."})
    reuse_on_policy_logprobs: bool = field(
        default=False,
        metadata={
            "help": "The first of a collection's S updates runs on the weights that generated it: take that "
            "slice's old log-probs from the update's own forward pass, detached, and score only slices 2..S "
            "beforehand. Same loss and gradients, 1/S of the scoring pass fewer (all of it when S=1). Off "
            "by default: the study's trainer time includes old-policy scoring of every response in every "
            "arm, and a saving that shrinks with S would tilt the job-time comparison between knob shapes."
        },
    )
    # --- budget and evaluation
    seed: int = field(default=1, metadata={"help": "Fixes data draws, sampling and initialisation of a run."})
    deterministic: bool = field(
        default=False,
        metadata={
            "help": "Bit-identical reruns of a seed on one GPU model and software stack: kernels with a fixed "
            "reduction order (torch's deterministic algorithms, cuBLAS's reproducible workspace, flash "
            "attention's deterministic backward, Inductor without benchmarking), a packed token budget fixed "
            "by the GPU's total memory, and every path's sampling noise keyed per response. Costs job time "
            "(docs/determinism.md); CPU runs are reproducible either way."
        },
    )
    response_budget: int = field(default=1024, metadata={"help": "Training responses in the run (whole collections)."})
    eval_every_responses: int = field(
        default=512, metadata={"help": "Evaluate every N responses (whole collections)."}
    )
    eval_problems: int | None = field(default=None, metadata={"help": "Validation problems evaluated; None = all."})
    max_new_tokens: int = field(default=256, metadata={"help": "Response-token cap for training rollouts."})
    eval_max_new_tokens: int | None = field(
        default=None, metadata={"help": "Cap for evaluation; None = max_new_tokens."}
    )
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature of training rollouts."})
    # --- memory and speed (never change the learning algorithm)
    micro_batch_size: int | None = field(
        default=None, metadata={"help": "Responses per micro-batch (alternative to the token budget)."}
    )
    max_tokens_per_micro_batch: int | None = field(
        default=8192, metadata={"help": "Token budget per micro-batch (packing)."}
    )
    trainer_path: str = field(
        default="auto",
        metadata={
            "help": "Trainer forward/backward: packed (sequences back to back, no padding, variable-length attention, "
            "chunked log-prob head), packed-liger (the same with liger-kernel's fused RMSNorm, rotary and SwiGLU; "
            "CUDA), packed-compiled (the same through torch.compile; CUDA), padded (right-padded micro-batches), "
            "or auto: packed-liger on CUDA where liger-kernel is installed, else packed, where the model supports "
            "it. Same loss and gradients up to rounding."
        },
    )
    packed_tokens_per_micro_batch: int | None = field(
        default=None,
        metadata={
            "help": "Token budget of a packed micro-batch; None: sized to free GPU memory on CUDA, "
            "max_tokens_per_micro_batch elsewhere."
        },
    )
    max_concurrent_sequences: int = field(
        default=512,
        metadata={
            "help": "Most sequences generated at once (concurrency cap; not TRL's generation_batch_size, "
            "which is P x G)."
        },
    )
    engine: str = field(default="hf", metadata={"help": "Rollout engine: hf or sglang."})
    engine_url: str | None = field(
        default=None, metadata={"help": "sglang: attach to this server instead of launching one."}
    )
    fast_rollout: str = field(
        default="auto",
        metadata={
            "help": "hf engine decode path: on (static cache, CUDA graphs on GPU), fused (on, plus the Triton "
            "decode kernels), off (model.generate), or auto: fused on GPU where the model allows, else on; off on CPU."
        },
    )
    device: str = field(default="auto", metadata={"help": "auto, cpu or cuda[:n]."})
    # --- SGLang server (engine=sglang; grpo_knobs.rollout.sglang); the run seed becomes its --random-seed
    sglang_mem_fraction: float = field(
        default=0.65, metadata={"help": "sglang: GPU memory share for weights and KV cache (--mem-fraction-static)."}
    )
    sglang_base_gpu_id: int | None = field(
        default=None,
        metadata={"help": "sglang: first server GPU (--base-gpu-id); None: not the trainer's where two are visible."},
    )
    sglang_deterministic: bool | None = field(
        default=None,
        metadata={
            "help": "sglang: --enable-deterministic-inference, so per-response seeds reproduce samples (slower); "
            "None follows deterministic."
        },
    )
    sglang_server_args: str = field(
        default="", metadata={"help": "sglang: further server flags, shell-quoted (e.g. '--attention-backend fa3')."}
    )
    sglang_max_retries: int = field(
        default=5,
        metadata={"help": "sglang: re-sends of a request after a 503, a dropped connection, a timeout or an abort."},
    )
    sglang_max_restarts: int = field(
        default=2, metadata={"help": "sglang: restarts of a launched server that died, per run."}
    )
    sglang_request_timeout: float = field(
        default=3600.0, metadata={"help": "sglang: seconds one request may take before it is re-sent."}
    )
    sglang_startup_timeout: float = field(
        default=900.0, metadata={"help": "sglang: seconds the server may take to become healthy."}
    )
    sglang_python: str | None = field(
        default=None,
        metadata={
            "help": "sglang: Python of the environment SGLang is installed in (it pins its own torch); None: this one."
        },
    )
    # --- records
    output_dir: str = field(
        default="runs/adhoc", metadata={"help": "Study directory; the run lives in output_dir/run_id."}
    )
    run_id: str = field(
        default="", metadata={"help": "Run directory name; derived from the arm, task and seed when empty."}
    )
    resume: bool = field(default=False, metadata={"help": "Continue an existing run from its last saved collection."})
    save_checkpoint: bool = field(default=True, metadata={"help": "Save final/ safetensors at the end."})
    resume_every_collections: int = field(
        default=0, metadata={"help": "Save resumable state every N collections (0: at evaluations)."}
    )
    data_dir: str | None = field(
        default=None, metadata={"help": "GSM8K directory (else the shipped copy, then GRPO_KNOBS_DATA)."}
    )
    tracker: str = field(
        default="none",
        metadata={
            "help": "Also log scalars live to none, tensorboard or trackio (beside the records; never replaces them)."
        },
    )
    tracking_dir: str | None = field(
        default=None, metadata={"help": "Where the tracker writes; None = <run_dir>/tracking."}
    )
    # --- labels used by studies and analysis
    study: str = field(default="adhoc", metadata={"help": "Study name recorded with the run."})
    phase: str = field(default="adhoc", metadata={"help": "screening, lr-followup, confirmation, pilot or adhoc."})
    arm: str = field(default="custom", metadata={"help": "Arm name (knob shape and LR multiplier)."})
    recipe: str = field(default="", metadata={"help": "Display name of the recipe in tables."})

    def __post_init__(self) -> None:
        # Derived once: S (when left to be derived) and the plan every later step reads.
        plan = self.validate()
        object.__setattr__(self, "num_steps_per_rollout", plan.num_steps_per_rollout)
        object.__setattr__(self, "plan", plan)

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

    @property
    def sglang_deterministic_resolved(self) -> bool:
        """Whether the SGLang server runs its deterministic inference: its own setting, else ``deterministic``."""
        return self.deterministic if self.sglang_deterministic is None else self.sglang_deterministic

    def validate(self) -> BatchPlan:
        """Fail fast, with the field name and a fix, on any bad value. Changes nothing; returns the
        batch plan it checked."""
        _check_types(self)
        plan = BatchPlan(
            self.rollout_batch_size, self.n_samples_per_prompt, self.global_batch_size, self.num_steps_per_rollout
        )  # raises on a bad knob shape, naming the knob to change
        plan.eval_points(self.response_budget, self.eval_every_responses)
        from .data import list_tasks

        if self.task not in list_tasks():
            raise ValueError(f"Unknown task {self.task!r}; valid tasks: {', '.join(list_tasks())}.")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}.")
        for name in ("adam_beta1", "adam_beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must lie in [0, 1), got {getattr(self, name)}.")
        if not 0.0 < self.clip_low < 1.0:
            raise ValueError(
                f"clip_low must lie in (0, 1): the ratio is clipped below at 1 - clip_low; got {self.clip_low}."
            )
        if not self.clip_high > 0.0:
            raise ValueError(
                f"clip_high must be positive: the ratio is clipped above at 1 + clip_high; got {self.clip_high}."
            )
        if self.weight_decay < 0 or self.grad_clip <= 0 or self.kl_coef < 0:
            raise ValueError("weight_decay and kl_coef must be >= 0 and grad_clip > 0.")
        _check_choice("loss_aggregation", self.loss_aggregation, LOSS_AGGREGATIONS)
        _check_choice("engine", self.engine, ENGINES)
        _check_choice("fast_rollout", self.fast_rollout, FAST_ROLLOUT)
        _check_choice("phase", self.phase, PHASES)
        _check_choice("tracker", self.tracker, TRACKERS)
        _check_choice("trainer_path", self.trainer_path, TRAINER_PATHS)
        if not _DEVICE.fullmatch(self.device):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N; got {_shown(self.device)}.")
        if self.micro_batch_size is not None and self.max_tokens_per_micro_batch is not None:
            raise ValueError("Set micro_batch_size or max_tokens_per_micro_batch, not both (set the other to None).")
        if self.micro_batch_size is None and self.max_tokens_per_micro_batch is None:
            raise ValueError("Set one of micro_batch_size or max_tokens_per_micro_batch.")
        for name in (
            "micro_batch_size",
            "max_tokens_per_micro_batch",
            "packed_tokens_per_micro_batch",
            "eval_problems",
            "eval_max_new_tokens",
            "max_new_tokens",
            "max_concurrent_sequences",
        ):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value}.")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive for training rollouts, got {self.temperature}.")
        self._check_names()
        if self.resume_every_collections < 0:
            raise ValueError(f"resume_every_collections must be >= 0, got {self.resume_every_collections}.")
        # SGLang server settings
        if not 0.0 < self.sglang_mem_fraction < 1.0:
            raise ValueError(f"sglang_mem_fraction must lie in (0, 1), got {self.sglang_mem_fraction}.")
        # Types are already checked (_check_types); only the ranges are left.
        gpu = self.sglang_base_gpu_id
        if gpu is not None and gpu < 0:
            raise ValueError(f"sglang_base_gpu_id must be a GPU number >= 0 or None (pick one), got {gpu!r}.")
        for name in ("sglang_max_retries", "sglang_max_restarts"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {getattr(self, name)!r}.")
        for name in ("sglang_request_timeout", "sglang_startup_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {getattr(self, name)!r}.")
        if self.sglang_server_args:
            from .rollout.sglang import split_server_args

            split_server_args(self.sglang_server_args)
        return plan

    def _check_names(self) -> None:
        """The run directory's name, the study's and the arm's: nothing a run writes may leave output_dir."""
        check_name("study", self.study)
        if self.run_id:
            check_name("run_id", self.run_id)
            if not _LABEL.match(self.arm):
                raise ValueError(f"arm {self.arm!r} must be 1-128 characters without '/', '\\' or control characters.")
        elif not _NAME.match(self.resolved_run_id):
            raise ValueError(
                f"the run directory name {self.resolved_run_id!r}, made from task, arm and seed, must be letters, "
                f"digits, '.', '_' or '-'; choose such an arm name (now {self.arm!r}) or set run_id."
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "RunConfig":
        """Build from a mapping (YAML, ``-p key=value``, papermill): unknown keys are refused with the
        closest valid names, and every value is parsed to its field's declared type."""
        values = rename_deprecated(values)
        known = set(cls.field_names())
        unknown = sorted(set(values) - known)
        if unknown:
            hints = {k: difflib.get_close_matches(k, known, n=1) for k in unknown}
            detail = ", ".join(f"{k!r}" + (f" (did you mean {h[0]!r}?)" if h else "") for k, h in hints.items())
            raise ValueError(f"Unknown run parameter(s): {detail}. Valid names: {', '.join(sorted(known))}.")
        hints = field_types()
        return cls(**{k: parse_value(k, v, hints[k]) for k, v in values.items()})

    @classmethod
    def from_parameters(cls, namespace: dict[str, Any]) -> "RunConfig":
        """Build from a notebook's globals: its parameter cell's fields, plus any deprecated name
        papermill injected (which then overrides the new name's default)."""
        values = {k: v for k, v in namespace.items() if k in cls.field_names()}
        for old, new in DEPRECATED_NAMES.items():
            if namespace.get(old) is not None:
                values.pop(new, None)
                values[old] = namespace[old]
        return cls.from_dict(values)

    @classmethod
    def from_trl(cls, config: Any, **fields: Any) -> "RunConfig":
        """A run from a TRL ``GRPOConfig`` (or a mapping of its keys); ``fields`` set what TRL does not hold.
        Settings the study cannot express are refused (see ``grpo_knobs.conventions``)."""
        from .conventions import from_trl

        return cls.from_dict({**from_trl(config), **fields})

    def to_trl(self, num_processes: int = 1, gradient_accumulation_steps: int = 1) -> dict[str, Any]:
        """TRL ``GRPOConfig`` keyword arguments for this run."""
        from .conventions import to_trl

        return to_trl(self, num_processes=num_processes, gradient_accumulation_steps=gradient_accumulation_steps)

    @classmethod
    def from_verl(cls, config: Any, **fields: Any) -> "RunConfig":
        """A run from verl's PPO-trainer settings (dotted keys or nested mapping); ``fields`` as in from_trl."""
        from .conventions import from_verl

        return cls.from_dict({**from_verl(config), **fields})

    def to_verl(self) -> dict[str, Any]:
        """verl PPO-trainer overrides (dotted keys) for this run."""
        from .conventions import to_verl

        return to_verl(self)

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> "RunConfig":
        return cls.from_dict(read_run_values(path) | (overrides or {}))


def read_run_values(path: str | Path) -> dict[str, Any]:
    """The run parameters a YAML file sets (``--config``), unparsed; refuses a file that is not a mapping."""
    import yaml

    try:
        with open(path) as f:
            values = yaml.safe_load(f) or {}
    except yaml.YAMLError as error:
        raise ValueError(yaml_error(path, error)) from None
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping of run parameters, got {type(values).__name__}.")
    return values


# The parameters cell of grpo_knobs/notebooks/10_train.ipynb: comment lines that open each group of fields.
SECTIONS = {
    "task": "what is trained, on what",
    "rollout_batch_size": "the four batch knobs: P x G = B x S exactly",
    "lr": "optimisation",
    "seed": "budget and evaluation",
    "micro_batch_size": "memory and speed (never change the learning algorithm)",
    "output_dir": "records",
    "study": "labels used by studies and analysis",
}
PARAMETERS_HEADER = (
    "# Parameters: one typed block of defaults, generated from grpo_knobs.config.RunConfig\n"
    "# (`grpo-knobs notebook-params` rewrites it); papermill overrides any of them.\n"
    "from typing import Optional  # papermill reads `Optional[int]`, not `int | None`\n"
)


def parameters_cell() -> str:
    """The source of the notebook's ``parameters`` cell: every RunConfig field, its type and default.

    Written for papermill's line parser (``papermill --help-notebook`` and its check of injected
    names): one field per line, a type it reads (``int``, ``Optional[int]``), and a help comment
    on the line only where that line then holds a single ``=`` (the parser skips any other).
    """
    lines = [PARAMETERS_HEADER]
    declared = field_types()
    for f in dataclasses.fields(RunConfig):
        if f.name in SECTIONS:
            lines.append(f"\n# --- {SECTIONS[f.name]}\n")
        help_text = _help_text(f)
        code = f"{f.name}: {_annotation(declared[f.name])} = {_literal(f.default)}"
        if len(code) + len(help_text) + 4 <= 119 and "=" not in help_text:
            lines.append(f"{code}  # {help_text}\n")
        else:  # a long help (or one with "=") reads above its field
            lines += [f"# {line}\n" for line in textwrap.wrap(help_text, 115)] + [f"{code}\n"]
    return "".join(lines).rstrip("\n")


def run_parameters_help(width: int = 100) -> str:
    """Every RunConfig field as ``--help`` lists it: grouped as in the parameters cell, each name with its
    default and help, the help wrapped to ``width`` columns under the name."""
    lines = ["run parameters (-p KEY=VALUE, or the keys of a --config YAML), default in brackets:"]
    for f in dataclasses.fields(RunConfig):
        if f.name in SECTIONS:
            lines += ["", f"  {SECTIONS[f.name]}"]
        lines.append(f"    {f.name} [{_as_typed(f.default)}]")
        help_text = _help_text(f)
        lines += textwrap.wrap(help_text, width, initial_indent=" " * 8, subsequent_indent=" " * 8)
    return "\n".join(lines)


def _help_text(f: dataclasses.Field) -> str:
    """A field's help on one line (the source wraps it)."""
    return " ".join(f.metadata.get("help", "").split())


def _as_typed(value: Any) -> str:
    """A default as it is typed after ``-p KEY=``: strings bare, booleans and None in lower case."""
    if value is None or isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _annotation(declared: Any) -> str:
    """A field's type as papermill's parser reads it: ``int``, ``Optional[int]``."""
    kinds, optional = _base_types(declared)
    if len(kinds) != 1 or not isinstance(kinds[0], type):
        raise TypeError(f"the parameters cell cannot declare {declared}: use one plain type, optionally | None")
    return f"Optional[{kinds[0].__name__}]" if optional else kinds[0].__name__


def _literal(value: Any) -> str:
    """A default as Python source, strings double-quoted as the formatter writes them."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


# Fields that may change when a run is resumed: where and how it runs, not what it learns.
RESUMABLE_FIELDS = frozenset(
    {"resume", "output_dir", "device", "engine_url", "data_dir", "tracker", "tracking_dir", "resume_every_collections"}
)
# Fields whose None means "the same as another field".
FOLLOWING_FIELDS = {"sglang_deterministic": "deterministic"}
FAST_ROLLOUT = ("auto", "on", "off", "fused")
TRAINER_PATHS = ("auto", "packed", "packed-liger", "packed-compiled", "padded")
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def config_drift(recorded: dict[str, Any], cfg: RunConfig) -> list[str]:
    """``key: recorded X, now Y`` for each field that differs from a run's recorded config.

    Fields in :data:`RESUMABLE_FIELDS` and fields newer than the record are not compared, so a
    new RunConfig field keeps older runs resumable.
    """
    recorded = {DEPRECATED_NAMES.get(k, k): v for k, v in recorded.items()}  # records keep their old names
    now = cfg.to_dict()
    for name, leader in FOLLOWING_FIELDS.items():  # None means "as the leader": compare what takes effect
        if name in recorded:
            recorded[name] = recorded.get(leader, False) if recorded[name] is None else recorded[name]
            now[name] = now[leader] if now[name] is None else now[name]
    return [
        f"{k}: recorded {recorded[k]!r}, now {v!r}"
        for k, v in now.items()
        if k not in RESUMABLE_FIELDS and k in recorded and recorded[k] != v
    ]


def check_name(what: str, value: Any) -> str:
    """``value`` when it is safe as a directory or file name (run ids, study names); ValueError naming
    ``what`` otherwise. The one rule for every name the suite turns into a path."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise ValueError(
            f"{what} {value!r} must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit "
            "(it names a directory)."
        )
    return value


def inside(root: str | Path, *parts: str) -> Path:
    """``root / parts``, resolved, after checking that it lies inside ``root`` (symbolic links followed):
    every path the suite derives from a name goes through here before anything is written there."""
    base = Path(root).resolve()
    path = base.joinpath(*parts).resolve()
    if path != base and base not in path.parents:
        raise ValueError(f"{base.joinpath(*parts)} resolves to {path}, outside {base}; nothing is written there.")
    return path


def yaml_error(path: str | Path, error: Exception) -> str:
    """One line for a YAML syntax error: the file, line and column, and what to fix."""
    mark = getattr(error, "problem_mark", None)
    where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(error, "problem", None) or "not valid YAML"
    return f"{path}:{where}: {problem}; fix the YAML syntax there."


def field_types() -> dict[str, Any]:
    """Each RunConfig field's declared type, resolved (``int | None`` -> ``int | None``)."""
    return typing.get_type_hints(RunConfig)


def _base_types(declared: Any) -> tuple[tuple[type, ...], bool]:
    """(the non-None types of a field, whether None is allowed)."""
    if isinstance(declared, types.UnionType) or typing.get_origin(declared) is typing.Union:
        args = typing.get_args(declared)
        return tuple(a for a in args if a is not type(None)), type(None) in args
    return (declared,), False


def parse_value(name: str, value: Any, declared: Any) -> Any:
    """``value`` as the declared type of field ``name``; strings are parsed, nothing is guessed.

    Booleans accept true/false, yes/no, on/off, 1/0; integers must be whole numbers; ``null`` or
    ``none`` give None where the field allows it.
    """
    kinds, optional = _base_types(declared)
    if value is None or (optional and isinstance(value, str) and value.strip().lower() in ("null", "none", "~")):
        if optional:
            return None
        raise ValueError(f"{name} must be a {kinds[0].__name__}, not null.")
    kind = kinds[0]
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        raise ValueError(f"{name} must be true or false (also yes/no, on/off, 1/0), got {value!r}.")
    if kind is int:
        if isinstance(value, str):
            text = value.strip()
            try:
                value = int(text)
            except ValueError:
                if re.fullmatch(r"[+-]?\d+", text):  # more digits than Python converts
                    raise ValueError(f"{name} must be an integer below 2**63 in size, got {_shown(text)}.") from None
                try:
                    value = float(text)
                except ValueError:
                    raise ValueError(f"{name} must be an integer, got {_shown(text)}.") from None
        if isinstance(value, float) and value.is_integer():
            raise ValueError(f"{name} must be an integer, got {value!r}; write {int(value)}.")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an integer, got {_shown(value)}.")
        _check_range(name, value)
        return value
    if kind is float:
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise ValueError(f"{name} must be a number, got {_shown(value)}.") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} must be a number, got {_shown(value)}.")
        try:
            value = float(value)
        except OverflowError:  # an integer too large for a float
            value = math.inf
        _check_range(name, value)
        return value
    if kind is str and not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {_shown(value)}.")
    return value


def _shown(value: Any) -> str:
    """A value for an error message, cut to a readable length."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _check_range(name: str, value: int | float) -> None:
    """Numbers must be finite (a NaN or infinite setting trains nothing) and integers fit int64."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}.")
    if isinstance(value, int) and not -INT_LIMIT <= value < INT_LIMIT:
        raise ValueError(f"{name} must be an integer below 2**63 in size, got {_shown(value)}.")


def _check_types(cfg: RunConfig) -> None:
    """Every field holds its declared type (the parse happens in :meth:`RunConfig.from_dict`)."""
    for name, declared in field_types().items():
        value = getattr(cfg, name)
        kinds, optional = _base_types(declared)
        if value is None and optional:
            continue
        kind = kinds[0]
        ok = (
            (isinstance(value, (int, float)) and not isinstance(value, bool))
            if kind is float
            else (isinstance(value, kind) and (kind is bool or not isinstance(value, bool)))
        )
        if not ok:
            allowed = " or None" if optional else ""
            raise ValueError(
                f"{name} must be {kind.__name__}{allowed}, got {_shown(value)} ({type(value).__name__}); "
                "build configs with RunConfig.from_dict to parse strings."
            )
        if kind in (int, float):
            _check_range(name, value)


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}.")


def rename_deprecated(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with deprecated parameter names replaced by their new names (one warning each)."""
    import warnings

    out = dict(values)
    for old, new in DEPRECATED_NAMES.items():
        if old in out:
            value = out.pop(old)
            if new in out and out[new] != value:
                raise ValueError(
                    f"{old!r} is the deprecated name of {new!r}; set only {new!r} "
                    f"(got {old}={value!r} and {new}={out[new]!r})."
                )
            warnings.warn(
                f"{old} is deprecated; use {new} (same meaning: a generation concurrency cap).",
                DeprecationWarning,
                stacklevel=3,
            )
            out[new] = value
    return out


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """``key=value`` strings as a mapping of raw strings; :meth:`RunConfig.from_dict` parses each
    value to its field's type (so ``resume=no`` is False and ``fast_rollout=on`` stays the word)."""
    out: dict[str, str] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"Expected key=value, got {pair!r}.")
        key, raw = pair.split("=", 1)
        out[key.strip()] = raw.strip()
    return out


def parse_plan_params(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` strings for a study plan's ``params``: values read as YAML scalars (1e-5, true, 64)."""
    import yaml

    out: dict[str, Any] = {}
    for key, raw in parse_overrides(pairs).items():
        # YAML 1.1 reads on/off/yes/no as booleans; here they are the words (fast_rollout=on).
        value = raw if raw.lower() in ("on", "off", "yes", "no", "y", "n") else (yaml.safe_load(raw) if raw else "")
        if isinstance(value, str) and any(c in value for c in ".eE"):
            try:  # YAML reads 3e-6 as a string (no dot)
                value = float(value)
            except ValueError:
                pass
        out[key] = value
    return out

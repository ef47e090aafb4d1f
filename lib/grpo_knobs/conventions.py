"""A run's settings in TRL's and verl's names, both ways, refusing what the study cannot express.

The study's names follow Miles (P = ``rollout_batch_size``, G = ``n_samples_per_prompt``,
B = ``global_batch_size``, S = ``num_steps_per_rollout``). ``to_trl``/``to_verl`` give the
settings of those trainers that run the same algorithm; ``from_trl``/``from_verl`` read theirs
back into ``RunConfig`` field values. A setting that changes the algorithm into one the study
does not define (more than one pass over a collection, batch-level reward scaling, another
loss) raises :class:`UnrepresentableError` naming each such key. docs/conventions.md gives the
table and the source lines of both trainers it was checked against (trl 1.16.0; verl at commit
b178a3c).

Nothing here imports trl or verl: a TRL ``GRPOConfig`` is read through its attributes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

TRL_VERSION = "1.16.0"
VERL_COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"

# Defaults of the GRPOConfig keys read here (trl 1.16.0 trl/trainer/grpo_config.py, and
# transformers' TrainingArguments for the optimiser keys). A mapping that lacks a key gets these.
TRL_DEFAULTS: dict[str, Any] = {
    "num_generations": 8,
    "generation_batch_size": None,
    "steps_per_generation": None,
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "num_iterations": 1,
    "max_steps": -1,
    "learning_rate": 1e-6,
    "lr_scheduler_type": "linear",
    "warmup_steps": 0,
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "adam_epsilon": 1e-8,
    "weight_decay": 0.0,
    "max_grad_norm": 1.0,
    "optim": "adamw_torch_fused",
    "epsilon": 0.2,
    "epsilon_high": None,
    "delta": None,
    "scale_rewards": "group",
    "loss_type": "dapo",
    "beta": 0.0,
    "use_bias_correction_kl": True,
    "sync_ref_model": False,
    "importance_sampling_level": "token",
    "mask_truncated_completions": False,
    "top_entropy_quantile": 1.0,
    "entropy_coef": 0.0,
    "use_adaptive_entropy": False,
    "off_policy_mask_threshold": None,
    "max_completion_length": 512,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": None,
    "repetition_penalty": 1.0,
    "seed": 42,
    "full_determinism": False,
}

# Defaults of the verl keys read here (verl/trainer/config/_generated_ppo_trainer.yaml at VERL_COMMIT).
_A, _R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
VERL_DEFAULTS: dict[str, Any] = {
    "data.train_batch_size": 1024,
    f"{_R}.n": 1,
    f"{_A}.ppo_mini_batch_size": 256,
    f"{_A}.ppo_epochs": 1,
    "algorithm.adv_estimator": "gae",
    "algorithm.norm_adv_by_std_in_grpo": True,
    "algorithm.use_kl_in_reward": False,
    f"{_A}.clip_ratio": 0.2,
    f"{_A}.clip_ratio_low": 0.2,
    f"{_A}.clip_ratio_high": 0.2,
    f"{_A}.clip_ratio_c": 3.0,
    f"{_A}.loss_agg_mode": "token-mean",
    f"{_A}.use_kl_loss": False,
    f"{_A}.kl_loss_coef": 0.001,
    f"{_A}.kl_loss_type": "low_var_kl",
    f"{_A}.entropy_coeff": 0,
    f"{_A}.policy_loss.loss_mode": "vanilla",
    f"{_A}.optim.lr": 1e-6,
    f"{_A}.optim.betas": [0.9, 0.999],
    f"{_A}.optim.weight_decay": 0.01,
    f"{_A}.optim.lr_scheduler_type": "constant",
    f"{_A}.optim.warmup_style": None,
    f"{_A}.optim.lr_warmup_steps_ratio": 0.0,
    f"{_A}.optim.lr_warmup_steps": -1,
    f"{_A}.grad_clip": 1.0,
    f"{_A}.optim.clip_grad": 1.0,
    "data.max_response_length": 512,
    f"{_R}.temperature": 1.0,
    f"{_R}.top_p": 1,
    f"{_R}.top_k": -1,
    f"{_R}.do_sample": True,
    "trainer.total_training_steps": None,
}

# verl bounds the loss of negative-advantage tokens at clip_ratio_c x |A| ("dual clip"); the study does not. verl
# clamps the log-ratio to [-20, 20] (core_algos.compute_policy_loss_vanilla), so a bound above e^20 never acts.
VERL_DUAL_CLIP_OFF = 1e9

_TRL_LOSS = {"sequence-mean": "grpo", "token-mean": "dapo"}
_VERL_AGG = {"sequence-mean": "seq-mean-token-mean", "token-mean": "token-mean"}


class UnrepresentableError(ValueError):
    """A peer's setting (or a run's) that the other side cannot express; the message names each key."""


class _Problems:
    """Collects every refused key so that one error names them all."""

    def __init__(self, header: str):
        self.header, self.items = header, []

    def add(self, key: str, value: Any, why: str) -> None:
        self.items.append(f"{key}={value!r} ({why})")

    def raise_any(self) -> None:
        if self.items:
            raise UnrepresentableError(f"{self.header}: " + "; ".join(self.items))


def _plain(value: Any) -> Any:
    """Enum members (TRL's SchedulerType, OptimizerNames) as their string values."""
    return getattr(value, "value", value)


def _trl_reader(config: Any):
    # Keys not read here (output_dir, logging, ...) do not touch the algorithm.
    if isinstance(config, Mapping):
        return lambda key: _plain(config.get(key, TRL_DEFAULTS[key]))
    return lambda key: _plain(getattr(config, key, TRL_DEFAULTS[key]))


# ---------------------------------------------------------------------------------------------------------------------
# TRL
# ---------------------------------------------------------------------------------------------------------------------
def to_trl(cfg: Any, num_processes: int = 1, gradient_accumulation_steps: int = 1) -> dict[str, Any]:
    """``GRPOConfig`` keyword arguments that run ``cfg``'s algorithm on ``num_processes`` data-parallel processes.

    B = per_device_train_batch_size x num_processes x gradient_accumulation_steps responses per optimizer
    step, and P x G = generation_batch_size responses per generation, so TRL derives
    steps_per_generation = S x gradient_accumulation_steps. max_steps counts optimizer steps.
    """
    bad = _Problems("run setting(s) TRL cannot express")
    if cfg.loss_aggregation == "token-mean" and cfg.num_steps_per_rollout != 1:
        bad.add(
            "loss_aggregation",
            cfg.loss_aggregation,
            "TRL's token-mean loss, loss_type='dapo', divides every update by the collection's tokens / S, "
            "not by the update's own tokens; the two agree only when num_steps_per_rollout = 1",
        )
    bad.raise_any()
    batch = _trl_batch(
        cfg.rollout_batch_size,
        cfg.n_samples_per_prompt,
        cfg.global_batch_size,
        cfg.num_steps_per_rollout,
        cfg.collections,
        num_processes,
        gradient_accumulation_steps,
    )
    return batch | {
        "learning_rate": cfg.lr,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "optim": "adamw_torch",
        "adam_beta1": cfg.adam_beta1,
        "adam_beta2": cfg.adam_beta2,
        "adam_epsilon": 1e-8,
        "weight_decay": cfg.weight_decay,
        "max_grad_norm": cfg.grad_clip,
        "epsilon": cfg.clip_low,
        "epsilon_high": cfg.clip_high,
        "scale_rewards": "group" if cfg.std_normalize_advantages else "none",
        "loss_type": _TRL_LOSS[cfg.loss_aggregation],
        "beta": cfg.kl_coef,
        "use_bias_correction_kl": False,
        "importance_sampling_level": "token",
        "mask_truncated_completions": False,
        "max_completion_length": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "top_p": 1.0,
        "top_k": 0,
        "seed": cfg.seed,
        "full_determinism": cfg.deterministic,
    }


def _trl_batch(
    p: int, g: int, b: int, s: int, collections: int | None, num_processes: int = 1, accum: int = 1
) -> dict[str, int]:
    """TRL's batch keys for P, G, B, S (and max_steps when the number of collections is given)."""
    shards = num_processes * accum
    if b % shards:
        bad = _Problems("run setting(s) TRL cannot express")
        bad.add(
            "global_batch_size",
            b,
            f"must split into num_processes x gradient_accumulation_steps = {shards} equal per-device batches",
        )
        bad.raise_any()
    out = {
        "num_generations": g,
        "generation_batch_size": p * g,
        "per_device_train_batch_size": b // shards,
        "gradient_accumulation_steps": accum,
        "num_iterations": 1,
    }
    return out if collections is None else out | {"max_steps": collections * s}


def _trl_batches(get, num_processes: int, bad: _Problems) -> dict[str, int] | None:
    """P, G, B, S from TRL's batch keys, resolving generation_batch_size / steps_per_generation as
    GRPOConfig.__post_init__ does."""
    g, per_device, accum = (
        get("num_generations"),
        get("per_device_train_batch_size"),
        get("gradient_accumulation_steps"),
    )
    gen, steps = get("generation_batch_size"), get("steps_per_generation")
    b = per_device * num_processes * accum
    if gen is None and steps is None:
        steps = accum
    if steps is None:
        if gen % (per_device * num_processes):
            bad.add(
                "generation_batch_size",
                gen,
                f"must be a multiple of per_device_train_batch_size x processes = {per_device * num_processes}",
            )
            return None
        steps = gen // (per_device * num_processes)
    elif gen is None:
        gen = per_device * num_processes * steps
    elif gen != per_device * num_processes * steps:
        bad.add(
            "generation_batch_size",
            gen,
            f"disagrees with steps_per_generation={steps}: TRL sets "
            "generation_batch_size = per_device_train_batch_size x processes x "
            "steps_per_generation",
        )
        return None
    if gen % g:
        bad.add("generation_batch_size", gen, f"must hold whole groups of num_generations={g}")
        return None
    if steps % accum:
        bad.add(
            "steps_per_generation",
            steps,
            f"must be a multiple of gradient_accumulation_steps={accum}: "
            "otherwise an optimizer step spans two generations",
        )
        return None
    return {
        "rollout_batch_size": gen // g,
        "n_samples_per_prompt": g,
        "global_batch_size": b,
        "num_steps_per_rollout": steps // accum,
    }


def from_trl(config: Any, num_processes: int | None = None) -> dict[str, Any]:
    """RunConfig field values from a TRL ``GRPOConfig`` (or a mapping of its keys; missing keys take TRL's
    defaults). ``num_processes`` defaults to the config's ``world_size`` (a mapping's ``num_processes``, else 1).

    Raises :class:`UnrepresentableError` naming every key whose value the study cannot express.
    """
    get = _trl_reader(config)
    if num_processes is None:
        num_processes = (
            config.get("num_processes", 1) if isinstance(config, Mapping) else getattr(config, "world_size", 1)
        )
    bad = _Problems("TRL setting(s) the study cannot express")
    shape = _trl_batches(get, num_processes, bad)
    _check_trl_algorithm(get, config, shape, bad)
    bad.raise_any()
    loss, scale, beta, max_steps = get("loss_type"), _trl_scale(get), get("beta"), get("max_steps")
    out = dict(shape or {})
    out.update(
        lr=get("learning_rate"),
        adam_beta1=get("adam_beta1"),
        adam_beta2=get("adam_beta2"),
        weight_decay=get("weight_decay"),
        grad_clip=get("max_grad_norm"),
        clip_low=get("epsilon"),
        clip_high=get("epsilon_high") if get("epsilon_high") is not None else get("epsilon"),
        std_normalize_advantages=scale == "group",
        loss_aggregation={v: k for k, v in _TRL_LOSS.items()}[loss],
        kl_coef=beta,
        max_new_tokens=get("max_completion_length"),
        temperature=get("temperature"),
        seed=get("seed"),
        deterministic=get("full_determinism"),
    )
    if max_steps and max_steps > 0:
        out["response_budget"] = (
            max_steps // out["num_steps_per_rollout"] * out["rollout_batch_size"] * out["n_samples_per_prompt"]
        )
    return out


def _trl_scale(get) -> str:
    """scale_rewards as a string (GRPOConfig.__post_init__ maps True / False to "group" / "none")."""
    return {True: "group", False: "none"}.get(get("scale_rewards"), get("scale_rewards"))


def _check_trl_algorithm(get, config: Any, shape: dict | None, bad: _Problems) -> None:
    """Adds every TRL setting outside the study's algorithm to ``bad``."""
    loss = get("loss_type")
    if get("num_iterations") != 1:
        bad.add("num_iterations", get("num_iterations"), "the study makes one pass over each collection")
    if loss not in ("grpo", "dapo"):
        bad.add("loss_type", loss, "the study defines 'grpo' (sequence-mean) and 'dapo' (token-mean) only")
    elif loss == "dapo" and shape and shape["num_steps_per_rollout"] != 1:
        bad.add(
            "loss_type",
            loss,
            "'dapo' divides each update by the generation's tokens / steps, which is the "
            "study's token-mean only with one update per generation",
        )
    scale = _trl_scale(get)
    if scale not in ("group", "none"):
        bad.add("scale_rewards", scale, "the study normalises by each group's std ('group') or not at all ('none')")
    beta = get("beta")
    if beta and get("use_bias_correction_kl"):
        bad.add("use_bias_correction_kl", True, "the study's k3 KL term is not weighted by the importance ratio")
    if beta and get("sync_ref_model"):
        bad.add("sync_ref_model", True, "the study's KL reference is the initial policy")
    scheduler = get("lr_scheduler_type")
    if scheduler not in ("constant", "constant_with_warmup"):
        bad.add("lr_scheduler_type", scheduler, "the study's learning rate is constant")
    if get("warmup_steps"):
        bad.add("warmup_steps", get("warmup_steps"), "the study's learning rate is constant from the first step")
    if isinstance(config, Mapping) and config.get("warmup_ratio"):
        bad.add("warmup_ratio", config["warmup_ratio"], "the study's learning rate is constant from the first step")
    if not str(get("optim")).startswith("adamw"):
        bad.add("optim", get("optim"), "the study's optimizer is AdamW")
    if get("adam_epsilon") != 1e-8:
        bad.add("adam_epsilon", get("adam_epsilon"), "the study's AdamW uses eps=1e-8")
    fixed = {
        "importance_sampling_level": "token",
        "delta": None,
        "mask_truncated_completions": False,
        "top_entropy_quantile": 1.0,
        "entropy_coef": 0.0,
        "use_adaptive_entropy": False,
        "off_policy_mask_threshold": None,
        "top_p": 1.0,
        "min_p": None,
        "repetition_penalty": 1.0,
    }
    for key, want in fixed.items():
        if get(key) != want:
            bad.add(key, get(key), f"the study's loss and sampling have no such setting (use {want!r})")
    if get("top_k") not in (0, None):
        bad.add("top_k", get("top_k"), "the study samples from the full distribution (use 0)")
    max_steps = get("max_steps")
    if shape and max_steps and max_steps > 0 and max_steps % shape["num_steps_per_rollout"]:
        bad.add("max_steps", max_steps, f"must be whole generations of {shape['num_steps_per_rollout']} steps")


# ---------------------------------------------------------------------------------------------------------------------
# verl
# ---------------------------------------------------------------------------------------------------------------------
def flatten(mapping: Mapping, prefix: str = "") -> dict[str, Any]:
    """A nested mapping (verl's YAML) as dotted keys; dotted keys pass through."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def to_verl(cfg: Any) -> dict[str, Any]:
    """verl PPO-trainer overrides (``key=value`` on its command line) that run ``cfg``'s algorithm.

    verl counts prompts: data.train_batch_size = P and ppo_mini_batch_size = B / G (its workers
    multiply it by rollout.n), so S = P / ppo_mini_batch_size updates per step.
    """
    batch = _verl_batch(cfg.rollout_batch_size, cfg.n_samples_per_prompt, cfg.global_batch_size, cfg.collections)
    return batch | {
        "algorithm.adv_estimator": "grpo",
        "algorithm.norm_adv_by_std_in_grpo": cfg.std_normalize_advantages,
        "algorithm.use_kl_in_reward": False,
        f"{_A}.clip_ratio_low": cfg.clip_low,
        f"{_A}.clip_ratio_high": cfg.clip_high,
        f"{_A}.clip_ratio_c": VERL_DUAL_CLIP_OFF,
        f"{_A}.loss_agg_mode": _VERL_AGG[cfg.loss_aggregation],
        f"{_A}.policy_loss.loss_mode": "vanilla",
        f"{_A}.use_kl_loss": cfg.kl_coef > 0,
        f"{_A}.kl_loss_coef": cfg.kl_coef,
        f"{_A}.kl_loss_type": "low_var_kl",
        f"{_A}.entropy_coeff": 0,
        f"{_A}.optim.lr": cfg.lr,
        f"{_A}.optim.betas": [cfg.adam_beta1, cfg.adam_beta2],
        f"{_A}.optim.weight_decay": cfg.weight_decay,
        f"{_A}.optim.lr_scheduler_type": "constant",
        f"{_A}.optim.lr_warmup_steps_ratio": 0.0,
        f"{_A}.optim.clip_grad": cfg.grad_clip,
        f"{_A}.grad_clip": cfg.grad_clip,
        "data.max_response_length": cfg.max_new_tokens,
        f"{_R}.temperature": cfg.temperature,
        f"{_R}.top_p": 1.0,
        f"{_R}.top_k": -1,
    }


def _verl_batch(p: int, g: int, b: int, collections: int | None) -> dict[str, Any]:
    """verl's batch keys for P, G, B (and trainer.total_training_steps when the number of collections is given)."""
    if b % g:
        bad = _Problems("run setting(s) verl cannot express")
        bad.add(
            "global_batch_size",
            b,
            f"verl's ppo_mini_batch_size counts prompts: B must hold whole groups of n_samples_per_prompt={g}",
        )
        bad.raise_any()
    out = {"data.train_batch_size": p, f"{_R}.n": g, f"{_A}.ppo_mini_batch_size": b // g, f"{_A}.ppo_epochs": 1}
    return out if collections is None else out | {"trainer.total_training_steps": collections}


def from_verl(config: Mapping) -> dict[str, Any]:
    """RunConfig field values from verl's PPO-trainer settings: dotted keys (as on its command line) or a nested
    mapping; missing keys take verl's defaults (so ``algorithm.adv_estimator`` must be set to ``grpo``).

    Raises :class:`UnrepresentableError` naming every key whose value the study cannot express.
    """
    values = flatten(config)

    def get(key: str) -> Any:
        return values.get(key, VERL_DEFAULTS[key])

    bad = _Problems("verl setting(s) the study cannot express")
    _check_verl(get, values, bad)
    bad.raise_any()
    p, g, mini = get("data.train_batch_size"), get(f"{_R}.n"), get(f"{_A}.ppo_mini_batch_size")
    agg, use_kl = get(f"{_A}.loss_agg_mode"), bool(get(f"{_A}.use_kl_loss"))
    betas = list(get(f"{_A}.optim.betas"))
    out = {
        "rollout_batch_size": p,
        "n_samples_per_prompt": g,
        "global_batch_size": mini * g,
        "num_steps_per_rollout": p // mini,
        "std_normalize_advantages": bool(get("algorithm.norm_adv_by_std_in_grpo")),
        "clip_low": _verl_clip(get, "low"),
        "clip_high": _verl_clip(get, "high"),
        "loss_aggregation": {v: k for k, v in _VERL_AGG.items()}[agg],
        "kl_coef": float(get(f"{_A}.kl_loss_coef")) if use_kl else 0.0,
        "lr": get(f"{_A}.optim.lr"),
        "adam_beta1": betas[0],
        "adam_beta2": betas[1],
        "weight_decay": get(f"{_A}.optim.weight_decay"),
        "grad_clip": values.get(f"{_A}.grad_clip", get(f"{_A}.optim.clip_grad")),
        "max_new_tokens": get("data.max_response_length"),
        "temperature": get(f"{_R}.temperature"),
    }
    steps = get("trainer.total_training_steps")
    if steps:
        out["response_budget"] = steps * p * g
    return out


def _check_verl(get, values: dict[str, Any], bad: _Problems) -> None:
    """Adds every verl setting outside the study's algorithm to ``bad``."""
    p, mini = get("data.train_batch_size"), get(f"{_A}.ppo_mini_batch_size")
    if p % mini:
        bad.add(
            f"{_A}.ppo_mini_batch_size",
            mini,
            f"must divide data.train_batch_size={p}: a step's prompts are cut into whole mini-batches",
        )
    if get(f"{_A}.ppo_epochs") != 1:
        bad.add(f"{_A}.ppo_epochs", get(f"{_A}.ppo_epochs"), "the study makes one pass over each collection")
    if get("algorithm.adv_estimator") != "grpo":
        bad.add("algorithm.adv_estimator", get("algorithm.adv_estimator"), "the study's advantages are GRPO's")
    if get(f"{_A}.clip_ratio_c") < math.exp(20):
        bad.add(
            f"{_A}.clip_ratio_c",
            get(f"{_A}.clip_ratio_c"),
            "verl's dual clip bounds negative-advantage losses at clip_ratio_c x |A|, the study's loss does not; "
            f"set it above e^20, e.g. {VERL_DUAL_CLIP_OFF:g}, to turn it off",
        )
    if get("algorithm.use_kl_in_reward"):
        bad.add("algorithm.use_kl_in_reward", True, "the study's KL is a loss term, not a reward penalty")
    agg = get(f"{_A}.loss_agg_mode")
    if agg not in _VERL_AGG.values():
        bad.add(f"{_A}.loss_agg_mode", agg, "the study defines seq-mean-token-mean (sequence-mean) and token-mean")
    use_kl = bool(get(f"{_A}.use_kl_loss"))
    if use_kl and get(f"{_A}.kl_loss_type") not in ("low_var_kl", "k3"):
        bad.add(f"{_A}.kl_loss_type", get(f"{_A}.kl_loss_type"), "the study's KL term is the k3 estimator")
    if get(f"{_A}.entropy_coeff"):
        bad.add(f"{_A}.entropy_coeff", get(f"{_A}.entropy_coeff"), "the study's loss has no entropy bonus")
    if get(f"{_A}.policy_loss.loss_mode") != "vanilla":
        bad.add(
            f"{_A}.policy_loss.loss_mode",
            get(f"{_A}.policy_loss.loss_mode"),
            "the study's loss is the clipped surrogate ('vanilla')",
        )
    for key in (f"{_A}.optim.lr_scheduler_type", f"{_A}.optim.warmup_style"):
        if get(key) not in ("constant", None):
            bad.add(key, get(key), "the study's learning rate is constant")
    if get(f"{_A}.optim.lr_warmup_steps_ratio") or (get(f"{_A}.optim.lr_warmup_steps") or 0) > 0:
        bad.add(
            f"{_A}.optim.lr_warmup_steps_ratio",
            get(f"{_A}.optim.lr_warmup_steps_ratio"),
            "the study's learning rate is constant from the first step (and lr_warmup_steps <= 0)",
        )
    if (
        f"{_A}.grad_clip" in values
        and f"{_A}.optim.clip_grad" in values
        and values[f"{_A}.grad_clip"] != values[f"{_A}.optim.clip_grad"]
    ):
        bad.add(f"{_A}.grad_clip", values[f"{_A}.grad_clip"], f"disagrees with {_A}.optim.clip_grad")
    if get(f"{_R}.top_p") != 1 or get(f"{_R}.top_k") not in (-1, 0):
        bad.add(
            f"{_R}.top_p/top_k",
            (get(f"{_R}.top_p"), get(f"{_R}.top_k")),
            "the study samples from the full distribution (top_p=1, top_k=-1)",
        )
    if not get(f"{_R}.do_sample"):
        bad.add(f"{_R}.do_sample", False, "the study samples its training responses")


def _verl_clip(get, side: str) -> float:
    """clip_ratio_low/high, each falling back to clip_ratio when null (core_algos.compute_policy_loss_vanilla)."""
    value = get(f"{_A}.clip_ratio_{side}")
    return value if value is not None else get(f"{_A}.clip_ratio")


def format_settings(settings: Mapping[str, Any], keys: tuple[str, ...] | None = None) -> str:
    """``key=value`` pairs separated by spaces (verl's command-line override syntax)."""

    def text(v: Any) -> str:
        return "[" + ",".join(map(text, v)) + "]" if isinstance(v, list) else str(v)

    return " ".join(f"{k}={text(settings[k])}" for k in (keys or tuple(settings)) if k in settings)


def shape_settings(plan: Any, response_budget: int | None = None) -> dict[str, dict[str, Any] | str]:
    """TRL's and verl's batch keys for a knob shape (a ``BatchPlan``), with the step count of a budget when given.

    A shape that one of them cannot express maps to the refusal's message instead of a dict.
    """
    p, g, b, s = plan.rollout_batch_size, plan.n_samples_per_prompt, plan.global_batch_size, plan.num_steps_per_rollout
    collections = plan.collections_for_budget(response_budget) if response_budget else None
    out: dict[str, dict[str, Any] | str] = {}
    for name, settings in (
        ("trl", lambda: _trl_batch(p, g, b, s, collections)),
        ("verl", lambda: _verl_batch(p, g, b, collections)),
    ):
        try:
            out[name] = settings()
        except UnrepresentableError as exc:
            out[name] = str(exc)
    return out

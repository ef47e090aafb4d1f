"""TRL and verl names: round trips for every study arm, refusals naming the key, the renamed concurrency cap."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from grpo_knobs import conventions, study
from grpo_knobs.config import RunConfig
from grpo_knobs.conventions import UnrepresentableError, from_trl, from_verl, to_trl
from grpo_knobs.records import RunDir, atomic_write_json

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted(p.stem for p in (ROOT / "lib" / "grpo_knobs" / "studies").glob("*.yaml"))


def _study_configs() -> list[RunConfig]:
    """Every run config of every preset, confirmation candidates included (one per arm, task and phase)."""
    out = {}
    for preset in PRESETS:
        for run in study.plan(preset).runs:
            for cfg in run.candidates if run.placeholder else (run.config,):
                out[(preset, cfg.phase, cfg.task, cfg.arm)] = cfg
    return list(out.values())


STUDY_CONFIGS = _study_configs()
IDS = [f"{c.study}:{c.phase}:{c.task}:{c.arm}" for c in STUDY_CONFIGS]


def _rest(cfg: RunConfig, covered: dict) -> dict:
    """The run's fields that the peer's settings do not hold."""
    return {k: v for k, v in cfg.to_dict().items() if k not in covered}


def _trl_grpo_config():
    """TRL's own GRPOConfig class, when trl==1.16.0 is installed (pip install --no-deps trl==1.16.0)."""
    grpo_config = pytest.importorskip(
        "trl.trainer.grpo_config",
        reason="trl is not installed: the GRPOConfig checks are skipped (pip install --no-deps trl==1.16.0)",
    )
    import trl

    if trl.__version__ != conventions.TRL_VERSION:
        pytest.skip(f"trl {trl.__version__} installed; these checks are for trl=={conventions.TRL_VERSION}")
    return grpo_config.GRPOConfig


def _grpo_config(cls, tmp_path, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' FutureWarnings about renamed TrainingArguments
        try:
            return cls(output_dir=str(tmp_path), report_to=[], use_cpu=True, bf16=False, **kwargs)
        except ImportError as exc:  # TrainingArguments needs accelerate
            pytest.skip(f"GRPOConfig cannot be built here: {exc}")


def test_every_preset_is_covered():
    assert {c.study for c in STUDY_CONFIGS} == {"smoke", "h200-mini", "paper", "seeds20"}
    assert len(STUDY_CONFIGS) > 30


@pytest.mark.parametrize("cfg", STUDY_CONFIGS, ids=IDS)
def test_trl_round_trip(cfg):
    settings = cfg.to_trl()
    back = from_trl(settings)
    # the four knobs, the budget and the algorithm's settings all come back from TRL's names alone
    assert {
        "rollout_batch_size",
        "n_samples_per_prompt",
        "global_batch_size",
        "num_steps_per_rollout",
        "response_budget",
        "clip_low",
        "clip_high",
        "std_normalize_advantages",
        "loss_aggregation",
        "kl_coef",
        "lr",
        "max_new_tokens",
        "temperature",
    } <= set(back)
    assert RunConfig.from_trl(settings, **_rest(cfg, back)) == cfg
    p, g, b, s = cfg.rollout_batch_size, cfg.n_samples_per_prompt, cfg.global_batch_size, cfg.num_steps_per_rollout
    assert settings["generation_batch_size"] == p * g  # TRL's generation_batch_size is a collection, P x G
    assert settings["max_steps"] == cfg.collections * s  # optimizer steps
    for procs, accum in ((2, 1), (1, 4), (2, 2)):
        if b % (procs * accum) == 0:
            split = to_trl(cfg, num_processes=procs, gradient_accumulation_steps=accum)
            assert split["per_device_train_batch_size"] * procs * accum == b
            assert from_trl(split, num_processes=procs) == back


@pytest.mark.parametrize("cfg", STUDY_CONFIGS, ids=IDS)
def test_verl_round_trip(cfg):
    settings = cfg.to_verl()
    back = from_verl(settings)
    assert RunConfig.from_verl(settings, **_rest(cfg, back)) == cfg
    assert settings["data.train_batch_size"] == cfg.rollout_batch_size  # verl counts prompts
    assert settings["actor_rollout_ref.actor.ppo_mini_batch_size"] * cfg.n_samples_per_prompt == cfg.global_batch_size
    nested: dict = {}
    for key, value in settings.items():  # the same settings as verl's YAML nests them
        *parents, leaf = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    assert from_verl(nested) == back


def test_real_grpo_config_from_to_trl(tmp_path):
    grpo_config = _trl_grpo_config()
    shapes = {(c.rollout_batch_size, c.n_samples_per_prompt, c.global_batch_size): c for c in STUDY_CONFIGS}
    for cfg in shapes.values():
        for accum in (1, 2):
            real = _grpo_config(grpo_config, tmp_path, **to_trl(cfg, gradient_accumulation_steps=accum))
            # TRL's own __post_init__ derives the same S: steps_per_generation micro-steps, accum per update
            assert real.steps_per_generation == cfg.num_steps_per_rollout * accum
            assert real.generation_batch_size == cfg.rollout_batch_size * cfg.n_samples_per_prompt
            assert RunConfig.from_trl(real, **_rest(cfg, from_trl(real))) == cfg
    refused = _grpo_config(grpo_config, tmp_path, **(to_trl(STUDY_CONFIGS[0]) | {"num_iterations": 2}))
    with pytest.raises(UnrepresentableError, match="num_iterations=2"):
        RunConfig.from_trl(refused)


def test_trl_defaults_are_grpo_configs_own(tmp_path):
    """The defaults a mapping's missing keys take are those of trl 1.16.0's GRPOConfig."""
    real = _grpo_config(_trl_grpo_config(), tmp_path)
    for key, value in conventions.TRL_DEFAULTS.items():
        if key in ("generation_batch_size", "steps_per_generation", "bf16"):
            continue  # resolved by __post_init__ (checked above)
        assert conventions._plain(getattr(real, key)) == value, key


TRL_REFUSALS = [
    ({"num_iterations": 2}, "num_iterations=2"),
    ({"scale_rewards": "batch"}, "scale_rewards='batch'"),
    *[({"loss_type": t}, f"loss_type='{t}'") for t in ("dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo")],
    ({"loss_type": "dapo", "steps_per_generation": 2}, "loss_type='dapo'"),
    ({"lr_scheduler_type": "cosine"}, "lr_scheduler_type='cosine'"),
    ({"warmup_steps": 10}, "warmup_steps=10"),
    ({"beta": 0.04, "use_bias_correction_kl": True}, "use_bias_correction_kl=True"),
    ({"importance_sampling_level": "sequence"}, "importance_sampling_level='sequence'"),
    ({"mask_truncated_completions": True}, "mask_truncated_completions=True"),
    ({"delta": 2.0}, "delta=2.0"),
    ({"top_p": 0.9}, "top_p=0.9"),
    ({"top_k": 50}, "top_k=50"),
    ({"entropy_coef": 0.01}, "entropy_coef=0.01"),
    ({"gradient_accumulation_steps": 2, "steps_per_generation": 3}, "steps_per_generation=3"),
    (
        {"generation_batch_size": 36, "num_generations": 8, "per_device_train_batch_size": 4},
        "generation_batch_size=36",
    ),
    ({"generation_batch_size": 64, "steps_per_generation": 3}, "generation_batch_size=64"),
    ({"max_steps": 5, "steps_per_generation": 2}, "max_steps=5"),
]


@pytest.mark.parametrize("change,key", TRL_REFUSALS, ids=[k for _, k in TRL_REFUSALS])
def test_trl_refuses_what_the_study_cannot_express(change, key):
    settings = STUDY_CONFIGS[0].to_trl()
    settings.pop("generation_batch_size") if "steps_per_generation" in change else None
    with pytest.raises(UnrepresentableError, match=f"^TRL setting.*{_re(key)}"):
        from_trl(settings | change)


def test_trl_refusal_names_every_key():
    with pytest.raises(UnrepresentableError) as err:
        from_trl(STUDY_CONFIGS[0].to_trl() | {"num_iterations": 4, "scale_rewards": "batch", "loss_type": "bnpo"})
    assert all(k in str(err.value) for k in ("num_iterations=4", "scale_rewards='batch'", "loss_type='bnpo'"))


_V = "actor_rollout_ref.actor"
VERL_REFUSALS = [
    ({f"{_V}.ppo_epochs": 2}, f"{_V}.ppo_epochs=2"),
    ({"algorithm.adv_estimator": "gae"}, "algorithm.adv_estimator='gae'"),
    ({f"{_V}.loss_agg_mode": "seq-mean-token-sum"}, f"{_V}.loss_agg_mode='seq-mean-token-sum'"),
    ({f"{_V}.loss_agg_mode": "seq-mean-token-sum-norm"}, f"{_V}.loss_agg_mode='seq-mean-token-sum-norm'"),
    ({"algorithm.use_kl_in_reward": True}, "algorithm.use_kl_in_reward=True"),
    ({f"{_V}.use_kl_loss": True, f"{_V}.kl_loss_type": "mse"}, f"{_V}.kl_loss_type='mse'"),
    ({f"{_V}.entropy_coeff": 0.001}, f"{_V}.entropy_coeff=0.001"),
    ({f"{_V}.policy_loss.loss_mode": "gspo"}, f"{_V}.policy_loss.loss_mode='gspo'"),
    ({f"{_V}.optim.lr_scheduler_type": "cosine"}, f"{_V}.optim.lr_scheduler_type='cosine'"),
    ({f"{_V}.optim.lr_warmup_steps_ratio": 0.1}, f"{_V}.optim.lr_warmup_steps_ratio=0.1"),
    ({f"{_V}.ppo_mini_batch_size": 5}, f"{_V}.ppo_mini_batch_size=5"),
    ({f"{_V}.clip_ratio_c": 3.0}, f"{_V}.clip_ratio_c=3.0"),
    ({"actor_rollout_ref.rollout.top_p": 0.9}, "actor_rollout_ref.rollout.top_p/top_k"),
]


@pytest.mark.parametrize("change,key", VERL_REFUSALS, ids=[k for _, k in VERL_REFUSALS])
def test_verl_refuses_what_the_study_cannot_express(change, key):
    with pytest.raises(UnrepresentableError, match=f"^verl setting.*{_re(key)}"):
        from_verl(STUDY_CONFIGS[0].to_verl() | change)


def test_verl_defaults_are_refused_until_grpo_is_chosen():
    with pytest.raises(UnrepresentableError, match="adv_estimator='gae'.*clip_ratio_c=3.0"):
        RunConfig.from_verl({})
    # verl's own defaults otherwise: 1024 prompts, n=1 ... and ppo_mini_batch_size counts prompts
    got = from_verl(
        {
            "algorithm.adv_estimator": "grpo",
            "actor_rollout_ref.rollout.n": 8,
            "actor_rollout_ref.actor.clip_ratio_c": 1e9,
        }
    )
    assert (got["rollout_batch_size"], got["global_batch_size"], got["num_steps_per_rollout"]) == (1024, 2048, 4)
    assert got["loss_aggregation"] == "token-mean" and got["kl_coef"] == 0.0


def test_to_trl_and_to_verl_refuse_what_they_cannot_express():
    uneven = RunConfig(
        rollout_batch_size=3, n_samples_per_prompt=4, global_batch_size=6, response_budget=12, eval_every_responses=12
    )
    with pytest.raises(UnrepresentableError, match="global_batch_size=6"):
        uneven.to_verl()  # B=6 is not whole groups of G=4: verl's mini-batch counts prompts
    with pytest.raises(UnrepresentableError, match="global_batch_size=6"):
        uneven.to_trl(num_processes=4)
    token_mean = RunConfig(
        **(
            STUDY_CONFIGS[0].to_dict()
            | {
                "loss_aggregation": "token-mean",
                "num_steps_per_rollout": 2,
                "global_batch_size": STUDY_CONFIGS[0].global_batch_size // 2,
            }
        )
    )
    with pytest.raises(UnrepresentableError, match="loss_aggregation='token-mean'"):
        token_mean.to_trl()
    assert from_verl(token_mean.to_verl())["loss_aggregation"] == "token-mean"


def test_dr_grpo_and_kl_round_trip():
    """Dr. GRPO (no std normalisation), token-mean at S=1 and a KL term have names on both sides."""
    base = STUDY_CONFIGS[0].to_dict()
    cfg = RunConfig(**(base | {"std_normalize_advantages": False, "loss_aggregation": "token-mean", "kl_coef": 0.04}))
    assert cfg.num_steps_per_rollout == 1
    trl, verl = cfg.to_trl(), cfg.to_verl()
    assert (trl["scale_rewards"], trl["loss_type"], trl["beta"]) == ("none", "dapo", 0.04)
    assert verl["algorithm.norm_adv_by_std_in_grpo"] is False and verl["actor_rollout_ref.actor.use_kl_loss"] is True
    assert RunConfig.from_trl(trl, **_rest(cfg, from_trl(trl))) == cfg
    assert RunConfig.from_verl(verl, **_rest(cfg, from_verl(verl))) == cfg


def _re(text: str) -> str:
    import re

    return re.escape(text)


# ----------------------------------------------------------------------------- the renamed concurrency cap
def test_generation_batch_size_is_a_deprecated_alias(tmp_path):
    with pytest.warns(DeprecationWarning, match="generation_batch_size is deprecated; use max_concurrent_sequences"):
        cfg = RunConfig.from_dict({"generation_batch_size": 64})
    assert cfg.max_concurrent_sequences == 64 and "generation_batch_size" not in cfg.to_dict()
    with pytest.raises(ValueError, match="set only 'max_concurrent_sequences'"):
        RunConfig.from_dict({"generation_batch_size": 64, "max_concurrent_sequences": 32})
    (tmp_path / "run.yaml").write_text("generation_batch_size: 48\n")
    with pytest.warns(DeprecationWarning):
        assert RunConfig.from_yaml(tmp_path / "run.yaml").max_concurrent_sequences == 48
    # papermill injects the old name after the parameters cell, which holds the new name's default
    with pytest.warns(DeprecationWarning):
        cfg = RunConfig.from_parameters(
            {"max_concurrent_sequences": 512, "generation_batch_size": 16, "seed": 3, "In": [], "cfg": None}
        )
    assert (cfg.max_concurrent_sequences, cfg.seed) == (16, 3)


def test_recorded_configs_with_the_old_name_still_load():
    recorded = sorted((ROOT / "results" / "h200-mini").glob("screening-*/config.json"))
    assert recorded
    for path in recorded:
        values = json.loads(path.read_text())["config"]
        assert "generation_batch_size" in values
        with pytest.warns(DeprecationWarning):
            cfg = RunConfig.from_dict(values)
        assert cfg.max_concurrent_sequences == values["generation_batch_size"]


def test_config_drift_reads_the_old_name(tmp_path):
    from grpo_knobs.study.run import _config_drift

    cfg = RunConfig(output_dir=str(tmp_path), run_id="r", max_concurrent_sequences=256)
    record = cfg.to_dict()
    record["generation_batch_size"] = record.pop("max_concurrent_sequences")
    atomic_write_json(RunDir(cfg.run_dir).config_path, {"config": record})
    assert _config_drift(cfg) == []
    record["generation_batch_size"] = 512
    atomic_write_json(RunDir(cfg.run_dir).config_path, {"config": record})
    assert _config_drift(cfg) == ["max_concurrent_sequences: recorded 512, now 256"]


def test_no_file_uses_the_old_name_outside_records():
    hits = []
    for folder in ("lib", "benchmarks", "docs"):
        for path in (ROOT / folder).rglob("*"):
            if (
                path.is_file()
                and path.suffix in (".py", ".ipynb", ".yaml", ".md")
                and "generation_batch_size" in path.read_text(errors="ignore")
            ):
                hits.append(str(path.relative_to(ROOT)))
    # the mapping to TRL and the TRL peer benchmark name TRL's key, the config keeps the alias, and the
    # field's help (in the generated parameters cell) warns that TRL's key means something else
    assert sorted(hits) == [
        "benchmarks/peers/trl_grpo.py",
        "docs/conventions.md",
        "lib/grpo_knobs/config.py",
        "lib/grpo_knobs/conventions.py",
        "lib/grpo_knobs/notebooks/10_train.ipynb",
    ]


# ----------------------------------------------------------------------------- grpo-knobs knobs
def test_knobs_prints_trl_and_verl_settings():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_knobs.cli",
            "knobs",
            "--rollout-batch-size",
            "64",
            "--n-samples-per-prompt",
            "8",
            "--global-batch-size",
            "128",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out[0] == "P=64 prompts x G=8 samples = 512 responses per collection, consumed as S=4 updates of B=128"
    trl = next(line for line in out if line.startswith("TRL"))
    verl = next(line for line in out if line.startswith("verl"))
    assert "num_generations=8 generation_batch_size=512 per_device_train_batch_size=128" in trl
    assert "gradient_accumulation_steps=1 num_iterations=1" in trl
    assert (
        "data.train_batch_size=64 actor_rollout_ref.rollout.n=8 actor_rollout_ref.actor.ppo_mini_batch_size=16 "
        "actor_rollout_ref.actor.ppo_epochs=1"
    ) in verl

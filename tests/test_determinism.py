"""Deterministic mode on CPU: identical reruns by `grpo-knobs compare-runs`, keyed sampling noise, the digest."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from grpo_knobs.config import RunConfig, config_drift
from grpo_knobs.determinism import compare_runs, content_digest, first_difference
from grpo_knobs.models import load_model
from grpo_knobs.records import RunDir
from grpo_knobs.rollout import kernels as K
from grpo_knobs.rollout.hf import HFEngine, keyed_sample_tokens, response_keys
from grpo_knobs.rollout.sglang import engine_options
from grpo_knobs.runtime import CUBLAS_WORKSPACE_ENV, deterministic_mode

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "task=countdown-2x10",
    "model=tiny-random",
    "rollout_batch_size=4",
    "n_samples_per_prompt=4",
    "global_batch_size=8",
    "response_budget=48",
    "eval_every_responses=32",
    "eval_problems=4",
    "max_new_tokens=8",
    "lr=1e-2",
    "temperature=1.5",
    "max_tokens_per_micro_batch=64",
    "device=cpu",
    "deterministic=true",
]


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib")}
    return subprocess.run(
        [sys.executable, "-m", "grpo_knobs.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )


def train(tmp: Path, run_id: str, *params: str) -> Path:
    args = [f"-p{p}" for p in (*TINY, f"output_dir={tmp / 'study'}", f"run_id={run_id}", *params)]
    proc = cli("train", "--no-progress", *args, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return tmp / "study" / run_id


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory):
    """Two runs of seed 3 and one of seed 4, all deterministic, through the CLI in fresh processes."""
    tmp = tmp_path_factory.mktemp("det")
    return tmp, train(tmp, "a", "seed=3"), train(tmp, "b", "seed=3"), train(tmp, "c", "seed=4")


def test_two_runs_of_one_seed_are_identical_by_compare_runs(three_runs):
    tmp, a, b, _ = three_runs
    proc = cli("compare-runs", str(a), str(b), cwd=tmp)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "identical: 3 collections" in proc.stdout and "final weights" in proc.stdout
    digest_a, digest_b = (json.loads((r / "digest.json").read_text()) for r in (a, b))
    assert digest_a["deterministic"] is True and digest_a["sha256"] == digest_b["sha256"]
    assert digest_a["sha256"]["weights"] is not None
    # the digest recomputed from the records matches what the run wrote at its end
    assert content_digest(RunDir(a), digest_a["sha256"]["weights"]) == digest_a["sha256"]
    record = json.loads((a / "config.json").read_text())["determinism"]
    assert record["deterministic"] and record["sampling_noise"] == "keyed per response"
    assert record["settings"]["torch_deterministic_algorithms"] and record["settings"][CUBLAS_WORKSPACE_ENV]


def test_compare_runs_names_where_two_seeds_part(three_runs):
    tmp, a, _, c = three_runs
    proc = cli("compare-runs", str(a), str(c), cwd=tmp)
    assert proc.returncode == 1, proc.stderr
    assert "configs differ: seed: 3 (A) vs 4 (B)" in proc.stdout
    assert "differ: first at collection 0, field " in proc.stdout
    assert "reward_mean, last 4 collections" in proc.stdout and "last validation" in proc.stdout
    proc = cli("compare-runs", "--json", str(a), str(c), cwd=tmp)
    report = json.loads(proc.stdout)
    assert report["identical"] is False and report["collections"]["first_difference"]["collection"] == 0
    assert report["collections"]["rows"] == [3, 3]


def test_compare_runs_finds_one_changed_value_and_a_missing_row(three_runs, tmp_path):
    _, a, b, _ = three_runs
    copy = tmp_path / "b"
    subprocess.run(["cp", "-r", str(b), str(copy)], check=True)
    lines = (copy / "collections.jsonl").read_text().splitlines()
    row = json.loads(lines[1])
    row["per_update"][1]["grad_norm"] += 1e-9
    row["seconds"]["generation"] += 5.0  # clock fields never count
    (copy / "collections.jsonl").write_text("\n".join([lines[0], json.dumps(row), lines[2]]) + "\n")
    c = compare_runs(a, copy)
    assert not c.identical
    assert (c.collections.collection, c.collections.field) == (1, "per_update[1].grad_norm")
    (copy / "collections.jsonl").write_text("\n".join(lines[:2]) + "\n")
    c = compare_runs(a, copy)
    assert (c.collections.collection, c.collections.field, c.rows) == (2, "rows", (3, 2))


def test_compare_runs_refuses_a_folder_that_is_no_run(tmp_path, three_runs):
    _, a, _, _ = three_runs
    proc = cli("compare-runs", str(a), str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2 and "not a run directory" in proc.stderr and "Traceback" not in proc.stderr


def test_first_difference_paths():
    assert first_difference({"a": [1, {"b": 2.0}]}, {"a": [1, {"b": 2.0}]}) is None
    assert first_difference({"a": [1, {"b": 2.0}]}, {"a": [1, {"b": 2.5}]}) == ("a[1].b", 2.0, 2.5)
    assert first_difference({"a": [1]}, {"a": [1, 2]}) == ("a (length)", 1, 2)
    assert (
        first_difference({"reward_mean": 1, "collection": 0}, {"reward_mean": 2, "collection": 1})[0] == "collection"
    )


# ------------------------------------------------------------------------------------------ keyed sampling
def test_response_keys_depend_on_seed_prompt_and_sample_only():
    keys = response_keys(7, 3, 2)  # [6], prompt-major
    assert keys.dtype == torch.int64 and len(set(keys.tolist())) == 6
    assert torch.equal(response_keys(7, 5, 2)[:6], keys)  # more prompts after: the first ones keep their keys
    assert torch.equal(response_keys(7, 1, 2), keys[:2])
    assert not set(response_keys(8, 3, 2).tolist()) & set(keys.tolist())


@pytest.mark.parametrize(
    "sampler",
    [
        "host",
        pytest.param(
            "kernel",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="compiled on a GPU: test_determinism_cuda.py"),
        ),
    ],
)
def test_keyed_noise_follows_the_response_not_its_row(sampler):
    """The same logits and key give the same token in any row, in a batch of any size; another key or step
    gives other draws."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 40, generator=g)  # [B, V]
    keys = response_keys(3, 6, 1)
    inv_t = torch.ones(1)

    def draw(rows: torch.Tensor, step: int, k: torch.Tensor | None = None) -> torch.Tensor:
        k = keys[rows] if k is None else k
        if sampler == "host":
            return keyed_sample_tokens(logits[rows], inv_t, k, step, greedy=False)[0]
        tok, lp = torch.empty(len(rows), dtype=torch.long), torch.empty(len(rows))
        K.sample(logits[rows].contiguous(), inv_t, k.contiguous(), torch.tensor([step]), False, tok, lp, block=16)
        return tok

    all_rows = torch.arange(6)
    base = draw(all_rows, 5)
    perm = torch.tensor([4, 0, 5, 2, 1, 3])
    assert torch.equal(draw(perm, 5), base[perm])  # rows moved: each response keeps its draw
    assert torch.equal(draw(torch.tensor([2]), 5), base[2:3])  # alone
    draws = torch.stack([draw(all_rows, s) for s in range(20)])  # [steps, B]
    assert (draws != base).any(dim=0).all()  # other steps draw anew
    rekeyed = torch.stack([draw(all_rows, s, keys.flip(0)) for s in range(20)])
    assert not torch.equal(rekeyed, draws)


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer, _ = load_model("tiny-random")
    texts = ["The cat sat", "Seven plus five equals twelve, and eight", "A", "Dogs bark at night"]
    return model, tokenizer, [tokenizer(t, add_special_tokens=False).input_ids for t in texts]


FUSED = pytest.param("fused", marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path"))


@pytest.mark.parametrize("fast", [False, True, FUSED])
def test_keyed_generation_ignores_batch_rows_chunks_and_compaction(tiny, fast):
    """A response depends on (seed, prompt position, sample index): not on the prompts after it, how rows are
    chunked by max_batch_size, or whether finished rows are dropped. (On this CPU stack the tiny model's
    logits round alike in each layout; the draws are equal by construction.)"""
    model, tokenizer, prompts = tiny
    kw = dict(n=3, max_new_tokens=10, temperature=1.0, seed=21)
    whole = HFEngine(model, tokenizer, fast=fast, keyed_sampling=True).generate(prompts, **kw)
    first = HFEngine(model, tokenizer, fast=fast, keyed_sampling=True).generate(prompts[:1], **kw)
    chunked = HFEngine(model, tokenizer, fast=fast, keyed_sampling=True, max_batch_size=2).generate(prompts, **kw)
    assert first.token_ids == whole.token_ids[:3]
    assert chunked.token_ids == whole.token_ids
    assert len({tuple(t) for t in whole.token_ids[:3]}) == 3  # the samples of one prompt differ
    assert (
        whole.token_ids
        != HFEngine(model, tokenizer, fast=fast, keyed_sampling=True)
        .generate(prompts, **(kw | {"seed": 22}))
        .token_ids
    )
    if fast:
        compacting = HFEngine(model, tokenizer, fast=fast, keyed_sampling=True, compact=True)
        compacting.decoder.check_every, compacting.decoder.min_rows = 1, 1
        assert compacting.generate(prompts, **kw).token_ids == whole.token_ids


def test_keyed_eager_generation_is_the_fast_paths_draw(tiny):
    """On the host, generate (keyed) and the static decoder (keyed) draw the same noise: with the same logits
    they pick the same tokens."""
    model, tokenizer, prompts = tiny
    kw = dict(n=2, max_new_tokens=8, temperature=0.8, seed=5)
    eager = HFEngine(model, tokenizer, fast=False, keyed_sampling=True, return_logprobs=True).generate(prompts, **kw)
    fast = HFEngine(model, tokenizer, fast=True, keyed_sampling=True, return_logprobs=True).generate(prompts, **kw)
    assert eager.token_ids == fast.token_ids
    for a, b in zip(eager.logprobs, fast.logprobs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-4, rtol=0)


# ------------------------------------------------------------------------------------------ settings
def test_deterministic_mode_sets_and_restores_torch():
    before = (torch.are_deterministic_algorithms_enabled(), os.environ.get(CUBLAS_WORKSPACE_ENV))
    with deterministic_mode(True) as settings:
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ[CUBLAS_WORKSPACE_ENV] in (":4096:8", ":16:8")
        assert settings["torch_deterministic_algorithms"]
    assert (torch.are_deterministic_algorithms_enabled(), os.environ.get(CUBLAS_WORKSPACE_ENV)) == before
    with deterministic_mode(False) as settings:
        assert settings == {} and torch.are_deterministic_algorithms_enabled() == before[0]


def test_sglang_deterministic_follows_deterministic_unless_set():
    base = dict(engine="sglang", run_id="x")
    assert engine_options(RunConfig(**base))["server"].deterministic is False
    assert engine_options(RunConfig(**base, deterministic=True))["server"].deterministic is True
    assert (
        engine_options(RunConfig(**base, deterministic=True, sglang_deterministic=False))["server"].deterministic
        is False
    )
    assert engine_options(RunConfig(**base, sglang_deterministic=True))["server"].deterministic is True
    # runs recorded before the field followed anything resume as they ran
    recorded = RunConfig(**base).to_dict() | {"sglang_deterministic": False}
    recorded.pop("deterministic")
    assert config_drift(recorded, RunConfig(**base)) == []
    assert config_drift(RunConfig(**base).to_dict(), RunConfig(**base, deterministic=True)) == [
        "deterministic: recorded False, now True",
        "sglang_deterministic: recorded False, now True",
    ]


def test_trl_names_deterministic_full_determinism():
    cfg = RunConfig(deterministic=True)
    assert cfg.to_trl()["full_determinism"] is True
    assert RunConfig.from_trl(cfg.to_trl(), task=cfg.task).deterministic is True


def test_rerun_trains_a_recorded_run_again_and_compares_the_two(three_runs, tmp_path):
    """`grpo-knobs rerun` retrains a run from its config.json elsewhere and says it is identical (exit 0); it
    never writes over the rerun or into the run itself, and refuses a run recorded from other library source
    unless told to train anyway."""
    tmp, a, _, _ = three_runs
    out = tmp_path / "reruns"
    proc = cli("rerun", str(a), "--out", str(out), "--no-progress", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "identical: 3 collections" in proc.stdout and (out / "a" / "digest.json").exists()
    again = cli("rerun", str(a), "--out", str(out), cwd=tmp_path)
    assert again.returncode == 2 and "already exists and is never overwritten; pass --resume" in again.stderr
    itself = cli("rerun", str(a), "--out", str(a.parent), cwd=tmp_path)
    assert itself.returncode == 2 and "itself; pass another --out" in itself.stderr

    other = tmp_path / "other" / "a"
    other.parent.mkdir()
    subprocess.run(["cp", "-r", str(a), str(other.parent)], check=True)
    meta = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(meta | {"source_sha256": "0" * 64}))
    refused = cli("rerun", str(other), "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.strip().count("\n") == 0
    assert "ran library source 000000000000" in refused.stderr and "--other-source" in refused.stderr
    forced = cli("rerun", str(other), "--out", str(tmp_path / "o"), "--other-source", "--no-progress", cwd=tmp_path)
    assert forced.returncode == 0 and "identical" in forced.stdout  # the same code after all

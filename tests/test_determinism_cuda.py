"""Deterministic mode on CUDA: the keyed sampler compiled, and every trainer backend's update reproduced bit for bit.

Skipped without a GPU. The trainer tests load SmolLM2-135M-Instruct (set GRPO_KNOBS_GGUF or have it cached)
and print, beside each assertion, whether default mode reproduced the same update, so the log shows what
deterministic mode changes.
"""

import pytest
import torch
from grpo_knobs.config import RunConfig
from grpo_knobs.determinism import weights_sha256
from grpo_knobs.rollout import kernels as K
from grpo_knobs.rollout.hf import response_keys
from grpo_knobs.runtime import deterministic_mode
from grpo_knobs.trainer import Trainer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_keyed_sampler_on_cuda_follows_the_response_not_its_row():
    g = torch.Generator("cuda").manual_seed(0)
    logits = torch.randn(300, 49152, generator=g, device="cuda").bfloat16()  # [B, V]
    keys = response_keys(9, 300, 1).cuda()
    inv_t, step = torch.ones(1, device="cuda"), torch.tensor([17], device="cuda")

    def draw(rows):
        tok = torch.empty(len(rows), dtype=torch.long, device="cuda")
        K.sample(
            logits[rows].contiguous(),
            inv_t,
            keys[rows].contiguous(),
            step,
            False,
            tok,
            torch.empty_like(tok, dtype=torch.float32),
        )
        return tok

    base = draw(torch.arange(300, device="cuda"))
    perm = torch.randperm(300, generator=g, device="cuda")
    assert torch.equal(draw(perm), base[perm])
    assert torch.equal(draw(torch.tensor([42], device="cuda")), base[42:43])
    assert torch.equal(draw(torch.arange(300, device="cuda")), base)  # and again: the kernel is deterministic


def one_update(trainer_path: str, deterministic: bool, tmp_path) -> tuple[list, str, list]:
    """A fresh trainer's first collection and its S updates: (tokens, weights sha256, update records)."""
    cfg = RunConfig(
        task="countdown-2x10",
        rollout_batch_size=32,
        n_samples_per_prompt=8,
        global_batch_size=128,
        lr=2e-5,
        max_new_tokens=128,
        response_budget=256,
        eval_every_responses=256,
        trainer_path=trainer_path,
        deterministic=deterministic,
        device="cuda",
        output_dir=str(tmp_path),
        run_id=f"{trainer_path}-{deterministic}",
    )
    trainer = Trainer(cfg, progress=False)
    with deterministic_mode(deterministic):
        trainer.setup()
        batch = trainer.collect(0)
        updates, _ = trainer.train_on_collection(batch)
        torch.cuda.synchronize()
        return batch.generation.token_ids, weights_sha256(trainer.model), updates


@pytest.mark.slow
@pytest.mark.parametrize("trainer_path", ["padded", "packed", "packed-liger", "packed-compiled"])
def test_trainer_backends_reproduce_their_update_bit_for_bit(trainer_path, tmp_path):
    if trainer_path == "packed-liger":
        pytest.importorskip("liger_kernel")
    runs = [one_update(trainer_path, True, tmp_path) for _ in range(2)]
    default = [one_update(trainer_path, False, tmp_path) for _ in range(2)]
    print(
        f"\n{trainer_path}: default mode reproduced its update: {default[0][1] == default[1][1]} "
        f"(grad norms {[u['grad_norm'] for u in default[0][2]]} vs {[u['grad_norm'] for u in default[1][2]]})"
    )
    assert runs[0][0] == runs[1][0]  # the same responses (decode is deterministic with a fixed batch)
    assert runs[0][2] == runs[1][2]  # every update statistic
    assert runs[0][1] == runs[1][1]  # and the weights after the updates

"""GRPO maths: advantages, clipped surrogate, aggregation and micro-batch invariance."""

import math

import pytest
import torch
from grpo_knobs.grpo import (
    clipped_surrogate_loss,
    collate,
    group_advantages,
    mixed_group_fraction,
    pack_micro_batches,
    token_logprobs,
)
from tiny import random_sequences, tiny_llama


def test_advantages_use_bessel_std_and_zero_equal_groups():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    a = group_advantages(r, 4)
    mean, std = 0.25, math.sqrt(((0.75**2) + 3 * 0.25**2) / 3)  # sample std
    assert a[0].item() == pytest.approx((1.0 - mean) / (std + 1e-6))
    assert a[1].item() == pytest.approx((0.0 - mean) / (std + 1e-6))
    assert torch.equal(a[4:], torch.zeros(4))  # all-equal group contributes exactly zero
    assert a[:4].sum().item() == pytest.approx(0.0, abs=1e-6)


def test_dr_grpo_option_only_centres():
    a = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, std_normalize=False)
    assert a.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_mixed_group_fraction_counts_groups_with_unequal_rewards():
    r = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    assert mixed_group_fraction(r, 2) == pytest.approx(0.5)


def test_packing_respects_token_budget_and_covers_every_index_once():
    lengths = [5, 40, 12, 33, 7, 90, 3, 64]
    mbs = pack_micro_batches(lengths, max_tokens=100)
    assert sorted(i for mb in mbs for i in mb) == list(range(len(lengths)))
    for mb in mbs:
        assert len(mb) == 1 or len(mb) * max(lengths[i] for i in mb) <= 100
    assert pack_micro_batches(lengths, micro_batch_size=3) == [[0, 1, 2], [3, 4, 5], [6, 7]]


def test_clip_is_asymmetric():
    old = torch.zeros(1, 4)
    mask = torch.ones(1, 4)
    # ratios 0.5, 0.9, 1.2, 1.5 against positive advantage: only the high side can clip (> 1.28)
    logp = torch.log(torch.tensor([[0.5, 0.9, 1.2, 1.5]]))
    t = clipped_surrogate_loss(
        logp,
        old,
        torch.tensor([1.0]),
        mask,
        clip_low=0.2,
        clip_high=0.28,
        aggregation="sequence-mean",
        global_batch_size=1,
        global_batch_tokens=4,
    )
    assert t.clipped_high == 1 and t.clipped_low == 0
    assert t.loss.item() == pytest.approx(-(0.5 + 0.9 + 1.2 + 1.28) / 4)
    t = clipped_surrogate_loss(
        logp,
        old,
        torch.tensor([-1.0]),
        mask,
        clip_low=0.2,
        clip_high=0.28,
        aggregation="sequence-mean",
        global_batch_size=1,
        global_batch_tokens=4,
    )
    assert t.clipped_low == 1 and t.clipped_high == 0  # 0.5 < 0.8 with negative advantage
    assert t.loss.item() == pytest.approx((0.8 + 0.9 + 1.2 + 1.5) / 4)


def test_sequence_mean_and_token_mean_differ_as_defined():
    logp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([1.0, 1.0])
    seq = clipped_surrogate_loss(
        logp,
        torch.zeros(2, 3),
        adv,
        mask,
        clip_low=0.2,
        clip_high=0.28,
        aggregation="sequence-mean",
        global_batch_size=2,
        global_batch_tokens=4,
    )
    tok = clipped_surrogate_loss(
        logp,
        torch.zeros(2, 3),
        adv,
        mask,
        clip_low=0.2,
        clip_high=0.28,
        aggregation="token-mean",
        global_batch_size=2,
        global_batch_tokens=4,
    )
    seq_grad = torch.autograd.grad(seq.loss, logp)[0]
    tok_grad = torch.autograd.grad(tok.loss, logp)[0]
    assert seq_grad[0, 0].item() == pytest.approx(-0.5) and seq_grad[1, 0].item() == pytest.approx(-1 / 6)
    assert tok_grad[0, 0].item() == pytest.approx(-0.25) and tok_grad[1, 0].item() == pytest.approx(-0.25)
    assert seq_grad[0, 1].item() == 0.0  # masked tokens carry no gradient


def test_k3_kl_penalty_is_zero_at_reference_and_positive_elsewhere():
    logp = torch.tensor([[-1.0, -2.0]])
    kw = dict(clip_low=0.2, clip_high=0.28, aggregation="token-mean", global_batch_size=1, global_batch_tokens=2)
    same = clipped_surrogate_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 2), ref_logp=logp, kl_coef=0.1, **kw)
    diff = clipped_surrogate_loss(
        logp, logp, torch.tensor([0.0]), torch.ones(1, 2), ref_logp=logp - 0.5, kl_coef=0.1, **kw
    )
    assert same.loss.item() == pytest.approx(0.0) and diff.loss.item() > 0


def test_token_logprobs_match_single_sequence_forward():
    model, seqs = tiny_llama(), random_sequences()
    mb = collate(seqs, pad_id=0)
    batched = token_logprobs(model, mb)
    for i, s in enumerate(seqs):
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        logits = model(ids).logits[0, len(s.prompt_ids) - 1 : -1]  # [r, V]
        ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(s.response_ids)[:, None])[:, 0]
        torch.testing.assert_close(batched[i, : len(s.response_ids)], ref, atol=1e-5, rtol=1e-5)


def _update_grads(model, seqs, groups, aggregation):
    adv = torch.linspace(-1.0, 1.0, len(seqs))
    with torch.no_grad():
        full = collate(seqs, 0)
        old = token_logprobs(model, full) - 0.05  # ratios away from 1 so clipping is exercised
    model.zero_grad()
    n_tokens = float(sum(len(s.response_ids) for s in seqs))
    for idx in groups:
        mb = collate([seqs[i] for i in idx], 0)
        r = mb.response_ids.size(1)
        old_mb = torch.stack(
            [
                torch.nn.functional.pad(old[i, : len(seqs[i].response_ids)], (0, r - len(seqs[i].response_ids)))
                for i in idx
            ]
        )
        t = clipped_surrogate_loss(
            token_logprobs(model, mb),
            old_mb,
            adv[idx],
            mb.response_mask,
            clip_low=0.2,
            clip_high=0.28,
            aggregation=aggregation,
            global_batch_size=len(seqs),
            global_batch_tokens=n_tokens,
        )
        t.loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("aggregation", ["sequence-mean", "token-mean"])
def test_gradient_is_invariant_to_micro_batching(aggregation):
    model, seqs = tiny_llama(), random_sequences()
    n = len(seqs)
    full = _update_grads(model, seqs, [list(range(n))], aggregation)
    ones = _update_grads(model, seqs, [[i] for i in range(n)], aggregation)
    lengths = [len(s) for s in seqs]
    packed = _update_grads(model, seqs, pack_micro_batches(lengths, max_tokens=40), aggregation)
    assert full.abs().max() > 1e-4  # a real gradient, not a vacuous match
    torch.testing.assert_close(ones, full, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(packed, full, atol=1e-6, rtol=1e-4)

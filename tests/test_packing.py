"""The packed trainer path against the padded one: same log-probs, loss and gradients.

Tolerances: on CPU both paths run in float32 and differ only in summation order (padding,
chunked vs whole-vocabulary log-softmax), so log-probs agree to 1e-4 absolute, losses to
1e-5 relative and gradient norms to 1e-4 relative (the real SmolLM2, 30 layers); the tiny
model is held to 1e-5.
"""

from __future__ import annotations

import pytest
import torch
from grpo_knobs.grpo import Sequence, clipped_surrogate_loss, collate, token_logprobs
from grpo_knobs.packing import (
    STAT_NAMES,
    chunked_target_logprobs,
    merge_stats,
    pack,
    packed_hidden_states,
    packed_surrogate_loss,
    packed_token_logprobs,
    shared_prompt_tokens,
    supports_packed,
    token_budget_micro_batches,
)
from tiny import random_sequences, tiny_llama


def test_pack_layout_positions_and_prediction_index():
    seqs = [Sequence([5, 6], [7, 8, 9]), Sequence([10], [11])]
    pb = pack(seqs)
    assert pb.input_ids.tolist() == [5, 6, 7, 8, 9, 10, 11]
    assert pb.position_ids.tolist() == [0, 1, 2, 3, 4, 0, 1]
    assert pb.cu_seqlens.tolist() == [0, 5, 7]
    assert pb.predict_index.tolist() == [1, 2, 3, 5]  # the token before each response token
    assert pb.targets.tolist() == [7, 8, 9, 11]
    assert pb.segment.tolist() == [0, 0, 0, 1]
    assert pb.response_lengths.tolist() == [3.0, 1.0]


def test_pack_shares_a_groups_prompt():
    """Consecutive sequences with one prompt: the prompt once, each response a segment whose keys are
    the prompt's then its own; an empty response has no segment; a lone sequence keeps its own."""
    p = [5, 6]
    seqs = [Sequence(p, [7, 8]), Sequence(p, [9]), Sequence(list(p), []), Sequence([1], [2])]
    assert shared_prompt_tokens(seqs) == [0, 2, 2, 0]
    pb = pack(seqs)
    assert pb.input_ids.tolist() == [5, 6, 7, 8, 9, 1, 2]
    assert pb.position_ids.tolist() == [0, 1, 2, 3, 2, 0, 1]
    assert pb.cu_seqlens.tolist() == [0, 2, 4, 5, 7]  # prompt, response 0, response 1, the lone sequence
    assert pb.cu_seqlens_k.tolist() == [0, 2, 6, 9, 11]
    assert pb.kv_index.tolist() == [0, 1, 0, 1, 2, 3, 0, 1, 4, 5, 6]
    assert (pb.max_len, pb.max_len_k) == (2, 4)
    assert pb.predict_index.tolist() == [1, 2, 1, 5]  # every response's first token: the prompt's last position
    assert pb.targets.tolist() == [7, 8, 9, 2]
    assert pb.segment.tolist() == [0, 0, 1, 3]
    assert pb.response_split == [2, 1, 0, 1]
    unshared = pack(seqs, share_prompts=False)
    assert unshared.kv_index is None and unshared.cu_seqlens.tolist() == [0, 4, 7, 9, 11]
    assert unshared.targets.tolist() == pb.targets.tolist()


def grouped_sequences(groups: int = 3, size: int = 4, seed: int = 2, vocab: int = 50) -> list[Sequence]:
    """``groups`` prompts with ``size`` responses each (one of them empty), group-major, as a collection."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(groups):
        prompt = torch.randint(3, vocab, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist()
        for j in range(size):
            r = 0 if j == 1 else int(torch.randint(1, 12, (1,), generator=g))
            out.append(Sequence(prompt, torch.randint(3, vocab, (r,), generator=g).tolist()))
    return out


def test_shared_prompts_give_the_unshared_logprobs_and_gradients():
    """Sharing a group's prompt changes how much is computed, not what: log-probs, and the gradient of
    a loss over them, match the layout with a copy of the prompt per response (float32, CPU)."""
    model = tiny_llama()
    seqs = grouped_sequences() + random_sequences(n=2, seed=9)
    weights = torch.linspace(-1.0, 1.0, sum(len(s.response_ids) for s in seqs))
    out = {}
    for share in (True, False):
        model.zero_grad()
        pb = pack(seqs, share_prompts=share)
        assert (pb.kv_index is not None) == share
        logp = packed_token_logprobs(model, pb)  # [Nr]
        (logp * weights).sum().backward()
        out[share] = (logp.detach(), torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert pack(seqs).input_ids.numel() < pack(seqs, share_prompts=False).input_ids.numel()
    torch.testing.assert_close(out[True][0], out[False][0], atol=1e-6, rtol=0)
    assert float(out[False][1].norm()) > 1e-4
    torch.testing.assert_close(out[True][1], out[False][1], atol=1e-6, rtol=1e-5)


def test_a_response_sees_only_its_own_prompt_and_earlier_tokens():
    """Changing one response of a group leaves the prompt's and its siblings' hidden states unchanged."""
    model = tiny_llama()
    seqs = grouped_sequences(groups=2)
    changed = list(seqs)
    changed[2] = Sequence(seqs[2].prompt_ids, [48] * len(seqs[2].response_ids))
    with torch.no_grad():
        base, other = (packed_hidden_states(model, pack(x)) for x in (seqs, changed))
    cu = pack(seqs).cu_seqlens.tolist()  # segments: prompt 0, responses 0, 2, 3 (1 is empty), prompt 1, ...
    moved = {2}  # the segment of response 2
    for s in range(len(cu) - 1):
        a, b = cu[s], cu[s + 1]
        if s in moved:
            assert not torch.allclose(base[a:b], other[a:b])
        else:
            torch.testing.assert_close(base[a:b], other[a:b], atol=0, rtol=0)


def test_token_budget_counts_a_shared_prompt_once():
    lengths, shared = [10, 10, 10, 10, 6], [0, 8, 8, 8, 0]
    # packed: 10 + 2 + 2 = 14 fits 16; the next group member opens no new prompt but 14 + 2 = 16 fits too
    assert token_budget_micro_batches(lengths, 16, shared) == [[0, 1, 2, 3], [4]]
    # a group cut by the budget: its next micro-batch holds the prompt again, at full length
    assert token_budget_micro_batches(lengths, 12, shared) == [[0, 1], [2, 3], [4]]
    assert token_budget_micro_batches(lengths, 16) == [[0], [1], [2], [3, 4]]


def test_token_budget_counts_real_tokens_and_keeps_order():
    lengths = [5, 9, 3, 7, 20, 1]
    batches = token_budget_micro_batches(lengths, 12)
    assert sum(batches, []) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 12 or len(b) == 1 for b in batches)
    assert batches == [[0], [1, 2], [3], [4], [5]]


def test_no_attention_across_sequence_boundaries():
    """Changing one sequence's tokens leaves every other sequence's hidden states unchanged."""
    model = tiny_llama()
    seqs = random_sequences()
    assert supports_packed(model)
    with torch.no_grad():
        base = packed_hidden_states(model, pack(seqs))
        changed = list(seqs)
        changed[2] = Sequence([49] * len(seqs[2].prompt_ids), [48] * len(seqs[2].response_ids))
        other = packed_hidden_states(model, pack(changed))
    bounds = pack(seqs).cu_seqlens.tolist()
    for i in range(len(seqs)):
        a, b = bounds[i], bounds[i + 1]
        if i == 2:
            assert not torch.allclose(base[a:b], other[a:b])
        else:
            torch.testing.assert_close(base[a:b], other[a:b], atol=0, rtol=0)


def test_chunked_logprobs_and_gradients_match_full_log_softmax():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(37, 16, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 16, generator=g, dtype=torch.float64, requires_grad=True)
    tgt = torch.randint(0, 50, (37,), generator=g)
    weights = torch.randn(37, generator=g, dtype=torch.float64)
    for temperature in (1.0, 0.7):
        ref = torch.log_softmax(h @ w.t() / temperature, -1).gather(1, tgt[:, None])[:, 0]
        gh_ref, gw_ref = torch.autograd.grad((ref * weights).sum(), (h, w))
        out = chunked_target_logprobs(h, w, tgt, temperature, chunk=8)
        gh, gw = torch.autograd.grad((out * weights).sum(), (h, w))
        # The logits and softmax are float32 by design, so float64 inputs agree to float32 rounding.
        torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-6)
        torch.testing.assert_close(gh, gh_ref, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(gw, gw_ref, atol=1e-5, rtol=1e-4)


def _padded_update(model, seqs, adv, old, aggregation, n_tokens):
    mb = collate(seqs, 0)
    r = mb.response_ids.size(1)
    logp = token_logprobs(model, mb)  # [m, R]
    old_mb = torch.stack([torch.nn.functional.pad(o, (0, r - o.numel())) for o in old])
    t = clipped_surrogate_loss(
        logp,
        old_mb,
        adv,
        mb.response_mask,
        clip_low=0.2,
        clip_high=0.28,
        aggregation=aggregation,
        global_batch_size=len(seqs),
        global_batch_tokens=n_tokens,
    )
    return logp, t


def _compare(model, seqs, aggregation, logp_atol, rel):
    adv = torch.linspace(-1.0, 1.0, len(seqs))
    n_tokens = float(sum(len(s.response_ids) for s in seqs))
    with torch.no_grad():
        ref = token_logprobs(model, collate(seqs, 0))
        g = torch.Generator().manual_seed(5)
        # Ratios spread over [0.67, 1.49] so that both clip sides are exercised.
        old = [
            ref[i, : len(s.response_ids)] + 0.8 * (torch.rand(len(s.response_ids), generator=g) - 0.5)
            for i, s in enumerate(seqs)
        ]
    model.zero_grad()
    logp_pad, t = _padded_update(model, seqs, adv, old, aggregation, n_tokens)
    t.loss.backward()
    grad_pad = torch.cat([p.grad.flatten() for p in model.parameters()])
    model.zero_grad()
    # Two packed micro-batches: the update's loss is shared across them as on the padded path.
    stats, loss_packed, logp_packed = None, 0.0, []
    for idx in token_budget_micro_batches([len(s) for s in seqs], sum(len(s) for s in seqs) // 2 + 1):
        pb = pack([seqs[i] for i in idx])
        logp = packed_token_logprobs(model, pb)  # [Nr]
        loss, st = packed_surrogate_loss(
            logp,
            torch.cat([old[i] for i in idx]),
            adv[idx],
            pb,
            clip_low=0.2,
            clip_high=0.28,
            aggregation=aggregation,
            global_batch_size=len(seqs),
            global_batch_tokens=n_tokens,
        )
        loss.backward()
        loss_packed += float(loss.detach())
        stats = merge_stats(stats, st)
        logp_packed.append(logp.detach())
    grad_packed = torch.cat([p.grad.flatten() for p in model.parameters()])
    flat_pad = torch.cat([logp_pad[i, : len(s.response_ids)] for i, s in enumerate(seqs)]).detach()
    torch.testing.assert_close(torch.cat(logp_packed), flat_pad, atol=logp_atol, rtol=0)
    assert loss_packed == pytest.approx(float(t.loss.detach()), rel=rel, abs=1e-7)
    assert float(grad_pad.norm()) > 1e-4  # a real gradient, not a vacuous match
    assert float(grad_packed.norm()) == pytest.approx(float(grad_pad.norm()), rel=rel)
    assert float((grad_packed - grad_pad).norm() / grad_pad.norm()) < 10 * rel
    named = dict(zip(STAT_NAMES, stats.tolist()))
    assert (
        named["tokens"] == t.tokens
        and named["clipped_low"] == t.clipped_low
        and named["clipped_high"] == t.clipped_high
    )
    assert named["clipped_low"] > 0 and named["clipped_high"] > 0
    assert named["ratio_sum"] == pytest.approx(t.ratio_sum, rel=1e-5)
    assert named["approx_kl_sum"] == pytest.approx(t.approx_kl_sum, rel=1e-3, abs=1e-7)


@pytest.mark.parametrize("aggregation", ["sequence-mean", "token-mean"])
def test_packed_matches_padded_on_tiny_model(aggregation):
    _compare(tiny_llama(), random_sequences(), aggregation, logp_atol=1e-5, rel=1e-5)


@pytest.mark.slow
def test_packed_matches_padded_on_smollm2():
    from grpo_knobs.models import load_model

    model, tok, _ = load_model("smollm2-135m-instruct", device="cpu", dtype=torch.float32)
    model.eval()
    assert supports_packed(model)
    seqs = random_sequences(n=6, seed=3, vocab=len(tok))
    _compare(model, seqs, "sequence-mean", logp_atol=1e-4, rel=1e-4)


class _ReferenceLigerOps:
    """liger-kernel's three autograd functions as plain torch, with the signatures and layouts its
    ops document (liger_kernel/ops: rms_norm.LigerRMSNormFunction.forward(X, W, eps, offset,
    casting_mode, in_place), "llama" casting: float32 statistics, (X * rstd).to(X.dtype) * W;
    rope.LigerRopeFunction.forward(q, k, cos, sin) with q [bsz, n_q_head, seq_len, head_dim] and
    cos/sin [1, seq_len, head_dim]; swiglu.LigerSiLUMulFunction.forward(a, b) = silu(a) * b).
    Its kernels need a GPU; these check the packed layer's layouts on the CPU."""

    class rms:
        @staticmethod
        def apply(x, w, eps, offset, casting_mode, in_place):
            assert casting_mode == "llama" and offset == 0.0
            h = x.float()
            return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w

    class rope:
        @staticmethod
        def apply(q, k, cos, sin):
            assert q.dim() == 4 and q.size(0) == 1 and cos.shape == (1, q.size(2), q.size(3))

            def rot(x):
                x1, x2 = x.chunk(2, dim=-1)
                return torch.cat((-x2, x1), dim=-1)

            c, s = cos[:, None], sin[:, None]  # [1, 1, T, D] over [1, H, T, D]
            return q * c + rot(q) * s, k * c + rot(k) * s

    class silu_mul:
        @staticmethod
        def apply(a, b):
            return torch.nn.functional.silu(a) * b


def test_liger_layer_layout_matches_eager_layer(monkeypatch):
    """The liger backend's calls (views, transposes, rotary table shape) give the eager layer's hidden
    states and gradients when liger's functions compute what they document."""
    from grpo_knobs import packing

    ops = _ReferenceLigerOps
    monkeypatch.setitem(packing._COMPILED, "liger", (ops.rms, ops.rope, ops.silu_mul))
    model = tiny_llama()
    pb = pack(random_sequences(), "cpu")
    out = {}
    for backend in ("eager", "liger"):
        model.zero_grad()
        h = packed_hidden_states(model, pb, backend)  # [N, H_model]
        (h * torch.linspace(-1, 1, h.numel()).view_as(h)).sum().backward()
        out[backend] = (h.detach(), [p.grad.clone() for p in model.parameters()])
    torch.testing.assert_close(out["liger"][0], out["eager"][0], rtol=1e-5, atol=1e-6)
    for a, b in zip(out["liger"][1], out["eager"][1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_trainer_path_resolution_fails_fast_off_cuda():
    from grpo_knobs.trainer import resolve_trainer_path

    cpu = torch.device("cpu")
    model = tiny_llama()
    assert resolve_trainer_path("auto", model, cpu) == "packed"
    assert resolve_trainer_path("padded", model, cpu) == "padded"
    for path in ("packed-liger", "packed-compiled"):
        with pytest.raises(ValueError, match="runs on CUDA only; use trainer_path=packed"):
            resolve_trainer_path(path, model, cpu)


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"kl_coef": 0.05, "loss_aggregation": "token-mean", "rollout_batch_size": 2, "reuse_on_policy_logprobs": True},
    ],
)
def test_trainer_packed_and_padded_paths_agree(tmp_path, extra):
    """A whole first collection through the trainer on each path: same rollouts, same update statistics."""
    from grpo_knobs.config import RunConfig
    from grpo_knobs.records import RunDir
    from grpo_knobs.trainer import Trainer

    rows = {}
    for path in ("padded", "packed"):
        cfg = RunConfig(
            **(
                {
                    "task": "countdown-2x10",
                    "model": "tiny-random",
                    "rollout_batch_size": 4,
                    "n_samples_per_prompt": 4,
                    "global_batch_size": 8,
                    "response_budget": 16,
                    "eval_every_responses": 16,
                    "eval_problems": 2,
                    "max_new_tokens": 8,
                    "lr": 1e-3,
                    "seed": 3,
                    "output_dir": str(tmp_path / path),
                    "run_id": "t",
                    "max_tokens_per_micro_batch": 40,
                    "device": "cpu",
                    "trainer_path": path,
                }
                | extra
            )
        )
        trainer = Trainer(cfg, progress=False)
        run = RunDir(trainer.run_loop())
        assert trainer.trainer_path == path and (trainer.packed_backend is not None) == (path == "packed")
        rows[path] = run.collections()[0]
    pad, pk = rows["padded"], rows["packed"]
    assert pad["reward_mean"] == pk["reward_mean"] and pad["output_tokens"] == pk["output_tokens"]
    for a, b in zip(pad["per_update"], pk["per_update"]):
        assert a["tokens"] == b["tokens"]
        for k in ("loss", "grad_norm", "ratio_mean", "approx_kl", "clip_fraction"):
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), k


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: variable-length flash attention and bf16")
@pytest.mark.parametrize("backend", ["eager", "liger", "compiled"])
def test_packed_matches_padded_on_cuda_in_bf16(backend):
    """On the GPU (bf16 autocast, flash varlen attention) both paths round differently, so each is held
    against the padded path in float32: the packed path's log-prob error and gradient-norm error must stay
    within 1.5x the padded bf16 path's own error (plus 1e-3), i.e. no worse than today's trainer."""
    from grpo_knobs.models import load_model
    from grpo_knobs.packing import liger_available, logprobs_to_host, score_packed, update_packed

    if backend == "liger" and not liger_available():
        pytest.skip("liger-kernel is not installed")
    model, tok, _ = load_model("smollm2-135m-instruct", device="cuda", dtype=torch.float32)
    model.eval()
    seqs = random_sequences(n=24, seed=4, vocab=len(tok))
    seqs = [Sequence(s.prompt_ids * 8, s.response_ids * 12) for s in seqs]  # run-like lengths (16-96 + 12-132)
    dev = torch.device("cuda")
    adv = torch.linspace(-1.0, 1.0, len(seqs))

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16)

    def fp32():
        return torch.autocast("cuda", enabled=False)

    def padded(ctx):
        with torch.no_grad(), ctx():
            lp = token_logprobs(model, collate(seqs, 0, dev)).float().cpu()
        return [lp[i, : len(s.response_ids)] for i, s in enumerate(seqs)]

    def padded_grad_norm(ctx, old):
        model.zero_grad()
        _, t = _padded_update_cuda(model, seqs, adv, old, dev, ctx)
        t.loss.backward()
        return float(t.loss.detach()), float(torch.cat([p.grad.flatten() for p in model.parameters()]).norm())

    ref, pad = padded(fp32), padded(autocast)
    micro = token_budget_micro_batches([len(s) for s in seqs], 1500)
    assert len(micro) > 1
    got = logprobs_to_host(score_packed(model, seqs, micro, dev, 1.0, autocast, backend))

    def err(x):
        return float(torch.cat([a - b for a, b in zip(x, ref)]).abs().mean())

    assert err(got) <= 1.5 * err(pad) + 1e-3, (err(got), err(pad))

    old = [r + 0.1 for r in ref]
    loss32, g32 = padded_grad_norm(fp32, old)
    loss16, g16 = padded_grad_norm(autocast, old)
    model.zero_grad()
    cfg = type(
        "C", (), dict(clip_low=0.2, clip_high=0.28, loss_aggregation="sequence-mean", kl_coef=0.0, temperature=1.0)
    )
    values = update_packed(model, seqs, list(range(len(seqs))), micro, adv, old, None, cfg, dev, autocast, backend)
    g_packed = float(torch.cat([p.grad.flatten() for p in model.parameters()]).norm())
    assert abs(float(values[0]) - loss32) <= 1.5 * abs(loss16 - loss32) + 1e-3 * abs(loss32) + 1e-6
    assert abs(g_packed - g32) <= 1.5 * abs(g16 - g32) + 1e-2 * g32, (g_packed, g16, g32)


def _padded_update_cuda(model, seqs, adv, old, dev, ctx):
    mb = collate(seqs, 0, dev)
    r = mb.response_ids.size(1)
    with ctx():
        logp = token_logprobs(model, mb)  # [m, R]
    old_mb = torch.stack([torch.nn.functional.pad(o, (0, r - o.numel())) for o in old]).to(dev)
    t = clipped_surrogate_loss(
        logp,
        old_mb,
        adv.to(dev),
        mb.response_mask,
        clip_low=0.2,
        clip_high=0.28,
        aggregation="sequence-mean",
        global_batch_size=len(seqs),
        global_batch_tokens=float(sum(len(s.response_ids) for s in seqs)),
    )
    return logp, t


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: variable-length flash attention and bf16")
@pytest.mark.parametrize("backend", ["eager", "liger", "compiled"])
def test_shared_prompts_on_cuda_match_unshared_and_repeat_bit_for_bit(backend):
    """Flash attention with a shared prompt (more keys than queries, bottom-right causal) against one copy
    of the prompt per response, both held to the float32 padded path: the shared layout's log-prob and
    gradient-norm errors stay within 1.5x the unshared one's (plus a little). Under deterministic mode two
    updates give the same gradients bit for bit (the key gather's backward sums a prompt's keys in order)."""
    from grpo_knobs.models import load_model
    from grpo_knobs.packing import liger_available, logprobs_to_host, score_packed, update_packed
    from grpo_knobs.runtime import deterministic_mode

    if backend == "liger" and not liger_available():
        pytest.skip("liger-kernel is not installed")
    model, tok, _ = load_model("smollm2-135m-instruct", device="cuda", dtype=torch.float32)
    model.eval()
    seqs = [
        Sequence(s.prompt_ids * 12, s.response_ids * 8) for s in grouped_sequences(6, 8, seed=4, vocab=len(tok))
    ]  # run-like: 6 prompts of 24-96 tokens, 8 responses each of 0-88
    dev = torch.device("cuda")
    adv = torch.linspace(-1.0, 1.0, len(seqs))

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16)

    with torch.no_grad():
        ref = token_logprobs(model, collate(seqs, 0, dev)).float().cpu()  # float32, padded
    ref = [ref[i, : len(s.response_ids)] for i, s in enumerate(seqs)]
    micro = token_budget_micro_batches([len(s) for s in seqs], 1500, shared_prompt_tokens(seqs))
    assert len(micro) > 1

    def run(share):
        got = logprobs_to_host(score_packed(model, seqs, micro, dev, 1.0, autocast, backend, share))
        model.zero_grad()
        cfg = type(
            "C", (), dict(clip_low=0.2, clip_high=0.28, loss_aggregation="sequence-mean", kl_coef=0.0, temperature=1.0)
        )
        old = [r + 0.1 for r in ref]
        update_packed(model, seqs, list(range(len(seqs))), micro, adv, old, None, cfg, dev, autocast, backend, share)
        return got, torch.cat([p.grad.flatten() for p in model.parameters()])

    (shared, g_shared), (unshared, g_unshared) = run(True), run(False)
    with deterministic_mode(True):
        _, g_a = run(True)
        _, g_b = run(True)

    def err(x):
        return float(torch.cat([a - b for a, b in zip(x, ref) if a.numel()]).abs().mean())

    assert err(shared) <= 1.5 * err(unshared) + 1e-3, (err(shared), err(unshared))
    cos = float(torch.nn.functional.cosine_similarity(g_shared, g_unshared, dim=0))
    assert cos > 0.99 and float(g_shared.norm()) == pytest.approx(float(g_unshared.norm()), rel=0.02), cos
    assert torch.equal(g_a, g_b)

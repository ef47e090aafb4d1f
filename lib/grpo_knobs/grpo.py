"""GRPO's pieces: group advantages, token log-probs, the clipped surrogate, loss
aggregation and micro-batch packing.

The loss of one update is defined over its B responses, whatever the micro-batching:
each micro-batch contributes its share of the update's loss (sums divided by the
update-level denominator), so gradients accumulated over any packing equal the gradient
of the whole update up to floating-point rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def group_advantages(
    rewards: torch.Tensor, group_size: int, std_normalize: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Advantages for rewards laid out group-major.

    Args:
        rewards: [N] with N = groups x group_size; group k is rewards[k*G:(k+1)*G].
        std_normalize: divide by the group's sample std (Bessel-corrected) + eps;
            False gives Dr. GRPO's mean-only centering.
    Returns:
        [N] advantages; a group whose rewards are all equal gets exactly zero.
    """
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be 1-D with a multiple of {group_size} entries, got shape {tuple(rewards.shape)}."
        )
    r = rewards.double().view(-1, group_size)  # [groups, G]
    centered = r - r.mean(dim=1, keepdim=True)  # [groups, G]
    if std_normalize:
        centered = centered / (r.std(dim=1, unbiased=True, keepdim=True) + eps)
    centered[(r == r[:, :1]).all(dim=1)] = 0.0  # exact zeros, not 0/(0+eps) rounding
    return centered.view(-1).to(rewards.dtype)  # [N]


def mixed_group_fraction(rewards: torch.Tensor, group_size: int) -> float:
    """Share of groups whose rewards are not all equal (the ones that carry signal)."""
    r = rewards.view(-1, group_size)  # [groups, G]
    return float((r != r[:, :1]).any(dim=1).float().mean())


@dataclass
class Sequence:
    """One prompt + response, unpadded, as the trainer scores it."""

    prompt_ids: list[int]
    response_ids: list[int]

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


def pack_micro_batches(
    lengths: list[int], micro_batch_size: int | None = None, max_tokens: int | None = None
) -> list[list[int]]:
    """Split indices into micro-batches, by count or by a padded-token budget.

    With a token budget, sequences are sorted by length and packed greedily so that
    (sequences x longest length) stays within ``max_tokens``; a single sequence longer
    than the budget gets a micro-batch of its own. The split never changes which
    responses form the update, only how they are processed.
    """
    n = len(lengths)
    if micro_batch_size is not None:
        return [list(range(i, min(i + micro_batch_size, n))) for i in range(0, n, micro_batch_size)]
    if max_tokens is None:
        return [list(range(n))]
    order = sorted(range(n), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = max(lengths[i], max((lengths[j] for j in current), default=0))
        if current and longest * (len(current) + 1) > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [m, T] right-padded prompt + response
    attention_mask: torch.Tensor  # [m, T]
    gather_index: torch.Tensor  # [m, R] position whose hidden state predicts response token j
    response_ids: torch.Tensor  # [m, R]
    response_mask: torch.Tensor  # [m, R] 1 for real response tokens (EOS included)


def collate(seqs: list[Sequence], pad_id: int, device: torch.device | str = "cpu") -> MicroBatch:
    m = len(seqs)
    t = max(len(s) for s in seqs)
    r = max(max(len(s.response_ids) for s in seqs), 1)
    input_ids = torch.full((m, t), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((m, t), dtype=torch.long)
    gather_index = torch.zeros((m, r), dtype=torch.long)
    response_ids = torch.full((m, r), pad_id, dtype=torch.long)
    response_mask = torch.zeros((m, r), dtype=torch.float32)
    for i, s in enumerate(seqs):
        ids = s.prompt_ids + s.response_ids
        p, n = len(s.prompt_ids), len(s.response_ids)
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention_mask[i, : len(ids)] = 1
        # Hidden state at position p + j - 1 predicts response token j.
        gather_index[i] = torch.clamp(torch.arange(r) + p - 1, max=len(ids) - 1)
        response_ids[i, :n] = torch.tensor(s.response_ids, dtype=torch.long)
        response_mask[i, :n] = 1.0
    return MicroBatch(*(x.to(device) for x in (input_ids, attention_mask, gather_index, response_ids, response_mask)))


def token_logprobs(model: torch.nn.Module, mb: MicroBatch, temperature: float = 1.0) -> torch.Tensor:
    """Log-probs of the response tokens under ``model``: [m, R] (zeros where masked).

    The output projection runs only on the positions that predict response tokens,
    which keeps the [tokens, vocab] logits small.
    """
    hidden = model.base_model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).last_hidden_state  # [m, T, H]
    idx = mb.gather_index.unsqueeze(-1).expand(-1, -1, hidden.size(-1))  # [m, R, H]
    logits = model.get_output_embeddings()(torch.gather(hidden, 1, idx)).float()  # [m, R, V]
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.gather(logits, 2, mb.response_ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(
        logits, dim=-1
    )  # [m, R]
    return logp * mb.response_mask


@dataclass
class LossTerms:
    loss: torch.Tensor  # scalar, this micro-batch's share of the update loss
    tokens: float
    clipped_low: float  # tokens whose ratio was clipped below and the clip was active
    clipped_high: float
    ratio_sum: float
    ratio_max: float
    approx_kl_sum: float  # k3 estimate of KL(old || new), summed over tokens
    kl_penalty_sum: float


@dataclass
class TokenSurrogate:
    """Per-token pieces of the GRPO loss, all of ``logp``'s shape."""

    per_token: torch.Tensor  # -min(ratio * A, clip(ratio) * A) + kl_coef * k3 penalty
    ratio: torch.Tensor  # pi / pi_old
    log_ratio: torch.Tensor
    clip_active: torch.Tensor  # bool: the min picked the clipped branch
    kl_penalty: torch.Tensor  # k3 estimate of KL(pi || pi_ref), zeros without a KL term


def token_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> TokenSurrogate:
    """The PPO clipped surrogate per token, plus the k3 KL penalty; no masking or aggregation.

    Args:
        logp, old_logp, ref_logp: per-token log-probs, e.g. [m, R] (padded) or [Nr] (packed);
        advantages: broadcastable to them ([m, 1] or [Nr]).
    """
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    kl_pen = torch.zeros_like(per_token)
    if kl_coef > 0.0:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs reference log-probs.")
        d = ref_logp - logp
        kl_pen = torch.exp(d) - d - 1.0  # k3 estimator, >= 0
        per_token = per_token + kl_coef * kl_pen
    return TokenSurrogate(per_token, ratio, log_ratio, clipped < unclipped, kl_pen)


def clipped_surrogate_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    aggregation: str,
    global_batch_size: int,
    global_batch_tokens: float,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> LossTerms:
    """PPO clipped surrogate for one micro-batch, scaled as a share of the update loss.

    Args:
        logp, old_logp, mask: [m, R]; advantages: [m].
        aggregation: "sequence-mean" (each response's token mean, then the mean over the
            update's ``global_batch_size`` (B)) or "token-mean" (sum over the update's
            ``global_batch_tokens``).
    """
    adv = advantages.unsqueeze(-1)  # [m, 1]
    t = token_surrogate(
        logp, old_logp, adv, clip_low=clip_low, clip_high=clip_high, ref_logp=ref_logp, kl_coef=kl_coef
    )  # [m, R] each
    per_token = t.per_token * mask
    if aggregation == "sequence-mean":
        lengths = mask.sum(-1).clamp(min=1.0)  # [m]
        loss = (per_token.sum(-1) / lengths).sum() / global_batch_size
    elif aggregation == "token-mean":
        loss = per_token.sum() / global_batch_tokens
    else:
        raise ValueError(f"Unknown loss aggregation {aggregation!r}.")
    with torch.no_grad():
        m = mask.bool()
        r = t.ratio[m]
        active = t.clip_active[m]
        low = active & (r < 1.0 - clip_low)
        high = active & (r > 1.0 + clip_high)
        lr_ = t.log_ratio[m]
        approx_kl = (torch.exp(lr_) - 1.0) - lr_
        return LossTerms(
            loss=loss,
            tokens=float(m.sum()),
            clipped_low=float(low.sum()),
            clipped_high=float(high.sum()),
            ratio_sum=float(r.sum()),
            ratio_max=float(r.max()) if r.numel() else 1.0,
            approx_kl_sum=float(approx_kl.sum()),
            kl_penalty_sum=float(t.kl_penalty[m].sum()),
        )


# The per-update statistics both trainer paths return, after the loss: sums over the update's
# response tokens (ratio_max is a max), then the gradient norm.
STAT_NAMES = ("tokens", "clipped_low", "clipped_high", "ratio_sum", "ratio_max", "approx_kl_sum", "kl_penalty_sum")
UPDATE_VALUES = ("loss", *STAT_NAMES, "grad_norm")


def update_record(values: list[float], micro_batches: int) -> dict:
    """One update's record from its ``UPDATE_VALUES`` (token sums become per-token means)."""
    s = dict(zip(UPDATE_VALUES, values, strict=True))
    n = max(s["tokens"], 1.0)
    return {
        "loss": s["loss"],
        "clip_fraction": (s["clipped_low"] + s["clipped_high"]) / n,
        "clip_low_fraction": s["clipped_low"] / n,
        "clip_high_fraction": s["clipped_high"] / n,
        "approx_kl": s["approx_kl_sum"] / n,
        "ratio_mean": s["ratio_sum"] / n,
        "ratio_max": s["ratio_max"],
        "grad_norm": s["grad_norm"],
        "tokens": int(s["tokens"]),
        "micro_batches": micro_batches,
    }

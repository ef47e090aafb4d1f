"""A tiny llama and random sequences, shared by the loss and packing tests; a tiny CPU run's parameters."""

from __future__ import annotations

import torch
from grpo_knobs.grpo import Sequence
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    """2 layers, 4 query heads over 2 key/value heads, vocabulary 50, tied embeddings; eval mode."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(cfg).eval()


def random_sequences(n: int = 7, seed: int = 1, vocab: int = 50) -> list[Sequence]:
    """``n`` sequences of 2-8 prompt and 1-11 response tokens drawn from ids 3..vocab-1."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        p = int(torch.randint(2, 9, (1,), generator=g))
        r = int(torch.randint(1, 12, (1,), generator=g))
        out.append(
            Sequence(
                torch.randint(3, vocab, (p,), generator=g).tolist(),
                torch.randint(3, vocab, (r,), generator=g).tolist(),
            )
        )
    return out


# A whole `grpo-knobs train` of the tiny model on CPU in seconds: two collections of 4, two evaluations.
TINY_RUN = dict(
    model="tiny-random",
    device="cpu",
    rollout_batch_size=2,
    n_samples_per_prompt=2,
    global_batch_size=4,
    response_budget=8,
    eval_every_responses=4,
    eval_problems=2,
    max_new_tokens=8,
    resume_every_collections=0,
)


def run_args(flag: str = "-p", **changes) -> list[str]:
    """``TINY_RUN`` with ``changes`` as command-line arguments: ``flag KEY=VALUE`` each."""
    return [a for k, v in (TINY_RUN | changes).items() for a in (flag, f"{k}={v}")]

"""The rollout engine interface shared by the HF engines and SGLang.

Responses are returned in prompt-major order (prompt 0's n samples first) so the trainer can form
GRPO groups by slicing, and every response keeps its stop token: with SmolLM2 the EOS id equals the
pad id, so a mask built from `token != pad` would silently drop EOS from the loss.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass
class Generation:
    """N = len(prompts) * n responses, prompt-major."""

    prompt_index: list[int]  # [N] index into the prompt list
    token_ids: list[list[int]]  # [N][len_i] response tokens, ending with the stop token when finish is "stop"
    texts: list[str]  # [N] decoded with skip_special_tokens=True
    finish_reasons: list[str]  # [N] "stop" or "length"
    logprobs: list[list[float]] | None  # [N][len_i] log-prob of each sampled token under the engine, or None

    @property
    def response_lengths(self) -> list[int]:
        return [len(t) for t in self.token_ids]

    @property
    def num_responses(self) -> int:
        return len(self.token_ids)


def cut_at_stop(tokens: list[int], stop_ids: set[int]) -> tuple[list[int], str]:
    """Keep tokens up to and including the first stop token; a response without one hit the length cap."""
    for i, t in enumerate(tokens):
        if t in stop_ids:
            return tokens[: i + 1], "stop"
    return tokens, "length"


def cut_rows(
    tokens: torch.Tensor, logprobs: torch.Tensor | None, stop_ids: set[int]
) -> tuple[list[list[int]], list[str], list[list[float]] | None]:
    """``cut_at_stop`` for every row of CPU tensors tokens [R, S] at once, log-probs [R, S] cut alike:
    (token_ids, finish reasons, log-probs). The stop positions come from tensor operations and each output
    goes to Python in one ``tolist``, instead of a Python pass over every token and a conversion per row."""
    R, S = tokens.shape
    stop = torch.isin(tokens, torch.tensor(sorted(stop_ids), dtype=tokens.dtype))  # [R, S]
    stopped = stop.any(1)  # [R]
    lengths = torch.where(stopped, stop.byte().argmax(1) + 1, S)  # [R] argmax: the first stop token
    kept = (torch.arange(S) < lengths[:, None]).numpy()  # [R, S]
    ends = lengths.cumsum(0).tolist()
    starts = [0, *ends[:-1]]

    def split(values: torch.Tensor) -> list[list]:
        flat = values.numpy()[kept].tolist()  # [sum(lengths)] row after row; numpy selects faster than torch
        return [flat[a:b] for a, b in zip(starts, ends)]

    finish = ["stop" if s else "length" for s in stopped.tolist()]
    return split(tokens), finish, None if logprobs is None else split(logprobs)


def decode_texts(tokenizer, token_ids: list[list[int]]) -> list[str]:
    """``tokenizer.batch_decode(token_ids, skip_special_tokens=True)``: by the Rust tokenizer row by row where
    that is all batch_decode would do (a fast tokenizer whose decoding no subclass changes, with no clean-up of
    spaces), since batch_decode first walks every id in Python and calls ``_decode`` per row, most of its time
    for a collection's responses. One row at a time: once the Rust batch decode has used the tokenizers'
    thread pool, every later fork of the process warns and turns the pool off (unless TOKENIZERS_PARALLELISM
    is set). A byte-level BPE tokenizer's rows are read from its ``byte_table``. token_ids: ids a model
    sampled (none negative)."""
    from transformers import PreTrainedTokenizerFast

    plain = isinstance(tokenizer, PreTrainedTokenizerFast) and all(
        getattr(type(tokenizer), m) is getattr(PreTrainedTokenizerFast, m)
        for m in ("batch_decode", "decode", "_decode")
    )
    if not plain or cleans_up_spaces(tokenizer):
        return tokenizer.batch_decode(token_ids, skip_special_tokens=True)
    decode = tokenizer.backend_tokenizer.decode
    table = byte_table(tokenizer)
    if table is None:
        return [decode(ids, skip_special_tokens=True) for ids in token_ids]
    get, texts = table.__getitem__, []
    for ids in token_ids:
        try:  # a byte-level BPE's text is its tokens' bytes read as UTF-8, which the Rust decoder also does
            texts.append(b"".join(map(get, ids)).decode())
        except (TypeError, IndexError, UnicodeDecodeError):  # an id left to the decoder; bytes that are not UTF-8
            texts.append(decode(ids, skip_special_tokens=True))
    return texts


def byte_table(tokenizer) -> list[bytes | None] | None:
    """The bytes each token id decodes to, for a byte-level BPE tokenizer (GPT-2's byte-to-character map, as
    SmolLM2, Qwen and Llama 3 use): b"" for special tokens, which decoding skips, and None for an added token
    that is not special, a token outside the map, or one the decoder would change before its ByteLevel step,
    which ``decode_texts`` leaves to the Rust decoder. Joining a row's bytes and reading them as UTF-8 is 3-4x
    faster than the decoder's call per row. None for other tokenizers. Cached on the tokenizer until its
    vocabulary grows or its decoder changes."""
    backend = tokenizer.backend_tokenizer
    key = (backend.get_vocab_size(with_added_tokens=True), repr(backend.decoder))
    cached = tokenizer.__dict__.get("_byte_table")
    if cached is not None and cached[0] == key:
        return cached[1]
    size, table = key[0], None
    changed = _byte_level_steps(backend.decoder) if type(backend.model).__name__ == "BPE" else None
    if changed is not None:
        from transformers.convert_slow_tokenizer import bytes_to_unicode  # the map the ByteLevel decoder inverts

        chars = {c: b for b, c in bytes_to_unicode().items()}
        added = tokenizer.added_tokens_decoder
        table = []
        for i in range(size):
            token = backend.id_to_token(i)
            if i in added or token is None or not set(token) <= chars.keys() or changed(token):
                table.append(b"" if i in added and added[i].special else None)
            else:
                table.append(bytes(chars[c] for c in token))
    tokenizer.__dict__["_byte_table"] = (key, table)
    return table


_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _byte_level_steps(decoder):
    """For a decoder that is ByteLevel, alone or last in a Sequence of steps that leave most byte-level tokens as
    they are, a test of the tokens those steps would change: ByteFallback turns "<0xNN>" into its byte, Replace
    of one character changes the tokens holding it, Fuse only joins the tokens (as the table's join does).
    None for any other decoder. transformers 5.17 builds such a Sequence for SmolLM2's GGUF tokenizer, 5.24 a
    plain ByteLevel."""
    decoder = json.loads(decoder.__getstate__()) if decoder is not None else {}
    steps = decoder.get("decoders", []) if decoder.get("type") == "Sequence" else [decoder]
    if not steps or steps[-1].get("type") != "ByteLevel":
        return None
    fallback, replaced = False, set()
    for step in steps[:-1]:
        kind, pattern = step.get("type"), (step.get("pattern") or {}).get("String")
        if kind == "ByteFallback":
            fallback = True
        elif kind == "Replace" and pattern is not None and len(pattern) == 1:
            replaced.add(pattern)
        elif kind != "Fuse":
            return None
    return lambda token: bool(replaced.intersection(token)) or (fallback and _BYTE_TOKEN.fullmatch(token) is not None)


def cleans_up_spaces(tokenizer) -> bool:
    """Whether ``_decode`` cleans up spaces. transformers 5 skips the clean-up for a BPE tokenizer (it would
    strip real spaces before punctuation) unless ``clean_up_tokenization_spaces_for_bpe_even_though_it_will_
    corrupt_output`` forces it; earlier versions, which lack that attribute, clean up whenever asked."""
    if not tokenizer.clean_up_tokenization_spaces:
        return False
    force = getattr(tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", None)
    return force is None or force or type(tokenizer.backend_tokenizer.model).__name__ != "BPE"


def repeat_prompts(prompt_ids: list[list[int]], n: int) -> tuple[list[list[int]], list[int]]:
    """Prompt-major repetition: [p0]*n + [p1]*n + ..., with each row's prompt index."""
    if n < 1:
        raise ValueError(f"n (samples per prompt) must be >= 1, got {n}")
    rows, index = [], []
    for i, p in enumerate(prompt_ids):
        p = [int(t) for t in p]
        if not p:
            raise ValueError(f"prompt {i} is empty: every prompt needs at least one token")
        rows += [p] * n
        index += [i] * n
    return rows, index


class RolloutEngine(ABC):
    """Generates responses for the trainer and receives its weights after each collection."""

    @abstractmethod
    def generate(
        self, prompt_ids: list[list[int]], n: int, max_new_tokens: int, temperature: float, seed: int
    ) -> Generation:
        """Sample n responses per prompt at `temperature` (0 = greedy) with no top-k/top-p truncation."""

    @abstractmethod
    def update_weights(self, state_dict) -> None:
        """Copy trainer weights into the generator, in place."""

    def stats(self) -> dict:
        """Counters worth a line in collections.jsonl (SGLang: re-sent requests, server restarts); cumulative."""
        return {}

    def close(self) -> None:
        """Release processes or memory held by the engine."""

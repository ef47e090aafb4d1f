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

import numpy as np
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
    if not decodes_directly(tokenizer):
        return tokenizer.batch_decode(token_ids, skip_special_tokens=True)
    table = byte_table(tokenizer)
    if table is None:
        decode = tokenizer.backend_tokenizer.decode
        return [decode(ids, skip_special_tokens=True) for ids in token_ids]
    return [row_text(tokenizer, ids, table_bytes(table, ids)) for ids in token_ids]


def decodes_directly(tokenizer) -> bool:
    """Whether batch_decode's texts are the Rust decoder's, row by row (see ``decode_texts``)."""
    from transformers import PreTrainedTokenizerFast

    plain = isinstance(tokenizer, PreTrainedTokenizerFast) and all(
        getattr(type(tokenizer), m) is getattr(PreTrainedTokenizerFast, m)
        for m in ("batch_decode", "decode", "_decode")
    )
    return plain and not cleans_up_spaces(tokenizer)


def table_bytes(table: list[bytes | None], ids: list[int]) -> bytes | None:
    """The bytes of ``ids`` from a ``byte_table``; None where one has no entry (left to the decoder)."""
    try:
        return b"".join(map(table.__getitem__, ids))
    except (TypeError, IndexError):  # an added token that is not special; an id past the vocabulary
        return None


def row_text(tokenizer, ids: list[int], raw: bytes | None) -> str:
    """A byte-level BPE's text of ``ids``: their bytes read as UTF-8, which the Rust decoder also does, or that
    decoder's own text where the bytes are missing (None) or not UTF-8 (a row cut inside a character)."""
    if raw is not None:
        try:
            return raw.decode()
        except UnicodeDecodeError:
            pass
    return tokenizer.backend_tokenizer.decode(ids, skip_special_tokens=True)


class ResponseStream:
    """The responses of one decoder call, assembled while it decodes: each block of output columns handed to
    ``add`` is cut at every row's first stop token and appended to that response's token ids, log-probs and
    text bytes, so the host work a collection ends with is done while the GPU decodes the blocks after it.
    ``finish`` returns what ``cut_rows`` and then ``decode_texts`` return for the whole output: the same
    lists, reasons and texts.

    rows: how many responses; stop_ids: the tokens that end one (kept, as ``cut_at_stop`` keeps them);
    logprobs: whether blocks carry log-probs."""

    def __init__(self, tokenizer, rows: int, stop_ids: set[int], logprobs: bool):
        self.tokenizer, self.rows = tokenizer, rows
        self.stop = np.array(sorted(stop_ids), dtype=np.int64)  # [S]
        self.table = byte_table(tokenizer) if decodes_directly(tokenizer) else None  # None: texts at the end
        self.token_ids: list[list[int]] = [[] for _ in range(rows)]
        self.logprobs: list[list[float]] | None = [[] for _ in range(rows)] if logprobs else None
        self.parts: list[list[bytes] | None] = [[] for _ in range(rows)]  # None: an id with no bytes
        self.ended = np.zeros(rows, dtype=bool)  # [rows] the stop token has been seen

    def add(self, tokens: np.ndarray, logprobs: np.ndarray | None, origin: np.ndarray) -> None:
        """The next columns of the output. tokens, logprobs: [W, k], for W decoder rows; origin: [W], the
        response each row carries (rows with -1, or with an index past ``rows``, carry none and are skipped)."""
        k = tokens.shape[1]
        stop = np.isin(tokens, self.stop)  # [W, k]
        stopped = stop.any(1)  # [W]
        cut = np.where(stopped, stop.argmax(1) + 1, k)  # [W] columns kept: through the first stop token
        live = (origin >= 0) & (origin < self.rows)  # [W]
        live[live] = ~self.ended[origin[live]]  # responses that stopped in an earlier block take nothing more
        rows = np.flatnonzero(live)  # [L]
        self.ended[origin[rows]] = stopped[rows]
        # one conversion to Python per array, then a pass over the live rows: the loop's own overhead is most
        # of the work, so it does no numpy indexing
        token_rows = tokens[rows].tolist()  # [L][k]
        lp_rows = logprobs[rows].tolist() if self.logprobs is not None else [None] * len(rows)
        for o, n, ids, lps in zip(origin[rows].tolist(), cut[rows].tolist(), token_rows, lp_rows):
            if n < k:
                ids = ids[:n]
            self.token_ids[o] += ids
            if lps is not None:
                self.logprobs[o] += lps[:n]
            parts = self.parts[o]
            if self.table is not None and parts is not None:
                raw = table_bytes(self.table, ids)
                if raw is None:  # an id with no bytes: this row's text is the decoder's
                    self.parts[o] = None
                else:
                    parts.append(raw)

    def finish(self) -> tuple[list[list[int]], list[str], list[list[float]] | None, list[str]]:
        """(token_ids, finish reasons, log-probs or None, texts), as ``cut_rows`` and ``decode_texts`` give."""
        finish = ["stop" if e else "length" for e in self.ended.tolist()]
        if self.table is None:
            texts = decode_texts(self.tokenizer, self.token_ids)
        else:
            texts = [
                row_text(self.tokenizer, ids, None if parts is None else b"".join(parts))
                for ids, parts in zip(self.token_ids, self.parts)
            ]
        return self.token_ids, finish, self.logprobs, texts


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

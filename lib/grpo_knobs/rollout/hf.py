"""Rollouts from a transformers model: eager `generate`, or a static-cache decode loop replayed as CUDA graphs.

The engine keeps its own copy of the weights so the generator changes only at weight sync, exactly
as with a separate inference server. The fast path exists because default `generate` is launch- and
Python-bound on a GPU (70-96 ms per step at every batch size on an H200, docs/performance.md); replaying one
captured graph per decode step removes that overhead while reading the same parameter storage, so
`update_weights` (an in-place copy) needs no recapture.
"""

from __future__ import annotations

import copy
import itertools
import os
import warnings
from contextlib import contextmanager

import numpy as np
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from ..runtime import without_deterministic_algorithms
from .base import Generation, ResponseStream, RolloutEngine, cut_rows, decode_texts, repeat_prompts

FAST_MODEL_TYPES = ("llama", "qwen2", "qwen3")  # decoder layers the static decoder re-implements around


def sample_tokens(logits: torch.Tensor, inv_temperature: torch.Tensor, greedy: bool):
    """Draw one token per row from softmax(logits / T) with no truncation; return (tokens, their log-probs).

    Sampling is an exponential race (argmax of z - log E, E ~ Exp(1)), the method torch.multinomial itself
    uses for one draw, but without building the probability tensor. Greedy rows take argmax(z) and report
    log-probs at T = 1 (the caller sets inv_temperature to 1).
    """
    z = logits.float() * inv_temperature  # [B, V]
    if greedy:
        tokens = z.argmax(-1)  # [B]
    else:
        # clamp: a zero draw would make -log E infinite and pick its token regardless of z
        noise = torch.empty_like(z).exponential_().clamp_min_(torch.finfo(torch.float32).tiny).log_()  # [B, V]
        tokens = (z - noise).argmax(-1)  # [B]
    logprobs = z.gather(-1, tokens[:, None])[:, 0] - torch.logsumexp(z, -1)  # [B]
    return tokens, logprobs


_U64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit integers that scatters nearby inputs."""
    x = (x + 0x9E3779B97F4A7C15) & _U64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _U64
    return x ^ (x >> 31)


def response_keys(seed: int, n_prompts: int, n: int) -> torch.Tensor:
    """One 64-bit key per response, prompt-major: a hash of (seed, prompt position, sample index). [n_prompts * n]

    A keyed sampler draws a response's noise from its key and the token position alone, so the response
    does not depend on its row in the batch, on how many prompts share the call, on the chunks of
    ``max_batch_size`` rows, on rows dropped as others finish, or on the CUDA-graph width bucket.
    """
    keys = [_mix64(_mix64(_mix64(seed & _U64) ^ k) ^ s) for k in range(n_prompts) for s in range(n)]
    return torch.tensor([k - (1 << 64) if k >> 63 else k for k in keys], dtype=torch.int64)  # int64 bit patterns


def keyed_sample_tokens(
    logits: torch.Tensor, inv_temperature: torch.Tensor, keys: torch.Tensor, step: int, greedy: bool
):
    """``sample_tokens`` with row r's noise drawn from a generator seeded by (keys[r], step) alone.

    The host-side keyed sampler of the CPU paths (the GPU paths use ``kernels.sample``, Philox keyed the same
    way): one small generator per row, so the cost is a seed and an exponential draw per row and step.
    """
    if greedy:
        return sample_tokens(logits, inv_temperature, greedy=True)
    z = logits.float() * inv_temperature  # [B, V]
    noise = torch.empty_like(z)  # [B, V]
    salt = _mix64(step)
    for r, key in enumerate(keys[: z.shape[0]].tolist()):
        noise[r].exponential_(generator=torch.Generator(z.device).manual_seed(_mix64((key & _U64) ^ salt)))
    noise.clamp_min_(torch.finfo(torch.float32).tiny).log_()  # a zero draw would pick its token regardless of z
    tokens = (z - noise).argmax(-1)  # [B]
    logprobs = z.gather(-1, tokens[:, None])[:, 0] - torch.logsumexp(z, -1)  # [B]
    return tokens, logprobs


def keyed_sample(
    logits: torch.Tensor, inv_temperature: torch.Tensor, keys: torch.Tensor, step: torch.Tensor, greedy: bool
):
    """Keyed draws where the logits are: the Philox kernel on CUDA (reading ``step`` [1] from device memory,
    so a captured graph replays it), ``keyed_sample_tokens`` on the host. Returns (tokens [B], log-probs [B])."""
    B = logits.shape[0]
    if logits.is_cuda:
        from .kernels import sample

        tokens, lps = logits.new_empty(B, dtype=torch.long), logits.new_empty(B, dtype=torch.float32)
        return sample(logits.contiguous(), inv_temperature, keys, step, greedy, tokens, lps)
    return keyed_sample_tokens(logits, inv_temperature, keys, int(step), greedy)


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


# The widest decode step whose projections run as kernels.py's GEMMs (the norm and residual add inside
# them) rather than cuBLAS's: narrower steps are bound by kernel latency, wider ones by the GEMMs' work.
LINEAR_ROWS = 64


class _OutputBlocks:
    """A decoder call's output columns handed to a ``ResponseStream`` block by block as the steps write them.
    Each block is copied to pinned host memory behind the steps that wrote it, without waiting; the stream
    takes it at the next block's push, by when the copy has landed, so its Python work runs while the GPU
    decodes the block after it and only the last block is left for the host once the GPU is done."""

    def __init__(self, stream: ResponseStream):
        self.stream, self.logprobs = stream, stream.logprobs is not None
        self.start = 0  # first column not yet pushed
        self.pending = None  # ([tokens, origin(, log-probs)] on the host, copy event) of the block not yet taken

    def push(self, out_tok, out_lp, origin, width: int, end: int) -> None:
        """Columns start..end-1 of decoder rows :width, whose responses are ``origin`` ([width], on the device)."""
        parts = [out_tok[:width, self.start : end], origin]  # [width, k], [width]
        if self.logprobs:
            parts.append(out_lp[:width, self.start : end])  # [width, k]
        self.start = end
        if origin.device.type == "cuda":
            host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in parts]
            for h, t in zip(host, parts):
                h.copy_(t.contiguous(), non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        else:  # a CPU decoder moves rows in place at compaction: keep this block's values
            host, event = [t.clone() for t in parts], None
        taken, self.pending = self.pending, (host, event)
        if taken is not None:
            self._take(*taken)

    def close(self, tokens: torch.Tensor, logprobs: torch.Tensor) -> None:
        """After the call: the pending block, then the columns after it from the call's CPU outputs ([n_real,
        steps], rows in response order)."""
        if self.pending is not None:
            self._take(*self.pending)
            self.pending = None
        if self.start < tokens.shape[1]:
            rows = np.arange(tokens.shape[0])
            rest = logprobs[:, self.start :].numpy() if self.logprobs else None
            self.stream.add(tokens[:, self.start :].numpy(), rest, rows)

    def _take(self, host, event) -> None:
        if event is not None:
            event.synchronize()
        tok, origin = host[0].numpy(), host[1].numpy()
        self.stream.add(tok, host[2].numpy() if self.logprobs else None, origin)


class StaticDecoder:
    """Batched decoding over a preallocated KV cache, using the model's own modules and parameters.

    Only attention and the cache are written here (query heads grouped over their shared KV head, so the
    cache is read once per step, not once per query head); norms, projections, rotary embedding and MLP
    are the model's modules. One decode step is a fixed sequence of kernels whose shapes depend only on
    (batch rows, attended cache length, greedy), which is what lets a CUDA graph replay it. Step state
    (token, position, cache slot, output column, finished flags) lives in device tensors updated in place.
    The attended cache length grows in blocks, so early steps do not read the empty tail of the cache.
    """

    def __init__(
        self,
        model,
        stop_ids,
        pad_id: int,
        use_graphs: bool,
        block: int = 64,
        prefill_bytes: int = 1 << 30,
        fused: bool = False,
        compact: bool = False,
        check_every: int = 16,
        min_rows: int = 16,
        keyed: bool = False,
        linear_rows: int = LINEAR_ROWS,
        share_reads: bool = True,
    ):
        cfg = model.config
        layer_types = set(getattr(cfg, "layer_types", None) or ["full_attention"])
        if cfg.model_type not in FAST_MODEL_TYPES or layer_types != {"full_attention"}:
            raise ValueError(
                f"the static decoder supports full-attention {', '.join(FAST_MODEL_TYPES)} models, "
                f"not {cfg.model_type!r} (layer types {sorted(layer_types)}); use fast=False"
            )
        self.model, self.backbone = model, model.model
        self.layers = list(model.model.layers)
        self.n_heads, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.groups = self.n_heads // self.n_kv
        self.weight = model.get_input_embeddings().weight
        self.stop_list = sorted(stop_ids)
        # [S] padded to a power of two by repeating an id (the fused bookkeeping reads it as one tile)
        width = 1 << max(len(self.stop_list) - 1, 0).bit_length()
        self.stop_padded = self.stop_list + self.stop_list[:1] * (width - len(self.stop_list))
        self.stop = torch.tensor(self.stop_padded, device=self.weight.device)  # [S]
        self.pad_id = pad_id
        self.use_graphs, self.block, self.prefill_bytes = use_graphs, block, prefill_bytes
        self.graphs, self.pool, self.capture_stream = {}, None, None
        self.prefill_graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, list]] = {}  # shape -> graph, its inputs
        self.rows, self.cap = 0, 0
        self.fused = _FusedWeights(model) if fused else None
        if fused:
            from . import kernels  # noqa: F401  (fails here, with its reason, rather than mid-generation)

            if self.weight.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
                raise ValueError(
                    "fast='fused' on a CPU model runs only in Triton's interpreter, and this process "
                    "compiles Triton for its GPU: move the model to the GPU, set TRITON_INTERPRET=1 "
                    "before anything imports triton, or use fast=True"
                )
        # compact: every check_every steps (one host sync), once at most half the rows are still
        # decoding, move them to the front and continue at the next power-of-two width (>= min_rows)
        self.compact, self.check_every, self.min_rows = compact, check_every, min_rows
        self.linear_rows = linear_rows  # the fused step's own GEMMs up to this many rows, cuBLAS's above
        self.compactions = 0  # how often rows were dropped (benchmarks and tests read it)
        # keyed: each row's noise comes from its response key (response_keys), not from torch's stream.
        # The fused sampler is always keyed; the plain one only when asked (deterministic runs).
        self.keyed = keyed or fused
        # share_reads: the fused attention reads a row's prompt slots from the first row that carries the same
        # prompt, so a group reads one copy (every row still holds its own, which compaction moves with it)
        self.share_reads = share_reads
        # graph_prefill: replay a prefill shape's CUDA graph from its second call on (off: always eager)
        self.graph_prefill = True
        # stream_outputs: the engine's responses are cut and decoded to text block by block while later steps
        # run (run's ``stream``; off: all of it after the last step)
        self.stream_outputs = True

    def _allocate(self, rows: int, cap: int):
        """Grow the cache and step state; graphs captured on the old buffers are dropped with them."""
        if rows <= self.rows and cap <= self.cap:
            return
        rows, cap = max(rows, self.rows), max(cap, self.cap)
        # The pool's lifetime ends with its graphs: capturing into a pool whose graphs were all
        # freed trips the caching allocator's use-count assert, so start a fresh pool too.
        self.graphs.clear()
        self.prefill_graphs.clear()
        self.pool = None
        self.kv = None  # free the old cache before allocating the new one
        dev, L = self.weight.device, len(self.layers)
        self.kv = torch.zeros(L, 2, rows, self.n_kv, cap, self.head_dim, dtype=self.weight.dtype, device=dev)
        self.valid = torch.zeros(rows, cap, dtype=torch.bool, device=dev)  # [R, C] slot holds a real token
        self.arange = torch.arange(cap, device=dev)  # [C]
        self.tok = torch.zeros(rows, dtype=torch.long, device=dev)  # [R] token fed to the next step
        # a decode token's rotary position and cache slot follow from the output column: pos0 + step, slot0 + step
        self.pos0 = torch.zeros(rows, dtype=torch.long, device=dev)  # [R]
        self.slot0 = torch.zeros(1, dtype=torch.long, device=dev)
        self.done = torch.zeros(rows, dtype=torch.bool, device=dev)  # [R] stop token already emitted
        self.out_tok = torch.zeros(rows, cap, dtype=torch.long, device=dev)  # [R, C] sampled tokens
        self.out_lp = torch.zeros(rows, cap, dtype=torch.float32, device=dev)  # [R, C] their log-probs
        self.step = torch.zeros(1, dtype=torch.long, device=dev)  # output column the next token goes to
        self.inv_temp = torch.ones(1, dtype=torch.float32, device=dev)
        self.keys = torch.zeros(rows, dtype=torch.long, device=dev)  # [R] response key of each row's noise
        self.prompt_of = torch.zeros(rows, dtype=torch.long, device=dev)  # [R] the prompt a row carries
        self.share = torch.zeros(rows, dtype=torch.long, device=dev)  # [R] first row carrying the same prompt
        # the tallies of split launches, each left at zero by the launch that used it: one per row and KV
        # head for split attention; one per output tile for split-K GEMMs, which split only while their
        # tiles are fewer than the SMs
        tallies = rows * self.n_kv
        if self.fused is not None:
            from .kernels import sm_count

            tallies = max(tallies, sm_count(dev))
        self.counts = torch.zeros(tallies, dtype=torch.int32, device=dev)  # [tallies]
        if self.fused is not None:  # the model's rotary embedding at every cache position, read by position
            cos, sin = self.backbone.rotary_emb(self.weight.new_empty(1, cap, 1), self.arange[None])  # [1, C, D]
            self.cos, self.sin = cos[0].contiguous(), sin[0].contiguous()  # [C, D]
        self.rows, self.cap = rows, cap

    def _forward(self, ids, pos, slots, kv_len: int, r0: int, r1: int):
        """Run rows r0:r1 for tokens `ids` written to cache `slots`, attending to slots < kv_len.

        ids, pos: [B, T]; slots: [T]. Returns the final hidden state of the last token, [B, H].
        """
        B, T = ids.shape
        Hkv, G, D = self.n_kv, self.groups, self.head_dim
        bb = self.backbone
        x = bb.embed_tokens(ids)  # [B, T, H]
        cos, sin = bb.rotary_emb(x, pos)  # [B, T, D]
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, T, D]
        keys = self.arange[:kv_len]  # [K]
        # a key is visible if it holds a real token and is not in the future; each query also sees itself so
        # that left-padding rows never softmax over an empty set (their outputs are never attended to)
        keep = self.valid[r0:r1, None, :kv_len] & (keys[None, None, :] <= slots[None, :, None])  # [B, T, K]
        keep = keep | (keys[None, :] == slots[:, None])[None]  # [B, T, K]
        keep = keep[:, None, None]  # [B, 1, 1, T, K]
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)  # [B, T, H]
            q = attn.q_proj(h).view(B, T, -1, D)  # [B, T, Hq, D]
            k = attn.k_proj(h).view(B, T, -1, D)  # [B, T, Hkv, D]
            v = attn.v_proj(h).view(B, T, -1, D).transpose(1, 2)  # [B, Hkv, T, D]
            if hasattr(attn, "q_norm"):  # qwen3 normalizes each head before rotary
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B, Hq, T, D], [B, Hkv, T, D]
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            k_cache, v_cache = self.kv[i, 0, r0:r1], self.kv[i, 1, r0:r1]  # [B, Hkv, C, D]
            k_cache.index_copy_(2, slots, k.to(k_cache.dtype))
            v_cache.index_copy_(2, slots, v.to(v_cache.dtype))
            k_cache, v_cache = k_cache[:, :, :kv_len], v_cache[:, :, :kv_len]  # [B, Hkv, K, D]
            qg = q.reshape(B, Hkv, G * T, D)  # [B, Hkv, G*T, D] query heads grouped by their KV head
            s = (qg @ k_cache.transpose(-1, -2)).float() * attn.scaling  # [B, Hkv, G*T, K]
            s = s.view(B, Hkv, G, T, kv_len).masked_fill(~keep, float("-inf"))  # [B, Hkv, G, T, K]
            p = s.softmax(-1).to(q.dtype).view(B, Hkv, G * T, kv_len)  # [B, Hkv, G*T, K]
            o = (p @ v_cache).view(B, Hkv, G, T, D)  # [B, Hkv, G, T, D]
            o = o.permute(0, 3, 1, 2, 4).reshape(B, T, self.n_heads * D)  # [B, T, Hq*D]
            x = x + attn.o_proj(o)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return bb.norm(x[:, -1])  # [B, H]

    def _emit(self, hidden, B: int, greedy: bool):
        """Sample from the last hidden state and record the token; rows already stopped emit pad."""
        logits = self.model.lm_head(hidden)  # [B, V]
        if self.fused is not None:  # the draw and all of this bookkeeping in the sampler's two launches
            from .kernels import sample_and_record

            sample_and_record(
                logits,
                self.inv_temp,
                self.keys,
                self.step,
                greedy,
                self.tok,
                logits.new_empty(B, dtype=torch.float32),
                self.done,
                self.stop,
                self.pad_id,
                self.out_tok,
                self.out_lp,
            )
            self.step.add_(1)
            return
        if self.keyed:
            tok, lp = keyed_sample(logits, self.inv_temp, self.keys, self.step, greedy)  # [B], [B]
        else:
            tok, lp = sample_tokens(logits, self.inv_temp, greedy)  # [B], [B]
        done = self.done[:B]
        tok = tok.masked_fill(done, self.pad_id)
        lp = lp.masked_fill(done, 0.0)
        self.out_tok[:B].index_copy_(1, self.step, tok[:, None])
        self.out_lp[:B].index_copy_(1, self.step, lp[:, None])
        done.logical_or_((tok[:, None] == self.stop).any(-1))
        self.tok[:B].copy_(tok)
        self.step.add_(1)

    def _forward_fused(self, B: int, kv_len: int):
        """One decode token for rows :B through the fused kernels (kernels.py); returns [B, H] after the final norm.

        Up to ``linear_rows`` rows a layer is ``_own_layer``'s six launches, wider ``_cublas_layer``'s six
        (benchmarks/decode_kernels.py --widths times both at each width; an o_proj or down_proj bias adds one).
        """
        from .kernels import add_rms_norm

        f, E = self.fused, self.weight
        x = E.new_empty(B, E.shape[1])  # [B, H] residual stream, updated in place
        h = torch.empty_like(x)  # [B, H] the final norm's output
        own = B <= self.linear_rows
        if not own:  # the stream starts as the tokens' embedding rows (the first norm is folded into q|k|v)
            torch.index_select(E, 0, self.tok[:B], out=x)
        for i, layer in enumerate(self.layers):
            (self._own_layer if own else self._cublas_layer)(i, layer, x, kv_len)
        add_rms_norm(x, None, f.norms[-1], f.eps, h)  # both layers end adding into the stream
        return h

    def _attend(self, i: int, layer, qkv, kv_len: int, **norm):
        """Layer i's rotary embedding, cache write and attention: qkv [B, (Hq + 2 Hkv) * D] -> [B, Hq * D].
        ``norm``: rotary_attention's stream, eps and bias, where qkv is the stream's product with folded weights."""
        from .kernels import rotary_attention

        o = qkv.new_empty(qkv.shape[0], self.n_heads * self.head_dim)  # [B, Hq * D]
        args = (self.cos, self.sin, self.pos0, self.slot0, self.step, self.kv[i, 0], self.kv[i, 1])
        share = self.share if self.share_reads else None
        scaling = layer.self_attn.scaling
        return rotary_attention(qkv, *args, kv_len, scaling, o, counts=self.counts, share=share, **norm)

    def _cublas_layer(self, i: int, layer, x, kv_len: int) -> None:
        """Six launches for a wide step, no norm among them: cuBLAS's products read the stream itself (the
        norms' weights folded into theirs, _FusedWeights), attention and the SiLU-gate divide by each row's
        rms, and o_proj and down_proj add into the stream as cuBLAS writes them (the sum rounded once)."""
        from .kernels import silu_mul

        f, attn, mlp, B = self.fused, layer.self_attn, layer.mlp, x.shape[0]
        linear = torch.nn.functional.linear
        qkv = linear(x, f.wqkv_folded[i])  # [B, (Hq + 2 Hkv) * D], before the row's 1 / rms and the bias
        o = self._attend(i, layer, qkv, kv_len, stream=x, eps=f.eps, bias=f.bqkv[i])  # [B, Hq * D]
        self._add_product(x, o, attn.o_proj)
        gate_up = linear(x, f.wgu_folded[i])  # [B, 2I], before the row's 1 / rms
        act = silu_mul(gate_up, x.new_empty(B, gate_up.shape[1] // 2), stream=x, eps=f.eps)  # [B, I]
        self._add_product(x, act, mlp.down_proj)

    @staticmethod
    def _add_product(x, a, proj) -> None:
        """x += proj(a): one cuBLAS launch that adds as it writes, two with a bias."""
        if proj.bias is None:
            x.addmm_(a, proj.weight.t())
        else:
            x.add_(proj(a))

    def _own_layer(self, i: int, layer, x, kv_len: int) -> None:
        """Six launches for a narrow step, where kernel latency rather than work sets the time: our GEMMs
        normalise their operand as they read it (q|k|v, gate|up) or add into the stream as they write
        (o_proj), and cuBLAS's down_proj adds into the stream (at K = I it beats ours; its sum is rounded
        once, where the module rounds the product and then the sum)."""
        from .kernels import embed_norm_linear, linear_add, norm_linear, silu_mul

        f, attn, mlp, B = self.fused, layer.self_attn, layer.mlp, x.shape[0]
        qkv = x.new_empty(B, f.wqkv[i].shape[0])  # [B, (Hq + 2 Hkv) * D]
        if i == 0:  # the stream starts as the tokens' embedding rows, gathered as the projection reads them
            embed_norm_linear(self.tok, self.weight, x, f.norms[0], f.eps, f.wqkv[0], f.bqkv[0], qkv, self.counts)
        else:
            norm_linear(x, f.norms[2 * i], f.eps, f.wqkv[i], f.bqkv[i], qkv, self.counts)
        o = self._attend(i, layer, qkv, kv_len)  # [B, Hq * D]
        linear_add(o, attn.o_proj.weight, x, bias=attn.o_proj.bias, counts=self.counts)
        gate_up = x.new_empty(B, f.wgu[i].shape[0])  # [B, 2I]
        norm_linear(x, f.norms[2 * i + 1], f.eps, f.wgu[i], None, gate_up, self.counts)
        act = silu_mul(gate_up, x.new_empty(B, gate_up.shape[1] // 2))  # [B, I]
        self._add_product(x, act, mlp.down_proj)

    def refresh_weights(self) -> None:
        """Copy the model's current weights into the fused buffers (in place: captured graphs stay valid)."""
        if self.fused is not None:
            self.fused.refresh()

    def _decode(self, B: int, kv_len: int, greedy: bool):
        """One decode step for rows :B; every shape is fixed by (B, kv_len, greedy)."""
        if self.fused is not None:  # the kernels read position and slot from the step counter, not `valid`
            self._emit(self._forward_fused(B, kv_len), B, greedy)
            return
        slot = self.slot0 + self.step  # [1]
        self.valid[:B].index_fill_(1, slot, True)
        hidden = self._forward(self.tok[:B, None], (self.pos0[:B] + self.step)[:, None], slot, kv_len, 0, B)  # [B, H]
        self._emit(hidden, B, greedy)

    def _reset(self, B: int):
        for t in (self.tok, self.step):
            t.zero_()
        self.done[:B].zero_()

    def _step(self, B: int, kv_len: int, greedy: bool):
        """One decode step for rows :B: replay its CUDA graph, or, the first time this shape comes up,
        run it eagerly and capture it for the next time. The eager run does the step's real work and
        is also the warm-up a capture needs (kernels compiled, cuBLAS handles created); capturing only
        records kernels, so the step state is left as the eager run set it. Shapes a call never
        reaches are never captured."""
        graph = self.graphs.get((B, kv_len, greedy))
        if graph is not None:
            graph.replay()
            return
        self._decode(B, kv_len, greedy)
        if self.use_graphs:
            graph = self._record(lambda: self._decode(B, kv_len, greedy))
            if graph is not None:
                self.graphs[(B, kv_len, greedy)] = graph

    def _record(self, work) -> torch.cuda.CUDAGraph | None:
        """``work()``'s kernels recorded as a CUDA graph on a side stream (nothing runs; no compilation), or
        None, with a warning, when capture fails: the run goes on without graphs. Graphs share one memory
        pool, since they run one at a time and keep nothing in it between replays. capture_begin/end
        directly: torch.cuda.graph would also synchronise, collect garbage and empty the allocator's cache
        before each of the run's captures."""
        graph = torch.cuda.CUDAGraph()
        side = self.capture_stream = self.capture_stream or torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(side):
                graph.capture_begin(pool=self.pool)
                try:
                    work()
                finally:
                    graph.capture_end()
        except RuntimeError as e:  # keep the run going; the warning says why it is slower
            warnings.warn(f"CUDA graph capture failed, decoding without graphs from now on: {e}")
            self.use_graphs = False
            self.graphs.clear()
            self.prefill_graphs.clear()
            self.pool = None
            return None
        finally:
            torch.cuda.current_stream().wait_stream(side)
        self.pool = self.pool or graph.pool()
        return graph

    @torch.no_grad()
    def run(
        self,
        ids,
        mask,
        n_real: int,
        max_new_tokens: int,
        temperature: float,
        seed: int,
        ignore_eos: bool,
        keys: torch.Tensor | None = None,
        expand: torch.Tensor | None = None,
        stream: ResponseStream | None = None,
    ):
        """Decode B rows of left-padded prompts (rows past n_real are padding) -> tokens, log-probs.

        ids, mask: [B, P], a prompt per decoder row; or, with expand, [U, P], the distinct prompts.
        keys: [n_real] int64 response keys, which fix a keyed sampler's noise (``seed`` then goes unused);
        an unkeyed sampler draws from torch's stream seeded by ``seed``.
        expand: [B] int64, each decoder row's prompt as a row of ids/mask: each prompt is prefilled once
        and its cache copied to the rows that carry it.
        stream: takes the outputs every check_every steps, while the steps after them run (``_OutputBlocks``).
        Returns CPU tensors [n_real, steps]; after a row's stop token its entries are pad and 0.
        """
        U, P = ids.shape
        B = U if expand is None else expand.shape[0]
        greedy = temperature == 0
        self._allocate(max(B, U), _round_up(P + max_new_tokens, 256))
        kv_lens = [_round_up(P + t + 1, self.block) for t in range(max_new_tokens - 1)]  # decode step t
        compact = self.compact and not ignore_eos
        widths = self._widths(B) if compact else [B]
        self.inv_temp.fill_(1.0 if greedy else 1.0 / temperature)
        if ignore_eos:  # no row ever finishes: exactly max_new_tokens steps
            self.stop.fill_(-1)
        else:
            self.stop.copy_(torch.tensor(self.stop_padded))
        if self.keyed:
            if keys is None and not greedy:
                raise ValueError("a keyed sampler needs each response's key (response_keys)")
            self.keys[:B].zero_()
            if keys is not None:
                self.keys[:n_real].copy_(keys)
        else:
            torch.manual_seed(seed)

        self._reset(B)
        self.done[n_real:B] = True  # padding rows emit pad and do not hold up the early exit
        self.valid[: max(B, U)].zero_()
        self._prefill(ids, mask, expand, B, greedy)  # step is now 1: decode step t writes slot P + t
        self.slot0.fill_(P - 1)

        # origin[i]: the input row that decoder row i carries (-1: a filler row); outputs of rows
        # dropped by compaction are kept in tokens / logprobs, indexed by input row
        origin = torch.arange(B, device=self.tok.device)  # [width]
        tokens = torch.full((B, max_new_tokens), self.pad_id, dtype=torch.long, device=self.tok.device)  # [B, N]
        logprobs = torch.zeros(B, max_new_tokens, dtype=torch.float32, device=self.tok.device)  # [B, N]
        width, steps = B, max_new_tokens
        blocks = _OutputBlocks(stream) if stream is not None else None
        for t, kv_len in enumerate(kv_lens):
            self._step(width, kv_len, greedy)
            if t % self.check_every != self.check_every - 1:
                continue
            if blocks is not None:  # columns :t + 2 are written once these steps are done
                blocks.push(self.out_tok, self.out_lp, origin, width, t + 2)
            if ignore_eos:
                continue
            live = ~self.done[:width]  # [width]; one host sync per check_every steps
            n_live = int(live.sum())
            if n_live == 0:
                steps = t + 2
                break
            narrower = next(w for w in reversed(widths) if w >= n_live) if compact else width
            if narrower <= width // 2:
                origin = self._keep_rows(live, narrower, width, origin, tokens, logprobs, t + 2)
                self.compactions += 1
                width = narrower
        self._store_rows(origin, width, tokens, logprobs, steps)
        tokens, logprobs = tokens[:n_real, :steps].cpu(), logprobs[:n_real, :steps].cpu()
        if blocks is not None:
            blocks.close(tokens, logprobs)
        return tokens, logprobs

    def _prefill(self, ids, mask, expand, B: int, greedy: bool) -> None:
        """``_prefill_rows``, replayed as a CUDA graph from its shape's second call on. Run eagerly, its
        launches (a few dozen per layer, through the model's modules) cost the host far more time than
        the GPU; a shape's first call runs eagerly and is captured then, as a decode step is, and a replay
        reads its new inputs from buffers the graph owns. The graph holds the eager run's kernels, so the
        outputs do not depend on which ran."""
        key = (tuple(ids.shape), B, expand is not None, greedy)
        entry = self.prefill_graphs.get(key)
        if entry is None:
            self._prefill_rows(ids, mask, expand, B, greedy)
            if self.use_graphs and self.graph_prefill:
                inputs = [ids.clone(), mask.clone(), None if expand is None else expand.clone()]
                graph = self._record(lambda: self._prefill_rows(*inputs, B, greedy))
                if graph is not None:
                    self.prefill_graphs[key] = (graph, inputs)
            return
        graph, inputs = entry
        for buffer, new in zip(inputs, (ids, mask, expand)):
            if new is not None:
                buffer.copy_(new, non_blocking=True)
        graph.replay()

    def _prefill_rows(self, ids, mask, expand, B: int, greedy: bool) -> None:
        """Prefill prompt rows ids, mask [U, P] into cache rows :U, give decoder rows :B their prompt (expand
        [B], or row i is prompt i), and draw each row's first token. Row chunks bound the float32 [rows,
        heads, P, P] attention scores (and their softmax copies) to prefill_bytes; short prompts take one."""
        U, P = ids.shape
        chunk = max(1, self.prefill_bytes // (4 * 4 * self.n_heads * P * P))
        self.valid[:U, :P] = mask
        pos = (mask.long().cumsum(-1) - 1).clamp_min(0)  # [U, P] positions restart after left padding
        hidden = torch.cat(
            [
                self._forward(ids[r : r + chunk], pos[r : r + chunk], self.arange[:P], P, r, min(r + chunk, U))
                for r in range(0, U, chunk)
            ]
        )  # [U, H]
        last = mask.sum(-1) - 1  # [U] position of each prompt's last token
        if expand is not None:
            hidden, last = self._expand_prompts(expand, mask, hidden), last.index_select(0, expand)  # [B, H], [B]
        self._emit(hidden, B, greedy)
        self.pos0[:B] = last
        self.prompt_of[:B] = torch.arange(B, device=self.tok.device) if expand is None else expand
        self._share_rows(B)

    def _expand_prompts(self, expand, mask, hidden):
        """Give decoder row i the prefill of prompt expand[i]: rows :U of the cache (prompt slots :P, every
        layer) and validity hold the distinct prompts, hidden [U, H] their last hidden states. Returns [B, H]."""
        U, P = mask.shape
        self.valid[: expand.shape[0], :P] = mask.index_select(0, expand)  # [B, P]
        for layer in range(self.kv.shape[0]):  # one layer at a time bounds the temporary copy
            self.kv[layer, :, : expand.shape[0], :, :P] = self.kv[layer, :, :U, :, :P].index_select(1, expand)
        return hidden.index_select(0, expand)  # [B, H]

    def _share_rows(self, width: int) -> None:
        """Point each of rows :width at the first row carrying the same prompt (``share``)."""
        if self.fused is None or not self.share_reads:  # only the fused attention reads the map
            return
        p = self.prompt_of[:width]  # [width]
        self.share[:width] = (p[:, None] == p[None, :]).int().argmax(1)  # [width]: argmax takes the first

    def _widths(self, B: int) -> list[int]:
        """Decoder widths compaction may shrink to: B, then powers of two down to min_rows."""
        widths, w = [B], 1 << max(B - 1, 0).bit_length()
        while w // 2 >= self.min_rows:
            w //= 2
            if w < B:
                widths.append(w)
        return widths

    def _store_rows(self, origin, width: int, tokens, logprobs, cols: int) -> None:
        """Copy the first `cols` outputs of decoder rows :width to their input rows."""
        real = origin >= 0  # [width]
        tokens[origin[real], :cols] = self.out_tok[:width, :cols][real]
        logprobs[origin[real], :cols] = self.out_lp[:width, :cols][real]

    def _keep_rows(self, live, narrower: int, width: int, origin, tokens, logprobs, cols: int):
        """Drop finished rows: store every row's outputs, then move the live rows to rows :narrower.

        Slots past the live rows are filled with copies of row 0 marked done, so the narrower graph
        decodes only finished filler there. Returns the new origin ([narrower], -1 for filler).
        """
        self._store_rows(origin, width, tokens, logprobs, cols)
        keep = live.nonzero()[:, 0]  # [n_live]
        sel = torch.cat([keep, keep.new_zeros(narrower - keep.numel())])  # [narrower]
        for t in (self.tok, self.pos0, self.done, self.valid, self.out_tok, self.out_lp, self.keys, self.prompt_of):
            t[:narrower] = t.index_select(0, sel)
        for layer in range(self.kv.shape[0]):  # one layer at a time bounds the temporary copy
            self.kv[layer, :, :narrower] = self.kv[layer].index_select(1, sel)
        self.done[keep.numel() : narrower] = True
        self._share_rows(narrower)
        return torch.cat([origin[keep], origin.new_full((narrower - keep.numel(),), -1)])  # [narrower]


class _FusedWeights:
    """Concatenated projection weights for the fused decode step: q|k|v and gate|up, one GEMM each, as they
    are (a narrow step's own GEMMs normalise their operand) and with the preceding norm's weight folded in
    (a wide step's cuBLAS products read the stream itself).

    They are copies, so ``refresh`` must follow every weight update; norms, o_proj and down_proj
    are read from the model's own parameters. Two copies of the q|k|v and gate|up weights: 0.14 GB for
    SmolLM2-135M in bf16, about 1.7 GB for a 1.5B Qwen2.5.
    """

    def __init__(self, model):
        cfg = model.config
        layers = list(model.model.layers)
        attn, mlp, norm = layers[0].self_attn, layers[0].mlp, layers[0].input_layernorm
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        problems = []
        if hasattr(attn, "q_norm"):
            problems.append("per-head q/k norms")
        if getattr(cfg, "hidden_act", "silu") != "silu":
            problems.append(f"activation {cfg.hidden_act!r}")
        if head_dim & (head_dim - 1):
            problems.append(f"head_dim {head_dim} (not a power of two)")
        rope = getattr(cfg, "rope_scaling", None) or {}
        rope_type = rope.get("rope_type", rope.get("type"))
        if rope_type in ("dynamic", "longrope"):  # positions are read from a fixed table
            problems.append(f"{rope_type} rotary scaling")
        if not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")) or not hasattr(
            norm, "variance_epsilon"
        ):
            problems.append("a non-llama MLP or norm")
        if problems:
            raise ValueError(f"the fused decode step does not support {', '.join(problems)}; use fast=True")
        self.layers = layers
        self.eps = float(norm.variance_epsilon)
        # [in_0, post_0, in_1, post_1, ..., final]: entry 2i+1 is layer i's post-attention norm,
        # 2i+2 the next input norm
        self.norms = [
            w for layer in layers for w in (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
        ]
        self.norms.append(model.model.norm.weight)
        self.wqkv = [self._qkv_weight(layer) for layer in layers]  # [(Hq + 2 Hkv) * D, H] each
        self.bqkv = [self._qkv_bias(layer) for layer in layers]  # [(Hq + 2 Hkv) * D] or None
        self.wgu = [self._gate_up_weight(layer) for layer in layers]  # [2I, H] each
        # The same with the preceding norm's weight folded into each input column: RMSNorm(x) @ W^T is
        # (x @ (W * w)^T) / rms(x), so a wide step multiplies the stream itself and the consumer of the product
        # (attention, the SiLU-gate) divides by the row's rms: no norm launch between the layer's products.
        self.wqkv_folded = [torch.empty_like(w) for w in self.wqkv]  # [(Hq + 2 Hkv) * D, H] each
        self.wgu_folded = [torch.empty_like(w) for w in self.wgu]  # [2I, H] each
        self._fold()

    @staticmethod
    def _qkv_weight(layer):
        a = layer.self_attn
        return torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])

    @staticmethod
    def _gate_up_weight(layer):
        return torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight])

    @staticmethod
    def _qkv_bias(layer):
        a = layer.self_attn
        biases = [a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]
        return None if all(b is None for b in biases) else torch.cat(biases)

    @torch.no_grad()
    def _fold(self) -> None:
        """W * w in float32, rounded once to the weights' dtype."""
        for i in range(len(self.layers)):
            for folded, w, norm in ((self.wqkv_folded, self.wqkv, 2 * i), (self.wgu_folded, self.wgu, 2 * i + 1)):
                folded[i].copy_(w[i].float() * self.norms[norm].float()[None, :])

    @torch.no_grad()
    def refresh(self) -> None:
        for i, layer in enumerate(self.layers):
            self.wqkv[i].copy_(self._qkv_weight(layer))
            if self.bqkv[i] is not None:
                self.bqkv[i].copy_(self._qkv_bias(layer))
            self.wgu[i].copy_(self._gate_up_weight(layer))
        self._fold()


class _LogprobRecorder(LogitsProcessor):
    """A logits processor that records each sampled token's log-prob while `generate` runs.

    It sees the logits of step t and, at step t + 1, the token chosen from them, so it keeps one [B, V]
    log-softmax instead of generate's output_scores (all steps: 25 GB at batch 512 x 256 steps).
    Custom processors run before transformers' temperature warper, so the temperature is applied here.
    """

    def __init__(self, temperature: float):
        self.inv_temperature = 1.0 / temperature if temperature > 0 else 1.0
        self.prev, self.out = None, []

    def __call__(self, input_ids, scores):
        if self.prev is not None:
            self.out.append(self.prev.gather(-1, input_ids[:, -1:])[:, 0])  # [B]
        self.prev = torch.log_softmax(scores.float() * self.inv_temperature, -1)  # [B, V]
        return scores

    def finish(self, response):
        """response [B, steps] -> [B, steps] log-probs (the last token's from the kept distribution)."""
        self.out.append(self.prev.gather(-1, response[:, -1:])[:, 0])
        return torch.stack(self.out, 1)


class _KeyedSampler(LogitsProcessor):
    """Samples inside ``generate`` (run greedy) with keyed noise: it draws each row's token from its response
    key and the token position (``keyed_sample_tokens``, or the Philox kernel on CUDA) and leaves only that
    token possible. Runs after generate's own processors and after ``_LogprobRecorder``."""

    def __init__(self, keys: torch.Tensor, temperature: float, prompt_width: int):
        self.keys, self.prompt_width = keys, prompt_width
        self.inv_temperature = torch.tensor([1.0 / temperature], device=keys.device)

    def __call__(self, input_ids, scores):
        step = self.keys.new_tensor([input_ids.shape[1] - self.prompt_width])
        tok, _ = keyed_sample(scores, self.inv_temperature, self.keys, step, greedy=False)
        return torch.full_like(scores, float("-inf")).scatter_(1, tok[:, None], 0.0)


@contextmanager
def _seeded(seed: int, device: torch.device):
    """Seed torch for one call without disturbing the caller's random state."""
    devices = (
        [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    )
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def left_pad(rows: list[list[int]], batch: int, pad_id: int):
    """Left-pad rows to one length: CPU tensors ids, mask [batch, P]; rows past len(rows) repeat row 0 (graph
    batch buckets). All ids are converted at once, not a tensor per row."""
    rows = rows + [rows[0]] * (batch - len(rows))
    lengths = torch.tensor([len(r) for r in rows])  # [B]
    width = int(lengths.max())
    mask = torch.arange(width) >= width - lengths[:, None]  # [B, P]
    ids = torch.full((batch, width), pad_id, dtype=torch.long)  # [B, P]
    flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum()))  # [sum]
    ids[mask] = torch.from_numpy(flat)  # the mask selects row after row; numpy reads a list faster than torch
    return ids, mask


def prompt_rows(chunk: list[list[int]], batch: int, pad_id: int, share: bool = True):
    """A chunk's prompts as ``StaticDecoder.run`` takes them for ``batch`` decoder rows: CPU tensors ids,
    mask [U, P] and expand ([batch] or None).

    share: the U rows are the chunk's distinct prompts (by their tokens) in first-occurrence order, and rows
    past the chunk (graph bucket filler) carry its first prompt. When no prompt repeats, or without share,
    every decoder row is its own prompt row (expand None).
    """
    if share:
        first: dict[tuple[int, ...], int] = {}
        index = [first.setdefault(tuple(row), len(first)) for row in chunk]  # [len(chunk)]
        if len(first) < batch:
            ids, mask = left_pad([list(row) for row in first], len(first), pad_id)  # [U, P]
            return ids, mask, torch.tensor(index + [0] * (batch - len(chunk)))  # [batch]
    return *left_pad(chunk, batch, pad_id), None


class HFEngine(RolloutEngine):
    """Generation from a private copy of a transformers causal LM (bf16 on CUDA, float32 on CPU).

    fast: True uses the StaticDecoder (CUDA graphs on CUDA, the same loop run eagerly on CPU so tests can
    compare it with generate); "fused" also replaces each decode layer's small kernels and the sampler
    with the Triton kernels of kernels.py (interpreted on CPU; its sampler draws the same distribution
    from Philox noise, so seeded samples differ from the other paths); False uses `model.generate`;
    "auto" is "fused" on CUDA for the models it supports, else True there, and False on CPU.
    compact: drop finished rows from the decode batch (fast paths only; default: on for "fused").
    Responses are sampled from the same distributions, but rows draw different noise than without
    it, so seeded samples differ from the uncompacted paths.
    return_logprobs: defaults to True on CUDA and False on CPU, where generate's recorder costs time.
    keyed_sampling: every path draws a response's noise from its key (``response_keys``: seed, prompt
    position, sample index) and the token position, never from its row; the fused path always does.
    """

    def __init__(
        self,
        model,
        tokenizer,
        device=None,
        max_batch_size: int = 512,
        fast="auto",
        return_logprobs: bool | None = None,
        compact: bool | None = None,
        keyed_sampling: bool = False,
    ):
        device = torch.device(device) if device is not None else next(model.parameters()).device
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        engine_model = copy.deepcopy(model)
        for p in engine_model.parameters():  # parameters only: rotary inv_freq buffers stay float32
            p.data = p.data.to(device=device, dtype=dtype)
        for b in engine_model.buffers():
            b.data = b.data.to(device=device)
        self.model = engine_model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.device, self.max_batch_size = device, max_batch_size
        self.keyed_sampling = keyed_sampling
        self.return_logprobs = device.type == "cuda" if return_logprobs is None else return_logprobs
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        eos = self.model.generation_config.eos_token_id if self.model.generation_config is not None else None
        self.stop_ids = {tokenizer.eos_token_id} | ({eos} if isinstance(eos, int) else set(eos or []))
        if fast not in (True, False, "auto", "fused"):
            raise ValueError(f"fast must be True, False, 'auto' or 'fused', got {fast!r}")
        self.decoder = None
        # "auto" on CUDA tries the fused step, then the plain static decoder, then generate
        tries = {True: [False], "fused": [True], False: [], "auto": [True, False] if device.type == "cuda" else []}[
            fast
        ]
        for fused in tries:
            try:
                self.decoder = StaticDecoder(
                    self.model,
                    self.stop_ids,
                    self.pad_id,
                    use_graphs=device.type == "cuda",
                    fused=fused,
                    compact=fused if compact is None else compact,
                    keyed=keyed_sampling,
                )
                break
            except (ValueError, ImportError) as e:
                if fast != "auto":
                    raise
                warnings.warn(
                    f"HFEngine falls back to {'the unfused static decoder' if fused else 'eager generate'}: {e}"
                )
        self.fast = self.decoder is not None
        # the static decoder prefills each distinct prompt of a chunk once and copies its cache to the
        # prompt's n rows (off: every row prefills its own copy, which tests and benchmarks compare with)
        self.share_prefill = True
        # which decode path runs: "fused", "fast" (static decoder) or "eager" (model.generate); run records keep it
        self.path = "eager" if self.decoder is None else "fused" if self.decoder.fused is not None else "fast"

    @torch.no_grad()
    def update_weights(self, state_dict) -> None:
        """Copy the trainer's weights in place: parameter storage (and so captured graphs) stays valid."""
        own = self.model.state_dict()
        unexpected, missing = set(state_dict) - set(own), set(own) - set(state_dict)
        if unexpected or missing:
            raise KeyError(
                f"state_dict does not match the engine's model: unexpected {sorted(unexpected)[:5]}, "
                f"missing {sorted(missing)[:5]}"
            )
        for name, value in state_dict.items():
            own[name].copy_(value, non_blocking=True)
        if self.decoder is not None:
            self.decoder.refresh_weights()

    def _pad(self, rows: list[list[int]], batch: int):
        """``left_pad`` on the engine's device."""
        ids, mask = left_pad(rows, batch, self.pad_id)  # [B, P]
        return ids.to(self.device), mask.to(self.device)

    def _prompt_rows(self, chunk: list[list[int]]):
        """``prompt_rows`` for one chunk at its graph bucket, on the engine's device."""
        out = prompt_rows(chunk, self._bucket(len(chunk)), self.pad_id, self.share_prefill)
        return tuple(t if t is None else t.to(self.device) for t in out)

    def _bucket(self, n: int) -> int:
        """Graph batch size for n rows: powers of two (capped), so capture happens for few sizes."""
        if not (self.fast and self.decoder.use_graphs):
            return n
        return min(self.max_batch_size, 1 << (n - 1).bit_length())

    def _eager_chunk(self, rows, max_new_tokens, temperature, ignore_eos, keys=None):
        ids, mask = self._pad(rows, len(rows))
        keyed = keys is not None and temperature > 0  # keyed noise: generate runs greedy over the keyed choice
        kwargs = dict(
            max_new_tokens=max_new_tokens,
            do_sample=temperature > 0 and not keyed,
            eos_token_id=sorted(self.stop_ids),
            pad_token_id=self.pad_id,
        )
        if temperature > 0 and not keyed:
            kwargs.update(temperature=temperature, top_k=0, top_p=1.0)
        if ignore_eos:
            kwargs["min_new_tokens"] = max_new_tokens
        processors = [_LogprobRecorder(temperature)] if self.return_logprobs else []
        if keyed:
            processors.append(_KeyedSampler(keys.to(self.device), temperature, ids.shape[1]))
        recorder = processors[0] if self.return_logprobs else None
        out = self.model.generate(
            input_ids=ids,
            attention_mask=mask.long(),
            logits_processor=LogitsProcessorList(processors),
            **kwargs,
        )
        response = out[:, ids.shape[1] :]  # [B, steps]; finished rows are padded with pad (== EOS for SmolLM2)
        logprobs = recorder.finish(response).cpu() if recorder else None
        return response.cpu(), logprobs

    @torch.no_grad()
    def generate(
        self, prompt_ids, n: int, max_new_tokens: int, temperature: float, seed: int, ignore_eos: bool = False
    ) -> Generation:
        """ignore_eos runs exactly max_new_tokens steps (benchmarks); responses are then still cut at EOS."""
        if max_new_tokens < 1 or temperature < 0:
            raise ValueError(f"need max_new_tokens >= 1 and temperature >= 0, got {max_new_tokens}, {temperature}")
        rows, prompt_index = repeat_prompts(prompt_ids, n)
        keyed = self.keyed_sampling or (self.fast and self.decoder.keyed)
        keys = response_keys(seed, len(prompt_ids), n) if keyed else None  # [N]
        token_ids, finish, texts, logprobs = [], [], [], [] if self.return_logprobs else None
        with _seeded(seed, self.device), without_deterministic_algorithms():
            for c, start in enumerate(range(0, len(rows), self.max_batch_size)):
                chunk = rows[start : start + self.max_batch_size]
                chunk_keys = keys[start : start + len(chunk)] if keyed else None
                stream = None
                if self.fast:
                    ids, mask, expand = self._prompt_rows(chunk)
                    if self.decoder.stream_outputs:
                        stream = ResponseStream(self.tokenizer, len(chunk), self.stop_ids, logprobs is not None)
                    tokens, lps = self.decoder.run(
                        ids,
                        mask,
                        len(chunk),
                        max_new_tokens,
                        temperature,
                        seed + 7919 * c,
                        ignore_eos,
                        chunk_keys,
                        expand,
                        stream,
                    )
                else:
                    torch.manual_seed(seed + 7919 * c)
                    tokens, lps = self._eager_chunk(chunk, max_new_tokens, temperature, ignore_eos, chunk_keys)
                if stream is not None:  # cut and decoded block by block while the decoder ran
                    kept, reasons, kept_lps, kept_texts = stream.finish()
                else:
                    kept, reasons, kept_lps = cut_rows(tokens, lps if logprobs is not None else None, self.stop_ids)
                    kept_texts = decode_texts(self.tokenizer, kept)
                token_ids += kept
                finish += reasons
                texts += kept_texts
                if logprobs is not None:
                    logprobs += kept_lps
        return Generation(
            prompt_index=prompt_index, token_ids=token_ids, texts=texts, finish_reasons=finish, logprobs=logprobs
        )

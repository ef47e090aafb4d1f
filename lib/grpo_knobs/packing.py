"""The trainer's packed path: sequences back to back with no padding, attention that never
crosses a sequence boundary, and response log-probs without [tokens, vocab] float32 logits.

A micro-batch of m sequences becomes one row of N tokens without padding. Each token carries
its position inside its own sequence (rotary restarts at 0), and attention is causal within
each sequence only: variable-length flash attention on CUDA, one causal SDPA call per segment
elsewhere. Consecutive sequences with the same prompt (a GRPO group: G responses to one prompt)
share one copy of it: the prompt is a query segment of its own, each response a query segment
whose keys are the prompt's followed by its own, causal from the bottom-right corner. The
arithmetic per response is the unshared one; a group of G costs P + sum(R_i) tokens instead of
G * P + sum(R_i). The
output projection, log-softmax and gather run over chunks of response positions with the
logits recomputed in the backward pass, so memory holds one chunk of logits at a time.

Three backends run the same arithmetic: ``eager`` (plain torch ops), ``liger`` (liger-kernel's
fused RMSNorm, rotary and SwiGLU kernels with their own backward passes; CUDA only) and
``compiled`` (the decoder layer and the head through torch.compile; CUDA only).

The loss is the padded path's loss on the same responses (``grpo.clipped_surrogate_loss``),
written over flat token vectors; its statistics stay on the device and are read once per
update. ``tests/test_packing.py`` checks log-probs, loss and gradient norm against the
padded path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .grpo import STAT_NAMES, Sequence, token_surrogate

PACKED_MODEL_TYPES = ("llama", "qwen2")  # decoder layers this module's forward reproduces
BACKENDS = ("eager", "liger", "compiled")
# trainer_path -> backend
PACKED_BACKENDS = {"packed": "eager", "packed-liger": "liger", "packed-compiled": "compiled"}


def supports_packed(model: torch.nn.Module) -> bool:
    """Whether ``packed_hidden_states`` reproduces this model's forward pass."""
    cfg = model.config
    if getattr(cfg, "model_type", None) not in PACKED_MODEL_TYPES or getattr(cfg, "use_sliding_window", False):
        return False
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "mlp_bias", False):
        return False
    layer = model.base_model.layers[0]
    attn = layer.self_attn
    if not hasattr(layer.input_layernorm, "variance_epsilon"):
        return False
    return all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")) and not hasattr(attn, "q_norm")


def token_budget_micro_batches(
    lengths: list[int], max_tokens: int, shared: list[int] | None = None
) -> list[list[int]]:
    """Split indices, in order, into runs whose packed length stays within ``max_tokens``
    (no padding is counted); a sequence longer than the budget gets a micro-batch of its own.
    ``shared[i]``: tokens sequence i shares with sequence i - 1 (its prompt, when ``pack`` lays
    them out as one group), which it does not add unless it opens a micro-batch."""
    batches: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i, n in enumerate(lengths):
        cost = n - shared[i] if shared is not None and current else n
        if current and used + cost > max_tokens:
            batches.append(current)
            current, used, cost = [], 0, n
        current.append(i)
        used += cost
    if current:
        batches.append(current)
    return batches


def memory_token_budget(
    model: torch.nn.Module, device: torch.device, fraction: float = 0.5, cap: int = 131_072, fixed: bool = False
) -> int:
    """Tokens per packed micro-batch that fit in ``fraction`` of the device's free memory.

    Counts the bf16 activations the backward pass keeps per token and layer (norms, q/k/v,
    attention output and its log-sum-exp, MLP gate/up/product) with a 1.5x margin; the
    chunked log-prob head adds a fixed ~2 GiB that the fraction leaves room for.
    ``fixed``: size from the device's total memory instead (0.35 of it), so the split into
    micro-batches, and with it the order gradients are summed in, is the same in every run
    on that GPU model, whatever else holds memory at the time.
    """
    if device.type != "cuda":
        return 16_384
    c = model.config
    kv = c.num_key_value_heads * (c.hidden_size // c.num_attention_heads)
    per_layer = 6 * c.hidden_size + 2 * kv + 5 * c.intermediate_size
    per_token = int(1.5 * 2 * c.num_hidden_layers * per_layer)
    free, total = torch.cuda.mem_get_info(device)
    available = 0.35 * total if fixed else fraction * free
    return int(max(4096, min(cap, available // per_token)))


@dataclass
class PackedBatch:
    """m sequences in N tokens, Nr of them response tokens, attended as q query segments.

    Segment s attends to its keys ``kv_index[cu_seqlens_k[s]:cu_seqlens_k[s + 1]]`` (flat token
    positions), causally aligned at the bottom-right: the last query sees every key. A sequence that
    shares no prompt is one segment whose keys are its own tokens; a group sharing a prompt is the
    prompt's segment, then one per non-empty response with the prompt's keys before its own.
    """

    input_ids: torch.Tensor  # [N] tokens: each group's prompt once, then its responses
    position_ids: torch.Tensor  # [N] position inside its own sequence
    cu_seqlens: torch.Tensor  # [q + 1] int32 start of each query segment, then N
    cu_seqlens_k: torch.Tensor  # [q + 1] int32 start of each segment's keys in kv_index, then Nk
    kv_index: torch.Tensor | None  # [Nk] token position of each key; None: the keys are the queries (Nk = N)
    max_len: int  # longest query segment
    max_len_k: int  # longest key segment
    lengths: list[int]  # [q] query segment lengths (host copy, for the per-segment fallback)
    lengths_k: list[int]  # [q] key segment lengths (host copy)
    predict_index: torch.Tensor  # [Nr] flat position whose hidden state predicts each response token
    targets: torch.Tensor  # [Nr] response token ids
    segment: torch.Tensor  # [Nr] sequence (0..m-1) of each response token
    response_lengths: torch.Tensor  # [m] float32 response lengths
    response_split: list[int]  # [m] response lengths (host copy)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``; on CUDA through pinned memory, so the copy is queued without
    waiting for the work already on the GPU (a copy from pageable memory may wait for it)."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def shared_prompt_tokens(seqs: list[Sequence]) -> list[int]:
    """[m] prompt tokens each sequence shares with the one before it (``pack``'s groups): its prompt
    length when the two prompts are equal, else 0."""
    return [
        len(s.prompt_ids)
        if i and (s.prompt_ids is seqs[i - 1].prompt_ids or s.prompt_ids == seqs[i - 1].prompt_ids)
        else 0
        for i, s in enumerate(seqs)
    ]


def _prompt_groups(seqs: list[Sequence], share_prompts: bool) -> list[list[int]]:
    """Runs of consecutive sequences with one prompt (each its own run without ``share_prompts``)."""
    groups: list[list[int]] = []
    for i, n in enumerate(shared_prompt_tokens(seqs) if share_prompts else [0] * len(seqs)):
        if n and groups:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


class _Layout:
    """The host-side pieces of a ``PackedBatch``, one group at a time (numpy arrays, concatenated once)."""

    def __init__(self):
        self.ids, self.pos, self.keys, self.predict = [], [], [], []
        self.q_len: list[int] = []
        self.k_len: list[int] = []
        self.end = 0  # flat position after the last token laid out

    def segment(self, tokens: np.ndarray, positions: np.ndarray, keys: np.ndarray) -> None:
        self.ids.append(tokens)
        self.pos.append(positions)
        self.keys.append(keys)
        self.q_len.append(len(tokens))
        self.k_len.append(len(keys))
        self.end += len(tokens)

    def alone(self, seq: Sequence) -> None:
        """One sequence, one segment over its own tokens; position p + j - 1 predicts response token j."""
        p, start = len(seq.prompt_ids), self.end
        tokens = np.asarray([*seq.prompt_ids, *seq.response_ids], dtype=np.int64)
        self.segment(tokens, np.arange(len(tokens)), np.arange(start, start + len(tokens)))
        self.predict.append(start + p - 1 + np.arange(len(seq.response_ids)))

    def group(self, seqs: list[Sequence]) -> None:
        """The shared prompt once, then each non-empty response with the prompt's keys before its own;
        every response's first token is predicted by the prompt's last position."""
        p, start = len(seqs[0].prompt_ids), self.end
        prompt_keys = np.arange(start, start + p)  # [p]
        self.segment(np.asarray(seqs[0].prompt_ids, dtype=np.int64), np.arange(p), prompt_keys)
        for seq in seqs:
            r, at = len(seq.response_ids), self.end
            self.predict.append(np.concatenate([[start + p - 1], at + np.arange(r - 1)]).astype(np.int64)[:r])
            if r:
                keys = np.concatenate([prompt_keys, np.arange(at, at + r)])  # [p + r]
                self.segment(np.asarray(seq.response_ids, dtype=np.int64), p + np.arange(r), keys)


def pack(seqs: list[Sequence], device: torch.device | str = "cpu", share_prompts: bool = True) -> PackedBatch:
    """Lay sequences out back to back without padding; consecutive sequences with one prompt share
    it unless ``share_prompts`` is False. Index arrays are built on the host with numpy and moved in
    one transfer each (pinned and asynchronous on CUDA)."""
    device = torch.device(device)
    layout = _Layout()
    for group in _prompt_groups(seqs, share_prompts):
        if len(group) == 1:
            layout.alone(seqs[group[0]])
        else:
            layout.group([seqs[i] for i in group])
    resp_len = np.array([len(s.response_ids) for s in seqs], dtype=np.int64)  # [m]
    flat_ids = np.concatenate(layout.ids) if layout.ids else np.zeros(0, np.int64)  # [N]
    kv = np.concatenate(layout.keys) if layout.keys else np.zeros(0, np.int64)  # [Nk]
    targets = np.fromiter((t for s in seqs for t in s.response_ids), dtype=np.int64, count=int(resp_len.sum()))
    q_len, k_len = layout.q_len, layout.k_len

    def put(a, dtype: torch.dtype) -> torch.Tensor:
        return to_device(torch.from_numpy(np.ascontiguousarray(a)).to(dtype), device)

    identity = len(kv) == len(flat_ids)  # no group shares a prompt: every segment's keys are its queries
    return PackedBatch(
        input_ids=put(flat_ids, torch.long),
        position_ids=put(np.concatenate(layout.pos) if layout.pos else np.zeros(0, np.int64), torch.long),
        cu_seqlens=put(np.concatenate([[0], np.cumsum(q_len)]), torch.int32),
        cu_seqlens_k=put(np.concatenate([[0], np.cumsum(k_len)]), torch.int32),
        kv_index=None if identity else put(kv, torch.long),
        max_len=max(q_len, default=0),
        max_len_k=max(k_len, default=0),
        lengths=q_len,
        lengths_k=k_len,
        predict_index=put(np.concatenate(layout.predict) if layout.predict else np.zeros(0, np.int64), torch.long),
        targets=put(targets, torch.long),
        segment=put(np.repeat(np.arange(len(seqs)), resp_len), torch.long),
        response_lengths=put(resp_len, torch.float32),
        response_split=resp_len.tolist(),
    )


# ----------------------------------------------------------------------------- attention
def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _keys(k: torch.Tensor, v: torch.Tensor, kv_index: torch.Tensor | None):
    """Each segment's keys and values, [Nk, Hkv, D]: shared prompts are read once per response.
    index_select, whose backward (index_add) has a deterministic CUDA kernel under torch's
    deterministic algorithms."""
    if kv_index is None:
        return k, v
    return k.index_select(0, kv_index), v.index_select(0, kv_index)


def _varlen_cuda(q, k, v, layout: tuple, scale: float) -> torch.Tensor:
    """Causal variable-length flash attention: q [N, Hq, D], k/v [N, Hkv, D] -> [N, Hq, D].

    ``layout`` = (cu_seqlens, cu_seqlens_k, max_len, max_len_k, kv_index) of a ``PackedBatch``.
    Flash attention aligns the causal mask at the bottom-right when a segment has more keys than
    queries (a response after its shared prompt), and reads each key/value head for its group of
    query heads, so k and v are never repeated. This is the aten op, which carries its own C++
    autograd node; torch.nn.attention.varlen wraps the same op in a Python custom op whose
    dispatch, forward and backward, costs more host time than the kernels of a short micro-batch
    take on the GPU.
    """
    cu_q, cu_k, max_q, max_k, kv_index = layout
    k, v = _keys(k, v, kv_index)
    return torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, True, False, scale=scale)[0]


def _per_segment_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_index: torch.Tensor | None,
    lengths: list[int],
    lengths_k: list[int],
    scale: float,
) -> torch.Tensor:
    """Reference and CPU path: one causal SDPA call per segment, the mask aligned at the bottom-right.
    q [N, Hq, D], k/v [N, Hkv, D] -> [N, Hq, D]."""
    gqa = k.size(1) != q.size(1)
    k, v = _keys(k, v, kv_index)
    outs = []
    for qs, ks, vs in zip(q.split(lengths), k.split(lengths_k), v.split(lengths_k)):
        lq, lk = qs.size(0), ks.size(0)
        # A segment with as many keys as queries is plain causal; a response after its shared prompt
        # sees the whole prompt, then its own earlier tokens.
        mask = None if lq == lk else torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
        o = F.scaled_dot_product_attention(
            qs.transpose(0, 1),
            ks.transpose(0, 1),
            vs.transpose(0, 1),
            attn_mask=mask,
            is_causal=mask is None,
            scale=scale,
            enable_gqa=gqa,
        )  # [Hq, L, D]
        outs.append(o.transpose(0, 1))
    return torch.cat(outs)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm: float32 statistics, result in x's dtype times the weight."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x, weight, bias)


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float, fused) -> torch.Tensor:
    """RMSNorm of [N, H_model]: plain ops, or liger's kernel ("llama" casting: float32 statistics, x's dtype out)."""
    return _rms_norm(x, weight, eps) if fused is None else fused[0].apply(x, weight, eps, 0.0, "llama", False)


def _rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fused):
    """Rotary embedding of q [N, Hq, D] and k [N, Hkv, D]; cos/sin [N, 1, D] (plain) or [1, N, D] (liger,
    which takes [1, H, N, D] views of the same storage and rotates q and k in one kernel)."""
    if fused is None:
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    q, k = fused[1].apply(q[None].transpose(1, 2), k[None].transpose(1, 2), cos, sin)  # [1, H, N, D]
    return q.transpose(1, 2)[0], k.transpose(1, 2)[0]


def _silu_mul(gate: torch.Tensor, up: torch.Tensor, fused) -> torch.Tensor:
    return F.silu(gate) * up if fused is None else fused[2].apply(gate, up)


def _decoder_layer(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: tuple,
    w: tuple,
    eps: float,
    n_heads: int,
    n_kv: int,
    head_dim: int,
    attend,
    fused: tuple | None = None,
) -> torch.Tensor:
    """One llama decoder layer over a packed row: x [N, H_model] -> [N, H_model].

    ``w`` holds the layer's tensors (input norm, q/k/v/o weights and biases, post norm,
    gate/up/down) so that one compiled graph serves every layer. ``fused``: None for plain
    torch ops, or liger-kernel's (RMSNorm, rotary, SiLU-mul) functions, each of which replaces
    several elementwise passes over the activations in both directions. The residual stream
    stays float32 either way.
    """
    ln1, wq, bq, wk, bk, wv, bv, wo, bo, ln2, wg, wu, wd = w
    n = x.size(0)
    h = _norm(x, ln1, eps, fused)
    q = _linear(h, wq, bq).view(n, n_heads, head_dim)  # [N, Hq, D]
    k = _linear(h, wk, bk).view(n, n_kv, head_dim)  # [N, Hkv, D]
    v = _linear(h, wv, bv).view(n, n_kv, head_dim)  # [N, Hkv, D]
    q, k = _rotary(q, k, cos, sin, fused)
    if torch.is_autocast_enabled(q.device.type):  # SDPA under autocast runs in the low-precision dtype too
        low = torch.get_autocast_dtype(q.device.type)
        q, k, v = q.to(low), k.to(low), v.to(low)
    o = attend(q, k, v, layout, head_dim**-0.5).reshape(n, n_heads * head_dim)  # [N, Hq*D]
    x = x + _linear(o, wo, bo)
    h = _norm(x, ln2, eps, fused)
    return x + _linear(_silu_mul(_linear(h, wg, None), _linear(h, wu, None), fused), wd, None)


_COMPILED: dict[object, object] = {}


def _liger_ops():
    """liger-kernel's autograd functions (RMSNorm, rotary, SiLU-mul); ImportError names the missing package."""
    if "liger" not in _COMPILED:
        try:
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction
            from liger_kernel.ops.rope import LigerRopeFunction
            from liger_kernel.ops.swiglu import LigerSiLUMulFunction
        except ImportError as e:
            raise ImportError(f"trainer_path=packed-liger needs liger-kernel (pip install liger-kernel): {e}") from e
        _COMPILED["liger"] = (LigerRMSNormFunction, LigerRopeFunction, LigerSiLUMulFunction)
    return _COMPILED["liger"]


def _compile(fn):
    """torch.compile, dynamic in the token count. Under torch's deterministic algorithms Inductor also
    chooses kernel configurations without timing them: a choice made by benchmarking can differ from
    one process to the next, and with it a reduction's order."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    return torch.compile(fn, dynamic=True, options={"deterministic": True} if deterministic else None)


def _compiled_layer():
    key = ("layer", torch.are_deterministic_algorithms_enabled())
    if key not in _COMPILED:
        _COMPILED[key] = _compile(_decoder_layer)
    return _COMPILED[key]


def _layer_tensors(layer: torch.nn.Module) -> tuple:
    a, m = layer.self_attn, layer.mlp
    return (
        layer.input_layernorm.weight,
        a.q_proj.weight,
        a.q_proj.bias,
        a.k_proj.weight,
        a.k_proj.bias,
        a.v_proj.weight,
        a.v_proj.bias,
        a.o_proj.weight,
        a.o_proj.bias,
        layer.post_attention_layernorm.weight,
        m.gate_proj.weight,
        m.up_proj.weight,
        m.down_proj.weight,
    )


def liger_available() -> bool:
    """Whether liger-kernel's fused ops import here."""
    try:
        _liger_ops()
    except ImportError:
        return False
    return True


def check_backend(backend: str, device: torch.device) -> None:
    """Fail fast, in one line, on a backend this device or environment cannot run."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown packed backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    if backend in ("liger", "compiled") and device.type != "cuda":
        raise ValueError(f"the packed {backend} backend runs on CUDA only; use trainer_path=packed on {device.type}")
    if backend == "liger":
        _liger_ops()


def packed_hidden_states(model: torch.nn.Module, pb: PackedBatch, backend: str = "eager") -> torch.Tensor:
    """Final-norm hidden states [N, H_model] of a llama-style decoder over a packed batch.

    Uses the model's own parameters and rotary table; the layer arithmetic is LlamaDecoderLayer's
    with the attention call replaced by the variable-length one. ``backend``: ``eager``,
    ``liger`` (fused kernels) or ``compiled`` (one torch.compile graph, dynamic in N, shared by
    all layers); the last two on CUDA only.
    """
    base = model.base_model
    cfg = model.config
    n_heads, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    layout = (pb.cu_seqlens, pb.cu_seqlens_k, pb.max_len, pb.max_len_k, pb.kv_index)
    if pb.input_ids.is_cuda:
        attend = _varlen_cuda
    else:

        def attend(q, k, v, layout, scale):
            return _per_segment_sdpa(q, k, v, layout[4], pb.lengths, pb.lengths_k, scale)

    x = base.embed_tokens(pb.input_ids)  # [N, H_model]
    cos, sin = base.rotary_emb(x[None], pb.position_ids[None])  # [1, N, D] each
    fused = _liger_ops() if backend == "liger" else None
    if fused is None:
        cos, sin = cos[0, :, None, :], sin[0, :, None, :]  # [N, 1, D]
    layer_fn = _compiled_layer() if backend == "compiled" else _decoder_layer
    eps = base.layers[0].input_layernorm.variance_epsilon
    for layer in base.layers:
        w = _layer_tensors(layer)
        x = layer_fn(x, cos, sin, layout, w, eps, n_heads, n_kv, head_dim, attend, fused)
    return _rms_norm(x, base.norm.weight, base.norm.variance_epsilon)  # [N, H_model]


# ----------------------------------------------------------------------------- log-probs
def _head_forward(h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, temperature: float):
    """One chunk: h [c, H] (compute dtype), w [V, H] -> (target log-prob [c], log-sum-exp [c]) in float32."""
    z = (h @ w.t()).float()  # [c, V]
    if temperature != 1.0:  # each pass over [c, V] float32 costs more than the product itself
        z.div_(temperature)
    lse = torch.logsumexp(z, dim=-1)  # [c]
    return z.gather(1, targets[:, None])[:, 0] - lse, lse


def _head_backward(
    h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, g: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Gradient of sum(g * logp) w.r.t. one chunk's raw logits: [c, V] in the compute dtype.

    d logp / d z = onehot(target) - softmax(z), times 1/T for the raw logits."""
    z = (h @ w.t()).float()  # [c, V]
    if temperature != 1.0:
        z.div_(temperature)
    dz = z.sub_(lse[:, None]).exp_().mul_(-g[:, None])  # [c, V], in place: no second [c, V] buffer
    dz.scatter_add_(1, targets[:, None], g[:, None])
    if temperature != 1.0:
        dz.div_(temperature)
    return dz.to(h.dtype)


def _head_fns(compile: bool):
    if not compile:
        return _head_forward, _head_backward
    key = ("head", torch.are_deterministic_algorithms_enabled())
    if key not in _COMPILED:
        _COMPILED[key] = (_compile(_head_forward), _compile(_head_backward))
    return _COMPILED[key]


class _ChunkedTargetLogprob(torch.autograd.Function):
    """log softmax(h W^T / T)[target] for rows of h, a chunk of rows at a time.

    Forward keeps only h, W and the per-row log-sum-exp; backward recomputes each chunk's
    logits. Products run in ``dtype`` (bf16 under autocast, as the padded path's lm_head
    does), softmax and sums in float32; W's gradient accumulates in float32.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, chunk: int, dtype: torch.dtype, compile: bool):
        fwd, _ = _head_fns(compile)
        w = weight.to(dtype)
        outs, lses = [], []
        for s in range(0, hidden.size(0), chunk):
            o, lse = fwd(hidden[s : s + chunk].to(dtype), w, targets[s : s + chunk], temperature)
            outs.append(o)
            lses.append(lse)
        out = torch.cat(outs) if outs else hidden.new_zeros(0, dtype=torch.float32)  # [n]
        lse = torch.cat(lses) if lses else out
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.temperature, ctx.chunk, ctx.dtype, ctx.compile = temperature, chunk, dtype, compile
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, targets, lse = ctx.saved_tensors
        _, bwd = _head_fns(ctx.compile)
        chunk, dtype = ctx.chunk, ctx.dtype
        w = weight.to(dtype)
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if ctx.needs_input_grad[1] else None
        )
        grad_out = grad_out.float()
        for s in range(0, hidden.size(0), chunk):
            h = hidden[s : s + chunk].to(dtype)  # [c, H]
            dz = bwd(
                h, w, targets[s : s + chunk], lse[s : s + chunk], grad_out[s : s + chunk], ctx.temperature
            )  # [c, V]
            if grad_h is not None:
                grad_h[s : s + chunk] = (dz @ w).to(hidden.dtype)
            if grad_w is not None:
                grad_w += (dz.t() @ h).float()  # [V, H]
        return grad_h, (grad_w.to(weight.dtype) if grad_w is not None else None), None, None, None, None, None


def chunked_target_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk: int = 8192,
    compile: bool = False,
) -> torch.Tensor:
    """Log-probs of ``targets`` [n] under logits ``hidden [n, H] @ weight [V, H]^T / temperature``: [n] float32.

    Peak extra memory is one [chunk, V] float32 block instead of [n, V].
    """
    dtype = (
        torch.get_autocast_dtype(hidden.device.type) if torch.is_autocast_enabled(hidden.device.type) else hidden.dtype
    )
    with torch.autocast(hidden.device.type, enabled=False):
        return _ChunkedTargetLogprob.apply(
            hidden, weight, targets, float(temperature), int(chunk), dtype, compile and hidden.is_cuda
        )


def packed_token_logprobs(
    model: torch.nn.Module, pb: PackedBatch, temperature: float = 1.0, chunk: int = 8192, backend: str = "eager"
) -> torch.Tensor:
    """Log-probs of every response token of a packed batch: [Nr] float32, sequence after sequence."""
    hidden = packed_hidden_states(model, pb, backend)  # [N, H_model]
    h = hidden.index_select(0, pb.predict_index)  # [Nr, H_model]
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ValueError("packed log-probs assume an output projection without bias; use trainer_path=padded.")
    return chunked_target_logprobs(h, head.weight, pb.targets, temperature, chunk, backend == "compiled")


# ----------------------------------------------------------------------------- loss
def packed_surrogate_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    pb: PackedBatch,
    *,
    clip_low: float,
    clip_high: float,
    aggregation: str,
    global_batch_size: int,
    global_batch_tokens: float,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``grpo.clipped_surrogate_loss`` over flat response tokens.

    Args:
        logp, old_logp, ref_logp: [Nr] per response token; advantages: [m] per sequence.
    Returns:
        (loss, stats): the scalar share of the update loss, and [7] float32 sums named by
        ``STAT_NAMES`` (ratio_max is a max), left on the device.
    """
    adv = advantages.to(logp.dtype)[pb.segment]  # [Nr]
    t = token_surrogate(
        logp, old_logp, adv, clip_low=clip_low, clip_high=clip_high, ref_logp=ref_logp, kl_coef=kl_coef
    )  # [Nr] each
    per_token, ratio, log_ratio = t.per_token, t.ratio, t.log_ratio
    if aggregation == "sequence-mean":
        loss = (per_token / pb.response_lengths.clamp(min=1.0)[pb.segment]).sum() / global_batch_size
    elif aggregation == "token-mean":
        loss = per_token.sum() / global_batch_tokens
    else:
        raise ValueError(f"Unknown loss aggregation {aggregation!r}.")
    with torch.no_grad():
        low = t.clip_active & (ratio < 1.0 - clip_low)
        high = t.clip_active & (ratio > 1.0 + clip_high)
        approx_kl = (ratio - 1.0) - log_ratio
        n = logp.new_full((), float(logp.numel()))  # a fill, not a host-to-device copy (which would wait)
        stats = torch.stack(
            [
                n,
                low.sum().float(),
                high.sum().float(),
                ratio.sum(),
                ratio.max() if ratio.numel() else torch.ones((), device=logp.device),
                approx_kl.sum(),
                t.kl_penalty.sum(),
            ]
        ).float()  # [7]
    return loss, stats


def merge_stats(total: torch.Tensor | None, stats: torch.Tensor) -> torch.Tensor:
    """Sum two [7] stat vectors, taking the max for ratio_max."""
    if total is None:
        return stats
    out = total + stats
    out[4] = torch.maximum(total[4], stats[4])
    return out


# ----------------------------------------------------------------------------- trainer steps
def score_packed(
    model: torch.nn.Module,
    seqs: list[Sequence],
    micro: list[list[int]],
    device: torch.device,
    temperature: float,
    autocast,
    backend: str = "eager",
    share_prompts: bool = True,
) -> list[torch.Tensor]:
    """Per-response token log-probs ([len_i] float32 views of one flat tensor on ``device``).

    Nothing is copied to the host, so the updates that follow are queued without waiting for
    this pass; ``logprobs_to_host`` brings a collection's log-probs back in one transfer."""
    outs = []
    with torch.no_grad():
        for mb_idx in micro:
            pb = pack([seqs[i] for i in mb_idx], device, share_prompts)
            with autocast():
                outs.append(packed_token_logprobs(model, pb, temperature, backend=backend))  # [Nr_mb]
    order = [i for mb in micro for i in mb]
    flat = torch.cat(outs) if outs else torch.zeros(0, device=device)  # [sum Nr]
    pieces = flat.split([len(seqs[i].response_ids) for i in order])
    out: list[torch.Tensor | None] = [None] * len(seqs)
    for i, p in zip(order, pieces):
        out[i] = p
    return out  # type: ignore[return-value]


def logprobs_to_host(pieces: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per-response log-prob tensors on the host, in one device-to-host copy."""
    if not pieces:
        return []
    return list(torch.cat(pieces).cpu().split([p.numel() for p in pieces]))


def update_packed(
    model: torch.nn.Module,
    seqs: list[Sequence],
    idx: list[int],
    micro: list[list[int]],
    adv: torch.Tensor,
    old_logp: list,
    ref_logp: list | None,
    cfg,
    device: torch.device,
    autocast,
    backend: str = "eager",
    share_prompts: bool = True,
) -> torch.Tensor:
    """Forward, loss and backward of one update's responses ``idx`` over packed micro-batches
    (gradients accumulate; the caller clips and steps). ``cfg`` supplies clip_low, clip_high,
    loss_aggregation, kl_coef and temperature. ``adv`` [P*G] is on the host; the entries of
    ``old_logp``/``ref_logp`` should be on ``device`` (host ones are copied). Entries of
    ``old_logp`` that are None are taken from this pass (detached) and stored back. ``share_prompts``:
    see ``pack`` (the trainer always shares; benchmarks time both layouts).

    Returns [8] float32 on the device: the loss, then the sums named by ``STAT_NAMES``. Nothing
    here waits for the device; the trainer reads every update's values once per collection."""
    update_tokens = float(sum(len(seqs[i].response_ids) for i in idx))
    stats, loss_total = None, torch.zeros((), device=device)
    for mb_idx in micro:
        pb = pack([seqs[i] for i in mb_idx], device, share_prompts)
        with autocast():
            logp = packed_token_logprobs(model, pb, cfg.temperature, backend=backend)  # [Nr]
        if any(old_logp[i] is None for i in mb_idx):
            for i, piece in zip(mb_idx, logp.detach().split(pb.response_split)):
                old_logp[i] = piece if old_logp[i] is None else old_logp[i]
        old = torch.cat([old_logp[i] for i in mb_idx]).to(device)  # [Nr]
        ref = torch.cat([ref_logp[i] for i in mb_idx]).to(device) if ref_logp is not None else None  # [Nr]
        loss, st = packed_surrogate_loss(
            logp,
            old,
            to_device(adv[mb_idx], device),  # [m]
            pb,
            clip_low=cfg.clip_low,
            clip_high=cfg.clip_high,
            aggregation=cfg.loss_aggregation,
            global_batch_size=len(idx),
            global_batch_tokens=update_tokens,
            ref_logp=ref,
            kl_coef=cfg.kl_coef,
        )
        loss.backward()
        loss_total += loss.detach()
        stats = merge_stats(stats, st)
    if stats is None:
        stats = torch.zeros(len(STAT_NAMES), device=device)
    return torch.cat([loss_total[None], stats])  # [8]

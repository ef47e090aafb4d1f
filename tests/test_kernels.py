"""The fused decode kernels against plain torch: compiled on a GPU, in Triton's interpreter on CPU
(tests/conftest.py)."""

import pytest
import torch
from grpo_knobs.rollout import kernels as K

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def on_device():
    """Compiled kernels take GPU tensors only, so every tensor of these tests is made on DEVICE."""
    torch.set_default_device(DEVICE)
    yield
    torch.set_default_device(None)


def rotate_half(x):
    x1, x2 = x.chunk(2, -1)
    return torch.cat((-x2, x1), -1)


@pytest.mark.parametrize("with_delta", [False, True])
def test_add_rms_norm(with_delta):
    g = torch.Generator(DEVICE).manual_seed(0)
    x, delta, w = torch.randn(3, 40, generator=g), torch.randn(3, 40, generator=g), torch.randn(40, generator=g)
    x0, out = x.clone(), torch.empty(3, 40)
    K.add_rms_norm(x, delta if with_delta else None, w, 1e-5, out)
    stream = x0 + delta if with_delta else x0  # [3, 40]
    torch.testing.assert_close(x, stream)  # updated in place, or untouched
    torch.testing.assert_close(out, stream * torch.rsqrt(stream.pow(2).mean(-1, keepdim=True) + 1e-5) * w)


# rotary_attention with its default 32-bit offsets into the cache, and with the 64-bit ones it takes only for
# caches spanning 2^31 elements or more
VARIANTS = {"default": {}, "wide": dict(wide=True)}


@pytest.mark.parametrize("kv_len, step", [(32, 6), (64, 50), (40, 20)])
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("share", [None, [3, 1, 0]], ids=["own-prompt", "shared-prompt"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rotary_attention_writes_its_slot_and_attends_prompt_decodes_and_itself(kv_len, step, split, share, variant):
    """One fused launch against plain torch: rotary at each row's position, k and v written to cache slot
    slot0 + step only, then grouped-query softmax over the real prompt slots (a left-padded prompt of
    pos0[b] + 1 tokens ends at slot0), earlier decoded slots and the token itself; whole, or split into
    16-slot pieces that the last program to finish combines (at kv_len 40 the last block runs past the
    bucket, so its loads are masked). With share, row b's prompt slots (keys and values) are row share[b]'s
    and the rest its own; the padding before the prompt is masked whatever those slots hold. 32- and
    64-bit offsets give the same attention."""
    check_rotary_attention(kv_len, step, split, share, variant, n_q=6, n_kv=2)  # 3 query heads a KV head


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("n_q, n_kv", [(2, 2), (12, 2), (16, 2)], ids=["g1", "g6", "g8"])
def test_rotary_attention_takes_any_group_of_query_heads(split, n_q, n_kv):
    """The query heads of a KV head are padded to a power of two, at least 4 (the score product's short side):
    one head a group, six and eight attend as plain torch does."""
    check_rotary_attention(40, 20, split, [3, 1, 0], "default", n_q=n_q, n_kv=n_kv)


def check_rotary_attention(kv_len, step, split, share, variant, n_q, n_kv):
    g = torch.Generator(DEVICE).manual_seed(2)
    B, D, C = 3, 32, 70
    P = 9  # prompt slots 0..8, then decoded tokens; this token goes to slot P - 1 + step
    slot = P - 1 + step
    counts = torch.zeros(B * n_kv, dtype=torch.int32)
    qkv = torch.randn(B, (n_q + 2 * n_kv) * D, generator=g)
    cos_table, sin_table = torch.randn(C, D, generator=g), torch.randn(C, D, generator=g)  # [positions, D]
    pos0 = torch.tensor([2, 0, 7, 5])  # [rows]: 4 rows, 3 decoded; prompts of 3, 1, 8 and 6 tokens
    kv = torch.randn(2, 4, n_kv, C, D, generator=g)  # [k|v, rows, Hkv, C, D]
    before = kv.clone()
    out = torch.empty(B, n_q * D)
    K.rotary_attention(
        qkv,
        cos_table,
        sin_table,
        pos0,
        torch.tensor([P - 1]),
        torch.tensor([step]),
        kv[0],
        kv[1],
        kv_len,
        0.25,
        out,
        block_k=16,
        split=split,
        chunk=16,
        counts=counts,
        share=None if share is None else torch.tensor(share),
        **VARIANTS[variant],
    )
    assert not counts.any()  # the split tally is left at zero for the next launch
    pos = pos0[:B] + step
    cos, sin = cos_table[pos][:, None], sin_table[pos][:, None]  # [B, 1, D]
    q, k, v = qkv.split([n_q * D, n_kv * D, n_kv * D], -1)
    q, k, v = q.view(B, n_q, D), k.view(B, n_kv, D), v.view(B, n_kv, D)
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    torch.testing.assert_close(kv[0, :B, :, slot], k)
    torch.testing.assert_close(kv[1, :B, :, slot], v)
    changed = (kv != before).any(-1)  # [2, rows, Hkv, C]
    assert not changed[:, B:].any() and not changed[..., :slot].any() and not changed[..., slot + 1 :].any()
    src = torch.arange(B) if share is None else torch.tensor(share)  # [B]: the row holding each row's prompt
    prompt = torch.arange(C) < P  # [C]
    keys = torch.arange(C)
    real = keys >= (P - 1 - pos0[:B])[:, None]  # [B, C]: the prompt's tokens, not its left padding
    seen = torch.where(prompt, real, keys <= slot)[:, :kv_len]  # [B, K]: this token's slot included
    cache = torch.where(prompt[:, None], kv[:, src], kv[:, :B])  # [2, B, Hkv, C, D]
    kk = cache[0, :, :, :kv_len].repeat_interleave(n_q // n_kv, 1)  # [B, Hq, K, D]
    vv = cache[1, :, :, :kv_len].repeat_interleave(n_q // n_kv, 1)
    scores = torch.einsum("bhd,bhkd->bhk", q, kk) * 0.25
    p = scores.masked_fill(~seen[:, None], float("-inf")).softmax(-1)  # [B, Hq, K]
    torch.testing.assert_close(out, torch.einsum("bhk,bhkd->bhd", p, vv).reshape(B, -1))


def test_attention_launch_shape_follows_the_width(monkeypatch):
    """Unless the caller names one, a launch over whole caches (rows x KV heads at least twice the SMs) reads
    16-slot blocks four deep, and a launch that splits the caches of a narrow step 32-slot blocks two deep
    (kernels.launch_shape); a block and depth given win at any width."""
    seen = []  # (split, block, stages) of each launch, recorded instead of run

    class Spy:
        def __getitem__(self, grid):
            wide = grid[0] * grid[1] >= 2 * K.sm_count(torch.device(DEVICE))
            return lambda *args, **kw: seen.append((not wide, kw["BLOCK_K"], kw["num_stages"]))

    monkeypatch.setattr(K, "_rotary_attention_kernel", Spy())
    n_q, n_kv, D, C = 6, 2, 64, 128
    sms = K.sm_count(torch.device(DEVICE))
    for B, given in ((1, {}), (sms, {}), (sms, dict(block_k=64, num_stages=3))):
        qkv, out = torch.zeros(B, (n_q + 2 * n_kv) * D), torch.zeros(B, n_q * D)
        table, kv = torch.zeros(C, D), torch.zeros(2, B, n_kv, C, D)
        one = torch.zeros(1, dtype=torch.long)
        K.rotary_attention(qkv, table, table, torch.zeros(B, dtype=torch.long), one, one, *kv, C, 0.125, out, **given)
    assert seen == [(True, 32, 2), (False, 16, 4), (False, 64, 3)]


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_rotary_attention_applies_the_rows_norm_then_the_bias(split, bias):
    """With the residual stream given, qkv is the stream's product with norm-folded weights: the launch is the
    one on qkv / rms(stream) + bias, row by row (outputs and cache writes alike)."""
    g = torch.Generator(DEVICE).manual_seed(5)
    B, n_q, n_kv, D, C, H, P, step = 3, 6, 2, 32, 48, 40, 9, 20
    qkv = torch.randn(B, (n_q + 2 * n_kv) * D, generator=g)
    stream = torch.randn(B, H, generator=g) * torch.tensor([[0.1], [1.0], [7.0]])  # rows of unlike scales
    b = torch.randn(qkv.shape[1], generator=g) if bias else None
    cos, sin = torch.randn(C, D, generator=g), torch.randn(C, D, generator=g)
    kv = torch.randn(2, B, n_kv, C, D, generator=g)
    inv = torch.rsqrt(stream.pow(2).mean(-1, keepdim=True) + 1e-5)  # [B, 1]
    launches = []
    for given, extra in ((qkv * inv + (b if bias else 0.0), {}), (qkv, dict(stream=stream, eps=1e-5, bias=b))):
        cache, out = kv.clone(), torch.empty(B, n_q * D)
        fixed = (cos, sin, torch.tensor([2, 0, 7]), torch.tensor([P - 1]), torch.tensor([step]), cache[0], cache[1])
        K.rotary_attention(given, *fixed, 48, 0.25, out, block_k=16, split=split, chunk=16, **extra)
        launches.append((out, cache))
    (want, want_cache), (got, got_cache) = launches
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_cache, want_cache)


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rotary_attention_does_not_read_blocks_past_the_token(split, variant):
    """A 16-slot block wholly past the token (slots 16-31 for the token in slot 14) is not read: NaN there
    leaves the output bits as they are; a read would carry the NaN through the zero probabilities."""
    g = torch.Generator(DEVICE).manual_seed(3)
    B, n_q, n_kv, D, C, P, step = 2, 6, 2, 32, 40, 9, 6
    qkv = torch.randn(B, (n_q + 2 * n_kv) * D, generator=g)
    cos, sin = torch.randn(C, D, generator=g), torch.randn(C, D, generator=g)
    kv = torch.randn(2, B, n_kv, C, D, generator=g)
    outs = []
    for poison in (False, True):
        cache = kv.clone()
        if poison:
            cache[..., 16:32, :] = float("nan")
        out = torch.empty(B, n_q * D)
        args = (qkv, cos, sin, torch.zeros(B, dtype=torch.long), torch.tensor([P - 1]), torch.tensor([step]))
        K.rotary_attention(
            *args, cache[0], cache[1], 32, 0.25, out, block_k=16, split=split, chunk=16, **VARIANTS[variant]
        )
        outs.append(out)
    assert torch.isfinite(outs[1]).all() and torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("split", [False, True])
def test_rotary_attention_does_not_read_the_left_paddings_blocks(split):
    """A row whose prompt starts at slot 20 (of slots 0-22) does not read slots 0-15, its left padding's whole
    block: NaN there leaves the output bits as they are."""
    g = torch.Generator(DEVICE).manual_seed(4)
    B, n_q, n_kv, D, C, P, step = 2, 6, 2, 32, 64, 23, 5
    qkv = torch.randn(B, (n_q + 2 * n_kv) * D, generator=g)
    cos, sin = torch.randn(C, D, generator=g), torch.randn(C, D, generator=g)
    kv = torch.randn(2, B, n_kv, C, D, generator=g)
    pos0 = torch.tensor([2, 12])  # prompts of 3 and 13 tokens: slots 20-22 and 10-22
    outs = []
    for poison in (False, True):
        cache = kv.clone()
        if poison:
            cache[:, 0, :, :16] = float("nan")
        out = torch.empty(B, n_q * D)
        args = (qkv, cos, sin, pos0, torch.tensor([P - 1]), torch.tensor([step]), cache[0], cache[1], 32, 0.25, out)
        outs.append(K.rotary_attention(*args, block_k=16, split=split, chunk=16))
    assert torch.isfinite(outs[1]).all() and torch.equal(outs[0], outs[1])


def test_cache_offsets_go_64_bit_only_for_a_cache_spanning_2_31_elements():
    """rotary_attention addresses a cache view with 32-bit offsets unless the view reaches 2^31 elements past
    its first (meta tensors: shapes and strides without storage)."""
    kv = torch.zeros(3, 2, 4, 2, 8, 16)  # [layers, k|v, rows, Hkv, C, D]
    assert K._elements(kv[1, 0]) == 4 * 2 * 8 * 16  # a layer's keys: a view into the whole cache
    layer = torch.empty_strided((2**16 + 1, 2, 256, 64), (2 * 256 * 64, 256 * 64, 64, 1), device="meta")
    assert K._elements(layer[: 2**16]) == 2**31 and K._elements(layer[: 2**16 - 1]) < 2**31


def rms_norm(x, gamma):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * gamma


@pytest.mark.parametrize("tiles", [{}, {"BM": 16, "BN": 32, "BK": 32}])
def test_norm_linear_normalises_as_it_reads(tiles):
    """RMSNorm(x) * gamma @ W^T + b in one launch; K = 80 and N = 70 leave partial tiles in both loops."""
    g = torch.Generator(DEVICE).manual_seed(5)
    x, gamma = torch.randn(5, 80, generator=g), torch.randn(80, generator=g)
    w, b = torch.randn(70, 80, generator=g), torch.randn(70, generator=g)
    out = torch.empty(5, 70)
    K.norm_linear(x, gamma, 1e-5, w, b, out, **tiles)
    torch.testing.assert_close(out, torch.nn.functional.linear(rms_norm(x, gamma), w, b))


def test_embed_norm_linear_writes_the_stream_it_starts():
    g = torch.Generator(DEVICE).manual_seed(6)
    emb, gamma, w = torch.randn(11, 80, generator=g), torch.randn(80, generator=g), torch.randn(70, 80, generator=g)
    tokens = torch.tensor([3, 10, 0, 3, 7, 1])  # one more than the rows decoded
    x, out = torch.empty(5, 80), torch.empty(5, 70)
    K.embed_norm_linear(tokens, emb, x, gamma, 1e-5, w, None, out, BN=32)  # three column tiles: one writes x
    torch.testing.assert_close(x, emb[tokens[:5]])
    torch.testing.assert_close(out, torch.nn.functional.linear(rms_norm(x, gamma), w))


@pytest.mark.parametrize("split_k", [1, 3])
def test_linear_add_adds_the_product_to_the_stream(split_k):
    """x += a @ W^T + b in place; K = 70 in one program per tile, or in three 32-column parts (the last
    partly masked) that the last program to finish adds in order."""
    g = torch.Generator(DEVICE).manual_seed(7)
    a, w, b = torch.randn(5, 70, generator=g), torch.randn(80, 70, generator=g), torch.randn(80, generator=g)
    x = torch.randn(5, 80, generator=g)
    x0, counts = x.clone(), torch.zeros(3, dtype=torch.int32)  # 3 output tiles of 16 x 32
    K.linear_add(a, w, x, bias=b, counts=counts, BN=32, BK=32, SPLIT_K=split_k)
    assert not counts.any()
    torch.testing.assert_close(x, x0 + torch.nn.functional.linear(a, w, b))


@pytest.mark.skipif(DEVICE == "cpu", reason="Triton 3.6's interpreter gets bf16 tl.dot wrong; a GPU compiles it")
def test_own_gemms_round_where_the_modules_round_in_bf16():
    """In bf16: the normalised operand is rounded, then scaled by the weight and rounded (HF's RMSNorm), and a
    projection's product is rounded before its residual add; against torch's modules' arithmetic."""
    g = torch.Generator(DEVICE).manual_seed(8)
    bf = lambda *shape, s=1.0: (torch.randn(*shape, generator=g) * s).to(torch.bfloat16)  # noqa: E731
    x, gamma, w, b = bf(24, 576), bf(576), bf(960, 576, s=0.05), bf(960)
    out = torch.empty(24, 960, dtype=torch.bfloat16)
    K.norm_linear(x, gamma, 1e-5, w, b, out)
    xf = x.float()
    normed = gamma * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(torch.bfloat16)
    torch.testing.assert_close(out, torch.nn.functional.linear(normed, w, b), atol=2e-2, rtol=1.6e-2)
    a, w2 = bf(24, 576), bf(576, 576, s=0.05)
    x0 = x.clone()
    K.linear_add(a, w2, x)
    torch.testing.assert_close(x, x0 + torch.nn.functional.linear(a, w2), atol=2e-2, rtol=1.6e-2)


def test_silu_mul():
    gate_up = torch.randn(3, 100, generator=torch.Generator(DEVICE).manual_seed(3))
    out = torch.empty(3, 50)
    K.silu_mul(gate_up, out, block=32)  # two blocks per row, the second partly masked
    torch.testing.assert_close(out, torch.nn.functional.silu(gate_up[:, :50]) * gate_up[:, 50:])


def test_silu_mul_applies_the_rows_norm():
    """With the residual stream given, gate and up are first divided by the row's rms (the norm's weight is
    folded into the gate|up weights)."""
    g = torch.Generator(DEVICE).manual_seed(6)
    gate_up, stream = torch.randn(3, 100, generator=g), torch.randn(3, 40, generator=g) * 5.0
    out = torch.empty(3, 50)
    K.silu_mul(gate_up, out, block=32, stream=stream, eps=1e-5)
    scaled = gate_up * torch.rsqrt(stream.pow(2).mean(-1, keepdim=True) + 1e-5)  # [3, 100]
    torch.testing.assert_close(out, torch.nn.functional.silu(scaled[:, :50]) * scaled[:, 50:])


def test_sample_greedy_is_argmax_with_log_softmax():
    logits = torch.randn(5, 300, generator=torch.Generator(DEVICE).manual_seed(4))
    # exact ties go to the lowest column, as torch.argmax: across blocks (row 0) and across the
    # lanes of one block (row 1: column 33 sits in an earlier lane than column 3)
    logits[0, [40, 200]] = 10.0
    logits[1, [3, 33]] = 10.0
    tok, lp = torch.empty(5, dtype=torch.long), torch.empty(5)
    one, zero = torch.ones(1), torch.zeros(1, dtype=torch.long)
    K.sample(logits, one, torch.zeros(5, dtype=torch.long), zero, True, tok, lp, block=128)  # 3 blocks, 1 partial
    assert torch.equal(tok, logits.argmax(-1)) and tok[:2].tolist() == [40, 3]
    torch.testing.assert_close(lp, logits.log_softmax(-1).gather(-1, tok[:, None])[:, 0])


def test_sample_and_record_keeps_the_decoders_books():
    """Stopped rows emit pad with log-prob 0; tokens land in column `step`; a stop token ends its row."""
    logits = torch.full((4, 50), -5.0)
    logits[torch.arange(4), torch.tensor([7, 2, 9, 2])] = 5.0  # greedy picks 7, 2 (a stop id), 9, 2
    done = torch.tensor([False, False, False, True])
    tok, lp = torch.zeros(4, dtype=torch.long), torch.empty(4)
    out_tok, out_lp = torch.full((4, 6), -1, dtype=torch.long), torch.full((4, 6), -1.0)
    stop = torch.tensor([2, 0])  # two stop ids
    K.sample_and_record(
        logits,
        torch.ones(1),
        torch.zeros(4, dtype=torch.long),
        torch.tensor([3]),
        True,
        tok,
        lp,
        done,
        stop,
        1,
        out_tok,
        out_lp,
    )
    assert tok.tolist() == [7, 2, 9, 1] and out_tok[:, 3].tolist() == [7, 2, 9, 1]
    assert done.tolist() == [False, True, False, True]
    expected = logits.log_softmax(-1)[torch.arange(4), torch.tensor([7, 2, 9, 2])]
    torch.testing.assert_close(out_lp[:3, 3], expected[:3])
    assert out_lp[3, 3] == 0.0 and (out_tok[:, [0, 1, 2, 4, 5]] == -1).all()


def test_sample_draws_from_softmax_at_temperature():
    """Many rows of one distribution, one response key each: token frequencies match softmax(z / T) within 4
    standard errors, each draw reports its own log-prob, and the noise is fixed by (key, step) and changes
    with either."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -4.0])
    temperature = 0.7
    inv_t = torch.tensor([1 / temperature])

    def draw(seed, step, rows):
        tok, lp = torch.empty(rows, dtype=torch.long), torch.empty(rows)
        keys = seed * 1000 + torch.arange(rows)  # [rows] distinct keys
        K.sample(logits.expand(rows, -1), inv_t, keys, torch.tensor([step]), False, tok, lp, block=8)
        return tok, lp

    rows = 600  # the interpreter runs each row's program in Python (~15 ms); 4 SE still tells T = 0.7 from T = 1
    tok, lp = draw(123, 0, rows)
    probs = torch.softmax(logits / temperature, -1)
    freq = torch.bincount(tok, minlength=6).double() / rows
    assert (freq.cpu() - probs.cpu().double()).abs().max() < 4 * (probs * (1 - probs) / rows).sqrt().max().item()
    torch.testing.assert_close(lp, probs.log()[tok])
    few = draw(123, 0, 64)[0]
    assert torch.equal(draw(123, 0, 64)[0], few) and torch.equal(few, tok[:64])  # row r's noise is its own
    assert not torch.equal(draw(123, 1, 64)[0], few) and not torch.equal(draw(124, 0, 64)[0], few)

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


def test_rotary_cache_write_touches_only_its_slot_and_rows():
    g = torch.Generator(DEVICE).manual_seed(1)
    B, n_q, n_kv, D, C = 3, 4, 2, 16, 10
    qkv = torch.randn(B, (n_q + 2 * n_kv) * D, generator=g)
    cos_table, sin_table = torch.randn(C, D, generator=g), torch.randn(C, D, generator=g)  # [positions, D]
    pos = torch.tensor([4, 0, 9, 2])  # [rows]: each row's own position (the 4th row is not decoded)
    cos, sin = cos_table[pos[:B]], sin_table[pos[:B]]  # [B, D]
    kv = torch.zeros(2, 5, n_kv, C, D)  # [k|v, rows, Hkv, C, D]: 5 rows, 3 in use
    q_out = torch.empty(B, n_q, D)
    K.rotary_cache_write(qkv, cos_table, sin_table, pos, q_out, kv[0], kv[1], torch.tensor([7]))
    q, k, v = qkv.split([n_q * D, n_kv * D, n_kv * D], -1)
    q, k, v = q.view(B, n_q, D), k.view(B, n_kv, D), v.view(B, n_kv, D)
    torch.testing.assert_close(q_out, q * cos[:, None] + rotate_half(q) * sin[:, None])
    torch.testing.assert_close(kv[0, :B, :, 7], k * cos[:, None] + rotate_half(k) * sin[:, None])
    torch.testing.assert_close(kv[1, :B, :, 7], v)
    written = torch.zeros_like(kv, dtype=torch.bool)
    written[:, :B, :, 7] = True
    assert not kv[~written].any()


@pytest.mark.parametrize("kv_len", [1, 33, 67])
def test_decode_attention_matches_grouped_softmax(kv_len):
    g = torch.Generator(DEVICE).manual_seed(2)
    B, n_q, n_kv, D, C = 3, 6, 2, 16, 70  # 3 query heads per KV head (padded to 4 in the kernel)
    kv = torch.randn(2, 5, n_kv, C, D, generator=g)
    valid = torch.rand(5, C, generator=g) > 0.3  # [rows, C]
    valid[:, 0] = True  # every row attends to at least one slot
    q = torch.randn(B, n_q, D, generator=g)
    out = torch.empty(B, n_q * D)
    K.decode_attention(q, kv[0], kv[1], valid, kv_len, 0.25, out, block_k=16)
    k = kv[0, :B, :, :kv_len].repeat_interleave(n_q // n_kv, 1)  # [B, Hq, K, D]
    v = kv[1, :B, :, :kv_len].repeat_interleave(n_q // n_kv, 1)
    scores = torch.einsum("bhd,bhkd->bhk", q, k) * 0.25
    p = scores.masked_fill(~valid[:B, None, :kv_len], float("-inf")).softmax(-1)  # [B, Hq, K]
    torch.testing.assert_close(out, torch.einsum("bhk,bhkd->bhd", p, v).reshape(B, -1))


def test_silu_mul():
    gate_up = torch.randn(3, 100, generator=torch.Generator(DEVICE).manual_seed(3))
    out = torch.empty(3, 50)
    K.silu_mul(gate_up, out, block=32)  # two blocks per row, the second partly masked
    torch.testing.assert_close(out, torch.nn.functional.silu(gate_up[:, :50]) * gate_up[:, 50:])


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

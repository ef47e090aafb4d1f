"""Decode attention's rounding, emulated in torch on the CPU: the token's own term added after the loop over cache
blocks (the library) or inside the loop's last block (own-term-in-loop.diff), the probabilities rounded to bf16 before
the value product in both. The inputs are drawn as ab_bits.py draws them (CPU generator, so not the same values).
How many outputs differ, which heads, and how far each is from exact attention over the same rounded q, k and v."""

import torch

N_Q, N_KV, D, H = 9, 3, 64, 576
G = N_Q // N_KV
bf = torch.bfloat16


def rotate_half(x):
    a, b = x.chunk(2, -1)
    return torch.cat([-b, a], -1)


def run(rows, prompt, slot, seed, own_in_loop, block=16):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(rows, (N_Q + 2 * N_KV) * D, generator=g).to(bf).float()
    C = 320
    cos, sin = torch.randn(C, D, generator=g), torch.randn(C, D, generator=g)
    kv = torch.randn(2, rows, N_KV, C, D, generator=g).to(bf).float()
    inv = torch.rsqrt(torch.randn(rows, H, generator=g).to(bf).float().pow(2).mean(-1) + 1e-5)[:, None]
    share = (torch.arange(rows) // 8) * 8
    pos0 = torch.randint(prompt // 2, prompt, (rows,), generator=g)
    step = slot - prompt + 1
    pos = pos0 + step
    c, s = cos[pos][:, None], sin[pos][:, None]  # [B, 1, D]
    x = (qkv * inv).view(rows, N_Q + 2 * N_KV, D)
    q = (x[:, :N_Q] * c + rotate_half(x[:, :N_Q]) * s).to(bf).float()  # [B, Hq, D]
    k_new = (x[:, N_Q : N_Q + N_KV] * c + rotate_half(x[:, N_Q : N_Q + N_KV]) * s).to(bf).float()  # [B, Hkv, D]
    v_new = x[:, N_Q + N_KV :].to(bf).float()
    kv[0, :, :, slot], kv[1, :, :, slot] = k_new, v_new
    first = prompt - 1 - pos0  # [B]
    slots = torch.arange(C)
    src = torch.where(slots[None, :] < min(prompt, slot), share[:, None], torch.arange(rows)[:, None])  # [B, C]
    K = kv[0][src, :, slots[None, :]]  # [B, C, Hkv, D]
    V = kv[1][src, :, slots[None, :]]
    K = K.repeat_interleave(G, 2)  # [B, C, Hq, D]
    V = V.repeat_interleave(G, 2)
    end = slot + 1 if own_in_loop else slot
    m = torch.full((rows, N_Q), -1e30)
    den = torch.zeros(rows, N_Q)
    acc = torch.zeros(rows, N_Q, D)
    lo = int(first.min()) // block * block
    for start in range(lo, slot + 1, block):
        ks = torch.arange(start, start + block)
        ok = (ks[None, :] >= first[:, None]) & (ks[None, :] < end)  # [B, blk]
        sc = torch.einsum("bkhd,bhd->bkh", K[:, start : start + block], q) * 0.125  # [B, blk, Hq]
        sc = sc.masked_fill(~ok[:, :, None], float("-inf"))
        m_new = torch.maximum(m, sc.amax(1))
        alpha = torch.exp(m - m_new)
        p = torch.exp(sc - m_new[:, None])
        den = den * alpha + p.sum(1)
        m = m_new
        acc = acc * alpha[..., None] + torch.einsum("bkh,bkhd->bhd", p.to(bf).float(), V[:, start : start + block])
    if not own_in_loop:
        kq, vq = k_new.repeat_interleave(G, 1), v_new.repeat_interleave(G, 1)
        s_self = (q * kq).sum(-1) * 0.125
        m_new = torch.maximum(m, s_self)
        alpha = torch.exp(m - m_new)
        p_self = torch.exp(s_self - m_new).to(bf).float()
        acc = acc * alpha[..., None] + p_self[..., None] * vq
        den = den * alpha + torch.exp(s_self - m_new)
        self_max = s_self > m  # [B, Hq]: the token's own score above every earlier one
    out = (acc / den[..., None]).to(bf)
    # exact attention over the same rounded q, k, v, in float64
    okall = slots[None, : slot + 1] >= first[:, None]  # [B, slot + 1]
    sc = torch.einsum("bkhd,bhd->bkh", K[:, : slot + 1].double(), q.double()) * 0.125
    p = sc.masked_fill(~okall[:, :, None], float("-inf")).softmax(1)
    exact = torch.einsum("bkh,bkhd->bhd", p, V[:, : slot + 1].double())
    return out, (self_max if not own_in_loop else None), exact


for rows in (512, 64):
    for slot in (56, 70, 184, 300):
        a, self_max, exact = run(rows, 57, slot, rows + slot, False)
        b, _, _ = run(rows, 57, slot, rows + slot, True)
        diff = (a != b).any(-1)  # [B, Hq]: heads with any output moved
        print(
            f"rows {rows:>4} slot {slot:>3}: {(a != b).sum().item():>6} of {a.numel()} outputs differ; "
            f"heads moved {diff.float().mean().item():.4f}, heads whose own score tops every earlier one "
            f"{self_max.float().mean().item():.4f}, moved among those {diff[self_max].float().mean().item():.3f}, "
            f"moved among the rest {diff[~self_max].float().mean().item():.4f}"
        )
        ea = (a.double() - exact).abs()[diff].mean().item()
        eb = (b.double() - exact).abs()[diff].mean().item()
        print(
            f"    on the moved heads, mean |output - exact attention|: own term after the loop {ea:.3e}, "
            f"in the loop {eb:.3e}"
        )

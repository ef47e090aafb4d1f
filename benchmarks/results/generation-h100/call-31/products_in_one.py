"""What a wide layer's products cost as four launches against the same FLOPs in fewer launches (512 rows).

The decoder runs q|k|v, o_proj, gate|up and down_proj as four cuBLAS launches a layer, each waiting for the one
before it. Their FLOPs equal one product of 512 x 576 by 576 x 6144 (960 + 576 + 3072 columns at K = 576, and
down_proj's 576 columns at K = 1536 as 1536 columns at K = 576). The one-launch arms are not the layer (its
products depend on each other); they bound what fewer, longer kernels could take for the same work.

    python3 products_in_one.py
"""

import torch

from benchmarks.decode_kernels import per_launch_us

ROWS, H, INTER, REPS, ITERS = 512, 576, 1536, 30, 50
device = torch.device("cuda")
bf16 = dict(device=device, dtype=torch.bfloat16)


def randn(*shape):
    return torch.randn(*shape, **bf16) / shape[-1] ** 0.5


x, act = randn(ROWS, H), randn(ROWS, INTER)  # [M, H], [M, I]
wqkv, wo, wgu, wd = randn(960, H), randn(H, H), randn(2 * INTER, H), randn(H, INTER)  # [N, K] each
w_three, w_all = randn(960 + H + 2 * INTER, H), randn(960 + H + 3 * INTER, H)  # [N, K]
linear = torch.nn.functional.linear
arms = {
    "four launches, as the decoder (q|k|v, o_proj, gate|up, down_proj)": lambda: (
        linear(x, wqkv),
        linear(x, wo),
        linear(x, wgu),
        linear(act, wd),
    ),
    "two launches (q|k|v|o|gate|up at K = 576, down_proj)": lambda: (linear(x, w_three), linear(act, wd)),
    "one launch of the same FLOPs (576 x 6144)": lambda: linear(x, w_all),
}
flops = 2 * ROWS * H * (960 + H + 3 * INTER)
print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}; a layer's products: {flops / 1e9:.2f} GFLOP")
first = None
for name, fn in arms.items():
    us = min(per_launch_us(fn, REPS, ITERS, device) for _ in range(3))  # us per layer's worth
    first = first or us
    print(f"{name:<70} {us:7.2f} us a layer  {flops / us / 1e6:6.1f} TFLOP/s  {us / first:.3f}x")

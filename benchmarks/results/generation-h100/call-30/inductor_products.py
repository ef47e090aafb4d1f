"""A wide decode step's four layer products at 512 rows: cuBLAS (F.linear) against the best kernel that
torch.compile's max-autotune finds among cuBLAS and its own Triton templates (persistent TMA ones included
where this torch has them), each timed as the decoder runs them: 30 launches in one CUDA graph.

    python3 inductor_products.py   # SmolLM2-135M's shapes; inductor's autotune tables go to stderr
"""

import torch
import torch._inductor.config as inductor

from benchmarks.decode_kernels import per_launch_us

SHAPES = {"qkv": (960, 576), "o_proj": (576, 576), "gate_up": (3072, 576), "down_proj": (576, 1536)}  # (N, K)
ROWS, REPS, ITERS = 512, 30, 50

for name, value in (("max_autotune_gemm_backends", "ATEN,TRITON"), ("triton.enable_persistent_tma_matmul", True)):
    obj, _, attr = name.rpartition(".")
    target = getattr(inductor, obj) if obj else inductor
    if hasattr(target, attr):
        setattr(target, attr, value)
        print(f"inductor.{name} = {value}")

device = torch.device("cuda")
print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}")
print(f"{'product':<10} {'cuBLAS us':>10} {'compiled us':>12} {'compiled / cuBLAS':>18}")
for name, (n, k) in SHAPES.items():
    x = torch.randn(ROWS, k, device=device, dtype=torch.bfloat16)  # [M, K]
    w = torch.randn(n, k, device=device, dtype=torch.bfloat16) / k**0.5  # [N, K]
    compiled = torch.compile(torch.nn.functional.linear, mode="max-autotune-no-cudagraphs", dynamic=False)
    torch.testing.assert_close(compiled(x, w), torch.nn.functional.linear(x, w), rtol=2e-2, atol=2e-2)
    cublas = per_launch_us(lambda: torch.nn.functional.linear(x, w), REPS, ITERS, device)
    mine = per_launch_us(lambda: compiled(x, w), REPS, ITERS, device)
    cublas2 = per_launch_us(lambda: torch.nn.functional.linear(x, w), REPS, ITERS, device)
    base = min(cublas, cublas2)
    print(f"{name:<10} {base:10.2f} {mine:12.2f} {mine / base:17.3f}x   (cuBLAS twice: {cublas:.2f}, {cublas2:.2f})")

"""A wide layer's four products (512 rows, SmolLM2-135M's shapes) as the decoder launches them, 30 layers in one
CUDA graph: each layer's own weights (read from HBM, as in the decoder) against one layer's weights for all 30
(L2-hot after the first): how much of the products' time is waiting on their weights."""

import statistics

import torch

dev, bf = torch.device("cuda"), torch.bfloat16
R, H, INTER, QKV, L = 512, 576, 1536, 960, 30
g = torch.Generator(device=dev).manual_seed(0)
w = lambda *s: (torch.randn(*s, device=dev, generator=g) * 0.02).to(bf)  # noqa: E731
layers = [(w(QKV, H), w(H, H), w(2 * INTER, H), w(H, INTER)) for _ in range(L)]
x, o, act = w(R, H), w(R, H), w(R, INTER)
qkv, gu = torch.empty(R, QKV, device=dev, dtype=bf), torch.empty(R, 2 * INTER, device=dev, dtype=bf)


def step(ws):
    for wq, wo, wgu, wd in ws:
        torch.mm(x, wq.t(), out=qkv)
        x.addmm_(o, wo.t())
        torch.mm(x, wgu.t(), out=gu)
        x.addmm_(act, wd.t())


def timed(ws, reps=50):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step(ws)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(ws)
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / L)
    return statistics.median(out)


arms = {"own weights (HBM)": layers, "one layer's weights (L2)": [layers[0]] * L}
res = {k: [] for k in arms}
for _ in range(3):
    for k, ws in arms.items():
        res[k].append(timed(ws))
base = statistics.median(res["own weights (HBM)"])
for k, v in res.items():
    med, spread = statistics.median(v), " ".join(f"{t:.2f}" for t in v)
    print(f"{k:<28} {med:7.2f} us a layer [{spread}]  {med / base:.3f}x")

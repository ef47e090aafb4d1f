"""Every cuBLASLt algorithm cuBLAS offers for the wide decode step's products, timed as the decoder runs them.

The decoder's products at 512 rows go through torch (F.linear; addmm_ for o_proj and down_proj, which add into
the residual stream), so cuBLAS's heuristic picks one kernel a shape. This asks cuBLASLt for every algorithm
and configuration it will run at each shape (the heuristic's list, and every algorithm id crossed with its
tiles, stages, splits along K, reductions, swizzles and custom options that cublasLtMatmulAlgoCheck accepts),
times each as 30 launches over 30 layers' weights in one CUDA graph, then times the fastest few against
torch's launch in interleaved rounds, checks their outputs against torch's, and times a layer's four
products chained (q|k|v, o_proj adding, gate|up, down_proj adding) with torch's picks and with the best.

Random operands of SmolLM2-135M's shapes; bf16 in, float32 accumulate and scale, bf16 out, as torch calls it.

    python3 cublaslt_algos.py --rows 512 --json cublaslt.json
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import statistics
import time

import torch

H, INTER, QKV, VOCAB, LAYERS = 576, 1536, 960, 49152, 30
CUDA_R_32F, CUDA_R_16BF, COMPUTE_32F = 0, 14, 68
OP_N, OP_T = 0, 1
DESC_TRANSA, DESC_TRANSB = 3, 4
PREF_MAX_WORKSPACE = 1
CAP_SPLITK, CAP_REDUCTION_MASK, CAP_SWIZZLE, CAP_TILE_IDS, CAP_CUSTOM_MAX, CAP_STAGES_IDS = 0, 1, 2, 6, 7, 13
CFG_ID, CFG_TILE, CFG_SPLITK, CFG_REDUCTION, CFG_SWIZZLE, CFG_CUSTOM, CFG_STAGES, CFG_INNER, CFG_CLUSTER = range(9)
REDUCTIONS = {0: "none", 1: "inplace", 2: "compute", 4: "output"}
WORKSPACE = 32 << 20
CLUSTERS = (0, 2, 3, 5)  # auto, 1x1x1, 2x1x1, 1x2x1 (cublasLtClusterShape_t)


class Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class Heuristic(ctypes.Structure):
    _fields_ = [
        ("algo", Algo),
        ("workspace", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("waves", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


def load_lt() -> ctypes.CDLL:
    """The libcublasLt torch itself loaded (its path read from this process's maps after a first product)."""
    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    torch.nn.functional.linear(a, a)
    torch.cuda.synchronize()
    with open("/proc/self/maps") as f:
        paths = sorted({line.split()[-1] for line in f if "libcublasLt.so" in line})
    if not paths:
        raise SystemExit("libcublasLt is not loaded in this process")
    lib = ctypes.CDLL(paths[0])
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    lib.cublasLtMatrixLayoutCreate.argtypes = [
        ctypes.POINTER(vp),
        ctypes.c_int,
        ctypes.c_uint64,
        ctypes.c_uint64,
        ctypes.c_int64,
    ]
    lib.cublasLtMatmulDescCreate.argtypes = [ctypes.POINTER(vp), ctypes.c_int, ctypes.c_int]
    lib.cublasLtMatmulDescSetAttribute.argtypes = [vp, ctypes.c_int, vp, sz]
    lib.cublasLtMatmulPreferenceSetAttribute.argtypes = [vp, ctypes.c_int, vp, sz]
    lib.cublasLtMatmulAlgoGetHeuristic.argtypes = [
        vp,
        vp,
        vp,
        vp,
        vp,
        vp,
        vp,
        ctypes.c_int,
        ctypes.POINTER(Heuristic),
        ctypes.POINTER(ctypes.c_int),
    ]
    lib.cublasLtMatmulAlgoGetIds.argtypes = (
        [vp] + [ctypes.c_int] * 7 + [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    )
    lib.cublasLtMatmulAlgoInit.argtypes = [vp] + [ctypes.c_int] * 7 + [ctypes.POINTER(Algo)]
    lib.cublasLtMatmulAlgoCheck.argtypes = [vp, vp, vp, vp, vp, vp, ctypes.POINTER(Algo), ctypes.POINTER(Heuristic)]
    lib.cublasLtMatmulAlgoCapGetAttribute.argtypes = [ctypes.POINTER(Algo), ctypes.c_int, vp, sz, ctypes.POINTER(sz)]
    lib.cublasLtMatmulAlgoConfigSetAttribute.argtypes = [ctypes.POINTER(Algo), ctypes.c_int, vp, sz]
    lib.cublasLtMatmulAlgoConfigGetAttribute.argtypes = [
        ctypes.POINTER(Algo),
        ctypes.c_int,
        vp,
        sz,
        ctypes.POINTER(sz),
    ]
    lib.cublasLtMatmul.argtypes = [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, ctypes.POINTER(Algo), vp, sz, vp]
    lib.cublasLtGetVersion.restype = ctypes.c_size_t
    return lib


def ok(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what}: cuBLAS status {status}")


class Product:
    """out[M, N] (+)= x[M, K] @ W[N, K]^T in cuBLASLt's column-major terms: D (N x M) = op_T(W) @ x."""

    def __init__(self, lt, handle, name: str, M: int, N: int, K: int, add: bool, layers: int):
        self.lt, self.handle, self.name, self.M, self.N, self.K, self.add = lt, handle, name, M, N, K, add
        g = torch.Generator(device="cuda").manual_seed(0)
        bf16 = dict(device="cuda", dtype=torch.bfloat16, generator=g)
        self.w = [torch.randn(N, K, **bf16) / K**0.5 for _ in range(layers)]  # [N, K] each: a layer's weight
        self.x = torch.randn(M, K, **bf16)  # [M, K]
        self.out = torch.randn(M, N, **bf16)  # [M, N]: the stream o_proj and down_proj add into
        self.ws = torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(1.0 if add else 0.0)
        self.desc = ctypes.c_void_p()
        ok(lt.cublasLtMatmulDescCreate(ctypes.byref(self.desc), COMPUTE_32F, CUDA_R_32F), "desc")
        for attr, op in ((DESC_TRANSA, OP_T), (DESC_TRANSB, OP_N)):
            v = ctypes.c_int32(op)
            ok(lt.cublasLtMatmulDescSetAttribute(self.desc, attr, ctypes.byref(v), 4), "trans")
        self.a, self.b, self.c = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        ok(lt.cublasLtMatrixLayoutCreate(ctypes.byref(self.a), CUDA_R_16BF, K, N, K), "A")  # W as K x N, ld K
        ok(lt.cublasLtMatrixLayoutCreate(ctypes.byref(self.b), CUDA_R_16BF, K, M, K), "B")  # x as K x M, ld K
        ok(lt.cublasLtMatrixLayoutCreate(ctypes.byref(self.c), CUDA_R_16BF, N, M, N), "C")  # out as N x M, ld N

    def heuristic(self, count: int = 64) -> list[Heuristic]:
        pref = ctypes.c_void_p()
        ok(self.lt.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "pref")
        ws = ctypes.c_uint64(WORKSPACE)
        ok(self.lt.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE, ctypes.byref(ws), 8), "pref ws")
        results, n = (Heuristic * count)(), ctypes.c_int(0)
        ok(
            self.lt.cublasLtMatmulAlgoGetHeuristic(
                self.handle, self.desc, self.a, self.b, self.c, self.c, pref, count, results, ctypes.byref(n)
            ),
            "heuristic",
        )
        return [results[i] for i in range(n.value) if results[i].state == 0]

    def check(self, algo: Algo) -> Heuristic | None:
        r = Heuristic()
        s = self.lt.cublasLtMatmulAlgoCheck(
            self.handle, self.desc, self.a, self.b, self.c, self.c, ctypes.byref(algo), ctypes.byref(r)
        )
        return r if s == 0 and r.state == 0 and r.workspace <= WORKSPACE else None

    def launch(self, algo: Algo | None, layer: int, out: torch.Tensor | None = None) -> None:
        """One product with layer's weight: torch's own launch when algo is None."""
        out = self.out if out is None else out
        w = self.w[layer % len(self.w)]
        if algo is None:
            if self.add:
                out.addmm_(self.x, w.t())
            else:
                torch.mm(self.x, w.t(), out=out)
            return
        stream = torch.cuda.current_stream().cuda_stream
        s = self.lt.cublasLtMatmul(
            self.handle,
            self.desc,
            ctypes.byref(self.alpha),
            w.data_ptr(),
            self.a,
            self.x.data_ptr(),
            self.b,
            ctypes.byref(self.beta),
            out.data_ptr(),
            self.c,
            out.data_ptr(),
            self.c,
            ctypes.byref(algo),
            self.ws.data_ptr(),
            WORKSPACE,
            stream,
        )
        ok(s, f"{self.name} matmul")


def config(lt, algo: Algo) -> dict:
    def get(attr, ctype=ctypes.c_int32):
        v, n = ctype(0), ctypes.c_size_t(0)
        lt.cublasLtMatmulAlgoConfigGetAttribute(
            ctypes.byref(algo), attr, ctypes.byref(v), ctypes.sizeof(v), ctypes.byref(n)
        )
        return int(v.value)

    return {
        "id": get(CFG_ID),
        "tile": get(CFG_TILE),
        "stages": get(CFG_STAGES),
        "splitk": get(CFG_SPLITK),
        "reduction": REDUCTIONS.get(get(CFG_REDUCTION), "?"),
        "swizzle": get(CFG_SWIZZLE),
        "custom": get(CFG_CUSTOM),
        "inner": get(CFG_INNER, ctypes.c_uint16),
        "cluster": get(CFG_CLUSTER, ctypes.c_uint16),
    }


def key(c: dict) -> tuple:
    return tuple(
        c[k] for k in ("id", "tile", "stages", "splitk", "reduction", "swizzle", "custom", "inner", "cluster")
    )


def cap_list(lt, algo: Algo, attr: int) -> list[int]:
    n = ctypes.c_size_t(0)
    lt.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), attr, None, 0, ctypes.byref(n))
    count = n.value // 4
    if count == 0:
        return []
    buf = (ctypes.c_uint32 * count)()
    lt.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), attr, buf, ctypes.sizeof(buf), ctypes.byref(n))
    return list(buf)


def cap_int(lt, algo: Algo, attr: int) -> int:
    v, n = ctypes.c_int32(0), ctypes.c_size_t(0)
    lt.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), attr, ctypes.byref(v), 4, ctypes.byref(n))
    return int(v.value)


def exhaustive(p: Product, limit: int) -> list[Algo]:
    """Every algorithm id crossed with its capabilities, as far as cublasLtMatmulAlgoCheck accepts them, taken
    from the ids in turn (one configuration of each id, then the next of each), so a limit cuts every id alike."""
    lt = p.lt
    ids, n = (ctypes.c_int * 256)(), ctypes.c_int(0)
    types = (COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF)
    ok(lt.cublasLtMatmulAlgoGetIds(p.handle, *types, 256, ids, ctypes.byref(n)), "ids")
    streams = [_configs(p, types, algo_id) for algo_id in list(ids)[: n.value]]
    found = []
    while streams and len(found) < limit:
        for s in list(streams):
            algo = next(s, None)
            if algo is None:
                streams.remove(s)
            else:
                found.append(algo)
    return found[:limit]


def _configs(p: Product, types: tuple, algo_id: int):
    """The configurations of one algorithm id that cublasLtMatmulAlgoCheck accepts, one at a time."""
    lt = p.lt
    base = Algo()
    if lt.cublasLtMatmulAlgoInit(p.handle, *types, algo_id, ctypes.byref(base)) != 0:
        return
    tiles = cap_list(lt, base, CAP_TILE_IDS) or [0]
    stages = cap_list(lt, base, CAP_STAGES_IDS) or [0]
    splits = [1, 2, 3, 4, 6] if cap_int(lt, base, CAP_SPLITK) else [1]
    mask = cap_int(lt, base, CAP_REDUCTION_MASK)
    swizzles = [0, 1] if cap_int(lt, base, CAP_SWIZZLE) else [0]
    customs = range(min(cap_int(lt, base, CAP_CUSTOM_MAX), 3) + 1)
    combos = itertools.product(tiles, stages, splits, swizzles, customs, CLUSTERS)
    for tile, stage, split, swizzle, custom, cluster in combos:
        reductions = [0] if split == 1 else [r for r in (1, 2, 4) if mask & r]
        for red in reductions:
            algo = Algo()
            ctypes.memmove(ctypes.byref(algo), ctypes.byref(base), ctypes.sizeof(Algo))
            settings = ((CFG_TILE, tile), (CFG_STAGES, stage), (CFG_SPLITK, split), (CFG_REDUCTION, red))
            for attr, val in settings + ((CFG_SWIZZLE, swizzle), (CFG_CUSTOM, custom)):
                v = ctypes.c_uint32(val)
                lt.cublasLtMatmulAlgoConfigSetAttribute(ctypes.byref(algo), attr, ctypes.byref(v), 4)
            v16 = ctypes.c_uint16(cluster)
            lt.cublasLtMatmulAlgoConfigSetAttribute(ctypes.byref(algo), CFG_CLUSTER, ctypes.byref(v16), 2)
            if p.check(algo) is not None:
                yield algo


def graph_of(p: Product, algo: Algo | None, layers: int) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(layers):
            p.launch(algo, i)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(layers):
            p.launch(algo, i)
    return g


def us_per_launch(g: torch.cuda.CUDAGraph, launches: int, replays: int) -> float:
    g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / replays / launches


def max_rel_error(p: Product, algo: Algo) -> float:
    """Relative max |difference| of one launch against torch's (the stream reset before each)."""
    base = p.out.clone()
    p.launch(None, 0)
    want = p.out.float().clone()
    p.out.copy_(base)
    p.launch(algo, 0)
    got = p.out.float().clone()
    p.out.copy_(base)
    return float((got - want).abs().max() / want.abs().max())


def sweep(p: Product, limit: int, finalists: int, rounds: int, seconds: float) -> dict:
    t0 = time.perf_counter()
    heur = p.heuristic()
    cands: dict[tuple, tuple[Algo, str]] = {}
    for i, h in enumerate(heur):
        cands.setdefault(key(config(p.lt, h.algo)), (h.algo, f"heuristic #{i}"))
    for algo in exhaustive(p, limit):
        cands.setdefault(key(config(p.lt, algo)), (algo, "search"))
    screen = []
    for k, (algo, src) in cands.items():
        if time.perf_counter() - t0 > seconds:  # the heuristic's come first, so a cut leaves the search's tail
            break
        try:
            us = us_per_launch(graph_of(p, algo, LAYERS), LAYERS, 10)
        except RuntimeError as e:  # a configuration AlgoCheck took but the launch refused
            print(f"  skip {k}: {e}")
            continue
        screen.append((us, k, algo, src))
    screen.sort(key=lambda t: t[0])
    torch_us = us_per_launch(graph_of(p, None, LAYERS), LAYERS, 10)
    picked = screen[:finalists]
    h0 = next((s for s in screen if s[3] == "heuristic #0"), None)
    if h0 is not None and h0 not in picked:
        picked.append(h0)
    arms = [("torch", None, "torch")] + [(str(config(p.lt, a)), a, src) for _, _, a, src in picked]
    graphs = [graph_of(p, a, LAYERS) for _, a, _ in arms]
    times = [[] for _ in arms]
    for _ in range(rounds):
        for j, g in enumerate(graphs):
            times[j].append(us_per_launch(g, LAYERS, 50))
    rows = []
    base = statistics.median(times[0])
    for (name, algo, src), t in zip(arms, times):
        med = statistics.median(t)
        rows.append(
            {
                "algo": algo,
                "arm": src,
                "config": None if algo is None else config(p.lt, algo),
                "us": med,
                "min_us": min(t),
                "ratio": med / base,
                "max_rel_error": 0.0 if algo is None else max_rel_error(p, algo),
            }
        )
    return {
        "product": p.name,
        "M": p.M,
        "N": p.N,
        "K": p.K,
        "adds": p.add,
        "heuristic_count": len(heur),
        "candidates": len(cands),
        "screened": len(screen),
        "torch_screen_us": torch_us,
        "screen_best": [
            (
                round(us, 3),
                src,
                dict(zip(("id", "tile", "stages", "splitk", "reduction", "swizzle", "custom", "inner", "cluster"), k)),
            )
            for us, k, _, src in screen[:15]
        ],
        "finals": rows,
        "seconds": time.perf_counter() - t0,
        "ids_timed": sorted({k[0] for _, k, _, _ in screen}),
    }


def chain_us(prods: list[Product], algos: list[Algo | None], replays: int) -> float:
    """A layer's four products back to back over 30 layers in one graph: us a layer."""

    def work():
        for i in range(LAYERS):
            for p, a in zip(prods, algos):
                p.launch(a, i)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        work()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        work()
    return us_per_launch(g, LAYERS, replays)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--limit", type=int, default=20000, help="configurations searched a product at most")
    ap.add_argument("--finalists", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=90, help="screening time a product at most")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--lm-head", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    lt = load_lt()
    handle = ctypes.c_void_p()
    ok(lt.cublasLtCreate(ctypes.byref(handle)), "create")
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
        f"cuBLASLt {lt.cublasLtGetVersion()}",
        flush=True,
    )
    M = args.rows
    shapes = [
        ("qkv", QKV, H, False),
        ("o_proj", H, H, True),
        ("gate_up", 2 * INTER, H, False),
        ("down_proj", H, INTER, True),
    ]
    prods = [Product(lt, handle, n, M, N, K, add, LAYERS) for n, N, K, add in shapes]
    if args.lm_head:
        prods.append(Product(lt, handle, "lm_head", M, VOCAB, H, False, 1))
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": M, "products": []}
    best = []
    for p in prods:
        print(f"{p.name}: searching", flush=True)
        r = sweep(p, args.limit, args.finalists, args.rounds, args.seconds)
        report["products"].append(r)
        print(
            f"\n{p.name} [{M}x{p.K}] x [{p.K}x{p.N}]{' added into the stream' if p.add else ''}: "
            f"{r['heuristic_count']} heuristic results, {r['candidates']} configurations, "
            f"{r['screened']} timed, {r['seconds']:.0f} s; ids timed {r['ids_timed']}"
        )
        for row in r["finals"]:
            c = row["config"]
            desc = (
                "torch (cuBLAS's pick)"
                if c is None
                else (
                    f"{row['arm']:<13} id {c['id']:>3} tile {c['tile']:>3} stages {c['stages']:>3} "
                    f"splitK {c['splitk']} {c['reduction']:<7} swz {c['swizzle']} cust {c['custom']} "
                    f"inner {c['inner']} cluster {c['cluster']}"
                )
            )
            print(
                f"  {desc:<100} {row['us']:7.3f} us (min {row['min_us']:.3f})  {row['ratio']:.3f}x  "
                f"err {row['max_rel_error']:.1e}",
                flush=True,
            )
        fin = [row for row in r["finals"][1:] if row["max_rel_error"] < 2e-2]
        top = min(fin, key=lambda row: row["us"]) if fin else None
        best.append(None if top is None or top["ratio"] >= 1 else top)
    # a layer's products chained, torch's picks against the best configuration of each
    layer = prods[:4]
    algo_best = [None if b is None else b["algo"] for b in best]
    arms = {"torch": [None] * 4, "best": algo_best}
    chain = {name: [] for name in arms}
    for _ in range(args.rounds):
        for name, algos in arms.items():
            chain[name].append(chain_us(layer, algos, 50))
    t = {name: statistics.median(v) for name, v in chain.items()}
    print(
        f"\na layer's four products chained, 30 layers in one graph: torch {t['torch']:.2f} us a layer, "
        f"best {t['best']:.2f} ({t['best'] / t['torch']:.3f}x); "
        f"{30 * (t['torch'] - t['best']) / 1e3:.3f} ms a step of 30 layers"
    )
    report["chain_us_a_layer"] = chain
    for r in report["products"]:
        for row in r["finals"]:
            row.pop("algo")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()

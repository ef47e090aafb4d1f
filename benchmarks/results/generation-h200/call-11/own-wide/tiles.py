"""Best swept tiles per own GEMM and width from a decode_kernels --widths --tile-sweep JSON -> ~/tiles.json."""

import json
import os
import sys

rows = json.load(open(sys.argv[1]))
shapes = {"qkv (norm)": (960, 576), "o (+x)": (576, 576), "gate_up (norm)": (3072, 576), "down (+x)": (576, 1536)}
table = {}
for r in rows:
    if r.get("kernel") != "layer routes":
        continue
    for name, (n, k) in shapes.items():
        e = r[f"gemm {name}"]
        if e["sweep"]:
            best = {k2: v for k2, v in e["sweep"][0].items() if k2 != "us"}
            table[f"{r['width']}:{n}:{k}"] = best
            print(
                r["width"],
                name,
                "own default",
                round(e["default_us"], 2),
                "cuBLAS",
                round(e["cublas_us"], 2),
                "best",
                round(e["sweep"][0]["us"], 2),
                best,
            )
json.dump(table, open(os.path.expanduser("~/tiles.json"), "w"))

"""Where decode attention's warps wait: Nsight Compute's stall samples of call 42's launch, by reason and by place.

Reads source.csv.gz (ncu --page source --csv --print-source sass of the one profiled launch: 512 rows, the token in
slot 184) and prints the samples by stall reason, the share inside the loop over cache blocks (the range of its
backward branch) and before it, and the instructions holding the most samples.

    python stalls.py source.csv.gz
"""

import csv
import gzip
import re
import sys
from collections import Counter


def main(path: str) -> None:
    with gzip.open(path, "rt") as f:
        rows = list(csv.reader(f))
    head, data = rows[1], rows[2:]
    col = {h: i for i, h in enumerate(head)}
    reasons = [h for h in head if h.startswith("stall_") and "Not Issued" not in h]
    samples = [int(r[col["Warp Stall Sampling (All Samples)"]] or 0) for r in data]
    address = [int(r[col["Address"]], 16) for r in data]
    sass = [r[col["Source"]].strip() for r in data]
    total = sum(samples)
    loops = []  # (first, last) instruction index of each backward branch's range
    for i, text in enumerate(sass):
        target = re.search(r"BRA (0x[0-9a-f]+)", text)
        if target and int(target.group(1), 16) < address[i]:
            loops.append((address.index(int(target.group(1), 16)), i))
    first, last = max(loops, key=lambda lo_hi: lo_hi[1] - lo_hi[0])
    by_reason = Counter()
    for r in data:
        for h in reasons:
            by_reason[h] += int(r[col[h]] or 0)
    print(f"{total} samples over {len(data)} instructions")
    print("by reason: " + ", ".join(f"{h[6:]} {n / total:.1%}" for h, n in by_reason.most_common(6)))
    inside = sum(samples[first : last + 1])
    before = sum(samples[:first])
    print(
        f"the loop over cache blocks (instructions {first}-{last}, {last - first + 1} of them): {inside / total:.1%}; "
        f"before it: {before / total:.1%}; after it: {(total - inside - before) / total:.1%}"
    )
    print(f"{'#':>5} {'samples':>8} {'share':>6}  instruction  (top reasons)")
    for i in sorted(range(len(data)), key=lambda i: -samples[i])[:10]:
        top = sorted(((int(data[i][col[h]] or 0), h[6:]) for h in reasons), reverse=True)[:2]
        where = "loop" if first <= i <= last else "before" if i < first else "after"
        why = ", ".join(f"{name} {n}" for n, name in top if n)
        print(f"{i:>5} {samples[i]:>8} {samples[i] / total:6.1%}  [{where}] {sass[i][:48]}  ({why})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "source.csv.gz")

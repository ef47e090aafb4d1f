# Calls 40 and 41: one H100 80GB HBM3 (a plain call; an H100 came), the checkout at fd36d49 with results/, figures/
# and benchmarks/results/ out of the tree and l2_prefetch.py in probe/; no model (random operands of SmolLM2-135M's
# shapes, the library's attention, SiLU-gate and norm kernels, cuBLAS's products). From the checkout's root:
export PYTHONPATH=$PWD/lib:$PWD/probe:$PWD PYTHONUNBUFFERED=1

# call 40
A=base,As-kv16,As-kv32,As-kvall,Bs-kv32,As-w,As-kv32w,Am-kv32,Bm-kv32
timeout 150 python3 probe/l2_prefetch.py --arms $A --json pf-184.json 2>&1 | tee l2-prefetch.log
timeout 150 python3 probe/l2_prefetch.py --arms $A --slot 300 --bucket 320 --json pf-300.json 2>&1 | tee -a l2-prefetch.log

# call 41, the same machine: a branch asking for one slot a row (kv0) sizes what the fork, the launch and the
# join cost without the bytes
A=base,As-kv0,As-kv16,As-kv32,As-w,Am-kv0,Am-kv32
timeout 100 python3 probe/l2_prefetch.py --arms $A --rounds 4 --json pf2-184.json 2>&1 | tee l2-prefetch-2.log

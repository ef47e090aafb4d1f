# Calls 62-63: one H100 80GB HBM3 (asked for as nvidia-h200; an H100 came), the checkout at 300600e with results/,
# figures/ and benchmarks/results/ out of the tree and, in probe/: gus.py (the kernel) and ab_gus.py (here). Call 62
# staged the model's first half and the gguf wheel, call 63 the second half and ran the comparison (as in ../call-58).
# From the checkout's root:
export PYTHONPATH=$PWD/lib:$PWD GRPO_KNOBS_GGUF=$HOME/model/SmolLM2-135M-Instruct.Q4_1.gguf \
  GRPO_KNOBS_CACHE=$HOME/cache PYTHONPYCACHEPREFIX=$HOME/pyc PYTHONUNBUFFERED=1

# gate|up and the SiLU-gate in one launch (five tile shapes: BM-BN-BK-warps-stages) against cuBLAS's gate|up and the
# library's SiLU-gate: alone, 30 layers' weights in one CUDA graph, then inside the fused decode steps of the rollout
# benchmark's 512-row, 256-step call, one engine an arm, three interleaved rounds
timeout 500 python3 probe/ab_gus.py --rounds 3 \
  --arms 64-64-64-4-4,64-64-64-4-3,128-64-64-8-3,64-128-64-8-3,64-32-64-4-4 --json ab-gus.json > ab-gus.log 2>&1
# (ab-gus.log: the loaders' progress bars filtered out)

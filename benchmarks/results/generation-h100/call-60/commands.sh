# Calls 60-61: one H100 80GB HBM3 (asked for as nvidia-h200; an H100 came), the checkout at 906d845 with results/,
# figures/ and benchmarks/results/ out of the tree and, in probe/: pf_kernels.py (lib/grpo_knobs/rollout/kernels.py
# with prefetch.diff applied), ab_prefetch.py and products_l2.py (here). The model staged in calls 60 and 61 as in
# ../call-58. From the checkout's root:
export PYTHONPATH=$PWD/lib:$PWD GRPO_KNOBS_GGUF=$HOME/model/SmolLM2-135M-Instruct.Q4_1.gguf \
  GRPO_KNOBS_CACHE=$HOME/cache PYTHONPYCACHEPREFIX=$HOME/pyc PYTHONUNBUFFERED=1
mkdir -p probe && cp lib/grpo_knobs/rollout/kernels.py probe/pf_kernels.py && patch probe/pf_kernels.py < prefetch.diff

# call 60: a wide layer's four products with each layer's weights against one layer's weights for all 30 (L2-hot)
python3 probe/products_l2.py > products-l2.log 2>&1

# call 61: the library's wide layer against the prefetching variants inside the fused decode steps, one engine an
# arm, three interleaved rounds; every arm's tokens compared with the library's
timeout 500 python3 probe/ab_prefetch.py --rounds 3 --arms copy,s0,s1,e0,e1 --json ab-prefetch.json > ab-prefetch.log 2>&1
# (ab-prefetch.log: the loaders' progress bars filtered out)

# On the development machine (no GPU): both variants compiled for sm_90, their prefetch instructions counted in the PTX
python probe/compile_check.py

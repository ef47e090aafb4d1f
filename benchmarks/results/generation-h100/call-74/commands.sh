# Call 74: one H100 80GB HBM3 (asked for as nvidia-h200; an H100 came), the checkout at 2f780f6 with results/,
# figures/ and benchmarks/results/ out of the tree. Two calls before it on the same machine staged the model, as
# ../call-69 did (its first half and the gguf wheel, then the second half). From the checkout's root:
export PYTHONPATH=$PWD/lib:$PWD GRPO_KNOBS_GGUF=$HOME/model/SmolLM2-135M-Instruct.Q4_1.gguf \
  GRPO_KNOBS_CACHE=$HOME/cache PYTHONPYCACHEPREFIX=$HOME/pyc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > gpu.txt

# the figure at main's head: 512 rows, all paths in one run, three timed calls a path
# (rollout-512.log: the loaders' progress bars filtered out)
python3 -m benchmarks.rollout --batches 512 --new-tokens 256 --paths eager,fast,fused --out rollout-512.json

# the fused kernels' and the rollout's CUDA tests (the last 15 lines of pytest's output)
timeout 200 python3 -m pytest -q -x tests/test_kernels.py tests/test_rollout.py -k "cuda or kernel" \
  -p no:cacheprovider | tail -15 > tests-kernels-rollout.log

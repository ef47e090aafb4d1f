# Calls 58-59: one H100 80GB HBM3 (asked for as nvidia-h200; an H100 came), the checkout at 906d845 with results/,
# figures/ and benchmarks/results/ out of the tree. Call 58 staged the model's first half and the gguf wheel, call 59
# the second half and ran the benchmark (as in ../../generation-h200/call-27). From the checkout's root:
export PYTHONPATH=$PWD/lib:$PWD GRPO_KNOBS_GGUF=$HOME/model/SmolLM2-135M-Instruct.Q4_1.gguf \
  GRPO_KNOBS_CACHE=$HOME/cache PYTHONPYCACHEPREFIX=$HOME/pyc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > gpu.txt

# the rollout benchmark, all paths in one run, three timed calls a path (the default --repeats 3)
timeout 480 python3 -m benchmarks.rollout --batches 512 --new-tokens 256 --paths eager,fast,fused --out rollout.json \
  2>&1 | tee rollout.log

# Calls 69-70: one H100 80GB HBM3 (asked for as nvidia-h200; an H100 came), the checkout at 661fbb0 with results/,
# figures/ and benchmarks/results/ out of the tree. Call 69 staged the model's first half and the gguf wheel, call 70
# the second half and ran the table (as in ../call-58). From the checkout's root:
export PYTHONPATH=$PWD/lib:$PWD GRPO_KNOBS_GGUF=$HOME/model/SmolLM2-135M-Instruct.Q4_1.gguf \
  GRPO_KNOBS_CACHE=$HOME/cache PYTHONPYCACHEPREFIX=$HOME/pyc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > gpu.txt

# the rollout table at six widths, all paths, every path warmed at the timed length, three timed calls each
# (rollout-table.log: the loaders' progress bars filtered out); shipped as
# lib/grpo_knobs/datasets/rollout-benchmarks/rollout-h100.json
timeout 540 python3 -m benchmarks.rollout --batches 64,128,256,512,1024,2048 --new-tokens 256 \
  --paths eager,fast,fused --out rollout-table.json

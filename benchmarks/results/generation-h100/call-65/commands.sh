# Calls 65-66: one H100 80GB HBM3 (asked for as nvidia-h200; an H100 came), the checkout at 215ae53 with
# warmup.diff applied to benchmarks/rollout.py (every path's warm-up call decodes the timed length; eager's used to
# decode 4 tokens) and 215ae53's benchmarks/rollout.py beside it as benchmarks/rollout_old.py; results/, figures/ and
# benchmarks/results/ out of the tree. Call 65 staged the model's first half and the gguf wheel, call 66 the second
# half and ran both (as in ../call-58). From the checkout's root:
export PYTHONPATH=$PWD/lib:$PWD GRPO_KNOBS_GGUF=$HOME/model/SmolLM2-135M-Instruct.Q4_1.gguf \
  GRPO_KNOBS_CACHE=$HOME/cache PYTHONPYCACHEPREFIX=$HOME/pyc PYTHONUNBUFFERED=1

# the warm-up of the timed length, all paths (rollout.log; the loaders' progress bars filtered out)
timeout 280 python3 -m benchmarks.rollout --batches 512 --new-tokens 256 --paths eager,fast,fused --out rollout.json
# the 4-token warm-up for eager, as before, in a fresh process on the same machine (rollout-old.log)
timeout 200 python3 -m benchmarks.rollout_old --batches 512 --new-tokens 256 --paths eager,fast --out rollout-old.json

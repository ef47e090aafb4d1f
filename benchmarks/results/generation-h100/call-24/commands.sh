# Call 24: one H100 80GB HBM3 (a call for an H200 got an H100), the checkout at 49825ea with results/, figures/ and
# benchmarks/results/ out of the tree; the model staged in two calls as in call 14; then, from the checkout's root:
export PYTHONPATH=$PWD/lib:$PWD GRPO_KNOBS_GGUF=$HOME/model/SmolLM2-135M-Instruct.Q4_1.gguf \
  GRPO_KNOBS_CACHE=$HOME/cache PYTHONPYCACHEPREFIX=$HOME/pyc PYTHONUNBUFFERED=1

python3 -m benchmarks.attention_shapes --batch 512 --new-tokens 256 --rounds 2 \
    --arms k32-w1-s2,k16-w1-s6,k16-w2-s4,k16-w1-s3 --json attention.json   # attention.log

# Call 27: one NVIDIA H200, the checkout at 49825ea with results/, figures/ and benchmarks/results/ out of the tree;
# the model staged in two calls as in call 14; then, from the checkout's root:
export PYTHONPATH=$PWD/lib:$PWD GRPO_KNOBS_GGUF=$HOME/model/SmolLM2-135M-Instruct.Q4_1.gguf \
  GRPO_KNOBS_CACHE=$HOME/cache PYTHONPYCACHEPREFIX=$HOME/pyc PYTHONUNBUFFERED=1

python3 -m benchmarks.rollout --batches 512 --new-tokens 256 --paths eager,fast,fused --out rollout.json   # rollout.log
python3 -m benchmarks.attention_shapes --batch 512 --new-tokens 256 --rounds 2 \
    --arms k32-w1-s2,k16-w1-s4-split128,k16-w1-s4-split64 --json attention.json   # attention.log

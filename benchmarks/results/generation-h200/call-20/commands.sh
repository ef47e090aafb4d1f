# Call 20: one H200, the checkout at 33a469e (the norms folded into the wide step's products), results/,
# figures/ and benchmarks/results/ out of the tree; the model staged in two calls as in call 14; then, from its
# root (bounds.py is generation-h100/call-16/bounds/bounds.py, byte for byte):
export PYTHONPATH=$PWD/lib:$PWD GRPO_KNOBS_GGUF=$HOME/model/SmolLM2-135M-Instruct.Q4_1.gguf \
  GRPO_KNOBS_CACHE=$HOME/cache PYTHONPYCACHEPREFIX=$HOME/pyc PYTHONUNBUFFERED=1

python3 benchmarks/results/generation-h100/call-16/bounds/bounds.py --rounds 2   # bounds.log
python3 -m benchmarks.attention_shapes --batch 512 --new-tokens 256 --rounds 2 --arms k32-w1-s2,k16-w1-s4 \
    --json attention.json   # attention.log

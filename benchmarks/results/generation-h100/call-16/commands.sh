# Call 16: one H100 80GB HBM3 (no H200 was lent), the checkout at 65d3427, run from its root with results/,
# figures/ and benchmarks/results/ out of the tree; the model staged in two calls as in call 14 (the second
# call ran the command below after joining the model's halves), then:
export PYTHONPATH=$PWD/lib:$PWD GRPO_KNOBS_GGUF=$HOME/model/SmolLM2-135M-Instruct.Q4_1.gguf \
  GRPO_KNOBS_CACHE=$HOME/cache PYTHONPYCACHEPREFIX=$HOME/pyc PYTHONUNBUFFERED=1

python3 benchmarks/results/generation-h100/call-16/bounds/bounds.py --rounds 2   # bounds/bounds.log, bounds.json

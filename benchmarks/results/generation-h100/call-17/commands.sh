# Call 17: another H100 80GB HBM3 machine (an H200 was asked for; none was lent), the checkout at 829f9ac (the
# library as at 65d3427), run as call 16 was; then, in the same call, the rollout benchmark:
export PYTHONPATH=$PWD/lib:$PWD GRPO_KNOBS_GGUF=$HOME/model/SmolLM2-135M-Instruct.Q4_1.gguf \
  GRPO_KNOBS_CACHE=$HOME/cache PYTHONPYCACHEPREFIX=$HOME/pyc PYTHONUNBUFFERED=1

python3 benchmarks/results/generation-h100/call-16/bounds/bounds.py --rounds 2   # bounds/bounds.log, bounds.json
python3 -m benchmarks.rollout --batches 512 --new-tokens 256 --paths eager,fast,fused   # rollout.log

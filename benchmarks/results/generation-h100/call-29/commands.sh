# Call 29: one H100 80GB HBM3, the checkout at 49825ea plus benchmarks/step_counters.py (the commit after it); staged
# as in call 24; then, from the checkout's root:
export PYTHONPATH=$PWD/lib:$PWD GRPO_KNOBS_GGUF=$HOME/model/SmolLM2-135M-Instruct.Q4_1.gguf \
  GRPO_KNOBS_CACHE=$HOME/cache PYTHONPYCACHEPREFIX=$HOME/pyc PYTHONUNBUFFERED=1

python3 -m benchmarks.step_counters --batch 512 --step 128 --raw step-counters.txt --json step-counters.json \
    2>&1 | tee step-counters.log   # step-counters.txt committed gzipped

# Call 25: one H100 80GB HBM3, another machine than call 24's, the checkout at 49825ea; staged as in call 24; then:
export PYTHONPATH=$PWD/lib:$PWD GRPO_KNOBS_GGUF=$HOME/model/SmolLM2-135M-Instruct.Q4_1.gguf \
  GRPO_KNOBS_CACHE=$HOME/cache PYTHONPYCACHEPREFIX=$HOME/pyc PYTHONUNBUFFERED=1

python3 -m benchmarks.attention_shapes --batch 512 --new-tokens 256 --rounds 2 \
    --arms k16-w1-s4-split128,k16-w1-s4-split64,k32-w1-s2-split128 --json attention-split.json   # attention-split.log

# Call 23: one H100 80GB HBM3 (no H200 started), the checkout at b41b640 with the working tree's width-dependent
# launch shape of decode attention (the commit after b41b640: 16-slot blocks four deep where a launch covers
# whole caches, 32-slot blocks two deep where it splits them), results/, figures/ and benchmarks/results/ out of
# the tree; the model staged in two calls as in call 14; then, from the checkout's root:
export PYTHONPATH=$PWD/lib:$PWD GRPO_KNOBS_GGUF=$HOME/model/SmolLM2-135M-Instruct.Q4_1.gguf \
  GRPO_KNOBS_CACHE=$HOME/cache PYTHONPYCACHEPREFIX=$HOME/pyc PYTHONUNBUFFERED=1

python3 -m benchmarks.rollout --batches 512 --new-tokens 256 --paths eager,fast,fused --out rollout.json   # rollout.log
python3 -m pytest -q -p no:cacheprovider -rs tests/test_kernels.py tests/test_kernels_compile.py   # tests-kernels.log
python3 -m pytest -q -p no:cacheprovider -rs tests/test_rollout.py tests/test_determinism_cuda.py -k cuda   # tests-rollout.log
python3 -m benchmarks.attention_shapes --batch 512 --new-tokens 256 --rounds 2 --arms k32-w1-s2 \
    --json attention.json   # attention.log

# Call 22: one H200, the checkout at b41b640, results/, figures/ and benchmarks/results/ out of the tree; the
# model staged in two calls as in call 14; then, from the checkout's root:
export PYTHONPATH=$PWD/lib:$PWD GRPO_KNOBS_GGUF=$HOME/model/SmolLM2-135M-Instruct.Q4_1.gguf \
  GRPO_KNOBS_CACHE=$HOME/cache PYTHONPYCACHEPREFIX=$HOME/pyc PYTHONUNBUFFERED=1

python3 -m benchmarks.collection_timeline --prompts 64 --group 8 --collections 4 --arms default,k16-w1-s4 \
    --json timeline-64x8.json   # timeline-64x8.log
python3 -m pytest -q -p no:cacheprovider -rs tests/test_kernels.py tests/test_kernels_compile.py   # tests-kernels.log
python3 -m pytest -q -p no:cacheprovider -rs tests/test_rollout.py tests/test_determinism_cuda.py -k cuda   # tests-rollout.log
python3 -m benchmarks.collection_timeline --prompts 8 --group 8 --collections 4 --arms default,k16-w1-s4 \
    --json timeline-8x8.json   # timeline-8x8.log

# Call 21: one H100 80GB HBM3, the checkout at 2599cc4 with the working tree's refactor of decode attention's
# q|k|v loads into _qkv_part (the commit after 2599cc4), results/, figures/ and benchmarks/results/ out of the tree;
# the model staged as in call 18; then, from its root:
export PYTHONPATH=$PWD/lib:$PWD GRPO_KNOBS_GGUF=$HOME/model/SmolLM2-135M-Instruct.Q4_1.gguf \
  GRPO_KNOBS_CACHE=$HOME/cache PYTHONPYCACHEPREFIX=$HOME/pyc PYTHONUNBUFFERED=1

python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_kernels_compile.py   # tests-kernels.log
python3 -m pytest -q -p no:cacheprovider -rs tests/test_rollout.py tests/test_determinism_cuda.py -k cuda   # tests-rollout.log

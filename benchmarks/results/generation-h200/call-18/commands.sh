# Call 18: one H200, the checkout at 7be2ce6 with fold.diff applied (the norms folded into the wide decode
# step's products; the diff still carries a decoder switch, fold_norms, that fold.py sets: the library as
# committed has no switch and always folds). results/, figures/ and benchmarks/results/ out of the tree; the
# model staged in two calls as in call 14; then, from the checkout's root:
export PYTHONPATH=$PWD/lib:$PWD GRPO_KNOBS_GGUF=$HOME/model/SmolLM2-135M-Instruct.Q4_1.gguf \
  GRPO_KNOBS_CACHE=$HOME/cache PYTHONPYCACHEPREFIX=$HOME/pyc PYTHONUNBUFFERED=1

# (fold.py as committed is the script that ran, reformatted by ruff afterwards)
python3 benchmarks/results/generation-h200/call-18/fold.py --rounds 3   # fold.log, fold.json
python3 -m pytest -q -x tests/test_kernels.py tests/test_kernels_compile.py   # tests-kernels.log
python3 -m benchmarks.rollout --batches 512 --new-tokens 256 --paths eager,fast,fused --out rollout.json   # rollout.log

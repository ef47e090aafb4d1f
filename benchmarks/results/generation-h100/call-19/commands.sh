# Call 19: one H100 80GB HBM3 (an H200 was asked for), two commands on the same machine, the checkout at
# 7be2ce6 with fold.diff applied (as in generation-h200/call-18; the norms folded in, the default); results/,
# figures/ and benchmarks/results/ out of the tree; the model staged as in call 18; then, from its root:
export PYTHONPATH=$PWD/lib:$PWD GRPO_KNOBS_GGUF=$HOME/model/SmolLM2-135M-Instruct.Q4_1.gguf \
  GRPO_KNOBS_CACHE=$HOME/cache PYTHONPYCACHEPREFIX=$HOME/pyc PYTHONUNBUFFERED=1

python3 -m pytest -q -p no:cacheprovider -rs tests/test_rollout.py tests/test_determinism_cuda.py -k cuda   # tests-rollout.log
python3 -m benchmarks.recipe --out fold --in-process --arm s1:seed=1 --arm s2:seed=2 \
    --archive recipe-s1-s2-records.tar --json recipe-s1-s2.json   # recipe-s1-s2.log
python3 -m benchmarks.attention_shapes --batch 512 --new-tokens 256 --rounds 2 --arms k32-w1-s2,k16-w1-s4 \
    --json attention.json   # attention.log

# second command: three more seeds with the norms folded, in one process ...
python3 -m benchmarks.recipe --out fold --in-process --arm fold-s2:seed=2 --arm fold-s3:seed=3 --arm fold-s4:seed=4 \
    --archive recipe-s2-s4-records.tar --json recipe-s2-s4.json   # recipe-s2-s4.log
# ... and two without, each in a fresh process: a copy of lib/ with rollout/hf.py and rollout/kernels.py as at
# 7be2ce6 (git show 7be2ce6:lib/grpo_knobs/rollout/hf.py, and kernels.py)
mkdir -p $HOME/before && cp -r lib $HOME/before/ && cp hf.py kernels.py $HOME/before/lib/grpo_knobs/rollout/
python3 -m benchmarks.recipe --out before --arm before-s2:code=$HOME/before,seed=2 \
    --arm before-s4:code=$HOME/before,seed=4 --archive recipe-before-records.tar --json recipe-before.json   # recipe-before.log

# Call 14: two H200 machines, one after another; the checkout sent to the machine, run from its root, after
# `. benchmarks/results/generation-h200/call-13/env.sh` (the staged GGUF, caches under $HOME). Each machine got
# the model in two staging calls, with results/, figures/ and benchmarks/results/ out of the tree for the session.

# arms/ (machine 1: 341394b with the block loop's body written out in the kernel, as 1a2cbc5; same sm_90 build):
# the kernel tests compiled (the loop variants and 64-bit offsets in their parameters), then the variants timed
# inside the rollout's 512-row, 256-step fused call
python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_kernels_compile.py   # arms/tests-kernels.log
python3 -m benchmarks.attention_shapes --batch 512 --new-tokens 256 --rounds 2 --json attention-arms.json   # arms/

# bounded/ (machine 2: 88d4c0d, the bounded loop the default, the other variants removed)
# bits against the kernel behind the committed records; same.py loads it from kernels_before.py beside it:
#   git show 88524f8:lib/grpo_knobs/rollout/kernels.py > benchmarks/results/generation-h200/call-14/bounded/kernels_before.py
python3 benchmarks/results/generation-h200/call-14/bounded/same.py   # same.log
python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_kernels_compile.py   # tests-kernels.log
python3 -m pytest -q -p no:cacheprovider -rs tests/test_rollout.py tests/test_determinism_cuda.py -k cuda   # tests-rollout.log
python3 -m benchmarks.rollout --batches 512 --new-tokens 256 --paths eager,fast,fused --out rollout.json
python3 -m benchmarks.attention_shapes --batch 512 --new-tokens 256 --rounds 2 --json attention-arms.json
# call-13's recipe records unpacked into recipe13/ (benchmarks/results/generation-h200/call-13/recipe/recipe-records.tar)
python3 -m benchmarks.recipe --in-process --out recipe --arm s1:seed=1 --arm s2:seed=2 --archive recipe-records.tar
grpo-knobs compare-runs recipe13/s1 recipe/s1   # compare-s1.log (and s2)
python3 -m benchmarks.decode_profile --batch 512 --steps 255 --paths fused --top 20 --out decode-profile.json
python3 -m benchmarks.attention_shapes --batch 512 --new-tokens 256 --rounds 2 \
    --arms k16-w1-s4,k16-w1-s3,k16-w1-s5,k32-w1-s3,k32-w1-s4,k16-w2-s4 --json attention-launch.json
python3 benchmarks/results/generation-h200/call-14/bounded/blocks.py   # blocks.log

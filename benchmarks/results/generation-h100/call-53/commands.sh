# Calls 53-57: one H100 80GB HBM3 (asked for as nvidia-h200; an H100 came), the checkout at 17c2d01 with
# own-term-in-loop.diff applied to lib/grpo_knobs/rollout/kernels.py (decode attention reads the token's own key and
# value back in the loop's last block instead of adding its term after the loop; not landed), results/, figures/
# and benchmarks/results/ out of the tree, and in probe/: base_kernels.py (kernels.py at 17c2d01), ab_bits.py (here)
# and ab_rollout.py (../call-46/ab_rollout.py; it runs lib/ against probe/base_kernels.py). So "lib" in these logs is
# the variant and "head" the library at 17c2d01. From the checkout's root (the model staged in calls 53 and 54 as in
# ../../generation-h200/call-27):
export PYTHONPATH=$PWD/lib:$PWD GRPO_KNOBS_GGUF=$HOME/model/SmolLM2-135M-Instruct.Q4_1.gguf \
  GRPO_KNOBS_CACHE=$HOME/cache PYTHONPYCACHEPREFIX=$HOME/pyc PYTHONUNBUFFERED=1

# call 53: outputs and cache writes bit for bit (ab-bits.log); the attention tests on CUDA (tests-kernels.log: 41 passed)
timeout 200 python3 probe/ab_bits.py > ab-bits.log 2>&1
timeout 300 python3 -m pytest -q -x tests/test_kernels.py -k "rotary_attention or attention_launch" -p no:cacheprovider > tests-kernels.log 2>&1

# call 54: head's attention against the variant inside the fused decode steps, one engine each, 3 interleaved rounds;
# then the rollout benchmark, all paths in one run (at the variant)
timeout 280 python3 probe/ab_rollout.py --rounds 3 --json ab-rollout.json > ab-rollout.log 2>&1
timeout 290 python3 -m benchmarks.rollout --batches 512 --new-tokens 256 --paths eager,fast,fused --out rollout.json > rollout.log 2>&1

# call 55: narrow widths (64 and 16 rows: the split launch), and the rollout benchmark again (rollout-2.*)
for b in 64 16; do timeout 120 python3 probe/ab_rollout.py --batch $b --rounds 3 --json ab-rollout-$b.json > ab-rollout-$b.log 2>&1; done
timeout 150 python3 -m benchmarks.rollout --batches 512 --new-tokens 256 --paths eager,fast,fused --out rollout-2.json > rollout-2.log 2>&1

# call 56: the variant's launch-shape neighbours (ab-shapes.log; the default stays the fastest)
timeout 260 python3 probe/ab_rollout.py --rounds 2 --shapes k16-w1-s3,k16-w1-s5,k32-w1-s2 --json ab-shapes.json > ab-shapes.log 2>&1

# call 57: the rollout tests that run on CUDA (tests-rollout.log: 7 passed)
timeout 200 python3 -m pytest -q tests/test_rollout.py -k "cuda or fused or gpu" -p no:cacheprovider -rs > tests-rollout.log 2>&1

# On the development machine (no GPU):
# the sm_90 builds, the library's and the variant's (kernel-resources-library.log, kernel-resources-variant.log)
TRITON_INTERPRET=0 python -m benchmarks.kernel_resources > kernel-resources-library.log
git apply benchmarks/results/generation-h100/call-53/own-term-in-loop.diff
TRITON_INTERPRET=0 python -m benchmarks.kernel_resources > kernel-resources-variant.log
# ptx-order.txt: the variant's PTX for the default arm (compile_sm90 of benchmarks.kernel_resources, asm["ptx"]),
# its stores, barriers and first async copies in order (grep -n "st.global\|bar.sync\|cp.async..." | head -12)
git checkout lib/grpo_knobs/rollout/kernels.py
# the rounding of the two forms emulated in torch (emulate.log)
python benchmarks/results/generation-h100/call-53/emulate.py > emulate.log

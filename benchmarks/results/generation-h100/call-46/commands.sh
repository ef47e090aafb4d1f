# Calls 46-52: one H100 80GB HBM3 (asked for as nvidia-h100-x1), the checkout at c2bc808 with
# call-42/scores-keys-by-queries.diff applied to lib/grpo_knobs/rollout/kernels.py (decode attention's scores as
# keys x queries, the query heads padded to 4), results/, figures/ and benchmarks/results/ out of the tree, and in
# probe/: base_kernels.py (kernels.py at c2bc808), variant_kernels.py (see ab_bits.py), ab_bits.py, ab_rollout.py.
# From the checkout's root (the model staged in calls 46 and 47 as in ../../generation-h200/call-27):
export PYTHONPATH=$PWD/lib:$PWD GRPO_KNOBS_GGUF=$HOME/model/SmolLM2-135M-Instruct.Q4_1.gguf \
  GRPO_KNOBS_CACHE=$HOME/cache PYTHONPYCACHEPREFIX=$HOME/pyc PYTHONUNBUFFERED=1

# call 46: the kernel tests on CUDA (tests-kernels.log: 55 passed)
timeout 300 python3 -m pytest -q -x tests/test_kernels.py -p no:cacheprovider > tests-kernels.log 2>&1

# call 47: the rollout benchmark, all paths in one run (rollout.log, rollout.json), then HEAD's attention ("head")
# against the library's ("lib") inside the fused decode steps, one engine each, 3 interleaved rounds
python3 -m benchmarks.rollout --batches 512 --new-tokens 256 --paths eager,fast,fused --out rollout.json > rollout.log 2>&1
timeout 300 python3 probe/ab_rollout.py --rounds 3 --json ab-rollout.json > ab-rollout.log 2>&1

# calls 48, 49: the library's launch shapes under the new product (the default stays the fastest)
timeout 330 python3 probe/ab_rollout.py --rounds 3 --shapes k32-w1-s2,k32-w1-s3,k64-w1-s2,k16-w1-s3 \
  --json ab-shapes.json > ab-shapes.log 2>&1
timeout 300 python3 probe/ab_rollout.py --rounds 3 --shapes k16-w1-s5,k16-w1-s6,k16-w2-s4,k32-w2-s3 \
  --json ab-shapes2.json > ab-shapes2.log 2>&1

# call 50: the rollout tests that run on CUDA (tests-rollout.log: 7 passed; the rest need the CPU model)
timeout 230 python3 -m pytest -q tests/test_rollout.py -k "cuda or fused or gpu" -p no:cacheprovider -rs > tests-rollout.log 2>&1

# call 51: outputs and cache writes bit for bit (ab-bits.log). Call 46 had run an earlier form of ab_bits.py
# without the counts and the variant; its verdicts were the same as this log's.
timeout 200 python3 probe/ab_bits.py > ab-bits.log 2>&1

# call 52: narrow widths (the split launch), 64 and 16 rows
for b in 64 16; do timeout 150 python3 probe/ab_rollout.py --batch $b --rounds 3 --json ab-rollout-$b.json > ab-rollout-$b.log 2>&1; done

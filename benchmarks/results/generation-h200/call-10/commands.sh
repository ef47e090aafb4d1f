# Call 10: two H200 machines, one after the other; the checkout sent to the machine, run from its root.
# environment (. $HOME/env.sh): PYTHONPATH=lib:.:$HOME/site GRPO_KNOBS_GGUF=<the SmolLM2 GGUF> PYTHONPYCACHEPREFIX=$HOME/pyc
# Libraries: each arm is a copy of lib/ with rollout/kernels.py swapped, on PYTHONPATH before the checkout:
#   before  kernels.py at 4a37719
#   A       the sampler's logs through the hardware's approximate log2 (fast_logf); attention as before.
#           This is the kernels.py committed with these results.
#   B       A, and decode attention's key/value loads masked to the slots that count (real prompt tokens,
#           earlier decodes) instead of the cache-length bucket
#   C       A, keys masked to the slots before this token, values as in B
#   D       A, keys and values masked to the slots before this token
# stage.log: GPU, driver, torch / triton / transformers versions.

# first/ (first machine; kernels.py = B): CUDA tests, then the rollout benchmark
python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_kernels_compile.py -rs
python3 -m pytest -q -p no:cacheprovider tests/test_rollout.py tests/test_determinism_cuda.py -k cuda -rs
python3 -m benchmarks.rollout --batches 512 --new-tokens 256 --paths eager,fast,fused --out rollout-after.json

# kernel-arms/ (first machine, next call): the rollout on `before`; the layer products by weight layout and
# BLAS library; each kernel alone on `before` and on B
PYTHONPATH=$HOME/arm/before/lib:$PYTHONPATH python3 -m benchmarks.rollout --batches 512 --new-tokens 256 \
    --paths eager,fast,fused --out rollout-before.json
python3 -m benchmarks.gemm_layouts --rows 256,512 --out gemm-layouts.json
PYTHONPATH=$HOME/arm/before/lib:$PYTHONPATH python3 -m benchmarks.decode_kernels --batch 512 --kv-lens 192 \
    --out decode-kernels-before.json
python3 -m benchmarks.decode_kernels --batch 512 --kv-lens 192 --out decode-kernels-after.json

# decode-masks/ (second machine): the rollout, then each kernel alone, on A, B, C and D
for v in A B C D; do
  PYTHONPATH=$HOME/arm/$v/lib:$PYTHONPATH python3 -m benchmarks.rollout --batches 512 --new-tokens 256 \
      --paths eager,fast,fused --out rollout-$v.json
done
for v in A B C D; do
  PYTHONPATH=$HOME/arm/$v/lib:$PYTHONPATH python3 -m benchmarks.decode_kernels --batch 512 \
      --kv-lens 128,192,320 --sweep 32,64:1,2:1,2 --out dk-$v.json
done

# recipe/ (second machine, next call; kernels.py = B): CUDA tests, then three seeds of the batch-256 recipe
# in one process (records.tar holds each run's records)
python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_kernels_compile.py -rs
python3 -m pytest -q -p no:cacheprovider tests/test_rollout.py tests/test_determinism_cuda.py -k cuda -rs
python3 -m grpo_knobs.cli prepare --max-new-tokens 256 -p deterministic=false
python3 -m benchmarks.recipe --out runs/fl --archive records.tar --json recipe.json \
    --arm h1:process=here,seed=1 --arm h2:process=here,seed=2 --arm h3:process=here,seed=3

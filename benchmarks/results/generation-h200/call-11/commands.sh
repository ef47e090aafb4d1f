# Call 11: four H200 machines, one after another; the checkout sent to the machine, run from its root.
# environment (. $HOME/env.sh): PYTHONPATH=lib:.:$HOME/site GRPO_KNOBS_GGUF=<the SmolLM2 GGUF> PYTHONPYCACHEPREFIX=$HOME/pyc
# Libraries: copies of lib/ on PYTHONPATH before the checkout where an arm needs one:
#   ddd4db7     the library before this call's change ("before", "default")
#   unmasked    ddd4db7 with decode attention's key/value loads unmasked where the bucket is whole blocks
#               (unmasked-loads/unmasked.diff); this was the checkout's kernels.py on the first machine
#   S           ddd4db7 with the loads of a block wholly past the token masked by one value per block:
#               the kernels.py committed with these results
#   W0, W       ddd4db7 with _linear_tiles reading own-wide/tiles.json first (own-wide/patch_arm.py);
#               W also routes every width through the own GEMMs (LINEAR_ROWS = 65536)
# stage.log in each folder: GPU, driver, torch / triton / transformers versions.

# unmasked-loads/ (first machine; checkout = unmasked): kernel tests, each kernel alone on both libraries,
# then the host pieces of a fused generate (host/)
python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_kernels_compile.py -rs
PYTHONPATH=$HOME/arm/before/lib:$PYTHONPATH python3 -m benchmarks.decode_kernels --batch 512 --kv-lens 128,192,320 \
    --sweep 32,64:1,2:1,2 --out dk-before.json
python3 -m benchmarks.decode_kernels --batch 512 --kv-lens 128,192,320 --sweep 32,64:1,2:1,2 --out dk-after.json
python3 benchmarks/results/generation-h200/call-11/host/hostdiag.py   # host/hostdiag.txt

# unmasked-loads/ and block-32/ (first machine, next call): the rollout on both libraries, then 32-slot buckets
python3 -m benchmarks.rollout --batches 512 --new-tokens 256 --paths eager,fast,fused --out rollout-after.json
PYTHONPATH=$HOME/arm/before/lib:$PYTHONPATH python3 -m benchmarks.rollout --batches 512 --new-tokens 256 \
    --paths eager,fast,fused --out rollout-before.json
python3 -m benchmarks.collection_timeline --task countdown-2x10 --prompts 64 --group 8 --collections 4 \
    --arms default,block-32 --json timeline-block.json

# profile/ (second machine; ddd4db7)
python3 -m benchmarks.decode_profile --batch 512 --paths fused --steps 256 --top 24 --out decode-profile-512x256.json

# own-wide/ (third machine; ddd4db7 with this call's benchmark changes): the own GEMMs' tiles swept from 128 rows,
# the best written to tiles.json (tiles.py), then the own route against cuBLAS's in one process and the rollout on W
python3 -m benchmarks.decode_kernels --batch 512 --kv-lens 192 --sweep 32:1:2 --widths 128,256,512 --tile-sweep \
    --out dk-wide.json
python3 benchmarks/results/generation-h200/call-11/own-wide/tiles.py dk-wide.json
PYTHONPATH=$HOME/arm/W0/lib:$PYTHONPATH python3 -m benchmarks.collection_timeline --task countdown-2x10 --prompts 64 \
    --group 8 --collections 4 --arms default,own-wide --json timeline-own-wide.json
PYTHONPATH=$HOME/arm/W/lib:$PYTHONPATH python3 -m benchmarks.rollout --batches 512 --new-tokens 256 \
    --paths eager,fast,fused --out rollout-W.json
python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py   # tests-kernels-committed.txt (ddd4db7 kernels)

# dead-blocks/ (fourth machine): the rollout on S, then on ddd4db7, then S's kernel tests
PYTHONPATH=$HOME/arm/S/lib:$PYTHONPATH python3 -m benchmarks.rollout --batches 512 --new-tokens 256 \
    --paths eager,fast,fused --out rollout-S.json
python3 -m benchmarks.rollout --batches 512 --new-tokens 256 --paths eager,fast,fused --out rollout-default.json
python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_kernels_compile.py -rs   # kernels.py = S

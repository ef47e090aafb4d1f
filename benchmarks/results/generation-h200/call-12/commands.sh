# Call 12: three H200 machines, one after another; the checkout sent to the machine, run from its root.
# environment (.device-stage/s/env.sh there): PYTHONPATH=lib:.:$HOME/site GRPO_KNOBS_GGUF=<the SmolLM2 GGUF>
#   GRPO_KNOBS_CACHE=$HOME/cache; gpu.txt in each folder names the GPU.

# halves/ (first machine): e2ec1eb with halves/halves.diff applied (StaticDecoder.overlap_rows: steps of 256+
# rows as two halves of their rows, the second on its own CUDA stream; rollout path fused-halves and
# collection_timeline arm halves). Not kept: the library is e2ec1eb's.
python3 -m benchmarks.rollout --batches 512 --new-tokens 256 --paths eager,fast,fused,fused-halves --out rollout.json
python3 -m benchmarks.collection_timeline --arms default,halves --collections 4 --json timeline.json
python3 -m pytest -q -p no:cacheprovider tests/test_rollout.py -k cuda   # tests.log

# attention-shapes/ (second machine): e2ec1eb plus benchmarks/attention_shapes.py as committed
python3 -m benchmarks.attention_shapes --batch 512 --new-tokens 256 --rounds 2 --json attention-shapes.json

# cuda-tests/ (third machine): the same checkout
python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_kernels_compile.py   # tests-kernels.log
python3 -m pytest -q -p no:cacheprovider tests/test_rollout.py tests/test_determinism_cuda.py -k cuda   # tests-rollout.log

# Call 9: one H200 per block; the checkout sent to the machine, run from its root.
# environment (. $HOME/env.sh): PYTHONPATH=$HOME/site:lib:. GRPO_KNOBS_GGUF=<the SmolLM2 GGUF> PYTHONPYCACHEPREFIX=$HOME/pyc
# "before" is the library at a31a9a9: git archive a31a9a9 lib | tar -x -C $HOME/rev/before

# rollout-split/ (first machine, commit a31a9a9): the rollout benchmark with its split of a second call
python3 -m benchmarks.rollout --batches 512 --new-tokens 256 --paths eager,fast,fused --out rollout.json

# prefill-graphs/ (second machine, the prefill-graph change): CUDA tests, graph vs eager prefill, rollout
python3 -m pytest -q -p no:cacheprovider tests/test_rollout.py tests/test_determinism_cuda.py -k cuda -rs
python3 -m benchmarks.collection_timeline --task countdown-2x10 --prompts 64 --group 8 --collections 4 \
    --arms default,eager-prefill --json timeline-64x8.json
python3 -m benchmarks.rollout --batches 512 --new-tokens 256 --paths eager,fast,fused --out rollout.json

# recipe-prefill/ (second machine): the prefill's kernels (graphs off, 64 prompts x 8, max_new_tokens=1,
# torch.profiler), then the recipe before and after, deterministic, fresh processes, after prepare
python3 -m grpo_knobs.cli prepare --max-new-tokens 256 -p deterministic=true
python3 -m benchmarks.recipe --out runs/prefill --archive records.tar --json recipe.json \
  --base deterministic=true --arm before-s2:code=$HOME/rev/before,seed=2 --arm after-s2:seed=2 \
  --arm before-s3:code=$HOME/rev/before,seed=3 --arm after-s3:seed=3 \
  --compare before-s2,after-s2 --compare before-s3,after-s3

# rollout-before-after/ (second machine, one call): the rollout benchmark on each library
PYTHONPATH=$HOME/rev/before/lib:$PYTHONPATH python3 -m benchmarks.rollout --batches 512 --new-tokens 256 \
    --paths eager,fast,fused --out rollout-before.json
python3 -m benchmarks.rollout --batches 512 --new-tokens 256 --paths eager,fast,fused --out rollout-after.json

# texts/ (third machine, commit a5effa3: prefill graphs and the byte table): host work on this host's CPU,
# the rollout benchmark, a collection timeline
python3 -m benchmarks.host_after --reps 20 --json host_after.json
python3 -m benchmarks.rollout --batches 512 --new-tokens 256 --paths eager,fast,fused --out rollout.json
python3 -m benchmarks.collection_timeline --task countdown-2x10 --prompts 64 --group 8 --collections 4 \
    --json timeline-64x8.json

# launch-floor/ (fourth machine, commit c82fc4a): empty kernels and one of the step's GEMMs in a graph
python3 -m benchmarks.launch_floor --out launch-floor.json
python3 -m benchmarks.launch_floor --reps 30 --out launch-floor-30.json

# host-after-per-row/ (fifth machine, commit with the per-row arm timing its texts alone): the tokenizer is
# SmolLM2's, through tiny-random built from a cache holding only SmolLM2's tokenizer files; twice
GRPO_KNOBS_CACHE=$HOME/cc python3 -m benchmarks.host_after --model tiny-random --reps 20 --json host_after.json
GRPO_KNOBS_CACHE=$HOME/cc python3 -m benchmarks.host_after --model tiny-random --reps 20 --json host_after-2.json

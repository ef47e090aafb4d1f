# Call 15: one H200, the checkout at af5a2e1 (responses streamed while the steps run, the rollout benchmark's
# garbage-collection line, the recipe's gc arm), run from its root with results/, figures/ and benchmarks/results/
# out of the tree; the model staged in two calls as in call 14, then:
export PYTHONPATH=$PWD/lib:$PWD:$HOME/site GRPO_KNOBS_GGUF=$HOME/model/SmolLM2-135M-Instruct.Q4_1.gguf \
  GRPO_KNOBS_CACHE=$HOME/cache PYTHONPYCACHEPREFIX=$HOME/pyc PYTHONUNBUFFERED=1

python3 -m pytest -q -p no:cacheprovider -rs tests/test_rollout.py tests/test_determinism_cuda.py -k cuda   # tests-rollout.log
python3 -m benchmarks.rollout --batches 512 --new-tokens 256 --paths eager,fast,fused --out rollout.json   # rollout.log
python3 -m benchmarks.collection_timeline --task countdown-2x10 --prompts 64 --group 8 --collections 4 \
    --arms default,outputs-after --json timeline.json   # timeline.log

# call 14's recipe records (call-14/bounded/recipe-records.tar) unpacked into recipe14/
python3 -m benchmarks.recipe --out gc --in-process --arm warm:seed=1 --arm on-s2:seed=2 \
    --arm freeze-s2:gc=freeze,seed=2 --arm on-s3:seed=3 --arm freeze-s3:gc=freeze,seed=3 \
    --archive recipe-records.tar --json recipe.json   # recipe.log
python3 -m grpo_knobs.cli compare-runs recipe14/s1 gc/warm        # compare-s1.log
python3 -m grpo_knobs.cli compare-runs recipe14/s2 gc/on-s2       # compare-s2.log
python3 -m grpo_knobs.cli compare-runs gc/on-s2 gc/freeze-s2      # compare-freeze-s2.log

python3 -m benchmarks.attention_shapes --batch 512 --new-tokens 256 --rounds 2 \
    --arms k16-w1-s4,k32-w1-s2-split128,k32-w1-s2-split64,k16-w1-s4-split128,k16-w1-s4-split64 \
    --json attention-split.json   # attention-split.log

# the same seed twice in deterministic mode, the stream on (the default)
python3 -m benchmarks.recipe --out det --in-process --arm det-a:deterministic=true,seed=1 \
    --arm det-b:deterministic=true,seed=1 --archive det-records.tar   # det.log
python3 -m grpo_knobs.cli compare-runs det/det-a det/det-b   # compare-det.log

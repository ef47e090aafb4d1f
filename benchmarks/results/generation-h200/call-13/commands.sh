# Call 13: five H200 machines, one after another; the checkout sent to the machine, run from its root, after
# `. benchmarks/results/generation-h200/call-13/env.sh` (the staged GGUF, caches under $HOME). Each machine got
# the model in two staging calls, with results/, figures/ and benchmarks/results/ out of the tree for the session.
# arms.py, ncu/attend.py --before, ncu/same.py and timeline/timeline_ab.py load the previous decode attention from arms/kernels_before.py:
#   git show 33eab91:lib/grpo_knobs/rollout/kernels.py > benchmarks/results/generation-h200/call-13/arms/kernels_before.py

# bounds/ (machine 1, the library at 33eab91): decode attention with parts of its work left out, inside the
# rollout's 512-row, 256-step fused call; and how decode_texts reads this machine's tokenizer (transformers 5.17)
python3 benchmarks/results/generation-h200/call-13/bounds/bounds.py --rounds 2 --arms prompt-free,no-reads  # bounds.log
# (machine 2, 33eab91) Nsight Compute on one attention launch, then the no-exp arm
ncu --clock-control none --set full -k regex:rotary_attention --launch-skip 4 -c 1 -o att \
    python3 benchmarks/results/generation-h200/call-13/ncu/attend.py   # ncu/ncu-run-before.txt
ncu --import att.ncu-rep --page details > details-before.txt
ncu --import att.ncu-rep --page source --csv --print-source sass > sass-before.csv   # ncu/sass-before.csv.gz
python3 benchmarks/results/generation-h200/call-13/bounds/bounds.py --rounds 2 --arms no-exp   # bounds-no-exp.log

# (machine 3, this commit's kernel and byte table) the CUDA tests, then attention before and after in the rollout
python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_kernels_compile.py   # cuda-tests/
python3 -m pytest -q -p no:cacheprovider tests/test_rollout.py tests/test_determinism_cuda.py -k cuda
python3 benchmarks/results/generation-h200/call-13/arms/arms.py --rounds 2   # arms/arms.log

# (machine 4, the same) bits of before and after on one input; Nsight Compute on the new launch; the host work
# with this machine's tokenizer; the rollout benchmark; two seeds of the batch-256 recipe in one process
python3 benchmarks/results/generation-h200/call-13/ncu/same.py   # ncu/same.log
ncu --clock-control none --set full -k regex:rotary_attention --launch-skip 4 -c 1 -o att \
    python3 benchmarks/results/generation-h200/call-13/ncu/attend.py   # ncu/ncu-run-after.txt, details-after.txt
python3 -m benchmarks.host_after --prompts 64 --group 8 --steps 256 --mean-length 256 --capped 1 --reps 10 \
    --json host-after-512x256.json   # host/
python3 -m benchmarks.rollout --batches 512 --new-tokens 256 --paths eager,fast,fused --out rollout.json   # rollout/
python3 -m benchmarks.recipe --in-process --out recipe --arm s1:seed=1 --arm s2:seed=2 --archive recipe-records.tar

# timeline/ (machine 5, the same): whole collections as a run draws them (64 prompts x 8 of countdown-2x10, T = 1,
# EOS on), the previous attention and text decoding against this commit's, interleaved
python3 benchmarks/results/generation-h200/call-13/timeline/timeline_ab.py --collections 4   # timeline-ab.log

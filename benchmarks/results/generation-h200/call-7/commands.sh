# dependent launches: CUDA tests, collection timelines (arms interleaved), rollout at 512 rows
. $HOME/env.sh
L=$HOME/c7; mkdir -p $L
pack() { tar -czf $OUT/c7.tgz -C $HOME c7; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)" > $L/versions.txt 2>&1
git rev-parse HEAD > $L/rev.txt 2>&1
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_rollout.py tests/test_kernels.py -k "cuda or kernel or rotary or sample or norm or linear" -rs > $L/cuda-tests.log 2>&1; echo "rc=$?" >> $L/cuda-tests.log; tail -4 $L/cuda-tests.log; pack
timeout 150 python3 -m benchmarks.collection_timeline --task countdown-2x10 --prompts 64 --group 8 --collections 4 --launch dependent,plain --json $L/timeline-64x8.json > $L/timeline-64x8.log 2>&1; tail -4 $L/timeline-64x8.log; pack
timeout 60 python3 -m benchmarks.collection_timeline --task countdown-2x10 --prompts 8 --group 8 --collections 4 --launch dependent,plain --json $L/timeline-8x8.json > $L/timeline-8x8.log 2>&1; tail -4 $L/timeline-8x8.log; pack
timeout 120 python3 -m benchmarks.rollout --batches 512 --new-tokens 256 --paths eager,fast,fused --out $L/rollout.json > $L/rollout.log 2>&1; tail -8 $L/rollout.log; pack
ls -la $OUT

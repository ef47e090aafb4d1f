# On the 2-core CPU machine (no GPU), at 341394b (its exp2, lazy, bounded and swap arms were removed at 88d4c0d): Triton 3.6.0 compiling for sm_90, the model's config from the cache.
python -m benchmarks.kernel_resources --json benchmarks/results/kernel-resources-sm90/attention-512.json \
    2>&1 | tee benchmarks/results/kernel-resources-sm90/attention-512.log
python -m benchmarks.kernel_resources --batch 32 --kv-len 320 \
    --arms k32-w1-s2-wide,k32-w1-s2-exp2,k32-w1-s2-exp2-lazy-bounded,k16-w1-s4-exp2-lazy-bounded,k32-w1-s2-split128-exp2-lazy-bounded \
    --json benchmarks/results/kernel-resources-sm90/attention-32.json 2>&1 | tee benchmarks/results/kernel-resources-sm90/attention-32.log

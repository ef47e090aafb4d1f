# the fused decode step's kernels at 512 and 64 rows (one device call with compiled-start/)
# environment (. $HOME/env.sh): PYTHONPATH=$HOME/site:lib:. GRPO_KNOBS_GGUF=<the SmolLM2 GGUF> PYTHONPYCACHEPREFIX=$HOME/pyc, run from the checkout
. $HOME/env.sh
L=$HOME/c14; mkdir -p $L
pack() { tar -czf $OUT/c14.tgz -C $HOME c14; }
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv > $L/gpu.txt
timeout 150 python3 -m benchmarks.decode_profile --batch 512 --paths fused --top 20 --out $L/profile-512.json > $L/profile-512.log 2>&1; tail -28 $L/profile-512.log
timeout 100 python3 -m benchmarks.decode_profile --batch 64 --paths fused --top 14 --out $L/profile-64.json > $L/profile-64.log 2>&1; tail -5 $L/profile-64.log; pack

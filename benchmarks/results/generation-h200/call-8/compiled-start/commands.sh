# where the compiled trainer's start-up goes (the same device call as decode-profile/, after it)
# environment (. $HOME/env.sh): PYTHONPATH=$HOME/site:lib:. GRPO_KNOBS_GGUF=<the SmolLM2 GGUF> PYTHONPYCACHEPREFIX=$HOME/pyc, run from the checkout
. $HOME/env.sh
L=$HOME/c14; mkdir -p $L
pack() { tar -czf $OUT/c14.tgz -C $HOME c14; }
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv > $L/gpu.txt
export TORCH_LOGS=recompiles
timeout 120 python3 benchmarks/results/generation-h200/call-8/compiled-start/ctime.py cold > $L/ctime-cold.log 2>&1; grep -v "Loading\|Writing" $L/ctime-cold.log | tail -25; pack
timeout 90 python3 benchmarks/results/generation-h200/call-8/compiled-start/ctime.py warm > $L/ctime-warm.log 2>&1; grep -v "Loading\|Writing" $L/ctime-warm.log | tail -25; pack

# the recipe in fresh processes and in this process, interleaved on one machine, after prepare
# environment (. $HOME/env.sh): PYTHONPATH=$HOME/site:lib:. GRPO_KNOBS_GGUF=<the SmolLM2 GGUF> PYTHONPYCACHEPREFIX=$HOME/pyc, run from the checkout
. $HOME/env.sh
L=$HOME/c12; mkdir -p $L
pack() { tar -czf $OUT/c12.tgz -C $HOME c12; }
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv > $L/gpu.txt
( time python3 -m grpo_knobs.cli prepare --max-new-tokens 256 -p deterministic=false ) > $L/prepare.log 2>&1; tail -3 $L/prepare.log
timeout 470 python3 -m benchmarks.recipe --out runs/where --archive $L/records.tar --json $L/recipe.json \
  --arm f2:process=fresh,seed=2 --arm h2:process=here,seed=2 --arm f3:process=fresh,seed=3 --arm h3:process=here,seed=3 \
  --arm f4:process=fresh,seed=4 --arm h4:process=here,seed=4 > $L/recipe.log 2>&1; tail -16 $L/recipe.log; pack

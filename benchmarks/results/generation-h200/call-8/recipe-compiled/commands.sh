# the recipe with the compiled trainer against the default (packed-liger), in this process and fresh, one machine
# environment (. $HOME/env.sh): PYTHONPATH=$HOME/site:lib:. GRPO_KNOBS_GGUF=<the SmolLM2 GGUF> PYTHONPYCACHEPREFIX=$HOME/pyc, run from the checkout
. $HOME/env.sh
L=$HOME/c13; mkdir -p $L
pack() { tar -czf $OUT/c13.tgz -C $HOME c13; }
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv > $L/gpu.txt
( time python3 -m grpo_knobs.cli prepare --max-new-tokens 256 -p deterministic=false ) > $L/prepare.log 2>&1; tail -3 $L/prepare.log
( time python3 -m grpo_knobs.cli prepare --max-new-tokens 256 -p deterministic=false -p trainer_path=packed-compiled ) > $L/prepare-compiled.log 2>&1; tail -3 $L/prepare-compiled.log
pack
timeout 450 python3 -m benchmarks.recipe --out runs/compiled --archive $L/records.tar --json $L/recipe.json \
  --arm hc1:process=here,seed=1,trainer_path=packed-compiled --arm h2:process=here,seed=2 --arm hc2:process=here,seed=2,trainer_path=packed-compiled \
  --arm h3:process=here,seed=3 --arm hc3:process=here,seed=3,trainer_path=packed-compiled \
  --arm h4:process=here,seed=4 --arm hc4:process=here,seed=4,trainer_path=packed-compiled \
  --arm fc3:process=fresh,seed=3,trainer_path=packed-compiled > $L/recipe.log 2>&1; grep -v Loading $L/recipe.log | grep -v Writing | tail -22; pack

# the recipe in fresh processes on the same code, to set beside the in-process runs of c9
. $HOME/env.sh
L=$HOME/c11; mkdir -p $L
pack() { tar -czf $OUT/c11.tgz -C $HOME c11; }
timeout 200 python3 -m benchmarks.recipe --out runs/sub --archive $L/records.tar --json $L/recipe.json --arm s2:seed=2 --arm s3:seed=3 > $L/recipe.log 2>&1; tail -16 $L/recipe.log; pack

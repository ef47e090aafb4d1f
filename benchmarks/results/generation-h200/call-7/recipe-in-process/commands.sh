# the recipe as a study's inprocess executor runs it: seeds one after another in one process
. $HOME/env.sh
L=$HOME/c9; mkdir -p $L
pack() { tar -czf $OUT/c9.tgz -C $HOME c9; }
timeout 300 python3 -m benchmarks.recipe --in-process --out runs/inproc --archive $L/records.tar --json $L/recipe.json --arm s1:seed=1 --arm s2:seed=2 --arm s3:seed=3 > $L/recipe.log 2>&1; tail -30 $L/recipe.log; pack
ls -la $OUT

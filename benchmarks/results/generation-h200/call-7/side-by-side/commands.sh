# runs side by side on one GPU: job time and throughput at 1, 2 and 3 concurrent runs
. $HOME/env.sh
L=$HOME/c10; mkdir -p $L
pack() { tar -czf $OUT/c10.tgz -C $HOME c10; }
timeout 560 python3 -m benchmarks.side_by_side --out runs/side --runs 4 --jobs 1,2,3 --json $L/side.json > $L/side.log 2>&1; tail -30 $L/side.log; pack
ls -la $OUT

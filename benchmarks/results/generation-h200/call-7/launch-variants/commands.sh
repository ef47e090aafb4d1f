# dependent launches, early and late trigger, against plain: collection timelines (arms interleaved)
. $HOME/env.sh
L=$HOME/c7b; mkdir -p $L
pack() { tar -czf $OUT/c7b.tgz -C $HOME c7b; }
timeout 90 python3 -m benchmarks.collection_timeline --task countdown-2x10 --prompts 8 --group 8 --collections 4 --launch dependent,late,plain --json $L/timeline-8x8.json > $L/timeline-8x8.log 2>&1; tail -3 $L/timeline-8x8.log; pack
timeout 180 python3 -m benchmarks.collection_timeline --task countdown-2x10 --prompts 64 --group 8 --collections 4 --launch dependent,late,plain --json $L/timeline-64x8.json > $L/timeline-64x8.log 2>&1; tail -3 $L/timeline-64x8.log; pack
ls -la $OUT

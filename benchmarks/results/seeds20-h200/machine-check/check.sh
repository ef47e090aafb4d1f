# onpolicy-small s14 and s15 trained again on one machine (seeds20 library), each compared with its committed run
. $HOME/env.sh
export PYTHONPATH=$HOME/site:$HOME/s20/lib
python3 -c "import grpo_knobs.provenance as p; print('lib', p.__file__, p.source_sha256()[:12])" 2>&1 | tee $OUT/check.log
echo "start $(date +%s)" | tee -a $OUT/check.log
timeout 480 python3 -m grpo_knobs.cli study seeds20 --study-dir runs/check --executor inprocess --jobs 2 \
  --only 'confirmation-countdown-2x10-onpolicy-small-s14' --only 'confirmation-countdown-2x10-onpolicy-small-s15' >> $OUT/check.log 2>&1
echo "rc=$? end $(date +%s)" | tee -a $OUT/check.log
for s in 14 15; do echo "== s$s" >> $OUT/check.log; python3 -m grpo_knobs.cli compare-runs runs/check/confirmation-countdown-2x10-onpolicy-small-s$s results/seeds20/confirmation-countdown-2x10-onpolicy-small-s$s >> $OUT/check.log 2>&1; echo "compare rc=$?" >> $OUT/check.log; done
(cd runs && find check -path '*/final' -prune -o -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.parquet' -o -name 'samples.jsonl.gz' -o -name '*.log' -o -name '*.md' -o -name '*.txt' \) -size -8M -print | tar -czf $OUT/check.tgz -T -)
cp $HOME/b/gpu.txt $OUT/ 2>/dev/null
tail -40 $OUT/check.log; ls -la $OUT

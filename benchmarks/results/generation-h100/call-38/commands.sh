# Call 38: one H100 80GB HBM3 (a plain call; an H100 came), the checkout at 0525262 with results/, figures/ and
# benchmarks/results/ out of the tree and attention_rows.py in probe/; no model (random operands of
# SmolLM2-135M's shapes, the library's decode attention kernel). From the checkout's root:
export PYTHONPATH=$PWD/lib:$PWD PYTHONUNBUFFERED=1

timeout 250 python3 probe/attention_rows.py --json rows-184.json 2>&1 | tee attention-rows.log
timeout 200 python3 probe/attention_rows.py --slot 300 --bucket 320 --json rows-300.json 2>&1 | tee -a attention-rows.log

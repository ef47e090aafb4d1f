# Call 32: one H100 80GB HBM3 (a call for an H200 got an H100), the checkout at 3e397a5 with results/, figures/ and
# benchmarks/results/ out of the tree; no model (random operands of SmolLM2-135M's shapes). From the checkout's root:
export PYTHONPATH=$PWD/lib:$PWD PYTHONUNBUFFERED=1

python3 layer_tail.py 2>&1 | tee layer-tail.log

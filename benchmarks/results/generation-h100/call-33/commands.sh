# Call 33: one H100 80GB HBM3 (a plain call got an H100), the checkout at 960452e with results/, figures/ and
# benchmarks/results/ out of the tree and layer_tail2.py in probe/; no model (random operands of SmolLM2-135M's
# shapes). From the checkout's root:
export PYTHONPATH=$PWD/lib:$PWD PYTHONUNBUFFERED=1

python3 probe/layer_tail2.py 2>&1 | tee layer-tail2.log

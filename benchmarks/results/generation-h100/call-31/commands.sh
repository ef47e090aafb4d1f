# Call 31: one H100 80GB HBM3 (a call for an H200 got an H100), the checkout at bf12173 with results/, figures/ and
# benchmarks/results/ out of the tree; no model (random operands of SmolLM2-135M's shapes). From the checkout's root:
export PYTHONPATH=$PWD/lib:$PWD PYTHONUNBUFFERED=1

python3 products_in_one.py 2>&1 | tee products-in-one.log

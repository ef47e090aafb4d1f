# Call 30: one H100 80GB HBM3 (a call for an H200 got an H100), the checkout at fc31ebe with results/, figures/ and
# benchmarks/results/ out of the tree; no model (random operands of SmolLM2-135M's shapes). From the checkout's root:
export PYTHONPATH=$PWD/lib:$PWD PYTHONUNBUFFERED=1

python3 inductor_products.py > products.log 2> autotune.log   # autotune.log kept without its traceback lines

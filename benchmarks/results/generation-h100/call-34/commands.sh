# Call 34: one H100 80GB HBM3 (a plain call got an H100), the checkout at 960452e with results/, figures/ and
# benchmarks/results/ out of the tree; no model (random operands of SmolLM2-135M's shapes). The script it ran is
# call 35's with layer_tail2-from-call-35.diff applied (without the queue arm, the K step of 128 and the counts
# zeroed per arm). From the checkout's root:
export PYTHONPATH=$PWD/lib:$PWD PYTHONUNBUFFERED=1
R=benchmarks/results/generation-h100
mkdir -p probe && patch -o probe/layer_tail2.py $R/call-35/layer_tail2.py < $R/call-34/layer_tail2-from-call-35.diff

# Stopped by `timeout 520` after the first tile shape: the flow kernel's counts were kept from one tile shape to the
# next (9 o_proj tiles a row block, then 18), so the second shape's waits never reached their targets.
timeout 520 python3 probe/layer_tail2.py 2>&1 | tee layer-tail2.log

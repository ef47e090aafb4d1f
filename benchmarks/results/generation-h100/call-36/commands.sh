# Calls 36 and 37: one H100 80GB HBM3 each time (plain calls; the second found the first's machine warm), the
# checkout at c0d27ec with results/, figures/ and benchmarks/results/ out of the tree and the script in probe/;
# no model (random operands of SmolLM2-135M's shapes). From the checkout's root:

# Call 36 ran an earlier form of cublaslt_algos.py: it searched the algorithm ids one after another and stopped
# at 6,000 configurations a product, which all fell inside id 66 (cuBLASLt's first id here), and it searched
# again for the chain's configurations. Its log and JSON are cublaslt-512.*.
timeout 560 python3 probe/cublaslt_algos.py --rows 512 --seconds 75 --json cublaslt-512.json 2>&1 | tee cublaslt-512.log

# Call 37 ran the script as it is here (ids taken in turn, so every id's configurations are timed; 20,000 a
# product at most, 80 s of screening a product):
timeout 560 python3 probe/cublaslt_algos.py --rows 512 --seconds 80 --json cublaslt-512-ids.json 2>&1 | tee cublaslt-512-ids.log

# The logs print cuBLASLt's enum values; their names in cublasLt.h (CUDA 13.1's, from the nvidia-cublas wheel):
#   tile 14 32x128, 15 64x64, 27 96x64, 28 96x128, 80 40x64, 92 48x64, 124 72x64, 134 80x64, 143 88x64,
#        314 64x40, 319 64x88 (rows x columns of cuBLASLt's column-major D, which is N x M here)
#   stages 35 64xAUTO
#   cluster 0 AUTO, 2 1x1x1, 3 2x1x1, 5 1x2x1, 7 4x2x1, 8 1x4x1, 9 2x4x1

# Call 42: one H200 (a plain call; an H200 came after several calls found no machine), the checkout at c8ddfc4 with
# results/, figures/ and benchmarks/results/ out of the tree and the three scripts in probe/; no model (random
# operands of SmolLM2-135M's shapes; the library's decode attention, cuBLAS through torch). Nsight Compute 2025.3.1.
# The scripts here are as they ran but for two print lines rewrapped for the linter. In attn-pdl.log the
# "product alone" rows are 0.00 by a leftover multiplication by zero in the script: they measure nothing (the
# "lib, no product" rows are attention alone). From the checkout's root:
set -o pipefail
export PYTHONPATH=$PWD/lib:$PWD/probe:$PWD PYTHONUNBUFFERED=1
nvidia-smi > nvidia-smi.txt
timeout 100 python3 probe/pdl_cublas.py 2>&1 | tee pdl.log
timeout 170 python3 probe/attn_pdl.py 2>&1 | tee attn-pdl.log
timeout 200 python3 probe/attn_bound.py --json bound.json 2>&1 | tee bound.log
timeout 100 /usr/local/cuda/bin/ncu --clock-control none --profile-from-start off --set full --import-source yes \
  -o attn python3 probe/attn_bound.py --ncu --rows 512 --slots 184:192 > ncu.log 2>&1
/usr/local/cuda/bin/ncu --import attn.ncu-rep --page details > details.txt 2>&1
/usr/local/cuda/bin/ncu --import attn.ncu-rep --page source --csv --print-source sass > source.csv 2>&1
# committed as source.csv.gz (the .ncu-rep itself, 1.6 MB, is not); on the development machine:
python stalls.py source.csv.gz > stalls.log

# scores-keys-by-queries.diff: attn_pdl.py's "trans" arm written into the library's kernel (whole and split
# launches, the query heads padded to 4); checked on the development machine only (the interpreter's attention
# tests, the sm_90 compile test), not run on a GPU, not in the library.

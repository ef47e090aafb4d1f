# Call 28: the same H200 as call 27, right after it (Nsight Compute 2025.3.1 in /usr/local/cuda/bin): the exports and
# the ncu command of ../../generation-h100/call-26/commands.sh, with that call's ncu_step.py; its output is
# ncu-step.txt.gz here.

# Drawn later on the development machine from this call's profile (step-time.png / .svg; the marks are call 27's
# rollout benchmark: its bound, 0.50 ms a step, and its graphed decode steps, 1.446 ms):
python -m benchmarks.step_counters --from-raw benchmarks/results/generation-h200/call-28/ncu-step.txt.gz \
  --plot benchmarks/results/generation-h200/call-28/step-time.png --mark "the bandwidth bound=0.50" \
  --mark "steps at 40% of the bound=1.15" --mark "the graphed step=1.446" \
  --title "A 512-row fused decode step on an H200 (step 128 of 256), each kernel replayed alone"

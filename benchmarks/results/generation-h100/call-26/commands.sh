# Call 26: one H100 80GB HBM3 (Nsight Compute 2025.3.1 in /usr/local/cuda/bin), the checkout at 49825ea; staged as in
# call 24. ncu_step.py is the program that became benchmarks.step_counters' --target mode (the same engine, the same
# bracketed step); benchmarks.step_counters --from-raw ncu-step.txt.gz prints its table. From the checkout's root:
export PYTHONPATH=$PWD/lib:$PWD GRPO_KNOBS_GGUF=$HOME/model/SmolLM2-135M-Instruct.Q4_1.gguf \
  GRPO_KNOBS_CACHE=$HOME/cache PYTHONPYCACHEPREFIX=$HOME/pyc PYTHONUNBUFFERED=1

ncu --clock-control none --profile-from-start off \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
  --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
  --csv --page details python3 ncu_step.py 128 > ncu-step.txt 2>&1   # committed gzipped

# Call 28: the same H200 as call 27, right after it (Nsight Compute 2025.3.1 in /usr/local/cuda/bin): the exports and
# the ncu command of ../../generation-h100/call-26/commands.sh, with that call's ncu_step.py; its output is
# ncu-step.txt.gz here.

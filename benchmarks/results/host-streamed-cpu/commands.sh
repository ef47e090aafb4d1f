# The host work of a collection, cut and decoded after the last step against streamed block by block
# (ResponseStream), on the development machine's CPU (2 cores), at 20ba028.
python -m benchmarks.host_after --reps 20 --json collection.json | tee collection.log
python -m benchmarks.host_after --reps 20 --prompts 8 --group 64 --capped 1 --mean-length 256 --json rollout.json | tee rollout.log
# Python's garbage collections over one small CPU run (gc_run.log)
PYTHONPATH=.:lib python benchmarks/results/host-streamed-cpu/gc_run.py

# Sourced on the H200 machine from the checkout's root: the library from this checkout, the staged GGUF,
# caches under $HOME (kept while the machine stays warm), the gguf wheel installed by the first staging call.
export PYTHONPATH=$PWD/lib:$PWD:$HOME/site GRPO_KNOBS_GGUF=$HOME/model/SmolLM2-135M-Instruct.Q4_1.gguf \
  GRPO_KNOBS_CACHE=$HOME/cache PYTHONPYCACHEPREFIX=$HOME/pyc PYTHONUNBUFFERED=1

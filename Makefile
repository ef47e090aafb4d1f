# Two commands for a fresh machine:
#   make study   set up .venv, fetch the model, run the smoke study on CPU, draw its figures and report
#   make test    set up .venv, fetch the model, run every test (unit, integration, nbval)
# Without a checkout: install the wheel and work in a `grpo-knobs init` workspace (docs/install.md).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# A pinned torch: on the CPU machines this resolves to a local CPU build; an unpinned
# torch would pull a multi-GB CUDA build. GPU users may set TORCH_SPEC to their build.
TORCH_SPEC ?= torch==2.13.0
# Triton runs the fused decode kernels' tests in its CPU interpreter; 3.6.0 is the version the
# H200 image pairs with its torch. With your own CUDA torch, set TRITON_SPEC= to keep its Triton.
TRITON_SPEC ?= triton==3.6.0
MODEL  ?= smollm2-135m-instruct
PRESET ?= smoke
STAMP  := $(VENV)/.installed
# Notebooks checked by nbval: committed executed, re-run from committed records. The
# training and study drivers (10-45) are exercised by tests/ instead, with tiny budgets.
NBVAL_NOTEBOOKS := lib/grpo_knobs/notebooks/00_data.ipynb $(wildcard lib/grpo_knobs/notebooks/5*.ipynb)

.PHONY: setup study test figures clean-venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)" $(TRITON_SPEC)
	$(BIN)/python -m pip install -q -e ".[test,tracking,ray]"
# TRL with the datasets it imports (tests/test_conventions.py builds real GRPOConfigs,
# tests/test_benchmarks.py runs the TRL peer script on CPU), their requirements pinned here
# (--no-deps keeps pip from choosing other versions); `pip check` below proves the set complete.
	$(BIN)/python -m pip install -q --no-deps trl==1.16.0 datasets==5.2.0 dill==0.4.0 \
		multiprocess==0.70.18 xxhash==3.6.0
# SGLang's argument parser and API types (tests/test_sglang.py) go beside the environment, not
# into it: SGLang pins its own torch and transformers. tests/conftest.py puts them on the path.
	rm -rf $(VENV)/sglang-api
	$(BIN)/python -m pip install -q --no-deps --target $(VENV)/sglang-api -r tests/sglang-api-requirements.txt
	$(BIN)/python -m pip check
	touch $(STAMP)

setup: $(STAMP)
	$(BIN)/grpo-knobs fetch-model $(MODEL)

study: setup
	$(BIN)/grpo-knobs study $(PRESET)
	$(BIN)/grpo-knobs report runs/$(PRESET)

test: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest tests $(NBVAL_NOTEBOOKS) --nbval-lax --nbval-sanitize-with tests/nbval_sanitize.cfg

# Re-execute the committed analysis notebooks on results/h200-mini, rewriting figures/ and its report.
figures: $(STAMP)
	$(BIN)/grpo-knobs analyze --committed
	$(BIN)/grpo-knobs report results/h200-mini

clean-venv:
	rm -rf $(VENV)

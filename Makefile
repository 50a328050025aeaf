# psyrl: `make test` on a fresh clone builds .venv and runs the whole suite (what CI runs).
PYTHON ?= python3
VENV ?= .venv
# On a laptop without a GPU, the CPU build of torch avoids GBs of CUDA wheels:
#   make test TORCH_SPEC='torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu'
TORCH_SPEC ?= torch==2.13.0
PIP_ARGS ?=
PY := $(VENV)/bin/python
STAMP := $(VENV)/.psyrl-installed

.PHONY: install test test-fast lint bench docs clean

install: $(STAMP)

# Re-runs only when pyproject.toml changes: a second `make test` installs nothing.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(PIP_ARGS) $(TORCH_SPEC)
	$(PY) -m pip install -q $(PIP_ARGS) -e '.[dev]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -x

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) bench/reward_throughput.py

# Regenerates the config reference inside README.md from the dataclass docstrings.
docs: $(STAMP)
	$(PY) -m psyrl.cli config reference --write-readme README.md

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis

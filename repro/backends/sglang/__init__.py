"""Live SGLang backend (optional extra; imported lazily, never by the simulator).

Modules here:
* `rlt_patch`  -- registers the `rlt` eviction strategy in SGLang 0.5.23 and hooks marking into
  its `RadixCache` (`apply()`, idempotent; no fork of SGLang). What the patched tree does and
  how it differs from `repro.kvcache`'s node-granularity RLT: its module docstring.
* `server`     -- `python -m repro.backends.sglang.server --radix-eviction-policy rlt <sglang args>`
  (GPU nodes; `--check-spawn` is a CPU-runnable pre-flight check).
* `cpu_shims`  -- test/benchmark-only import shims for SGLang's radix cache on a CPU machine.
* `backend`    -- the harness entry point for `backend=sglang` (run_cell, validate_cell, identity).
* `config`     -- the backend's config as types: every default of conf/backend/sglang.yaml once,
  and the router service's / emulated workers' process configs.
* `orchestrate` -- one cell on a node: M servers (or emulated workers), router, client, teardown
  (`planning`: the commands and configs of a cell; `processes`: starting and stopping them).
* `node_agent` -- the servers of one other node of a Slurm job (one srun step).
* `router_service` -- package: aiohttp proxy routing SGLang `/generate` with the repro.routing classes.
* `client`     -- open-loop streaming benchmark client writing the simulator's per-request records.
* `emulated_worker` -- GPU-less SGLang stand-in: the simulator's worker behind the same protocol
  (`realtime_worker`: that worker driven by the wall clock).
* `protocol`   -- SGLang 0.5.23's `/generate` wire format as these modules speak it.
* `cli_common` -- the `--config/--host/--port` command line of router service and emulated worker.

CPU checks against SGLang's real RadixCache (from the repo root; times measured on this 2-core
machine shared with other jobs, load average ~5-6):

    bash scripts/make_sglang_env.sh                  # .venv-sglang: 7 min 22 s from scratch with an
                                                     # empty pip cache, 3 min 43 s with a warm one,
                                                     # 23 s when already up to date; 1.8 GB
    .venv-sglang/bin/python -m pytest -m sglang tests/sglang            # 38 tests, ~2 min 45 s
    PYTHONPATH=. .venv-sglang/bin/python tests/benchmarks/bench_sglang.py   # ~25 s (--quick ~20 s)

`make test-sglang` runs the same tests (it builds the env first).
"""

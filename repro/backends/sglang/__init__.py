"""Live SGLang backend (optional extra; imported lazily, never by the simulator).

Modules here:
* `rlt_patch`  -- registers the `rlt` eviction strategy in SGLang 0.5.23 and hooks marking into
  its `RadixCache` (`apply()`, idempotent; no fork of SGLang).
* `server`     -- `python -m repro.backends.sglang.server --radix-eviction-policy rlt <sglang args>`.
* `cpu_shims`  -- test/benchmark-only import shims for SGLang's radix cache on a CPU machine.
"""

"""Test-only backend: deterministic per-request records from the cell config.

Cells of a chosen length (`backend.sleep_s`) or failing on purpose (`backend.fail_when_rate`),
for the tests that need them (killing a sweep from outside). Selected with
`backend.name: tests.harness.fake_backend` (tests/harness/conf/backend/fake.yaml).
Every number depends only on the cell's config (seed, workload, policy, workers), never on
the process or the wall clock, like a real backend.
"""

from __future__ import annotations

import time
import zlib
from typing import Callable

import numpy as np
import pandas as pd
from omegaconf import DictConfig

from repro.backends.base import CellResult
from repro.metrics import RECORD_COLUMNS


def run_cell(cfg: DictConfig, progress: Callable[[float], None] | None = None) -> CellResult:
    wl = cfg.workload
    rate = float(wl.request_rate)
    if cfg.backend.get("fail_when_rate") is not None and rate == float(cfg.backend.fail_when_rate):
        raise RuntimeError(f"fake backend: configured to fail at request_rate={rate}")
    if cfg.backend.get("sleep_s"):
        time.sleep(float(cfg.backend.sleep_s))
    n, m = int(wl.num_queries), int(cfg.cluster.num_workers)
    rng = np.random.default_rng([int(cfg.seed), zlib.crc32(str(cfg.policy_name).encode())])
    arrival = np.cumsum(rng.exponential(1.0 / rate, n))
    worker = rng.integers(0, m, n)
    prompt = rng.integers(16, 96, n)
    cached = (prompt * rng.uniform(0.0, 0.9, n)).astype(np.int64)
    out_tokens = np.full(n, int(wl.output_len))
    first = arrival + 1e-4 * (prompt - cached) + 0.005
    finish = first + 0.002 * out_tokens
    for i in range(1, 5):
        if progress is not None:
            progress(i / 4)
    records = pd.DataFrame(
        {
            "id": np.arange(n),
            "worker": worker.astype(np.int64),
            "arrival_s": arrival,
            "first_token_s": first,
            "finish_s": finish,
            "queue_wait_s": np.full(n, np.nan),  # like a live backend: no queue times
            "prefill_s": np.full(n, np.nan),
            "decode_s": finish - first,
            "prompt_tokens": prompt.astype(np.int64),
            "cached_tokens": cached,
            "output_tokens": out_tokens.astype(np.int64),
            "group": (np.arange(n) % 3).astype(np.int64),
            "failed": np.zeros(n, dtype=bool),
        },
        columns=list(RECORD_COLUMNS),
    )
    return CellResult(
        records=records,
        provenance={"backend": "fake", "workload": {"name": str(wl.name), "synthetic": True}},
        timings={"route_s_per_call": time.perf_counter() % 1e-3},  # machine-dependent on purpose
    )

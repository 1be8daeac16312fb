"""run_cell on the real parts: conf/{model,hardware,workload,router,eviction} + the packages.

Every router x eviction config file is simulated on a small GSP cell; a missing part is a
failure, never a skip.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parents[2] / "conf"


def routers() -> list[str]:
    return sorted(p.stem for p in (CONF / "router").glob("*.yaml")) or ["none"]


def evictions() -> list[str]:
    return sorted(p.stem for p in (CONF / "eviction").glob("*.yaml") if p.stem != "opt") or ["none"]


def cell(router: str, eviction: str, seed: int = 0):
    root = OmegaConf.load(CONF / "config.yaml")
    cfg = OmegaConf.create(
        {
            "seed": seed,
            "cluster": root.cluster,
            "model": OmegaConf.load(CONF / "model" / "llama31_8b.yaml"),
            "hardware": OmegaConf.load(CONF / "hardware" / "l40.yaml"),
            "workload": OmegaConf.load(CONF / "workload" / "gsp.yaml"),
            "router": OmegaConf.load(CONF / "router" / f"{router}.yaml"),
            "eviction": OmegaConf.load(CONF / "eviction" / f"{eviction}.yaml"),
        }
    )
    cfg.cluster.num_workers = 2
    cfg.cluster.kv_cache_tokens = 40_000  # small enough that eviction happens
    cfg.workload.num_queries = 96
    cfg.workload.num_groups = 8
    cfg.workload.request_rate = 24.0
    if router == "fixed":  # it routes a trace's assignments: the same GSP requests as a trace, alternating
        cfg.workload = gsp_as_trace(cfg.workload, seed, 2)
    return cfg


def gsp_as_trace(workload_cfg, seed: int, num_workers: int):
    """The workload's requests written as a trace (workload=trace) with request i on worker i % M."""
    import tempfile

    from repro.workloads import build_workload
    from repro.workloads.trace import request_rows, write_trace

    reqs = build_workload(OmegaConf.to_container(workload_cfg), seed=seed).requests
    path = Path(tempfile.mkdtemp(prefix="gsp_trace_")) / "trace.jsonl"
    write_trace(path, request_rows(reqs, [i % num_workers for i in range(len(reqs))]))
    return OmegaConf.merge(OmegaConf.load(CONF / "workload" / "trace.yaml"), {"path": str(path)})


@pytest.mark.parametrize("eviction", evictions())
@pytest.mark.parametrize("router", routers())
def test_real_parts_simulate_every_router_and_eviction(router, eviction):
    from repro.backends.sim import run_cell
    from repro.metrics import summarize

    a = run_cell(cell(router, eviction))
    rec = a.records
    assert len(rec) == 96 and not rec["failed"].any()
    assert (rec["arrival_s"] <= rec["first_token_s"]).all() and (rec["first_token_s"] <= rec["finish_s"]).all()
    assert ((0 <= rec["cached_tokens"]) & (rec["cached_tokens"] <= rec["prompt_tokens"])).all()
    assert rec["cached_tokens"].sum() > 0  # GSP shares system prompts
    s = summarize(rec, a.provenance)
    assert s["num_requests"] == 96 and np.isfinite(s["latency_p95_s"])
    b = run_cell(cell(router, eviction))
    pd.testing.assert_frame_equal(rec, b.records, check_exact=True)

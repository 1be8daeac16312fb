"""repro.backends.sim.run_cell: config -> parts -> simulation -> CellResult.

The workload / cost model / cache builders are replaced by the test fakes here, so these
tests check the backend's wiring (seeds, capacities, validation, records, provenance)
independently of those packages.
"""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest
from omegaconf import OmegaConf

import repro.costmodel
import repro.kvcache
import repro.workloads
from repro.backends.base import CellResult
from repro.metrics import RECORD_COLUMNS, REGIMES, WORKER_BUSY_KEY, summarize
from repro.backends.sim import run_cell
from repro.backends.assembly import SeedPlan
from tests.sim.sim_fakes import FixedCostModel, TrieCache, gsp_requests

CALLS: dict = {}


@pytest.fixture
def fake_parts(monkeypatch):
    CALLS.clear()

    def build_workload(cfg, seed):
        CALLS.setdefault("workload_seeds", []).append(seed)
        reqs = gsp_requests(seed % 1000, num_groups=cfg["num_groups"], per_group=4, rate=50.0)
        return SimpleNamespace(requests=reqs, provenance={"source": "fake-gsp", "seed": seed})

    def make_cache(capacity, eviction_cfg, seed):
        CALLS.setdefault("caches", []).append((capacity, eviction_cfg["name"], seed))
        return TrieCache(capacity)

    class StepCostModel(FixedCostModel):
        @classmethod
        def from_config(cls, model_cfg, hardware_cfg):
            return cls(base_s=0.003, prefill_token_s=float(hardware_cfg["sec_per_token"]), decode_seq_s=0.001)

    def kv_capacity_tokens(model_cfg, hardware_cfg, mem_fraction):
        return int(hardware_cfg["memory_tokens"] * mem_fraction)

    monkeypatch.setattr(repro.workloads, "build_workload", build_workload, raising=False)
    monkeypatch.setattr(repro.kvcache, "make_cache", make_cache, raising=False)
    monkeypatch.setattr(repro.costmodel, "StepCostModel", StepCostModel, raising=False)
    monkeypatch.setattr(repro.costmodel, "kv_capacity_tokens", kv_capacity_tokens, raising=False)


def cell(**over):
    cfg = OmegaConf.create(
        {
            "seed": 0,
            "model": {"name": "fake-8b"},
            "hardware": {"name": "fake-gpu", "sec_per_token": 0.0004, "memory_tokens": 1000},
            "workload": {"num_groups": 6},
            "router": {"_target_": "tests.sim.sim_fakes.RandomRouter"},
            "eviction": {"name": "lru", "granularity": "token"},
            "cluster": {
                "num_workers": 3,
                "mem_fraction": 0.5,
                "kv_cache_tokens": None,
                "scheduler": {
                    "schedule_policy": "lpm",
                    "max_running_requests": 8,
                    "max_prefill_tokens": 256,
                    "chunked_prefill_size": 64,
                },
            },
        }
    )
    for dotted, value in over.items():
        OmegaConf.update(cfg, dotted.replace("__", "."), value, merge=False)
    return cfg


def test_run_cell_returns_records_provenance_and_timings(fake_parts):
    seen = []
    res = run_cell(cell(), progress=seen.append)
    assert isinstance(res, CellResult)
    assert tuple(res.records.columns) == RECORD_COLUMNS
    assert len(res.records) == 24 and not res.records["failed"].any()
    assert res.records["worker"].isin([0, 1, 2]).all()
    plan = SeedPlan.spawn(0, 3)
    assert CALLS["workload_seeds"] == [plan.workload]
    assert CALLS["caches"] == [(500, "lru", s) for s in plan.workers]  # 1000 * mem_fraction
    p = res.provenance
    assert (p["backend"], p["model"], p["gpu"], p["seed"]) == ("sim", "fake-8b", "fake-gpu", 0)
    assert p["kv_capacity_tokens"] == [500, 500, 500]
    assert p["workload"] == {"source": "fake-gsp", "seed": plan.workload}
    assert p["scheduler"]["chunked_prefill_size"] == 64
    assert {"repro", "python", "numpy"} <= set(p["versions"])
    assert res.timings["routing"]["decisions"] == 24
    assert seen[-1] == 1.0 and seen == sorted(seen)
    # busy seconds per worker for the summary's utilisation, within the makespan
    s = summarize(res.records, p)
    assert len(p[WORKER_BUSY_KEY]) == 3 and "busy_s" not in p["sim"]
    assert 0 < s["util_mean"] <= s["util_max"] <= 1 and s["regime"] in REGIMES


def test_run_cell_is_deterministic_and_seed_sensitive(fake_parts):
    a, b = run_cell(cell()), run_cell(cell())
    pd.testing.assert_frame_equal(a.records, b.records, check_exact=True)
    assert a.provenance == b.provenance
    c = run_cell(cell(seed=1))
    assert not a.records["finish_s"].equals(c.records["finish_s"])


def test_explicit_kv_cache_tokens_per_worker(fake_parts):
    res = run_cell(cell(cluster__kv_cache_tokens=[300, 400, 500]))
    assert res.provenance["kv_capacity_tokens"] == [300, 400, 500]
    assert [c[0] for c in CALLS["caches"]] == [300, 400, 500]
    res = run_cell(cell(cluster__kv_cache_tokens=350))
    assert res.provenance["kv_capacity_tokens"] == [350, 350, 350]


@pytest.mark.parametrize(
    "over, message",
    [
        ({"cluster__num_workers": 0}, "num_workers"),
        ({"cluster__scheduler__schedule_policy": "random"}, "schedule_policy"),
        ({"cluster__scheduler__max_running_requests": 0}, "max_running_requests"),
        ({"cluster__kv_cache_tokens": [100, 200]}, "2 capacities for 3 workers"),
        ({"cluster__kv_cache_tokens": 0}, "kv_cache_tokens"),
        ({"cluster__mem_fraction": 1.5}, "mem_fraction"),
        ({"seed": -3}, "seed"),
    ],
)
def test_bad_config_fails_before_any_work(fake_parts, over, message):
    with pytest.raises(ValueError, match=message):
        run_cell(cell(**over))
    assert "workload_seeds" not in CALLS and "caches" not in CALLS


def test_request_larger_than_the_cache_is_a_clear_error(fake_parts):
    with pytest.raises(ValueError, match="whole KV cache"):
        run_cell(cell(cluster__kv_cache_tokens=20))

"""The embedded default backend: one config cell -> the discrete-event simulator -> CellResult.

Builds, from the composed config: the workload (repro.workloads.build_workload), the step-cost
model (repro.costmodel.StepCostModel.from_config), one radix cache per worker
(repro.kvcache.make_cache) of capacity `cluster.kv_cache_tokens` when set (an int, or a list
of one int per worker) else `kv_capacity_tokens(model, hardware, cluster.mem_fraction)`, and
the router (hydra.utils.instantiate(cfg.router)). Seeds: see repro.sim.SeedPlan.

Nothing global and no wall clock in the result: `records` and `provenance` depend only on the
config; `timings` (routing / eviction CPU time) is machine-dependent and kept apart.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Callable

import numpy as np
from omegaconf import DictConfig

import repro
from repro.backends.base import CellResult
from repro.confutil import to_plain
from repro.results.fingerprint import PYTHON_VERSION
from repro.sim.cluster import SeedPlan, SimCluster, StateSampler
from repro.sim.worker import SchedulerConfig


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def kv_capacities(cfg: DictConfig, num_workers: int) -> list[int]:
    """Per-worker KV capacity in tokens: cluster.kv_cache_tokens if set, else the memory formula."""
    explicit = cfg.cluster.get("kv_cache_tokens")
    if explicit is not None:
        explicit = to_plain(explicit)
        if isinstance(explicit, (list, tuple)):
            if len(explicit) != num_workers:
                raise ValueError(
                    f"cluster.kv_cache_tokens lists {len(explicit)} capacities for {num_workers} workers"
                )
            return [_positive_int(v, "cluster.kv_cache_tokens[i]") for v in explicit]
        return [_positive_int(explicit, "cluster.kv_cache_tokens")] * num_workers
    frac = cfg.cluster.get("mem_fraction")
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0.0 < frac <= 1.0:
        raise ValueError(f"cluster.mem_fraction must be in (0, 1], got {frac!r}")
    import repro.costmodel as costmodel

    cap = costmodel.kv_capacity_tokens(cfg.model, cfg.hardware, float(frac))
    return [_positive_int(cap, "kv_capacity_tokens(model, hardware, mem_fraction)")] * num_workers


def run_cell(
    cfg: DictConfig,
    progress: Callable[[float], None] | None = None,
    wrap_router: Callable[[Any], Any] | None = None,
) -> CellResult:
    """Simulate one grid cell; `progress(fraction finished)` is called now and then.

    `wrap_router(router)` may return a wrapper the cell routes through instead (diagnostics
    record every decision this way: repro/routing/lbgr_diagnostics.py).
    """
    import hydra.utils

    import repro.costmodel as costmodel
    import repro.kvcache as kvcache
    import repro.workloads as workloads

    # -- everything that can be checked from the config alone, before any work
    num_workers = _positive_int(cfg.cluster.num_workers, "cluster.num_workers")
    scheduler = SchedulerConfig.from_config(to_plain(cfg.cluster.get("scheduler")))
    seeds = SeedPlan.spawn(cfg.seed, num_workers)
    eviction_name = cfg.eviction.get("name")
    if not eviction_name:
        raise ValueError("eviction.name is not set")
    capacities = kv_capacities(cfg, num_workers)

    # -- build the parts
    cost_model = costmodel.StepCostModel.from_config(cfg.model, cfg.hardware)
    workload = workloads.build_workload(cfg.workload, seeds.workload)
    caches = [kvcache.make_cache(cap, cfg.eviction, s) for cap, s in zip(capacities, seeds.workers)]
    router = hydra.utils.instantiate(cfg.router)
    if wrap_router is not None:
        router = wrap_router(router)

    sim = SimCluster(workload.requests, caches, cost_model, router, scheduler, str(eviction_name), seeds.router)
    # worker state over simulated time for the cell's time series (not when tracking is off)
    tracking = cfg.get("tracking") or {}
    sampler = None if str(tracking.get("mode", "offline")) == "disabled" else StateSampler(
        int(tracking.get("max_points", 320))
    )
    result = sim.run(progress, sampler)

    provenance = {
        "backend": "sim",
        "model": cfg.model.get("name"),
        "gpu": cfg.hardware.get("name"),
        "workload": to_plain(getattr(workload, "provenance", {})),
        "seed": seeds.seed,
        "seeds": {"workload": seeds.workload, "router": seeds.router, "workers": list(seeds.workers)},
        "num_workers": num_workers,
        "kv_capacity_tokens": capacities,
        "scheduler": asdict(scheduler),
        "router": to_plain(cfg.router),
        "eviction": to_plain(cfg.eviction),
        "sim": result.stats,
        "versions": {
            "repro": repro.__version__,
            "python": PYTHON_VERSION,
            "numpy": np.__version__,
        },
    }
    samples = sampler.as_dict() if sampler is not None else None
    return CellResult(records=result.records, provenance=provenance, timings=result.timings, samples=samples)

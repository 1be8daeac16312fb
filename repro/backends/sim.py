"""The embedded default backend: one config cell -> the discrete-event simulator -> CellResult.

The cell's parts (seeds, per-worker KV capacities, scheduler config, step-cost model, workload,
one radix cache per worker, router) and the common provenance come from
repro.backends.assembly, shared with the live backend and with validation; this module runs
them on repro.sim.SimCluster.

Nothing global and no wall clock in the result: `records` and `provenance` depend only on the
config; `timings` (routing / eviction CPU time) is machine-dependent and kept apart.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from repro.backends import assembly
from repro.backends.base import CellResult
from repro.confutil import to_plain
from repro.metrics import WORKER_BUSY_KEY
from repro.sim.cluster import SimCluster, StateSampler

DETERMINISTIC = True  # simulated time only, RNGs from the cell's seed (docs/ARCHITECTURE.md)
PLAIN_CONFIG = True  # the assembly takes plain mappings (as validation gives them)


def run_cell(
    cfg: Mapping, progress: Callable[[float], None] | None = None, wrap_router: Callable[[Any], Any] | None = None
) -> CellResult:
    """Simulate one grid cell; `progress(fraction finished)` is called now and then.

    `wrap_router(router)` may return a wrapper the cell routes through instead (diagnostics
    record every decision this way: repro/analysis/decisions.py). `cfg`: plain mappings (an OmegaConf
    node is resolved here, once).
    """
    cfg = to_plain(cfg)
    cell = assembly.assemble(cfg, wrap_router=wrap_router)
    plan = cell.plan
    client_plan = getattr(cell.workload, "client", None)  # protocol=artifact: the authors' benchmark client
    sim = SimCluster(
        cell.requests,
        cell.caches,
        cell.cost_model,
        cell.router,
        plan.scheduler,
        plan.eviction_name,
        plan.seeds.router,
        client=client_plan.start(cell.requests) if client_plan is not None else None,
    )
    # worker state over simulated time for the cell's time series (not when tracking is off)
    tracking = cfg.get("tracking") or {}
    sampler = (
        None
        if str(tracking.get("mode", "offline")) == "disabled"
        else StateSampler(int(tracking.get("max_points", 320)))
    )
    result = sim.run(progress, sampler)

    stats = dict(result.stats)
    provenance = {
        "backend": "sim",
        **assembly.cell_provenance(cfg, cell),
        "sim": stats,
        WORKER_BUSY_KEY: stats.pop("busy_s"),  # the summary's utilisation reads it here
        "versions": assembly.versions(),
    }
    samples = sampler.as_dict() if sampler is not None else None
    return CellResult(records=result.records, provenance=provenance, timings=result.timings, samples=samples)

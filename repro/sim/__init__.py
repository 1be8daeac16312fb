"""Discrete-event simulator of an SGLang-like serving cluster (ALGORITHMS.md §1, §5, §6).

    SimCluster(requests, caches, cost_model, router, scheduler, eviction_policy, router_seed).run()
        -> SimResult(records, timings, stats)

`repro.sim.worker` holds the per-worker scheduler (continuous batching; its docstring lists every
simplification), `repro.sim.cluster` the event loop and the seed plan. The config-driven entry
point is `repro.backends.sim.run_cell`.
"""

from repro.sim.cluster import SeedPlan, SimCluster, SimResult, StateSampler, validate_requests
from repro.sim.worker import RequestTable, SchedulerConfig, SimTimings, SimWorker, SimWorkerView, StepInfo

__all__ = [
    "RequestTable",
    "SchedulerConfig",
    "SeedPlan",
    "SimCluster",
    "SimResult",
    "SimTimings",
    "SimWorker",
    "SimWorkerView",
    "StateSampler",
    "StepInfo",
    "validate_requests",
]

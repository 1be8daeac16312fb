"""Discrete-event simulator of an SGLang-like serving cluster (docs/ALGORITHMS.md §1, §5-7).

    SimCluster(requests, caches, cost_model, router, scheduler, eviction_policy, router_seed).run()
        -> SimResult(records, timings, stats)

`repro.sim.worker` holds the per-worker scheduler (continuous batching; its parts and every
simplification: docs/ALGORITHMS.md §7), `repro.sim.cluster` the event loop. It takes plain seeds
and already checked requests: the seed plan and the request checks live with the cell assembly
(repro.backends.assembly). The config-driven entry point is `repro.backends.sim.run_cell`.
"""

from repro.sim.cluster import SimCluster, SimResult, StateSampler
from repro.sim.worker import RequestTable, SchedulerConfig, SimTimings, SimWorker, SimWorkerView, StepInfo

__all__ = [
    "RequestTable",
    "SchedulerConfig",
    "SimCluster",
    "SimResult",
    "SimTimings",
    "SimWorker",
    "SimWorkerView",
    "StateSampler",
    "StepInfo",
]

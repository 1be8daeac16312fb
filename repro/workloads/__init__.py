"""Workloads: GSP, ShareGPT, UltraChat and LooGLE as token-level request streams.

    from repro.workloads import build_workload
    wl = build_workload(cfg.workload, seed=cfg.seed)   # conf/workload/<name>.yaml
    wl.requests          # list[Request], sorted by arrival_s, ids 0..N-1
    wl.provenance        # JSON-able: source file + sha256, synthetic stand-in or not, tokenizer ...
    wl.max_request_tokens

A workload is pure data: it knows nothing of caches or routers. Each workload is one
module here + one `conf/workload/<name>.yaml` whose `_target_` names its class.
"""

from repro.workloads.base import (
    COMMON_DEFAULTS,
    MissingDataError,
    Workload,
    WorkloadConfigError,
    WorkloadError,
    WorkloadSpec,
    build_workload,
    resolve_spec,
)
from repro.workloads.request import Request

__all__ = [
    "COMMON_DEFAULTS",
    "MissingDataError",
    "Request",
    "Workload",
    "WorkloadConfigError",
    "WorkloadError",
    "WorkloadSpec",
    "build_workload",
    "resolve_spec",
]

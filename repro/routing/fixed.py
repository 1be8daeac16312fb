"""A router that sends each request where a recorded trace says it went (`Request.server`).

Replaying a real cell's assignments through the simulator (repro.analysis.sim_vs_real) separates
the cache and scheduler model from the routing decisions: the trace workload
(repro/workloads/trace.py) fills `server` from the trace's `server` field. A request without one,
or with one outside 0..M-1, is an error naming it (never a silent fallback).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from repro.routing.base import Router, WorkerView

if TYPE_CHECKING:  # pragma: no cover
    from repro.workloads.request import Request


class FixedRouter(Router):
    name = "fixed"

    def __init__(self, name: str = "fixed") -> None:
        self.name = name

    def select_worker(self, request: "Request", workers: Sequence[WorkerView], now_s: float) -> int:
        server = getattr(request, "server", None)
        if server is None:
            raise ValueError(
                f"router fixed: request {request.id} has no assigned server (the trace workload's `server` "
                "field; every request of the trace needs one)"
            )
        if not 0 <= int(server) < len(workers):
            raise ValueError(
                f"router fixed: request {request.id} is assigned server {server}, but the cell has "
                f"{len(workers)} workers (cluster.num_workers)"
            )
        return int(server)

"""LMetric (arXiv 2603.15202): score = new prefill tokens on the worker x (its batch + 1), lowest wins.

The product makes the cache term and the load term scale-free (no weight to tune). What the
paper leaves open, and what this class fixes (docs/ALGORITHMS.md "Today's routers"):
* new prefill tokens = prompt length - the worker's cached prefix (WorkerView.peek_prefix: exact
  in the simulator, the router service's tracker live);
* batch = the worker's running requests (`batch: running`) or running + waiting (`in_flight`);
* "+ 1" (the issue's form): an idle worker still pays its prefill, so an empty batch is not a
  free pass; a fully cached prompt scores 0 everywhere it is cached (the paper's degenerate case);
* ties: uniformly at random from the router's seeded RNG.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from repro.routing.base import Router, WorkerView, check_choice, request_key

if TYPE_CHECKING:  # pragma: no cover
    from repro.workloads.request import Request


class LMetricRouter(Router):
    """LMetric's product score (see the module docstring)."""

    name = "lmetric"

    def __init__(self, name: str = "lmetric", batch: str = "running") -> None:
        self.name = name
        self.batch = check_choice("batch", batch, ("running", "in_flight"))

    def score(self, w: WorkerView, key: bytes, n: int) -> int:
        b = w.running if self.batch == "running" else w.in_flight
        return (n - w.peek_prefix(key)) * (b + 1)

    def select_worker(self, request: "Request", workers: Sequence[WorkerView], now_s: float) -> int:
        key = request_key(request)
        n = len(key) >> 2
        best, best_score, tied = -1, None, 0
        for w in workers:
            s = self.score(w, key, n)
            if best_score is None or s < best_score:
                best, best_score, tied = w.worker_id, s, 1
            elif s == best_score:
                tied += 1
                if int(self.rng.integers(tied)) == 0:
                    best = w.worker_id
        return best

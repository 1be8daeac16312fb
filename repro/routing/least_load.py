"""smg 1.13's `least_load` router: the least expected wait, from the workers' reported load.

Rule (smg-project/smg model_gateway/src/policies/least_load.rs; the 1.13.0 binary's flags
--least-load-kv-pressure-weight / -default-throughput / -mean-prefill-tokens / -max-waiting-requests):

  score(w) = (queued_tokens(w) + dispatched_since_poll_tokens(w)) / throughput(w)
             + kv_pressure_weight * k / (1 - k),        k = KV token usage clamped to [0, 0.999]
  queued_tokens = the waiting requests' uncached prompt tokens (if reported > 0, else
                  waiting requests * mean_prefill_tokens)

the lowest score wins, ties uniformly at random (smg: reservoir over its thread RNG; here the
router's seeded RNG). The k / (1 - k) term is smg's KV barrier: a worker near a full KV pool
costs without bound. `max_waiting_requests` > 0 skips workers whose waiting queue reached it.

loads = "view": the WorkerView is the report, fresh at every decision (the simulator's; the
dispatched-since-poll term is then 0), throughput = default_throughput (our workers report no
generation throughput), k = active_kv_tokens / kv_capacity_tokens (SGLang's token_usage counts
running requests' KV, not the evictable cache). loads = "dark": no worker reports a load, as
behind the real binary with workers that never answer its load poll: score = the router's own
in-flight count (what the 1.13.0 binary does then; the router_binary parity test's case).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from repro.routing.base import Router, WorkerView, check_choice

if TYPE_CHECKING:  # pragma: no cover
    from repro.workloads.request import Request


class LeastLoadRouter(Router):
    """smg 1.13 `least_load` (see the module docstring); defaults = smg's."""

    name = "least_load"

    def __init__(
        self,
        name: str = "least_load",
        kv_pressure_weight: float = 0.15,
        default_throughput: float = 2000.0,
        mean_prefill_tokens: int = 1024,
        max_waiting_requests: int = 0,
        loads: str = "view",
    ) -> None:
        if not (
            isinstance(kv_pressure_weight, (int, float))
            and math.isfinite(kv_pressure_weight)
            and kv_pressure_weight >= 0
        ):
            raise ValueError(f"kv_pressure_weight must be finite and >= 0, got {kv_pressure_weight!r}")
        if not (
            isinstance(default_throughput, (int, float))
            and math.isfinite(default_throughput)
            and default_throughput > 0
        ):
            raise ValueError(f"default_throughput must be finite and > 0 (tokens/s), got {default_throughput!r}")
        for key, v, lo in (
            ("mean_prefill_tokens", mean_prefill_tokens, 1),
            ("max_waiting_requests", max_waiting_requests, 0),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{key} must be an int >= {lo}, got {v!r}")
        self.name = name
        self.kv_pressure_weight = float(kv_pressure_weight)
        self.default_throughput = float(default_throughput)
        self.mean_prefill_tokens = mean_prefill_tokens
        self.max_waiting_requests = max_waiting_requests
        self.loads = check_choice("loads", loads, ("view", "dark"))

    def reset(self, workers: Sequence[WorkerView], seed: int) -> None:
        super().reset(workers, seed)
        self.in_flight = [0] * self.num_workers

    def score(self, w: WorkerView) -> float:
        if self.loads == "dark":
            return float(self.in_flight[w.worker_id])
        queued = w.waiting_prefill_tokens
        if queued <= 0:
            queued = max(w.waiting, 0) * self.mean_prefill_tokens
        k = min(max(w.active_kv_tokens / max(w.kv_capacity_tokens, 1), 0.0), 0.999)
        return queued / self.default_throughput + self.kv_pressure_weight * k / (1.0 - k)

    def select_worker(self, request: "Request", workers: Sequence[WorkerView], now_s: float) -> int:
        cands = range(self.num_workers)
        if self.max_waiting_requests and self.loads == "view":
            capped = [i for i in cands if workers[i].waiting < self.max_waiting_requests]
            cands = capped or cands  # smg answers no worker; the simulator keeps every one
        best, best_score, tied = -1, math.inf, 0
        for i in cands:
            s = self.score(workers[i])
            if s < best_score:
                best, best_score, tied = i, s, 1
            elif s == best_score:
                tied += 1
                if int(self.rng.integers(tied)) == 0:  # reservoir: uniform among the tied
                    best = i
        self.in_flight[best] += 1
        return best

    def on_request_complete(self, request, worker_id, latency_s, ttft_s, cached_tokens, now_s=None):
        if self.in_flight[worker_id] > 0:
            self.in_flight[worker_id] -= 1

    def on_request_abandoned(self, request, worker_id, now_s=None):
        self.on_request_complete(request, worker_id, 0.0, 0.0, 0, now_s)

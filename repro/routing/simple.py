"""Load-only baselines: random, round-robin (paper §5) and power-of-two choices (extra row)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from repro.routing.base import Router, WorkerView, check_choice

if TYPE_CHECKING:  # pragma: no cover
    from repro.workloads.request import Request


class RandomRouter(Router):
    """Uniform over the M workers, from the run's seeded generator."""

    name = "random"

    def __init__(self, name: str = "random") -> None:
        self.name = name

    def select_worker(self, request: "Request", workers: Sequence[WorkerView], now_s: float) -> int:
        return int(self.rng.integers(self.num_workers))


class RoundRobinRouter(Router):
    """Counter modulo M, starting at worker 0 on every reset (sglang-router's round_robin)."""

    name = "round_robin"

    def __init__(self, name: str = "round_robin") -> None:
        self.name = name

    def reset(self, workers: Sequence[WorkerView], seed: int) -> None:
        super().reset(workers, seed)
        self.counter = 0

    def select_worker(self, request: "Request", workers: Sequence[WorkerView], now_s: float) -> int:
        worker = self.counter % self.num_workers
        self.counter += 1
        return worker


class PowerOfTwoRouter(Router):
    """Power of two choices: draw two distinct workers uniformly, send to the less loaded one.

    load = "in_flight" (default): the router's own count of dispatched, not yet completed
    requests per worker (what sglang-router's power_of_two compares; works the same live);
    "view": WorkerView.in_flight. Ties go to the first worker drawn (sglang-router: `<=`).
    With one worker it always answers 0.
    """

    name = "power_of_two"

    def __init__(self, name: str = "power_of_two", load: str = "in_flight") -> None:
        self.name = name
        self.load = check_choice("load", load, ("in_flight", "view"))

    def reset(self, workers: Sequence[WorkerView], seed: int) -> None:
        super().reset(workers, seed)
        self.in_flight = [0] * self.num_workers

    def select_worker(self, request: "Request", workers: Sequence[WorkerView], now_s: float) -> int:
        if self.num_workers == 1:
            worker = 0
        else:
            # A uniform pair of distinct workers (cheaper than rng.choice(replace=False)).
            a = int(self.rng.integers(self.num_workers))
            b = int(self.rng.integers(self.num_workers - 1))
            b += b >= a
            if self.load == "view":
                la, lb = workers[a].in_flight, workers[b].in_flight
            else:
                la, lb = self.in_flight[a], self.in_flight[b]
            worker = a if la <= lb else b
        self.in_flight[worker] += 1
        return worker

    def on_request_complete(self, request, worker_id, latency_s, ttft_s, cached_tokens, now_s=None):
        if self.in_flight[worker_id] > 0:
            self.in_flight[worker_id] -= 1

    def on_request_abandoned(self, request, worker_id, now_s=None):
        # completion only releases the request's slot here: abandoning is the same
        self.on_request_complete(request, worker_id, 0.0, 0.0, 0, now_s)

"""Longest cached prefix if it covers more than `min_match` of the prompt, else fewest in flight."""

from __future__ import annotations

from repro.routing.base import Router, request_key


class PrefixOrLeastLoadedRouter(Router):
    """Send a request to the worker holding the longest prefix of its prompt when that prefix is
    more than `min_match` of the prompt's tokens; otherwise to the worker with the fewest requests
    in flight. Ties go to the lowest worker id. Reads the workers' caches exactly
    (`WorkerView.peek_prefix`), unlike the paper's routers, which keep approximate trees."""

    name = "prefix_or_least"

    def __init__(self, name: str = "prefix_or_least", min_match: float = 0.5) -> None:
        if not 0.0 <= min_match <= 1.0:
            raise ValueError(f"min_match must be in [0, 1], got {min_match!r}")
        self.name = name
        self.min_match = float(min_match)

    def select_worker(self, request, workers, now_s):
        key = request_key(request)
        tokens = len(key) // 4  # packed int32
        best, best_len = 0, -1
        for w in workers:
            n = w.peek_prefix(key)
            if n > best_len:
                best, best_len = w.worker_id, n
        if tokens and best_len > self.min_match * tokens:
            return best
        return min(workers, key=lambda w: (w.in_flight, w.worker_id)).worker_id

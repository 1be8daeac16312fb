"""SGLang's cache-aware router (sglang-router 0.3.2), the paper's strongest baseline (§5).

Rule (ALGORITHMS.md §3; behaviour checked against sglang-router's `cache_aware.rs`/`tree.rs`):

1. load_i = the router's own count of in-flight requests on worker i (+1 when dispatched,
   -1 on the completion callback, never below 0).
2. imbalanced = (max load - min load > balance_abs_threshold) AND
   (max load > balance_rel_threshold * min load). If imbalanced: route to the least loaded
   worker (first minimum = lowest id) and still insert the request into the tree for it.
3. Otherwise: match the request against the shared approximate tree (`ApproximateTree`);
   match rate = matched units / request units (0 for an empty request). If
   rate > cache_threshold (strictly): the tenant of the node where matching stopped;
   else the tenant holding the fewest units in the tree ("smallest tree"). Insert the
   request for the chosen worker.
4. Every eviction_interval_secs of the driver's clock (`now_s`), trim every tenant to
   max_tree_size units, least recently accessed tenant-leaves first. The real router runs
   this in a background thread from start-up; here it runs lazily at the first
   `select_worker` call at or after each deadline, deadlines every interval from the first
   call after `reset` (trimming is idempotent, so several elapsed intervals trim once).
   eviction_interval_secs <= 0 disables it (as in the real router).

Choices the paper and the real router leave open (config keys):
- match_on: "text" = characters of `request.text` (the real router's tree), "tokens" =
  prompt token ids (for the simulator, whose workloads may have no text), "auto" (default)
  = text when the first routed request has text, else tokens; the choice then holds for the
  run (a text-mode run fed a request without text raises).
- tie_break: the real router resolves two ties by DashMap hash order (arbitrary per process):
  which tenant of a shared node, and which of several equally small tenants. "index"
  (default, deterministic): the tenant that reached the node first / the lowest worker id;
  "random": uniform among the tied candidates, from the run's seeded generator.
- At reset every worker joins the tree with an empty key (sglang-router's init_workers), so
  all start at size 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from repro.routing.approx_tree import ApproximateTree
from repro.routing.base import Router, WorkerView, check_choice, token_key

if TYPE_CHECKING:  # pragma: no cover
    from repro.workloads.request import Request


class CacheAwareRouter(Router):
    name = "cache_aware"

    def __init__(
        self,
        name: str = "cache_aware",
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        eviction_interval_secs: float = 60.0,
        max_tree_size: int = 2**26,
        match_on: str = "auto",
        tie_break: str = "index",
    ) -> None:
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {cache_threshold}")
        if balance_abs_threshold < 0:
            raise ValueError(f"balance_abs_threshold must be >= 0, got {balance_abs_threshold}")
        if balance_rel_threshold < 0:
            raise ValueError(f"balance_rel_threshold must be >= 0, got {balance_rel_threshold}")
        if max_tree_size < 0:
            raise ValueError(f"max_tree_size must be >= 0, got {max_tree_size}")
        self.name = name
        self.cache_threshold = float(cache_threshold)
        self.balance_abs_threshold = int(balance_abs_threshold)
        self.balance_rel_threshold = float(balance_rel_threshold)
        self.eviction_interval_secs = float(eviction_interval_secs)
        self.max_tree_size = int(max_tree_size)
        self.match_on = check_choice("match_on", match_on, ("auto", "text", "tokens"))
        self.tie_break = check_choice("tie_break", tie_break, ("index", "random"))

    # ------------------------------------------------------------------ lifecycle
    def reset(self, workers: Sequence[WorkerView], seed: int) -> None:
        super().reset(workers, seed)
        self.loads = [0] * self.num_workers
        self.mode: str | None = None if self.match_on == "auto" else self.match_on
        self.tree: ApproximateTree | None = None
        if self.mode is not None:
            self._build_tree()
        self._next_eviction_s: float | None = None
        self.evictions_run = 0

    def _build_tree(self) -> None:
        self.tree = ApproximateTree(unit=1 if self.mode == "text" else 4)
        for worker in range(self.num_workers):
            self.tree.insert(self.tree.root.key, worker, 0.0)

    def _key(self, request: "Request") -> str | bytes:
        if self.mode is None:  # auto: decided by the first request of the run
            self.mode = "text" if request.text is not None else "tokens"
            self._build_tree()
        if self.mode == "text":
            if request.text is None:
                raise ValueError(
                    f"request {request.id} has no text but the cache-aware router matches on text "
                    "(match_on=text, or auto resolved to text by an earlier request)"
                )
            return request.text
        return token_key(request.prompt_tokens)

    # ------------------------------------------------------------------ routing
    def select_worker(self, request: "Request", workers: Sequence[WorkerView], now_s: float) -> int:
        key = self._key(request)
        tree = self.tree
        self._maybe_evict(now_s)
        loads = self.loads
        max_load, min_load = max(loads), min(loads)
        imbalanced = (max_load - min_load > self.balance_abs_threshold) and (
            max_load > min_load * self.balance_rel_threshold
        )
        if imbalanced:
            worker = loads.index(min_load)
        else:
            matched, tenant = tree.prefix_match(key, now_s, self._pick_tenant)
            total = len(key) // tree.unit
            rate = matched / total if total else 0.0
            if rate > self.cache_threshold and tenant is not None:
                worker = tenant
            else:
                smallest = tree.smallest_tenants()
                worker = smallest[0] if self.tie_break == "index" else self._draw(smallest)
        tree.insert(key, worker, now_s)
        loads[worker] += 1
        return worker

    def on_request_complete(self, request, worker_id, latency_s, ttft_s, cached_tokens, now_s=None):
        if self.loads[worker_id] > 0:
            self.loads[worker_id] -= 1

    def on_request_abandoned(self, request, worker_id, now_s=None):
        # completion only releases the request's slot here: abandoning is the same
        self.on_request_complete(request, worker_id, 0.0, 0.0, 0, now_s)

    # ------------------------------------------------------------------ helpers
    def _pick_tenant(self, tenants: dict[int, float]) -> int:
        if self.tie_break == "index" or len(tenants) == 1:
            return next(iter(tenants))
        return self._draw(list(tenants))

    def _draw(self, candidates: list[int]) -> int:
        if len(candidates) == 1:
            return candidates[0]
        return candidates[int(self.rng.integers(len(candidates)))]

    def _maybe_evict(self, now_s: float) -> None:
        interval = self.eviction_interval_secs
        if interval <= 0:
            return
        if self._next_eviction_s is None:
            self._next_eviction_s = now_s + interval
            return
        if now_s >= self._next_eviction_s:
            self.tree.evict_tenant_by_size(self.max_tree_size)
            self.evictions_run += 1
            missed = int((now_s - self._next_eviction_s) // interval)
            self._next_eviction_s += (missed + 1) * interval

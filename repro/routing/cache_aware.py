"""SGLang's cache-aware router (sglang-router 0.3.2), the paper's strongest baseline (§5), its
successor's rule (`generation: smg_1_13`) and its predecessor's (`le_0_1_4`), see below.

Rule (docs/ALGORITHMS.md §3; checked against the real 0.3.2 binary by
tests/router_binary/, read from its `cache_aware.rs`/`tree.rs`):

1. load_i = the router's own count of in-flight requests on worker i (+1 when dispatched,
   -1 on the completion callback, never below 0).
2. imbalanced = (max load - min load > balance_abs_threshold) AND
   (max load > balance_rel_threshold * min load, in float32 as the real router computes it).
   If imbalanced: the least-loaded worker, and the request is still inserted for it.
3. Otherwise: match the routing key against the shared approximate tree (`ApproximateTree`);
   match rate = matched / key length (0 for an empty key; float32). If rate >
   cache_threshold (strictly): the tenant of the node where matching stopped (its creator).
   Else ("low match"): the least-loaded worker (`generation: v0_3_2`, the default; since
   0.2.4), or with `generation: le_0_2_3` the worker holding the fewest units in the tree (the
   rule of sglang-router <= 0.2.3). Insert the key for the chosen worker.
4. Load ties, in both least-loaded choices (and smallest-tree ties), go to the first minimum
   in `worker_order`: the real router scans its worker registry, a map keyed by random UUIDs,
   i.e. a random permutation fixed for the router process (it reports it in `GET /workers`).
   `seeded` (default) draws that permutation from the run's router seed at reset, `index` is
   0..M-1, or an explicit list of worker ids (the binary parity test passes the real order).
5. Every eviction_interval_secs of the driver's clock (`now_s`), trim every tenant to
   max_tree_size units. The real router runs this in a background thread from start-up;
   here it runs lazily at the first `select_worker` call at or after each deadline,
   deadlines every interval from the first call after `reset` (trimming is idempotent, so
   several elapsed intervals trim once). eviction_interval_secs <= 0 disables it.
6. Tree timestamps are the real tree's epochs (`approx_tree`): at reset every worker joins
   with an empty key (init_workers: one epoch each), each insert and each match draws one
   more; a match re-stamps its node one time in eight (epoch multiple of 8).

Routing key (`match_on`): "text" = characters of `request.text` (the real router with a
`text` request); "tokens" = the prompt token ids as decimal strings joined by single spaces,
counted in characters (exactly what the real router matches, and what max_tree_size counts,
for a request with only `input_ids`); "auto" (default) = text when the first routed request
has text, else tokens, then fixed for the run (a text-mode run fed a request without text raises);
"none" = the empty key for every request (what sglang-router 0.1.4's PyPI wheel routes on, below).

`route_key` = `decide` (trim if due, match, choose; `last_branch` then names the branch: hit |
low_match_tied | low_match_untied | imbalanced) + `commit` (insert, count the load); the binary
parity test commits the real router's decision to stay in its state.

Generation `smg_1_13` (smg 1.13.0, sglang-router's successor; checked against its binary by
tests/router_binary/, docs/ALGORITHMS.md §3): no global imbalance test (step 2 is gone); on a
hit, the candidates are the tenants of the node where matching stopped, the least loaded of
them is chosen, and a spill gate sends the request to the least-loaded worker when that
candidate's load > balance_rel_threshold * mean and > mean + margin, margin =
min(balance_abs_threshold, max(4, ceil(2 * sqrt(mean)))) (mean over all workers); a low match goes to
the least-loaded worker. Every load tie (candidates, spill target, low match) is broken
uniformly at random (the router's RNG here; the binary's thread RNG). The trim is one budget
for the whole tree: least recently stamped (node, tenant) leaves of any tenant go first until
the total is <= max_tree_size. Stamps and epochs are 0.3.2's. `last_branch` adds `spill`;
`last_ties` holds the tied workers of the last random choice (() when none was random).

Generation `le_0_1_4` (sglang-router 0.1.4, the router of sglang 0.4.6 the paper's authors built
and ran; docs/ALGORITHMS.md §3; `approx_tree_014`): steps 1-2 as above, except that the
authors' build counts a request down only on a successful reply or a stream's `[DONE]` (an
abandoned request's count stays here too; the wheel also counts down a non-streamed error
reply); no imbalance -> match; a hit
goes to the first tenant of the stopping node in that node's hash order (`HashOrderTree`), a low
match (or an empty key: 0/0 is NaN) to the smallest tree, its ties to the first in `size_order`
(the size map's hash order), the imbalanced branch's to the first in `order` (the load map's;
`seeded` draws the two orders independently). Stamps are `now_s` in milliseconds. Only a
request's text is routed: "tokens" mode routes on "". The PyPI wheel compares the route name
without its leading slash and so routes every request on "" (`match_on: none` reproduces it;
tests/router_binary/test_router_binary_014.py); the authors' build reads the text, as the 0.1.5
wheel does with the same cache-aware code (test_router_binary_015.py checks the text path on it).

The removed `tie_break: index | random` is rejected with an error naming `worker_order`:
the real router has no random tie-break, its ties follow the registry order. The removed
`low_match: least_loaded | smallest_tree` is rejected with an error naming `generation`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence, cast

import numpy as np

from repro.routing.approx_tree import ApproximateTree
from repro.routing.approx_tree_014 import HashOrderTree
from repro.routing.base import Router, WorkerView, check_choice, request_text

if TYPE_CHECKING:  # pragma: no cover
    from repro.workloads.request import Request

_f32 = np.float32
# sglang-router 0.1.4 (sglang 0.4.6's: the paper authors' build) | <= 0.2.3 | 0.3.2 (default) | smg 1.13.0
GENERATIONS = ("le_0_1_4", "le_0_2_3", "v0_3_2", "smg_1_13")


def ids_key(tokens) -> str:
    """The real router's routing text for an `input_ids`-only request: ids joined by spaces."""
    return " ".join(map(str, np.asarray(tokens).tolist()))


def check_worker_order(worker_order) -> str | tuple[int, ...]:
    """`seeded` | `index` | a list of distinct worker ids (checked against M at reset)."""
    if isinstance(worker_order, str):
        return check_choice("worker_order", worker_order, ("seeded", "index"))
    try:
        order = tuple(int(w) for w in worker_order)
    except (TypeError, ValueError):
        raise ValueError(
            f"worker_order must be 'seeded', 'index' or a list of worker ids, got {worker_order!r}"
        ) from None
    if len(set(order)) != len(order) or any(w < 0 for w in order):
        raise ValueError(f"worker_order must list distinct worker ids >= 0, got {list(order)}")
    return order


class CacheAwareRouter(Router):
    name = "cache_aware"
    removed_options = ("tie_break", "low_match")  # accepted only to fail with a pointer to the replacement

    def __init__(
        self,
        name: str = "cache_aware",
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        eviction_interval_secs: float = 60.0,
        max_tree_size: int = 2**26,
        match_on: str = "auto",
        worker_order="seeded",
        generation: str = "v0_3_2",
        tie_break: str | None = None,
        low_match: str | None = None,
    ) -> None:
        if tie_break is not None:
            raise ValueError(
                "cache_aware: tie_break was removed; load ties follow worker_order "
                "(seeded | index | explicit list of worker ids), like the real router's registry order"
            )
        if low_match is not None:
            raise ValueError(
                "cache_aware: low_match was replaced by generation: le_0_2_3 (smallest tree, "
                "sglang-router <= 0.2.3; le_0_1_4 for 0.1.4) | v0_3_2 (least loaded, the default) | smg_1_13"
            )
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
        self.match_on = check_choice("match_on", match_on, ("auto", "text", "tokens", "none"))
        self.uses_text = match_on not in ("tokens", "none")
        self.worker_order = check_worker_order(worker_order)
        self.generation = check_choice("generation", generation, GENERATIONS)
        self.low_match_smallest_tree = self.generation in ("le_0_1_4", "le_0_2_3")
        self.v014 = self.generation == "le_0_1_4"
        if self.generation == "smg_1_13" and self.balance_rel_threshold < 1.0:
            raise ValueError(f"cache_aware: smg requires balance_rel_threshold >= 1, got {self.balance_rel_threshold}")
        self._threshold32 = _f32(self.cache_threshold)
        self._thr_lo = float(self._threshold32)  # _rate_above's exact bounds
        self._thr_hi = float(np.nextafter(self._threshold32, _f32(np.inf)))
        self._rel32 = _f32(self.balance_rel_threshold)

    # ------------------------------------------------------------------ lifecycle
    def reset(self, workers: Sequence[WorkerView], seed: int) -> None:
        super().reset(workers, seed)
        m = self.num_workers
        if self.worker_order == "seeded":
            self.order = [int(w) for w in self.rng.permutation(m)]
        elif self.worker_order == "index":
            self.order = list(range(m))
        else:
            if sorted(self.worker_order) != list(range(m)):
                raise ValueError(f"worker_order {list(self.worker_order)} is not a permutation of 0..{m - 1}")
            self.order = list(self.worker_order)
        # le_0_1_4: load ties follow the queue map's order (self.order), size ties the size map's
        self.size_order = list(self.order)
        self.loads = [0] * m
        self.mode: str | None = None if self.match_on == "auto" else self.match_on
        if self.v014:
            if self.worker_order == "seeded":  # two hash maps, two orders
                self.size_order = [int(w) for w in self.rng.permutation(m)]
            self.tree: ApproximateTree = HashOrderTree(seed=int(self.rng.integers(2**63)))
            for worker in range(m):  # Router::new: every worker joins with an empty key
                self.tree.insert("", worker)
        else:
            self.tree = ApproximateTree(unit=1, tenant_order=self.order)
            for worker in self.order:  # init_workers: every worker joins with an empty key
                self.tree.insert("", worker)
        self._next_eviction_s: float | None = None
        self._now_ms = 0
        self.evictions_run = 0
        self.last_branch: str | None = None  # hit | low_match_tied | low_match_untied | imbalanced | spill
        self.last_ties: tuple[int, ...] = ()
        # smg_1_13: how a random tie is resolved (the parity test replays the binary's pick)
        self.pick_tie = lambda ties: ties[int(self.rng.integers(len(ties)))]

    def _key(self, request: "Request") -> str:
        mode = self.mode
        if mode == "none":
            return ""
        if mode != "tokens":
            text = request_text(request)  # read once: a pool-backed request builds its text on each access
            if mode is None:  # auto: decided by the first request of the run
                mode = self.mode = "text" if text is not None else "tokens"
            if mode == "text":
                if text is None:
                    raise ValueError(
                        f"request {request.id} has no text but the cache-aware router matches on text "
                        "(match_on=text, or auto resolved to text by an earlier request)"
                    )
                return text
        if self.v014:
            return ""  # 0.1.4 reads only a request's `text`: an ids-only request routes on ""
        return ids_key(request.prompt_tokens)

    # ------------------------------------------------------------------ routing
    def select_worker(self, request: "Request", workers: Sequence[WorkerView], now_s: float) -> int:
        return self.route_key(self._key(request), now_s)

    def route_key(self, key: str, now_s: float) -> int:
        """The decision for a routing key (the real router's request text); updates state."""
        worker = self.decide(key, now_s)
        self.commit(key, worker)
        return worker

    def decide(self, key: str, now_s: float) -> int:
        """Choose a worker for `key`: trims when due and matches (which stamps, as the real
        router does) but neither inserts nor counts load; `commit` does that."""
        tree = self.tree
        self._maybe_evict(now_s)
        if self.generation == "smg_1_13":
            return self._decide_smg(key)
        if self.v014:
            return self._decide_014(key, now_s)
        loads = self.loads
        max_load, min_load = max(loads), min(loads)
        imbalanced = (max_load - min_load > self.balance_abs_threshold) and (
            _f32(max_load) > _f32(min_load) * self._rel32
        )
        if imbalanced:
            self.last_branch = "imbalanced"
            return self._least_loaded()
        matched, tenant = tree.prefix_match(key)
        if tenant is not None and self._rate_above(matched, len(key)):
            self.last_branch = "hit"
            return tenant
        if not self.low_match_smallest_tree:
            worker = self._least_loaded()
            tied = loads.count(loads[worker]) > 1
        else:
            sizes = tree.tenant_size
            worker = min(self.order, key=sizes.__getitem__)
            tied = sum(1 for s in sizes.values() if s == sizes[worker]) > 1
        self.last_branch = "low_match_tied" if tied else "low_match_untied"
        return worker

    def _decide_014(self, key: str, now_s: float) -> int:
        """sglang-router 0.1.4's choice (module docstring): 0.3.2's imbalance test, then the first
        tenant of the stopping node in its hash order on a hit, else the smallest tree."""
        self._now_ms = now_ms = int(now_s * 1000.0)  # the stamp of this decision's match and insert
        loads = self.loads
        max_load, min_load = max(loads), min(loads)
        if (max_load - min_load > self.balance_abs_threshold) and (_f32(max_load) > _f32(min_load) * self._rel32):
            self.last_branch = "imbalanced"
            return self._least_loaded()
        tree = cast(HashOrderTree, self.tree)
        matched, tenant = tree.prefix_match(key, now_ms)
        # an empty key: 0 / 0 is NaN in the real router, never above the threshold
        if tenant is not None and key and self._rate_above(matched, len(key)):
            self.last_branch = "hit"
            return tenant
        worker = tree.smallest_tenant(self.size_order)
        sizes = tree.tenant_size
        tied = sum(1 for s in sizes.values() if s == sizes[worker]) > 1
        self.last_branch = "low_match_tied" if tied else "low_match_untied"
        return worker

    def _decide_smg(self, key: str) -> int:
        """smg 1.13's choice (module docstring): per-request spill gate, random load ties."""
        tree, loads = self.tree, self.loads
        self.last_ties = ()
        matched, _ = tree.prefix_match(key)  # (stamps as 0.3.2's match does)
        holders = tree.last_match_holders(key)
        if holders and self._rate_above(matched, len(key)):
            worker = self._least_loaded_random(holders)
            mean = sum(loads) / len(loads)
            load = loads[worker]
            if load > mean * self.balance_rel_threshold and load > mean + self._spill_margin(mean):
                self.last_branch = "spill"
                return self._least_loaded_random(range(len(loads)))
            self.last_branch = "hit"
            return worker
        worker = self._least_loaded_random(range(len(loads)))
        self.last_branch = "low_match_tied" if self.last_ties else "low_match_untied"
        return worker

    def _spill_margin(self, mean: float) -> float:
        """smg 1.13's absolute margin: balance_abs_threshold, capped at two standard deviations of a
        Poisson in-flight count at the mean rounded up to whole requests, but never under 4 (unless
        the threshold is). The rounding up is the binary's (tests/router_binary), not its help text's."""
        return min(self.balance_abs_threshold, max(4, math.ceil(2.0 * math.sqrt(mean))))

    def _least_loaded_random(self, candidates) -> int:
        """The least-loaded candidate; a tie goes to `pick_tie` (uniform at random by default)."""
        loads = self.loads
        low = min(loads[w] for w in candidates)
        ties = tuple(w for w in candidates if loads[w] == low)
        if len(ties) == 1:
            return ties[0]
        self.last_ties = ties
        return self.pick_tie(ties)

    def commit(self, key: str, worker: int) -> None:
        """The routed request: insert its key for `worker` (on every branch) and count it."""
        if self.v014:
            cast(HashOrderTree, self.tree).insert(key, worker, self._now_ms)
        else:
            self.tree.insert(key, worker)
        self.loads[worker] += 1

    def _rate_above(self, matched: int, total: int) -> bool:
        """float32(matched) / float32(total) > float32(cache_threshold), as the real router computes it.

        Without numpy scalars on the common path: below 2**24 both counts are exact in float32 and
        rounding the double quotient to float32 equals float32 division (double rounding is
        innocuous for a quotient: 53 >= 2 * 24 + 2 bits), so the answer is False when the double
        quotient is <= the threshold and True when it is >= the next float32 above it; only a
        quotient strictly between the two asks numpy."""
        if not total:
            return _f32(0.0) > self._threshold32
        if total < 16777216:
            q = matched / total
            if q <= self._thr_lo:
                return False
            if q >= self._thr_hi:
                return True
        return bool(_f32(matched) / _f32(total) > self._threshold32)

    def _least_loaded(self) -> int:
        return min(self.order, key=self.loads.__getitem__)  # first minimum in registry order

    def on_request_complete(self, request, worker_id, latency_s, ttft_s, cached_tokens, now_s=None):
        self.release(worker_id)

    def on_request_abandoned(self, request, worker_id, now_s=None):
        if self.v014:
            return  # 0.1.4 counts a request down only when its reply (or `[DONE]`) passes it: a lost one stays
        self.release(worker_id)  # completion only releases the request's slot here

    def release(self, worker_id: int) -> None:
        if self.loads[worker_id] > 0:
            self.loads[worker_id] -= 1

    # ------------------------------------------------------------------ helpers
    def _trim(self) -> None:
        if self.generation == "smg_1_13":
            self.tree.evict_by_total_size(self.max_tree_size)  # one budget for the whole tree
        else:
            self.tree.evict_tenant_by_size(self.max_tree_size)  # a budget per worker

    def _maybe_evict(self, now_s: float) -> None:
        interval = self.eviction_interval_secs
        if interval <= 0:
            return
        if self._next_eviction_s is None:
            self._next_eviction_s = now_s + interval
            return
        if now_s >= self._next_eviction_s:
            self._trim()
            self.evictions_run += 1
            missed = int((now_s - self._next_eviction_s) // interval)
            self._next_eviction_s += (missed + 1) * interval

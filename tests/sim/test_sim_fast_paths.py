"""The worker's fast paths against its plain-contract paths, on random cells.

The worker uses `RadixCache.insert_after` / `access_path` and `StepCostModel.decode_step_time_s`
when its cache / cost model have them, and the plain contract (`insert`, `match_prefix`,
`step_time_s`) otherwise. Twin runs of random cells, one with the real cache and cost model and
one with wrappers exposing only the plain contract, must give identical records, stats and
final trees (LRU and RLT, node and token granularity, every scheduler mode).
"""

from __future__ import annotations

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from repro.kvcache import make_cache
from repro.sim.cluster import SimCluster
from repro.sim.worker import SchedulerConfig
from tests.sim.sim_fakes import RoundRobinRouter
import pytest

from tests.sim.test_sim_invariants import SIMPLE, cells
from tests.costmodel.costmodel_support import load_conf

from repro.costmodel import StepCostModel

COST = StepCostModel.from_config(load_conf("model", "llama31_8b"), load_conf("hardware", "l40"))


class PlainCache:
    """A RadixCache seen through the kvcache contract only (no walk-free verbs)."""

    def __init__(self, inner):
        self.inner = inner
        self.capacity_tokens = inner.capacity_tokens
        for name in ("match_prefix", "peek_prefix", "insert", "inc_lock_ref", "dec_lock_ref", "evict",
                     "evictable_size", "protected_size", "total_size", "free_tokens"):
            setattr(self, name, getattr(inner, name))


class PlainCost:
    """A cost model seen through `step_time_s` only."""

    def __init__(self, inner):
        self.step_time_s = inner.step_time_s


def tree(cache):
    pk = cache.path_key
    return sorted((pk(n), n.n, n.stamp, n.mark, n.lock_ref) for n in cache.iter_nodes()), cache.clock, cache.stats()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cell=cells(), policy=st.sampled_from(["lru", "rlt"]), gran=st.sampled_from(["node", "token"]))
def test_fast_paths_equal_plain_contract(cell, policy, gran):
    reqs, caps, sched, _cost, _router, seed = cell
    out = []
    for fast in (True, False):
        caches = [make_cache(c, {"name": policy, "granularity": gran}, seed + w) for w, c in enumerate(caps)]
        used = caches if fast else [PlainCache(c) for c in caches]
        sim = SimCluster(reqs, used, COST if fast else PlainCost(COST), RoundRobinRouter(), sched, policy, seed)
        res = sim.run()
        assert not any(sim.table.prompt_key), "keys are dropped when requests finish"
        out.append((res.records, res.stats, [tree(c) for c in caches]))
    pd.testing.assert_frame_equal(out[0][0], out[1][0], check_exact=True)
    assert out[0][1:] == out[1][1:]


def test_run_restores_gc_thresholds_even_on_error():
    import gc

    import pytest

    from tests.sim.sim_fakes import make_request

    before = gc.get_threshold()
    reqs = [make_request(0, 0.0, [1, 2, 3], output_len=2)]
    cache = make_cache(64, {"name": "lru", "granularity": "node"}, 0)
    SimCluster(reqs, [cache], COST, RoundRobinRouter(), SchedulerConfig(),
               "lru", 0).run()
    assert gc.get_threshold() == before

    class Broken(RoundRobinRouter):
        def select_worker(self, request, workers, now_s):
            assert gc.get_threshold()[0] >= 50_000  # raised while the loop runs
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        SimCluster(reqs, [make_cache(64, {"name": "lru", "granularity": "node"}, 0)], COST, Broken(),
                   SchedulerConfig(), "lru", 0).run()
    assert gc.get_threshold() == before


def test_routers_get_the_prompt_key_the_cluster_built():
    # request_key gives the offered key for that very request object, the computed one otherwise
    from repro.kvcache import as_key
    from repro.routing.base import Router, offer_request_key, request_key
    from tests.sim.sim_fakes import gsp_requests

    reqs = gsp_requests(3, num_groups=3, per_group=4)
    seen = []

    class KeyRouter(Router):
        def select_worker(self, request, workers, now_s):
            seen.append(("select", request.id, request_key(request) == as_key(request.prompt_tokens)))
            return request.id % len(workers)

        def on_request_complete(self, request, worker_id, latency_s, ttft_s, cached_tokens, now_s=None):
            seen.append(("complete", request.id, request_key(request) == as_key(request.prompt_tokens)))

    caches = [make_cache(10_000, {"name": "lru", "granularity": "node"}, w) for w in range(2)]
    sim = SimCluster(reqs, caches, COST, KeyRouter(), SchedulerConfig(), "lru", 0)
    sim.run()
    assert len(seen) == 2 * len(reqs) and all(ok for _, _, ok in seen)
    assert not any(sim.table.prompt_key)
    offer_request_key(reqs[0], b"\0\0\0\0")
    assert request_key(reqs[0]) == b"\0\0\0\0"  # the driver's promise is taken as is
    assert request_key(reqs[1]) == as_key(reqs[1].prompt_tokens)  # another request: computed


def test_a_router_that_uses_text_gets_it_built_outside_its_timed_call():
    # the cluster offers request.text before select_worker when the router says it reads text;
    # the text it offers is the request's, and its building is not counted as routing time
    from repro.routing.base import Router, offer_request_text, request_text
    from repro.workloads.request import Request
    from tests.sim.sim_fakes import gsp_requests

    base = gsp_requests(2, num_groups=2, per_group=3)
    built = []

    class CountedText(Request):
        @property
        def text(self):
            built.append(self.id)
            return f"text of {self.id}"

    reqs = [CountedText(r.id, r.arrival_s, r.prompt_tokens, r.output_len, r.generated_tokens, r.group_id,
                     r.conversation_id, r.turn) for r in base]
    seen = []

    class TextRouter(Router):
        uses_text = True

        def select_worker(self, request, workers, now_s):
            n = len(built)
            seen.append((request.id, request_text(request), len(built) == n))  # no build in here
            return request.id % len(workers)

    caches = [make_cache(10_000, {"name": "lru", "granularity": "node"}, w) for w in range(2)]
    sim = SimCluster(reqs, caches, COST, TextRouter(), SchedulerConfig(), "lru", 0)
    sim.run()
    assert seen == [(r.id, f"text of {r.id}", True) for r in reqs] and built == [r.id for r in reqs]
    offer_request_text(reqs[0], "offered")
    assert request_text(reqs[0]) == "offered" and request_text(reqs[1]) == "text of 1" and built[-1] == 1


@settings(max_examples=300, deadline=None)
@given(a=st.lists(st.integers(-3, 3), min_size=1, max_size=12), b=st.lists(st.integers(-3, 3), min_size=1, max_size=12),
       start=st.integers(0, 11), p=st.integers(0, 12))
def test_computed_hit_on_keys_equals_token_comparison(a, b, start, p):
    # computed_hit compares packed keys; the rule it implements, on token arrays: request i's
    # match p is capped at `start` iff p > start and i agrees with the pending prompt on 0..start
    import numpy as np

    from repro.kvcache import as_key
    from repro.sim.worker import RequestTable, SimWorker
    from tests.sim.sim_fakes import make_request

    start = min(start, len(b) - 1)  # the pending prompt has an uncomputed token at `start`
    p = min(p, len(a))
    table = RequestTable([make_request(0, 0.0, a), make_request(1, 0.0, b)])
    table.key(0)
    worker = SimWorker(0, make_cache(64, {"name": "lru", "granularity": "node"}, 0), COST, SchedulerConfig(),
                       table, "lru")
    worker.pending = [(as_key(b), start)]
    ta, tb = np.asarray(a, np.int32), np.asarray(b, np.int32)
    want = start if p > start and start < len(a) and ta[start] == tb[start] and np.array_equal(ta[:start], tb[:start]) else p
    assert worker.computed_hit(0, p) == want


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cell=cells(exact_ok=False), grid=st.sampled_from([0.05, 0.5, 2.0]))
def test_simultaneous_events_match_the_reference(cell, grid):
    # arrivals on a coarse grid: many share a time (traces with ms timestamps do), so arrivals land
    # on busy workers while other workers wait for the events at that time to be applied; the
    # event loop's kick shortcut must start every idle worker at the right time (regression)
    import dataclasses
    import math

    from tests.sim.test_sim_invariants import assert_matches_reference

    reqs, caps, sched, cost, router_cls, seed = cell
    reqs = [dataclasses.replace(r, arrival_s=math.floor(r.arrival_s / grid) * grid) for r in reqs]
    assert_matches_reference(reqs, caps, sched, cost, router_cls, seed)


def test_arrival_on_a_busy_worker_does_not_delay_an_idle_one():
    # two arrivals at 0.1: the first to idle worker 0, the second to worker 1 (busy with a long
    # prefill until 1.01). Worker 0 starts at 0.1, once both arrivals are applied, not at 1.01.
    from tests.sim.reference_sim import reference_simulate
    from tests.sim.sim_fakes import FixedCostModel, FixedRouter, TrieCache, make_request

    reqs = [make_request(0, 0.0, list(range(1000)), output_len=1), make_request(1, 0.1, [5000, 5001], output_len=1),
            make_request(2, 0.1, [6000, 6001], output_len=1)]
    route = {0: 1, 1: 0, 2: 1}
    rec = SimCluster(reqs, [TrieCache(5000), TrieCache(5000)], FixedCostModel(), FixedRouter(route),
                     SchedulerConfig(**SIMPLE), "lru", 0).run().records
    assert rec["first_token_s"].tolist() == pytest.approx([1.01, 0.112, 1.022])
    ref = reference_simulate(reqs, [TrieCache(5000), TrieCache(5000)], FixedCostModel(), FixedRouter(route),
                             SchedulerConfig(**SIMPLE), 0)
    assert rec["first_token_s"].tolist() == list(ref["first_token_s"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 50), st.integers(1, 9)), min_size=1, max_size=30))
def test_the_largest_request_is_the_first_with_the_most_tokens(lengths):
    # RequestTable.largest (found once for all workers) against the per-worker scan it replaced
    from types import SimpleNamespace

    from repro.sim.worker import RequestTable

    reqs = [SimpleNamespace(arrival_s=0.0, prompt_len=p, output_len=o) for p, o in lengths]
    table = RequestTable(reqs)
    assert table.largest() == max(range(len(lengths)), key=lambda i: lengths[i][0] + lengths[i][1])
    assert table.largest() == table.largest()


def test_a_request_larger_than_every_worker_admits_is_named_before_the_run():
    from tests.sim.sim_fakes import gsp_requests

    reqs = gsp_requests(1, num_groups=2, per_group=3)
    longest = max(reqs, key=lambda r: r.prompt_len + r.output_len)
    cap = longest.prompt_len + longest.output_len + 1  # fits the cache, not SGLang's admission rule
    caches = [make_cache(cap, {"name": "lru", "granularity": "node"}, w) for w in range(2)]
    with pytest.raises(ValueError, match=f"request {longest.id} needs {longest.prompt_len} prompt"):
        SimCluster(reqs, caches, COST, RoundRobinRouter(), SchedulerConfig(exact_budgets=True), "lru", 0)

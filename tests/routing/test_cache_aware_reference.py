"""The fast CacheAwareRouter + ApproximateTree against the slow reference (cache_aware_reference.py)
on random traffic: decisions, branches, loads, sizes and every node's stamps and creator."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from repro.routing import CacheAwareRouter
from tests.routing.cache_aware_reference import RefCacheAware, dump_fast_tree
from tests.routing.fakes import make_views

keys = st.text(alphabet="ab é中", max_size=10)
op = st.one_of(
    st.tuples(st.just("route"), keys),
    st.tuples(st.just("done"), st.integers(0, 50)),
    st.tuples(st.just("evict"), st.integers(0, 15)),
)


@settings(max_examples=300, deadline=None)
@given(
    m=st.integers(1, 4),
    perm_seed=st.integers(0, 10**6),
    ops=st.lists(op, max_size=60),
    threshold=st.sampled_from([0.0, 0.3, 0.5, 0.9]),
    abs_thr=st.integers(0, 3),
    rel_thr=st.sampled_from([1.0, 1.5, 2.0]),
    generation=st.sampled_from(["v0_3_2", "le_0_2_3"]),
)
def test_fast_router_equals_reference(m, perm_seed, ops, threshold, abs_thr, rel_thr, generation):
    import random

    order = list(range(m))
    random.Random(perm_seed).shuffle(order)
    fast = CacheAwareRouter(
        match_on="text",
        cache_threshold=threshold,
        balance_abs_threshold=abs_thr,
        balance_rel_threshold=rel_thr,
        eviction_interval_secs=0,
        generation=generation,
        worker_order=order,
    )
    fast.reset(make_views(m), seed=0)
    ref = RefCacheAware(order, threshold, abs_thr, rel_thr, generation)
    in_flight: list[int] = []
    for kind, arg in ops:
        if kind == "route":
            w_ref, branch_ref = ref.route(arg)
            assert (fast.route_key(arg, 0.0), fast.last_branch) == (w_ref, branch_ref)
            in_flight.append(w_ref)
        elif kind == "done" and in_flight:
            w = in_flight.pop(arg % len(in_flight))
            ref.complete(w)
            fast.release(w)
        elif kind == "evict":
            ambiguous = ref.tree.evict(arg)
            fast.tree.evict_tenant_by_size(arg)
            if ambiguous:
                return  # equal stamps: heap order decides in the real router; nothing to compare
        assert fast.loads == [ref.loads[w] for w in range(m)]
        assert fast.tree.tenant_size == ref.tree.size
        assert fast.tree.epoch == ref.tree.epoch
        assert dump_fast_tree(fast.tree) == ref.tree.dump()


@settings(max_examples=300, deadline=None)
@given(
    m=st.integers(1, 4),
    ops=st.lists(op, max_size=60),
    threshold=st.sampled_from([0.0, 0.3, 0.5, 0.9]),
    abs_thr=st.integers(0, 6),
    rel_thr=st.sampled_from([1.0, 1.5, 2.0]),
)
def test_fast_smg_rule_equals_reference(m, ops, threshold, abs_thr, rel_thr):
    """generation smg_1_13: decisions, branches, loads, sizes, stamps, and the one-budget trim."""
    fast = CacheAwareRouter(match_on="text", cache_threshold=threshold, balance_abs_threshold=abs_thr,
                            balance_rel_threshold=rel_thr, eviction_interval_secs=0, worker_order="index",
                            generation="smg_1_13")
    fast.reset(make_views(m), seed=0)
    fast.pick_tie = min  # the reference's stand-in for the binary's random pick
    ref = RefCacheAware(list(range(m)), threshold, abs_thr, rel_thr, generation="smg_1_13")
    in_flight: list[int] = []
    for kind, arg in ops:
        if kind == "route":
            w_ref, branch_ref = ref.route(arg)
            assert (fast.route_key(arg, 0.0), fast.last_branch) == (w_ref, branch_ref)
            in_flight.append(w_ref)
        elif kind == "done" and in_flight:
            w = in_flight.pop(arg % len(in_flight))
            ref.complete(w)
            fast.release(w)
        elif kind == "evict":
            ambiguous = ref.tree.evict_total(arg)
            fast.tree.evict_by_total_size(arg)
            if ambiguous:
                return  # equal stamps: heap order decides in the real router
            assert sum(fast.tree.tenant_size.values()) <= arg
        assert fast.loads == [ref.loads[w] for w in range(m)]
        assert fast.tree.tenant_size == ref.tree.size
        assert fast.tree.epoch == ref.tree.epoch
        assert dump_fast_tree(fast.tree) == ref.tree.dump()

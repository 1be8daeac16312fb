"""rlt_shipped's batched draws (no eviction log, no debug hook) against its one-token-at-a-time
form (taken whenever a log is kept) and the plain reference of test_rlt_shipped: the same draws,
victims, tree and counters after every call."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from repro.kvcache import RadixCache
from repro.kvcache.eviction.rlt_shipped import RLTShippedEviction
from tests.kvcache import test_rlt_shipped as T


def _same_without_log(cache, ref):
    pol = cache.policy
    assert cache.eviction_log is None and cache.debug_on_evict is None  # the batched form ran
    assert T.fast_state(cache) == ref.state()
    assert (pol.phases, pol.marked_count) == (ref.phases, ref.marked)
    assert cache.total_size() == ref.size()
    assert pol.rng.getstate() == ref.rng.getstate()  # as many draws, over the same ranges
    cache.check_invariants()


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(1, 30), seed=st.integers(0, 2**32), ops=T._ops)
def test_batched_draws_against_reference(capacity, seed, ops):
    cache = RadixCache(capacity, RLTShippedEviction(seed), "node")
    ref = T.ShippedReference(capacity, seed)
    saved = T.assert_same
    T.assert_same = _same_without_log
    try:
        T._drive(cache, ref, ops)
    finally:
        T.assert_same = saved


def _tree_state(cache):
    return sorted(
        (tuple(T.key_to_tokens(cache.path_key(n)).tolist()), n.mark, n.lock_ref, n.n, n.depth, n.stamp)
        for n in cache.iter_nodes()
    )


def test_batched_and_logged_forms_agree_on_long_runs():
    """Long prompts (a leaf cut many times in one call): every node's length, depth and stamp too."""
    rng = random.Random(5)
    for seed in range(4):
        caches = [
            RadixCache(400, RLTShippedEviction(seed), "node", record_evictions=logged) for logged in (False, True)
        ]
        for _ in range(300):
            prompt = [rng.randrange(3) for _ in range(rng.randrange(1, 6))] + [rng.randrange(50) for _ in range(40)]
            need = rng.randrange(1, 120)
            got = [c.evict(need) for c in caches]
            assert got[0] == got[1]
            for c in caches:
                if len(prompt) - c.peek_prefix(prompt) <= c.free_tokens():
                    c.insert(prompt)
            a, b = caches
            assert _tree_state(a) == _tree_state(b)
            assert a.policy.stats() == b.policy.stats() and a.policy.rng.getstate() == b.policy.rng.getstate()
            assert (a.total_size(), a.evictable_size(), a.evicted_tokens) == (
                b.total_size(),
                b.evictable_size(),
                b.evicted_tokens,
            )


def test_inline_draws_equal_randrange(monkeypatch):
    """Both draw forms of the batched loop (inline getrandbits where CPython's randrange is that)."""
    from repro.kvcache.eviction import rlt_shipped

    assert rlt_shipped._randrange_is_getrandbits() == rlt_shipped._INLINE_DRAWS
    states = []
    for inline in (True, False):
        monkeypatch.setattr(rlt_shipped, "_INLINE_DRAWS", inline)
        rng = random.Random(9)
        c = RadixCache(300, RLTShippedEviction(3), "node")
        got = []
        for _ in range(200):
            got.append(c.evict(rng.randrange(1, 90)))
            prompt = [rng.randrange(3)] + [rng.randrange(40) for _ in range(30)]
            if len(prompt) - c.peek_prefix(prompt) <= c.free_tokens():
                c.insert(prompt)
        states.append((got, _tree_state(c), c.policy.rng.getstate()))
    assert states[0] == states[1]

"""`insert_after` and `access_path` (the simulator's walk-free verbs) against the plain verbs they stand for.

Twin caches (same policy, granularity and seed) run the same simulator-style operations; one uses
`insert_after(node, suffix)` / `access_path(node)`, the other `insert(path_key(node) + suffix)` /
`match_prefix(path_key(node))`. After every operation the two must be indistinguishable: same
results, same tree (keys, lengths, stamps, marks, locks), same clock and counters, the same
candidate-list order (RLT draws victims by list position) and the same evicted tokens.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from repro.kvcache import as_key, make_cache

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def snapshot(cache):
    pk = cache.path_key
    nodes = sorted((pk(n), n.n, n.depth, n.stamp, n.mark, n.lock_ref, n.lidx) for n in cache.iter_nodes())
    pol = cache.policy
    lists = tuple(tuple(pk(n) for n in getattr(pol, name, [])) for name in ("unmarked", "marked"))
    return nodes, lists, cache.clock, cache.stats()


@st.composite
def op_sequences(draw):
    ops = []
    for _ in range(draw(st.integers(1, 30))):
        kind = draw(st.sampled_from(["admit", "admit", "extend", "rematch", "finish"]))
        toks = draw(st.lists(st.integers(0, 2), min_size=1, max_size=6))
        ops.append((kind, toks, draw(st.integers(0, 10))))
    return ops


@pytest.mark.parametrize("gran", ["token", "node"])
@pytest.mark.parametrize("policy", ["lru", "rlt", "rlt_shipped"])
@FAST
@given(ops=op_sequences(), cap=st.integers(6, 24), seed=st.integers(0, 100))
def test_fast_verbs_equal_plain_verbs(ops, cap, policy, gran, seed):
    fast = make_cache(cap, {"name": policy, "granularity": gran}, seed)
    plain = make_cache(cap, {"name": policy, "granularity": gran}, seed)
    fast.eviction_log, plain.eviction_log = [], []
    running = []  # (fast node, plain node, key)

    def admit(cache, key, use_fast):
        m = cache.match_prefix(key)
        cache.inc_lock_ref(m.last_node)
        need = (len(key) >> 2) - m.length - cache.free_tokens()
        if need > 0:
            cache.evict(need)
        if (len(key) >> 2) - m.length > cache.free_tokens():
            cache.dec_lock_ref(m.last_node)
            return None
        if use_fast:
            r = cache.insert_after(m.last_node, key[m.length << 2 :])
        else:
            r = cache.insert(key)
        assert cache.path_key(r.last_node) == key
        cache.inc_lock_ref(r.last_node)
        cache.dec_lock_ref(m.last_node)
        return r

    for kind, toks, k in ops:
        key = as_key(toks)
        if kind == "finish" and running:
            nf, np_, _ = running.pop(k % len(running))
            fast.dec_lock_ref(nf)
            plain.dec_lock_ref(np_)
        elif kind == "extend" and running:  # a running request's generated tokens below its prompt
            j = k % len(running)
            nf, np_, pkey = running[j]
            if len(toks) <= fast.free_tokens():
                rf = fast.insert_after(nf, key)
                rp = plain.insert(pkey + key)
                assert (rf.prefix_len, fast.path_key(rf.last_node)) == (rp.prefix_len, plain.path_key(rp.last_node))
                fast.inc_lock_ref(rf.last_node)
                fast.dec_lock_ref(nf)
                plain.inc_lock_ref(rp.last_node)
                plain.dec_lock_ref(np_)
                running[j] = (rf.last_node, rp.last_node, pkey + key)
        elif kind == "rematch":  # a match, then the same path accessed again
            mf, mp = fast.match_prefix(key), plain.match_prefix(key)
            assert mf.length == mp.length
            af = fast.access_path(mf.last_node)
            ap = plain.match_prefix(plain.path_key(mp.last_node))
            assert (af.length, fast.path_key(af.last_node)) == (ap.length, plain.path_key(ap.last_node))
        else:
            rf, rp = admit(fast, key, True), admit(plain, key, False)
            assert (rf is None) == (rp is None)
            if rf is not None:
                assert rf.prefix_len == rp.prefix_len
                running.append((rf.last_node, rp.last_node, key))
        assert snapshot(fast) == snapshot(plain)
        assert fast.eviction_log == plain.eviction_log
        fast.check_invariants()


def test_fast_verbs_reject_evicted_nodes():
    cache = make_cache(8, {"name": "lru", "granularity": "node"}, 0)
    node = cache.insert(as_key([1, 2, 3])).last_node
    cache.evict(3)
    with pytest.raises(ValueError, match="evicted"):
        cache.insert_after(node, as_key([4]))
    with pytest.raises(ValueError, match="evicted"):
        cache.access_path(node)
    assert cache.insert_after(cache.root, as_key([5])).prefix_len == 0
    assert cache.access_path(cache.root).length == 0


@pytest.mark.parametrize("gran", ["token", "node"])
@pytest.mark.parametrize("policy", ["lru", "rlt", "opt"])
@FAST
@given(paths=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=6), min_size=1, max_size=40),
       extra=st.integers(0, 8), seed=st.integers(0, 100))
def test_unlocked_process_path_equals_lock_then_unlock(paths, extra, policy, gran, seed):
    """The replayer's batch-1 loop (`process_path(key, lock=False)`, whose cached paths skip the
    lock walks) against the general loop (`process_path` then `dec_lock_ref`; an `on_path`
    callback selects it): same misses per path, counters, tree, candidate order and victims."""
    from repro.kvcache.replay import replay

    cap = max(len(p) for p in paths) + extra
    fast = replay(paths, cap, policy, gran, 1, seed, record_evictions=True)
    plain = replay(paths, cap, policy, gran, 1, seed, record_evictions=True, on_path=lambda cache, j, res: None)
    assert (fast.hits, fast.evicted_tokens, fast.misses_per_path.tolist()) == (
        plain.hits, plain.evicted_tokens, plain.misses_per_path.tolist())
    assert snapshot(fast.cache) == snapshot(plain.cache)
    assert fast.cache.eviction_log == plain.cache.eviction_log
    fast.cache.check_invariants()

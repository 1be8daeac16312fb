"""Property tests: the fast tree against the one-token-per-node reference, and invariants.

* LRU and OPT, token and node granularity, single-query and batched: IDENTICAL hits, misses
  per path and evicted-token sequences (token identities in eviction order).
* RLT: every run of the fast tree is a legal run of the reference semantics: the reference
  replays the fast tree's victims (forced), asserting each is an unmarked evictable leaf
  whenever one exists (else the LRU leaf), and must then see the same hits, misses and
  phase resets (its marks are computed independently: reset at B + 1 distinct marked).
* Invariants after every path and at every eviction: never a locked victim, never a marked
  victim while an unmarked evictable leaf exists, evictable + protected == total <= B,
  parent links / depths / counters / candidate structures consistent (check_invariants).
* peek_prefix changes nothing; bulk verbs (simulator-style) keep the invariants and
  agree with a brute-force longest-prefix.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from repro.kvcache import RadixCache, TraceIndex, as_key, make_cache
from repro.kvcache.replay import replay
from tests.kvcache.reference import ReferenceReplayer, fiat_phase_starts

FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def traces(draw, max_paths=18, vocab=3, max_len=7):
    """Random prefix trees of paths: new paths branch off random prefixes of earlier ones."""
    n = draw(st.integers(1, max_paths))
    paths = []
    for _ in range(n):
        if paths and draw(st.booleans()):
            base = paths[draw(st.integers(0, len(paths) - 1))]
            cut = draw(st.integers(0, len(base)))
            tail = draw(st.lists(st.integers(0, vocab - 1), min_size=0 if cut else 1, max_size=max_len - cut))
            path = base[:cut] + tail
            if not path:
                path = [0]
        else:
            path = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=max_len))
        paths.append(path)
    batch = draw(st.integers(1, 3))
    index = TraceIndex(paths)
    need = max(index.distinct_tokens(range(g, min(n, g + batch))) for g in range(0, n, batch))
    capacity = need + draw(st.integers(0, 6))  # >= longest path (>= largest batch group)
    return paths, capacity, batch


def tokens_of(log):
    return [tuple(np.frombuffer(k, dtype=np.int32).tolist()) for k in log]


def check_lru_opt(case, policy, gran):
    paths, cap, batch = case
    res = replay(paths, cap, policy, gran, batch, record_evictions=True)
    ref = ReferenceReplayer(cap, policy, gran, trace=paths)
    hits, per_path = ref.run(paths, batch)
    assert res.hits == hits
    assert res.misses_per_path.tolist() == per_path
    assert tokens_of(res.cache.eviction_log) == ref.evicted
    assert res.evicted_tokens == len(ref.evicted)
    assert res.phase_starts == fiat_phase_starts(paths, cap)


def check_rlt_valid(case, gran, seed):
    paths, cap, batch = case
    res = replay(paths, cap, "rlt", gran, batch, seed=seed, record_evictions=True)
    ref = ReferenceReplayer(cap, "rlt", gran, trace=paths, forced_victims=tokens_of(res.cache.eviction_log))
    hits, per_path = ref.run(paths, batch)
    assert res.hits == hits and res.misses_per_path.tolist() == per_path
    assert ref.forced == [], "the reference needed fewer victims than the fast tree evicted"
    assert ref.resets == res.stats["rlt_resets"]


@pytest.mark.parametrize("gran", ["token", "node"])
@pytest.mark.parametrize("policy", ["lru", "opt"])
@FAST
@given(case=traces())
def test_lru_opt_identical_to_reference(case, policy, gran):
    check_lru_opt(case, policy, gran)


@pytest.mark.parametrize("gran", ["token", "node"])
@FAST
@given(case=traces(), seed=st.integers(0, 2**16))
def test_rlt_run_is_a_legal_reference_run(case, gran, seed):
    check_rlt_valid(case, gran, seed)


def attach_eviction_checks(cache: RadixCache, seen: list):
    """debug hook: victims are unlocked leaves; RLT never takes a marked one while an unmarked is evictable."""
    pol = cache.policy

    def hook(node, r):
        assert node.lock_ref == 0 and not node.children and node.parent is not None
        assert 1 <= r <= node.n
        if pol.name == "rlt" and node.mark == pol.phase:
            unmarked_evictable = [
                n for n in cache.iter_evictable_leaves() if n.mark != pol.phase
            ]
            assert not unmarked_evictable, "RLT evicted a marked leaf while an unmarked one was evictable"
        seen.append(r)

    cache.debug_on_evict = hook


@pytest.mark.parametrize("gran", ["token", "node"])
@pytest.mark.parametrize("policy", ["lru", "rlt", "opt"])
@FAST
@given(case=traces(), seed=st.integers(0, 1000), hooked=st.booleans())
def test_invariants_after_every_path(case, policy, gran, seed, hooked):
    paths, cap, batch = case
    seen = []
    locked_keys = set()

    def on_path(cache, j, res):
        if hooked and cache.debug_on_evict is None:
            attach_eviction_checks(cache, seen)
        cache.check_invariants()
        cached = cache.cached_keys()
        key = as_key(paths[j])
        # the whole path is cached and locked right after it was processed
        assert all(key[: 4 * k] in cached for k in range(1, len(paths[j]) + 1))
        assert res.last_node.lock_ref > 0 and cache.path_key(res.last_node) == key
        if j % batch == 0:
            locked_keys.clear()
        locked_keys.add(key)
        for k in locked_keys:  # earlier paths of the group are still locked
            assert cache.peek_prefix(k) == len(k) >> 2
        assert cache.total_size() <= cap

    res = replay(paths, cap, policy, gran, batch, seed=seed, on_path=on_path)
    res.cache.check_invariants()
    assert res.cache.protected_size() == 0  # every lock released
    assert res.cache.evictable_size() == res.cache.total_size()
    if hooked:
        assert sum(seen) <= res.evicted_tokens


@pytest.mark.parametrize("policy", ["lru", "rlt"])
@FAST
@given(case=traces(), seed=st.integers(0, 1000), probes=st.lists(st.lists(st.integers(0, 3), max_size=8), max_size=6))
def test_peek_prefix_changes_nothing(case, policy, seed, probes):
    paths, cap, batch = case

    def snapshot(cache):
        nodes = sorted((cache.path_key(n), n.n, n.stamp, n.lock_ref, n.mark) for n in cache.iter_nodes())
        return nodes, cache.clock, cache.stats()

    def peeker(cache, j, res):
        for p in probes:
            before = snapshot(cache)
            got = cache.peek_prefix(p)
            key = as_key(p)
            want = max((k for k in range(len(p) + 1) if k == 0 or key[: 4 * k] in cache.cached_keys()), default=0)
            assert got == want
            assert snapshot(cache) == before

    plain = replay(paths, cap, policy, "token", batch, seed=seed, record_evictions=True)
    peeked = replay(paths, cap, policy, "token", batch, seed=seed, record_evictions=True, on_path=peeker)
    assert plain.cache.eviction_log == peeked.cache.eviction_log
    assert snapshot(plain.cache) == snapshot(peeked.cache)


@st.composite
def op_sequences(draw):
    """Simulator-style requests: admit (match, lock, evict, insert, relock) and finish (unlock)."""
    ops = []
    for _ in range(draw(st.integers(1, 30))):
        if draw(st.integers(0, 3)) == 0:
            ops.append(("finish", draw(st.integers(0, 10))))
        else:
            ops.append(("admit", draw(st.lists(st.integers(0, 2), min_size=1, max_size=6))))
    return ops


@pytest.mark.parametrize("gran", ["token", "node"])
@pytest.mark.parametrize("policy", ["lru", "rlt"])
@FAST
@given(ops=op_sequences(), cap=st.integers(6, 20), seed=st.integers(0, 100))
def test_bulk_verbs_keep_invariants(ops, cap, policy, gran, seed):
    cache = make_cache(cap, {"name": policy, "granularity": gran}, seed)
    running = []  # (node, key)
    for kind, arg in ops:
        if kind == "finish":
            if running:
                node, key = running.pop(arg % len(running))
                cache.dec_lock_ref(node)
        else:
            key = as_key(arg)
            cached = cache.cached_keys()
            want = max(k for k in range(len(arg) + 1) if k == 0 or key[: 4 * k] in cached)
            assert cache.peek_prefix(key) == want
            m = cache.match_prefix(key)
            assert m.length == want
            cache.inc_lock_ref(m.last_node)
            need = len(arg) - m.length - cache.free_tokens()
            if need > 0:
                evictable = cache.evictable_size()
                got = cache.evict(need)
                if gran == "token":
                    assert got == min(need, evictable)
                else:  # whole nodes: at least `need`, unless everything evictable went
                    assert got >= need or got == evictable
            if len(arg) - m.length > cache.free_tokens():
                cache.dec_lock_ref(m.last_node)  # does not fit next to the running requests
                continue
            r = cache.insert(key)
            assert r.prefix_len == m.length and cache.path_key(r.last_node) == key
            cache.inc_lock_ref(r.last_node)
            cache.dec_lock_ref(m.last_node)
            running.append((r.last_node, key))
        cache.check_invariants()
        for node, key in running:  # locked requests never lose tokens
            assert cache.peek_prefix(key) == len(key) >> 2


@pytest.mark.slow
@pytest.mark.parametrize("gran", ["token", "node"])
@pytest.mark.parametrize("policy", ["lru", "opt"])
@SLOW
@given(case=traces(max_paths=30, vocab=4, max_len=10))
def test_lru_opt_identical_to_reference_many(case, policy, gran):
    check_lru_opt(case, policy, gran)


@pytest.mark.slow
@pytest.mark.parametrize("gran", ["token", "node"])
@SLOW
@given(case=traces(max_paths=30, vocab=4, max_len=10), seed=st.integers(0, 2**16))
def test_rlt_run_is_a_legal_reference_run_many(case, gran, seed):
    check_rlt_valid(case, gran, seed)

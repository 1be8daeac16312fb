"""RLT patched into SGLang 0.5.23's real RadixCache: registration, invariants, victim distribution."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from tests.sglang.sglang_driver import SGLangTree, deterministic_clock, prefix_tree_trace, run_requests

pytestmark = pytest.mark.sglang


def test_apply_registers_rlt_everywhere_and_is_idempotent(sg, rlt):
    from sglang.srt.arg_groups.choices import RADIX_EVICTION_POLICY_CHOICES
    from sglang.srt.mem_cache import registry
    from sglang.srt.mem_cache.utils import get_eviction_strategy

    strategy = get_eviction_strategy("rlt", {"seed": 7})
    assert isinstance(strategy, rlt.RLTStrategy) and strategy.seed == 7
    assert "rlt" in RADIX_EVICTION_POLICY_CHOICES
    assert registry.get_radix_cache_factory(rlt.RADIX_BACKEND_NAME) is not None
    hooked = sg.RadixCache.match_prefix
    rlt._applied = False  # force a second full pass: nothing may be wrapped twice
    rlt.apply()
    assert sg.RadixCache.match_prefix is hooked
    assert RADIX_EVICTION_POLICY_CHOICES.count("rlt") == 1
    with pytest.raises(ValueError, match="seed"):
        get_eviction_strategy("rlt", {"seed": "x"})
    with pytest.raises(TypeError):
        get_eviction_strategy("rlt", {"sead": 1})  # unknown key: fails loudly


def test_patch_leaves_lru_caches_alone(sg, rlt):
    rng = np.random.default_rng(0)
    trace = prefix_tree_trace(rng, 60)
    with deterministic_clock(sg):
        tree = SGLangTree(sg, 40, "lru")
        run_requests(tree, [tree.key_of(t) for t in trace], [len(t) for t in trace])
    assert all(node._rlt_phase == 0 for node in tree.iter_nodes())
    assert type(tree.cache.eviction_strategy).__name__ == "LRUStrategy"


class InvariantChecker:
    """Checks, at every victim and every phase reset, the rules RLT must keep (on a live cache)."""

    def __init__(self, tree: SGLangTree):
        self.tree = tree
        self.cache = tree.cache
        self.strategy = tree.cache.eviction_strategy
        self.pending_new = None  # new tokens of the request being processed
        self.victims = self.marked_victims = self.resets = 0
        orig_on_delete, orig_reset = self.strategy.on_delete, self.strategy.reset_phase

        def on_delete(node):
            self.check_victim(node)
            orig_on_delete(node)

        def reset_phase():
            self.check_reset()
            orig_reset()

        self.strategy.on_delete = on_delete
        self.strategy.reset_phase = reset_phase

    def check_victim(self, node):
        s = self.strategy
        self.victims += 1
        assert node.lock_ref == 0, "evicted a locked node"
        assert not any(not c.evicted for c in node.children.values()), "evicted a node with children"
        assert s.marked_tokens < self.tree.total_size(), "evicted while every cached token was marked (no phase reset)"
        if s.is_marked(node):
            self.marked_victims += 1
            unmarked = [x for x in self.cache.evictable_leaves if x is not node and not s.is_marked(x)]
            assert not unmarked, "evicted a marked leaf while an unmarked evictable leaf existed"

    def check_reset(self):
        s = self.strategy
        self.resets += 1
        total = self.tree.total_size()
        assert s.marked_tokens == total > 0, "phase reset while some cached token was unmarked"
        # the tokens that need room are the (B+1)-th and later distinct marked tokens
        assert self.pending_new is not None and total + self.pending_new > self.tree.capacity_tokens

    def check_state(self):
        s, cache = self.strategy, self.cache
        total = cache.total_size()  # SGLang's own O(n) walk
        assert cache.evictable_size() + cache.protected_size() == total, "evictable + protected != total"
        assert total <= self.tree.capacity_tokens
        marked = 0
        for node in self.tree.iter_nodes():
            if s.is_marked(node):
                marked += len(node.key)
                assert node.parent is self.tree.root or s.is_marked(node.parent), "a marked node below an unmarked one"
        assert marked == s.marked_tokens, f"mark count {s.marked_tokens} != {marked} marked tokens in the tree"


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("in_flight", [1, 3])
def test_rlt_invariants_on_random_request_sequences(sg, rlt, seed, in_flight):
    rng = np.random.default_rng(100 + seed)
    trace = prefix_tree_trace(rng, 250, branching=3, depth=5, segment_tokens=(1, 8))
    capacity = 60
    with deterministic_clock(sg):
        tree = SGLangTree(sg, capacity, "rlt", seed=seed)
        checker = InvariantChecker(tree)
        keys = [tree.key_of(t) for t in trace]
        lengths = [len(t) for t in trace]
        for lo in range(0, len(trace), 25):  # check the whole state between chunks of requests

            def on_evict(need, lo=lo):
                checker.pending_new = need + tree.free_tokens()

            run_requests(tree, keys[lo : lo + 25], lengths[lo : lo + 25], in_flight=in_flight, on_evict=on_evict)
            checker.check_state()
    assert checker.victims > 50 and checker.resets >= 3  # the checks did run
    stats = tree.cache.eviction_strategy.stats()
    assert stats["rlt_random_evicted_tokens"] > 0
    if in_flight == 1:
        # with only the current request locked, an unmarked leaf is almost always evictable
        assert stats["rlt_fallback_evicted_tokens"] <= 0.1 * stats["rlt_random_evicted_tokens"]


def _leaf_tree(sg, rlt, *, unmarked, marked, chain_under=None, seed=0):
    """Cache holding one-token leaves: unmarked (i,) under node (1,), marked (100+i,) under (2,);
    `chain_under`: for that i the path is [1, i, 9] with (i,) a separate node: (9,) is its only child."""
    tree = SGLangTree(sg, 10**6, "rlt", seed=seed)
    for i in range(unmarked):
        if i == chain_under:
            tree.insert([1, i, 9])
        tree.insert([1, i])
    for i in range(marked):
        tree.insert([2, 100 + i])
    s = tree.cache.eviction_strategy
    s.reset_phase()  # everything unmarked, then mark the `marked` group again
    for i in range(marked):
        tree.match_prefix([2, 100 + i])
    return tree, s


def test_rlt_victim_is_uniform_over_unmarked_leaves(sg, rlt):
    k, runs = 5, 2000
    counts = Counter()
    for seed in range(runs):
        tree, s = _leaf_tree(sg, rlt, unmarked=k, marked=3, seed=seed)
        victims = []
        s.on_delete = lambda node, orig=s.on_delete: (victims.append(tuple(node.key.token_ids)), orig(node))
        assert tree.evict(1) == 1
        counts[victims[0]] += 1
    # the one-token leaves under [1] are keys (i,); a marked leaf key would be under [2]
    assert set(counts) == {(i,) for i in range(k)}
    expected = runs / k
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert chi2 < 18.5  # chi-square, 4 degrees of freedom, p = 0.001; fixed seeds: deterministic


def test_rlt_parent_exposed_mid_call_is_drawn_uniformly(sg, rlt):
    """Leaves A=[1,0,9] (only child of [1,0]), B, C, D = [1,1], [1,2], [1,3]; evict 2 tokens in ONE call.
    Uniform draws: first victim uniform over {A,B,C,D}; if it was A, then [1,0] is a leaf and the
    second victim is uniform over {[1,0], and the other three}: P(A then [1,0]) = 1/4 * 1/4."""
    runs = 3000
    pairs = Counter()
    for seed in range(runs):
        tree, s = _leaf_tree(sg, rlt, unmarked=4, marked=0, chain_under=0, seed=seed)
        victims = []
        s.on_delete = lambda node, orig=s.on_delete: (victims.append(tuple(node.key.token_ids)), orig(node))
        assert tree.evict(2) == 2
        pairs[tuple(victims)] += 1
    first_a = sum(c for (v1, _), c in pairs.items() if v1 == (9,))
    a_then_parent = pairs[((9,), (0,))]
    assert abs(first_a / runs - 0.25) < 0.035
    # a parent keyed without the exponential clock would be drawn first far more often (~1/2 or more)
    assert abs(a_then_parent / first_a - 0.25) < 0.07
    assert sum(1 for (v1, v2) in pairs if v2 == (0,) and v1 != (9,)) == 0  # never before its child


def test_rlt_new_phase_when_every_cached_token_is_marked(sg, rlt):
    tree, s = _leaf_tree(sg, rlt, unmarked=0, marked=4, seed=1)  # [2] + 4 leaves, all marked
    assert s.marked_tokens == tree.total_size() == 5
    victims = []
    s.on_delete = lambda node, orig=s.on_delete: (victims.append(tuple(node.key.token_ids)), orig(node))
    phase = s.phase
    assert tree.evict(1) == 1
    assert s.phase == phase + 1 and s.marked_tokens == 0  # new phase first: the victim was drawn at random
    assert s.stats()["rlt_random_evicted_tokens"] == 1 and s.stats()["rlt_fallback_evicted_tokens"] == 0


def test_rlt_fallback_order_is_lru(sg, rlt):
    with deterministic_clock(sg):
        tree = SGLangTree(sg, 10**6, "rlt", seed=0)
        for i in range(4):
            tree.insert([5, i])
        s = tree.cache.eviction_strategy
        tree.insert([6])  # the only unmarked token after the reset below will be [6]...
        s.reset_phase()
        for i in (2, 0, 3, 1):  # ...all [5, i] marked again, recency 2 < 0 < 3 < 1
            tree.match_prefix([5, i])
        lock = tree.match_prefix([6])[1]  # [6] marked too: mark it, then unmark by a fresh phase
        s.reset_phase()
        for i in (2, 0, 3, 1):
            tree.match_prefix([5, i])
        tree.inc_lock_ref(lock)  # the only unmarked leaf [6] is locked -> fallback to LRU among marked
        victims = []
        s.on_delete = lambda node, orig=s.on_delete: (victims.append(tuple(node.key.token_ids)), orig(node))
        tree.evict(3)
        assert victims == [(2,), (0,), (3,)]
        assert s.stats()["rlt_fallback_evicted_tokens"] == 3


def test_flush_resets_rlt_state(sg, rlt):
    tree = SGLangTree(sg, 100, "rlt", seed=0)
    tree.insert([1, 2, 3])
    s = tree.cache.eviction_strategy
    assert s.marked_tokens == 3
    tree.cache.reset()
    assert s.marked_tokens == 0 and s.phase == 1
    assert tree.match_prefix([1, 2, 3])[0] == 0


# ---------------------------------------------------------------- rlt_shipped (RLT as the authors shipped it)


class ShippedSGLangTree(SGLangTree):
    """SGLang's RadixCache under `rlt_shipped`; the mock allocator gets the pool size (the phase limit)."""

    def __init__(self, sg, capacity_tokens: int, seed: int = 0):
        from tests.sglang.sglang_driver import MockAllocator

        self.sg = sg
        self.capacity_tokens = int(capacity_tokens)
        self.allocator = MockAllocator(sg.torch)
        self.allocator.size = self.capacity_tokens
        params = sg.CacheInitParams(
            disable=False,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=self.allocator,
            page_size=1,
            eviction_policy="rlt_shipped",
            eviction_policy_config={"seed": seed},
        )
        self.cache = sg.RadixCache(params)
        self.root = self.cache.root_node


def _sglang_state(tree):
    s = tree.cache.eviction_strategy
    out = []
    for node in tree.iter_nodes():
        path, n = [], node
        while n is not tree.root:
            path = list(n.key.token_ids) + path
            n = n.parent
        out.append((tuple(path), node._rlt_phase == s.phase, node.lock_ref))
    return sorted(out), (s.resets + 1, s.marked_tokens)


def _our_state(ours):
    from repro.kvcache.keys import key_to_tokens

    c = ours.cache
    p = c.policy
    nodes = sorted(
        (tuple(key_to_tokens(c.path_key(n)).tolist()), n.mark == p.phase, n.lock_ref) for n in c.iter_nodes()
    )
    return nodes, (p.phases, p.marked_count)


def _serve(tree, trace, rng, whole: bool, in_flight: int, log: list):
    """Requests as a server makes them: match(prompt[:-1]) (a bare match now and then: a waiting
    request looked at, not admitted), lock, evict (`whole`: the whole allocation, SGLang 0.4.6;
    else the shortfall, 0.5.23) when short, insert, lock the inserted path, unlock the match; a
    request stays locked while `in_flight - 1` later ones start. `log`: the state after each."""
    locked = []
    for t in trace:
        if rng.random() < 0.2:
            tree.match_prefix(tree.key_of(t))
        m, node = tree.match_prefix(tree.key_of(t[:-1]))
        tree.inc_lock_ref(node)
        new = len(t) - m
        if new > tree.free_tokens():
            tree.evict(new if whole else new - tree.free_tokens())
        last = None
        if new <= tree.free_tokens():
            last = tree.insert(tree.key_of(t))[1]
            tree.inc_lock_ref(last)
        tree.dec_lock_ref(node)
        locked.append(last)
        while len(locked) >= in_flight:
            old = locked.pop(0)
            if old is not None:
                tree.dec_lock_ref(old)
        log.append(_sglang_state(tree) if isinstance(tree, SGLangTree) else _our_state(tree))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("whole, in_flight", [(True, 1), (False, 1), (True, 3), (False, 3)])
def test_shipped_on_sglang_equals_our_tree_draw_for_draw(sg, rlt, seed, whole, in_flight):
    """SGLang's tree with the patch and our RadixCache with RLTShippedEviction, same seed, same
    calls: the same nodes, marks, locks, phases and marked count after every request (so the
    same tokens evicted by the same draws; tests/kvcache/test_rlt_shipped.py checks our tree
    against the rules' reference)."""
    from tests.sglang.sglang_driver import OursTree

    trace = prefix_tree_trace(np.random.default_rng(300 + seed), 200, branching=3, depth=5, segment_tokens=(1, 8))
    theirs, ours = [], []
    _serve(ShippedSGLangTree(sg, 50, seed), trace, np.random.default_rng(seed), whole, in_flight, theirs)
    _serve(OursTree(50, "rlt_shipped", seed), trace, np.random.default_rng(seed), whole, in_flight, ours)
    assert theirs == ours
    assert theirs[-1][1][0] > 5  # phases happened


def test_shipped_registered_seeded_and_flush_restarts(sg, rlt):
    from sglang.srt.arg_groups.choices import RADIX_EVICTION_POLICY_CHOICES
    from sglang.srt.mem_cache.utils import get_eviction_strategy

    s = get_eviction_strategy("rlt_shipped", {"seed": 5})
    assert isinstance(s, rlt.RLTShippedStrategy) and s.seed == 5
    assert "rlt_shipped" in RADIX_EVICTION_POLICY_CHOICES
    with pytest.raises(ValueError, match="seed"):
        get_eviction_strategy("rlt_shipped", {"seed": 1.5})
    trace = prefix_tree_trace(np.random.default_rng(9), 120, branching=3, depth=5, segment_tokens=(1, 8))
    tree = ShippedSGLangTree(sg, 40, seed=3)
    runs = []
    for _ in range(2):  # the same calls after a flush: the same evictions
        log: list = []
        _serve(tree, trace, np.random.default_rng(1), True, 1, log)
        runs.append(log)
        tree.cache.reset()
        tree.root = tree.cache.root_node
    assert runs[0] == runs[1]
    other: list = []
    _serve(ShippedSGLangTree(sg, 40, seed=4), trace, np.random.default_rng(1), True, 1, other)
    assert other != runs[0]


def test_shipped_marks_and_no_fallback_on_sglang(sg, rlt):
    tree = ShippedSGLangTree(sg, 100)
    s = tree.cache.eviction_strategy
    tree.insert([1, 2, 3, 4])
    s.new_phase(tree.cache)
    tree.match_prefix([1, 2, 3, 4])  # a full match marks nothing
    assert s.marked_tokens == 0
    tree.match_prefix([1, 2, 9])  # the split's upper part [1, 2] only
    assert s.marked_tokens == 2 and _sglang_state(tree)[0] == [((1, 2), True, 0), ((1, 2, 3, 4), False, 0)]
    _, last = tree.insert([1, 2, 3, 4])
    tree.inc_lock_ref(last)  # the one leaf locked: nothing to evict, and no LRU fallback
    assert tree.evict(2) == 0 and tree.total_size() == 4
    assert s.stats()["rlt_short_evictions"] == 1
    tree.dec_lock_ref(last)
    assert tree.evict(1) == 1 and tree.total_size() == 3  # one token off the leaf's tail
    assert _sglang_state(tree)[0][-1][0] == (1, 2, 3)


def test_shipped_needs_page_size_one_and_a_pool_size(sg, rlt):
    from types import SimpleNamespace

    params = SimpleNamespace(eviction_policy="rlt_shipped", page_size=16)
    with pytest.raises(ValueError, match="page-size 1"):
        rlt._radix_cache_factory(SimpleNamespace(params=params))
    tree = ShippedSGLangTree(sg, 10)
    del tree.allocator.size
    with pytest.raises(ValueError, match="pool"):  # the first mark needs the limit
        tree.insert([1, 2])


def test_server_argv_for_rlt_shipped(sg, rlt):
    from repro.backends.sglang.server import build_sglang_argv

    argv = build_sglang_argv(["--radix-eviction-policy", "rlt_shipped", "--random-seed", "7"])
    assert argv[-4:] == ["--radix-cache-backend", "repro_radix", "--radix-eviction-policy-config", '{"seed": 7}']

"""`generation: le_0_1_4` (sglang-router 0.1.4's cache-aware rule) against a slow reference written
here from the rule in docs/ALGORITHMS.md §3, on random traffic: decisions, branches, loads, sizes and
every node's stamps. The per-node hash order is pinned to "lowest id" on both sides for that
comparison; its own properties (seeded, a split keeps it, uniform over nodes) are tested apart."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.routing import CacheAwareRouter
from repro.routing.approx_tree_014 import HashOrderTree
from tests.routing.cache_aware_reference import RefNode, RefTree, f32, lcp
from tests.routing.fakes import make_request, make_views


class Ref014Tree(RefTree):
    """0.1.4's tree: ms stamps on the whole path, no creator, the first tenant = the lowest id."""

    def insert(self, key: str, t: int, ms: int) -> None:  # type: ignore[override]
        self.size.setdefault(t, 0)
        self.nodes[""].tenants[t] = ms
        cur = ""
        while cur != key:
            c = self.child_towards(cur, key)
            if c is None:
                self.nodes[key] = RefNode({t: ms}, None)
                self.size[t] += len(key) - len(cur)
                return
            n = lcp(c, key)
            if n < len(c):
                self.nodes[c[:n]] = RefNode(dict(self.nodes[c].tenants), None)
                c = c[:n]
            if t not in self.nodes[c].tenants:
                self.size[t] += len(c) - len(cur)
            self.nodes[c].tenants[t] = ms
            cur = c

    def match(self, key: str, ms: int) -> tuple[int, int | None]:  # type: ignore[override]
        cur, matched = "", 0
        while matched < len(key):
            c = self.child_towards(cur, key)
            if c is None:
                break
            matched = lcp(c, key)
            cur = c
            if matched < len(c):
                break
        tenants = self.nodes[cur].tenants
        tenant = min(tenants) if tenants else None
        if tenant is not None:
            for p in self.nodes:
                if cur.startswith(p):
                    self.nodes[p].tenants[tenant] = ms
        return matched, tenant


class Ref014:
    def __init__(self, m, queue_order, size_order, threshold, abs_thr, rel_thr):
        self.loads = [0] * m
        self.queue_order, self.size_order = queue_order, size_order
        self.tree = Ref014Tree(list(range(m)))
        for w in range(m):
            self.tree.insert("", w, 0)
        self.threshold, self.abs_thr, self.rel_thr = threshold, abs_thr, rel_thr

    @staticmethod
    def first_min(order, value):
        best = order[0]
        for w in order:
            if value(w) < value(best):
                best = w
        return best

    def route(self, key: str, ms: int) -> tuple[int, str]:
        hi, lo = max(self.loads), min(self.loads)
        if hi - lo > self.abs_thr and f32(hi) > f32(f32(lo) * f32(self.rel_thr)):
            w, branch = self.first_min(self.queue_order, self.loads.__getitem__), "imbalanced"
        else:
            matched, tenant = self.tree.match(key, ms)
            if key and tenant is not None and f32(f32(matched) / f32(len(key))) > f32(self.threshold):
                w, branch = tenant, "hit"
            else:
                size = self.tree.size
                w = self.first_min(self.size_order, size.__getitem__)
                branch = "low_match_tied" if list(size.values()).count(size[w]) > 1 else "low_match_untied"
        self.tree.insert(key, w, ms)
        self.loads[w] += 1
        return w, branch


def lowest_id(tree):
    tree.first_tenant = lambda node: min(node.tenants) if node.tenants else None


keys = st.text(alphabet="ab é中", max_size=10)
op = st.one_of(
    st.tuples(st.just("route"), keys),
    st.tuples(st.just("done"), st.integers(0, 50)),
    st.tuples(st.just("evict"), st.integers(0, 15)),
    st.tuples(st.just("tick"), st.integers(0, 3)),  # ms between decisions (0: equal stamps)
)


@settings(max_examples=300, deadline=None)
@given(
    m=st.integers(1, 4),
    perm_seed=st.integers(0, 10**6),
    ops=st.lists(op, max_size=60),
    threshold=st.sampled_from([0.0, 0.3, 0.5, 0.9]),
    abs_thr=st.integers(0, 3),
    rel_thr=st.sampled_from([1.0, 1.0001, 1.5]),
)
def test_le_0_1_4_equals_reference(m, perm_seed, ops, threshold, abs_thr, rel_thr):
    rng = random.Random(perm_seed)
    queue_order, size_order = rng.sample(range(m), m), rng.sample(range(m), m)
    fast = CacheAwareRouter(
        match_on="text",
        cache_threshold=threshold,
        balance_abs_threshold=abs_thr,
        balance_rel_threshold=rel_thr,
        eviction_interval_secs=0,
        generation="le_0_1_4",
        worker_order=queue_order,
    )
    fast.reset(make_views(m), seed=0)
    fast.size_order = size_order
    lowest_id(fast.tree)
    ref = Ref014(m, queue_order, size_order, threshold, abs_thr, rel_thr)
    in_flight: list[int] = []
    ms = 0
    for kind, arg in ops:
        if kind == "route":
            w_ref, branch_ref = ref.route(arg, ms)
            assert (fast.route_key(arg, ms / 1000.0), fast.last_branch) == (w_ref, branch_ref)
            in_flight.append(w_ref)
        elif kind == "done" and in_flight:
            w = in_flight.pop(arg % len(in_flight))
            ref.loads[w] = max(0, ref.loads[w] - 1)
            fast.release(w)
        elif kind == "evict":
            ambiguous = ref.tree.evict(arg)
            fast.tree.evict_tenant_by_size(arg)
            if ambiguous:  # equal stamps: the real heap's order decides; restart both from the fast tree
                return
        elif kind == "tick":
            ms += arg
        assert fast.loads == ref.loads
        assert fast.tree.tenant_size == ref.tree.size
        assert fast.tree.used_size_per_tenant() == ref.tree.size
        assert dump(fast.tree) == {p: n.tenants for p, n in ref.tree.nodes.items()}


def dump(tree) -> dict[str, dict[int, int]]:
    out = {}
    stack = [("", tree.root)]
    while stack:
        path, node = stack.pop()
        out[path] = dict(node.tenants)
        stack.extend((path + c.key, c) for c in node.children.values())
    return out


def test_hash_order_is_seeded_per_node_and_kept_by_a_split():
    a, b = HashOrderTree(seed=5), HashOrderTree(seed=5)
    firsts = []
    for i in range(400):
        key = f"{i:03d}" + "x" * 5
        for tree in (a, b):
            tree.insert(key, 0, i)
            tree.insert(key, 1, i)
        node = a.walk(key)[1]
        firsts.append(a.first_tenant(node))
        assert a.first_tenant(node) == b.first_tenant(b.walk(key)[1])  # the same seed, the same orders
        first = a.first_tenant(node)
        a.insert(key[:4] + "y", 2, i)  # splits `node`: the upper part is a clone of its map and order
        upper = a.walk(key[:4])[1]
        assert upper is not node and upper.salt == node.salt and a.first_tenant(node) == first
        assert a.first_tenant(upper) in (first, 2)  # tenant 2 joined it: first, or after `first`
        b.insert(key[:4] + "y", 2, i)
    # every node its own random order: tenant 0 first about half the time (binomial sd 10)
    assert 140 < firsts.count(0) < 260
    other = HashOrderTree(seed=6)
    for i in range(400):
        other.insert(f"{i:03d}xxxxx", 0, i)
        other.insert(f"{i:03d}xxxxx", 1, i)
    assert [other.first_tenant(other.walk(f"{i:03d}xxxxx")[1]) for i in range(400)] != firsts


def test_match_stamps_the_chosen_tenant_up_to_the_root():
    t = HashOrderTree(seed=0)
    for w in range(2):
        t.insert("", w, 0)
    t.insert("abcdef", 0, 10)
    t.insert("abcxyz", 1, 20)  # splits at "abc": the upper part holds both
    matched, tenant = t.prefix_match("abcdeQ", 30)
    assert (matched, tenant) == (5, 0)
    assert dump(t) == {"": {0: 30, 1: 20}, "abc": {0: 30, 1: 20}, "abcdef": {0: 30}, "abcxyz": {1: 20}}
    matched, tenant = t.prefix_match("abQ", 40)  # stops inside "abc", a node both hold: its hash order picks
    assert matched == 2 and tenant == t.first_tenant(t.walk("abc")[1]) and t.hash_order_choices == 1


def test_defaults_and_key_rules():
    r = CacheAwareRouter(generation="le_0_1_4", match_on="auto")
    r.reset(make_views(3), seed=3)
    assert sorted(r.order) == sorted(r.size_order) == [0, 1, 2]
    text_req = make_request(0, [5, 6, 7])
    assert r._key(text_req) == ""  # no text: 0.1.4 reads only `text`, an ids-only request routes on ""
    none = CacheAwareRouter(generation="le_0_1_4", match_on="none")
    none.reset(make_views(2), seed=0)
    assert none._key(make_request(1, [1, 2])) == "" and not none.uses_text
    seeded = [CacheAwareRouter(generation="le_0_1_4") for _ in range(2)]
    for s in seeded:
        s.reset(make_views(5), seed=11)
    assert (seeded[0].order, seeded[0].size_order) == (seeded[1].order, seeded[1].size_order)


def test_an_empty_key_is_never_a_hit_and_an_abandoned_request_keeps_its_count():
    r = CacheAwareRouter(generation="le_0_1_4", match_on="none", cache_threshold=0.0, worker_order="index")
    r.reset(make_views(2), seed=0)
    r.size_order = [1, 0]
    picks = [r.route_key("", i / 1000) for i in range(5)]
    assert picks == [1] * 5 and r.last_branch == "low_match_tied"  # 0/0 is NaN: never above even 0.0
    r.on_request_abandoned(make_request(0, [1]), 1)
    assert r.loads == [0, 5]
    r.on_request_complete(make_request(1, [1]), 1, 1.0, 0.5, 0)
    assert r.loads == [0, 4]


@pytest.mark.parametrize("gen", ["v0_3_2", "le_0_2_3", "smg_1_13"])
def test_other_generations_keep_their_tree(gen):
    r = CacheAwareRouter(generation=gen)
    r.reset(make_views(2), seed=0)
    assert type(r.tree).__name__ == "ApproximateTree"

"""The cache-aware router's approximate tree against an obviously-right dict-of-strings reference."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.kvcache import as_key
from repro.routing.approx_tree import ApproximateTree


class ReferenceTree:
    """Every inserted (tenant, string) kept in order; answers by brute force.

    - match length = longest common prefix of the query with any inserted string;
    - tenants at the match = tenants that inserted a string starting with query[:match],
      ordered by their first such insertion (the tree keeps arrival order per node);
    - tenant size = number of distinct non-empty prefixes of the tenant's strings.
    """

    def __init__(self) -> None:
        self.log: list[tuple[int, str]] = []

    def insert(self, s: str, tenant: int) -> None:
        self.log.append((tenant, s))

    @staticmethod
    def _lcp(a: str, b: str) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    def match(self, q: str) -> tuple[int, list[int]]:
        m = max((self._lcp(q, s) for _, s in self.log), default=0)
        tenants: list[int] = []
        for t, s in self.log:
            if s.startswith(q[:m]) and t not in tenants:
                tenants.append(t)
        return m, tenants

    def sizes(self) -> dict[int, int]:
        prefixes: dict[int, set[str]] = {}
        for t, s in self.log:
            prefixes.setdefault(t, set()).update(s[:k] for k in range(1, len(s) + 1))
        return {t: len(p) for t, p in prefixes.items()}


def tree_key(s: str, unit: int):
    if unit == 1:
        return s
    return as_key(np.array([ord(c) for c in s], dtype=np.int32))


strings = st.text(alphabet="abcé", max_size=8)
ops = st.lists(st.tuples(st.integers(0, 3), strings), max_size=25)


@settings(max_examples=300, deadline=None)
@given(ops=ops, queries=st.lists(strings, min_size=1, max_size=8), unit=st.sampled_from([1, 4]))
def test_tree_matches_reference(ops, queries, unit):
    tree, ref = ApproximateTree(unit=unit), ReferenceTree()
    for k, (tenant, s) in enumerate(ops):
        tree.insert(tree_key(s, unit), tenant)
        ref.insert(s, tenant)
    assert tree.tenant_size == ref.sizes()
    assert tree.used_size_per_tenant() == tree.tenant_size
    for q in queries:
        m_ref, tenants_ref = ref.match(q)
        # Which tenants sit on the node where matching stops, in arrival order.
        m, node = tree.walk(tree_key(q, unit))
        assert m == m_ref
        assert list(node.tenants) == tenants_ref
        # The tenant reported is the node's creator: the first to reach it (no trimming here);
        # the root has no creator: the first tenant in tenant_order (default: lowest id).
        expected = (min(tenants_ref) if node is tree.root else tenants_ref[0]) if tenants_ref else None
        assert tree.prefix_match(tree_key(q, unit)) == (m_ref, expected)
    assert tree.tenant_size == ref.sizes()  # matching never changes sizes


@settings(max_examples=200, deadline=None)
@given(ops=ops, max_units=st.integers(0, 12))
def test_eviction_keeps_sizes_consistent_and_within_budget(ops, max_units):
    tree = ApproximateTree(unit=1)
    for k, (tenant, s) in enumerate(ops):
        tree.insert(s, tenant)
    tree.evict_tenant_by_size(max_units)
    assert all(size <= max_units for size in tree.tenant_size.values())
    assert tree.used_size_per_tenant() == tree.tenant_size
    # Structure stays a tree where each tenant set is closed towards the root and no node is dead.
    for node in tree._nodes():
        if node is tree.root:
            continue
        assert node.tenants or node.children
        assert set(node.tenants) <= set(node.parent.tenants)
        assert node.parent.children[node.key[:1]] is node


def test_insert_split_and_sizes_table():
    tree = ApproximateTree()
    tree.insert("apple", 0)  # epoch 0
    tree.insert("apricot", 1)  # epoch 1
    tree.insert("banana", 0)  # epoch 2
    assert tree.tenant_size == {0: 11, 1: 7}
    (ap,) = [c for c in tree.root.children.values() if c.key == "ap"]
    # The split copied worker 0's stamp and creator; worker 1 joined it with timestamp 0.
    assert ap.tenants == {0: 0, 1: 0} and ap.creator == 0
    ple, ricot = sorted(ap.children.values(), key=lambda c: c.key)
    assert (ple.key, ple.tenants, ricot.key, ricot.tenants) == ("ple", {0: 0}, "ricot", {1: 1})
    assert tree.prefix_match("apricots") == (7, 1)  # epoch 3: no re-stamp
    assert tree.prefix_match("apx") == (2, 0)  # stops inside "ap": its creator
    assert tree.prefix_match("zzz")[0] == 0
    assert tree.epoch == 6


def test_eviction_table_lru_order_and_shared_nodes():
    tree = ApproximateTree()
    tree.insert("aaaa", 0)  # epoch 0
    tree.insert("bbbb", 0)  # epoch 1
    tree.insert("aaaa", 1)  # epoch 2: the key ends on the existing node, stamped for 1 only
    tree.evict_tenant_by_size(4)
    # Tenant 0's least recent leaf "aaaa" goes; tenant 1 keeps it.
    assert tree.tenant_size == {0: 4, 1: 4}
    nodes = {c.key: dict(c.tenants) for c in tree.root.children.values()}
    assert nodes == {"aaaa": {1: 2}, "bbbb": {0: 1}}


def test_prefix_match_restamps_one_time_in_eight():
    tree = ApproximateTree()
    tree.insert("aaaa", 0)  # epoch 0
    tree.insert("bbbb", 0)  # epoch 1
    for _ in range(5):  # epochs 2..6: no re-stamp
        assert tree.prefix_match("aaaa") == (4, 0)
    tree.evict_tenant_by_size(4)
    assert [c.key for c in tree.root.children.values()] == ["bbbb"]
    tree = ApproximateTree()
    tree.insert("aaaa", 0)
    tree.insert("bbbb", 0)
    for _ in range(6):  # epochs 2..7: the match with epoch... 8 is the next one
        tree.prefix_match("aaaa")
    assert tree.prefix_match("aaaa") == (4, 0)  # epoch 8: re-stamps tenant 0 on "aaaa"
    assert tree.root.children["a"].tenants == {0: 8}
    tree.evict_tenant_by_size(4)
    assert [c.key for c in tree.root.children.values()] == ["aaaa"]


def test_inner_nodes_joined_get_timestamp_zero_and_creator_survives_until_trimmed():
    tree = ApproximateTree(tenant_order=[2, 1, 0])
    tree.insert("abcd", 0)  # epoch 0
    tree.insert("abcdef", 1)  # joins "abcd" with 0, leaf "ef" stamped 1
    tree.insert("abcdef", 2)  # joins both with 0, stamps the leaf "ef" for 2 with epoch 2
    abcd = tree.root.children["a"]
    assert abcd.tenants == {0: 0, 1: 0, 2: 0} and abcd.creator == 0
    assert abcd.children["e"].tenants == {1: 1, 2: 2}
    tree.evict_tenant_by_size(0)  # everyone trimmed: an empty tree remains
    assert tree.root.children == {}
    tree.insert("abcd", 0)
    tree.insert("abcd", 1)
    tree.insert("abcd", 2)
    abcd = tree.root.children["a"]
    del abcd.tenants[0]  # the creator is gone (as after a trim): the first remaining in tenant_order
    tree.tenant_size[0] -= 4
    assert tree.prefix_match("abcd") == (4, 2)


def test_eviction_walks_up_to_parents():
    tree = ApproximateTree()
    tree.insert("abcd", 0)
    tree.insert("abxy", 0)
    tree.insert("zz", 1)
    tree.evict_tenant_by_size(0)
    assert tree.tenant_size == {0: 0, 1: 0}
    assert tree.root.children == {}
    assert tree.num_nodes() == 1


def test_eviction_stops_at_budget_and_spares_small_tenants():
    tree = ApproximateTree()
    tree.insert("q", 1)  # older than everything, but tenant 1 is within budget
    tree.insert("abcd", 0)  # ab|cd after the next insert
    tree.insert("abxy", 0)
    tree.evict_tenant_by_size(4)
    assert tree.tenant_size == {0: 4, 1: 1}
    (ab,) = [c for c in tree.root.children.values() if c.key == "ab"]
    assert [c.key for c in ab.children.values()] == ["xy"]  # the older leaf "cd" went first


def _shape(tree: ApproximateTree):
    """Everything an insert can change: structure, tenants with stamps, creators, sizes, epoch."""
    out = []
    stack = [((), tree.root)]
    while stack:
        path, node = stack.pop()
        out.append((path, node.key, sorted(node.tenants.items()), node.creator))
        for first in sorted(node.children):
            stack.append((path + (first,), node.children[first]))
    return sorted(out, key=repr), dict(sorted(tree.tenant_size.items())), tree.epoch


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 3), strings, st.booleans()), max_size=30), unit=st.sampled_from([1, 4]))
def test_insert_after_prefix_match_equals_plain_insert(ops, unit):
    # the router's decide (prefix_match) + commit (insert of the same key object) resumes the
    # match's descent; a twin tree walks again. Both must end identical, after every step.
    fused, plain = ApproximateTree(unit=unit), ApproximateTree(unit=unit)
    for tenant, s, match_first in ops:
        key = tree_key(s, unit)
        if match_first:
            assert fused.prefix_match(key) == plain.prefix_match(key)
            plain._last_walk = None  # the twin never resumes
        fused.insert(key, tenant)
        plain.insert(key, tenant)
        assert _shape(fused) == _shape(plain)

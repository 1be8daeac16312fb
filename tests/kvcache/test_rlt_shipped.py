"""RLT as shipped (`rlt_shipped`): draw for draw against a plain reference written from the rules.

The reference (`ShippedReference`) is its own radix tree of token lists and dicts, written from
the rules in docs/ALGORITHMS.md "RLT as shipped" alone: children kept in insertion order (a split
node keeps its place), a match marks only the upper part of a node it splits, an insert marks
every node on its path, a node newly marked with marked >= limit starts a phase that keeps its
path, `evict(n)` with its two phase rules, one `random.Random(seed).randrange` per draw over a
swap-remove list of the unmarked unlocked leaves in walk order, one token per draw, an emptied
leaf's parent joining. On random call sequences (hypothesis) the fast tree and the reference
must agree after every call: every node (path, mark, lock), the evicted tokens in draw order,
the phases and the marked count.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.kvcache import RadixCache, check_eviction_config, make_cache
from repro.kvcache.eviction.rlt_shipped import RLTShippedEviction
from repro.kvcache.keys import key_to_tokens


class _N:
    def __init__(self, key, parent):
        self.key = list(key)
        self.parent = parent
        self.children: dict = {}
        self.marked = False
        self.lock = 0


class ShippedReference:
    """The rules, literally (module docstring)."""

    def __init__(self, capacity, seed):
        self.limit = capacity
        self.rng = random.Random(seed)
        self.root = _N([], None)
        self.root.lock = 1
        self.marked = 0
        self.phases = 1
        self.log: list[tuple] = []  # evicted tokens (their path prefixes) in draw order

    # -- structure
    def path(self, node):
        out = []
        while node is not self.root:
            out = node.key + out
            node = node.parent
        return tuple(out)

    def split(self, node, k):
        upper = _N(node.key[:k], node.parent)
        upper.marked, upper.lock = node.marked, node.lock
        node.parent.children[node.key[0]] = upper  # same dict slot: its place is kept
        node.key = node.key[k:]
        node.parent = upper
        upper.children[node.key[0]] = node
        return upper

    def size(self):
        return sum(len(n.key) for n in self.nodes())

    def nodes(self):
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    # -- marks
    def mark(self, node):
        if not node.marked:
            node.marked = True
            self.marked += len(node.key)
            if self.marked >= self.limit:
                self.new_phase(keep=node)

    def new_phase(self, keep=None):
        for n in self.nodes():
            n.marked = False
        self.marked = 0
        self.phases += 1
        while keep is not None and keep is not self.root:
            keep.marked = True
            self.marked += len(keep.key)
            keep = keep.parent

    # -- verbs
    def match(self, tokens):
        node, i = self.root, 0
        while i < len(tokens) and tokens[i] in node.children:
            child = node.children[tokens[i]]
            k = 0
            while k < len(child.key) and i + k < len(tokens) and child.key[k] == tokens[i + k]:
                k += 1
            if k < len(child.key):
                upper = self.split(child, k)
                if not upper.marked:
                    self.mark(upper)
                return i + k, upper
            i += k
            node = child
        return i, node

    def insert(self, tokens):
        node, i = self.root, 0
        while i < len(tokens) and tokens[i] in node.children:
            child = node.children[tokens[i]]
            k = 0
            while k < len(child.key) and i + k < len(tokens) and child.key[k] == tokens[i + k]:
                k += 1
            if k < len(child.key):
                child = self.split(child, k)
            self.mark(child)
            i += k
            node = child
        if i < len(tokens):
            new = _N(tokens[i:], node)
            node.children[tokens[i]] = new
            self.mark(new)
            node = new
        return node

    def lock(self, node, d):
        while node is not self.root:
            node.lock += d
            node = node.parent

    def leaves(self):
        out, stack = [], [self.root]
        while stack:
            n = stack.pop()
            if n.children:
                stack.extend(n.children.values())
            elif n is not self.root and not n.marked and n.lock == 0:
                out.append(n)
        return out

    def evict(self, need):
        if need + self.marked >= self.limit:
            self.new_phase()
        cand = self.leaves()
        if not cand or sum(len(n.key) for n in cand) < need:
            self.new_phase()
            cand = self.leaves()
        done = 0
        while cand and done < need:
            i = self.rng.randrange(len(cand))
            leaf = cand[i]
            cand[i] = cand[-1]  # swap-remove, then the leaf (or its parent) goes to the end
            cand.pop()
            self.log.append(self.path(leaf))
            leaf.key.pop()
            done += 1
            if leaf.key:
                cand.append(leaf)
                continue
            parent = leaf.parent
            del parent.children[_first(parent, leaf)]
            if parent is not self.root and not parent.marked and parent.lock == 0 and not parent.children:
                cand.append(parent)
        return done

    def state(self):
        return sorted((self.path(n), n.marked, n.lock) for n in self.nodes())


def _first(parent, leaf):
    return next(k for k, v in parent.children.items() if v is leaf)


def fast_state(cache):
    pol = cache.policy
    return sorted(
        (tuple(key_to_tokens(cache.path_key(n)).tolist()), n.mark == pol.phase, n.lock_ref) for n in cache.iter_nodes()
    )


def fast_cache(capacity, seed):
    return RadixCache(capacity, RLTShippedEviction(seed), "node", record_evictions=True)


def fast_log(cache):
    return [tuple(key_to_tokens(k).tolist()) for k in cache.eviction_log]


def assert_same(cache, ref):
    pol = cache.policy
    assert fast_state(cache) == ref.state()
    assert fast_log(cache) == ref.log
    assert (pol.phases, pol.marked_count) == (ref.phases, ref.marked)
    assert cache.total_size() == ref.size()
    cache.check_invariants()


# A request: its prompt and what it later appends (its outputs); small alphabets share prefixes.
_tokens = st.lists(st.integers(0, 2), min_size=1, max_size=9)
_ops = st.lists(
    st.tuples(
        st.sampled_from(["admit", "admit", "finish", "evict", "match"]), _tokens, st.integers(0, 3), st.booleans()
    ),
    min_size=1,
    max_size=40,
)


def _drive(cache, ref, ops):
    """The call sequence of a server, on both trees: admit = match(prompt[:-1]), lock, evict if
    short (the whole allocation or the shortfall, as 0.4.6 / 0.5.23), insert(prompt), match(prompt),
    move the lock; finish = insert(prompt + outputs) (evict if short), unlock; evict / match = a
    bare call (0.4.6 matches every waiting request it looks at, admitted or not)."""
    active = []  # (prompt, fast node, reference node)
    for kind, tokens, extra, whole in ops:
        if kind == "evict":
            got = cache.evict(extra + 1)
            assert got == ref.evict(extra + 1)
        elif kind == "match":
            assert cache.match_prefix(tokens).length == ref.match(tokens)[0]
        elif kind == "admit":
            m = cache.match_prefix(tokens[:-1])
            rlen, rnode = ref.match(tokens[:-1])
            assert m.length == rlen
            cache.inc_lock_ref(m.last_node)
            ref.lock(rnode, +1)
            new = len(tokens) - m.length
            short = new - cache.free_tokens()
            if short > 0:
                n = new if whole else short
                assert cache.evict(n) == ref.evict(n)
            if new > cache.free_tokens():
                cache.dec_lock_ref(m.last_node)
                ref.lock(rnode, -1)
            else:
                cache.insert(tokens)
                ref.insert(tokens)
                m2 = cache.match_prefix(tokens)
                r2 = ref.match(tokens)[1]
                cache.inc_lock_ref(m2.last_node)
                ref.lock(r2, +1)
                cache.dec_lock_ref(m.last_node)
                ref.lock(rnode, -1)
                active.append((tokens, m2.last_node, r2))
        elif active:
            prompt, node, rnode = active.pop(extra % len(active))
            full = prompt + tokens[:extra]
            short = len(full) - cache.peek_prefix(full) - cache.free_tokens()
            if short > 0:
                n = short + (len(prompt) if whole else 0)
                assert cache.evict(n) == ref.evict(n)
            if len(full) - cache.peek_prefix(full) <= cache.free_tokens():
                cache.insert(full)
                ref.insert(full)
            cache.dec_lock_ref(node)
            ref.lock(rnode, -1)
        assert_same(cache, ref)


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(1, 30), seed=st.integers(0, 2**32), ops=_ops)
def test_draw_for_draw_against_reference(capacity, seed, ops):
    cache, ref = fast_cache(capacity, seed), ShippedReference(capacity, seed)
    _drive(cache, ref, ops)


def test_reference_has_teeth():
    """The comparison sees a one-rule change: a match that marks its whole path (our RLT's rule)."""
    ops = [("admit", [0, 1, 2, 0], 0, True), ("finish", [9], 0, True), ("admit", [1, 1, 1, 1], 0, True)]
    ops += [("match", [0, 1, 2, 0], 0, True)]  # a full match: marks nothing (else: 8 marked, a new phase)

    class MarksOnMatch(ShippedReference):
        def match(self, tokens):
            length, node = super().match(tokens)
            n = node
            while n is not self.root:
                self.mark(n)
                n = n.parent
            return length, node

    with pytest.raises(AssertionError):
        _drive(fast_cache(8, 1), MarksOnMatch(8, 1), ops)
    _drive(fast_cache(8, 1), ShippedReference(8, 1), ops)


def _tree(capacity=100, seed=0):
    return fast_cache(capacity, seed)


def _marked(cache):
    pol = cache.policy
    return {tuple(key_to_tokens(cache.path_key(n)).tolist()) for n in cache.iter_nodes() if n.mark == pol.phase}


def test_marks_insert_path_match_split_only():
    c = _tree()
    c.insert([1, 2, 3, 4])
    c.policy.new_phase()
    c.match_prefix([1, 2, 3, 4])  # a full match: no mark
    assert _marked(c) == set() and c.policy.marked_count == 0
    c.match_prefix([1, 2, 9])  # ends inside the node: the upper part [1, 2] is marked, [3, 4] is not
    assert _marked(c) == {(1, 2)} and c.policy.marked_count == 2
    c.insert([1, 2, 3, 4, 5])  # an insert marks every node on its path
    assert _marked(c) == {(1, 2), (1, 2, 3, 4), (1, 2, 3, 4, 5)} and c.policy.marked_count == 5


def test_phase_in_advance_and_no_fallback():
    c = _tree(capacity=10)
    c.insert([1, 1, 1])
    c.insert([2, 2, 2])  # 6 marked of limit 10
    ph = c.policy.phases
    assert c.evict(3) == 3  # 3 + 6 >= 10: a new phase first, then three draws
    assert c.policy.phases == ph + 1
    c = _tree(capacity=10)
    c.insert([1, 1, 1])
    c.policy.new_phase()
    c.insert([2, 2, 2])  # [1,1,1] unmarked, [2,2,2] marked: 3 marked
    assert c.evict(2) == 2  # 2 + 3 < 10, the unmarked leaf holds 3 >= 2: same phase
    assert {tuple(key_to_tokens(k).tolist()) for k in c.eviction_log} == {(1, 1, 1), (1, 1)}
    assert c.policy.phases == 2
    assert c.evict(2) == 2  # only 1 unmarked token left (< 2): a new phase, then any leaf
    assert c.policy.phases == 3


def test_locked_tree_evicts_nothing():
    c = _tree(capacity=10)
    r = c.insert([1, 2, 3])
    c.inc_lock_ref(r.last_node)
    assert c.evict(2) == 0 and c.total_size() == 3
    assert c.policy.stats()["rlt_short_evictions"] == 1


def test_parent_joins_after_last_child():
    c = _tree(capacity=100)
    c.insert([1, 2])
    c.insert([1, 2, 3])
    c.policy.new_phase()
    assert c.evict(2) == 2  # the leaf [3], then its parent [1, 2] (now a leaf), one token
    assert [tuple(key_to_tokens(k).tolist()) for k in c.eviction_log] == [(1, 2, 3), (1, 2)]


@pytest.mark.parametrize("seed", [0, 7])
def test_reproducible_per_seed(seed):
    def run(s):
        c = make_cache(40, {"name": "rlt_shipped", "granularity": "node"}, s)
        rng = random.Random(99)
        out = []
        for _ in range(200):
            t = [rng.randrange(4) for _ in range(rng.randrange(1, 10))]
            m = c.match_prefix(t)
            c.inc_lock_ref(m.last_node)
            if len(t) - m.length > c.free_tokens():
                c.evict(len(t) - m.length)
            c.insert(t)
            c.dec_lock_ref(m.last_node)
            out.append(sorted(c.cached_keys()))
        return out, c.stats()

    assert run(seed) == run(seed)
    assert run(seed) != run(seed + 1)


def test_config_and_backends():
    assert check_eviction_config({"name": "rlt_shipped", "granularity": "node"}, "sim") == []
    assert check_eviction_config({"name": "rlt_shipped", "granularity": "node"}, "sglang") == []
    assert check_eviction_config({"name": "rlt_shipped"}, "theory")  # not a replayer policy
    with pytest.raises(ValueError, match="seed"):
        RLTShippedEviction("x")  # type: ignore[arg-type]


def test_policy_option_exists():
    from hydra_plugins.repro_policies import policies

    opts = policies()
    assert "cache_aware_rlt_shipped" in opts and "lbgr_rlt_shipped" in opts
    assert opts["lbgr_rlt_shipped"]["policy_name"].endswith("+RLT-shipped")


def test_long_sequence_draw_for_draw():
    """One long sequence with many draws, parents joining and phases (the random ones are short)."""
    rng = random.Random(5)
    kinds = ["admit", "admit", "admit", "finish", "finish", "evict", "match"]
    ops = [
        (
            rng.choice(kinds),
            [rng.randrange(3) for _ in range(rng.randrange(1, 12))],
            rng.randrange(4),
            rng.random() < 0.5,
        )
        for _ in range(600)
    ]
    cache, ref = fast_cache(24, 11), ShippedReference(24, 11)
    _drive(cache, ref, ops)
    assert len(ref.log) > 300 and ref.phases > 20

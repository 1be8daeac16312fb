"""Leaf-eviction policies for `RadixCache`: LRU (L-LRU), RLT (randomized marking) and OPT (Belady).

A policy is attached to exactly one cache and keeps its own candidate structures up to date
through the cache's hooks: `touch` (a node was accessed: re-stamped / marked), `new_node`
(a fresh evictable leaf was added), `leaf_added` / `leaf_removed` (a node became / stopped
being an evictable leaf: unlocked childless node <-> locked, got a child, evicted) and
`split`. `evict(need)` removes >= need tokens through `cache._evict_tokens` and returns
`(evicted, reset_at)` (`reset_at`: RLT only, tokens evicted before the first phase reset
of this call, so that `process_path` can split the new run where the token-by-token model
resets; None otherwise).

The structures are hand-written (lazy heaps, list + index maps) because eviction runs on
every admitted request in the simulator; `heapq` and lists are the fast C primitives here.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from typing import TYPE_CHECKING, Mapping

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from repro.kvcache.radix_cache import Node, RadixCache
    from repro.kvcache.trace_index import TraceIndex

POLICY_NAMES: tuple[str, ...] = ("lru", "rlt", "opt")
INF_USE = 1 << 62  # "never used again"


class EvictionPolicy:
    """Base class: one instance per cache (it holds that cache's candidate structures)."""

    name = "base"

    def __init__(self, granularity: str | None = None):
        from repro.kvcache.radix_cache import GRANULARITIES

        if granularity is not None and granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
        self.granularity = granularity  # None: the cache decides
        self.cache: RadixCache | None = None

    def _attach(self, cache: "RadixCache") -> None:
        if self.cache is not None:
            raise ValueError(f"this {type(self).__name__} is already attached to a cache; build one policy per cache")
        self.cache = cache

    # hooks (defaults: nothing to maintain)
    def touch(self, node: "Node") -> None:
        pass

    def new_node(self, node: "Node", marked: bool) -> None:
        self.leaf_added(node)

    def leaf_added(self, node: "Node") -> None:
        pass

    def leaf_removed(self, node: "Node") -> None:
        pass

    def split(self, upper: "Node", lower: "Node") -> None:
        pass

    def evict(self, need: int) -> tuple[int, int | None]:  # pragma: no cover - abstract
        raise NotImplementedError

    def stats(self) -> dict:
        return {"policy": self.name}

    def check(self) -> None:
        pass


def _lru_valid(entry_stamp: int, node: "Node") -> bool:
    return node.parent is not None and node.stamp == entry_stamp and node.lock_ref == 0 and not node.children


class LRUEviction(EvictionPolicy):
    """L-LRU: evict the least recently used evictable leaf (SGLang's default policy).

    A lazy min-heap of (stamp, node). Nodes that became evictable leaves or got a new stamp
    wait in `dirty` (once each) and are pushed when `evict` runs, so a node that is
    inserted, locked and unlocked between two evictions costs one push; stale entries
    (re-stamped, locked, got a child, gone) are skipped when popped, and the heap is rebuilt
    when they outnumber live nodes. Token granularity evicts from the popped leaf until it
    is empty or `need` is met: its remaining tokens are older than its (evicted) last
    token, hence older than every other leaf token, so this is exactly token-by-token LRU.
    """

    name = "lru"

    def __init__(self, granularity: str | None = None):
        super().__init__(granularity)
        self.heap: list = []
        self.dirty: list = []

    def touch(self, node):
        if not node.hdirty and not node.children and node.lock_ref == 0:
            node.hdirty = True
            self.dirty.append(node)

    def leaf_added(self, node):
        if not node.hdirty:
            node.hdirty = True
            self.dirty.append(node)

    def _flush(self) -> None:
        heap = self.heap
        push = heapq.heappush
        for node in self.dirty:
            node.hdirty = False
            if node.parent is not None and not node.children and node.lock_ref == 0:
                push(heap, (node.stamp, node))
        self.dirty = []
        if len(heap) > 2 * self.cache._num_nodes + 1024:
            heap[:] = [(n.stamp, n) for n in self.cache.iter_evictable_leaves()]
            heapq.heapify(heap)

    def evict(self, need):
        cache = self.cache
        token = cache.granularity == "token"
        pop = heapq.heappop
        evicted = 0
        while evicted < need:
            if self.dirty:  # includes parents that just became leaves
                self._flush()
            heap = self.heap
            node = None
            while heap:
                stamp, cand = pop(heap)
                if _lru_valid(stamp, cand):
                    node = cand
                    break
            if node is None:
                break
            r = min(node.n, need - evicted) if token else node.n
            if not cache._evict_tokens(node, r):
                heapq.heappush(heap, (node.stamp, node))
            evicted += r
        return evicted, None

    def check(self):
        live = {id(n) for s, n in self.heap if _lru_valid(s, n)} | {id(n) for n in self.dirty}
        for node in self.cache.iter_evictable_leaves():
            assert id(node) in live, "LRU: an evictable leaf has no valid heap entry"


class RLTEviction(EvictionPolicy):
    """RLT (Randomized Leaf Token, Algorithm 1): the marking algorithm on radix-tree leaves.

    Marks: every accessed token is marked (`match_prefix`, `insert`, `process_path`); a node
    is marked iff `node.mark == self.phase`, so clearing all marks is `phase += 1` (O(1)).
    Marks live on cached tokens: an evicted token loses its mark and `marked_count` drops
    (the project's decision; the paper does not say). Hence B + 1 distinct marked tokens
    (B = capacity) happen exactly when a miss finds the cache full and every cached token
    marked; `evict` checks this before every victim (`marked_count == total_size`) and then
    starts a new phase. All marks are cleared: the "most recently accessed token" the paper
    keeps marked is the missed token itself, not cached yet, and the insert that follows
    marks it. Bulk verbs: `insert` after such a reset marks all its new tokens, whereas the
    token-by-token model (`process_path`, the replayer) leaves the part of the run inserted
    before the reset point unmarked -- the only place the bulk verbs differ from it.

    Victim: uniform among UNMARKED evictable leaf tokens (token granularity: each leaf node
    offers its last token, one draw per evicted token) or unmarked evictable leaf nodes
    (node granularity, evicted whole). If none exists (unmarked tokens are all interior or
    locked), fall back to the least recently used evictable leaf (the paper does not say;
    counted in `fallback_evicted_tokens`).

    Structures (hand-written, hot path): evictable leaves are kept in two lists with index
    maps (`node.lidx`), unmarked and marked, for O(1) uniform sampling and swap-removal; a
    phase reset moves the marked list into the unmarked one (amortised O(1): each move pays
    for the mark that put the node there). The fallback LRU heap is only refreshed when a
    fallback happens (nodes whose stamp changed wait in `dirty`). Uniform draws come from a
    buffer filled by the numpy Generator (deterministic per seed, ~0.1 us per draw).
    """

    name = "rlt"
    _BUF = 1024

    def __init__(self, seed: "int | np.random.Generator" = 0, granularity: str | None = None):
        super().__init__(granularity)
        self.rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        self._ubuf: list[float] = []
        self._ui = 0
        self.phase = 1  # nodes start with mark 0: unmarked
        self.marked_count = 0
        self.unmarked: list = []
        self.marked: list = []
        self.heap: list = []
        self.dirty: list = []
        self.resets = 0
        self.random_evicted_tokens = 0
        self.fallback_evicted_tokens = 0
        self.random_evictions = 0  # victims (nodes at node granularity, tokens at token granularity)
        self.fallback_evictions = 0

    @property
    def phases(self) -> int:
        """Phases begun so far (1 + resets once anything was accessed)."""
        return self.resets + (1 if self.cache is not None and self.cache.clock > 0 else 0)

    # -- list helpers
    def _add(self, node) -> None:
        lst = self.marked if node.mark == self.phase else self.unmarked
        node.lidx = len(lst)
        lst.append(node)
        if not node.hdirty:
            node.hdirty = True
            self.dirty.append(node)

    def _remove(self, lst: list, node) -> None:
        i = node.lidx
        last = lst.pop()
        if last is not node:
            lst[i] = last
            last.lidx = i
        node.lidx = -1

    # -- hooks
    def touch(self, node):
        if node.mark != self.phase:
            node.mark = self.phase
            self.marked_count += node.n
            if node.lidx >= 0:  # an evictable leaf moves to the marked list
                self._remove(self.unmarked, node)
                node.lidx = len(self.marked)
                self.marked.append(node)
        if node.lidx >= 0 and not node.hdirty:
            node.hdirty = True
            self.dirty.append(node)

    def new_node(self, node, marked):
        if marked:
            node.mark = self.phase
            self.marked_count += node.n
        self._add(node)

    def leaf_added(self, node):
        self._add(node)

    def leaf_removed(self, node):
        if node.lidx >= 0:
            self._remove(self.marked if node.mark == self.phase else self.unmarked, node)

    def reset_phase(self) -> None:
        self.phase += 1
        self.marked_count = 0
        self.resets += 1
        ul = self.unmarked
        for node in self.marked:
            node.lidx = len(ul)
            ul.append(node)
        self.marked = []

    def _pop_lru(self):
        heap = self.heap
        if self.dirty:
            for node in self.dirty:
                node.hdirty = False
                if node.lidx >= 0:
                    heapq.heappush(heap, (node.stamp, node))
            self.dirty = []
            if len(heap) > 2 * self.cache._num_nodes + 1024:
                heap[:] = [(n.stamp, n) for n in self.unmarked + self.marked]
                heapq.heapify(heap)
        pop = heapq.heappop
        while heap:
            stamp, node = pop(heap)
            if node.lidx >= 0 and node.stamp == stamp:
                return node
        return None

    def evict(self, need):
        cache = self.cache
        token = cache.granularity == "token"
        # no debug hooks: token-granularity draws that only shorten a leaf are applied inline
        inline = token and cache.debug_on_evict is None and cache.eviction_log is None
        evicted = 0
        reset_at = None
        ubuf = self._ubuf
        ui = self._ui
        while evicted < need:
            total = cache._total
            if total == 0:
                break
            if self.marked_count == total:
                self.reset_phase()
                if reset_at is None:
                    reset_at = evicted
            ul = self.unmarked
            if ul:
                c = len(ul)
                if inline:
                    # The candidate set only changes when a leaf empties, and no reset can
                    # happen while unmarked candidates hold tokens: draw and shorten in a
                    # tight loop until a draw would empty its leaf.
                    dirty = self.dirty
                    k = 0
                    node = None
                    while evicted < need:
                        if ui == len(ubuf):
                            ubuf = self._ubuf = self.rng.random(self._BUF).tolist()
                            ui = 0
                        node = ul[int(ubuf[ui] * c)]
                        ui += 1
                        if node.n == 1:
                            break
                        node.n -= 1
                        node.depth -= 1
                        node.stamp -= 1
                        if not node.hdirty:
                            node.hdirty = True
                            dirty.append(node)
                        k += 1
                        evicted += 1
                        node = None
                    cache._total -= k
                    cache._evictable -= k
                    cache.evicted_tokens += k
                    self.random_evicted_tokens += k
                    self.random_evictions += k
                    if node is None:
                        break
                else:
                    if ui == len(ubuf):
                        ubuf = self._ubuf = self.rng.random(self._BUF).tolist()
                        ui = 0
                    node = ul[int(ubuf[ui] * c)]
                    ui += 1
                r = 1 if token else node.n
                self.random_evicted_tokens += r
                self.random_evictions += 1
            else:
                node = self._pop_lru()
                if node is None:
                    break
                # while this leaf has tokens no new leaf appears, and evicting marked
                # tokens keeps total - marked_count fixed: batch them (exact LRU per token)
                r = min(node.n, need - evicted) if token else node.n
                self.fallback_evicted_tokens += r
                self.fallback_evictions += 1
            if node.mark == self.phase:
                self.marked_count -= r
            if not cache._evict_tokens(node, r) and not node.hdirty:
                node.hdirty = True  # new stamp: the fallback heap needs a fresh entry
                self.dirty.append(node)
            evicted += r
        self._ui = ui
        return evicted, reset_at

    def stats(self):
        return {
            "policy": self.name,
            "rlt_phases": self.phases,
            "rlt_resets": self.resets,
            "rlt_random_evicted_tokens": self.random_evicted_tokens,
            "rlt_fallback_evicted_tokens": self.fallback_evicted_tokens,
            "rlt_random_evictions": self.random_evictions,
            "rlt_fallback_evictions": self.fallback_evictions,
        }

    def check(self):
        cache = self.cache
        marked = 0
        leaves_m, leaves_u = set(), set()
        for node in cache.iter_nodes():
            if node.mark == self.phase:
                marked += node.n
            if not node.children and node.lock_ref == 0:
                (leaves_m if node.mark == self.phase else leaves_u).add(id(node))
            else:
                assert node.lidx == -1, "RLT: a non-candidate node has a list index"
        assert marked == self.marked_count, f"RLT: marked_count {self.marked_count} != {marked}"
        assert marked <= cache.total_size(), "RLT: more marked than cached tokens"
        for lst, want in ((self.marked, leaves_m), (self.unmarked, leaves_u)):
            assert {id(n) for n in lst} == want and len(lst) == len(want), "RLT: candidate lists out of sync"
            for i, node in enumerate(lst):
                assert node.lidx == i, "RLT: stale list index"
        fresh = {id(n) for s, n in self.heap if n.lidx >= 0 and n.stamp == s} | {id(n) for n in self.dirty}
        assert leaves_m | leaves_u <= fresh, "RLT: an evictable leaf is missing from the fallback heap"


class OPTEviction(EvictionPolicy):
    """OPT (Belady on leaves), offline: evict the leaf whose next use lies furthest ahead.

    Needs the whole trace (`TraceIndex`) and the index of the path being processed
    (`begin_path(j)`, called by the replayer). Next use of a token (a path prefix) = the
    first later path j' > j that contains it; never used again = infinitely far. Token
    granularity: the candidates are the leaf tokens (each leaf node's last token). Node
    granularity: a leaf node's next use is that of its FIRST token (the earliest of its
    tokens' next uses: when evicting it whole first costs a miss). Ties (only "never used
    again" can tie) go to the least recently used leaf. A lazy max-heap keyed
    (-next_use, stamp); a key only changes when its token is accessed (its next use is
    exactly an access of it) or its node is truncated, and both re-push. Only valid inside
    the replayer: every split / new node lies on the current path of the trace.
    """

    name = "opt"

    def __init__(self, index: "TraceIndex", granularity: str | None = None):
        super().__init__(granularity)
        self.index = index
        self.now = -1
        self._segs: list = []
        self._ends: list = []
        self.heap: list = []

    def begin_path(self, j: int) -> None:
        self.now = j
        self._segs, self._ends = self.index.path_segments(j)

    def _tn_at(self, depth: int):
        segs, ends = self._segs, self._ends
        i = bisect_left(ends, depth)
        if i >= len(ends):
            raise ValueError("OPT: the cache holds a token outside the current trace path; OPT runs in the replayer only")
        return segs[i]

    def _key(self, node):
        tn = node.tn
        if self.cache.granularity == "node":
            first = node.depth - node.n  # depth before the node's first token
            while tn.start > first:
                tn = tn.parent
        occ = tn.occ
        i = bisect_right(occ, self.now)
        nu = occ[i] if i < len(occ) else INF_USE
        return (-nu, node.stamp)

    def _push(self, node):
        key = self._key(node)
        node.okey = key
        heapq.heappush(self.heap, (key, node))

    def touch(self, node):
        if not node.children and node.lock_ref == 0:
            self._push(node)

    def new_node(self, node, marked):
        node.tn = self._tn_at(node.depth)
        self._push(node)

    def leaf_added(self, node):
        self._push(node)

    def split(self, upper, lower):
        tn = lower.tn
        while tn.start >= upper.depth:
            tn = tn.parent
        upper.tn = tn
        if self.cache.granularity == "node" and not lower.children and lower.lock_ref == 0:
            self._push(lower)  # its first token changed, and with it the node's next use

    def evict(self, need):
        cache = self.cache
        heap = self.heap
        token = cache.granularity == "token"
        pop = heapq.heappop
        evicted = 0
        while evicted < need:
            node = None
            while heap:
                key, cand = pop(heap)
                if cand.okey is key and cand.parent is not None and cand.lock_ref == 0 and not cand.children:
                    node = cand
                    break
            if node is None:
                break
            if token:
                # tokens of the node inside its last trie segment share next use; their stamps
                # decrease, so they stay the furthest: evict them together
                seg_tokens = node.depth - max(node.tn.start, node.depth - node.n)
                r = min(seg_tokens, need - evicted)
            else:
                r = node.n
            node.okey = None
            if not cache._evict_tokens(node, r):
                tn = node.tn
                while tn.start >= node.depth:
                    tn = tn.parent
                node.tn = tn
                self._push(node)
            evicted += r
        if len(heap) > 2 * cache._num_nodes + 1024:
            self.heap = [(n.okey, n) for n in cache.iter_evictable_leaves() if n.okey is not None]
            heapq.heapify(self.heap)
        return evicted, None

    def check(self):
        live = {id(n) for k, n in self.heap if n.okey is k}
        for node in self.cache.iter_evictable_leaves():
            assert id(node) in live, "OPT: an evictable leaf has no valid heap entry"


_ALLOWED_KEYS = frozenset({"name", "granularity"})


def make_eviction(cfg: Mapping, seed: "int | np.random.Generator" = 0) -> EvictionPolicy:
    """Build a policy from a conf/eviction/*.yaml mapping `{name: lru|rlt, granularity: node|token}`."""
    if not isinstance(cfg, Mapping):
        raise ValueError(f"eviction config must be a mapping like {{name: lru, granularity: node}}, got {cfg!r}")
    unknown = set(cfg) - _ALLOWED_KEYS
    if unknown:
        raise ValueError(f"unknown eviction config keys {sorted(unknown)}; allowed: {sorted(_ALLOWED_KEYS)}")
    name = cfg.get("name")
    gran = cfg.get("granularity")
    if name == "lru":
        return LRUEviction(granularity=gran)
    if name == "rlt":
        return RLTEviction(seed, granularity=gran)
    if name == "opt":
        raise ValueError("OPT needs the future trace: build OPTEviction(TraceIndex(paths)) (the replayer does)")
    raise ValueError(f"unknown eviction policy {name!r}; choose one of 'lru', 'rlt' (or 'opt' in the replayer)")


def make_cache(capacity_tokens: int, eviction_cfg: Mapping, seed: "int | np.random.Generator" = 0):
    """A RadixCache with the policy and granularity of `eviction_cfg` (granularity default: node)."""
    from repro.kvcache.radix_cache import RadixCache

    policy = make_eviction(eviction_cfg, seed)
    return RadixCache(capacity_tokens, policy, policy.granularity or "node")

"""OPT (Belady on leaves), offline: needs the whole trace, so it runs in the replayer only."""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from typing import TYPE_CHECKING

from repro.kvcache.eviction.base import EvictionPolicy

if TYPE_CHECKING:  # pragma: no cover
    from repro.kvcache.trace_index import TraceIndex

INF_USE = 1 << 62  # "never used again"


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
    backends = frozenset({"theory"})

    def __init__(self, index: "TraceIndex"):
        super().__init__()
        self.index = index
        self.now = -1
        self._segs: list = []
        self._ends: list = []
        self.heap: list = []

    @classmethod
    def create(cls, seed=0, trace=None, **params):
        if trace is None:
            raise ValueError("OPT needs the future trace: build OPTEviction(TraceIndex(paths)) (the replayer does)")
        return cls(trace, **params)

    def begin_path(self, j: int) -> None:
        self.now = j
        self._segs, self._ends = self.index.path_segments(j)

    def _tn_at(self, depth: int):
        segs, ends = self._segs, self._ends
        i = bisect_left(ends, depth)
        if i >= len(ends):
            raise ValueError(
                "OPT: the cache holds a token outside the current trace path; OPT runs in the replayer only"
            )
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
            if r == node.n:
                cache.evict_leaf(node)
            else:
                cache.truncate_leaf(node, r)
                tn = node.tn
                while tn.start >= node.depth:
                    tn = tn.parent
                node.tn = tn
                self._push(node)
            evicted += r
        if len(heap) > 2 * cache.num_nodes() + 1024:
            self.heap = [(n.okey, n) for n in cache.iter_evictable_leaves() if n.okey is not None]
            heapq.heapify(self.heap)
        return evicted, None

    def check(self):
        live = {id(n) for k, n in self.heap if n.okey is k}
        for node in self.cache.iter_evictable_leaves():
            assert id(node) in live, "OPT: an evictable leaf has no valid heap entry"

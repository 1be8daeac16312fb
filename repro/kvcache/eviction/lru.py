"""L-LRU, SGLang's default: evict the least recently used evictable leaf."""

from __future__ import annotations

import heapq

from repro.kvcache.eviction.base import EvictionPolicy


def _lru_valid(entry_stamp: int, node) -> bool:
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
    backends = frozenset({"sim", "sglang", "theory"})

    def __init__(self) -> None:
        super().__init__()
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

    def new_node(self, node, marked):  # = leaf_added, without the base class's extra call
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
        if len(heap) > 2 * self.cache.num_nodes() + 1024:
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
            if r < node.n:
                cache.truncate_leaf(node, r)
                heapq.heappush(heap, (node.stamp, node))
            else:
                cache.evict_leaf(node)
            evicted += r
        return evicted, None

    def check(self):
        live = {id(n) for s, n in self.heap if _lru_valid(s, n)} | {id(n) for n in self.dirty}
        for node in self.cache.iter_evictable_leaves():
            assert id(node) in live, "LRU: an evictable leaf has no valid heap entry"

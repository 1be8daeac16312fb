"""SGLang 0.5.23's hit-count eviction policies `lfu` and `slru` (its `--radix-eviction-policy`).

SGLang keys every evictable leaf by its strategy's `get_priority(node)` and evicts the smallest
(sglang/srt/mem_cache/evict_policy.py): `lfu` = (hit_count, last_access_time), `slru` =
(hit_count >= protected_threshold, last_access_time), protected_threshold 2 by default. The hit
count (radix_cache.py) moves on inserts only, never on a match: an insert adds 1 to every node
of its path that ends past the request's `inserted_len` (what the same request inserted before:
0 for its first chunk, the previous chunk's end after, the prompt's length at the finish) and to
the node it appends; a split copies the count to the new upper node. The recency part is our
node stamp, the order SGLang's `last_access_time` gives (tests/sglang/test_parity.py for LRU;
tests/sglang/test_parity_policies.py for these two). Counts live in `node.state` (an int).
"""

from __future__ import annotations

import heapq

from repro.kvcache.eviction.base import EvictionPolicy


class HitCountEviction(EvictionPolicy):
    """A lazy min-heap of (key(node), node) over evictable leaves, key from (hit count, stamp).

    As LRUEviction's heap: touched / new leaves wait in `dirty` and are pushed at the next
    `evict`; an entry is stale (skipped when popped) unless its node is still an evictable leaf
    with the same key. A count changes only on an insert, which also touches the node, so a
    changed key is always re-pushed. Token granularity evicts from the popped leaf as LRU does:
    its remaining tokens keep its count and are older, so it stays the minimum.
    """

    def __init__(self) -> None:
        super().__init__()
        self.heap: list = []
        self.dirty: list = []

    def key(self, node) -> tuple:  # pragma: no cover - abstract
        raise NotImplementedError

    def _file(self, node) -> None:
        if not node.hdirty:
            node.hdirty = True
            self.dirty.append(node)

    def touch(self, node):
        if not node.hdirty and not node.children and node.lock_ref == 0:
            node.hdirty = True
            self.dirty.append(node)

    def leaf_added(self, node):
        self._file(node)

    def new_node(self, node, marked):
        self._file(node)

    def split(self, upper, lower):
        upper.state = lower.state  # SGLang's _split_node: new_node.hit_count = child.hit_count

    def inserted(self, path, inserted_len, new):
        for node in path:
            if node.depth > inserted_len:
                node.state = (node.state or 0) + 1
        if new is not None:
            new.state = (new.state or 0) + 1

    def _valid(self, entry_key, node) -> bool:
        return node.parent is not None and node.lock_ref == 0 and not node.children and self.key(node) == entry_key

    def _flush(self) -> None:
        heap = self.heap
        for node in self.dirty:
            node.hdirty = False
            if node.parent is not None and not node.children and node.lock_ref == 0:
                heapq.heappush(heap, (self.key(node), node))
        self.dirty = []
        if len(heap) > 2 * self.cache.num_nodes() + 1024:
            heap[:] = [(self.key(n), n) for n in self.cache.iter_evictable_leaves()]
            heapq.heapify(heap)

    def evict(self, need):
        cache = self.cache
        token = cache.granularity == "token"
        evicted = 0
        while evicted < need:
            if self.dirty:  # includes parents that just became leaves
                self._flush()
            heap = self.heap
            node = None
            while heap:
                k, cand = heapq.heappop(heap)
                if self._valid(k, cand):
                    node = cand
                    break
            if node is None:
                break
            r = min(node.n, need - evicted) if token else node.n
            if r < node.n:
                cache.truncate_leaf(node, r)
                heapq.heappush(heap, (self.key(node), node))
            else:
                cache.evict_leaf(node)
            evicted += r
        return evicted, None

    def check(self):
        live = {id(n) for k, n in self.heap if self._valid(k, n)} | {id(n) for n in self.dirty}
        for node in self.cache.iter_evictable_leaves():
            assert id(node) in live, f"{self.name}: an evictable leaf has no valid heap entry"


class LFUEviction(HitCountEviction):
    """SGLang's `lfu`: the evictable leaf with the fewest hits goes first, the least recent among equals."""

    name = "lfu"
    backends = frozenset({"sim", "sglang"})

    def key(self, node) -> tuple:
        return (node.state or 0, node.stamp)


class SLRUEviction(HitCountEviction):
    """SGLang's `slru`: leaves hit fewer than `protected_threshold` times (probationary) go before
    the others (protected), LRU inside each segment."""

    name = "slru"
    backends = frozenset({"sim", "sglang"})

    def __init__(self, protected_threshold: int = 2) -> None:
        if isinstance(protected_threshold, bool) or not isinstance(protected_threshold, int):
            raise ValueError(f"slru: protected_threshold must be an int, got {protected_threshold!r}")
        super().__init__()
        self.protected_threshold = protected_threshold

    def key(self, node) -> tuple:
        return (1 if (node.state or 0) >= self.protected_threshold else 0, node.stamp)

    def stats(self) -> dict:
        return {"policy": self.name, "protected_threshold": self.protected_threshold}

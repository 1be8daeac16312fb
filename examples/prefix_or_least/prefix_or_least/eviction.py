"""Evict the oldest evictable leaf (by creation), or with probability `p_random` a uniformly
random one: FIFO on leaves with a dose of RLT's randomness."""

from __future__ import annotations

import numpy as np

from repro.kvcache.eviction.base import EvictionPolicy


class OldestOrRandomEviction(EvictionPolicy):
    """Each victim: with probability `p_random` a uniform draw among the evictable leaves (in
    creation order), else the leaf created first. A node's creation number lives in the node's
    policy slot, `node.state`; a split's upper half takes its lower half's number."""

    name = "oldest_or_random"
    backends = frozenset({"sim", "theory"})
    randomized = True

    def __init__(self, seed: "int | np.random.Generator" = 0, p_random: float = 0.1) -> None:
        super().__init__()
        if not 0.0 <= p_random <= 1.0:
            raise ValueError(f"p_random must be in [0, 1], got {p_random!r}")
        self.p_random = float(p_random)
        self.rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        self.created = 0

    @classmethod
    def create(cls, seed=0, trace=None, **params):
        return cls(seed, **params)

    def new_node(self, node, marked):
        node.state = self.created
        self.created += 1

    def split(self, upper, lower):
        upper.state = lower.state

    def evict(self, need):
        cache = self.cache
        evicted = 0
        while evicted < need:
            leaves = sorted(cache.iter_evictable_leaves(), key=lambda n: n.state)
            if not leaves:
                break
            if self.p_random and self.rng.random() < self.p_random:
                node = leaves[int(self.rng.integers(len(leaves)))]
            else:
                node = leaves[0]
            r = min(node.n, need - evicted) if cache.granularity == "token" else node.n
            if r < node.n:
                cache.truncate_leaf(node, r)
            else:
                cache.evict_leaf(node)
            evicted += r
        return evicted, None

"""RLT as the paper's authors shipped it (KVRouting, commit fc3b2a1): phases, marks and victims.

Our reconstruction from the paper's text is `repro.kvcache.RLTEviction` (rlt.py); this is the
rule set of their `RandomRadixCache` (sglang 0.4.6 patch: mem_cache/radix_cache_lrt.py and its
Cython loop cy_evict.pyx), rewritten in our words on our tree. docs/ALGORITHMS.md, "RLT as
shipped", lists the rules one by one with the file each was read from.

* Phase limit: the cache's capacity (their KV pool size).
* Marks are per node: an insert marks every node on its path (cached prefix, split node, new
  leaf); a match marks nothing, except the upper part of a node it splits (when the split node
  was unmarked; a marked node's two parts stay marked). Marks are counted in tokens.
* A node newly marked while `marked_count >= limit` starts a new phase that keeps that node's
  path root..node marked (the count is that path's length).
* `evict(n)`: a new phase first if `n + marked_count >= limit` (ahead of need, while unmarked
  leaves may remain); then the candidates are the unmarked, unlocked leaves in the order of a
  depth-first walk (children in insertion order, the last one visited first); if there are none
  or they hold fewer than n tokens, another new phase and a fresh walk. Then n draws: each picks
  a candidate uniformly (`random.Random.randrange` over a swap-remove list, their order kept so
  a draw lands on the same leaf as theirs) and evicts ONE token from its tail; a leaf emptied
  this way is removed and its parent joins the candidates if it is unmarked, unlocked and now
  childless. No LRU fallback: a marked token is never evicted. With no candidate left the call
  returns what it evicted (possibly fewer than n, even 0); the caller then cannot allocate.

The RNG is Python's Mersenne Twister (`random.Random`), theirs, seeded from the cell seed (theirs
is unseeded): with the same seed and the same calls, the same draws land on the same leaves.
Granularity does not apply: every draw evicts one token, at either cache granularity.
"""

from __future__ import annotations

import random
from typing import ClassVar

import numpy as np

from repro.kvcache.eviction.base import EvictionPolicy


def python_rng(seed: "int | np.random.Generator") -> random.Random:
    """A `random.Random` seeded from a cell seed (an int) or drawn from a numpy Generator."""
    if isinstance(seed, np.random.Generator):
        seed = int(seed.integers(0, 2**63))
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"rlt_shipped: seed must be an int or a numpy Generator, got {seed!r}")
    return random.Random(int(seed))


def _randrange_is_getrandbits() -> bool:
    """Whether `Random.randrange(n)` is getrandbits(n.bit_length()) until below n (CPython's
    `_randbelow_with_getrandbits`), checked on a sample: then evict draws so, a call cheaper."""
    a, b = random.Random(12345), random.Random(12345)
    for n in [1, 2, 3, 4, 5, 7, 8, 9, 255, 256, 257, 1000, 4096, 65535, 65537, 10**6, 2**31 - 1] * 20:
        k = n.bit_length()
        r = b.getrandbits(k)
        while r >= n:
            r = b.getrandbits(k)
        if a.randrange(n) != r:
            return False
    return a.getstate() == b.getstate()


_INLINE_DRAWS = _randrange_is_getrandbits()


class RLTShippedEviction(EvictionPolicy):
    """RLT as shipped (module docstring). Counters: `resets` (new phases), `evicted_tokens`,
    `short_evictions` (calls that evicted fewer tokens than asked)."""

    name = "rlt_shipped"
    backends = frozenset({"sim", "sglang"})  # sglang: repro.backends.sglang.rlt_patch
    randomized = True
    # RadixCache reads this: a match touches (marks) only the upper part of a node it splits
    match_touches_split_only: ClassVar[bool] = True

    def __init__(self, seed: "int | np.random.Generator" = 0):
        super().__init__()
        self.rng = python_rng(seed)
        self.phase = 1  # a node is marked iff node.mark == phase (new nodes have mark 0)
        self.marked_count = 0
        self.limit = 0
        self.resets = 0
        self.evicted_tokens = 0
        self.short_evictions = 0

    @classmethod
    def create(cls, seed=0, trace=None, **params):
        return cls(seed, **params)

    def _attach(self, cache) -> None:
        super()._attach(cache)
        self.limit = cache.capacity_tokens

    @property
    def phases(self) -> int:
        return self.resets + 1

    # -- marks
    def touch(self, node) -> None:
        if node.mark != self.phase:
            node.mark = self.phase
            self.marked_count += node.n
            if self.marked_count >= self.limit:
                self.new_phase(keep=node)

    def restamp(self, node) -> None:
        pass  # recency only (the base class would touch, i.e. mark)

    def new_node(self, node, marked) -> None:
        if not marked:  # process_path's unmarked run: a verb this policy does not support
            raise ValueError("rlt_shipped runs on the bulk verbs (match_prefix / insert), not process_path")
        self.touch(node)

    def new_phase(self, keep=None) -> None:
        """Clear every mark; `keep`: a node whose path root..node stays marked."""
        self.phase += 1
        self.marked_count = 0
        self.resets += 1
        if keep is not None:
            root = self.cache.root
            phase = self.phase
            while keep is not root:
                keep.mark = phase
                self.marked_count += keep.n
                keep = keep.parent

    # -- eviction
    def candidates(self) -> tuple[list, int]:
        """Unmarked unlocked leaves in their walk order, and their tokens."""
        root = self.cache.root
        phase = self.phase
        out = []
        tokens = 0
        stack = [root]
        pop, extend, append = stack.pop, stack.extend, out.append
        while stack:
            node = pop()
            if node.children:
                extend(node.children.values())
            elif node is not root and node.mark != phase and node.lock_ref <= 0:
                append(node)
                tokens += node.n
        return out, tokens

    def evict(self, need):
        if need + self.marked_count >= self.limit:
            self.new_phase()
        leaves, tokens = self.candidates()
        if not leaves or tokens < need:
            self.new_phase()
            leaves, tokens = self.candidates()
        cache = self.cache
        root = cache.root
        phase = self.phase
        draw = self.rng.randrange
        size = len(leaves)
        done = 0
        if cache.debug_on_evict is None and cache.eviction_log is None:
            done = self._draw_batched(leaves, size, need, draw if not _INLINE_DRAWS else None)
            size = 0  # the loop below is the one-token-at-a-time form (its log sees each token)
        while size and done < need:
            i = draw(size)
            leaf = leaves[i]
            size -= 1
            leaves[i] = leaves[size]
            done += 1
            if leaf.n > 1:
                cache.truncate_leaf(leaf, 1)
                leaves[size] = leaf
                size += 1
                continue
            parent = leaf.parent
            cache.evict_leaf(leaf)
            if parent is not root and parent.mark != phase and parent.lock_ref <= 0 and not parent.children:
                leaves[size] = parent
                size += 1
        self.evicted_tokens += done
        if done < need:
            self.short_evictions += 1
        return done, None

    def _draw_batched(self, leaves: list, size: int, need: int, draw) -> int:
        """`evict`'s draws with the one-token cuts of a leaf that stays counted and made at the end,
        one `truncate_leaves` call: the same draws, victims and final tree (nothing reads a leaf's
        length in between but this loop, through `pending`)."""
        cache = self.cache
        root = cache.root
        phase = self.phase
        pending: dict = {}  # leaf -> tokens cut from its tail so far
        done = 0
        bits = self.rng.getrandbits
        while size and done < need:
            if draw is None:  # randrange(size) as CPython computes it (checked at import: _INLINE_DRAWS)
                k = size.bit_length()
                i = bits(k)
                while i >= size:
                    i = bits(k)
            else:
                i = draw(size)
            leaf = leaves[i]
            size -= 1
            leaves[i] = leaves[size]
            done += 1
            k = pending.get(leaf, 0)
            if leaf.n - k > 1:
                pending[leaf] = k + 1
                leaves[size] = leaf
                size += 1
                continue
            if k:
                del pending[leaf]
            parent = leaf.parent
            cache.evict_leaf(leaf)  # all its tokens: the k cut ones and the last
            if parent is not root and parent.mark != phase and parent.lock_ref <= 0 and not parent.children:
                leaves[size] = parent
                size += 1
        if pending:
            cache.truncate_leaves(list(pending), list(pending.values()))
        return done

    def stats(self):
        return {
            "policy": self.name,
            "rlt_phases": self.phases,
            "rlt_resets": self.resets,
            "rlt_marked_tokens": self.marked_count,
            "rlt_evicted_tokens": self.evicted_tokens,
            "rlt_short_evictions": self.short_evictions,
        }

    def check(self):
        marked = sum(node.n for node in self.cache.iter_nodes() if node.mark == self.phase)
        assert marked == self.marked_count, f"rlt_shipped: marked_count {self.marked_count} != {marked}"

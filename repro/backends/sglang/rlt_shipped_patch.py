"""RLT as shipped (`rlt_shipped`) inside SGLang 0.5.23's RadixCache: the strategy and its eviction.

The rules are those of `repro.kvcache.RLTShippedEviction` (the authors' RandomRadixCache; module
docstring there, docs/ALGORITHMS.md "RLT as shipped"), applied to SGLang's own tree by the hooks
`rlt_patch` installs:

* marks: `node._rlt_phase == strategy.phase`; an insert marks its path root to leaf (after
  SGLang's insert, node by node, so a phase that starts at one node keeps that node's path); a
  match (`_match_prefix_helper`: match_prefix and touch_prefix) marks only the upper part of a
  node it split, which inherits the split node's mark like every split;
* phase limit: the KV pool's size (`token_to_kv_pool_allocator.size`, their limit);
* `evict(n)`: the two phase rules, the candidates in a depth-first walk of `children` (SGLang
  keeps them in insertion order and a split keeps its slot, as 0.4.6 did), draws from
  `random.Random(seed)`, one token per draw; trims are applied at the end of the call (as their
  Cython loop does) and an emptied leaf is deleted at once (its parent may join).
Page size 1 only (a draw evicts one token). `seed` from `--radix-eviction-policy-config
'{"seed": S}'` (the server entry point fills it from `--random-seed`); a flush restarts the
stream, so the victims depend only on the seed and the calls since the start or the last flush.
"""

from __future__ import annotations

import random
import time

import numpy as np

from repro.kvcache import RLTShippedEviction

RLT_SHIPPED_NAME = RLTShippedEviction.name  # the registry's name, not a copy


def make_strategy_class(EvictionStrategy):
    class RLTShippedStrategy(EvictionStrategy):
        """Mark state and RNG of one SGLang RadixCache under RLT as shipped (module docstring).

        Config: `seed` (int, default 0). Counters: `phase`, `resets`, `marked_tokens`,
        `evicted_tokens`, `short_evictions` (calls that evicted fewer tokens than asked)."""

        name = RLT_SHIPPED_NAME

        def __init__(self, seed: int = 0):
            if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
                raise ValueError(f"{RLT_SHIPPED_NAME}: 'seed' must be an int, got {seed!r}")
            self.seed = int(seed)
            self.clear()

        def clear(self) -> None:
            """Fresh state (a new or flushed cache): phase 1, nothing marked, the stream restarted."""
            self.rng = random.Random(self.seed)
            self.phase = 1  # nodes start with _rlt_phase 0: unmarked
            self.marked_tokens = 0
            self.resets = 0
            self.evicted_tokens = 0
            self.short_evictions = 0

        def get_priority(self, node):  # SGLang's heap is never built for this policy (see evict)
            return 0

        def touch(self, cache, node) -> None:
            if node._rlt_phase != self.phase:
                node._rlt_phase = self.phase
                self.marked_tokens += len(node.key)
                if self.marked_tokens >= pool_size(cache):
                    self.new_phase(cache, keep=node)

        def new_phase(self, cache, keep=None) -> None:
            self.phase += 1
            self.marked_tokens = 0
            self.resets += 1
            root = cache.root_node
            while keep is not None and keep is not root:
                keep._rlt_phase = self.phase
                self.marked_tokens += len(keep.key)
                keep = keep.parent

        def stats(self) -> dict:
            return {
                "rlt_phase": self.phase,
                "rlt_resets": self.resets,
                "rlt_marked_tokens": self.marked_tokens,
                "rlt_evicted_tokens": self.evicted_tokens,
                "rlt_short_evictions": self.short_evictions,
            }

    return RLTShippedStrategy


def pool_size(cache) -> int:
    size = getattr(cache.token_to_kv_pool_allocator, "size", None)
    if not isinstance(size, (int, np.integer)) or size <= 0:
        raise ValueError(f"{RLT_SHIPPED_NAME}: the phase limit is the KV pool's size, but the allocator has none")
    return int(size)


def mark_inserted(cache, strategy, last_node) -> None:
    """An insert's marks: every node root..last_node, root first."""
    path = []
    root = cache.root_node
    while last_node is not None and last_node is not root:
        path.append(last_node)
        last_node = last_node.parent
    for node in reversed(path):
        strategy.touch(cache, node)


def candidates(cache, phase: int) -> tuple[list, int]:
    root = cache.root_node
    out = []
    tokens = 0
    stack = [root]
    while stack:
        node = stack.pop()
        if node.children:
            stack.extend(node.children.values())
        elif node is not root and node._rlt_phase != phase and node.lock_ref <= 0:
            out.append(node)
            tokens += len(node.key)
    return out, tokens


def evict(cache, strategy, need: int) -> int:
    """`evict(need)` under RLT as shipped on SGLang's tree (module docstring); returns the tokens evicted."""
    if need <= 0:
        return 0
    if cache.page_size != 1:
        raise ValueError(f"{RLT_SHIPPED_NAME} evicts one token per draw: it needs --page-size 1")
    start = time.perf_counter()
    if need + strategy.marked_tokens >= pool_size(cache):
        strategy.new_phase(cache)
    leaves, tokens = candidates(cache, strategy.phase)
    if not leaves or tokens < need:
        strategy.new_phase(cache)
        leaves, tokens = candidates(cache, strategy.phase)
    phase = strategy.phase
    root = cache.root_node
    allocator = cache.token_to_kv_pool_allocator
    left = {node: len(node.key) for node in leaves}  # tokens each candidate keeps
    draw = strategy.rng.randrange
    size = len(leaves)
    done = 0
    while size and done < need:
        i = draw(size)
        leaf = leaves[i]
        size -= 1
        leaves[i] = leaves[size]
        done += 1
        r = left[leaf] - 1
        if r:
            left[leaf] = r
            leaves[size] = leaf
            size += 1
            continue
        del left[leaf]
        parent = leaf.parent
        allocator.free_segment(leaf.value, start_pos=0)
        cache._delete_leaf(leaf)
        cache.kv_events.record_remove(leaf)
        if parent is not root and parent._rlt_phase != phase and parent.lock_ref <= 0 and not parent.children:
            left[parent] = len(parent.key)
            leaves[size] = parent
            size += 1
    for node, r in left.items():
        cut = len(node.key) - r
        if cut:
            allocator.free_segment(node.value[r:], start_pos=0)
            node.key = node.key[:r]
            node.value = node.value[:r].clone()
            if node.hash_value is not None:
                node.hash_value = node.hash_value[:r]
            if node.event_hash_value is not None:
                node.event_hash_value = node.event_hash_value[:r]
            cache.evictable_size_ -= cut
    strategy.evicted_tokens += done
    if done < need:
        strategy.short_evictions += 1
    cache.update_eviction_metrics(done, start)
    return done

"""The base class of leaf-eviction policies: the hooks a `RadixCache` calls, what a policy declares.

A policy is attached to exactly one cache and keeps its own candidate structures up to date
through the cache's hooks: `touch` (a node was accessed: re-stamped / marked), `new_node`
(a fresh evictable leaf was added), `leaf_added` / `leaf_removed` (a node became / stopped
being an evictable leaf: unlocked childless node <-> locked, got a child, evicted) and
`split`. `evict(need)` removes >= need tokens through the cache's eviction verbs
(`cache.truncate_leaf(node, k)`, `cache.evict_leaf(node)`) and returns `(evicted, reset_at)`
(`reset_at`: RLT only, tokens evicted before the first phase reset of this call, so that
`process_path` can split the new run where the token-by-token model resets; None otherwise).
The granularity (node | token) is the cache's: a policy reads `self.cache.granularity`.

What a policy class declares (the registry, `repro.kvcache.eviction_policies()`, reads it):
`name` (the config's `eviction.name`), `backends` (which backends can run it, a subset of
`EVICTION_BACKENDS`), `randomized` (results depend on the seed) and `create(seed, trace,
**params)`; its __init__'s keywords are the config's parameters. Per-node state: `node.state`
(None on a new node) belongs to the cache's policy, for any policy; the built-in ones keep
their fields in dedicated slots of `Node` (radix_cache.py) because the hot loops read them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from repro.kvcache.radix_cache import Node, RadixCache
    from repro.kvcache.trace_index import TraceIndex

# Who can run a policy:
#   sim     the simulator's workers (and the emulated SGLang workers): our RadixCache, built by
#           make_cache(capacity, cfg, seed) from the config alone (an online policy)
#   sglang  the real SGLang server (SGLang's own policy, or ours patched in: repro.backends.sglang.rlt_patch)
#   theory  the trace replayer (repro.kvcache.replay) and the competitive-ratio cells, which give
#           the policy the whole trace up front (offline policies run here only)
EVICTION_BACKENDS: tuple[str, ...] = ("sim", "sglang", "theory")


class EvictionPolicy:
    """Base class: one instance per cache (it holds that cache's candidate structures).

    A subclass that sets its own `name` in a module of `repro.kvcache.eviction` is a
    registered policy (found by name from every backend); one without is a helper.
    """

    name: ClassVar[str | None] = None
    backends: ClassVar[frozenset[str]] = frozenset()
    randomized: ClassVar[bool] = False  # True: the seed changes results (the theory cells average seeds)

    def __init__(self) -> None:
        self.cache: RadixCache | None = None

    @classmethod
    def create(
        cls, seed: "int | np.random.Generator" = 0, trace: "TraceIndex | None" = None, **params
    ) -> "EvictionPolicy":
        """One instance for one cache. `seed`: randomized policies; `trace`: the whole future
        trace, given by the replayer only (an offline policy raises ValueError without it);
        `params`: the config's other keys, the keywords of __init__ (checked before any work by
        check_eviction_config). A randomized policy overrides this to pass `seed` on."""
        return cls(**params)

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

    def restamp(self, node: "Node") -> None:
        """`node.stamp` moved without an access (SGLang's split rule): recency only, never marks."""
        self.touch(node)

    def inserted(self, path: list, inserted_len: int, new: "Node | None") -> None:
        """An insert accessed `path` (root to leaf; `new`: the uncached run it added, or None).
        `inserted_len`: how much of this path the inserting request had inserted before (SGLang's
        `InsertParams.inserted_len`; lfu / slru count a hit on the nodes that end past it)."""

    def begin_path(self, j: int) -> None:
        """The replayer is about to process path j of its trace (offline policies track it)."""

    def evict(self, need: int) -> tuple[int, int | None]:  # pragma: no cover - abstract
        raise NotImplementedError

    def stats(self) -> dict:
        return {"policy": self.name}

    def check(self) -> None:
        pass

"""The KV-cache contract every cache implementation meets: the simulator's workers, the routers'
trackers and the replayer call only these verbs (SGLang's RadixCache names)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


class Matched(Protocol):
    """What `match_prefix` returns (RadixCache: `MatchResult`)."""

    @property
    def length(self) -> int: ...  # matched tokens

    @property
    def last_node(self) -> Any: ...  # the node ending exactly at the match boundary (the root if none)


class Inserted(Protocol):
    """What `insert` returns (RadixCache: `InsertResult`)."""

    @property
    def prefix_len(self) -> int: ...  # tokens that were cached already

    @property
    def last_node(self) -> Any: ...  # the node ending at the end of the inserted tokens


@runtime_checkable
class KVCache(Protocol):
    """`tokens`: an int32 numpy array, a sequence of ints, or bytes of packed int32 (repro.kvcache.keys).

    A node handle (`last_node`) stays valid while it is locked; an unlocked one may be split, truncated
    or evicted.
    """

    @property
    def capacity_tokens(self) -> int: ...

    def match_prefix(self, tokens: Any) -> Matched:
        """Longest cached prefix. An access: the matched tokens are stamped (LRU)
        and marked (RLT); the node holding the match boundary is split so `last_node` ends there."""
        ...

    def peek_prefix(self, tokens: Any) -> int:
        """Longest cached prefix, read-only: no split, no stamp, no mark (what routers call)."""
        ...

    def insert(self, tokens: Any) -> Inserted:
        """An access of every token (cached ones re-stamped / marked, new ones added). Never evicts (the caller makes room with `evict` first, SGLang's contract); raises
        CapacityError if the new tokens exceed `free_tokens()`."""
        ...

    def inc_lock_ref(self, node: Any) -> int:
        """Lock the path root..node (locked tokens are never evicted); the change of protected_size()."""
        ...

    def dec_lock_ref(self, node: Any) -> int:
        """Unlock the path root..node; the change of protected_size() (<= 0)."""
        ...

    def evict(self, num_tokens: int) -> int:
        """Evict at least `num_tokens` evictable leaf tokens chosen by the policy (token granularity:
        exactly; node granularity: whole leaf nodes, may overshoot); the number evicted (fewer only if
        nothing more is evictable)."""
        ...

    def evictable_size(self) -> int: ...

    def protected_size(self) -> int: ...

    def total_size(self) -> int: ...

    def free_tokens(self) -> int: ...

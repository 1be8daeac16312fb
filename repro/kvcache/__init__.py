"""Radix-tree KV cache with pluggable leaf eviction (ALGORITHMS.md §2).

The contract the simulator, the routers' trackers and the replayer use is `KVCache`
(repro/kvcache/protocol.py, a typing.Protocol; RadixCache and the tests' caches meet it):

    cache = make_cache(capacity_tokens, {"name": "rlt", "granularity": "node"}, seed)
        (or RadixCache(capacity_tokens, eviction=RLTEviction(seed), granularity="node"))
    match_prefix / peek_prefix / insert / inc_lock_ref / dec_lock_ref / evict,
    evictable_size / protected_size / total_size / free_tokens, capacity_tokens

`tokens` is an int32 numpy array, a sequence of ints, or bytes of packed int32 (the
internal key format; key comparison runs in C on bytes, never token by token in Python).

Policies (repro/kvcache/eviction/, one module each; the registry `eviction_policies()` maps
`eviction.name` -> class, each class declaring `name` and `backends`): `LRUEviction` (leaf
LRU), `RLTEviction` (marking algorithm on leaves) and `OPTEviction` (offline Belady, built by
the replayer / theory code from a `TraceIndex` of the whole trace); a policy outside this
package is named by `_target_` (docs/EXTENDING.md). A conf/eviction/*.yaml (`_target_`,
`name`, `granularity`, and the class's constructor parameters) builds a cache with
`make_cache(capacity_tokens, cfg, seed)`; `check_eviction_config(cfg, backend)` lists what is
wrong with one (unknown name, granularity, parameters, or a backend that cannot run it). The granularity is the cache's; policies
evict through `cache.truncate_leaf(node, k)` / `cache.evict_leaf(node)`. `cache.stats()`
returns the counters (evicted tokens, RLT phases, RLT random-vs-fallback evictions).
`cache.process_path(tokens)` is the paper's token-by-token path model (the replayer's step).
Keys: `as_key(tokens) -> bytes` is THE token-key function of the project, with
`key_to_tokens` and the prefix comparator `common_prefix_len` (repro/kvcache/keys.py).
Errors: `CapacityError` (tokens do not fit), `ValueError` (bad arguments).
"""

from repro.kvcache.eviction import (
    EVICTION_BACKENDS,
    EvictionPolicy,
    LFUEviction,
    LRUEviction,
    OPTEviction,
    RLTEviction,
    RLTShippedEviction,
    SLRUEviction,
    check_eviction_config,
    eviction_policies,
    make_cache,
    make_eviction,
)
from repro.kvcache.keys import as_key, common_prefix_len, key_to_tokens
from repro.kvcache.protocol import KVCache
from repro.kvcache.radix_cache import (
    GRANULARITIES,
    CapacityError,
    InsertResult,
    MatchResult,
    Node,
    PathResult,
    RadixCache,
)
from repro.kvcache.trace_index import TraceIndex

__all__ = [
    "EVICTION_BACKENDS",
    "GRANULARITIES",
    "CapacityError",
    "EvictionPolicy",
    "InsertResult",
    "KVCache",
    "LFUEviction",
    "LRUEviction",
    "MatchResult",
    "Node",
    "OPTEviction",
    "PathResult",
    "RLTEviction",
    "RLTShippedEviction",
    "RadixCache",
    "SLRUEviction",
    "TraceIndex",
    "as_key",
    "check_eviction_config",
    "common_prefix_len",
    "eviction_policies",
    "key_to_tokens",
    "make_cache",
    "make_eviction",
]

"""Radix-tree KV cache with pluggable leaf eviction (ALGORITHMS.md §2).

Contract used by the simulator, the routers' trackers and the replayer (fixed here so
that separately written parts fit; the implementation lives in this package):

    cache = RadixCache(capacity_tokens, eviction=make_eviction({"name": "rlt"}, seed), granularity="node")
    cache.match_prefix(tokens) -> MatchResult(length: int, last_node)
        An access: matched tokens are stamped (LRU) and marked (RLT); the node holding the
        match boundary is split so that `last_node` ends exactly there.
    cache.peek_prefix(tokens) -> int
        Read-only longest cached prefix: no split, no stamp, no mark (routers use it).
    cache.insert(tokens) -> InsertResult(prefix_len: int, last_node)
        An access of every token of `tokens` (cached ones re-stamped/marked, new ones added).
        Never evicts: the caller makes room first with `evict` (SGLang's contract); raises
        CapacityError if the new tokens do not fit in `free_tokens()`.
    cache.inc_lock_ref(node) / cache.dec_lock_ref(node) -> int
        Lock / unlock the path root..node (locked tokens are never evicted); returns the
        change of protected_size().
    cache.evict(num_tokens) -> int
        Evict at least `num_tokens` evictable leaf tokens chosen by the policy (token
        granularity: exactly; node granularity: whole leaf nodes, may overshoot); returns
        the number evicted (fewer only if nothing more is evictable).
    cache.evictable_size(), cache.protected_size(), cache.total_size(), cache.free_tokens()
    cache.capacity_tokens

`tokens` is an int32 numpy array, a sequence of ints, or bytes of packed int32 (the
internal key format; key comparison runs in C on bytes, never token by token in Python).
"""

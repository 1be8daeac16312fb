"""SGLang 0.5.23's RadixCache behind repro.kvcache's verbs, and the request sequence both trees run.

Used by the `sglang` tests and tests/benchmarks/bench_sglang.py (run with the CPU env's python,
from the repo root). Nothing here changes SGLang: `SGLangTree` only adds the token capacity
SGLang's tree does not have (SGLang's scheduler checks the allocator's free slots and calls
`evict`; here `free_tokens()` plays that role) and converts token sequences to `RadixKey`s.
"""

from __future__ import annotations

import itertools
from array import array
from types import SimpleNamespace

import numpy as np


def import_sglang() -> SimpleNamespace:
    """SGLang's radix-cache API (CPU shims installed first). ImportError if SGLang is missing."""
    from repro.backends.sglang import cpu_shims

    cpu_shims.install()
    import sglang
    import torch
    from sglang.srt.mem_cache import radix_cache
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    return SimpleNamespace(
        version=sglang.__version__,
        torch=torch,
        radix_cache=radix_cache,
        RadixCache=radix_cache.RadixCache,
        RadixKey=radix_cache.RadixKey,
        TreeNode=radix_cache.TreeNode,
        CacheInitParams=CacheInitParams,
        EvictParams=EvictParams,
        InsertParams=InsertParams,
        MatchPrefixParams=MatchPrefixParams,
    )


class MockAllocator:
    """The allocator stand-in SGLang's `evict` needs: `device` and `free_segment(value, start_pos=0)`."""

    def __init__(self, torch):
        self.device = torch.device("cpu")
        self.freed_tokens = 0

    def free_segment(self, value, start_pos: int = 0) -> None:
        self.freed_tokens += len(value) - start_pos


class CounterClock:
    """Stand-in for the `time` module inside sglang's radix_cache: `monotonic()` counts 1, 2, 3, ...

    SGLang stamps recency with `time.monotonic()`; two accesses in the same clock tick would tie
    and the LRU order between them would depend on heap internals. Tests swap this in (see
    `deterministic_clock`) so that the order is the order of calls, as in our tree.
    """

    def __init__(self, real_time):
        self._real = real_time
        self._count = itertools.count(1)

    def monotonic(self) -> float:
        return float(next(self._count))

    def __getattr__(self, name):  # perf_counter (eviction metrics) etc.: the real ones
        return getattr(self._real, name)


class deterministic_clock:
    """Context manager: SGLang's radix_cache uses `CounterClock` inside the block."""

    def __init__(self, sg: SimpleNamespace):
        self.sg = sg

    def __enter__(self):
        self._saved = self.sg.radix_cache.time
        self.sg.radix_cache.time = CounterClock(self._saved)
        return self

    def __exit__(self, *exc):
        self.sg.radix_cache.time = self._saved
        return False


class SGLangTree:
    """One SGLang RadixCache (page_size 1) with a token capacity and our verb signatures.

    policy "lru": `RadixCache.create_simulated(mock_allocator=...)` exactly (SGLang's default);
    other policies: the same constructor path with `eviction_policy` set (create_simulated has
    no policy argument). Keys: int sequences / numpy arrays; `key_of` converts once.
    """

    def __init__(self, sg: SimpleNamespace, capacity_tokens: int, policy: str = "lru", seed: int = 0):
        self.sg = sg
        self.capacity_tokens = int(capacity_tokens)
        self.allocator = MockAllocator(sg.torch)
        if policy == "lru":
            self.cache = sg.RadixCache.create_simulated(mock_allocator=self.allocator)
        else:
            params = sg.CacheInitParams(
                disable=False,
                req_to_token_pool=None,
                token_to_kv_pool_allocator=self.allocator,
                page_size=1,
                eviction_policy=policy,
                eviction_policy_config={"seed": seed} if policy == "rlt" else None,
            )
            self.cache = sg.RadixCache(params)
        self.root = self.cache.root_node

    @staticmethod
    def key_of(tokens) -> array:
        return array("q", np.asarray(tokens, dtype=np.int64).tobytes())

    def value_of(self, tokens):
        """KV slot indices stand-in (SGLang's scheduler passes the request's kv indices tensor)."""
        return self.sg.torch.from_numpy(np.asarray(tokens, dtype=np.int64).copy())

    def _key(self, tokens):
        return self.sg.RadixKey(tokens if isinstance(tokens, array) else self.key_of(tokens))

    # -- our verbs
    def match_prefix(self, tokens):
        r = self.cache.match_prefix(self.sg.MatchPrefixParams(key=self._key(tokens)))
        return r.device_prefix_len, r.last_device_node

    def insert(self, tokens, value=None):
        r = self.cache.insert(self.sg.InsertParams(key=self._key(tokens), value=value))
        return r.prefix_len, r.last_device_node

    def inc_lock_ref(self, node) -> int:
        return self.cache.inc_lock_ref(node).delta

    def dec_lock_ref(self, node) -> int:
        return self.cache.dec_lock_ref(node).delta

    def evict(self, num_tokens: int) -> int:
        return self.cache.evict(self.sg.EvictParams(num_tokens=int(num_tokens))).num_tokens_evicted

    def evictable_size(self) -> int:
        return self.cache.evictable_size()

    def protected_size(self) -> int:
        return self.cache.protected_size()

    def total_size(self) -> int:
        """O(1): evictable + protected (the tests check it against SGLang's O(n) `total_size()`)."""
        return self.cache.evictable_size_ + self.cache.protected_size_

    def free_tokens(self) -> int:
        return self.capacity_tokens - self.total_size()

    def iter_nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())


class OursTree:
    """repro.kvcache.RadixCache with the same call shapes as SGLangTree (for shared drivers)."""

    def __init__(self, capacity_tokens: int, policy: str = "lru", seed: int = 0, granularity: str = "node"):
        from repro.kvcache import make_cache

        self.capacity_tokens = int(capacity_tokens)
        self.cache = make_cache(capacity_tokens, {"name": policy, "granularity": granularity}, seed)

    @staticmethod
    def key_of(tokens) -> bytes:
        from repro.kvcache import as_key

        return as_key(np.asarray(tokens, dtype=np.int64))

    def value_of(self, tokens):
        return None

    def match_prefix(self, key):
        r = self.cache.match_prefix(key)
        return r.length, r.last_node

    def insert(self, key, value=None):
        r = self.cache.insert(key)
        return r.prefix_len, r.last_node

    def inc_lock_ref(self, node) -> int:
        return self.cache.inc_lock_ref(node)

    def dec_lock_ref(self, node) -> int:
        return self.cache.dec_lock_ref(node)

    def evict(self, num_tokens: int) -> int:
        return self.cache.evict(int(num_tokens))

    def total_size(self) -> int:
        return self.cache.total_size()

    def free_tokens(self) -> int:
        return self.cache.free_tokens()


def run_requests(tree, keys, lengths, values=None, in_flight: int = 1, on_evict=None) -> dict:
    """The simulator's per-request sequence on `tree` (SGLangTree or OursTree); returns what happened.

    Per request: m = match_prefix; lock m; evict(need) if the new tokens do not fit; insert if
    they fit now (else the request is skipped: it cannot be cached); lock the inserted path;
    unlock m. A request stays locked until `in_flight` later requests have started (1: only
    while it is processed), like concurrently running requests. `on_evict(need)` is called
    before each evict (tests use it to know the pending miss).
    Returns matched lengths, misses, evicted tokens and skipped requests.
    """
    matched = []
    evicted = 0
    skipped = 0
    locked: list = []
    for i, (key, n) in enumerate(zip(keys, lengths)):
        m, node = tree.match_prefix(key)
        matched.append(m)
        tree.inc_lock_ref(node)
        need = n - m - tree.free_tokens()
        if need > 0:
            if on_evict is not None:
                on_evict(need)
            evicted += tree.evict(need)
        if n - m <= tree.free_tokens():
            _, last = tree.insert(key, None if values is None else values[i])
            tree.inc_lock_ref(last)
            locked.append(last)
        else:
            skipped += 1
            locked.append(None)
        tree.dec_lock_ref(node)
        while len(locked) >= in_flight:
            old = locked.pop(0)
            if old is not None:
                tree.dec_lock_ref(old)
    for old in locked:
        if old is not None:
            tree.dec_lock_ref(old)
    total = int(sum(lengths))
    return {
        "matched": matched,
        "hits": int(sum(matched)),
        "misses": total - int(sum(matched)),
        "evicted": evicted,
        "skipped": skipped,
    }


def prefix_tree_trace(rng: np.random.Generator, num_requests: int, *, branching: int = 3, depth: int = 4,
                      segment_tokens: tuple[int, int] = (1, 6), vocab: int = 5) -> list[np.ndarray]:
    """Random paths through a random prefix tree: shared prefixes of many lengths, small vocab
    (so that matches end inside nodes and splits happen often)."""
    children: dict[tuple, list[np.ndarray]] = {}

    def segments(prefix: tuple) -> list[np.ndarray]:
        if prefix not in children:
            lo, hi = segment_tokens
            children[prefix] = [rng.integers(0, vocab, size=int(rng.integers(lo, hi + 1))) for _ in range(branching)]
        return children[prefix]

    out = []
    for _ in range(num_requests):
        path: list[np.ndarray] = []
        ids: tuple = ()
        for _level in range(int(rng.integers(1, depth + 1))):
            j = int(rng.integers(0, branching))
            path.append(segments(ids)[j])
            ids = ids + (j,)
        out.append(np.concatenate(path).astype(np.int64))
    return out

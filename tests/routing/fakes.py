"""Test doubles for the routers: a request builder, a linear cost model, an obviously-right
token-level LRU cache with the repro.kvcache contract, and a WorkerView over it.

The cache stores every cached token as its path prefix (a tuple) -> last access stamp, so
its behaviour can be read off directly; it is quadratic and only for small tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from repro.workloads.request import Request


def make_request(
    rid: int,
    tokens,
    output_len: int = 4,
    text: str | None = None,
    arrival_s: float = 0.0,
    group_id: int = 0,
) -> Request:
    prompt = np.asarray(tokens, dtype=np.int32)
    generated = (np.arange(output_len, dtype=np.int32) + 1_000_000 + 17 * rid).astype(np.int32)
    return Request(
        id=rid,
        arrival_s=arrival_s,
        prompt_tokens=prompt,
        output_len=output_len,
        generated_tokens=generated,
        group_id=group_id,
        conversation_id=rid,
        turn=0,
        text=text,
    )


@dataclass
class LinearCostModel:
    """prefill = prefill_base_s + per_new_s * new + per_new_cached_s * new * cached; decode = decode_base_s + per_batch_s * batch."""

    prefill_base_s: float = 0.01
    per_new_s: float = 1e-4
    per_new_cached_s: float = 0.0
    decode_base_s: float = 0.02
    per_batch_s: float = 0.001

    def prefill_time_s(self, new_tokens: int, cached_tokens: int = 0) -> float:
        return self.prefill_base_s + self.per_new_s * new_tokens + self.per_new_cached_s * new_tokens * cached_tokens

    def decode_time_s(self, batch: int, context_tokens: int) -> float:
        return self.decode_base_s + self.per_batch_s * batch

    def step_time_s(self, prefill_tokens, prefill_attn_work, decode_batch, decode_context_tokens) -> float:
        return self.prefill_base_s + self.per_new_s * prefill_tokens + self.decode_time_s(decode_batch, 0)


class MatchResult(NamedTuple):
    length: int
    last_node: tuple


class InsertResult(NamedTuple):
    prefix_len: int
    last_node: tuple


class CapacityError(RuntimeError):
    pass


def _as_tuple(tokens) -> tuple:
    if isinstance(tokens, (bytes, bytearray)):
        return tuple(np.frombuffer(tokens, dtype="<i4").tolist())
    return tuple(int(t) for t in np.asarray(tokens).tolist())


class SimpleLRUCache:
    """Token-granularity leaf LRU with locks; contract of repro.kvcache.RadixCache."""

    def __init__(self, capacity_tokens: int, eviction_cfg: dict | None = None, seed: int = 0) -> None:
        self.capacity_tokens = int(capacity_tokens)
        self.eviction_cfg = dict(eviction_cfg or {"name": "lru"})
        self.seed = seed
        self.stamp: dict[tuple, int] = {}  # cached prefix (one token each) -> last access
        self.children: dict[tuple, int] = {}  # prefix -> number of cached one-token extensions
        self.locks: dict[tuple, int] = {}
        self.clock = 0
        self.calls: list[str] = []
        # called as (path key of the evicted token, tokens kept on that path) before each eviction
        # (the contract of repro.routing.trackers.listen_evictions)
        self.eviction_listener = None

    def _longest(self, key: tuple) -> int:
        n = 0
        while n < len(key) and key[: n + 1] in self.stamp:
            n += 1
        return n

    def peek_prefix(self, tokens) -> int:
        self.calls.append("peek_prefix")
        return self._longest(_as_tuple(tokens))

    def match_prefix(self, tokens) -> MatchResult:
        self.calls.append("match_prefix")
        key = _as_tuple(tokens)
        n = self._longest(key)
        self.clock += 1
        for k in range(1, n + 1):
            self.stamp[key[:k]] = self.clock
        return MatchResult(n, key[:n])

    def insert(self, tokens) -> InsertResult:
        self.calls.append("insert")
        key = _as_tuple(tokens)
        n = self._longest(key)
        if len(key) - n > self.free_tokens():
            raise CapacityError(f"{len(key) - n} new tokens, {self.free_tokens()} free")
        self.clock += 1
        for k in range(1, len(key) + 1):
            p = key[:k]
            if p not in self.stamp:
                self.children[p[:-1]] = self.children.get(p[:-1], 0) + 1
            self.stamp[p] = self.clock
        return InsertResult(n, key)

    def _locked(self, p: tuple) -> bool:
        return any(lock[: len(p)] == p and c > 0 for lock, c in self.locks.items() if len(lock) >= len(p))

    def inc_lock_ref(self, node: tuple) -> int:
        self.locks[node] = self.locks.get(node, 0) + 1
        return 0

    def dec_lock_ref(self, node: tuple) -> int:
        self.locks[node] -= 1
        return 0

    def evict(self, num_tokens: int) -> int:
        self.calls.append("evict")
        evicted = 0
        while evicted < num_tokens:
            leaves = [p for p in self.stamp if self.children.get(p, 0) == 0 and not self._locked(p)]
            if not leaves:
                break
            victim = min(leaves, key=lambda p: (self.stamp[p], p))
            if self.eviction_listener is not None:
                self.eviction_listener(np.array(victim, dtype="<i4").tobytes(), len(victim) - 1)
            del self.stamp[victim]
            self.children[victim[:-1]] -= 1
            evicted += 1
        return evicted

    def total_size(self) -> int:
        return len(self.stamp)

    def free_tokens(self) -> int:
        return self.capacity_tokens - len(self.stamp)

    def evictable_size(self) -> int:
        return sum(1 for p in self.stamp if not self._locked(p))

    def protected_size(self) -> int:
        return len(self.stamp) - self.evictable_size()


def simple_cache_factory(capacity_tokens: int, eviction_cfg: dict, seed: int) -> SimpleLRUCache:
    return SimpleLRUCache(capacity_tokens, eviction_cfg, seed)


@dataclass
class FakeView:
    """A WorkerView with settable fields over a SimpleLRUCache; records cache calls made through it."""

    worker_id: int
    cache: SimpleLRUCache = None
    cost_model: object = field(default_factory=LinearCostModel)
    in_flight: int = 0
    waiting: int = 0
    waiting_prefill_tokens: int = 0
    running: int = 0
    active_kv_tokens: int = 0
    kv_capacity_tokens: int = 1000
    kv_used_tokens: int = 0
    eviction_policy: str = "lru"
    view_calls: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.cache is None:
            self.cache = SimpleLRUCache(self.kv_capacity_tokens)

    def peek_prefix(self, tokens) -> int:
        self.view_calls.append("peek_prefix")
        return self.cache.peek_prefix(tokens)

    def match_prefix(self, tokens):  # a WorkerView has no access method; this spy proves it is never used
        self.view_calls.append("match_prefix")
        raise AssertionError("a router called match_prefix on a WorkerView")


def make_views(m: int, capacity: int = 1000, **kw) -> list[FakeView]:
    return [FakeView(worker_id=i, kv_capacity_tokens=capacity, **kw) for i in range(m)]

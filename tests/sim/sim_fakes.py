"""Small, obviously-right stand-ins used by the simulator tests (never by repro/ code).

- TrieCache: the kvcache contract (repro/kvcache/__init__.py) on a token-per-node trie with
  leaf-LRU eviction. Slow, but every rule is visible; it also audits itself (locked tokens are
  never evicted, inserts never exceed capacity).
- FixedCostModel: step time = a + b*prefill_tokens + c*attn_work + d*decode_batch + e*context,
  fixed coefficients, so that hand-computed scenarios have exact expected times.
- Routers: round-robin, seeded random, and a fixed assignment.
- gsp_requests: GSP-shaped requests (shared system prompt per group + question) with Poisson
  arrivals, for tests and for the benchmark until repro.workloads lands.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import numpy as np

from repro.routing.base import Router
from repro.workloads.request import Request


class CapacityError(RuntimeError):
    pass


class MatchResult(NamedTuple):
    length: int
    last_node: Any


class InsertResult(NamedTuple):
    prefix_len: int
    last_node: Any


class _Node:
    __slots__ = ("token", "parent", "children", "lock_ref", "stamp", "alive")

    def __init__(self, token: int, parent: "_Node | None"):
        self.token = token
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.lock_ref = 0
        self.stamp = 0
        self.alive = True


def _as_list(tokens: Any) -> list[int]:
    if isinstance(tokens, (bytes, bytearray, memoryview)):
        return np.frombuffer(tokens, dtype=np.int32).tolist()
    return np.asarray(tokens, dtype=np.int64).tolist()


class TrieCache:
    """Token-granularity radix cache with leaf-LRU eviction (one node per token)."""

    def __init__(self, capacity_tokens: int):
        self.capacity_tokens = int(capacity_tokens)
        self.root = _Node(-1, None)
        self._clock = 0
        self._size = 0
        self._protected = 0
        self.evicted_total = 0

    # -- lookups
    def _walk(self, toks: list[int]) -> tuple[int, _Node]:
        node = self.root
        k = 0
        for tok in toks:
            child = node.children.get(tok)
            if child is None:
                break
            node = child
            k += 1
        return k, node

    def _touch(self, node: _Node) -> None:
        path = []
        while node is not self.root:
            path.append(node)
            node = node.parent
        for nd in reversed(path):  # root to leaf, increasing stamps
            self._clock += 1
            nd.stamp = self._clock

    def peek_prefix(self, tokens: Any) -> int:
        return self._walk(_as_list(tokens))[0]

    def match_prefix(self, tokens: Any) -> MatchResult:
        k, node = self._walk(_as_list(tokens))
        self._touch(node)
        return MatchResult(k, node)

    def insert(self, tokens: Any) -> InsertResult:
        toks = _as_list(tokens)
        k, node = self._walk(toks)
        new = len(toks) - k
        if new > self.free_tokens():
            raise CapacityError(f"insert of {new} new tokens, {self.free_tokens()} free")
        for tok in toks[k:]:
            child = _Node(tok, node)
            node.children[tok] = child
            node = child
        self._size += new
        self._touch(node)
        return InsertResult(k, node)

    # -- locks
    def inc_lock_ref(self, node: _Node) -> int:
        assert node.alive, "locking an evicted node"
        delta = 0
        while node is not self.root:
            if node.lock_ref == 0:
                delta += 1
            node.lock_ref += 1
            node = node.parent
        self._protected += delta
        return delta

    def dec_lock_ref(self, node: _Node) -> int:
        assert node.alive, "unlocking an evicted node"
        delta = 0
        while node is not self.root:
            assert node.lock_ref > 0, "lock_ref underflow"
            node.lock_ref -= 1
            if node.lock_ref == 0:
                delta -= 1
            node = node.parent
        self._protected += delta
        return delta

    # -- eviction: least recently used unlocked leaf, one token at a time
    def evict(self, num_tokens: int) -> int:
        heap = []
        stack = [self.root]
        while stack:
            nd = stack.pop()
            stack.extend(nd.children.values())
            if nd is not self.root and not nd.children and nd.lock_ref == 0:
                heap.append((nd.stamp, id(nd), nd))
        heapq.heapify(heap)
        evicted = 0
        while evicted < num_tokens and heap:
            _, _, nd = heapq.heappop(heap)
            assert nd.lock_ref == 0 and not nd.children
            parent = nd.parent
            del parent.children[nd.token]
            nd.alive = False
            self._size -= 1
            evicted += 1
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.stamp, id(parent), parent))
        self.evicted_total += evicted
        return evicted

    # -- sizes
    def total_size(self) -> int:
        return self._size

    def protected_size(self) -> int:
        return self._protected

    def evictable_size(self) -> int:
        return self._size - self._protected

    def free_tokens(self) -> int:
        return self.capacity_tokens - self._size


@dataclass(frozen=True)
class FixedCostModel:
    """step_time_s = base + prefill_token*n + attn*work + decode_seq*b + context_token*L."""

    base_s: float = 0.01
    prefill_token_s: float = 0.001
    attn_work_s: float = 0.0
    decode_seq_s: float = 0.0
    context_token_s: float = 0.0

    def step_time_s(self, prefill_tokens, prefill_attn_work, decode_batch, decode_context_tokens) -> float:
        return (
            self.base_s
            + self.prefill_token_s * prefill_tokens
            + self.attn_work_s * prefill_attn_work
            + self.decode_seq_s * decode_batch
            + self.context_token_s * decode_context_tokens
        )

    def prefill_time_s(self, new_tokens, cached_tokens=0) -> float:
        return self.step_time_s(new_tokens, new_tokens * (cached_tokens + new_tokens / 2), 0, 0)

    def decode_time_s(self, batch, context_tokens) -> float:
        return self.step_time_s(0, 0.0, batch, context_tokens)


class RoundRobinRouter(Router):
    name = "round_robin"

    def reset(self, workers, seed):
        super().reset(workers, seed)
        self.counter = 0

    def select_worker(self, request, workers, now_s):
        w = self.counter % self.num_workers
        self.counter += 1
        return w


class RandomRouter(Router):
    name = "random"

    def select_worker(self, request, workers, now_s):
        return int(self.rng.integers(self.num_workers))


class FixedRouter(Router):
    """Worker chosen by request id (default 0); records every callback it gets."""

    name = "fixed"

    def __init__(self, assignment: dict | None = None):
        self.assignment = dict(assignment or {})
        self.completions: list[tuple] = []

    def select_worker(self, request, workers, now_s):
        return self.assignment.get(request.id, 0)

    def on_request_complete(self, request, worker_id, latency_s, ttft_s, cached_tokens, now_s=None):
        self.completions.append((request.id, worker_id, latency_s, ttft_s, cached_tokens, now_s))


class LeastLoadedRouter(Router):
    """Fewest in-flight requests (first minimum); exercises the views."""

    name = "least_loaded"

    def select_worker(self, request, workers, now_s):
        loads = [w.in_flight for w in workers]
        return int(np.argmin(loads))


class ViewRecorder(Router):
    """Wraps a router; records what every worker view shows at each routing decision."""

    FIELDS = ("in_flight", "waiting", "running", "active_kv_tokens", "kv_used_tokens", "kv_capacity_tokens")

    def __init__(self, inner: Router):
        self.inner = inner
        self.seen: list[tuple] = []

    def reset(self, workers, seed):
        self.inner.reset(workers, seed)

    def select_worker(self, request, workers, now_s):
        self.seen.append(tuple(tuple(getattr(v, f) for f in self.FIELDS) for v in workers))
        return self.inner.select_worker(request, workers, now_s)

    def on_request_complete(self, *args):
        self.inner.on_request_complete(*args)


def make_request(rid, arrival_s, prompt, output_len=1, group=0, generated=None) -> Request:
    prompt = np.asarray(prompt, dtype=np.int32)
    if generated is None:
        generated = 1_000_000 + 100 * rid + np.arange(output_len)
    return Request(
        id=rid,
        arrival_s=float(arrival_s),
        prompt_tokens=prompt,
        output_len=int(output_len),
        generated_tokens=np.asarray(generated, dtype=np.int32),
        group_id=group,
        conversation_id=rid,
        turn=0,
    )


def gsp_requests(
    seed: int,
    num_groups: int = 8,
    per_group: int = 4,
    system_len: tuple[int, int] = (20, 40),
    question_len: tuple[int, int] = (4, 10),
    output_len: tuple[int, int] = (1, 6),
    rate: float = 10.0,
) -> list[Request]:
    """GSP-shaped requests: group g's prompts share a system prompt; random order; Poisson arrivals."""
    rng = np.random.default_rng(seed)
    systems = [
        rng.integers(1, 50_000, size=int(rng.integers(system_len[0], system_len[1] + 1)))
        for _ in range(num_groups)
    ]
    items = [(g, k) for g in range(num_groups) for k in range(per_group)]
    order = rng.permutation(len(items))
    t = 0.0
    out = []
    for rid, idx in enumerate(order):
        g, _ = items[idx]
        q = rng.integers(50_000, 100_000, size=int(rng.integers(question_len[0], question_len[1] + 1)))
        t += float(rng.exponential(1.0 / rate))
        olen = int(rng.integers(output_len[0], output_len[1] + 1))
        gen = rng.integers(100_000, 150_000, size=olen)
        out.append(make_request(rid, t, np.concatenate([systems[g], q]), olen, group=g, generated=gen))
    return out


def simple_workers_caches(capacities: Sequence[int]) -> list[TrieCache]:
    return [TrieCache(c) for c in capacities]

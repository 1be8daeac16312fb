"""smg 1.13's `prefix_hash` router: a consistent-hash ring over the prompt's head, with a load bound.

Rule (smg-project/smg model_gateway/src/policies/prefix_hash.rs, checked against the 1.13.0 binary
in tests/router_binary/test_router_binary_prefix_hash.py):

1. key = the first `prefix_token_count` tokens (smg hashes them as little-endian u32 bytes: the
   bytes of our packed int32 key).
2. the ring: `virtual_nodes` positions per worker; the key's owner is the first position
   clockwise from the key's hash.
3. load_ok(load) iff load <= max(avg * load_factor, avg + balance_abs_threshold), avg = (total
   in-flight + 1) / M (the +1 is the incoming request); all loads 0: always ok.
4. owner load_ok -> owner; else the least loaded load_ok worker (the first such in worker
   order); none -> the owner anyway.

Load = the router's own in-flight count per worker (smg's `worker.load()`). Hashes: smg places
`url#v` with blake3 and the key via xxh3 + blake3; here both are blake2b-64 of `worker<i>#v` and
of the key bytes (no URL in the simulator, no extra dependency): the same ring structure and rule,
a different (equally uniform) assignment of heads to workers.
"""

from __future__ import annotations

import bisect
import hashlib

import numpy as np
from typing import TYPE_CHECKING, Sequence

from repro.routing.base import Router, WorkerView, request_key

if TYPE_CHECKING:  # pragma: no cover
    from repro.workloads.request import Request


def ring_position(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class PrefixHashRouter(Router):
    """smg 1.13 `prefix_hash` (see the module docstring); defaults = smg's."""

    name = "prefix_hash"

    def __init__(
        self,
        name: str = "prefix_hash",
        prefix_token_count: int = 256,
        load_factor: float = 1.25,
        balance_abs_threshold: int = 10,
        virtual_nodes: int = 150,
    ) -> None:
        if isinstance(prefix_token_count, bool) or not isinstance(prefix_token_count, int) or prefix_token_count < 1:
            raise ValueError(f"prefix_token_count must be an int >= 1, got {prefix_token_count!r}")
        if not (isinstance(load_factor, (int, float)) and load_factor >= 1.0 and load_factor < float("inf")):
            raise ValueError(f"load_factor must be finite and >= 1.0 (smg's bound), got {load_factor!r}")
        if (
            isinstance(balance_abs_threshold, bool)
            or not isinstance(balance_abs_threshold, int)
            or balance_abs_threshold < 0
        ):
            raise ValueError(f"balance_abs_threshold must be an int >= 0, got {balance_abs_threshold!r}")
        if isinstance(virtual_nodes, bool) or not isinstance(virtual_nodes, int) or virtual_nodes < 1:
            raise ValueError(f"virtual_nodes must be an int >= 1, got {virtual_nodes!r}")
        self.name = name
        self.prefix_token_count = prefix_token_count
        self.load_factor = float(load_factor)
        self.balance_abs_threshold = balance_abs_threshold
        self.virtual_nodes = virtual_nodes

    def reset(self, workers: Sequence[WorkerView], seed: int) -> None:
        super().reset(workers, seed)
        entries = sorted(
            (ring_position(f"worker{i}#{v}".encode()), i)
            for i in range(self.num_workers)
            for v in range(self.virtual_nodes)
        )
        self._pos = [p for p, _ in entries]
        self._owner = [i for _, i in entries]
        self.in_flight = [0] * self.num_workers

    @staticmethod
    def head_of(tokens, prefix_token_count: int) -> bytes:
        """The hashed head of a token sequence: its first prefix_token_count tokens, packed."""
        from repro.kvcache import as_key

        return as_key(np.asarray(tokens[:prefix_token_count], dtype=np.int64))

    def owner(self, head: bytes) -> int:
        """The ring's worker for a key head (the tests replace it with the real binary's ring)."""
        j = bisect.bisect_left(self._pos, ring_position(head))
        return self._owner[j % len(self._owner)]

    def _load_ok(self, load: int, total: int) -> bool:
        if total == 0:
            return True
        avg = (total + 1) / self.num_workers
        return load <= max(avg * self.load_factor, avg + self.balance_abs_threshold)

    def choose(self, head: bytes) -> int:
        loads = self.in_flight
        total = sum(loads)
        owner = self.owner(head)
        if self._load_ok(loads[owner], total):
            return owner
        ok = [w for w in range(self.num_workers) if self._load_ok(loads[w], total)]
        return min(ok, key=loads.__getitem__) if ok else owner  # min: the first of equals, as Rust's min_by_key

    def select_worker(self, request: "Request", workers: Sequence[WorkerView], now_s: float) -> int:
        worker = self.choose(request_key(request)[: 4 * self.prefix_token_count])
        self.in_flight[worker] += 1
        return worker

    def on_request_complete(self, request, worker_id, latency_s, ttft_s, cached_tokens, now_s=None):
        if self.in_flight[worker_id] > 0:
            self.in_flight[worker_id] -= 1

    def on_request_abandoned(self, request, worker_id, now_s=None):
        self.on_request_complete(request, worker_id, 0.0, 0.0, 0, now_s)

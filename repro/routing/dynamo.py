"""NVIDIA Dynamo's KV router cost rule (extra comparison row; not in the paper).

For every worker i (Dynamo's DefaultWorkerSelector, behaviour read from its source):

    overlap_blocks_i  = cached full blocks of the prompt on worker i  = floor(peek_prefix / B)
    prefill_blocks_i  = (active prefill tokens_i + |q| - B * overlap_blocks_i) / B
    decode_blocks_i   = active blocks_i + new blocks_i
    logit_i           = overlap_score_weight * prefill_blocks_i + decode_blocks_i

with blocks of B = block_size_tokens (16) tokens and overlap_score_weight = 1.0 (Dynamo's
defaults). router_temperature = 0 (Dynamo's default): argmin; Dynamo breaks a tie by the
smallest cached-block count ("tree size"), then uniformly at random — here tree size =
view.kv_used_tokens // B and the draw uses the run's seeded generator. Temperature > 0:
Dynamo's softmax over min-max normalised logits, p_i ∝ exp(-(logit_i / range) / T).

Where the numbers come from (choices where our views differ from Dynamo's):
- cached blocks: WorkerView.peek_prefix — an exact view of the worker cache, as Dynamo has
  with KV events on (its default).
- active prefill tokens: WorkerView.waiting_prefill_tokens (Dynamo counts router-side the
  prompts of routed requests until their first token; we get no first-token callback, and
  the view's count is the same quantity).
- active blocks / new blocks: router-side bookkeeping like Dynamo's ActiveSequences: the
  distinct full-block hashes of the prompts of this router's in-flight requests per worker
  (added at dispatch, released at completion); new blocks = the prompt's full blocks not
  among them. Block hashes chain the whole prefix (a block's hash depends on every token
  before it), so the shared blocks always form a prefix of the prompt's blocks and are
  found by binary search.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Sequence

import numpy as np

from repro.kvcache import as_key
from repro.routing.base import Router, WorkerView

if TYPE_CHECKING:  # pragma: no cover
    from repro.workloads.request import Request

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, vectorised (uint64 arithmetic wraps modulo 2**64)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


class BlockHasher:
    """Chained hashes of the full blocks of a token array: hash k depends on tokens[: (k+1) * B].

    h_k = sum_{j<=k} mix(block_j . W) * R_j over uint64 (wrapping), with fixed
    pseudo-random W (per position in a block) and R (per block index): all vectorised.
    The tables are constants of the instance (no state shared between routers).
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        with np.errstate(over="ignore"):
            self.weights = _mix64(np.arange(1, block_size + 1, dtype=np.uint64)) | np.uint64(1)
        self.positions = np.empty(0, dtype=np.uint64)

    def _grow(self, nblocks: int) -> None:
        n = max(nblocks, 2 * len(self.positions), 1024)
        with np.errstate(over="ignore"):
            self.positions = _mix64(np.arange(n, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15))

    def __call__(self, tokens: np.ndarray) -> list[int]:
        tokens = np.asarray(tokens)
        bs = self.block_size
        nblocks = len(tokens) // bs
        if nblocks == 0:
            return []
        if nblocks > len(self.positions):
            self._grow(nblocks)
        blocks = tokens[: nblocks * bs].astype(np.uint64).reshape(nblocks, bs)
        with np.errstate(over="ignore"):
            per_block = _mix64(blocks @ self.weights)
            chained = np.cumsum(per_block * self.positions[:nblocks], dtype=np.uint64)
        return chained.tolist()


def block_hashes(tokens: np.ndarray, block_size: int) -> list[int]:
    """One-off chained block hashes (see BlockHasher)."""
    return BlockHasher(block_size)(tokens)


class DynamoRouter(Router):
    name = "dynamo"

    def __init__(
        self,
        name: str = "dynamo",
        overlap_score_weight: float = 1.0,
        block_size_tokens: int = 16,
        router_temperature: float = 0.0,
    ) -> None:
        if overlap_score_weight < 0:
            raise ValueError(f"overlap_score_weight must be >= 0, got {overlap_score_weight}")
        if block_size_tokens < 1:
            raise ValueError(f"block_size_tokens must be >= 1, got {block_size_tokens}")
        if router_temperature < 0:
            raise ValueError(f"router_temperature must be >= 0, got {router_temperature}")
        self.name = name
        self.overlap_score_weight = float(overlap_score_weight)
        self.block_size_tokens = int(block_size_tokens)
        self.router_temperature = float(router_temperature)
        self.hasher = BlockHasher(self.block_size_tokens)

    def reset(self, workers: Sequence[WorkerView], seed: int) -> None:
        super().reset(workers, seed)
        self.active = [Counter() for _ in range(self.num_workers)]  # block hash -> in-flight users
        self.pending: dict[int, tuple[int, list[int]]] = {}

    @staticmethod
    def _shared_prefix_blocks(active: Counter, hashes: list[int]) -> int:
        lo, hi = 0, len(hashes)  # the first lo blocks are active; binary search the boundary
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if active.get(hashes[mid - 1], 0) > 0:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def logits(self, request: "Request", workers: Sequence[WorkerView]) -> tuple[np.ndarray, list[int]]:
        bs = self.block_size_tokens
        tokens = request.prompt_tokens
        key = as_key(tokens)
        isl = len(tokens)
        hashes = self.hasher(tokens)
        logits = np.empty(self.num_workers)
        for i, w in enumerate(workers):
            overlap_blocks = w.peek_prefix(key) // bs
            prefill_tokens = w.waiting_prefill_tokens + max(isl - overlap_blocks * bs, 0)
            active = self.active[i]
            new_blocks = len(hashes) - self._shared_prefix_blocks(active, hashes)
            decode_blocks = len(active) + new_blocks
            logits[i] = self.overlap_score_weight * prefill_tokens / bs + decode_blocks
        return logits, hashes

    def select_worker(self, request: "Request", workers: Sequence[WorkerView], now_s: float) -> int:
        logits, hashes = self.logits(request, workers)
        if self.router_temperature == 0.0:
            tied = np.flatnonzero(logits == logits.min())
            if len(tied) > 1:
                sizes = np.array([workers[i].kv_used_tokens // self.block_size_tokens for i in tied])
                tied = tied[sizes == sizes.min()]
            worker = int(tied[0]) if len(tied) == 1 else int(self.rng.choice(tied))
        else:
            lo, hi = logits.min(), logits.max()
            if hi == lo:
                probs = np.full(self.num_workers, 1.0 / self.num_workers)
            else:
                scaled = -(logits / (hi - lo)) / self.router_temperature
                probs = np.exp(scaled - scaled.max())
                probs /= probs.sum()
            worker = int(self.rng.choice(self.num_workers, p=probs))
        self.active[worker].update(hashes)
        self.pending[request.id] = (worker, hashes)
        return worker

    def on_request_complete(self, request, worker_id, latency_s, ttft_s, cached_tokens, now_s=None):
        record = self.pending.pop(request.id, None)
        if record is None:
            return
        worker, hashes = record
        active = self.active[worker]
        active.subtract(hashes)
        # Counts fall along the chain, so the blocks now unused form a suffix of `hashes`.
        keep = self._shared_prefix_blocks(active, hashes)
        pop = dict.pop  # dict's C pop: Counter.__delitem__ is Python code
        for h in hashes[keep:]:
            pop(active, h, None)

    def on_request_abandoned(self, request, worker_id, now_s=None):
        # completion only releases the request's active blocks here: abandoning is the same
        self.on_request_complete(request, worker_id, 0.0, 0.0, 0, now_s)

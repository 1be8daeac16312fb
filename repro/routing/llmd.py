"""llm-d's default inference-scheduler profile (extra comparison row; not in the paper).

Weighted sum of scorers, each in [0, 1] (llm-d's default EndpointPickerConfig: prefix-cache
weight 3, queue weight 2, kv-cache-utilization weight 2), max-score picker with a uniformly
random tie-break (the picker shuffles before taking the maximum). Scorers (behaviour read
from gateway-api-inference-extension / llm-d; our inputs where views differ):

- prefix-cache: matched full blocks / full blocks of the prompt, blocks of
  block_size_tokens (16) tokens, matched = floor(peek_prefix / block) — an exact view of the
  worker cache like llm-d's precise (KV-event) prefix scorer; 0 for a prompt shorter than
  one block.
- queue: min-max normalised waiting-queue length (WorkerView.waiting):
  (max - q_i) / (max - min), 1 for every worker when all queues are equal.
- kv-cache-utilization: 1 - usage_i. kv_usage = "active" (default): active_kv_tokens /
  kv_capacity_tokens — vLLM's gauge counts blocks held by running requests, cached but
  free blocks count as free; "used": kv_used_tokens / kv_capacity_tokens (every cached
  token, which for an SGLang radix cache sits near 1 once warm).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from repro.kvcache import as_key
from repro.routing.base import Router, WorkerView, check_choice

if TYPE_CHECKING:  # pragma: no cover
    from repro.workloads.request import Request


class LLMDRouter(Router):
    name = "llmd"

    def __init__(
        self,
        name: str = "llmd",
        prefix_cache_weight: float = 3.0,
        queue_weight: float = 2.0,
        kv_utilization_weight: float = 2.0,
        block_size_tokens: int = 16,
        kv_usage: str = "active",
    ) -> None:
        for key, value in (
            ("prefix_cache_weight", prefix_cache_weight),
            ("queue_weight", queue_weight),
            ("kv_utilization_weight", kv_utilization_weight),
        ):
            if value < 0:
                raise ValueError(f"{key} must be >= 0, got {value}")
        if block_size_tokens < 1:
            raise ValueError(f"block_size_tokens must be >= 1, got {block_size_tokens}")
        self.name = name
        self.prefix_cache_weight = float(prefix_cache_weight)
        self.queue_weight = float(queue_weight)
        self.kv_utilization_weight = float(kv_utilization_weight)
        self.block_size_tokens = int(block_size_tokens)
        self.kv_usage = check_choice("kv_usage", kv_usage, ("active", "used"))

    def scores(self, request: "Request", workers: Sequence[WorkerView]) -> np.ndarray:
        """Weighted total score per worker (higher is better)."""
        bs = self.block_size_tokens
        tokens = request.prompt_tokens
        total_blocks = len(tokens) // bs
        m = self.num_workers
        prefix = np.zeros(m)
        if total_blocks > 0:
            key = as_key(tokens)
            for i, w in enumerate(workers):
                prefix[i] = min(w.peek_prefix(key) // bs, total_blocks) / total_blocks
        queues = np.array([w.waiting for w in workers], dtype=float)
        qmin, qmax = queues.min(), queues.max()
        queue = np.ones(m) if qmax == qmin else (qmax - queues) / (qmax - qmin)
        if self.kv_usage == "active":
            used = np.array([w.active_kv_tokens for w in workers], dtype=float)
        else:
            used = np.array([w.kv_used_tokens for w in workers], dtype=float)
        capacity = np.array([max(w.kv_capacity_tokens, 1) for w in workers], dtype=float)
        kv = 1.0 - np.clip(used / capacity, 0.0, 1.0)
        return self.prefix_cache_weight * prefix + self.queue_weight * queue + self.kv_utilization_weight * kv

    def select_worker(self, request: "Request", workers: Sequence[WorkerView], now_s: float) -> int:
        total = self.scores(request, workers)
        tied = np.flatnonzero(total == total.max())
        return int(tied[0]) if len(tied) == 1 else int(self.rng.choice(tied))

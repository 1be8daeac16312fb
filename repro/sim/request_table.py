"""Per-request state of one simulation, shared by the cluster and its workers (flat lists by arrival position)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from repro.kvcache.keys import as_key

if TYPE_CHECKING:  # pragma: no cover
    from repro.workloads.request import Request


def _int32_key(tokens) -> bytes:
    """as_key of the ids cast to int32 (a request's arrays are int32 already: no copy then)."""
    if type(tokens) is np.ndarray and tokens.dtype == np.int32:
        return as_key(tokens)
    return as_key(np.ascontiguousarray(tokens, dtype=np.int32))


class RequestTable:
    """Per-request state of one simulation, in flat lists indexed by arrival position.

    Workers write the record fields (worker, prefill_start_s, first_token_s, finish_s, cached_tokens) in place,
    so that building the records at the end is one conversion, not a loop over objects.
    A prompt's key (`prompt_key[i]`, the radix tree's format) exists only while the request is
    in flight: the cluster builds it once when the request arrives (`key`; routers get the same
    bytes through repro.routing.base.request_key) and drops it after the completion callback, so
    a cell holds keys for its in-flight requests only, not a copy of every prompt.
    (`prompt_tokens` stays for subclasses that keep their own copies; this class never fills it.)
    """

    __slots__ = (
        "requests",
        "n",
        "arrival_s",
        "prompt_len",
        "output_len",
        "prompt_tokens",
        "prompt_key",
        "worker",
        "prefill_start_s",
        "first_token_s",
        "finish_s",
        "cached_tokens",
        "compute_start",
        "compute_len",
        "prefilled",
        "lock_node",
        "est_hit",
        "peek_len",
        "peek_version",
        "_largest",
    )

    def __init__(self, requests: Sequence["Request"]):
        self.requests = list(requests)
        n = self.n = len(self.requests)
        self.arrival_s = [float(r.arrival_s) for r in self.requests]
        self.prompt_tokens: list = []
        self.prompt_key: list[bytes] = [b""] * n  # while in flight, else b"" (see the class docstring)
        self.prompt_len = [int(r.prompt_len) for r in self.requests]
        self.output_len = [int(r.output_len) for r in self.requests]
        nan = float("nan")
        self.worker = [-1] * n
        self.prefill_start_s = [nan] * n  # start of the step that admitted it (its first prefill step)
        self.first_token_s = [nan] * n
        self.finish_s = [nan] * n
        self.cached_tokens = [0] * n
        self.compute_start = [0] * n  # tokens already computed when its prefill starts
        self.compute_len = [0] * n  # tokens its prefill computes (>= 1)
        self.prefilled = [0] * n  # of compute_len, done so far (chunked prefill)
        self.lock_node: list[Any] = [None] * n
        self.est_hit = [0] * n  # hit estimate while waiting (for waiting_prefill_tokens)
        self.peek_len = [0] * n  # last peek_prefix of its prompt on its worker ...
        self.peek_version = [-1] * n  # ... valid while the worker's tree_version is this
        self._largest = -1

    def largest(self) -> int:
        """Index of the first request with the most prompt + output tokens (found once: every worker asks)."""
        if self._largest < 0:
            self._largest = int(np.argmax(np.add(self.prompt_len, self.output_len, dtype=np.int64)))
        return self._largest

    def key(self, i: int) -> bytes:
        """Request i's prompt key, built on first use (dispatch) and kept until it finishes."""
        k = self.prompt_key[i]
        if not k:
            k = self.prompt_key[i] = self.requests[i].prompt_key
        return k

    def gen_key(self, i: int) -> bytes:
        """Key of the generated tokens a finished request leaves in the tree: all but the last.

        SGLang never feeds the last sampled token forward, so it has no KV: a finished request
        caches prompt + output - 1 tokens (docs/ALGORITHMS.md §7, "KV of a request").
        """
        return _int32_key(self.requests[i].generated_tokens[:-1])

    def full_key(self, i: int) -> bytes:
        """Key of the path a finished request leaves in the tree: prompt || gen_key."""
        return self.prompt_key[i] + self.gen_key(i)


class SimTimings:
    """Wall-clock CPU cost of routing decisions, completion callbacks and eviction calls.

    Machine-dependent; goes to timings.json only, never onto the simulated clock.
    """

    __slots__ = (
        "route_ns",
        "route_calls",
        "complete_ns",
        "complete_calls",
        "evict_ns",
        "evict_calls",
        "evicted_tokens",
    )

    def __init__(self) -> None:
        self.route_ns = self.route_calls = 0
        self.complete_ns = self.complete_calls = 0
        self.evict_ns = self.evict_calls = self.evicted_tokens = 0

    def as_dict(self) -> dict:
        def per(total_ns: int, count: int, scale: float) -> float | None:
            return total_ns / count / scale if count else None

        return {
            "routing": {
                "decisions": self.route_calls,
                "total_s": self.route_ns / 1e9,
                "mean_ms_per_decision": per(self.route_ns, self.route_calls, 1e6),
            },
            "completion_callback": {
                "calls": self.complete_calls,
                "total_s": self.complete_ns / 1e9,
                "mean_ms_per_call": per(self.complete_ns, self.complete_calls, 1e6),
            },
            "eviction": {
                "calls": self.evict_calls,
                "evicted_tokens": self.evicted_tokens,
                "total_s": self.evict_ns / 1e9,
                "mean_ms_per_call": per(self.evict_ns, self.evict_calls, 1e6),
                "mean_us_per_evicted_token": per(self.evict_ns, self.evicted_tokens, 1e3),
            },
        }

"""What a router is and what it may see (ARCHITECTURE.md "Interfaces").

A router never imports the simulator: it sees workers only through `WorkerView`
(read-only) and learns about completions through `on_request_complete`. The very
same classes run inside the simulator and inside the live router service.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence, runtime_checkable

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from repro.costmodel import StepCostModel
    from repro.workloads.request import Request


@runtime_checkable
class WorkerView(Protocol):
    """Read-only view of one worker, as a router may see it."""

    worker_id: int

    @property
    def in_flight(self) -> int: ...  # dispatched and not finished (waiting + running)

    @property
    def waiting(self) -> int: ...  # queued, not yet admitted

    @property
    def waiting_prefill_tokens(self) -> int: ...  # uncached prompt tokens still to prefill

    @property
    def running(self) -> int: ...  # requests in the running batch

    @property
    def active_kv_tokens(self) -> int: ...  # KV tokens held by running requests

    @property
    def kv_capacity_tokens(self) -> int: ...

    @property
    def kv_used_tokens(self) -> int: ...

    @property
    def eviction_policy(self) -> str: ...  # "lru" | "rlt" | ...: what an approximate tracker mirrors

    @property
    def cost_model(self) -> "StepCostModel": ...

    def peek_prefix(self, tokens: np.ndarray | bytes) -> int:
        """Longest cached prefix in tokens, touching neither recency nor marks."""
        ...


class Router:
    """Base class: `select_worker` picks a worker id, `on_request_complete` feeds back.

    `now_s` is the clock of whoever drives the router (simulated time in the
    simulator, monotonic wall time in the live service); routers never read a clock.
    All randomness comes from the generator `reset` builds from the run's seed, so
    two router instances never interfere.
    """

    name: str = "base"
    # True if select_worker reads the prompt's text (`request_text`): the simulator then builds
    # it before the timed call, so that routing time does not include making the workload's text
    uses_text: bool = False

    def reset(self, workers: Sequence[WorkerView], seed: int) -> None:
        """Prepare for a run over `workers` (their ids are 0..M-1 in order).

        Subclasses call this first, then build their per-run state (nothing survives a reset).
        """
        check_workers(workers)
        self.num_workers = len(workers)
        self.rng = np.random.default_rng(seed)

    def select_worker(self, request: "Request", workers: Sequence[WorkerView], now_s: float) -> int:
        raise NotImplementedError

    def on_request_complete(
        self,
        request: "Request",
        worker_id: int,
        latency_s: float,
        ttft_s: float,
        cached_tokens: int,
        now_s: float | None = None,
    ) -> None:
        """Completion callback (ARCHITECTURE.md); default: nothing to learn."""

    def on_request_abandoned(self, request: "Request", worker_id: int, now_s: float | None = None) -> None:
        """The request routed to `worker_id` will not complete there (it failed, or the live
        service served it on another worker): release what is held for it, learn nothing.
        Default: nothing is held. The simulator never abandons a request."""


def check_choice(name: str, value: str, allowed: Sequence[str]) -> str:
    """Return `value` if it is one of `allowed`, else raise a ValueError naming the key."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
    return value


def check_workers(workers: Sequence[WorkerView]) -> None:
    """Workers must be non-empty with ids 0..M-1 in order (the routers index by id)."""
    if len(workers) == 0:
        raise ValueError("a router needs at least one worker")
    for i, w in enumerate(workers):
        if w.worker_id != i:
            raise ValueError(f"workers must have ids 0..M-1 in order; position {i} has id {w.worker_id}")


# --- the prompt key, built once per request by whoever drives the router
_key_slot: tuple = (None, b"")


def request_key(request: "Request") -> bytes:
    """The prompt's packed key, `repro.kvcache.as_key(request.prompt_tokens)`.

    The simulator builds each prompt's key once and offers it (`offer_request_key`) right before
    it calls `select_worker` / `on_request_complete` for that request, so a router that asks here
    gets it without rebuilding the prompt and copying it again; anywhere else (the live router
    service, tests) it is the request's own `prompt_key`. One slot, checked by identity: never a stale key.
    """
    slot = _key_slot
    if slot[0] is request:
        return slot[1]
    return request.prompt_key


def offer_request_key(request: "Request", key: bytes) -> None:
    """`request_key(request)` returns `key` until the next offer (the driver's promise: it is that key)."""
    global _key_slot
    _key_slot = (request, key)


# --- the prompt text, offered the same way to a router that `uses_text`
_text_slot: tuple = (None, None)


def request_text(request: "Request") -> str | None:
    """The prompt's text, `request.text`: the one the driver offered (`offer_request_text`) for
    this request, else built here (a pool-backed request builds its text on each access)."""
    slot = _text_slot
    if slot[0] is request:
        return slot[1]
    return request.text


def offer_request_text(request: "Request", text: str | None) -> None:
    """`request_text(request)` returns `text` until the next offer (the driver's promise: it is `request.text`)."""
    global _text_slot
    _text_slot = (request, text)

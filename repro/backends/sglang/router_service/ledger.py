"""The router service's load ledger: per-worker bookkeeping and the router's live view of it.

`WorkerState` keeps, per worker, the requests forwarded there and not finished (waiting: no
first token yet; running: with it), the token counts derived from them, the health state and
the approximate cache tracker; `Flight` is one request on its way through the service;
`LiveWorkerView` is the read-only repro.routing.base.WorkerView the router reads. What each
field means for the router: the package docstring (router_service/__init__.py).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from repro.backends.sglang import protocol
from repro.backends.sglang.router_service.stall import StallWatch
from repro.kvcache import as_key
from repro.routing.trackers import finished_path, tracker_access

log = logging.getLogger("repro.router_service")


@dataclass
class Flight:
    """One request on its way through the service."""

    key: int
    request: Any  # repro Request used for routing
    prompt_key: bytes  # repro.kvcache.as_key of the prompt ids
    recv_wall: float
    chosen: int
    body: bytes
    stream: bool
    worker: int = -1
    first_token_wall: float = math.nan
    tracker: protocol.OutputTracker = field(default_factory=protocol.OutputTracker)
    attempts: list = field(default_factory=list)  # (worker, error) of failed attempts
    response: Any = None  # the client's StreamResponse once prepared (no retry after that)
    # abort(): why the current attempt is being ended from outside (worker marked down, stall),
    # and the handles that end it: the task waiting for the first byte, the worker's response.
    abort_reason: tuple[str, str] | None = None
    phase: Any = None
    worker_resp: Any = None
    last_event: float = 0.0  # loop time of the worker's latest stream event
    dispatched_at: float = 0.0  # monotonic time of the current attempt's dispatch

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_key) // 4  # packed int32 ids

    def abort(self, kind: str, message: str) -> None:
        if self.abort_reason is not None:
            return
        self.abort_reason = (kind, message)
        if self.phase is not None and not self.phase.done():
            self.phase.cancel()
        if self.worker_resp is not None:
            self.worker_resp.close()  # the pending read of the stream ends at once


class WorkerState:
    """The service's bookkeeping for one worker."""

    def __init__(self, worker_id: int, url: str):
        self.worker_id = worker_id
        self.url = url.rstrip("/")
        self.healthy = True
        self.consecutive_failures = 0
        self.last_error: str | None = None
        self.capacity = 0
        self.waiting: dict[int, int] = {}  # key -> uncached prompt tokens estimated at dispatch
        self.running: dict[int, int] = {}  # key -> KV tokens held (prompt + generated so far - 1)
        self.waiting_prefill = 0
        self.active_kv = 0
        self.live_generated = 0
        self.tracker: Any = None
        self.polled: dict | None = None
        self.dispatched = 0
        self.completed = 0
        self.failed_attempts = 0
        self.flights: dict[int, Flight] = {}  # key -> request forwarded here and not released
        self.down_at: float | None = None  # loop time it was last marked unhealthy
        self.stall = StallWatch()  # progress and exclusion from new requests (stall.py)

    # ------------------------------------------------------------------ health
    def mark_failure(self, error: str, threshold: int, hard: bool = False) -> None:
        self.last_error = error
        self.consecutive_failures = threshold if hard else self.consecutive_failures + 1
        if self.consecutive_failures >= threshold and self.healthy:
            log.warning("worker %d (%s) marked unhealthy: %s", self.worker_id, self.url, error)
            self.healthy = False
            self.down_at = time.monotonic()
            # Its requests stop waiting for it: those without a first byte go to another worker,
            # open streams end with an error (a frozen worker never times them out itself).
            for f in list(self.flights.values()):
                f.abort("worker_down", f"worker {self.worker_id} was marked unhealthy ({error})")

    def mark_success(self) -> None:
        if not self.healthy:
            log.info("worker %d (%s) healthy again", self.worker_id, self.url)
        self.healthy = True
        self.consecutive_failures = 0

    # ------------------------------------------------------------------ load
    @property
    def in_flight(self) -> int:
        return len(self.waiting) + len(self.running)

    def dispatch(self, f: Flight) -> None:
        """f is forwarded here: it waits, with its prompt minus the tracked hit to prefill."""
        was_idle = not self.flights
        f.worker = self.worker_id
        f.dispatched_at = time.monotonic()
        self.dispatched += 1
        self.flights[f.key] = f
        plen = f.prompt_len
        hit = int(self.tracker.peek_prefix(f.prompt_key)) if self.tracker is not None else 0
        self.waiting[f.key] = plen - hit
        self.waiting_prefill += plen - hit
        if self.tracker is not None:
            tracker_access(self.tracker, f.prompt_key)
        if was_idle:
            self.stall.became_busy(f.dispatched_at, self.waiting_prefill)

    def progress(self) -> None:
        """Bytes of a reply arrived from this worker (stall.py)."""
        self.stall.progress(time.monotonic(), self.waiting_prefill, self.worker_id)

    def add_tokens(self, f: Flight, new_tokens: int) -> None:
        """new_tokens more output tokens of f arrived (the first one ends its prefill)."""
        if new_tokens <= 0:
            return
        if f.key in self.waiting:
            uncached = self.waiting.pop(f.key)
            self.waiting_prefill -= uncached
            self.stall.first_token(time.monotonic(), uncached, f.dispatched_at)
            # prompt + generated - 1, as SGLang's KV: a sampled token gets KV when the next step feeds it
            held = f.prompt_len - 1
            self.running[f.key] = held
            self.active_kv += held
            self.live_generated -= 1
        self.running[f.key] += new_tokens
        self.active_kv += new_tokens
        self.live_generated += new_tokens

    def release(self, f: Flight) -> None:
        """f is no longer on this worker (finished, failed or moved)."""
        self.flights.pop(f.key, None)
        if f.key in self.waiting:
            self.waiting_prefill -= self.waiting.pop(f.key)
        held = self.running.pop(f.key, None)
        if held is not None:
            self.active_kv -= held
            self.live_generated -= held - f.prompt_len
        if not self.flights:
            self.stall.end(time.monotonic(), self.worker_id, "no request of it left in flight")

    def record_completion(self, f: Flight, output_ids: np.ndarray) -> None:
        """f finished here: the tracker gets prompt + reply but its last token, as the worker's
        cache does (that token is never fed forward, so it has no KV)."""
        self.completed += 1
        if self.tracker is not None:
            tracker_access(self.tracker, finished_path(f.prompt_key, f.prompt_key + as_key(output_ids)))

    def info(self) -> dict:
        """This worker in GET /stats and /workers."""
        return {
            "worker_id": self.worker_id,
            "url": self.url,
            "healthy": self.healthy,
            "last_error": self.last_error,
            "kv_capacity_tokens": self.capacity,
            "dispatched": self.dispatched,
            "completed": self.completed,
            "failed_attempts": self.failed_attempts,
            "in_flight": self.in_flight,
            "waiting": len(self.waiting),
            "active_kv_tokens": self.active_kv,  # the router's estimate (prompt + generated so far - 1)
            "excluded": self.stall.excluded,  # from new requests: in-flight ones stalled (stall.py)
            "stall_exclusions": self.stall.exclusions,
            "stall_closest": round(self.stall.closest, 3),  # largest silence / limit seen (1: excluded)
            "excluded_s": self.stall.excluded_s
            + (time.monotonic() - self.stall.excluded_at if self.stall.excluded_at is not None else 0.0),
        }


class LiveWorkerView:
    """Read-only WorkerView (repro/routing/base.py) of one worker, from the service's bookkeeping."""

    __slots__ = ("worker_id", "_w", "_svc")

    def __init__(self, state: WorkerState, service: Any):
        self.worker_id = state.worker_id
        self._w = state
        self._svc = service

    @property
    def in_flight(self) -> int:
        return self._w.in_flight

    @property
    def waiting(self) -> int:
        p = self._w.polled
        return int(p.get("num_waiting_reqs", 0)) if p is not None else len(self._w.waiting)

    @property
    def waiting_prefill_tokens(self) -> int:
        return self._w.waiting_prefill

    @property
    def running(self) -> int:
        p = self._w.polled
        return int(p.get("num_running_reqs", 0)) if p is not None else len(self._w.running)

    @property
    def active_kv_tokens(self) -> int:
        return self._w.active_kv

    @property
    def kv_capacity_tokens(self) -> int:
        return self._w.capacity

    @property
    def kv_used_tokens(self) -> int:
        w = self._w
        if w.polled is not None and "num_used_tokens" in w.polled:
            return int(w.polled["num_used_tokens"])
        if w.tracker is not None:
            return int(w.tracker.total_size()) + w.live_generated
        return w.active_kv

    @property
    def eviction_policy(self) -> str:
        return self._svc.config.eviction_policy

    @property
    def cost_model(self) -> Any:
        return self._svc.cost_model

    def peek_prefix(self, tokens: Any) -> int:
        t = self._w.tracker
        return int(t.peek_prefix(tokens)) if t is not None else 0

    def __repr__(self) -> str:
        w = self._w
        return (
            f"LiveWorkerView(worker_id={self.worker_id}, healthy={w.healthy}, waiting={len(w.waiting)}, "
            f"running={len(w.running)})"
        )


__all__ = ["Flight", "LiveWorkerView", "WorkerState"]

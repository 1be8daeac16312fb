"""Router service: an async HTTP proxy in front of N SGLang workers, routing with repro's own routers.

    python -m repro.backends.sglang.router_service --config router.json --host 127.0.0.1 --port 30000

Clients POST SGLang's `/generate` (streaming or not, `input_ids` or `text`; see
repro.backends.sglang.protocol) to the service; it asks the configured router — the very
`repro.routing` class the simulator uses (LBGR, cache-aware, random, ...; built with
`hydra.utils.instantiate(cfg.router)`) — for a worker, forwards the request body unchanged,
streams the reply back event by event, and tells the router about the completion.

What the router sees (`LiveWorkerView`, the repro.routing.base.WorkerView contract), filled from
the service's own bookkeeping:
- in_flight: requests forwarded to the worker and not finished; waiting: those without their
  first token yet; running: those with it (first token = end of prefill, as in the simulator).
- waiting_prefill_tokens: sum over waiting requests of (prompt - tracked hit at dispatch).
- active_kv_tokens: prompt + tokens generated so far, over running requests.
- kv_capacity_tokens: the worker's `max_total_num_tokens` from `/server_info` (the real pool
  size) when it reports one, else the configured capacity.
- peek_prefix / kv_used_tokens: from a router-side approximate tracker per worker (a
  repro.kvcache RadixCache of the worker's capacity and eviction policy, updated like LBGR's
  approximate tracker: the prompt on dispatch, prompt + generated tokens on completion; it does
  not see the worker's locks). `view_tracker: false` drops it (peek_prefix -> 0). So routers that
  read `peek_prefix` (Dynamo, llm-d) get an approximate view here, an exact one in the simulator.
- With `load_poll_interval_s > 0`, waiting / running / kv_used_tokens come from the worker's own
  `/v1/loads` instead (the latest poll; stale by up to that interval).
- now_s given to the router = wall seconds since the service started x time_scale (emulated
  seconds when the workers are emulated, real seconds otherwise).

Completion callback: `on_request_complete(request, worker, latency_s, ttft_s, cached_tokens,
now_s)` with latency and TTFT measured from the moment the service received the request, in
now_s units, cached_tokens = the worker's `meta_info.cached_tokens`, and `request` carrying the
generated token ids the worker returned. It is called only when the request finished on the
worker the router chose. A request that was retried on another worker, or that failed, gives no
latency (the router never learns one that its choice did not produce) but
`on_request_abandoned(request, worker, now_s)` instead, so that the router releases what it
holds for it (cache-aware's in-flight count, LBGR's in-flight prompt); otherwise one failure
would skew that worker's load or cache estimate for the rest of the run. Failing workers are
kept away by the health state below, not by leaked router state.

Faults:
- Retry: a connection error, an HTTP 5xx or a dropped connection BEFORE the first byte of the
  reply was sent on to the client moves the request to another worker: the healthy worker with
  the fewest in-flight requests that has not been tried (ties: lowest id), at most `max_retries`
  times. A worker the router picks that is marked unhealthy is replaced the same way.
- After the first byte, a failure ends the stream with an SGLang-style error event
  (`data: {"error": ...}` then `data: [DONE]`); a malformed worker response does the same
  (HTTP 502 when not streaming). A 4xx from the worker is passed through (bad request: no retry).
- Per-request deadline `request_timeout_s` (wall seconds, from receipt): 504, or an error event.
- Health: every `health_check_interval_s` GET /health on every worker; `health_failure_threshold`
  consecutive failures mark it unhealthy, one success healthy again; a refused connection during a
  request marks it unhealthy at once. With zero healthy workers requests get 503 at once.
- Marked unhealthy (e.g. a frozen worker: SIGSTOP, a hung GPU) = its requests stop waiting for it
  at once: those without a first byte go to another worker (as a retry), its open streams end with
  an error event. So a frozen worker costs its requests the detection time (about interval +
  threshold x timeout), never `request_timeout_s`.
- Stall limit `stall_timeout_s` (default 60 s): an open stream whose worker then sends nothing for
  that long is ended with an error event (and counts as one failed health check). The wait for the
  FIRST event has no such limit: a queued request or a 126k-token prefill may take minutes on a busy
  worker and is healthy. Between two events of a healthy SGLang server there is one scheduler step:
  a decode step (~20-50 ms for 8B on an L40) or a chunked-prefill step (a few seconds at most), so
  60 s never ends a healthy stream, whether the answer has 4 tokens or 128, and ends a silent one
  in a minute instead of the ten of the request deadline.
- Bad input, answered before any work: a body over `max_body_bytes` (default 4 MiB; a 128k-token
  prompt as ids plus its text is ~1.6 MB) -> 413 without reading it; not JSON or nested too deeply
  -> 400; fields outside protocol.FORWARDED_KEYS / SAMPLING_KEYS -> 400 naming them (so only known
  fields are forwarded). Bodies over 64 KiB are parsed and tokenized in a parser process (one,
  spawned on the first such body), not on the event loop: JSON decoding and the tokenizer's regex
  hold the GIL, so a thread would still stall small requests (~0.1 s for a 4 MB text prompt).
- Start-up: the service refuses to start (NoHealthyWorkersError, exit code 2 from the CLI) when
  none of the workers answers /health within `startup_health_timeout_s`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import math
import signal
import sys
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

from repro.backends.sglang import protocol
from repro.routing.trackers import tracker_access
from repro.workloads.request import Request

log = logging.getLogger("repro.router_service")
INLINE_PARSE_BYTES = 64 << 10  # bodies up to this are parsed on the event loop (~1 ms of work)


class NoHealthyWorkersError(RuntimeError):
    """The router service cannot start: no worker answered its health check."""


@dataclass
class RouterServiceConfig:
    """Knobs of the router service (conf/backend/sglang.yaml `router_service:` + what orchestrate fills)."""

    worker_urls: list[str]
    kv_capacity_tokens: list[int] | None = None  # per worker; None: ask each worker's /server_info
    eviction_policy: str = "lru"  # what the workers run (approximate trackers mirror it)
    view_tracker: bool = True
    view_tracker_granularity: str = "node"
    seed: int = 0  # the router's seed (the simulator's SeedPlan.router)
    time_scale: float = 1.0
    request_timeout_s: float = 600.0
    connect_timeout_s: float = 5.0
    max_retries: int = 2
    health_check_interval_s: float = 5.0
    health_check_timeout_s: float = 20.0
    health_failure_threshold: int = 2
    startup_health_timeout_s: float = 10.0
    load_poll_interval_s: float = 0.0
    tokenizer: dict | None = None  # the cell's workload.tokenizer (for text requests); None = the default
    # A stream that sent its first event and then sends nothing for this long (wall seconds) is
    # ended with an error (see the module docstring for why 60 s). The wait for the first event
    # has no such limit: a long prefill or a long queue is healthy.
    stall_timeout_s: float = 60.0
    max_body_bytes: int = 4 << 20  # larger request bodies get 413 before anything is parsed

    def __post_init__(self) -> None:
        if not self.worker_urls:
            raise ValueError("router service: worker_urls is empty")
        for u in self.worker_urls:
            if not isinstance(u, str) or not u.startswith(("http://", "https://")):
                raise ValueError(f"router service: worker url {u!r} must start with http:// or https://")
        if self.kv_capacity_tokens is not None and len(self.kv_capacity_tokens) != len(self.worker_urls):
            raise ValueError(
                f"router service: {len(self.kv_capacity_tokens)} capacities for {len(self.worker_urls)} workers"
            )
        for name in ("time_scale", "request_timeout_s", "connect_timeout_s", "health_check_interval_s",
                     "health_check_timeout_s", "startup_health_timeout_s", "stall_timeout_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"router service: {name} must be a number > 0, got {v!r}")
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ValueError(f"router service: max_retries must be an integer >= 0, got {self.max_retries!r}")
        if not isinstance(self.health_failure_threshold, int) or self.health_failure_threshold < 1:
            raise ValueError(
                f"router service: health_failure_threshold must be an integer >= 1, got {self.health_failure_threshold!r}"
            )
        if isinstance(self.max_body_bytes, bool) or not isinstance(self.max_body_bytes, int) or self.max_body_bytes < 1024:
            raise ValueError(f"router service: max_body_bytes must be an integer >= 1024, got {self.max_body_bytes!r}")
        if not isinstance(self.load_poll_interval_s, (int, float)) or self.load_poll_interval_s < 0:
            raise ValueError(f"router service: load_poll_interval_s must be >= 0, got {self.load_poll_interval_s!r}")


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
        self.running: dict[int, int] = {}  # key -> KV tokens held (prompt + generated so far)
        self.waiting_prefill = 0
        self.active_kv = 0
        self.live_generated = 0
        self.tracker: Any = None
        self.polled: dict | None = None
        self.dispatched = 0
        self.completed = 0
        self.failed_attempts = 0
        self.flights: dict[int, "_Flight"] = {}  # key -> request forwarded here and not released
        self.down_at: float | None = None  # loop time it was last marked unhealthy

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


class LiveWorkerView:
    """Read-only WorkerView (repro/routing/base.py) of one worker, from the service's bookkeeping."""

    __slots__ = ("worker_id", "_w", "_svc")

    def __init__(self, state: WorkerState, service: "RouterService"):
        self.worker_id = state.worker_id
        self._w = state
        self._svc = service

    @property
    def in_flight(self) -> int:
        return len(self._w.waiting) + len(self._w.running)

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
        return (f"LiveWorkerView(worker_id={self.worker_id}, healthy={w.healthy}, waiting={len(w.waiting)}, "
                f"running={len(w.running)})")


@dataclass
class _Flight:
    """One request on its way through the service."""

    key: int
    request: Any  # repro Request used for routing
    prompt_key: bytes
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

    def abort(self, kind: str, message: str) -> None:
        if self.abort_reason is not None:
            return
        self.abort_reason = (kind, message)
        if self.phase is not None and not self.phase.done():
            self.phase.cancel()
        if self.worker_resp is not None:
            self.worker_resp.close()  # the pending read of the stream ends at once


class _ClientGone(Exception):
    """Writing to the client failed: it disconnected."""


class _AttemptFailed(Exception):
    """A worker failed before the first byte reached the client: the request may be retried."""

    def __init__(self, message: str, hard: bool = False, retry: bool = True):
        super().__init__(message)
        self.hard = hard  # the worker is unreachable: mark it unhealthy at once
        self.retry = retry


class RouterService:
    """The proxy: `await start(host, port)`, then serve; `await stop()`."""

    def __init__(self, router: Any, config: RouterServiceConfig, cost_model: Any = None):
        self.router = router
        self.config = config
        self.cost_model = cost_model
        self.workers = [WorkerState(i, u) for i, u in enumerate(config.worker_urls)]
        self.views = [LiveWorkerView(w, self) for w in self.workers]
        self._next_key = 0
        self._t0 = 0.0
        self._session = None
        self._runner = None
        self._tasks: list[asyncio.Task] = []
        self._tokenizer = None
        self._pool = None
        self.port: int | None = None
        # counters (GET /stats)
        self.received = 0
        self.completed = 0
        self.failed = 0
        self.rejected = 0
        self.retried = 0
        self.callbacks = 0
        self.callbacks_skipped = 0
        self.callback_errors: list[str] = []
        self.route_ns = 0
        self.route_calls = 0
        self.complete_ns = 0
        self.failures: dict[str, int] = {}
        self.capacity_notes: list[str] = []

    # ------------------------------------------------------------------ clock
    def now_s(self) -> float:
        return (asyncio.get_running_loop().time() - self._t0) * self.config.time_scale

    # ------------------------------------------------------------------ lifecycle
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        import aiohttp
        from aiohttp import web

        loop = asyncio.get_running_loop()
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            timeout=aiohttp.ClientTimeout(total=None),
            read_bufsize=protocol.MAX_LINE_BYTES,
        )
        try:
            await self._startup_checks()
            self._setup_trackers()
            self.router.reset(self.views, int(self.config.seed))
        except BaseException:
            await self._session.close()
            raise
        self._t0 = loop.time()
        self._tasks.append(asyncio.create_task(self._health_loop()))
        if self.config.load_poll_interval_s > 0:
            self._tasks.append(asyncio.create_task(self._poll_loop()))
        app = web.Application(client_max_size=self.config.max_body_bytes)
        app.router.add_route("POST", "/generate", self.handle_generate)
        app.router.add_route("PUT", "/generate", self.handle_generate)
        app.router.add_get("/health", self.handle_health)
        app.router.add_get("/stats", self.handle_stats)
        app.router.add_get("/workers", self.handle_workers)
        self._runner, self.port = await protocol.serve_app(app, host, port, shutdown_timeout=2.0)
        return self.port

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    async def _get_json(self, url: str, timeout_s: float) -> Any:
        import aiohttp

        async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}")
            return await resp.json(content_type=None)

    async def _check_health(self, w: WorkerState, timeout_s: float) -> str | None:
        """None if healthy, else the reason."""
        import aiohttp

        try:
            async with self._session.get(f"{w.url}/health", timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                await r.read()
                return None if r.status == 200 else f"/health answered HTTP {r.status}"
        except asyncio.TimeoutError:
            return f"/health timed out after {timeout_s:g}s"
        except (aiohttp.ClientError, OSError) as exc:
            return f"/health failed: {type(exc).__name__}: {exc}"

    async def _startup_checks(self) -> None:
        cfg = self.config
        deadline = time.monotonic() + cfg.startup_health_timeout_s
        reasons: dict[int, str] = {}
        while True:
            results = await asyncio.gather(
                *(self._check_health(w, min(cfg.health_check_timeout_s, cfg.startup_health_timeout_s))
                  for w in self.workers)
            )
            reasons = {w.worker_id: r for w, r in zip(self.workers, results) if r is not None}
            if not reasons or time.monotonic() >= deadline:
                break
            await asyncio.sleep(min(0.25, max(0.0, deadline - time.monotonic())))
        if len(reasons) == len(self.workers):
            lines = "; ".join(f"worker {i} {self.workers[i].url}: {r}" for i, r in sorted(reasons.items()))
            raise NoHealthyWorkersError(
                f"router service: none of the {len(self.workers)} workers is healthy after "
                f"{cfg.startup_health_timeout_s:g}s ({lines})"
            )
        for i, r in reasons.items():
            self.workers[i].mark_failure(r, 1, hard=True)
            log.warning("worker %d unhealthy at start: %s", i, r)
        # Capacities: the worker's own number when it reports one, else the configured one; a
        # worker down at start without either gets the others' (workers of a cell are alike).
        caps: dict[int, int] = {}
        for w in self.workers:
            configured = cfg.kv_capacity_tokens[w.worker_id] if cfg.kv_capacity_tokens is not None else None
            reported = None
            if w.healthy:
                try:
                    info = await self._get_json(f"{w.url}/server_info", cfg.health_check_timeout_s)
                    v = info.get("max_total_num_tokens") if isinstance(info, dict) else None
                    reported = int(v) if isinstance(v, int) and v > 0 else None
                except Exception as exc:  # older servers / no endpoint: fall back to the config
                    log.info("worker %d: no /server_info (%s)", w.worker_id, exc)
            if reported is not None and configured is not None and reported != configured:
                note = f"worker {w.worker_id}: reports {reported} KV tokens, config says {configured}: using {reported}"
                log.warning(note)
                self.capacity_notes.append(note)
            cap = reported if reported is not None else configured
            if cap is not None:
                caps[w.worker_id] = int(cap)
        if not caps:
            raise NoHealthyWorkersError(
                "router service: no worker reports its KV capacity (/server_info max_total_num_tokens) "
                "and none is configured (kv_capacity_tokens)"
            )
        for w in self.workers:
            if w.worker_id not in caps:
                fill = next(iter(caps.values()))
                self.capacity_notes.append(f"worker {w.worker_id}: capacity unknown (down at start), assumed {fill}")
            w.capacity = caps.get(w.worker_id, next(iter(caps.values())))

    def _setup_trackers(self) -> None:
        cfg = self.config
        if not cfg.view_tracker:
            return
        from repro.kvcache import make_cache

        seeds = np.random.SeedSequence(int(cfg.seed) + 1).spawn(len(self.workers))
        for w, s in zip(self.workers, seeds):
            w.tracker = make_cache(
                w.capacity,
                {"name": cfg.eviction_policy, "granularity": cfg.view_tracker_granularity},
                int(s.generate_state(1)[0]),
            )

    async def _health_loop(self) -> None:
        cfg = self.config
        while True:
            await asyncio.sleep(cfg.health_check_interval_s)
            results = await asyncio.gather(*(self._check_health(w, cfg.health_check_timeout_s) for w in self.workers))
            for w, r in zip(self.workers, results):
                if r is None:
                    w.mark_success()
                else:
                    w.mark_failure(r, cfg.health_failure_threshold)

    async def _poll_loop(self) -> None:
        cfg = self.config
        while True:
            for w in self.workers:
                try:
                    data = await self._get_json(f"{w.url}/v1/loads", cfg.health_check_timeout_s)
                    loads = data.get("loads") if isinstance(data, dict) else None
                    if isinstance(loads, list) and loads and isinstance(loads[0], dict):
                        w.polled = loads[0]
                except Exception as exc:
                    log.debug("worker %d: /v1/loads failed: %s", w.worker_id, exc)
            await asyncio.sleep(cfg.load_poll_interval_s)

    # ------------------------------------------------------------------ bookkeeping
    def _prompt_ids(self, inp: protocol.GenerateInput) -> np.ndarray:
        if inp.input_ids is not None:
            return inp.input_ids
        if self._tokenizer is None:  # routing-only token ids for text requests: the cell's tokenizer
            from repro.workloads.tokenizer import make_tokenizer

            self._tokenizer = make_tokenizer(self.config.tokenizer)
        return np.asarray(self._tokenizer.encode(inp.text), dtype=np.int32)

    def _on_dispatch(self, f: _Flight, w: WorkerState) -> None:
        f.worker = w.worker_id
        w.dispatched += 1
        w.flights[f.key] = f
        plen = len(f.prompt_key) // 4
        hit = int(w.tracker.peek_prefix(f.prompt_key)) if w.tracker is not None else 0
        w.waiting[f.key] = plen - hit
        w.waiting_prefill += plen - hit
        if w.tracker is not None:
            tracker_access(w.tracker, f.prompt_key)

    def _on_tokens(self, f: _Flight, w: WorkerState, new_tokens: int) -> None:
        if new_tokens <= 0:
            return
        if f.key in w.waiting:
            w.waiting_prefill -= w.waiting.pop(f.key)
            held = len(f.prompt_key) // 4
            w.running[f.key] = held
            w.active_kv += held
        w.running[f.key] += new_tokens
        w.active_kv += new_tokens
        w.live_generated += new_tokens

    def _release(self, f: _Flight, w: WorkerState) -> None:
        w.flights.pop(f.key, None)
        if f.key in w.waiting:
            w.waiting_prefill -= w.waiting.pop(f.key)
        held = w.running.pop(f.key, None)
        if held is not None:
            w.active_kv -= held
            w.live_generated -= held - len(f.prompt_key) // 4

    def _count_failure(self, f: _Flight, kind: str) -> None:
        """A request that will not complete: count it and let the router release its state."""
        self.failed += 1
        self.failures[kind] = self.failures.get(kind, 0) + 1
        self._abandon(f)

    def _abandon(self, f: _Flight) -> None:
        """Tell the router that the request it routed to `f.chosen` will not complete there."""
        try:
            self.router.on_request_abandoned(f.request, f.chosen, self.now_s())
        except Exception as exc:  # a router bug must not take the service down; it is reported
            msg = f"on_request_abandoned(request {f.request.id}, worker {f.chosen}): {type(exc).__name__}: {exc}"
            log.exception(msg)
            if len(self.callback_errors) < 20:
                self.callback_errors.append(msg)

    def _next_worker(self, tried: Sequence[int]) -> WorkerState | None:
        best = None
        for w in self.workers:
            if not w.healthy or w.worker_id in tried:
                continue
            load = len(w.waiting) + len(w.running)
            if best is None or load < best[0]:
                best = (load, w)
        return best[1] if best else None

    def _finish_success(self, f: _Flight, w: WorkerState) -> None:
        now_wall = asyncio.get_running_loop().time()
        self._release(f, w)
        w.completed += 1
        self.completed += 1
        tr = f.tracker
        ids = np.asarray(tr.output_ids, dtype=np.int32)
        if len(ids) != tr.completion_tokens:  # the worker did not send ids: keep the count honest
            ids = np.zeros(tr.completion_tokens, dtype=np.int32)
        if w.tracker is not None:
            tracker_access(w.tracker, f.prompt_key + ids.astype("<i4").tobytes())
        if f.worker != f.chosen:  # served elsewhere after a failure: no latency sample of the chosen worker
            self.callbacks_skipped += 1
            self._abandon(f)
            return
        scale = self.config.time_scale
        latency = (now_wall - f.recv_wall) * scale
        ttft = (f.first_token_wall - f.recv_wall) * scale if not math.isnan(f.first_token_wall) else latency
        r = f.request
        done = Request(r.id, r.arrival_s, r.prompt_tokens, len(ids), ids, r.group_id, r.conversation_id, r.turn, r.text)
        t0 = time.perf_counter_ns()
        try:
            self.router.on_request_complete(done, f.chosen, latency, ttft, int(tr.cached_tokens), self.now_s())
            self.callbacks += 1
        except Exception as exc:  # a router bug must not take the service down; it is reported
            msg = f"on_request_complete(request {r.id}, worker {f.chosen}): {type(exc).__name__}: {exc}"
            log.exception(msg)
            if len(self.callback_errors) < 20:
                self.callback_errors.append(msg)
        self.complete_ns += time.perf_counter_ns() - t0

    def _attempt_failed(self, f: _Flight, w: WorkerState, exc: _AttemptFailed) -> None:
        self._release(f, w)
        w.failed_attempts += 1
        f.attempts.append((w.worker_id, str(exc)))
        w.mark_failure(str(exc), self.config.health_failure_threshold, hard=exc.hard)

    # ------------------------------------------------------------------ HTTP handlers
    async def handle_health(self, request):
        from aiohttp import web

        ok = any(w.healthy for w in self.workers)
        return web.Response(status=200 if ok else 503)

    def stats(self) -> dict:
        return {
            "received": self.received,
            "completed": self.completed,
            "failed": self.failed,
            "rejected": self.rejected,
            "retried": self.retried,
            "failures": dict(self.failures),
            "callbacks": self.callbacks,
            "callbacks_skipped": self.callbacks_skipped,
            "callback_errors": list(self.callback_errors),
            "capacity_notes": list(self.capacity_notes),
            "routing": {
                "decisions": self.route_calls,
                "total_s": self.route_ns / 1e9,
                "mean_ms_per_decision": self.route_ns / self.route_calls / 1e6 if self.route_calls else None,
            },
            "completion_callback": {
                "calls": self.callbacks,
                "total_s": self.complete_ns / 1e9,
                "mean_ms_per_call": self.complete_ns / self.callbacks / 1e6 if self.callbacks else None,
            },
            "workers": [self._worker_info(w) for w in self.workers],
        }

    def _worker_info(self, w: WorkerState) -> dict:
        return {
            "worker_id": w.worker_id,
            "url": w.url,
            "healthy": w.healthy,
            "last_error": w.last_error,
            "kv_capacity_tokens": w.capacity,
            "dispatched": w.dispatched,
            "completed": w.completed,
            "failed_attempts": w.failed_attempts,
            "in_flight": len(w.waiting) + len(w.running),
            "waiting": len(w.waiting),
            "active_kv_tokens": w.active_kv,  # the router's estimate (prompt + generated so far)
        }

    async def handle_stats(self, request):
        from aiohttp import web

        return web.json_response(self.stats())

    async def handle_workers(self, request):
        from aiohttp import web

        return web.json_response([self._worker_info(w) for w in self.workers])

    def _reject(self, status: int, message: str, kind: str):
        from aiohttp import web

        self.rejected += 1
        resp = web.json_response(protocol.error_body(message, kind, status), status=status)
        if status == 413:  # close instead of reading the rest of a too-large body to reuse the connection
            resp.force_close()
        return resp

    def _fail(self, f: _Flight, status: int, message: str, kind: str):
        from aiohttp import web

        self._count_failure(f, kind)
        tried = "; ".join(f"worker {w}: {e}" for w, e in f.attempts)
        if tried:
            message = f"{message} (attempts: {tried})"
        return web.json_response(protocol.error_body(message, kind, status), status=status)

    def _parse_request(self, raw: bytes) -> tuple[protocol.GenerateInput, np.ndarray]:
        """Body bytes -> (parsed request, prompt ids for routing); ProtocolError (-> 400) names the problem."""
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise protocol.ProtocolError(f"body is not JSON: {exc}") from None
        except RecursionError:
            raise protocol.ProtocolError("body is not acceptable JSON: nested too deeply") from None
        protocol.check_known_keys(body)
        inp = protocol.parse_generate_request(body)
        return inp, self._prompt_ids(inp)

    def _parse_pool(self):
        """One parser process for big bodies: they queue behind each other, never in front of small
        requests, and their JSON / tokenizer work (C code that holds the GIL: a thread would still
        stall the loop) runs outside this process. Started on the first big body."""
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_parser_init, initargs=(self.config,))
        return self._pool

    def warm_parser(self) -> None:
        """Start the parser process now (it imports for ~0.5 s), not on the first big body."""
        self._parse_pool().submit(_parse_in_child, b'{"input_ids": [1]}')

    async def handle_generate(self, request):
        from aiohttp import web

        loop = asyncio.get_running_loop()
        recv_wall = loop.time()
        self.received += 1
        limit = self.config.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            return self._reject(413, f"request body of {request.content_length} bytes exceeds the limit of "
                                     f"{limit} bytes (router_service.max_body_bytes)", "request_too_large")
        try:
            raw = await request.read()  # aiohttp stops a chunked body at client_max_size (= the limit)
        except web.HTTPRequestEntityTooLarge:
            return self._reject(413, f"request body exceeds the limit of {limit} bytes "
                                     f"(router_service.max_body_bytes)", "request_too_large")
        try:
            if len(raw) > INLINE_PARSE_BYTES:  # big bodies: JSON and tokenizer work off the event loop
                inp, prompt = await loop.run_in_executor(self._parse_pool(), _parse_in_child, raw)
            else:
                inp, prompt = self._parse_request(raw)
        except protocol.ProtocolError as exc:
            return self._reject(400, str(exc), "invalid_request_error")
        except BrokenProcessPool as exc:  # the parser process died (OOM?): a fresh one for the next body
            self._pool = None
            log.error("request parser process died: %s", exc)
            return self._reject(500, f"the router's request parser process died: {exc}", "internal")

        key = self._next_key
        self._next_key += 1
        n_out = inp.max_new_tokens
        gen = np.zeros(n_out, dtype=np.int32)  # the reply is unknown at dispatch (routers must not read it)
        if inp.reference_output_ids is not None and len(inp.reference_output_ids) == n_out:
            gen = inp.reference_output_ids
        req = Request(key, self.now_s(), prompt, n_out, gen, 0, 0, 0, inp.text)
        t0 = time.perf_counter_ns()
        try:
            chosen = self.router.select_worker(req, self.views, self.now_s())
        except Exception as exc:
            log.exception("select_worker failed")
            return self._reject(500, f"router {type(self.router).__name__}.select_worker failed: {exc}", "internal")
        self.route_ns += time.perf_counter_ns() - t0
        self.route_calls += 1
        if isinstance(chosen, (bool, np.bool_)) or not isinstance(chosen, (int, np.integer)) or not (
            0 <= int(chosen) < len(self.workers)
        ):
            return self._reject(500, f"router returned worker {chosen!r}; valid ids are 0..{len(self.workers) - 1}",
                                "internal")
        f = _Flight(key, req, prompt.astype("<i4").tobytes(), recv_wall, int(chosen), raw, inp.stream)
        f.tracker.where = "worker response"
        try:
            async with asyncio.timeout_at(recv_wall + self.config.request_timeout_s):
                return await self._serve(f, request)
        except TimeoutError:
            if f.worker >= 0:
                self._release(f, self.workers[f.worker])
            message = f"request timed out after {self.config.request_timeout_s:g}s"
            if f.response is None:
                return self._fail(f, 504, message, "timeout")
            self._count_failure(f, "timeout")  # the stream was already open: end it with an error event
            await _write_quietly(f.response, protocol.finish_event_error(f"router: {message}", 504, "timeout"))
            return f.response

    async def _serve(self, f: _Flight, request):
        tried: list[int] = []
        w = self.workers[f.chosen]
        if not w.healthy:
            w = self._next_worker(tried)
        while True:
            if w is None:
                kind = "no_healthy_worker"
                return self._fail(f, 503, "no healthy worker left to serve the request", kind)
            tried.append(w.worker_id)
            if len(tried) > 1:
                self.retried += 1
            self._on_dispatch(f, w)
            try:
                return await self._attempt(f, w, request)
            except _AttemptFailed as exc:
                self._attempt_failed(f, w, exc)
                if not exc.retry or len(tried) > self.config.max_retries:
                    return self._fail(f, 502, f"worker {w.worker_id} failed: {exc}", "worker_failed")
                w = self._next_worker(tried)

    async def _attempt(self, f: _Flight, w: WorkerState, request):
        """One try on worker w; raises _AttemptFailed while nothing was sent to the client.

        The wait for the worker's first byte runs as its own task so that marking the worker
        unhealthy (f.abort) ends it at once and the request moves on, instead of waiting for a
        frozen worker until the request deadline."""
        from aiohttp import web

        f.abort_reason = None
        phase = asyncio.ensure_future(self._open(f, w))
        f.phase = phase
        try:
            await asyncio.wait({phase})
        finally:
            f.phase = None
            if not phase.done():  # our own deadline: the phase closes what it opened
                phase.cancel()
        if phase.cancelled():
            raise _AttemptFailed((f.abort_reason or ("", "attempt ended"))[1])
        opened = phase.result()  # _AttemptFailed passes through
        if opened[0] == "reply":  # the request itself is bad: pass the worker's answer through
            _, status, text = opened
            self._release(f, w)
            self._count_failure(f, "worker_rejected")
            return web.Response(status=status, body=text.encode(), content_type="application/json",
                                headers={protocol.WORKER_HEADER: str(w.worker_id)})
        if f.abort_reason is not None:  # marked down while this task was waking up: nothing sent yet
            if opened[0] == "stream":
                opened[1].close()
            raise _AttemptFailed(f.abort_reason[1])
        if opened[0] == "json":
            return self._relay_json(f, w, opened[1])
        _, resp, lines, first = opened
        async with resp:
            f.worker_resp = resp
            try:
                return await self._relay_stream(f, w, lines, first, request)
            finally:
                f.worker_resp = None

    async def _open(self, f: _Flight, w: WorkerState):
        """Send the request to w and wait for its first byte: ("stream", resp, lines, first line),
        ("json", whole body) or ("reply", status, text) for a 4xx; _AttemptFailed otherwise."""
        import aiohttp

        url = f"{w.url}/generate"
        try:
            resp = await self._session.post(
                url,
                data=f.body,
                headers={"Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=None, connect=self.config.connect_timeout_s),
            )
        except (aiohttp.ClientConnectionError, OSError) as exc:
            raise _AttemptFailed(f"cannot reach {url}: {type(exc).__name__}: {exc}", hard=True) from None
        except aiohttp.ClientError as exc:
            raise _AttemptFailed(f"{url}: {type(exc).__name__}: {exc}") from None
        keep = False  # True: the caller owns resp (an open stream)
        try:
            if resp.status >= 500:
                text = await _safe_text(resp)
                raise _AttemptFailed(f"HTTP {resp.status} from {url}: {text}")
            if resp.status != 200:
                return "reply", resp.status, await _safe_text(resp)
            if not f.stream:
                try:
                    return "json", await resp.read()
                except (aiohttp.ClientError, OSError) as exc:
                    raise _AttemptFailed(f"connection lost reading the reply: {type(exc).__name__}: {exc}",
                                         hard=True) from None
            lines = protocol.iter_sse_lines(resp.content)
            try:
                first = await lines.__anext__()
            except StopAsyncIteration:
                raise _AttemptFailed("stream closed before the first event") from None
            except (aiohttp.ClientError, OSError) as exc:
                raise _AttemptFailed(f"connection lost before the first event: {type(exc).__name__}: {exc}",
                                     hard=True) from None
            except protocol.ProtocolError as exc:
                raise _AttemptFailed(str(exc), retry=False) from None
            keep = True
            return "stream", resp, lines, first
        except BaseException:  # an error, or cancelled by abort() or the deadline: drop the connection
            resp.close()
            raise
        finally:
            if not keep:
                resp.release()  # no-op after close(); else the read body's connection is reused

    def _relay_json(self, f: _Flight, w: WorkerState, raw: bytes):
        from aiohttp import web

        try:
            obj = json.loads(raw)
            new = f.tracker.add(obj)
            if not f.tracker.finished:
                raise protocol.ProtocolError("reply has no finish_reason")
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, protocol.ProtocolError,
                protocol.WorkerReportedError) as exc:
            self._release(f, w)
            return self._fail(f, 502, f"malformed reply from worker {w.worker_id}: {exc}", "malformed")
        f.first_token_wall = asyncio.get_running_loop().time()
        self._on_tokens(f, w, new)
        self._finish_success(f, w)
        return web.Response(body=raw, content_type="application/json",
                            headers={protocol.WORKER_HEADER: str(w.worker_id)})

    async def _relay_stream(self, f: _Flight, w: WorkerState, lines, first: bytes, request):
        import aiohttp
        from aiohttp import web

        loop = asyncio.get_running_loop()
        where = f"worker {w.worker_id}"
        out = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                      protocol.WORKER_HEADER: str(w.worker_id)})
        await out.prepare(request)
        f.response = out
        # Stall watchdog: one timer per stream, re-armed lazily (a read only stamps f.last_event).
        stall = self.config.stall_timeout_s
        f.last_event = loop.time()
        timer = None

        def _watch() -> None:
            nonlocal timer
            if loop.time() - f.last_event >= stall:
                f.abort("stalled", f"worker {w.worker_id} sent nothing for {stall:g}s in the middle of the "
                                   f"stream (router_service.stall_timeout_s)")
            else:
                timer = loop.call_at(f.last_event + stall, _watch)

        timer = loop.call_at(f.last_event + stall, _watch)
        done = False
        error: tuple[str, str] | None = None  # (kind, message) sent to the client as an error event
        line: bytes | None = first
        try:
            while line is not None:
                ev = protocol.parse_sse_line(line, where)
                if ev is protocol.DONE:
                    done = True
                    break
                if ev is not None:
                    try:
                        new = f.tracker.add(ev)
                    except protocol.WorkerReportedError as exc:
                        error = ("worker_error", str(exc))
                        break
                    if new > 0 and math.isnan(f.first_token_wall):
                        f.first_token_wall = loop.time()
                    self._on_tokens(f, w, new)
                    await _write_or_gone(out, line.rstrip(b"\r\n") + b"\n\n")
                try:
                    line = await lines.__anext__()
                    f.last_event = loop.time()
                except StopAsyncIteration:
                    line = None
        except _ClientGone:
            error = ("client_gone", "client disconnected")
        except protocol.ProtocolError as exc:
            error = ("malformed", f"malformed response from worker {w.worker_id}: {exc}")
        except (aiohttp.ClientError, OSError) as exc:
            error = ("worker_failed", f"connection to worker {w.worker_id} lost mid-stream: "
                                      f"{type(exc).__name__}: {exc}")
            if f.abort_reason is None:  # not our own close of the connection (abort)
                w.mark_failure(error[1], self.config.health_failure_threshold, hard=True)
        finally:
            timer.cancel()
        finished = error is None and done and f.tracker.finished
        if not finished and f.abort_reason is not None and (error is None or error[0] != "client_gone"):
            error = f.abort_reason
            if error[0] == "stalled":  # counts against the worker like a failed health check
                w.mark_failure(error[1], self.config.health_failure_threshold)
        if error is None and not finished:
            error = ("incomplete", f"stream from worker {w.worker_id} ended before the request finished")
        if error is None:
            self._finish_success(f, w)
            await _write_quietly(out, b"data: [DONE]\n\n", eof=True)
            try:  # read the worker's body to its end so that its connection is reused
                async for _ in lines:
                    pass
            except Exception:
                pass
            return out
        self._release(f, w)
        self._count_failure(f, error[0])
        if error[0] != "client_gone":
            code = 504 if error[0] == "stalled" else 502
            await _write_quietly(out, protocol.finish_event_error(f"router: {error[1]}", code, error[0]), eof=True)
        return out


async def _write_or_gone(out, data: bytes) -> None:
    try:
        await out.write(data)
    except (ConnectionError, OSError, RuntimeError) as exc:  # aiohttp: "Cannot write to closing transport"
        raise _ClientGone(str(exc)) from None


async def _write_quietly(out, data: bytes, eof: bool = False) -> None:
    try:
        await out.write(data)
        if eof:
            await out.write_eof()
    except (ConnectionError, OSError, RuntimeError):
        pass


async def _safe_text(resp, limit: int = 500) -> str:
    try:
        text = await resp.text()
    except Exception as exc:  # the body itself may be broken
        return f"<unreadable body: {exc}>"
    return text if len(text) <= limit else text[:limit] + "..."


# ---------------------------------------------------------------------------- parser process
_PARSER: RouterService | None = None


def _parser_init(config: RouterServiceConfig) -> None:
    """In the parser process: a service shell with the same config, for _parse_request / _prompt_ids
    (so the parser tokenizes exactly as the service would)."""
    global _PARSER
    _PARSER = RouterService(None, config)  # never started: only its parsing and tokenizer are used


def _parse_in_child(raw: bytes) -> tuple[protocol.GenerateInput, np.ndarray]:
    inp, ids = RouterService._parse_request(_PARSER, raw)
    return dataclasses.replace(inp, body={}), ids  # the body is not needed back (and may be megabytes)


# ---------------------------------------------------------------------------- construction / CLI
def build_router(router_cfg: dict) -> Any:
    """The router object from a conf/router/<name>.yaml mapping (hydra.utils.instantiate)."""
    import hydra.utils
    from omegaconf import OmegaConf

    return hydra.utils.instantiate(OmegaConf.create(router_cfg))


def service_from_file(path: str) -> RouterService:
    """{"router": <cfg.router>, "model": <cfg.model>, "hardware": <cfg.hardware>, "service": {...}}."""
    with open(path) as fh:
        spec = json.load(fh)
    missing = [k for k in ("router", "service") if k not in spec]
    if missing:
        raise ValueError(f"{path}: missing keys {missing}")
    cost_model = None
    if spec.get("model") is not None and spec.get("hardware") is not None:
        from repro.costmodel import StepCostModel

        cost_model = StepCostModel.from_config(spec["model"], spec["hardware"])
    known = set(RouterServiceConfig.__dataclass_fields__)
    unknown = sorted(set(spec["service"]) - known)
    if unknown:
        raise ValueError(f"{path}: unknown router service keys {unknown}; known: {sorted(known)}")
    return RouterService(build_router(spec["router"]), RouterServiceConfig(**spec["service"]), cost_model)


async def _serve(service: RouterService, host: str, port: int) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        bound = await service.start(host, port)
    except NoHealthyWorkersError as exc:
        print(f"ERROR: {exc}", file=sys.stderr, flush=True)
        return 2
    service.warm_parser()
    log.info("router service (%s) on http://%s:%d in front of %d workers",
             type(service.router).__name__, host, bound, len(service.workers))
    await stop.wait()
    log.info("router service stopping: %s", json.dumps({k: v for k, v in service.stats().items() if k != "workers"}))
    await service.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="repro router service (SGLang /generate proxy with repro routers)")
    ap.add_argument("--config", required=True, help="JSON: router, model, hardware, service")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args(argv)
    protocol.raise_open_file_limit()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        service = service_from_file(args.config)
    except Exception as exc:
        print(f"ERROR: router service: bad config {args.config}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(service, args.host, args.port))


__all__ = [
    "LiveWorkerView",
    "NoHealthyWorkersError",
    "RouterService",
    "RouterServiceConfig",
    "WorkerState",
    "build_router",
    "service_from_file",
    "main",
]

if __name__ == "__main__":
    sys.exit(main())

"""RouterService: the proxy itself (lifecycle, HTTP handlers, routing, retries, router callbacks).

Behaviour (what the router sees, the completion callback, faults): the package docstring,
router_service/__init__.py. The pieces it puts together: ledger.py (bookkeeping, the router's
view), health.py (health and capacity discovery), parsing.py (request bodies), relay.py (one
attempt on one worker).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Sequence

import numpy as np

from repro.backends.sglang import protocol
from repro.backends.sglang.config import RouterServiceConfig
from repro.backends.sglang.router_service import health, stall
from repro.backends.sglang.router_service.ledger import Flight, LiveWorkerView, WorkerState
from repro.backends.sglang.router_service.parsing import (
    INLINE_PARSE_BYTES,
    ParserPool,
    RequestParser,
    check_content_type,
    parse_in_child,
)
from repro.backends.sglang.router_service.relay import (
    AttemptFailed,
    open_attempt,
    relay_json,
    relay_stream,
    write_quietly,
)
from repro.kvcache import as_key
from repro.workloads.request import Request

log = logging.getLogger("repro.router_service")


class RouterService:
    """The proxy: `await start(host, port)`, then serve; `await stop()`."""

    def __init__(self, router: Any, config: RouterServiceConfig, cost_model: Any = None):
        self.router = router
        self.config = config
        self.cost_model = cost_model
        self.workers = [WorkerState(i, u) for i, u in enumerate(config.worker_urls)]
        self.views = [LiveWorkerView(w, self) for w in self.workers]
        self.parser = RequestParser(config.tokenizer)
        self._prompt_ids = self.parser.prompt_ids  # as on EmulatedWorker: text -> ids (tests compare the two)
        self._pool = ParserPool(config.tokenizer)
        self._next_key = 0
        self._t0 = 0.0
        self._session = None
        self._runner = None
        self._tasks: list[asyncio.Task] = []
        self.port: int | None = None
        # counters (GET /stats)
        self.received = 0
        self.completed = 0
        self.failed = 0
        self.rejected = 0
        self.retried = 0
        self.diverted = 0  # new requests the router sent to an excluded (stalled) worker, served elsewhere
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
            self.capacity_notes += await health.discover(self._session, self.workers, self.config)
            health.setup_trackers(self.workers, self.config)
            self.router.reset(self.views, int(self.config.seed))
        except BaseException:
            await self._session.close()
            raise
        self._t0 = loop.time()
        self._tasks.append(asyncio.create_task(health.health_loop(self._session, self.workers, self.config)))
        if self.config.stall_exclude:
            self._tasks.append(
                asyncio.create_task(
                    stall.stall_loop(self.workers, self.config.stall_exclude_floor_s, self.config.stall_exclude_factor)
                )
            )
        if self.config.load_poll_interval_s > 0:
            self._tasks.append(asyncio.create_task(health.poll_loop(self._session, self.workers, self.config)))
        app = web.Application(client_max_size=self.config.max_body_bytes)
        app.router.add_route("POST", "/generate", self.handle_generate)
        app.router.add_route("PUT", "/generate", self.handle_generate)
        app.router.add_get("/health", self.handle_health)
        app.router.add_get("/stats", self.handle_stats)
        app.router.add_get("/workers", self.handle_workers)
        try:
            self._runner, self.port = await protocol.serve_app(
                app, host, port, shutdown_timeout=2.0, keepalive_timeout=self.config.client_timeout_s
            )
        except BaseException:  # e.g. the port is taken: nothing started here outlives the failure
            await self.stop()
            raise
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
        self._pool.shutdown()

    def warm_parser(self) -> None:
        """Start the parser process for big bodies now (parsing.py), not on the first one."""
        self._pool.warm()

    # ------------------------------------------------------------------ outcomes
    def _on_dispatch(self, f: Flight, w: WorkerState) -> None:
        w.dispatch(f)

    def _count_failure(self, f: Flight, kind: str) -> None:
        """A request that will not complete: count it and let the router release its state."""
        self.failed += 1
        self.failures[kind] = self.failures.get(kind, 0) + 1
        self._abandon(f)

    def _callback_error(self, msg: str) -> None:  # a router bug must not take the service down; it is reported
        log.exception(msg)
        if len(self.callback_errors) < 20:
            self.callback_errors.append(msg)

    def _abandon(self, f: Flight) -> None:
        """Tell the router that the request it routed to `f.chosen` will not complete there."""
        try:
            self.router.on_request_abandoned(f.request, f.chosen, self.now_s())
        except Exception as exc:
            self._callback_error(
                f"on_request_abandoned(request {f.request.id}, worker {f.chosen}): {type(exc).__name__}: {exc}"
            )

    def _next_worker(self, tried: Sequence[int]) -> WorkerState | None:
        """The healthy untried worker with the fewest requests in flight (ties: lowest id); one
        excluded as stalled only when no other is left."""
        best = None
        for w in self.workers:
            if not w.healthy or w.worker_id in tried:
                continue
            rank = (w.stall.excluded, w.in_flight)
            if best is None or rank < best[0]:
                best = (rank, w)
        return best[1] if best else None

    def _finish_success(self, f: Flight, w: WorkerState) -> None:
        now_wall = asyncio.get_running_loop().time()
        w.release(f)
        self.completed += 1
        tr = f.tracker
        ids = np.asarray(tr.output_ids, dtype=np.int32)
        if len(ids) != tr.completion_tokens:  # the worker did not send ids: keep the count honest
            ids = np.zeros(tr.completion_tokens, dtype=np.int32)
        w.record_completion(f, ids)
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
        except Exception as exc:
            self._callback_error(f"on_request_complete(request {r.id}, worker {f.chosen}): {type(exc).__name__}: {exc}")
        self.complete_ns += time.perf_counter_ns() - t0

    def _attempt_failed(self, f: Flight, w: WorkerState, exc: AttemptFailed) -> None:
        w.release(f)
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
            "stall": {"exclusions": sum(w.stall.exclusions for w in self.workers), "diverted": self.diverted},
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
            "workers": [w.info() for w in self.workers],
        }

    async def handle_stats(self, request):
        from aiohttp import web

        return web.json_response(self.stats())

    async def handle_workers(self, request):
        from aiohttp import web

        return web.json_response([w.info() for w in self.workers])

    def _reject(self, status: int, message: str, kind: str):
        from aiohttp import web

        self.rejected += 1
        resp = web.json_response(protocol.error_body(message, kind, status), status=status)
        if status == 413:  # close instead of reading the rest of a too-large body to reuse the connection
            resp.force_close()
        return resp

    def _fail(self, f: Flight, status: int, message: str, kind: str):
        from aiohttp import web

        self._count_failure(f, kind)
        tried = "; ".join(f"worker {w}: {e}" for w, e in f.attempts)
        if tried:
            message = f"{message} (attempts: {tried})"
        return web.json_response(protocol.error_body(message, kind, status), status=status)

    async def handle_generate(self, request):
        from aiohttp import web

        loop = asyncio.get_running_loop()
        recv_wall = loop.time()
        self.received += 1
        limit = self.config.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            return self._reject(
                413,
                f"request body of {request.content_length} bytes exceeds the limit of "
                f"{limit} bytes (router_service.max_body_bytes)",
                "request_too_large",
            )
        try:
            check_content_type(request.headers.get("Content-Type"))
        except protocol.ProtocolError as exc:
            return self._reject(400, str(exc), "invalid_request_error")
        try:
            async with asyncio.timeout(self.config.client_timeout_s):  # a half-sent body holds nothing forever
                raw = await request.read()  # aiohttp stops a chunked body at client_max_size (= the limit)
        except web.HTTPRequestEntityTooLarge:
            return self._reject(
                413,
                f"request body exceeds the limit of {limit} bytes (router_service.max_body_bytes)",
                "request_too_large",
            )
        except TimeoutError:
            resp = self._reject(
                408,
                f"request body not received within {self.config.client_timeout_s:g}s (router_service.client_timeout_s)",
                "request_timeout",
            )
            resp.force_close()
            return resp
        except ConnectionError:  # the client left while sending its body: nobody to answer, no traceback
            self.rejected += 1
            self.failures["client_gone"] = self.failures.get("client_gone", 0) + 1
            resp = web.Response(status=400)
            resp.force_close()
            return resp
        try:
            if len(raw) > INLINE_PARSE_BYTES:  # big bodies: JSON and tokenizer work off the event loop
                inp, prompt = await loop.run_in_executor(self._pool.get(), parse_in_child, raw)
            else:
                inp, prompt = self.parser.parse(raw)
        except protocol.ProtocolError as exc:
            return self._reject(400, str(exc), "invalid_request_error")
        except BrokenProcessPool as exc:  # the parser process died (OOM?): a fresh one for the next body
            self._pool.reset()
            log.error("request parser process died: %s", exc)
            return self._reject(500, f"the router's request parser process died: {exc}", "internal")

        fits = max((w.capacity for w in self.workers), default=0)
        if len(prompt) > fits:  # no worker could ever hold it: refused here, not after a round trip
            return self._reject(
                400,
                f"prompt of {len(prompt)} tokens exceeds every worker's KV cache (largest: {fits} tokens)",
                "invalid_request_error",
            )
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
        if (
            isinstance(chosen, (bool, np.bool_))
            or not isinstance(chosen, (int, np.integer))
            or not (0 <= int(chosen) < len(self.workers))
        ):
            return self._reject(
                500, f"router returned worker {chosen!r}; valid ids are 0..{len(self.workers) - 1}", "internal"
            )
        f = Flight(key, req, as_key(prompt), recv_wall, int(chosen), raw, inp.stream)
        f.tracker.where = "worker response"
        try:
            async with asyncio.timeout_at(recv_wall + self.config.request_timeout_s):
                return await self._serve(f, request)
        except TimeoutError:
            if f.worker >= 0:
                self.workers[f.worker].release(f)
            message = f"request timed out after {self.config.request_timeout_s:g}s"
            if f.response is None:
                return self._fail(f, 504, message, "timeout")
            self._count_failure(f, "timeout")  # the stream was already open: end it with an error event
            await write_quietly(f.response, protocol.finish_event_error(f"router: {message}", 504, "timeout"))
            return f.response

    async def _serve(self, f: Flight, request):
        """Retries: the router's choice, then the least-loaded healthy untried workers."""
        tried: list[int] = []
        w = self.workers[f.chosen]
        if not w.healthy:
            w = self._next_worker(tried)
        elif w.stall.excluded:  # stalled: another worker unless every other is down or stalled too
            other = self._next_worker([w.worker_id])
            if other is not None and not other.stall.excluded:
                w = other
                self.diverted += 1
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
            except AttemptFailed as exc:
                self._attempt_failed(f, w, exc)
                if not exc.retry or len(tried) > self.config.max_retries:
                    return self._fail(f, 502, f"worker {w.worker_id} failed: {exc}", "worker_failed")
                w = self._next_worker(tried)

    async def _attempt(self, f: Flight, w: WorkerState, request):
        """One try on worker w; raises AttemptFailed while nothing was sent to the client.

        The wait for the worker's first byte runs as its own task so that marking the worker
        unhealthy (f.abort) ends it at once and the request moves on, instead of waiting for a
        frozen worker until the request deadline."""
        from aiohttp import web

        f.abort_reason = None
        phase = asyncio.ensure_future(open_attempt(self._session, self.config.connect_timeout_s, f, w))
        f.phase = phase
        try:
            await asyncio.wait({phase})
        finally:
            f.phase = None
            if not phase.done():  # our own deadline: the phase closes what it opened
                phase.cancel()
        if phase.cancelled():
            raise AttemptFailed((f.abort_reason or ("", "attempt ended"))[1])
        opened = phase.result()  # AttemptFailed passes through
        w.progress()
        if opened[0] == "reply":  # the request itself is bad: pass the worker's answer through
            _, status, text = opened
            w.release(f)
            self._count_failure(f, "worker_rejected")
            return web.Response(
                status=status,
                body=text.encode(),
                content_type="application/json",
                headers={protocol.WORKER_HEADER: str(w.worker_id)},
            )
        if f.abort_reason is not None:  # marked down while this task was waking up: nothing sent yet
            if opened[0] == "stream":
                opened[1].close()
            raise AttemptFailed(f.abort_reason[1])
        if opened[0] == "json":
            return relay_json(self, f, w, opened[1])
        _, resp, lines, first = opened
        async with resp:
            f.worker_resp = resp
            try:
                return await relay_stream(self, f, w, lines, first, request)
            finally:
                f.worker_resp = None


__all__ = ["RouterService"]

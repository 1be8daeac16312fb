"""Emulated SGLang worker: no GPU, the same HTTP protocol, the simulator's scheduler and step costs.

    python -m repro.backends.sglang.emulated_worker --config worker0.json --host 127.0.0.1 --port 30001

An aiohttp server answering SGLang 0.5.23's `/generate` (streaming and not; see
repro.backends.sglang.protocol), `/health`, `/health_generate`, `/server_info`, `/v1/loads`,
plus `/emulator/stats` (its cache and step counters). It lets the router service, the client and
the node orchestration run end to end on a laptop or in CI.

What runs inside (one place per idea): the simulator's own worker, `repro.sim.worker.SimWorker`
(SGLang-like continuous batching over a `repro.kvcache` radix cache, with that module's
documented simplifications), driven here by a real-time loop instead of the simulator's event
heap, and timed by the same step-cost model (`repro.costmodel.StepCostModel`). A step of
modelled duration d sleeps d / time_scale wall seconds. The worker's clock is emulated seconds:
while the worker is busy the next step starts exactly when the previous one was due to end (so
wall-clock overheads do not pile up on its timeline, as on a GPU that runs ahead of its host),
unless it has fallen more than MAX_LAG_WALL_S (20 ms) of wall time behind, in which case the debt
is dropped; when it is idle the clock catches up with the wall clock (x time_scale).

Choices the real server makes differently (stated so no one mistakes this for SGLang):
- Output tokens: the request's `custom_labels.repro_output_ids` (the workload's recorded reply, sent by our
  client) when present, else deterministic pseudo-random ids; exactly max_new_tokens of them
  (SGLang with ignore_eos does the same count). So prompt + reply paths — and hence the cache —
  are the ones the simulator sees.
- `meta_info.cached_tokens` is the simulator's hit count (the computed prefix matched at
  admission; a fully cached prompt reports its full length).
- A request whose client disconnects still runs to completion (SGLang aborts it).
- `text` requests are tokenized with the cell's tokenizer (`tokenizer`, the workload's); `text` in replies is "".
- Requests needing more KV than the whole cache get HTTP 400 (SGLang also refuses them).

time_scale: emulated seconds per wall second (10 = ten times faster than real time). Every time
the worker reports or uses is emulated time. Wall-clock costs outside the model (HTTP hops, JSON,
Python scheduling, ~0.1-2 ms each) are multiplied by time_scale when read on the emulated clock,
so a higher time_scale makes latencies look worse than the simulator's by about
(overhead x time_scale) and makes timing-dependent decisions (load-aware routing, which requests
share a batch) noisier; the hit rate is affected only through those decisions.

Test hooks (`fault` in the config; never set in experiments): "malformed" (stream garbage),
"http500", "hang" (never answer /generate), "never_healthy" (/health is 503 forever), and
{"exit_after_requests": N} (the process dies hard when its N-th /generate arrives).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import sys
from typing import Any

import numpy as np

from repro.backends.sglang import cli_common as cli, protocol
from repro.backends.sglang.config import FAULTS, EmulatorConfig
from repro.workloads.request import Request

log = logging.getLogger("repro.emulated_worker")

MAX_LAG_WALL_S = 0.02


def _growing_table():
    """A repro.sim RequestTable that grows as requests arrive over HTTP."""
    from repro.sim.worker import RequestTable

    class GrowingRequestTable(RequestTable):
        __slots__ = ()

        def __init__(self) -> None:
            super().__init__([])

        def add(self, request) -> int:
            i = self.n
            prompt = np.ascontiguousarray(request.prompt_tokens, dtype=np.int32)
            self.requests.append(request)
            self.arrival_s.append(float(request.arrival_s))
            self.prompt_tokens.append(prompt)
            self.prompt_key.append(prompt.tobytes())
            self.prompt_len.append(len(prompt))
            self.output_len.append(int(request.output_len))
            for name, value in (
                ("worker", -1),
                ("first_token_s", math.nan),
                ("finish_s", math.nan),
                ("cached_tokens", 0),
                ("compute_start", 0),
                ("compute_len", 0),
                ("prefilled", 0),
                ("lock_node", None),
                ("est_hit", 0),
                ("peek_len", 0),
                ("peek_version", -1),
            ):
                getattr(self, name).append(value)
            self.n = i + 1
            return i

    return GrowingRequestTable()


class _Stream:
    __slots__ = ("rid", "queue", "emitted", "output_ids", "open")

    def __init__(self, rid: str, output_ids: np.ndarray):
        self.rid = rid
        self.queue: asyncio.Queue = asyncio.Queue()
        self.emitted = 0
        self.output_ids = output_ids
        self.open = True


class EmulatedWorker:
    """One emulated worker: the HTTP app plus the real-time loop around a SimWorker."""

    def __init__(self, cfg: EmulatorConfig, cost_model: Any = None):
        from repro.kvcache import make_cache
        from repro.sim.worker import SchedulerConfig, SimWorker

        self.cfg = cfg
        if cost_model is None:
            from repro.costmodel import StepCostModel

            cost_model = StepCostModel.from_config(cfg.model, cfg.hardware)
        self.cost_model = cost_model
        self.time_scale = float(cfg.time_scale)
        self.cache = make_cache(int(cfg.kv_capacity_tokens), dict(cfg.eviction), int(cfg.seed))
        self.table = _growing_table()
        self.sim = SimWorker(
            int(cfg.worker_id),
            self.cache,
            cost_model,
            SchedulerConfig.from_config(cfg.scheduler),
            self.table,
            str(cfg.eviction["name"]),
            observer=self._observe,
        )
        self.streams: dict[int, _Stream] = {}
        self.running: list[int] = []  # first token emitted, not finished (the decode batch)
        self._step_info = None
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task | None = None
        self._t0_wall = 0.0
        self._clock = 0.0  # emulated seconds: end of the last step
        self._started_wall = 0.0
        self.requests_received = 0
        self.requests_finished = 0
        self.scheduler_error: BaseException | None = None
        self._runner = None
        self.port: int | None = None
        self._prompt_ids = protocol.PromptIds(cfg.tokenizer)  # text requests: the cell's tokenizer

    # ------------------------------------------------------------------ clock
    def now(self) -> float:
        """Emulated seconds since start (wall x time_scale)."""
        return (asyncio.get_running_loop().time() - self._t0_wall) * self.time_scale

    def _wall_at(self, emulated_s: float) -> float:
        return self._t0_wall + emulated_s / self.time_scale

    # ------------------------------------------------------------------ scheduler
    def _observe(self, event: str, worker: Any, info: Any) -> None:
        if event == "start":
            self._step_info = info

    def _has_work(self) -> bool:
        s = self.sim
        return bool(s.waiting) or s.chunked >= 0 or s.n_running > 0

    async def _scheduler_loop(self) -> None:
        loop = asyncio.get_running_loop()
        sim = self.sim
        try:
            while True:
                if not self._has_work():
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                now = self.now()
                # Back-to-back steps while busy; a debt of more than MAX_LAG_WALL_S of wall time
                # (the process was starved) is forgiven rather than repaid in a burst.
                start = self._clock if now - self._clock <= MAX_LAG_WALL_S * self.time_scale else now
                dur = sim.start_step(start)
                if dur < 0:  # work that cannot be scheduled yet (cannot happen with validated sizes)
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                info = self._step_info
                end = start + dur
                delay = self._wall_at(end) - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    await asyncio.sleep(0)  # let the HTTP handlers run between back-to-back steps
                done = sim.end_step(end)
                self._clock = end
                self._emit(info, done)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a broken invariant: fail every open request loudly
            log.exception("emulated worker %d: scheduler failed", self.cfg.worker_id)
            self.scheduler_error = exc
            for st in self.streams.values():
                st.queue.put_nowait(exc)

    def _event(self, i: int, st: _Stream, finished: bool) -> dict:
        k = st.emitted
        meta = {
            "id": st.rid,
            "finish_reason": {"type": "length", "length": k} if finished else None,
            "prompt_tokens": self.table.prompt_len[i],
            "completion_tokens": k,
            "cached_tokens": int(self.table.cached_tokens[i]),
        }
        return {"text": "", "output_ids": st.output_ids[:k].tolist(), "meta_info": meta}

    def _emit(self, info: Any, done: list[int]) -> None:
        finished = set(done)
        t = self.table
        if info is not None and info.prefill:
            advanced = [i for i, _ in info.prefill if not math.isnan(t.first_token_s[i])
                        and self.streams[i].emitted == 0]
        else:
            advanced = list(self.running)
        for i in advanced:
            st = self.streams[i]
            st.emitted += 1
            is_done = i in finished
            if st.emitted == 1 and not is_done:
                self.running.append(i)
            st.queue.put_nowait(self._event(i, st, is_done))
        if finished:
            self.running = [i for i in self.running if i not in finished]
            for i in done:
                self.streams.pop(i, None)
                self.requests_finished += 1
        if len(self.running) != self.sim.n_running:  # the SimWorker and this loop disagree
            raise RuntimeError(
                f"emulated worker {self.cfg.worker_id}: {len(self.running)} streams decoding, "
                f"scheduler says {self.sim.n_running}"
            )

    # ------------------------------------------------------------------ admission
    def _output_ids(self, index: int, n: int, reference: np.ndarray | None) -> np.ndarray:
        out = np.empty(n, dtype=np.int32)
        k = 0
        if reference is not None:
            k = min(n, len(reference))
            out[:k] = reference[:k]
        if k < n:
            rng = np.random.default_rng([int(self.cfg.seed) % (2**63), index])
            out[k:] = rng.integers(0, 128_000, n - k, dtype=np.int32)
        return out

    def submit(self, inp: protocol.GenerateInput) -> tuple[int, _Stream]:
        """Queue one request on the scheduler; returns (index, its stream)."""
        if self.scheduler_error is not None:
            raise RuntimeError(f"scheduler failed: {self.scheduler_error!r}")
        prompt = self._prompt_ids(inp)
        n_out = inp.max_new_tokens
        need = len(prompt) + n_out
        if need > self.sim.max_request_kv_tokens:  # capacity - 2 under SGLang's exact admission rule
            raise protocol.ProtocolError(
                f"the request needs {len(prompt)} prompt + {n_out} output = {need} KV tokens, "
                f"more than this worker can admit ({self.sim.max_request_kv_tokens} of its "
                f"{self.sim.capacity} tokens of KV cache)"
            )
        index = self.table.n
        out = self._output_ids(index, n_out, inp.reference_output_ids)
        req = Request(index, self.now(), prompt, n_out, out, 0, 0, 0, None)
        i = self.table.add(req)
        rid = inp.rid or f"emu{self.cfg.worker_id}-{i}"
        st = _Stream(rid, out)
        self.streams[i] = st
        self.table.worker[i] = self.cfg.worker_id
        if not self._has_work():
            # An idle worker's clock catches up with the wall clock before the new work starts.
            self._clock = max(self._clock, self.now())
        self.sim.enqueue(i)
        self._wake.set()
        return i, st

    # ------------------------------------------------------------------ HTTP
    def _healthy(self) -> bool:
        loop = asyncio.get_running_loop()
        if self.cfg.fault == "never_healthy" or self.scheduler_error is not None:
            return False
        return loop.time() - self._started_wall >= self.cfg.startup_delay_s

    async def handle_health(self, request):
        from aiohttp import web

        return web.Response(status=200 if self._healthy() else 503)

    async def handle_server_info(self, request):
        from aiohttp import web

        cfg = self.cfg
        return web.json_response(
            {
                "max_total_num_tokens": self.sim.capacity,
                "radix_eviction_policy": cfg.eviction.get("name"),
                "schedule_policy": "lpm" if self.sim.lpm else "fcfs",
                "max_running_requests": self.sim.max_running,
                "max_prefill_tokens": self.sim.max_prefill_tokens,
                "emulated": True,
                "worker_id": cfg.worker_id,
                "time_scale": self.time_scale,
                "version": "repro-emulated",
            }
        )

    async def handle_loads(self, request):
        from aiohttp import web

        s = self.sim
        load = {
            "dp_rank": 0,
            "num_running_reqs": s.n_running,
            "num_waiting_reqs": len(s.waiting),
            "num_waiting_uncached_tokens": int(s.waiting_prefill_tokens),
            "num_used_tokens": int(s.kv_used_tokens),
            "num_active_tokens": int(s.active_kv_tokens),
            "max_total_num_tokens": s.capacity,
            "max_running_requests": s.max_running,
        }
        return web.json_response({"version": "repro-emulated", "loads": [load]})

    async def handle_stats(self, request):
        from aiohttp import web

        s = self.sim
        stats = self.cache.stats() if hasattr(self.cache, "stats") else {}
        return web.json_response(
            {
                "worker_id": self.cfg.worker_id,
                # where it runs: multi-node tests check the placement with it (all "nodes" may be one host)
                "slurmd_nodename": os.environ.get("SLURMD_NODENAME"),
                "pid": os.getpid(),
                "requests_received": self.requests_received,
                "requests_finished": self.requests_finished,
                "prefill_steps": s.prefill_steps,
                "decode_steps": s.decode_steps,
                "busy_s": s.busy_s,
                "clock_s": self._clock,
                "cache": _jsonable(stats),
                "scheduler_error": repr(self.scheduler_error) if self.scheduler_error else None,
            }
        )

    async def handle_generate(self, request):
        from aiohttp import web

        self.requests_received += 1
        fault = self.cfg.fault
        if isinstance(fault, dict) and self.requests_received >= int(fault["exit_after_requests"]):
            log.error("emulated worker %d: fault hook: exiting hard", self.cfg.worker_id)
            os._exit(137)
        if fault == "http500":
            return web.json_response(protocol.error_body("emulated internal error", "internal", 500), status=500)
        if fault == "hang":
            await asyncio.sleep(3600)
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return web.json_response(protocol.error_body(f"body is not JSON: {exc}"), status=400)
        try:
            inp = protocol.parse_generate_request(body)
            i, st = self.submit(inp)
        except protocol.ProtocolError as exc:
            return web.json_response(protocol.error_body(str(exc)), status=400)
        except RuntimeError as exc:
            return web.json_response(protocol.error_body(str(exc), "internal", 500), status=500)

        if not inp.stream:
            while True:
                ev = await st.queue.get()
                if isinstance(ev, BaseException):
                    return web.json_response(protocol.error_body(repr(ev), "internal", 500), status=500)
                if ev["meta_info"]["finish_reason"] is not None:
                    return web.json_response(ev, headers=self._served_by)

        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream", **self._served_by})
        await resp.prepare(request)
        try:
            if fault == "malformed":
                await st.queue.get()
                await resp.write(b"data: {this is not json\n\n")
                await resp.write(b"data: [DONE]\n\n")
                return resp
            while True:
                ev = await st.queue.get()
                if isinstance(ev, BaseException):
                    await resp.write(protocol.finish_event_error(repr(ev), 500, "internal"))
                    return resp
                await resp.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
                if ev["meta_info"]["finish_reason"] is not None:
                    break
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, ConnectionError):  # client went away: the request still runs
            st.open = False
        return resp

    @property
    def _served_by(self) -> dict:
        # which worker served it, for a client behind a router that does not say (the real one)
        return {protocol.WORKER_HEADER: str(self.cfg.worker_id)}

    def make_app(self):
        from aiohttp import web

        app = web.Application(client_max_size=1 << 28)
        app.router.add_get("/health", self.handle_health)
        app.router.add_get("/health_generate", self.handle_health)
        app.router.add_get("/server_info", self.handle_server_info)
        app.router.add_get("/get_server_info", self.handle_server_info)
        app.router.add_get("/v1/loads", self.handle_loads)
        app.router.add_get("/emulator/stats", self.handle_stats)
        app.router.add_route("POST", "/generate", self.handle_generate)
        app.router.add_route("PUT", "/generate", self.handle_generate)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Start serving; returns the bound port."""
        loop = asyncio.get_running_loop()
        self._t0_wall = self._started_wall = loop.time()
        self._wake = asyncio.Event()
        self._loop_task = asyncio.create_task(self._scheduler_loop())
        self._runner, self.port = await protocol.serve_app(self.make_app(), host, port, shutdown_timeout=1.0)
        return self.port

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except (asyncio.CancelledError, Exception):
                pass
        if self._runner is not None:
            await self._runner.cleanup()


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    return obj


async def _serve(cfg: EmulatorConfig, host: str, port: int) -> None:
    worker = EmulatedWorker(cfg)
    stop = cli.stop_event()
    bound = await worker.start(host, port)
    log.info(
        "emulated worker %d serving on http://%s:%d (capacity %d tokens, eviction %s, time_scale %g)",
        cfg.worker_id, host, bound, cfg.kv_capacity_tokens, cfg.eviction.get("name"), cfg.time_scale,
    )
    await stop.wait()
    await worker.stop()


def main(argv: list[str] | None = None) -> int:
    return cli.server_main(argv, module="repro.backends.sglang.emulated_worker", what="emulated worker",
                           description=__doc__.splitlines()[0], config_help="JSON file with EmulatorConfig keys",
                           load=EmulatorConfig.from_json, serve=_serve)


__all__ = ["FAULTS", "EmulatedWorker", "EmulatorConfig", "main"]

if __name__ == "__main__":
    sys.exit(main())

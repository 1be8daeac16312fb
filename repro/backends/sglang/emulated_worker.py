"""Emulated SGLang worker: no GPU, the same HTTP protocol, the simulator's scheduler and step costs.

    python -m repro.backends.sglang.emulated_worker --config worker0.json --host 127.0.0.1 --port 30001

An aiohttp server answering SGLang 0.5.23's `/generate` (streaming and not; see
repro.backends.sglang.protocol), `/health`, `/health_generate`, `/server_info`, `/v1/loads`,
plus `/emulator/stats` (its cache and step counters). It lets the router service, the client and
the node orchestration run end to end on a laptop or in CI.

What runs inside (one place per idea): the simulator's own worker, `repro.sim.worker.SimWorker`,
driven by a real-time loop instead of the simulator's event heap and timed by the same step-cost
model: realtime_worker.RealTimeWorker (its clock: that module's docstring).

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
- With `enable_metrics` (as SGLang's --enable-metrics, the default) each event carries
  `meta_info.queue_time`: wall seconds from its arrival here to the start of its first prefill step.

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
import os
import sys
from typing import Any

import numpy as np

from repro.backends.sglang import cli_common as cli, protocol
from repro.backends.sglang.config import FAULTS, EmulatorConfig
from repro.backends.sglang.realtime_worker import RealTimeWorker

log = logging.getLogger("repro.emulated_worker")


class EmulatedWorker(RealTimeWorker):
    """One emulated worker: SGLang's HTTP surface in front of a RealTimeWorker."""

    def __init__(self, cfg: EmulatorConfig, cost_model: Any = None):
        super().__init__(cfg, cost_model)
        self.requests_received = 0
        self._runner = None
        self.port: int | None = None

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
        self.start_scheduler()
        self._runner, self.port = await protocol.serve_app(self.make_app(), host, port, shutdown_timeout=1.0)
        return self.port

    async def stop(self) -> None:
        await self.stop_scheduler()
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
        cfg.worker_id,
        host,
        bound,
        cfg.kv_capacity_tokens,
        cfg.eviction.get("name"),
        cfg.time_scale,
    )
    await stop.wait()
    await worker.stop()


def main(argv: list[str] | None = None) -> int:
    return cli.server_main(
        argv,
        module="repro.backends.sglang.emulated_worker",
        what="emulated worker",
        description=__doc__.splitlines()[0],
        config_help="JSON file with EmulatorConfig keys",
        load=EmulatorConfig.from_json,
        serve=_serve,
    )


__all__ = ["FAULTS", "EmulatedWorker", "EmulatorConfig", "main"]

if __name__ == "__main__":
    sys.exit(main())

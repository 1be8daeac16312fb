"""Shared pieces of the live-backend tests: configs, in-process emulated workers, fake workers.

Every helper bounds itself in time: `run_async` wraps a coroutine in a hard timeout, servers are
bound to 127.0.0.1 on free ports and stopped in `finally` blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any, Awaitable, Callable

import numpy as np
import yaml

from repro.backends.sglang import protocol

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"


def need_parts() -> None:
    """The parts the live backend builds on (an ImportError here is a failure, never a skip)."""
    import repro.sim.worker  # noqa: F401
    from repro.kvcache import make_cache  # noqa: F401
    from repro.routing import RandomRouter  # noqa: F401


def load_yaml(rel: str) -> dict:
    with open(CONF / rel) as fh:
        return yaml.safe_load(fh)


def model_cfg() -> dict:
    return load_yaml("model/llama31_8b.yaml")


def hardware_cfg() -> dict:
    return load_yaml("hardware/l40.yaml")


def run_async(coro: Awaitable, timeout_s: float = 60.0) -> Any:
    """Run a coroutine to completion on a fresh loop, failing the test after timeout_s."""

    async def _bounded():
        return await asyncio.wait_for(coro, timeout_s)

    return asyncio.run(_bounded())


def emulator_config(worker_id: int = 0, capacity: int = 50_000, eviction: str = "lru", seed: int = 0,
                    time_scale: float = 50.0, **kw):
    from repro.backends.sglang.emulated_worker import EmulatorConfig

    return EmulatorConfig(worker_id=worker_id, kv_capacity_tokens=capacity,
                          eviction={"name": eviction, "granularity": "node"}, seed=seed,
                          model=model_cfg(), hardware=hardware_cfg(), time_scale=time_scale, **kw)


@contextlib.asynccontextmanager
async def emulated_workers(n: int, **kw):
    """n in-process emulated workers; yields the list (each has .port)."""
    from repro.backends.sglang.emulated_worker import EmulatedWorker

    workers = []
    try:
        for i in range(n):
            w = EmulatedWorker(emulator_config(worker_id=i, seed=i, **kw))
            await w.start()
            workers.append(w)
        yield workers
    finally:
        for w in workers:
            await w.stop()


class FakeWorker:
    """A programmable /generate server: `behaviour(body) -> list of events | ('status', code, text)
    | 'hang' | 'drop'`; events are dicts (sent as SSE) or raw bytes."""

    def __init__(self, behaviour: Callable[[dict], Any], healthy: bool = True, capacity: int = 10_000):
        self.behaviour = behaviour
        self.healthy = healthy
        self.capacity = capacity
        self.bodies: list[dict] = []
        self.port: int | None = None
        self._runner = None

    async def _generate(self, request):
        from aiohttp import web

        body = await request.json()
        self.bodies.append(body)
        what = self.behaviour(body)
        if what == "hang":
            await asyncio.sleep(3600)
        if what == "drop":  # close the connection without an answer
            request.transport.close()
            return web.Response(status=500)
        if isinstance(what, tuple) and what[0] == "status":
            return web.Response(status=what[1], text=what[2], content_type="application/json")
        if not body.get("stream"):
            return web.json_response([ev for ev in what if isinstance(ev, dict)][-1])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for ev in what:
            if ev == "drop":
                request.transport.close()
                return resp
            data = ev if isinstance(ev, bytes) else b"data: " + json.dumps(ev).encode() + b"\n\n"
            await resp.write(data)
        return resp

    async def _health(self, request):
        from aiohttp import web

        return web.Response(status=200 if self.healthy else 503)

    async def _info(self, request):
        from aiohttp import web

        return web.json_response({"max_total_num_tokens": self.capacity})

    async def start(self) -> int:
        from aiohttp import web

        app = web.Application(client_max_size=1 << 26)  # the router's body limit is what tests probe
        app.router.add_post("/generate", self._generate)
        app.router.add_get("/health", self._health)
        app.router.add_get("/server_info", self._info)
        self._runner, self.port = await protocol.serve_app(app, shutdown_timeout=0.5)
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def sglang_events(body: dict, cached: int = 0, incremental: bool = False) -> list:
    """The events a real SGLang server streams for `body` (cumulative ids by default) + [DONE]."""
    n = body["sampling_params"]["max_new_tokens"]
    plen = len(body["input_ids"])
    ids = [7000 + k for k in range(n)]
    out = []
    for k in range(1, n + 1):
        meta = {"id": body.get("rid", "x"), "finish_reason": {"type": "length", "length": n} if k == n else None,
                "prompt_tokens": plen, "completion_tokens": k, "cached_tokens": cached}
        out.append({"text": "", "output_ids": ids[k - 1:k] if incremental else ids[:k], "meta_info": meta})
    return out + [b"data: [DONE]\n\n"]


def make_requests(n: int, prompt_len: int = 64, output_len: int = 3, rate: float = 50.0, groups: int = 4,
                  seed: int = 0, text: bool = False):
    """n requests in `groups` shared-prefix groups, Poisson arrivals at `rate`."""
    from repro.workloads.request import Request

    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, 50_000, prompt_len // 2) for _ in range(groups)]
    t = 0.0
    out = []
    for i in range(n):
        t += float(rng.exponential(1.0 / rate))
        g = i % groups
        prompt = np.concatenate([prefixes[g], rng.integers(0, 50_000, prompt_len - prompt_len // 2)]).astype(np.int32)
        gen = rng.integers(0, 50_000, output_len).astype(np.int32)
        out.append(Request(i, t, prompt, output_len, gen, g, i, 0, f"group {g} request {i}\n" if text else None))
    return out


class RecordingRouter:
    """A Router that picks `pick(request, views)` (default: round robin) and records every call."""

    name = "recording"

    def __init__(self, pick: Callable | None = None):
        self.pick = pick
        self.selected: list[tuple] = []
        self.completed: list[tuple] = []
        self.abandoned: list[tuple] = []

    def reset(self, workers, seed):
        self.num_workers = len(workers)
        self.counter = 0

    def select_worker(self, request, workers, now_s):
        snapshot = [(v.in_flight, v.waiting, v.running, v.waiting_prefill_tokens, v.active_kv_tokens,
                     v.kv_capacity_tokens, v.peek_prefix(request.prompt_tokens)) for v in workers]
        if self.pick is not None:
            w = self.pick(request, workers)
        else:
            w = self.counter % self.num_workers
            self.counter += 1
        self.selected.append((request, w, now_s, snapshot))
        return w

    def on_request_complete(self, request, worker_id, latency_s, ttft_s, cached_tokens, now_s=None):
        self.completed.append((request, worker_id, latency_s, ttft_s, cached_tokens, now_s))

    def on_request_abandoned(self, request, worker_id, now_s=None):
        self.abandoned.append((request, worker_id, now_s))

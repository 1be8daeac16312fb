"""Health and capacity discovery of the router service's workers.

At start-up `discover` waits (up to startup_health_timeout_s) for the workers' /health, refuses to
start when none answers (NoHealthyWorkersError), and sets each worker's KV capacity: its own
`/server_info` max_total_num_tokens when it reports one, else the configured one. While serving,
`health_loop` probes /health every health_check_interval_s (health_failure_threshold failures
in a row: unhealthy; one success: healthy again) and `poll_loop` reads /v1/loads when
load_poll_interval_s > 0. All of them take the service's aiohttp session and WorkerStates.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Sequence

import numpy as np

from repro.backends.sglang.config import RouterServiceConfig
from repro.backends.sglang.router_service.ledger import WorkerState

log = logging.getLogger("repro.router_service")


class NoHealthyWorkersError(RuntimeError):
    """The router service cannot start: no worker answered its health check."""


async def get_json(session: Any, url: str, timeout_s: float) -> Any:
    import aiohttp

    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}")
        return await resp.json(content_type=None)


async def check_health(session: Any, w: WorkerState, timeout_s: float) -> str | None:
    """None if healthy, else the reason."""
    import aiohttp

    try:
        async with session.get(f"{w.url}/health", timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            await r.read()
            return None if r.status == 200 else f"/health answered HTTP {r.status}"
    except asyncio.TimeoutError:
        return f"/health timed out after {timeout_s:g}s"
    except (aiohttp.ClientError, OSError) as exc:
        return f"/health failed: {type(exc).__name__}: {exc}"


async def discover(session: Any, workers: Sequence[WorkerState], cfg: RouterServiceConfig) -> list[str]:
    """Start-up: health of every worker, then capacities; returns notes on capacities (for /stats)."""
    deadline = time.monotonic() + cfg.startup_health_timeout_s
    reasons: dict[int, str] = {}
    while True:
        results = await asyncio.gather(
            *(check_health(session, w, min(cfg.health_check_timeout_s, cfg.startup_health_timeout_s)) for w in workers)
        )
        reasons = {w.worker_id: r for w, r in zip(workers, results) if r is not None}
        if not reasons or time.monotonic() >= deadline:
            break
        await asyncio.sleep(min(0.25, max(0.0, deadline - time.monotonic())))
    if len(reasons) == len(workers):
        lines = "; ".join(f"worker {i} {workers[i].url}: {r}" for i, r in sorted(reasons.items()))
        raise NoHealthyWorkersError(
            f"router service: none of the {len(workers)} workers is healthy after "
            f"{cfg.startup_health_timeout_s:g}s ({lines})"
        )
    for i, r in reasons.items():
        workers[i].mark_failure(r, 1, hard=True)
        log.warning("worker %d unhealthy at start: %s", i, r)
    # Capacities: the worker's own number when it reports one, else the configured one; a
    # worker down at start without either gets the others' (workers of a cell are alike).
    notes: list[str] = []
    caps: dict[int, int] = {}
    for w in workers:
        configured = cfg.kv_capacity_tokens[w.worker_id] if cfg.kv_capacity_tokens is not None else None
        reported = None
        if w.healthy:
            try:
                info = await get_json(session, f"{w.url}/server_info", cfg.health_check_timeout_s)
                v = info.get("max_total_num_tokens") if isinstance(info, dict) else None
                reported = int(v) if isinstance(v, int) and v > 0 else None
            except Exception as exc:  # older servers / no endpoint: fall back to the config
                log.info("worker %d: no /server_info (%s)", w.worker_id, exc)
        if reported is not None and configured is not None and reported != configured:
            note = f"worker {w.worker_id}: reports {reported} KV tokens, config says {configured}: using {reported}"
            log.warning(note)
            notes.append(note)
        cap = reported if reported is not None else configured
        if cap is not None:
            caps[w.worker_id] = int(cap)
    if not caps:
        raise NoHealthyWorkersError(
            "router service: no worker reports its KV capacity (/server_info max_total_num_tokens) "
            "and none is configured (kv_capacity_tokens)"
        )
    for w in workers:
        if w.worker_id not in caps:
            fill = next(iter(caps.values()))
            notes.append(f"worker {w.worker_id}: capacity unknown (down at start), assumed {fill}")
        w.capacity = caps.get(w.worker_id, next(iter(caps.values())))
    return notes


def setup_trackers(workers: Sequence[WorkerState], cfg: RouterServiceConfig) -> None:
    """One approximate cache per worker (its capacity and eviction policy) when view_tracker."""
    if not cfg.view_tracker:
        return
    from repro.kvcache import make_cache

    seeds = np.random.SeedSequence(int(cfg.seed) + 1).spawn(len(workers))
    for w, s in zip(workers, seeds):
        w.tracker = make_cache(
            w.capacity,
            {"name": cfg.eviction_policy, "granularity": cfg.view_tracker_granularity},
            int(s.generate_state(1)[0]),
        )


async def health_loop(session: Any, workers: Sequence[WorkerState], cfg: RouterServiceConfig) -> None:
    while True:
        await asyncio.sleep(cfg.health_check_interval_s)
        results = await asyncio.gather(*(check_health(session, w, cfg.health_check_timeout_s) for w in workers))
        for w, r in zip(workers, results):
            if r is None:
                w.mark_success()
            else:
                w.mark_failure(r, cfg.health_failure_threshold)


async def poll_loop(session: Any, workers: Sequence[WorkerState], cfg: RouterServiceConfig) -> None:
    """The workers' own waiting / running / used-token counts from /v1/loads (LiveWorkerView)."""
    while True:
        for w in workers:
            try:
                data = await get_json(session, f"{w.url}/v1/loads", cfg.health_check_timeout_s)
                loads = data.get("loads") if isinstance(data, dict) else None
                if isinstance(loads, list) and loads and isinstance(loads[0], dict):
                    w.polled = loads[0]
            except Exception as exc:
                log.debug("worker %d: /v1/loads failed: %s", w.worker_id, exc)
        await asyncio.sleep(cfg.load_poll_interval_s)


__all__ = [
    "NoHealthyWorkersError",
    "check_health",
    "discover",
    "get_json",
    "health_loop",
    "poll_loop",
    "setup_trackers",
]

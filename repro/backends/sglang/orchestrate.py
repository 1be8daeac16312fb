"""Node orchestration for one grid cell: M servers, a router, the client, then a clean teardown.

    plan = plan_cell(cfg, capacities, seeds, log_dir)     # commands, ports, configs (no side effects)
    result = run_plan(plan, requests, progress)           # start, wait, replay, tear down

Planning lives in planning.py, process supervision (local process groups, other nodes' srun
steps, health waits) in processes.py; this module runs a plan and re-exports both.

On a Slurm GPU node (`emulate: false`) each worker is one SGLang server
(`python -m repro.backends.sglang.server --radix-eviction-policy <lru|rlt> ...`: SGLang with the
RLT patch applied) on its own GPU(s) via CUDA_VISIBLE_DEVICES; with `emulate: true` each worker
is an emulated SGLang worker (repro.backends.sglang.emulated_worker) — that is how CI runs this
whole path without a GPU. The router is our router service (`router_impl: ours`, the cell's
cfg.router) or the real Rust `sglang-router` (`router_impl: sglang_router`, cache_aware / random
/ round_robin only). Every process binds 127.0.0.1 on a free port below the kernel's ephemeral
range (ports.py); a router whose port was taken before it bound moves to another. In a Slurm job
of several nodes (`backend.placement: auto`) the servers of the other nodes are started there by
one srun step per node and bind that node's address (node_agent.py; launchers/README.md says what
that exposes), while router, client and results stay on this node.

Guarantees:
- Bounded in time: servers must answer /health within timeouts.server_start_s (the router within
  timeouts.router_start_s), each request has timeouts.request_s, the whole cell timeouts.cell_s.
- A server that exits or never becomes healthy raises ServerStartError naming it, its command
  and the last lines of its log; one that exits after it was healthy, mid-cell, ServerDiedError.
- Teardown always runs (also on errors, Ctrl-C and SIGTERM, which Slurm sends at a job's time
  limit): every process was started in its own process group (session) and the whole group gets
  SIGTERM, then SIGKILL after timeouts.shutdown_grace_s, then whatever is left of its session.
  `logs/exit_codes.json` says per process its exit code and how it ended: "stopped" (it exited
  after our SIGTERM; SGLang's server then kills its own tree, code -9), "killed" (our SIGKILL after
  the grace) or "died" (it had exited before we signalled it).
- Logs stay in the cell folder (`<cell>/logs/`): one log per process, the exact commands and
  environment (`plan.json`), the worker / router config files, the client's report and the
  router's and workers' final statistics.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

from repro.backends.sglang.errors import ServerDiedError
from repro.backends.sglang.planning import (
    ROUTER_IMPLS,
    SGLANG_ROUTER_POLICIES,
    CellPlan,
    CellTimeoutError,
    OrchestrationError,
    ProcessSpec,
    ServerStartError,
    assign_gpus,
    emulated_worker_command,
    free_ports,
    plan_cell,
    router_service_command,
    sglang_router_command,
    sglang_server_command,
)
from repro.backends.sglang.processes import (
    _OPENER,
    HEALTH_PROBE_TIMEOUT_S,
    ManagedProcess,
    RemoteNode,
    RemoteServer,
    check_port_free,
    fatal_log_line,
    probe,
    wait_healthy,
)
from repro.fileio import write_json_atomic

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _sigterm_raises():
    """Turn SIGTERM into SystemExit while the cell runs (main thread only), so teardown runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _handler(signum, frame):
        raise SystemExit(f"received signal {signum}: tearing the cell's processes down")

    previous = signal.signal(signal.SIGTERM, _handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _get_json(url: str, timeout_s: float = 10.0) -> Any:
    try:
        with _OPENER.open(url, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except Exception as exc:  # best effort: statistics only
        return {"error": f"{type(exc).__name__}: {exc}"}


def flush_cache(url: str, timeout_s: float = 60.0) -> None:
    """POST /flush_cache to a real server; OrchestrationError naming it when the server refuses."""
    import urllib.request

    req = urllib.request.Request(
        url + "/flush_cache", data=b"{}", method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            resp.read()
    except Exception as exc:
        raise OrchestrationError(f"{url}/flush_cache failed before the replay: {type(exc).__name__}: {exc}") from exc


def server_eviction_stats(log_path: str) -> dict | None:
    """The last `repro-radix evict:` counters of a server log (None: nothing was evicted)."""
    from repro.backends.sglang.rlt_patch import eviction_log_stats

    try:
        with open(log_path, "rb") as fh:
            return eviction_log_stats(fh.read().decode("utf-8", "replace"))
    except OSError:
        return None


@dataclass
class PlanResult:
    records: Any  # pandas DataFrame, RECORD_COLUMNS
    client_report: dict
    router_stats: dict | None
    worker_stats: list | None
    startup_s: dict
    router_port_moves: int = 0  # how often the router's port was taken before it bound (_start_router)


async def _stream_worker_state(router_url: str, log: Callable[[dict], None], every_s: float = 2.0) -> None:
    """Per-worker curves of a live cell for W&B (the keys of repro.tracking.series): the router
    service's own view of each worker (in flight, waiting, estimated KV use), polled from /stats."""
    import aiohttp

    async with aiohttp.ClientSession(trust_env=False) as session:
        while True:
            await asyncio.sleep(every_s)
            try:
                async with session.get(f"{router_url}/stats", timeout=aiohttp.ClientTimeout(total=every_s)) as r:
                    workers = (await r.json())["workers"]
            except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, ValueError):
                continue  # a missed point; the cell itself is judged by the replay
            point = {}
            for w in workers:
                i = w["worker_id"]
                point[f"in_flight/w{i}"] = w["in_flight"]
                point[f"queue/w{i}"] = w["waiting"]
                point[f"kv_use/w{i}"] = w["active_kv_tokens"]
            log(point)


def _died(r: Any, rc: int) -> ServerDiedError:
    """A server (or node step) that had been healthy exited while we had sent it nothing: a death."""
    if isinstance(r, ManagedProcess):
        return ServerDiedError(r.describe_failure(f"exited with code {rc} in the middle of the cell"))
    return ServerDiedError(r.failure(f"the server step ended with code {rc} in the middle of the cell"))


ROUTER_PORT_TRIES = 3


def _start_router(plan: CellPlan, deadline: float) -> tuple[ManagedProcess, float, int]:
    """Start the router; where its port was taken meanwhile (the log says so), move it to a fresh one.

    Returns the healthy router, the seconds its last start took, and how often it moved."""
    host = urlsplit(plan.router_url).hostname or "127.0.0.1"
    for moves in range(ROUTER_PORT_TRIES):
        router = ManagedProcess(plan.router)
        router.start()
        try:
            return router, wait_healthy([router], plan.timeouts["router_start_s"], deadline=deadline), moves
        except BaseException:
            lost_port = fatal_log_line(router) is not None
            router.stop(plan.timeouts["shutdown_grace_s"])
            if not lost_port or moves == ROUTER_PORT_TRIES - 1:
                raise
        taken = urlsplit(plan.router_url).port
        port, prometheus_port = free_ports(2, host)
        log.warning("%s: port %s was taken before it could bind; moving it to %d", plan.router.name, taken, port)
        plan.move_router(port, prometheus_port)
    raise AssertionError("unreachable")


def _check_router(router: ManagedProcess) -> None:
    """ServerStartError naming the router when it has exited (ours or sglang-router): the requests
    it failed are the router's loss, not the policy's, so the cell fails instead of being saved."""
    rc = router.poll()
    if rc is not None:
        raise ServerStartError(router.describe_failure(f"exited with code {rc} in the middle of the cell"))


def run_plan(
    plan: CellPlan, requests: Sequence[Any], progress: Callable[[float], None] | None = None, client: Any = None
) -> PlanResult:
    """Start the workers and the router, replay `requests`, collect statistics, tear down.

    `client`: the workload's client plan (protocol=artifact, repro.workloads.clients): `requests`
    are then what it may send, and it decides the sends (client_loop.py)."""
    from repro.backends.sglang.client import ClientConfig, replay
    from repro.backends.sglang.client_loop import client_replay

    t_start = time.monotonic()
    cell_deadline = t_start + plan.timeouts["cell_s"]
    Path(plan.log_dir).mkdir(parents=True, exist_ok=True)
    write_json_atomic(os.path.join(plan.log_dir, "plan.json"), plan.describe())
    procs: list[ManagedProcess] = []
    remote = [
        RemoteNode(node, plan.remote_nodes()[node.name], plan)
        for node in plan.nodes[1:]
        if node.name in plan.remote_nodes()
    ]
    startup: dict[str, float] = {}
    try:
        with _sigterm_raises():
            for spec in plan.workers:
                if spec.node is None:
                    check_port_free(spec)
                    p = ManagedProcess(spec)
                    procs.append(p)
                    p.start()
            for r in remote:
                r.start()
            servers: list[Any] = list(procs)
            t0 = time.monotonic()
            for r in remote:  # their addresses first, then everyone's health
                plan.bind_urls(r.wait_addresses(min(t0 + plan.timeouts["server_start_s"], cell_deadline)))
                servers += r.servers()
            wait_healthy(servers, plan.timeouts["server_start_s"] - (time.monotonic() - t0), deadline=cell_deadline)
            startup["workers_s"] = time.monotonic() - t0
            for p in servers:  # one that lost its port to another process answers /health through that one
                rc = p.poll()
                if rc is not None:
                    raise ServerStartError(p.describe_failure(f"exited with code {rc} while the others became healthy"))
            if remote:
                write_json_atomic(os.path.join(plan.log_dir, "plan.json"), plan.describe())  # with the real URLs
            if not plan.emulate:  # the server's warm-up request left a path in the cache: every cell starts empty
                for url in plan.worker_urls:
                    flush_cache(url)
            router, startup["router_s"], moves = _start_router(plan, cell_deadline)
            procs.append(router)
            if moves:
                write_json_atomic(os.path.join(plan.log_dir, "plan.json"), plan.describe())  # the port it got
            remaining = cell_deadline - time.monotonic()
            if remaining <= 0:
                raise CellTimeoutError(f"timeouts.cell_s={plan.timeouts['cell_s']:g}s spent before the replay started")
            client_cfg = ClientConfig(**plan.client)

            local_servers = [p for p in procs if p is not router]

            async def _watch_nodes():  # a lost node or server fails the cell (it cannot be replaced)
                while True:
                    _check_router(router)
                    for r in remote + local_servers:
                        rc = r.poll()
                        if rc is not None:
                            return r, rc
                    await asyncio.sleep(0.5)

            async def _replay():
                run = asyncio.ensure_future(
                    replay(requests, plan.router_url, client_cfg, progress)
                    if client is None
                    else client_replay(client, requests, plan.router_url, client_cfg, progress)
                )
                watch = asyncio.ensure_future(_watch_nodes())
                live = getattr(progress, "log", None)
                poll = asyncio.ensure_future(
                    _stream_worker_state(plan.router_url, live)
                    if live is not None and plan.router_impl == "ours"
                    else asyncio.sleep(0)
                )
                try:
                    done, _ = await asyncio.wait({run, watch}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                    if run in done:
                        _check_router(router)  # a dead router fails every request fast: the replay ends first
                        return run.result()
                    if watch in done:
                        raise _died(*watch.result())
                    raise CellTimeoutError(
                        f"the replay ran past timeouts.cell_s={plan.timeouts['cell_s']:g}s "
                        f"(router log: {plan.router.log_path})"
                    )
                finally:
                    for t in (run, watch, poll):
                        t.cancel()
                    await asyncio.gather(run, watch, poll, return_exceptions=True)

            records, report = asyncio.run(_replay())
            for r in remote + local_servers:  # one that died after the watch's last look still fails the cell
                rc = r.poll()
                if rc is not None:
                    raise _died(r, rc)
            write_json_atomic(os.path.join(plan.log_dir, "client_report.json"), report)
            router_stats = None
            if plan.router_impl == "ours":
                router_stats = _get_json(f"{plan.router_url}/stats")
                write_json_atomic(os.path.join(plan.log_dir, "router_stats.json"), router_stats)
            if plan.emulate:
                worker_stats = [_get_json(u + "/emulator/stats", 5.0) for u in plan.worker_urls]
            else:  # what each server's radix cache evicted, from its own log (rlt_patch's evidence line)
                worker_stats = [
                    {"worker_id": i, "eviction": server_eviction_stats(spec.log_path)}
                    for i, spec in enumerate(plan.workers)
                ]
            write_json_atomic(os.path.join(plan.log_dir, "worker_stats.json"), worker_stats)
            return PlanResult(records, report, router_stats, worker_stats, startup, moves)
    finally:
        grace = plan.timeouts["shutdown_grace_s"]
        exit_codes = {}  # name -> {exit_code, ended: stopped | killed | died, left_in_session}
        for p in reversed(procs):  # router first, then the workers
            p.stop(grace)
            exit_codes[p.name] = p.exit_record()
        for r in remote:
            r.stop(grace)
            exit_codes[r.name] = r.exit_record()
        with contextlib.suppress(OSError):
            write_json_atomic(os.path.join(plan.log_dir, "exit_codes.json"), exit_codes)


__all__ = [
    "HEALTH_PROBE_TIMEOUT_S",
    "ROUTER_IMPLS",
    "SGLANG_ROUTER_POLICIES",
    "CellPlan",
    "CellTimeoutError",
    "ManagedProcess",
    "OrchestrationError",
    "PlanResult",
    "ProcessSpec",
    "RemoteNode",
    "RemoteServer",
    "ServerDiedError",
    "ServerStartError",
    "assign_gpus",
    "emulated_worker_command",
    "free_ports",
    "plan_cell",
    "probe",
    "router_service_command",
    "run_plan",
    "sglang_router_command",
    "sglang_server_command",
    "wait_healthy",
]

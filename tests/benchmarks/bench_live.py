"""Overhead of the live path: what the router service adds to a request, measured side by side.

    PYTHONPATH=. python tests/benchmarks/bench_live.py [--requests 200] [--prompt 2048]

One emulated worker runs with time_scale 1e6 (its modelled step times vanish), as its own process;
the router service (random router, then LBGR) runs as its own process in front of it, as in a cell.
The client in this process sends the same GSP-sized requests one at a time (streaming, 4 output
tokens) three ways, interleaved round by round so machine load hits all three alike:
  direct: client -> worker;  random: client -> router(random) -> worker;  lbgr: ... router(LBGR).
It prints wall-clock p50 / p95 per request and the router's added latency (ratio and difference to
direct), plus the router's own routing time per decision (its /stats). On the emulated clock every
wall millisecond of overhead counts time_scale milliseconds: that is the bias emulated latencies
carry against the simulator's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from repro.backends.sglang import orchestrate, protocol  # noqa: E402
from repro.backends.sglang.orchestrate import ManagedProcess, ProcessSpec  # noqa: E402


def _yaml(rel: str) -> dict:
    return yaml.safe_load((ROOT / "conf" / rel).read_text())


async def _one(session, url: str, body: dict) -> float:
    t0 = time.perf_counter()
    async with session.post(url + "/generate", json=body) as r:
        async for line in protocol.iter_sse_lines(r.content):
            pass
    return time.perf_counter() - t0


async def _measure(urls: dict, bodies: list) -> dict:
    import aiohttp

    out = {k: [] for k in urls}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        for body in bodies[:10]:  # warm-up: connections, first-call imports
            for url in urls.values():
                await _one(s, url, body)
        for body in bodies:
            for name, url in urls.items():
                out[name].append(await _one(s, url, body))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--prompt", type=int, default=2048)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_live_"))
    host = "127.0.0.1"
    wport, rport_random, rport_lbgr = orchestrate.free_ports(3)
    py = sys.executable
    worker_cfg = {"worker_id": 0, "kv_capacity_tokens": 10_000_000, "eviction": {"name": "lru", "granularity": "node"},
                  "seed": 0, "model": _yaml("model/llama31_8b.yaml"), "hardware": _yaml("hardware/l40.yaml"),
                  "time_scale": 1e6}
    specs = [ProcessSpec("worker", orchestrate.emulated_worker_command(py, host, wport, str(tmp / "w.json")), {},
                         str(tmp / "worker.log"), f"http://{host}:{wport}/health", str(tmp / "w.json"), worker_cfg)]
    routers = {"random": (rport_random, {"_target_": "repro.routing.RandomRouter", "name": "random"}),
               "lbgr": (rport_lbgr, _yaml("router/lbgr.yaml"))}
    for name, (port, rcfg) in routers.items():
        cfg = {"router": rcfg, "model": worker_cfg["model"], "hardware": worker_cfg["hardware"],
               "service": {"worker_urls": [f"http://{host}:{wport}"], "eviction_policy": "lru", "time_scale": 1.0}}
        path = str(tmp / f"router_{name}.json")
        specs.append(ProcessSpec(f"router_{name}", orchestrate.router_service_command(py, host, port, path), {},
                                 str(tmp / f"router_{name}.log"), f"http://{host}:{port}/health", path, cfg))
    procs = [ManagedProcess(s) for s in specs]
    try:
        procs[0].start()
        orchestrate.wait_healthy(procs[:1], 60)
        for p in procs[1:]:
            p.start()
        orchestrate.wait_healthy(procs[1:], 60)
        rng = np.random.default_rng(0)
        shared = rng.integers(0, 100_000, args.prompt - 128)
        bodies = [protocol.generate_body(np.concatenate([shared, rng.integers(0, 100_000, 128)]), 4)
                  for _ in range(args.requests)]
        urls = {"direct": f"http://{host}:{wport}", "random": f"http://{host}:{rport_random}",
                "lbgr": f"http://{host}:{rport_lbgr}"}
        res = asyncio.run(_measure(urls, bodies))
        stats = {name: orchestrate._get_json(f"http://{host}:{port}/stats") for name, (port, _) in routers.items()}
    finally:
        for p in reversed(procs):
            p.stop(5)
    d50 = float(np.percentile(res["direct"], 50))
    print(f"{args.requests} sequential streaming requests, prompt {args.prompt} tokens, 4 output tokens "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    for name, lat in res.items():
        p50, p95 = float(np.percentile(lat, 50)) * 1e3, float(np.percentile(lat, 95)) * 1e3
        extra = "" if name == "direct" else (f"   x{p50 / (d50 * 1e3):.2f} of direct, +{p50 - d50 * 1e3:.2f} ms "
                                              f"(= +{(p50 - d50 * 1e3) * 5:.0f} ms emulated at time_scale 5)")
        print(f"  {name:7s} p50 {p50:7.2f} ms  p95 {p95:7.2f} ms{extra}")
    for name, st in stats.items():
        r = st.get("routing", {})
        print(f"  router {name}: {r.get('mean_ms_per_decision', float('nan')):.3f} ms per routing decision "
              f"({r.get('decisions')} decisions)")
    print(json.dumps({"logs": str(tmp)}))


if __name__ == "__main__":
    main()

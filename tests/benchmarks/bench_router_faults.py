"""The router service under hostile input and a frozen worker, measured (issue 18's numbers).

    PYTHONPATH=.:tests/live python tests/benchmarks/bench_router_faults.py [--frozen]

Hostile input: the router service runs as its own process (as in a cell) in front of a fake worker;
for each bad body, a separate probe process sends a small request every 20 ms (open loop) for 1 s
and reports their latencies from the moment each was due; this process sends the bad body meanwhile.
--frozen: also the frozen-worker case with the issue's settings (3 emulated workers, health every
1 s, timeout 2 s, threshold 2, request timeout 30 s; one worker SIGSTOPped mid-run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "live"))

PROBE = r"""
import http.client, json, sys, time
host, port, dur = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
body = json.dumps({"input_ids": list(range(8)), "sampling_params": {"max_new_tokens": 1}, "stream": False})
c = http.client.HTTPConnection(host, port, timeout=30)
lat, start, k = [], time.monotonic(), 0
while time.monotonic() - start < dur:
    due = start + k * 0.02
    k += 1
    time.sleep(max(0.0, due - time.monotonic()))
    c.request("POST", "/generate", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    r.read()
    lat.append((time.monotonic() - due) * 1000)
print(json.dumps(lat))
"""


def hostile_cases() -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    words = np.array(["the", "router", "cache", "prefix", "worker", "token", "stream", "a"])
    return {
        "nested JSON (100k deep)": b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "20 MB text prompt": b'{"text": "' + b"a " * 10_000_000 + b'", "sampling_params": {"max_new_tokens": 1}}',
        "1 MB unknown field": json.dumps({"input_ids": [1, 2, 3], "junk": "x" * 1_000_000}).encode(),
        "3.6 MB text prompt": json.dumps({"text": " ".join(rng.choice(words, 600_000)),
                                          "sampling_params": {"max_new_tokens": 1}}).encode(),
    }


async def hostile() -> None:
    import aiohttp
    from live_helpers import FakeWorker, sglang_events
    from test_live_router_faults import _service_process

    w = FakeWorker(lambda body: sglang_events({**body, "input_ids": body.get("input_ids") or [0],
                                               "sampling_params": body.get("sampling_params") or {"max_new_tokens": 1}}))
    await w.start()
    try:
        async with _service_process(Path(tempfile.mkdtemp()), [w.url]) as url, aiohttp.ClientSession() as s:
            port = url.rsplit(":", 1)[1]
            for name, data in hostile_cases().items():
                probe = await asyncio.create_subprocess_exec(sys.executable, "-c", PROBE, "127.0.0.1", port, "1.0",
                                                             stdout=asyncio.subprocess.PIPE)
                await asyncio.sleep(0.3)
                t0 = time.monotonic()
                async with s.post(url + "/generate", data=data, headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    status = r.status
                took = (time.monotonic() - t0) * 1000
                lat = json.loads((await probe.communicate())[0])
                print(f"{name}: HTTP {status} in {took:.0f} ms; {len(lat)} small requests meanwhile: "
                      f"p50 {np.percentile(lat, 50):.1f} ms, p99 {np.percentile(lat, 99):.1f} ms, max {max(lat):.1f} ms",
                      flush=True)
    finally:
        await w.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frozen", action="store_true", help="also the frozen-worker case (issue settings, ~15 s)")
    args = ap.parse_args()
    asyncio.run(hostile())
    if args.frozen:
        from test_live_router_faults import frozen_worker_run

        frozen_worker_run(Path(tempfile.mkdtemp()), 1.0, 2.0, 2, 30.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

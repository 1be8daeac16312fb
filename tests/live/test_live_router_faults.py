"""The router service under faults and hostile input (issue 18), each case bounded and on 127.0.0.1.

- a frozen worker (SIGSTOP): requests without a first byte fail over as soon as it is marked down,
  its open streams end with an error; none waits for the request timeout;
- a stream that stalls mid-way is ended after stall_timeout_s; a long wait for the first token is not;
- deeply nested JSON -> 400, a body over the limit -> 413 (with and without Content-Length), unknown
  fields -> 400; a big text prompt is parsed and tokenized off the event loop; small requests sent
  meanwhile keep their latency (printed; run with -s to see the numbers).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sys
import time

import aiohttp
import numpy as np
import pytest

from repro.backends.sglang import protocol

from live_helpers import FakeWorker, RecordingRouter, emulator_config, need_parts, run_async, sglang_events


@pytest.fixture(autouse=True)
def _parts():
    need_parts()


def service(router, urls, **kw):
    from repro.backends.sglang.router_service import RouterService, RouterServiceConfig

    kw.setdefault("startup_health_timeout_s", 5.0)
    kw.setdefault("health_check_interval_s", 0.2)
    kw.setdefault("health_check_timeout_s", 1.0)
    return RouterService(router, RouterServiceConfig(worker_urls=urls, **kw))


async def stream(session, url, body):
    """(status, error message or None, seconds) of one streamed request read to its end."""
    t0 = time.monotonic()
    async with session.post(url + "/generate", json=body) as r:
        if r.status != 200:
            return r.status, (await r.json(content_type=None))["error"]["message"], time.monotonic() - t0
        tr, err = protocol.OutputTracker(), None
        async for line in protocol.iter_sse_lines(r.content):
            ev = protocol.parse_sse_line(line)
            if ev is not protocol.DONE and err is None:
                try:
                    tr.add(ev)
                except protocol.WorkerReportedError as exc:
                    err = str(exc)
        if err is None and not tr.finished:
            err = "stream ended unfinished"
        return 200, err, time.monotonic() - t0


# ---------------------------------------------------------------------------- frozen worker
def start_workers(tmp_path, n, time_scale):
    """n emulated worker processes; time_scale: one for all, or a list (one per worker)."""
    from repro.backends.sglang.orchestrate import ManagedProcess, ProcessSpec, emulated_worker_command, free_ports

    procs, urls = [], []
    scales = time_scale if isinstance(time_scale, list) else [time_scale] * n
    for i, port in enumerate(free_ports(n)):
        cfg_path = tmp_path / f"worker{i}.json"
        cfg = dataclasses.asdict(emulator_config(worker_id=i, seed=i, capacity=200_000, time_scale=scales[i]))
        cfg_path.write_text(json.dumps(cfg))
        url = f"http://127.0.0.1:{port}"
        p = ManagedProcess(ProcessSpec(f"worker{i}", emulated_worker_command(sys.executable, "127.0.0.1", port,
                                                                              str(cfg_path)),
                                       {}, str(tmp_path / f"worker{i}.log"), url + "/health"))
        p.start()
        procs.append(p)
        urls.append(url)
    return procs, urls


def frozen_worker_run(tmp_path, interval_s=0.2, timeout_s=1.0, threshold=2, request_timeout_s=30.0, n=60,
                      output_len=64, freeze_at_s=0.6, time_scale=2.0, **service_kw):
    """Three emulated worker processes behind the service; worker 1 gets SIGSTOP freeze_at_s after
    the first of n streamed requests (one every 30 ms). Returns the measurements (see the printout);
    `sent_to_frozen`: (seconds after the freeze, latency) of each request dispatched to worker 1
    after it froze."""
    from repro.backends.sglang.orchestrate import wait_healthy

    procs, urls = start_workers(tmp_path, 3, time_scale=time_scale)
    frozen = procs[1].proc.pid
    try:
        wait_healthy(procs, 60)
        redispatch: list[tuple[float, int]] = []
        to_frozen: dict[int, float] = {}  # flight key -> when it was dispatched to worker 1
        ended: dict[int, float] = {}  # flight key -> latency

        async def main():
            svc = service(RecordingRouter(), urls, request_timeout_s=request_timeout_s,
                           health_check_interval_s=interval_s, health_check_timeout_s=timeout_s,
                           health_failure_threshold=threshold, **service_kw)
            port = await svc.start()
            orig, orig_serve = svc._on_dispatch, svc._serve

            def on_dispatch(f, w):  # record when each retry starts, after its first attempt failed
                if f.attempts:
                    redispatch.append((time.monotonic(), w.worker_id))
                if w.worker_id == 1:
                    to_frozen.setdefault(f.key, time.monotonic())
                orig(f, w)

            async def serve(f, request):
                try:
                    return await orig_serve(f, request)
                finally:
                    ended[f.key] = time.monotonic() - f.recv_wall

            svc._on_dispatch, svc._serve = on_dispatch, serve
            url = f"http://127.0.0.1:{port}"
            try:
                async with aiohttp.ClientSession() as s:
                    rng = np.random.default_rng(0)

                    async def one(i):
                        await asyncio.sleep(i * 0.03)
                        body = protocol.generate_body(rng.integers(0, 30_000, 200), output_len)
                        return await stream(s, url, body)

                    tasks = [asyncio.create_task(one(i)) for i in range(n)]
                    await asyncio.sleep(freeze_at_s)
                    os.kill(frozen, signal.SIGSTOP)
                    t_freeze = time.monotonic()
                    results = await asyncio.gather(*tasks)
                return results, t_freeze, svc.workers[1].down_at, svc.workers[1].stall.first_excluded_at, svc.stats()
            finally:
                await svc.stop()

        results, t_freeze, down_at, excluded_at, stats = run_async(main(), request_timeout_s * 2 + 60)
    finally:
        os.kill(frozen, signal.SIGCONT)
        for p in procs:
            p.stop(5)
    gaps = [t - down_at for t, w in redispatch] if down_at is not None else []
    sent = sorted((t - t_freeze, ended[k]) for k, t in to_frozen.items() if t > t_freeze)
    out = {"detect_s": None if down_at is None else down_at - t_freeze, "failover_after_detect_s": gaps,
           "failover_to": [w for _, w in redispatch], "results": results, "stats": stats, "sent_to_frozen": sent,
           "excluded_s": None if excluded_at is None else excluded_at - t_freeze}
    ok = sum(1 for r in results if r[0] == 200 and r[1] is None)
    print(f"\nfrozen worker: excluded from new requests {out['excluded_s']} s after SIGSTOP; {len(sent)} requests "
          f"sent to it after the freeze, at {[round(t, 2) for t, _ in sent]} s, latencies "
          f"{[round(lat, 2) for _, lat in sent]} s")
    print(f"\nfrozen worker (health every {interval_s:g}s, timeout {timeout_s:g}s, threshold {threshold}, request "
          f"timeout {request_timeout_s:g}s): marked down {out['detect_s']:.2f}s after SIGSTOP; {len(gaps)} requests "
          f"failed over, {max(gaps, default=0) * 1000:.0f} ms at most after detection; {ok} ok, {len(results) - ok} "
          f"ended with an error; slowest request {max(r[2] for r in results):.2f}s")
    return out


def test_a_frozen_worker_fails_over_within_moments_of_being_marked_down(tmp_path):
    """Health every 0.2 s, timeout 1 s, threshold 2 -> marked down ~2 s after the freeze; request timeout 30 s."""
    out = frozen_worker_run(tmp_path)
    results, stats, gaps = out["results"], out["stats"], out["failover_after_detect_s"]
    assert out["detect_s"] is not None and out["detect_s"] < 5, "the frozen worker was never marked down"
    assert gaps and all(w != 1 for w in out["failover_to"])  # failovers happened, to the live workers
    assert max(gaps) < 1.0  # failover within moments of detection (also on a loaded machine)
    assert all(r[2] < 15 for r in results)  # nobody waits for the 30 s request timeout
    bad = [r for r in results if not (r[0] == 200 and r[1] is None)]
    assert all("marked unhealthy" in r[1] for r in bad)  # open streams of the frozen worker: clear error
    assert stats["workers"][1]["in_flight"] == 0 and stats["completed"] + stats["failed"] == 60


# ---------------------------------------------------------------------------- stall limit
def _slow_worker(first_delay_s, gap_s):
    """A worker that waits first_delay_s before its first event, then gap_s before the second."""
    from aiohttp import web

    async def generate(request):
        body = await request.json()
        evs = sglang_events(body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(first_delay_s)
        await resp.write(b"data: " + json.dumps(evs[0]).encode() + b"\n\n")
        await asyncio.sleep(gap_s)
        for ev in evs[1:-1]:
            await resp.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
        await resp.write(evs[-1])
        return resp

    fw = FakeWorker(lambda b: None)
    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", fw._health)
    app.router.add_get("/server_info", fw._info)
    return app


@pytest.mark.parametrize("first_delay_s, gap_s, expect", [(1.5, 0.0, "ok"), (0.0, 30.0, "stalled")])
def test_stall_limit_ends_a_silent_stream_but_not_a_long_prefill(first_delay_s, gap_s, expect):
    async def main():
        runner, port_w = await protocol.serve_app(_slow_worker(first_delay_s, gap_s), shutdown_timeout=0.2)
        svc = service(RecordingRouter(), [f"http://127.0.0.1:{port_w}"], stall_timeout_s=0.5,
                       request_timeout_s=20.0)
        port = await svc.start()
        try:
            async with aiohttp.ClientSession() as s:
                res = await stream(s, f"http://127.0.0.1:{port}", protocol.generate_body(np.arange(10), 3))
            return res, svc.stats()
        finally:
            await svc.stop()
            await runner.cleanup()

    (status, err, secs), stats = run_async(main(), 30)
    assert status == 200
    if expect == "ok":  # 1.5 s to the first token (3 x the stall limit) is a long prefill, not a stall
        assert err is None and stats["completed"] == 1
    else:
        assert "sent nothing for 0.5s" in err and "stall_timeout_s" in err
        assert 0.4 < secs < 5 and stats["failures"] == {"stalled": 1}
        assert stats["workers"][0]["in_flight"] == 0


# ---------------------------------------------------------------------------- hostile input
def _pct(xs, q):
    return float(np.percentile(np.asarray(xs) * 1000, q))


@contextlib.asynccontextmanager
async def _service_process(tmp_path, urls, **service_kw):
    """The router service as its own process (as in a cell: `python -m ...router_service`), random
    router; yields its URL. Started and stopped by PID (its process group)."""
    from repro.backends.sglang.orchestrate import ManagedProcess, ProcessSpec, free_ports, router_service_command

    (port,) = free_ports(1)
    cfg = tmp_path / "router.json"
    cfg.write_text(json.dumps({"router": {"_target_": "repro.routing.RandomRouter"},
                               "service": {"worker_urls": urls, "kv_capacity_tokens": [1_000_000] * len(urls),
                                           **service_kw}}))
    url = f"http://127.0.0.1:{port}"
    p = ManagedProcess(ProcessSpec("router", router_service_command(sys.executable, "127.0.0.1", port, str(cfg)), {},
                                   str(tmp_path / "router.log"), url + "/health"))
    p.start()
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(300):
                assert p.poll() is None, p.log_tail()
                try:
                    async with s.get(url + "/health") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # its parser process starts at start-up: let it finish importing
        yield url
    finally:
        await asyncio.get_running_loop().run_in_executor(None, p.stop, 5)


def test_hostile_bodies_get_4xx_without_blocking_small_requests(tmp_path):
    """The service runs as its own process. While each bad body is handled, small requests go out
    every 20 ms (open loop); their latencies are recorded per case, from the moment each was due.
    The big text prompt (~3.6 MB, ~1.2 M pieces, under the 4 MiB default limit) goes through."""
    nested = b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    huge = b'{"text": "' + b"a " * 10_000_000 + b'"}'  # 20 MB
    junk = json.dumps({"input_ids": [1, 2, 3], "junk": "x" * 1_000_000}).encode()
    rng = np.random.default_rng(0)
    words = np.array(["the", "router", "cache", "prefix", "worker", "token", "stream", "a"])
    big_text = " ".join(rng.choice(words, 600_000))  # ~3.6 MB
    big = json.dumps({"text": big_text, "sampling_params": {"max_new_tokens": 1}}).encode()

    async def chunked(data):  # a body without Content-Length
        for k in range(0, len(data), 1 << 20):
            yield data[k:k + (1 << 20)]

    cases = {
        "nested JSON (100k deep)": (nested, 400, "nested too deeply"),
        "20 MB text prompt": (huge, 413, "exceeds the limit"),
        "20 MB chunked body": (huge, 413, "exceeds the limit"),
        "1 MB unknown field": (junk, 400, "unknown request fields ['junk']"),
        "3.6 MB text prompt": (big, 200, None),
    }

    async def main():
        w = FakeWorker(lambda body: sglang_events({**body, "input_ids": body.get("input_ids") or [0]}),
                       capacity=1_000_000)  # holds the 600k-token prompt (the KV-size check passes it)
        await w.start()
        out = {}
        try:
            async with _service_process(tmp_path, [w.url]) as url, aiohttp.ClientSession() as s:
                small = protocol.generate_body(np.arange(8), 1, stream=False)

                async def probe_loop(stop, lat):
                    start = time.monotonic()
                    k = 0
                    while not stop.is_set():
                        due = start + k * 0.02
                        k += 1
                        await asyncio.sleep(max(0.0, due - time.monotonic()))
                        async with s.post(url + "/generate", json=small) as r:
                            await r.read()
                            assert r.status == 200
                        lat.append(time.monotonic() - due)

                for name, (data, status, fragment) in cases.items():
                    stop, lat = asyncio.Event(), []
                    probe = asyncio.create_task(probe_loop(stop, lat))
                    await asyncio.sleep(0.1)
                    t0 = time.monotonic()
                    payload = chunked(data) if "chunked" in name else data
                    async with s.post(url + "/generate", data=payload,
                                      headers={"Content-Type": "application/json"}) as r:
                        text = await r.text()
                        got = (r.status, text)
                    took = time.monotonic() - t0
                    await asyncio.sleep(0.1)
                    stop.set()
                    await probe
                    out[name] = (got, took, lat)
            return out, w.bodies
        finally:
            await w.stop()

    out, forwarded = run_async(main(), 120)
    print()
    for name, ((status, text), took, lat) in out.items():
        print(f"{name}: HTTP {status} in {took * 1000:.0f} ms; {len(lat)} small requests meanwhile: "
              f"p50 {_pct(lat, 50):.1f} ms, p99 {_pct(lat, 99):.1f} ms, max {max(lat) * 1000:.1f} ms")
    for name, (data, status, fragment) in cases.items():
        (got_status, text), took, lat = out[name]
        assert got_status == status, (name, text[:300])
        if fragment:
            assert fragment in json.loads(text)["error"]["message"], (name, text[:300])
        # The latencies are printed, not bounded: on a loaded machine any bound is flaky (issue 32,
        # point 8). That big bodies are parsed off the event loop is checked by events in
        # test_a_big_body_is_parsed_off_the_event_loop.
    # only the good requests reached the worker, with nothing but known fields
    assert all(set(b) <= protocol.FORWARDED_KEYS for b in forwarded)
    assert sum(1 for b in forwarded if b.get("text") == big_text) == 1


def _one_token_worker():
    return FakeWorker(lambda body: sglang_events({**body, "input_ids": body.get("input_ids") or [0]}))


def test_a_big_body_is_parsed_off_the_event_loop(monkeypatch):
    """While a big body's parse is held (an event the test controls), a small request is served;
    then the big one is. Parsing on the loop would serve nothing until the parse ended."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from repro.backends.sglang.router_service import INLINE_PARSE_BYTES, service as service_mod

    entered, release = threading.Event(), threading.Event()
    pool = ThreadPoolExecutor(1)

    async def main():
        w = _one_token_worker()
        await w.start()
        svc = service(RecordingRouter(), [w.url])

        def held_parse(raw):  # stands in for the parser process
            entered.set()
            release.wait()
            return svc.parser.parse(raw)

        monkeypatch.setattr(service_mod, "parse_in_child", held_parse)
        monkeypatch.setattr(svc._pool, "get", lambda: pool)
        port = await svc.start()
        url = f"http://127.0.0.1:{port}/generate"
        try:
            async with aiohttp.ClientSession() as s:
                big = json.dumps({"input_ids": [123456789] * 8000, "sampling_params":  # under the KV cache
                                  {"max_new_tokens": 1}}).encode()
                assert len(big) > INLINE_PARSE_BYTES

                async def post(data):
                    async with s.post(url, data=data, headers={"Content-Type": "application/json"}) as r:
                        return r.status
                big_task = asyncio.create_task(post(big))
                await asyncio.get_running_loop().run_in_executor(None, entered.wait)
                small = json.dumps(protocol.generate_body(np.arange(8), 1, stream=False)).encode()
                assert await post(small) == 200
                assert not big_task.done()  # still held: the small one did not wait for it
                release.set()
                assert await big_task == 200
        finally:
            release.set()
            await svc.stop()
            await w.stop()
            pool.shutdown()

    run_async(main(), 120)


async def _raw_post(port, headers: bytes, body: bytes) -> tuple[int, str]:
    """One raw request; `Connection: close` makes the service close after its answer, so read() returns at
    that EOF (a keep-alive connection would stay open until client_timeout_s, 30 s by default)."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(b"POST /generate HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers
            + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    await w.drain()
    data = await r.read()
    w.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), rest.decode(errors="replace")


@pytest.mark.parametrize("headers,body,fragment", [
    (b"Content-Type: application/json\r\n", b'{"text": "\\ud800abc"}', "lone surrogate (\\ud800)"),
    (b"Content-Type: application/json\r\n", b'{"input_ids": [1, ' + b"9" * 40 + b"]}", "outside 0..2^31-1"),
    (b"Content-Type: application/json\r\n", b'{"input_ids": [1, -1]}', "outside 0..2^31-1"),
    (b"Content-Type: application/json\r\n", b'{"input_ids": [1, 2.5]}', "must hold integers, found 2.5"),
    (b"Content-Type: text/plain\r\n", b'{"input_ids": [1]}', "Content-Type must be application/json"),
    (b"", b'{"input_ids": [1]}', "Content-Type must be application/json, got 'none'"),
    (b"Content-Type: application/json\r\n", b'{"input_ids": [1], "junk": 1}', "unknown request fields"),
    (b"Content-Type: application/json\r\n", b'{"input_ids": [' + b"1," * 10_000 + b'1]}',
     "prompt of 10001 tokens exceeds every worker's KV cache (largest: 10000 tokens)"),
])
def test_every_malformed_body_gets_a_clean_400_and_reaches_no_worker(caplog, headers, body, fragment):
    async def main():
        w = _one_token_worker()
        await w.start()
        svc = service(RecordingRouter(), [w.url])
        port = await svc.start()
        try:
            return await _raw_post(port, headers, body), w.bodies, svc.stats()
        finally:
            await svc.stop()
            await w.stop()

    (status, text), forwarded, stats = run_async(main(), 60)
    assert status == 400, text
    assert fragment in json.loads(text)["error"]["message"], text
    assert forwarded == [] and stats["rejected"] == 1
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


def test_idle_and_half_sent_connections_are_closed_without_tracebacks(caplog):
    """Connections that hold no complete request (idle, headers or body half-sent) are closed after
    client_timeout_s (a half-sent body gets a 408 first); clients that leave mid-body log nothing
    above INFO. Waits on each connection's end (EOF), not on a clock."""
    async def main():
        w = _one_token_worker()
        await w.start()
        svc = service(RecordingRouter(), [w.url], client_timeout_s=0.5)
        port = await svc.start()
        try:
            async def conn(first: bytes, leave: bool):
                r, wr = await asyncio.open_connection("127.0.0.1", port)
                wr.write(first)
                await wr.drain()
                if leave:  # the client goes away mid-request
                    wr.close()
                    return None
                data = await r.read()  # returns at the service's close
                wr.close()
                return data
            head = b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            half_body = head + b'Content-Length: 100\r\n\r\n{"inp'
            leavers = [conn(half_body, True) for _ in range(50)] + [conn(head, True) for _ in range(50)]
            stayers = [conn(b"", False), conn(head, False), conn(half_body, False)]
            *_, idle, half_header, half = await asyncio.gather(*leavers, *stayers)
            async with aiohttp.ClientSession() as s:  # the service still serves
                async with s.post(f"http://127.0.0.1:{port}/generate",
                                  json=protocol.generate_body([1, 2], 1, stream=False)) as r:
                    ok = r.status
            return idle, half_header, half, ok
        finally:
            await svc.stop()
            await w.stop()

    idle, half_header, half, ok = run_async(main(), 120)
    assert idle == b"" and half_header == b""  # closed without an answer
    assert half.startswith(b"HTTP/1.1 408") and b"client_timeout_s" in half
    assert ok == 200
    loud = [r for r in caplog.records if r.levelno > 20]
    assert not loud, [r.getMessage() for r in loud[:3]]


def test_unknown_sampling_params_and_config_limits():
    from repro.backends.sglang.router_service import INLINE_PARSE_BYTES, RouterService, RouterServiceConfig

    # deep nesting below the size that goes to the parser process: the same 400, on the event loop
    svc = RouterService(RecordingRouter(), RouterServiceConfig(worker_urls=["http://127.0.0.1:9"]))
    small_nested = b"[" * 20_000 + b"]" * 20_000
    assert len(small_nested) <= INLINE_PARSE_BYTES
    with pytest.raises(protocol.ProtocolError, match="nested too deeply"):
        svc.parser.parse(small_nested)

    with pytest.raises(protocol.ProtocolError, match=r"unknown sampling_params \['temprature'\]"):
        protocol.check_known_keys({"input_ids": [1], "sampling_params": {"temprature": 0}})
    protocol.check_known_keys(protocol.generate_body([1, 2], 3, rid="r", reference_output_ids=[4], text="x"))
    with pytest.raises(ValueError, match="stall_timeout_s"):
        RouterServiceConfig(worker_urls=["http://a"], stall_timeout_s=0)
    with pytest.raises(ValueError, match="max_body_bytes"):
        RouterServiceConfig(worker_urls=["http://a"], max_body_bytes=10)
    with pytest.raises(ValueError, match="client_timeout_s"):
        RouterServiceConfig(worker_urls=["http://a"], client_timeout_s=0)


if __name__ == "__main__":  # the setting: PYTHONPATH=.:tests/live python tests/live/test_live_router_faults.py
    import argparse
    import tempfile
    from pathlib import Path

    ap = argparse.ArgumentParser(description="frozen-worker failover, measured")
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--timeout", type=float, default=2.0)
    ap.add_argument("--threshold", type=int, default=2)
    ap.add_argument("--request-timeout", type=float, default=30.0)
    ap.add_argument("--freeze-at", type=float, default=0.6)
    ap.add_argument("--requests", type=int, default=60)
    a = ap.parse_args()
    frozen_worker_run(Path(tempfile.mkdtemp()), a.interval, a.timeout, a.threshold, a.request_timeout, a.requests,
                      freeze_at_s=a.freeze_at)

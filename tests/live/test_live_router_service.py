"""The router service: routing through repro routers, views, callbacks, retries, faults, timeouts."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import numpy as np
import pytest

from repro.backends.sglang import protocol

from live_helpers import (FakeWorker, RecordingRouter, emulated_workers, emulator_config, hardware_cfg, make_requests,
                          model_cfg, need_parts, run_async, sglang_events)


@pytest.fixture(autouse=True)
def _parts():
    need_parts()


def _service(router, urls, **kw):
    from repro.backends.sglang.router_service import RouterService, RouterServiceConfig
    from repro.costmodel import StepCostModel

    kw.setdefault("startup_health_timeout_s", 2.0)
    kw.setdefault("health_check_interval_s", 0.2)
    kw.setdefault("health_check_timeout_s", 2.0)
    cfg = RouterServiceConfig(worker_urls=urls, **kw)
    return RouterService(router, cfg, StepCostModel.from_config(model_cfg(), hardware_cfg()))


async def _generate(session, url, body, stream=True):
    """(status, worker header, events or json, tracker-or-error)."""
    async with session.post(url + "/generate", json=body) as r:
        worker = r.headers.get(protocol.WORKER_HEADER)
        if r.status != 200 or not stream:
            return r.status, worker, await r.json(content_type=None), None
        events, tr, err = [], protocol.OutputTracker(), None
        async for line in protocol.iter_sse_lines(r.content):
            ev = protocol.parse_sse_line(line)
            events.append(ev)
            if ev is not protocol.DONE and err is None:
                try:
                    tr.add(ev)
                except protocol.WorkerReportedError as exc:
                    err = str(exc)
        return r.status, worker, events, err if err else tr


def test_routes_with_a_repro_router_and_reports_completions():
    router = RecordingRouter()
    reqs = make_requests(8, prompt_len=100, output_len=3, groups=2, text=True)

    async def main():
        async with emulated_workers(2, capacity=5000, time_scale=50.0) as ws, aiohttp.ClientSession() as s:
            svc = _service(router, [f"http://127.0.0.1:{w.port}" for w in ws], time_scale=50.0)
            port = await svc.start()
            try:
                url = f"http://127.0.0.1:{port}"
                out = []
                for r in reqs:
                    body = protocol.generate_body(r.prompt_tokens, r.output_len,
                                                  reference_output_ids=r.generated_tokens, text=r.text)
                    out.append(await _generate(s, url, body))
                async with s.get(url + "/stats") as resp:
                    stats = await resp.json()
                return out, stats
            finally:
                await svc.stop()

    out, stats = run_async(main(), 60)
    assert [int(w) for _, w, _, _ in out] == [i % 2 for i in range(8)]  # round robin by the test router
    assert all(st == 200 and ev[-1] is protocol.DONE for st, _, ev, _ in out)
    assert len(router.completed) == 8 and stats["callbacks"] == 8 and stats["completed"] == 8
    for (req, w, now, views), (done, w2, lat, ttft, cached, now2), r, (_, _, _, tr) in zip(
            router.selected, router.completed, reqs, out):
        assert w == w2 and done.id == req.id
        assert np.array_equal(req.prompt_tokens, r.prompt_tokens) and req.text == r.text
        assert done.generated_tokens.tolist() == r.generated_tokens.tolist()  # what the worker returned
        assert cached == tr.cached_tokens
        assert 0 < ttft <= lat and now2 >= now >= 0
        # sequential requests: nothing in flight when routing; capacities from /server_info
        assert [v[0] for v in views] == [0, 0] and [v[5] for v in views] == [5000, 5000]
    # the approximate tracker saw request 0 (group 0, worker 0) when request 2 (group 0) arrived
    assert router.selected[2][3][0][6] >= 50
    assert stats["routing"]["decisions"] == 8


def test_views_track_waiting_running_and_prefill_tokens():
    """A worker that holds its first event: the request is waiting; after it, running."""
    gate = asyncio.Event

    async def main():
        release = gate()
        first_sent = gate()
        finish = gate()

        async def until(cond, timeout_s: float = 10.0):
            """Wait for a state the service reaches by itself (bounded; fails loudly)."""
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            while not cond():
                assert loop.time() < deadline, "state not reached"
                await asyncio.sleep(0.005)

        async def hold(request):
            from aiohttp import web

            body = await request.json()
            evs = sglang_events(body)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await release.wait()
            await resp.write(b"data: " + json.dumps(evs[0]).encode() + b"\n\n")
            first_sent.set()
            await finish.wait()  # the test has looked at the running state
            for ev in evs[1:-1]:
                await resp.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
            await resp.write(evs[-1])
            return resp

        fw = FakeWorker(lambda b: None)  # for its /health and /server_info handlers
        from aiohttp import web

        app = web.Application()
        app.router.add_post("/generate", hold)
        app.router.add_get("/health", fw._health)
        app.router.add_get("/server_info", fw._info)
        runner, port_w = await protocol.serve_app(app, shutdown_timeout=0.5)
        svc = _service(RecordingRouter(), [f"http://127.0.0.1:{port_w}"])
        port = await svc.start()
        try:
            async with aiohttp.ClientSession() as s:
                body = protocol.generate_body(np.arange(40), 3)
                task = asyncio.create_task(_generate(s, f"http://127.0.0.1:{port}", body))
                for _ in range(200):
                    if svc.views[0].in_flight:
                        break
                    await asyncio.sleep(0.01)
                v = svc.views[0]
                waiting = (v.in_flight, v.waiting, v.running, v.waiting_prefill_tokens, v.active_kv_tokens)
                release.set()
                await first_sent.wait()
                await until(lambda: v.running == 1)  # the service has read the first event
                running = (v.in_flight, v.waiting, v.running, v.waiting_prefill_tokens, v.active_kv_tokens)
                finish.set()
                result = await task
                after = (v.in_flight, v.waiting, v.running, v.waiting_prefill_tokens, v.active_kv_tokens,
                         v.peek_prefix(np.arange(40)), v.kv_used_tokens)
                return waiting, running, after, result
        finally:
            await svc.stop()
            await runner.cleanup()

    waiting, running, after, result = run_async(main(), 30)
    assert waiting == (1, 1, 0, 40, 0)
    # KV held as SGLang's: the prompt; the first sampled token is fed (gets KV) by the next step
    assert running == (1, 0, 1, 0, 40)
    assert after[:5] == (0, 0, 0, 0, 0)
    assert after[5] == 40 and after[6] == 42  # tracker: prompt + 2 of the 3 generated ids (the last has no KV)
    assert result[0] == 200 and result[2][-1] is protocol.DONE


def _one_good_one(fault_behaviour):
    """Worker 0 misbehaves, worker 1 is a normal SGLang stand-in; the router always picks 0."""
    bad = FakeWorker(fault_behaviour)
    good = FakeWorker(lambda body: sglang_events(body, cached=5))
    return bad, good


@pytest.mark.parametrize("behaviour", ["status500", "drop", "dead"])
def test_failure_before_the_first_byte_is_retried_on_another_worker(behaviour):
    router = RecordingRouter(pick=lambda req, views: 0)

    async def main():
        bad, good = _one_good_one(lambda body: ("status", 500, '{"error": {"message": "oom"}}')
                                  if behaviour == "status500" else "drop")
        await bad.start()
        await good.start()
        bad_url = bad.url
        if behaviour == "dead":
            await bad.stop()  # nothing listens there any more
        svc = _service(router, [bad_url, good.url], startup_health_timeout_s=0.5)
        try:
            port = await svc.start()
            async with aiohttp.ClientSession() as s:
                res = await _generate(s, f"http://127.0.0.1:{port}", protocol.generate_body(np.arange(12), 2))
            return res, svc.stats()
        finally:
            await svc.stop()
            await good.stop()
            if behaviour != "dead":
                await bad.stop()

    (status, worker, events, tr), stats = run_async(main(), 30)
    assert status == 200 and worker == "1" and events[-1] is protocol.DONE and tr.cached_tokens == 5
    assert stats["completed"] == 1 and stats["failed"] == 0
    if behaviour == "dead":  # unhealthy from the start: replaced without an attempt
        assert stats["workers"][0]["healthy"] is False and stats["retried"] == 0
    else:
        assert stats["retried"] == 1 and stats["workers"][0]["failed_attempts"] == 1
    # the router chose worker 0 but the request finished on 1: no latency callback (documented),
    # but the router is told to release what it holds for the request on worker 0
    assert router.completed == [] and stats["callbacks_skipped"] == 1
    assert [(r.id, w) for r, w, _ in router.abandoned] == [(router.selected[0][0].id, 0)]
    assert stats["callback_errors"] == []


def _one_request_to_one_worker(behaviour, router, **service_kw):
    """One streamed request through the service to a single FakeWorker(behaviour):
    ((status, worker, events or json, tracker-or-error), seconds it took, service stats)."""
    async def main():
        w = FakeWorker(behaviour)
        await w.start()
        svc = _service(router, [w.url], **service_kw)
        port = await svc.start()
        try:
            async with aiohttp.ClientSession() as s:
                t0 = asyncio.get_running_loop().time()
                res = await _generate(s, f"http://127.0.0.1:{port}", protocol.generate_body(np.arange(12), 3))
                return res, asyncio.get_running_loop().time() - t0, svc.stats()
        finally:
            await svc.stop()
            await w.stop()

    return run_async(main(), 30)


def test_malformed_stream_after_the_first_byte_becomes_an_error_event():
    (status, _, events, err), _, stats = _one_request_to_one_worker(
        lambda body: [sglang_events(body)[0], b"data: {broken\n\n", b"data: [DONE]\n\n"], RecordingRouter())
    assert status == 200 and events[-1] is protocol.DONE
    assert "malformed response from worker 0" in err
    assert stats["failed"] == 1 and stats["failures"] == {"malformed": 1}


def test_worker_dying_mid_stream_ends_the_stream_with_an_error():
    (status, _, events, err), _, stats = _one_request_to_one_worker(
        lambda body: [sglang_events(body)[0], "drop"], RecordingRouter())
    assert status == 200 and events[-1] is protocol.DONE
    assert "worker 0" in err and stats["failed"] == 1
    assert stats["workers"][0]["healthy"] is False  # a dropped connection marks it at once


def test_timeout_is_bounded_and_reported():
    router = RecordingRouter()
    (status, _, body, _), elapsed, stats = _one_request_to_one_worker(lambda body: "hang", router,
                                                                     request_timeout_s=0.5)
    assert status == 504 and "timed out after 0.5s" in body["error"]["message"]
    assert elapsed < 5 and stats["failures"] == {"timeout": 1}
    assert stats["workers"][0]["in_flight"] == 0
    assert len(router.abandoned) == 1 and router.abandoned[0][1] == 0 and router.completed == []


def test_bad_requests_and_worker_rejections():
    async def main():
        w = FakeWorker(lambda body: ("status", 400, '{"error": {"message": "too long"}}'))
        await w.start()
        svc = _service(RecordingRouter(), [w.url])
        port = await svc.start()
        url = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as s:
                async with s.post(url + "/generate", data=b"nope", headers={"Content-Type": "application/json"}) as r:
                    a = (r.status, await r.json())
                async with s.post(url + "/generate", json={"input_ids": [[1]]}) as r:
                    b = (r.status, await r.json())
                c = await _generate(s, url, protocol.generate_body(np.arange(5), 2))
            return a, b, c, svc.stats()
        finally:
            await svc.stop()
            await w.stop()

    a, b, c, stats = run_async(main(), 30)
    assert a[0] == 400 and "not JSON" in a[1]["error"]["message"]
    assert b[0] == 400 and "batched" in b[1]["error"]["message"]
    assert c[0] == 400 and c[2]["error"]["message"] == "too long"  # passed through, not retried
    assert stats["rejected"] == 2 and stats["retried"] == 0 and stats["failures"] == {"worker_rejected": 1}


def test_no_healthy_worker_at_start_is_a_clear_error():
    from repro.backends.sglang.router_service import NoHealthyWorkersError

    async def main():
        w = FakeWorker(lambda body: None, healthy=False)
        await w.start()
        svc = _service(RecordingRouter(), [w.url, "http://127.0.0.1:9"], startup_health_timeout_s=0.5)
        try:
            await svc.start()
        finally:
            await w.stop()

    with pytest.raises(NoHealthyWorkersError) as info:
        run_async(main(), 30)
    msg = str(info.value)
    assert "none of the 2 workers is healthy" in msg and "HTTP 503" in msg and "127.0.0.1:9" in msg


def test_all_workers_down_gives_503_at_once_and_recovery_is_noticed():
    async def main():
        w = FakeWorker(lambda body: sglang_events(body))
        await w.start()
        svc = _service(RecordingRouter(), [w.url], health_failure_threshold=1)
        port = await svc.start()
        url = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as s:
                w.healthy = False
                for _ in range(100):
                    if not svc.workers[0].healthy:
                        break
                    await asyncio.sleep(0.05)
                down = await _generate(s, url, protocol.generate_body(np.arange(5), 2))
                async with s.get(url + "/health") as r:
                    router_health = r.status
                w.healthy = True
                for _ in range(100):
                    if svc.workers[0].healthy:
                        break
                    await asyncio.sleep(0.05)
                up = await _generate(s, url, protocol.generate_body(np.arange(5), 2))
            return down, router_health, up
        finally:
            await svc.stop()
            await w.stop()

    down, router_health, up = run_async(main(), 30)
    assert down[0] == 503 and "no healthy worker" in down[2]["error"]["message"]
    assert router_health == 503
    assert up[0] == 200 and up[2][-1] is protocol.DONE


def test_non_streaming_text_request_and_a_broken_router():
    async def main():
        w = FakeWorker(lambda body: sglang_events({**body, "input_ids": [0] * 3}))
        await w.start()
        svc = _service(RecordingRouter(pick=lambda req, views: 7), [w.url])
        port = await svc.start()
        try:
            async with aiohttp.ClientSession() as s:
                bad = await _generate(s, f"http://127.0.0.1:{port}", {"text": "hi there\n"}, stream=False)
            svc.router.pick = None
            async with aiohttp.ClientSession() as s:
                good = await _generate(s, f"http://127.0.0.1:{port}",
                                       {"text": "hi there\n", "sampling_params": {"max_new_tokens": 2}}, stream=False)
            return bad, good
        finally:
            await svc.stop()
            await w.stop()

    bad, good = run_async(main(), 30)
    assert bad[0] == 500 and "router returned worker 7" in bad[2]["error"]["message"]
    assert good[0] == 200 and good[2]["meta_info"]["completion_tokens"] == 2


class _NoTokens:
    """A tokenizer under which any text encodes to nothing (real ones never do for non-empty text)."""

    def encode(self, text):
        return []


def test_text_that_encodes_to_zero_tokens_is_refused_before_routing():
    """The router service and the emulated worker share one prompt_ids (protocol.PromptIds):
    both answer 400 for text without tokens, and the router is never asked to route it."""
    from repro.backends.sglang.emulated_worker import EmulatedWorker

    body = {"text": "   ", "sampling_params": {"max_new_tokens": 2}}

    async def main():
        w = FakeWorker(lambda b: sglang_events(b))
        await w.start()
        router = RecordingRouter()
        svc = _service(router, [w.url])
        svc._prompt_ids._tokenizer = _NoTokens()
        emu = EmulatedWorker(emulator_config())
        emu._prompt_ids._tokenizer = _NoTokens()
        port = await svc.start()
        await emu.start()
        try:
            async with aiohttp.ClientSession() as s:
                via_router = await _generate(s, f"http://127.0.0.1:{port}", body, stream=False)
                at_worker = await _generate(s, f"http://127.0.0.1:{emu.port}", body, stream=False)
            return via_router, at_worker, router.selected, w.bodies, svc.stats()
        finally:
            await svc.stop()
            await emu.stop()
            await w.stop()

    via_router, at_worker, selected, forwarded, stats = run_async(main(), 30)
    for status, _, reply, _ in (via_router, at_worker):
        assert status == 400 and "encodes to zero tokens" in reply["error"]["message"], reply
    assert selected == [] and forwarded == [] and stats["rejected"] == 1


def test_config_errors_are_named():
    from repro.backends.sglang.router_service import RouterServiceConfig

    with pytest.raises(ValueError, match="worker_urls is empty"):
        RouterServiceConfig(worker_urls=[])
    with pytest.raises(ValueError, match="must start with http"):
        RouterServiceConfig(worker_urls=["localhost:1"])
    with pytest.raises(ValueError, match="2 capacities for 1 workers"):
        RouterServiceConfig(worker_urls=["http://a"], kv_capacity_tokens=[1, 2])
    with pytest.raises(ValueError, match="request_timeout_s"):
        RouterServiceConfig(worker_urls=["http://a"], request_timeout_s=0)
    with pytest.raises(ValueError, match="max_retries"):
        RouterServiceConfig(worker_urls=["http://a"], max_retries=-1)

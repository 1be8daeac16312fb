"""The emulated SGLang worker: protocol, agreement with the simulator's worker, clock, faults."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import numpy as np
import pytest

from repro.backends.sglang import protocol

from live_helpers import emulated_workers, emulator_config, make_requests, need_parts, run_async

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(autouse=True)
def _parts():
    need_parts()


async def _stream(session, url, body):
    """POST a streaming /generate; returns (status, events, tracker, wall seconds)."""
    t0 = time.perf_counter()
    events = []
    tr = protocol.OutputTracker()
    async with session.post(url + "/generate", json=body) as r:
        if r.status != 200:
            return r.status, await r.json(), None, time.perf_counter() - t0
        async for line in protocol.iter_sse_lines(r.content):
            ev = protocol.parse_sse_line(line)
            events.append(ev)
            if ev is not protocol.DONE:
                tr.add(ev)
    return 200, events, tr, time.perf_counter() - t0


def test_streams_one_event_per_token_with_the_reference_reply():
    async def main():
        async with emulated_workers(1) as (w,), aiohttp.ClientSession() as s:
            url = f"http://127.0.0.1:{w.port}"
            prompt = np.arange(300, dtype=np.int32)
            status, events, tr, _ = await _stream(s, url, protocol.generate_body(prompt, 4, rid="a",
                                                                                reference_output_ids=[9, 8, 7, 6]))
            assert status == 200 and events[-1] is protocol.DONE
            metas = [e["meta_info"] for e in events[:-1]]
            assert [m["completion_tokens"] for m in metas] == [1, 2, 3, 4]
            assert [m["finish_reason"] for m in metas[:-1]] == [None] * 3
            assert metas[-1]["finish_reason"] == {"type": "length", "length": 4}
            assert all(m["prompt_tokens"] == 300 and m["id"] == "a" for m in metas)
            assert tr.output_ids == [9, 8, 7, 6] and tr.cached_tokens == 0
            # as SGLang with --enable-metrics: its queue time (wall seconds; alone, next to nothing)
            assert all(0 <= m["queue_time"] < 1.0 for m in metas) and tr.queue_time_s == metas[-1]["queue_time"]
            # The same prompt again: the whole prompt is cached (the simulator's convention).
            _, _, tr2, _ = await _stream(s, url, protocol.generate_body(prompt, 2))
            assert tr2.cached_tokens == 300
            # Prompt + the first reply + more: prompt and reply but its last token are a cached path
            # (as SGLang: the last sampled token is never fed forward, so it has no KV)
            longer = np.concatenate([prompt, [9, 8, 7, 6], [1, 2, 3]]).astype(np.int32)
            _, _, tr3, _ = await _stream(s, url, protocol.generate_body(longer, 1))
            assert tr3.cached_tokens == 303 and tr3.completion_tokens == 1
            # Non-streaming answer: one JSON object with the totals.
            async with s.post(url + "/generate", json=protocol.generate_body(prompt, 3, stream=False)) as r:
                obj = await r.json()
            assert obj["meta_info"]["completion_tokens"] == 3 and len(obj["output_ids"]) == 3
            async with s.get(url + "/emulator/stats") as r:
                stats = await r.json()
            assert stats["requests_received"] == stats["requests_finished"] == 4

    run_async(main(), 60)


def _simulate_alone(requests, capacity, eviction, seed, cost_model):
    """The simulator's worker on `requests`, each one alone (arrivals 1000 s apart)."""
    from repro.kvcache import make_cache
    from repro.routing import RoundRobinRouter
    from repro.sim import SchedulerConfig, SimCluster
    from repro.workloads.request import Request

    spaced = [Request(r.id, 1000.0 * k, r.prompt_tokens, r.output_len, r.generated_tokens, r.group_id,
                      r.conversation_id, r.turn, r.text) for k, r in enumerate(requests)]
    cache = make_cache(capacity, {"name": eviction, "granularity": "node"}, seed)
    sim = SimCluster(spaced, [cache], cost_model, RoundRobinRouter(), SchedulerConfig(), eviction, 0)
    res = sim.run()
    return res.records["cached_tokens"].tolist(), sim.workers[0].busy_s, cache


@pytest.mark.parametrize("eviction", ["lru", "rlt"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_the_simulators_worker_request_by_request(eviction, seed):
    """Requests one at a time: the emulator IS the simulator's worker, so hits, step time and the
    final cache agree exactly (RLT included: same seed, same calls)."""
    requests = make_requests(30, prompt_len=200, output_len=3, groups=5, seed=seed)
    capacity = 1500  # ~7 paths: eviction on most requests

    async def main():
        async with emulated_workers(1, capacity=capacity, eviction=eviction, time_scale=1000.0) as (w,), \
                aiohttp.ClientSession() as s:
            url = f"http://127.0.0.1:{w.port}"
            cached = []
            for r in requests:
                body = protocol.generate_body(r.prompt_tokens, r.output_len, reference_output_ids=r.generated_tokens)
                status, _, tr, _ = await _stream(s, url, body)
                assert status == 200
                cached.append(tr.cached_tokens)
            return cached, w.sim.busy_s, w.cache

    cached, busy, cache = run_async(main(), 90)
    from repro.costmodel import StepCostModel

    from live_helpers import hardware_cfg, model_cfg

    ref_cached, ref_busy, ref_cache = _simulate_alone(requests, capacity, eviction, 0,
                                                      StepCostModel.from_config(model_cfg(), hardware_cfg()))
    assert cached == ref_cached
    assert sum(cached) > 0 and cached != [0] * len(cached)
    assert busy == pytest.approx(ref_busy, rel=1e-12)
    assert cache.cached_keys() == ref_cache.cached_keys()


def test_time_scale_divides_the_modelled_time():
    """A lone request takes at least its modelled time / time_scale of wall time (sleeps never end
    early), and the worker's clock advances by exactly the modelled step times."""
    async def main():
        async with emulated_workers(1, time_scale=20.0) as (w,), aiohttp.ClientSession() as s:
            url = f"http://127.0.0.1:{w.port}"
            prompt = np.arange(2000, dtype=np.int32)
            _, _, tr, wall = await _stream(s, url, protocol.generate_body(prompt, 3))
            cm = w.cost_model
            modelled = cm.prefill_time_s(2000, 0) + cm.decode_time_s(1, 2001) + cm.decode_time_s(1, 2002)
            return wall, modelled, w.sim.busy_s

    wall, modelled, busy = run_async(main(), 60)
    assert busy == pytest.approx(modelled, rel=1e-12)
    assert wall >= modelled / 20.0 * 0.98


def test_concurrent_requests_are_batched_and_all_finish():
    requests = make_requests(40, prompt_len=120, output_len=4, groups=3, seed=5)

    async def main():
        async with emulated_workers(1, capacity=3000, eviction="rlt", time_scale=50.0) as (w,), \
                aiohttp.ClientSession() as s:
            url = f"http://127.0.0.1:{w.port}"
            bodies = [protocol.generate_body(r.prompt_tokens, r.output_len, reference_output_ids=r.generated_tokens)
                      for r in requests]
            results = await asyncio.gather(*(_stream(s, url, b) for b in bodies))
            return results, w

    results, w = run_async(main(), 60)
    for (status, events, tr, _), r in zip(results, requests):
        assert status == 200 and events[-1] is protocol.DONE
        assert [e["meta_info"]["completion_tokens"] for e in events[:-1]] == [1, 2, 3, 4]
        assert tr.output_ids == r.generated_tokens.tolist()
        assert 0 <= tr.cached_tokens <= len(r.prompt_tokens)
    assert w.scheduler_error is None
    assert w.sim.prefill_steps < len(requests)  # some requests shared a prefill batch


def test_bad_requests_get_400_and_info_endpoints_answer():
    async def main():
        async with emulated_workers(1, capacity=1000) as (w,), aiohttp.ClientSession() as s:
            url = f"http://127.0.0.1:{w.port}"
            async with s.post(url + "/generate", data=b"{not json") as r:
                assert r.status == 400 and "not JSON" in (await r.json())["error"]["message"]
            async with s.post(url + "/generate", json={"input_ids": [[1], [2]]}) as r:
                assert r.status == 400 and "batched" in (await r.json())["error"]["message"]
            big = protocol.generate_body(np.arange(999), 5)
            async with s.post(url + "/generate", json=big) as r:
                msg = (await r.json())["error"]["message"]
                assert r.status == 400 and "1004 KV tokens" in msg and "1000 tokens" in msg
            async with s.post(url + "/generate", json={"text": "hello world\n", "sampling_params":
                                                       {"max_new_tokens": 2}}) as r:
                obj = await r.json()
                assert r.status == 200 and obj["meta_info"]["prompt_tokens"] > 0
            async with s.get(url + "/server_info") as r:
                info = await r.json()
                assert info["max_total_num_tokens"] == 1000 and info["emulated"] is True
            async with s.get(url + "/v1/loads") as r:
                load = (await r.json())["loads"][0]
                assert load["max_total_num_tokens"] == 1000 and load["num_waiting_reqs"] == 0
            async with s.get(url + "/health") as r:
                assert r.status == 200

    run_async(main(), 30)


@pytest.mark.parametrize("fault", ["malformed", "http500", "never_healthy"])
def test_fault_hooks(fault):
    async def main():
        async with emulated_workers(1, fault=fault) as (w,), aiohttp.ClientSession() as s:
            url = f"http://127.0.0.1:{w.port}"
            async with s.get(url + "/health") as r:
                health = r.status
            if fault == "never_healthy":
                assert health == 503
                return
            assert health == 200
            status, events, _, _ = await _stream(s, url, protocol.generate_body(np.arange(10), 2)) \
                if fault == "http500" else (None, None, None, None)
            if fault == "http500":
                assert status == 500
                return
            with pytest.raises(protocol.ProtocolError, match="not JSON"):
                await _stream(s, url, protocol.generate_body(np.arange(10), 2))

    run_async(main(), 30)


def test_startup_delay_and_bad_config():
    from repro.backends.sglang.emulated_worker import EmulatorConfig

    async def main():
        async with emulated_workers(1, startup_delay_s=30.0) as (w,), aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{w.port}/health") as r:
                assert r.status == 503

    run_async(main(), 30)
    with pytest.raises(ValueError, match="time_scale"):
        emulator_config(time_scale=0)
    with pytest.raises(ValueError, match="kv_capacity_tokens"):
        emulator_config(capacity=0)
    with pytest.raises(ValueError, match="fault"):
        emulator_config(fault="explode")
    with pytest.raises(TypeError):
        EmulatorConfig(worker_id=0)


def test_without_enable_metrics_no_queue_time_is_sent():
    async def main():
        async with emulated_workers(1, enable_metrics=False) as (w,), aiohttp.ClientSession() as s:
            body = protocol.generate_body(np.arange(50, dtype=np.int32), 2)
            status, events, tr, _ = await _stream(s, f"http://127.0.0.1:{w.port}", body)
            assert status == 200 and not any("queue_time" in e["meta_info"] for e in events[:-1])
            assert np.isnan(tr.queue_time_s)

    run_async(main(), 60)

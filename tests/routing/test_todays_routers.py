"""prefix_hash, least_load (smg 1.13) and LMetric against plain references written here, on random
loads, caches and prompts (hypothesis). The real smg binary: tests/router_binary/test_router_binary_prefix_hash.py."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.routing import LeastLoadRouter, LMetricRouter, PrefixHashRouter
from tests.routing.fakes import make_request, make_views


def _pos(b: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(b, digest_size=8).digest(), "little")


def ref_prefix_hash(tokens, loads, n_prefix=256, factor=1.25, abs_t=10, vnodes=150):
    m = len(loads)
    ring = sorted((_pos(f"worker{i}#{v}".encode()), i) for i in range(m) for v in range(vnodes))
    head = np.asarray(tokens[:n_prefix], dtype="<u4").tobytes()
    h = _pos(head)
    owner = next((i for p, i in ring if p >= h), ring[0][1])
    total = sum(loads)

    def ok(x):
        return total == 0 or x <= max((total + 1) / m * factor, (total + 1) / m + abs_t)

    if ok(loads[owner]):
        return owner
    good = [i for i in range(m) if ok(loads[i])]
    if not good:
        return owner
    low = min(loads[i] for i in good)
    return next(i for i in good if loads[i] == low)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    m=st.integers(1, 6),
    prompts=st.lists(st.lists(st.integers(0, 50), min_size=1, max_size=12), min_size=1, max_size=60),
    done=st.lists(st.booleans(), max_size=60),
    n_prefix=st.integers(1, 8),
    abs_t=st.integers(0, 3),
)
def test_prefix_hash_matches_the_reference(m, prompts, done, n_prefix, abs_t):
    views = make_views(m)
    r = PrefixHashRouter(prefix_token_count=n_prefix, balance_abs_threshold=abs_t)
    r.reset(views, 0)
    loads = [0] * m
    for j, p in enumerate(prompts):
        want = ref_prefix_hash(p, loads, n_prefix, 1.25, abs_t)
        req = make_request(j, p)
        got = r.select_worker(req, views, 0.0)
        assert got == want
        loads[got] += 1
        if j < len(done) and done[j]:
            r.on_request_complete(req, got, 1.0, 0.5, 0)
            loads[got] -= 1


def test_prefix_hash_groups_by_head_only():
    views = make_views(8)
    r = PrefixHashRouter(prefix_token_count=4)
    r.reset(views, 0)
    heads = [r.select_worker(make_request(i, [1, 2, 3, 4, 100 + i]), views, 0.0) for i in range(3)]
    assert len(set(heads)) == 1  # loads 1, 2 stay under avg + 10
    spread = {r.select_worker(make_request(10 + i, [i, 9, 9, 9]), views, 0.0) for i in range(40)}
    assert len(spread) >= 5  # different heads spread over the ring
    with pytest.raises(ValueError, match="load_factor"):
        PrefixHashRouter(load_factor=0.9)


def ref_least_load(views, w=0.15, tp=2000.0, mean=1024):
    def s(v):
        q = v.waiting_prefill_tokens if v.waiting_prefill_tokens > 0 else v.waiting * mean
        k = min(max(v.active_kv_tokens / v.kv_capacity_tokens, 0.0), 0.999)
        return q / tp + w * k / (1 - k)

    scores = [s(v) for v in views]
    best = min(scores)
    return {i for i, x in enumerate(scores) if x == best}


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3000), st.integers(0, 1000)), min_size=1, max_size=6),
    st.integers(0, 2**31),
)
def test_least_load_picks_a_minimum_of_the_reference_score(state, seed):
    views = make_views(len(state), capacity=1000)
    for v, (waiting, queued, kv) in zip(views, state):
        v.waiting, v.waiting_prefill_tokens, v.active_kv_tokens = waiting, queued, kv
    r = LeastLoadRouter()
    r.reset(views, seed)
    assert r.select_worker(make_request(0, [1, 2]), views, 0.0) in ref_least_load(views)


def test_least_load_kv_barrier_and_uniform_ties():
    views = make_views(3, capacity=1000)
    views[0].active_kv_tokens = 999  # k clamps to 0.999: 0.15 * 999 s
    views[1].waiting_prefill_tokens = 200_000  # 100 s of queued prefill
    views[2].waiting_prefill_tokens = 20_000
    views[2].active_kv_tokens = 900  # 10 s + 0.15 * 9 = 11.35 s
    r = LeastLoadRouter()
    r.reset(views, 0)
    assert r.select_worker(make_request(0, [1]), views, 0.0) == 2
    tied = make_views(4)
    r.reset(tied, 3)
    counts = np.bincount([r.select_worker(make_request(i, [1]), tied, 0.0) for i in range(4000)], minlength=4)
    assert counts.min() > 800  # with loads "view" and equal reports: uniform over the tied
    dark = LeastLoadRouter(loads="dark")
    dark.reset(tied, 0)
    picks = [dark.select_worker(make_request(i, [1]), tied, 0.0) for i in range(8)]
    assert sorted(np.bincount(picks, minlength=4)) == [2, 2, 2, 2]  # least in-flight, as the binary with no reports


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, 3), max_size=6), st.integers(0, 4), st.integers(0, 4)), min_size=1, max_size=5
    ),
    st.lists(st.integers(0, 3), min_size=1, max_size=8),
    st.sampled_from(["running", "in_flight"]),
)
def test_lmetric_picks_a_minimum_of_new_tokens_times_batch_plus_one(state, prompt, batch):
    views = make_views(len(state))
    for v, (cached, running, waiting) in zip(views, state):
        if cached:
            v.cache.insert(np.asarray(cached))
        v.running, v.in_flight = running, running + waiting
    r = LMetricRouter(batch=batch)
    r.reset(views, 0)

    def score(v):
        lcp = 0
        while lcp < len(prompt) and v.cache.peek_prefix(np.asarray(prompt[: lcp + 1])) == lcp + 1:
            lcp += 1
        return (len(prompt) - lcp) * ((v.running if batch == "running" else v.in_flight) + 1)

    scores = [score(v) for v in views]
    got = r.select_worker(make_request(0, prompt), views, 0.0)
    assert scores[got] == min(scores)


def test_lmetric_trades_cache_against_batch():
    views = make_views(2)
    views[0].cache.insert(np.arange(90))
    views[0].running = 8  # (100 - 90) * 9 = 90 < (100 - 0) * 1
    r = LMetricRouter()
    r.reset(views, 0)
    assert r.select_worker(make_request(0, np.arange(100)), views, 0.0) == 0
    views[0].running = 10  # 10 * 11 = 110 > 100
    assert r.select_worker(make_request(1, np.arange(100)), views, 0.0) == 1
    assert math.isfinite(LeastLoadRouter().kv_pressure_weight)

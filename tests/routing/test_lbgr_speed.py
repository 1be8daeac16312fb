"""LBGR's fast paths against their plain counterparts: the shared prefix index against per-worker
caches + in-flight prompts, the numpy evaluation against the loop (both EXACTLY, bit for bit),
and the plain-float ridge solve against np.linalg.inv after every sample (within a stated tolerance; the decision
flips that could cause are counted on the paper's cells by tests/benchmarks/bench_learner_flips.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import repro.routing.lbgr as lbgr_mod
from repro.kvcache import make_cache
from repro.routing import LBGRRouter
from repro.kvcache import as_key
import repro.routing.learners as learners_mod
from repro.routing.learners import RidgeRLSLearner
from repro.routing.trackers import ApproximateTracker
from tests.routing.ridge_reference import InverseEveryUpdate
from tests.routing.fakes import LinearCostModel, make_request, make_views, simple_cache_factory


# ---------------------------------------------------------------------------- shared index
def _lcp(a: tuple, b: tuple) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("policy", ["lru", "rlt"])
@pytest.mark.parametrize("granularity", ["node", "token"])
@pytest.mark.parametrize("cap", [60, 20])  # 20: paths longer than the cache are cut
@pytest.mark.parametrize("seed", range(3))
def test_shared_index_hits_equal_per_worker_peeks(policy, granularity, cap, seed):
    """Random dispatches / completions / abandons on small caches (lots of eviction): after every
    step, the index's hits = per worker max(cache peek, longest common prefix with in-flight)."""
    rng = np.random.default_rng(seed)
    m = 4
    caches = [make_cache(cap, {"name": policy, "granularity": granularity}, 100 + i) for i in range(m)]
    tracker = ApproximateTracker(caches, inflight=True)
    systems = [tuple(int(x) for x in rng.integers(0, 6, int(rng.integers(3, 25)))) for _ in range(5)]
    live: list[tuple[tuple, int]] = []
    for step in range(300):
        op = rng.random()
        if live and op < 0.45:
            prompt, w = live.pop(int(rng.integers(0, len(live))))
            key = as_key(np.array(prompt, dtype=np.int32))
            if rng.random() < 0.1:
                tracker.abandoned(key, w)
            else:
                gen = as_key(rng.integers(0, 6, int(rng.integers(1, 5))).astype(np.int32))
                tracker.completed(key, key + gen, w)
        else:
            prompt = systems[int(rng.integers(0, 5))] + tuple(int(x) for x in rng.integers(0, 6, int(rng.integers(1, 8))))
            w = int(rng.integers(0, m))
            tracker.dispatched(as_key(np.array(prompt, dtype=np.int32)), w)
            live.append((prompt, w))
        for q in (systems[int(rng.integers(0, 5))] + (int(rng.integers(0, 6)),), live[-1][0] if live else (1,)):
            key = as_key(np.array(q, dtype=np.int32))
            want = [
                max([caches[i].peek_prefix(key)] + [_lcp(q, p) for p, w in live if w == i]) for i in range(m)
            ]
            assert tracker.hits(key) == want, step
    for c in caches:
        c.check_invariants()


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_shared_index_levels_are_nested_and_give_the_hits(data):
    m = 3
    caches = [simple_cache_factory(12, {"name": "lru"}, i) for i in range(m)]
    tracker = ApproximateTracker(caches, inflight=bool(data.draw(st.booleans())))
    prompt = st.lists(st.integers(0, 2), min_size=1, max_size=8).map(tuple)
    live = []
    for _ in range(data.draw(st.integers(1, 25))):
        if live and data.draw(st.booleans()):
            p, w = live.pop(data.draw(st.integers(0, len(live) - 1)))
            k = as_key(np.array(p, dtype=np.int32))
            tracker.completed(k, k + as_key(np.array([7], dtype=np.int32)), w)
        else:
            p, w = data.draw(prompt), data.draw(st.integers(0, m - 1))
            tracker.dispatched(as_key(np.array(p, dtype=np.int32)), w)
            live.append((p, w))
        q = data.draw(prompt)
        key = as_key(np.array(q, dtype=np.int32))
        levels = tracker.index.levels(key)
        for (t0, m0), (t1, m1) in zip(levels, levels[1:]):
            assert t0 < t1 and m1 & ~m0 == 0 and m1 != m0
        inflight = [max([_lcp(q, p) for p, w in live if w == i], default=0) for i in range(m)]
        if not tracker.track_inflight:
            inflight = [0] * m
        want = [max(caches[i].peek_prefix(key), inflight[i]) for i in range(m)]
        assert tracker.hits(key) == want


def _shape(node, depth=0):
    """The index as nested (key, cmask, imask, inflight) tuples in child order (for equality)."""
    return [(c.key, c.cmask, c.imask, sorted(c.inflight.items()), _shape(c, depth + 1))
            for _, c in sorted(node.children.items())]


@pytest.mark.parametrize("seed", range(6))
def test_dispatch_after_levels_reuses_the_walk_and_builds_the_same_index(seed):
    """A decision walks the index (levels) and its dispatch reuses that walk: the index must be
    the one add_inflight builds from scratch, whatever happened before (splits, evictions)."""
    rng = np.random.default_rng(seed)
    m = 3
    both = [ApproximateTracker([make_cache(40, {"name": "lru", "granularity": "node"}, i) for i in range(m)], True)
            for _ in range(2)]
    systems = [tuple(int(x) for x in rng.integers(0, 4, int(rng.integers(2, 12)))) for _ in range(4)]
    live = []
    for step in range(400):
        if live and rng.random() < 0.45:
            prompt, w = live.pop(int(rng.integers(0, len(live))))
            key = as_key(np.array(prompt, dtype=np.int32))
            gen = as_key(rng.integers(0, 4, int(rng.integers(1, 4))).astype(np.int32))
            for t in both:
                t.completed(key, key + gen, w)
        else:
            prompt = systems[int(rng.integers(0, 4))][: int(rng.integers(0, 13))] + tuple(
                int(x) for x in rng.integers(0, 4, int(rng.integers(0, 5))))
            w = int(rng.integers(0, m))
            key = as_key(np.array(prompt, dtype=np.int32))
            both[0].index.levels(key)  # the decision's walk, reused by the dispatch
            if rng.random() < 0.2:  # ... unless the index changed in between
                probe = as_key(np.array(systems[0], dtype=np.int32))
                for t in both:
                    t.index.add_cached(probe, len(probe) // 4, (w + 1) % m)
            for t in both:
                t.dispatched(key, w)
            live.append((prompt, w))
        assert _shape(both[0].index.root) == _shape(both[1].index.root), step


# ---------------------------------------------------------------------------- evaluation paths
def _drive(router, views, rng, n=120):
    """A random stream with completions; yields (request, now) before each decision."""
    import heapq

    systems = [list(rng.integers(0, 40, int(rng.integers(5, 60)))) for _ in range(6)]
    done: list = []
    t = 0.0
    for i in range(n):
        t += float(rng.exponential(0.03))
        while done and done[0][0] <= t:
            t_done, j, w, q = heapq.heappop(done)
            router.on_request_complete(q, w, t_done - q.arrival_s + float(rng.normal(0, 0.05)), 0.01, 0, t_done)
        prompt = systems[int(rng.integers(0, 6))] + list(rng.integers(0, 40, int(rng.integers(1, 12))))
        q = make_request(i, prompt, output_len=int(rng.integers(1, 6)), arrival_s=t)
        yield q, t
        w = router.select_worker(q, views, t)
        heapq.heappush(done, (t + float(rng.uniform(0.05, 0.8)), i, w, q))


@pytest.mark.parametrize("tracker", ["approximate", "exact"])
@pytest.mark.parametrize("hetero", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_vector_and_loop_evaluations_are_bit_identical(monkeypatch, tracker, hetero, seed):
    m = 30
    cost = LinearCostModel(prefill_base_s=0.01, per_new_s=1e-3, per_new_cached_s=1e-7, decode_base_s=0.02, per_batch_s=0.001)
    other = LinearCostModel(prefill_base_s=0.02, per_new_s=7e-4, decode_base_s=0.01, per_batch_s=0.003)
    views = make_views(m, capacity=400, cost_model=cost)
    if hetero:
        for v in views[::3]:
            v.cost_model = other
        views[1].kv_capacity_tokens = 150
    routers = {}
    for vector_min in (1, 10**9):
        monkeypatch.setattr(lbgr_mod, "VECTOR_MIN_WORKERS", vector_min)
        r = LBGRRouter(tracker=tracker, cache_factory=simple_cache_factory if tracker == "approximate" else None)
        r.reset(views, seed)
        routers[vector_min] = r
    vec, loop = routers[1], routers[10**9]
    assert vec._vector and not loop._vector
    streams = [_drive(vec, views, np.random.default_rng(seed)), _drive(loop, views, np.random.default_rng(seed))]
    for (qa, ta), (qb, tb) in zip(*streams):
        ea, eb = vec.estimate(qa, views, ta), loop.estimate(qb, views, tb)
        assert ea[1] == eb[1]  # hits
        assert ea[2].tolist() == eb[2].tolist()  # S, bit for bit
        assert ea[4].tolist() == eb[4].tolist()  # E, bit for bit
        if tracker == "exact":  # the workers' caches (shared by both routers) fill up
            views[int(np.argmin(ea[4]))].cache.insert(qa.prompt_tokens)
    for _ in streams[1]:  # zip stopped after the first stream's last decision
        pass
    assert vec.pending.keys() == loop.pending.keys()
    assert [vec.pending[k][0] for k in vec.pending] == [loop.pending[k][0] for k in loop.pending]
    np.testing.assert_array_equal(vec.load_est, loop.load_est)


def test_vector_path_breaks_ties_like_the_loop(monkeypatch):
    monkeypatch.setattr(lbgr_mod, "VECTOR_MIN_WORKERS", 1)
    exact = LinearCostModel(prefill_base_s=0.0, per_new_s=1 / 1024, decode_base_s=0.0, per_batch_s=0.0)
    v = make_views(3, capacity=100_000, cost_model=exact)
    r = LBGRRouter(tracker="exact", learner="none")
    r.reset(v, 0)
    assert r._vector
    prompt = list(range(64))
    assert [r.select_worker(make_request(i, prompt), v, 0.0) for i in range(4)] == [0, 1, 2, 0]
    v[0].cache.insert(prompt[:32])  # S_0 = 32/1024 lower, P_0 higher by exactly that: a tie on E
    r.load_est[:] = [0.25 + 32 / 1024, 0.25, 0.25]
    assert r.select_worker(make_request(9, prompt), v, 0.0) == 1  # tie -> lower load, then lower id


# ---------------------------------------------------------------------------- ridge learner
# Tolerance accepted for the plain-float Cholesky solve against the numpy inverse it replaced:
# per worker, |theta - theta_ref|_inf <= RTOL * max(|theta_ref|_inf, THETA_FLOOR). Measured on
# the inputs below: ~4e-15 relative; the decisions this can flip on the paper's cells are
# counted by tests/benchmarks/bench_learner_flips.py.
RTOL = 1e-9
THETA_FLOOR = 1e-3  # coefficients are seconds per feature unit: below a millisecond is noise


def _agree(fast, ref):
    fast, ref = np.asarray(fast), np.asarray(ref)
    scale = np.maximum(np.abs(ref).max(axis=1), THETA_FLOOR)
    err = np.abs(fast - ref).max(axis=1)
    return bool(np.all(err <= RTOL * scale)), float((err / scale).max())


def _phi(prompt, hit, load):
    return (1.0, hit / 1024, (prompt - hit) / 1024, load)


@pytest.mark.parametrize("pooled", [False, True])
@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("m", [1, 3, 8, 40])  # 40: theta's rows by numpy (NUMPY_MIN_WORKERS)
def test_ridge_update_agrees_with_an_inverse_per_update(pooled, lazy, m):
    """Long random runs (LBGR-shaped features: hit + miss = prompt, so the features are nearly
    collinear and the pooled matrix is ill-conditioned): theta within the tolerance after every
    sample, D and c bit-identical (same operations as before)."""
    rng = np.random.default_rng(m + 10 * pooled + 100 * lazy)
    ref = InverseEveryUpdate(m, 4, 0.99, 500.0, pooled, 3.0)
    fast = RidgeRLSLearner(m, 4, 0.99, 500.0, pooled, 3.0, lazy=lazy)
    assert fast._numpy == (m >= learners_mod.NUMPY_MIN_WORKERS)
    prompt = float(rng.integers(100, 8000))
    for k in range(3000):
        w = int(rng.integers(0, m))
        if rng.random() < 0.05:
            prompt = float(rng.integers(100, 8000))
        phi = _phi(prompt, float(rng.integers(0, prompt + 1)), float(rng.exponential(3.0)))
        y = float(rng.normal(0.5, 2))
        ref.update(w, np.array(phi), y)
        fast.update(w, phi, y)
        if rng.random() < 0.2:
            ok, worst = _agree(fast.theta, ref.theta)
            assert ok, (k, worst)
    ok, worst = _agree(fast.theta_rows, ref.theta)
    assert ok, worst
    assert fast.theta_rows == fast.theta.tolist()
    np.testing.assert_array_equal(fast.D, ref.D)
    np.testing.assert_array_equal(fast.c, ref.c)
    np.testing.assert_allclose(fast.K, ref.K, rtol=1e-12, atol=1e-18)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 6),
    st.booleans(),
    st.floats(0.5, 1.0),
    st.floats(0.5, 2000.0),
    st.floats(0.05, 50.0),
    st.lists(
        st.tuples(
            st.integers(0, 63),
            st.floats(0.0, 16.0),
            st.floats(0.0, 1.0),
            st.floats(0.0, 200.0),
            st.floats(-100.0, 100.0),
        ),
        min_size=1,
        max_size=60,
    ),
)
def test_ridge_update_agrees_with_an_inverse_on_random_inputs(m, pooled, lam, delta, pool_delta, samples):
    """Any forgetting factor, regularisation and sample stream (hypothesis): theta within tolerance."""
    ref = InverseEveryUpdate(m, 4, lam, delta, pooled, pool_delta)
    fast = RidgeRLSLearner(m, 4, lam, delta, pooled, pool_delta)
    for w, prompt, frac, load, y in samples:
        phi = (1.0, prompt * frac, prompt * (1.0 - frac), load)
        ref.update(w % m, np.array(phi), y)
        fast.update(w % m, phi, y)
        ok, worst = _agree(fast.theta, ref.theta)
        assert ok, worst


def test_ridge_learner_wants_four_features():
    with pytest.raises(ValueError, match="4 features"):
        RidgeRLSLearner(2, 3)


@pytest.mark.parametrize("m", [3, 25])  # 25: LBGR's numpy evaluation and the learner's numpy rows
def test_flip_counter_counts_flips_and_only_flips(monkeypatch, m):
    """The flip diagnostic (tests/benchmarks/bench_learner_flips.py) on a random stream: with the
    pre-issue-20 learner as its shadow it sees every decision and no flip; with a shadow that
    learns differently (another regularisation) it counts the decisions that change."""
    from tests.benchmarks.bench_learner_flips import ShadowRouter

    monkeypatch.setattr(lbgr_mod, "VECTOR_MIN_WORKERS", 20)
    cost = LinearCostModel(prefill_base_s=0.01, per_new_s=1e-3, decode_base_s=0.02, per_batch_s=0.001)
    counts = []
    for other_delta in (None, 0.5):
        views = make_views(m, capacity=400, cost_model=cost)
        shadow = ShadowRouter(LBGRRouter(cache_factory=simple_cache_factory))
        shadow.reset(views, 0)
        if other_delta is not None:
            lr = shadow.inner.learner
            shadow.ref = InverseEveryUpdate(m, 4, lr.lam, other_delta, lr.pooled, lr.pool_delta)
            shadow.ref_view.ref = shadow.ref
        for _ in _drive(shadow, views, np.random.default_rng(1), n=300):
            pass
        counts.append((shadow.decisions, shadow.flips))
    assert counts[0] == (300, 0)
    assert counts[1][0] == 300 and counts[1][1] > 0


@pytest.mark.parametrize("seed", range(2))
def test_vector_path_matches_the_reference_decisions(monkeypatch, seed):
    """The from-scratch reference of test_lbgr.py, with every decision on the numpy path."""
    from tests.routing.test_lbgr import test_decisions_match_the_reference_on_random_streams as reference

    monkeypatch.setattr(lbgr_mod, "VECTOR_MIN_WORKERS", 1)
    reference(seed)


@pytest.mark.parametrize("lazy", [False, True])
def test_numpy_path_sees_every_learner_update(monkeypatch, lazy):
    """The numpy path caches theta's columns per learner version: an update must show at once."""
    monkeypatch.setattr(lbgr_mod, "VECTOR_MIN_WORKERS", 1)
    v = make_views(3, capacity=1000, cost_model=LinearCostModel())
    r = LBGRRouter(tracker="exact")
    r.reset(v, 0)
    r.learner.lazy = lazy
    q = make_request(1, list(range(50)))
    before = r.estimate(q, v, 0.0)[4]
    r.learner.update(1, (1.0, 0.0, 0.05, 0.0), 5.0)
    after = r.estimate(q, v, 0.0)[4]
    assert after[1] > before[1] and after[0] > before[0]  # the pooled prior moves every worker
    loop = LBGRRouter(tracker="exact")
    monkeypatch.setattr(lbgr_mod, "VECTOR_MIN_WORKERS", 10**9)
    loop.reset(v, 0)
    loop.learner.update(1, (1.0, 0.0, 0.05, 0.0), 5.0)
    assert loop.estimate(q, v, 0.0)[4].tolist() == after.tolist()

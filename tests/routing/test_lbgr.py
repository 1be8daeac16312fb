"""LBGR: estimates, decay, argmin, trackers and the online residual regression."""

from __future__ import annotations

import numpy as np
import pytest

from repro.routing import LBGRRouter
from repro.routing.learners import RLSLearner, SGDLearner
from tests.routing.fakes import FakeView, LinearCostModel, make_request, make_views, simple_cache_factory

# Exact binary fractions so that sums compare exactly: prefill = new / 1024 s, no decode.
EXACT_COST = LinearCostModel(prefill_base_s=0.0, per_new_s=1 / 1024, decode_base_s=0.0, per_batch_s=0.0)


def lbgr(views, seed=0, **kw):
    kw.setdefault("tracker", "exact")
    kw.setdefault("learner", "none")
    r = LBGRRouter(**kw)
    r.reset(views, seed)
    return r


def views_with(m=2, cost=EXACT_COST, capacity=100_000):
    return make_views(m, capacity=capacity, cost_model=cost)


# ---------------------------------------------------------------------------- argmin
def test_argmin_hand_computed():
    v = views_with()
    prompt = list(range(1024))
    v[1].cache.insert(prompt[:512])
    r = lbgr(v)
    r.load_est[:] = [0.25, 0.75]
    # S = [1.0, 0.5]; E = S + P = [1.25, 1.25] -> tie -> lower load -> worker 0
    _, hits, service, _, predicted = r.estimate(make_request(1, prompt), v, 0.0)
    assert hits == [0, 512] and list(service) == [1.0, 0.5] and list(predicted) == [1.25, 1.25]
    assert r.select_worker(make_request(1, prompt), v, 0.0) == 0
    assert list(r.load_est) == [1.25, 0.75]  # P_0 += S_0
    r.load_est[:] = [0.75, 0.25]  # E = [1.75, 0.75] -> worker 1
    assert r.select_worker(make_request(2, prompt), v, 0.0) == 1


def test_ties_go_to_lowest_load_then_lowest_index():
    v = views_with(m=3)
    r = lbgr(v)
    prompt = list(range(64))
    # All equal at start: lowest index; then the loaded worker loses the next ties.
    assert [r.select_worker(make_request(i, prompt), v, 0.0) for i in range(4)] == [0, 1, 2, 0]


def test_rls_with_zero_theta_predicts_like_no_learner():
    v = views_with()
    v[1].cache.insert(list(range(300)))
    a, b = lbgr(v, learner="rls"), lbgr(v, learner="none")
    for i in range(5):
        req = make_request(i, list(range(1000)))
        assert a.select_worker(req, v, 0.01 * i) == b.select_worker(req, v, 0.01 * i)


def test_service_estimate_uses_mean_output_length_not_the_true_one():
    cost = LinearCostModel(prefill_base_s=0.0, per_new_s=0.0, decode_base_s=0.02, per_batch_s=0.001)
    v = views_with(m=1, cost=cost)
    r = lbgr(v)
    long_answer = make_request(1, [1, 2, 3], output_len=50)
    _, _, s, _, _ = r.estimate(long_answer, v, 0.0)
    assert s[0] == pytest.approx(0.0)  # prior: 1 output token = no decode step
    for i, out in enumerate([3, 7]):
        q = make_request(10 + i, [5, 6], output_len=out)
        w = r.select_worker(q, v, 0.0)
        r.on_request_complete(q, w, 0.1, 0.05, 0, 0.1)
    _, _, s, _, _ = r.estimate(long_answer, v, 0.2)
    assert s[0] == pytest.approx(4 * 0.021)  # mean output 5 -> 4 decode steps at batch 1
    oracle = lbgr(v, oracle_output_len=True)
    _, _, s, _, _ = oracle.estimate(long_answer, v, 0.0)
    assert s[0] == pytest.approx(49 * 0.021)


# ---------------------------------------------------------------------------- decay
@pytest.mark.parametrize(
    "t, expected",
    [(0.05, 1.0), (0.1, 0.9), (0.199, 0.9), (0.3, 0.729), (0.35, 0.729), (1.0, 0.9**10)],
)
def test_exponential_decay_lazy_per_interval(t, expected):
    v = views_with(m=1)
    r = lbgr(v)
    r.select_worker(make_request(1, list(range(1024))), v, 0.0)  # S = 1.0
    assert r.load_est[0] == 1.0
    r.estimate(make_request(2, [1]), v, t)
    assert r.load_est[0] == pytest.approx(expected, rel=1e-12)


def test_decay_steps_add_up_and_interval_is_a_knob():
    v = views_with(m=1)
    r = lbgr(v)
    r.select_worker(make_request(1, list(range(1024))), v, 0.0)
    for t in (0.05, 0.12, 0.18, 0.21, 0.5):  # ticks 0,1,1,2,5
        r.estimate(make_request(2, [1]), v, t)
    assert r.load_est[0] == pytest.approx(0.9**5)
    slow = lbgr(v, decay_interval_s=1.0)
    slow.select_worker(make_request(1, list(range(1024))), v, 0.0)
    slow.estimate(make_request(2, [1]), v, 0.5)
    assert slow.load_est[0] == 1.0  # a staler estimate with a longer interval (fig14)


def test_drain_decay_subtracts_elapsed_times_rate_and_clamps():
    v = views_with(m=1)
    r = lbgr(v, decay="drain")
    r.select_worker(make_request(1, list(range(1024))), v, 0.0)  # P = 1.0
    r.estimate(make_request(2, [1]), v, 0.25)
    assert r.load_est[0] == pytest.approx(0.75)  # min rate 1 s/s
    r.estimate(make_request(2, [1]), v, 5.0)
    assert r.load_est[0] == 0.0


def test_drain_rate_follows_completed_work():
    v = views_with(m=1)
    r = lbgr(v, decay="drain", drain_time_constant_s=1.0, drain_min_rate=0.0)
    reqs = [make_request(i, list(range(1024))) for i in range(4)]
    for q in reqs:
        r.select_worker(q, v, 0.0)  # P = 4.0
    for q in reqs[:2]:
        r.on_request_complete(q, 0, 1.0, 0.5, 0, 0.0)  # 2 s of estimated work done at t=0
    r.estimate(make_request(9, [1]), v, 0.5)
    assert r.load_est[0] == pytest.approx(4.0 - 0.5 * 2.0)


# ---------------------------------------------------------------------------- trackers
def test_exact_tracker_reads_views_with_peek_prefix_only():
    v = views_with(m=3)
    v[2].cache.insert(list(range(800)))
    v[2].cache.calls.clear()
    r = lbgr(v, tracker="exact", learner="rls")
    for i in range(6):
        q = make_request(i, list(range(1000)))
        w = r.select_worker(q, v, 0.01 * i)
        r.on_request_complete(q, w, 0.5, 0.1, 0, 0.01 * i + 0.5)
    assert r.caches is None
    for view in v:
        assert set(view.view_calls) == {"peek_prefix"}  # the spy's match_prefix was never called
        assert set(view.cache.calls) <= {"peek_prefix"}  # and the worker cache saw no access


def test_exact_tracker_prefers_the_worker_that_holds_the_prefix():
    v = views_with(m=3)
    v[2].cache.insert(list(range(800)))
    r = lbgr(v)
    assert r.select_worker(make_request(1, list(range(1000))), v, 0.0) == 2


def test_approximate_tracker_mirrors_dispatch_and_completion():
    v = views_with(m=2, capacity=50)
    v[1].eviction_policy = "rlt"
    r = lbgr(v, tracker="approximate", cache_factory=simple_cache_factory)
    assert [c.eviction_cfg for c in r.caches] == [
        {"name": "lru", "granularity": "node"},
        {"name": "rlt", "granularity": "node"},
    ]
    assert [c.capacity_tokens for c in r.caches] == [50, 50]
    assert r.caches[0].seed != r.caches[1].seed
    q = make_request(1, list(range(20)), output_len=4)
    w = r.select_worker(q, v, 0.0)
    assert r.caches[w].peek_prefix(q.prompt_tokens) == 20
    r.on_request_complete(q, w, 0.3, 0.1, 0, 0.3)
    assert r.caches[w].peek_prefix(q.full_tokens) == 24
    # The next request with the same prefix goes where the tracker says the prefix is.
    assert r.select_worker(make_request(2, list(range(20)) + [99]), v, 0.31) == w
    assert all(view.view_calls == [] for view in v)  # approximate mode never reads the workers


def test_approximate_tracker_evicts_to_capacity_and_cuts_long_paths():
    v = views_with(m=1, capacity=30)
    r = lbgr(v, tracker="approximate", cache_factory=simple_cache_factory)
    for i in range(5):
        r.select_worker(make_request(i, [1000 * i + k for k in range(12)]), v, 0.0)
        assert r.caches[0].total_size() <= 30
    r.select_worker(make_request(99, list(range(45))), v, 0.0)  # longer than the capacity
    assert r.caches[0].total_size() == 30
    assert r.caches[0].peek_prefix(list(range(45))) == 30


# ---------------------------------------------------------------------------- learning
THETA_TRUE = np.array([0.5, -0.2, 0.3, 1.5])


def _synthetic(n, rng):
    phi = np.column_stack([np.ones(n), rng.uniform(0, 4, n), rng.uniform(0, 4, n), rng.uniform(0, 3, n)])
    return phi, phi @ THETA_TRUE + rng.normal(0, 0.01, n)


def test_rls_recovers_known_coefficients():
    rng = np.random.default_rng(0)
    phi, y = _synthetic(400, rng)
    learner = RLSLearner(2, 4, forgetting_factor=0.99)
    for k in range(len(y)):
        learner.update(1, phi[k], y[k])
    np.testing.assert_allclose(learner.theta[1], THETA_TRUE, atol=0.02)
    assert not learner.theta[0].any()  # per worker: the other model is untouched


def test_rls_forgetting_tracks_a_change():
    rng = np.random.default_rng(1)
    learner = RLSLearner(1, 4, forgetting_factor=0.95)
    phi, y = _synthetic(300, rng)
    for k in range(300):
        learner.update(0, phi[k], y[k])
    shifted = THETA_TRUE + np.array([1.0, 0.0, 0.0, -1.0])
    phi, _ = _synthetic(300, rng)
    for k in range(300):
        learner.update(0, phi[k], phi[k] @ shifted)
    np.testing.assert_allclose(learner.theta[0], shifted, atol=0.02)


def test_rls_covariance_stays_bounded_without_excitation():
    learner = RLSLearner(1, 4, forgetting_factor=0.99, max_trace=1e4)
    phi = np.array([1.0, 0.5, 0.5, 0.0])  # the same direction forever
    for _ in range(5_000):  # 0.99 ** -5000 ~ 1e22: unbounded P would be way past the cap
        learner.update(0, phi, 1.0)
    assert np.isfinite(learner.P).all() and np.trace(learner.P[0]) <= 1e4 * 1.01
    assert learner.theta[0] @ phi == pytest.approx(1.0)


def test_sgd_recovers_known_coefficients():
    rng = np.random.default_rng(2)
    phi, y = _synthetic(20_000, rng)
    learner = SGDLearner(1, 4, learning_rate=0.02)
    for k in range(len(y)):
        learner.update(0, phi[k], y[k])
    np.testing.assert_allclose(learner.theta[0], THETA_TRUE, atol=0.05)


class SpyLearner:
    def __init__(self):
        self.samples = []
        self.theta_rows = [[0.0] * 4, [0.0] * 4]

    def predict(self, phi):
        return np.zeros(len(phi))

    def update(self, worker, phi, y):
        self.samples.append((worker, phi.copy(), y))


def test_residual_target_is_latency_minus_service_and_load_features_scaled():
    v = views_with(m=2)
    v[0].cache.insert(list(range(512)))
    r = lbgr(v, learner="rls", token_scale=512.0, load_scale_s=2.0)
    r.learner = SpyLearner()
    r.load_est[:] = [1.0, 3.0]
    q = make_request(7, list(range(1024)))
    w = r.select_worker(q, v, 0.0)  # S = [0.5, 1.0], E = [1.5, 4.0]
    assert w == 0
    r.on_request_complete(q, 0, 2.25, 0.1, 512, 1.0)
    (worker, phi, y), = r.learner.samples
    assert worker == 0 and y == pytest.approx(2.25 - 1.5)
    np.testing.assert_allclose(phi, [1.0, 1.0, 1.0, 0.5])  # [1, 512/512, 512/512, 1.0/2]


class ScriptedView(FakeView):
    """peek_prefix answers a scripted hit length (capped at the prompt)."""

    hit: int = 0

    def peek_prefix(self, tokens) -> int:
        return min(self.hit, len(tokens) // 4 if isinstance(tokens, bytes) else len(tokens))


@pytest.mark.parametrize("learner", ["rls", "sgd"])
def test_router_learns_the_residual_of_a_synthetic_cluster(learner):
    """Latency = S + P + theta*.phi exactly: the router's per-worker models converge to theta*."""
    rng = np.random.default_rng(3)
    v = [ScriptedView(worker_id=i, cost_model=EXACT_COST) for i in range(2)]
    r = lbgr(v, learner=learner, token_scale=1024.0, sgd_learning_rate=0.05)
    theta = {0: np.array([0.2, -0.1, 0.4, 0.5]), 1: np.array([0.1, 0.3, -0.2, 0.8])}
    now = 0.0
    for i in range(4000 if learner == "sgd" else 600):
        now += rng.exponential(0.05)
        n = int(rng.integers(256, 4096))
        for view in v:
            view.hit = int(rng.integers(0, n))
        r.load_est[:] = rng.uniform(0, 3, 2)  # keep the load feature excited
        q = make_request(i, np.zeros(n, dtype=np.int32))
        w = r.select_worker(q, v, now)
        _, phi, base, _ = r.pending[q.id]
        r.on_request_complete(q, w, base + phi @ theta[w], 0.0, 0, now)
    for w in (0, 1):
        np.testing.assert_allclose(r.learner.theta[w], theta[w], atol=0.05)


# ---------------------------------------------------------------------------- misc
def test_completion_bookkeeping():
    v = views_with()
    r = lbgr(v)
    r.on_request_complete(make_request(123, [1]), 0, 1.0, 0.5, 0, 1.0)  # unknown: ignored
    q = make_request(1, [1, 2])
    w = r.select_worker(q, v, 0.0)
    with pytest.raises(ValueError, match="dispatched to worker"):
        r.on_request_complete(q, 1 - w, 1.0, 0.5, 0, 1.0)


@pytest.mark.parametrize(
    "kw",
    [
        {"tracker": "perfect"},
        {"decay": "linear"},
        {"learner": "adam"},
        {"decay_factor": 0.0},
        {"decay_factor": 1.5},
        {"decay_interval_s": 0.0},
        {"forgetting_factor": 0.0},
        {"sgd_learning_rate": -1.0, "learner": "sgd"},
        {"token_scale": 0},
        {"output_len_prior": 0},
    ],
)
def test_bad_config_fails_at_construction(kw):
    with pytest.raises(ValueError):
        LBGRRouter(**kw)


# ---------------------------------------------------------------------------- the real kvcache
def _real_make_cache():
    try:
        from repro.kvcache import make_cache
    except ImportError:
        pytest.skip("repro.kvcache.make_cache has not landed on this branch yet")
    return make_cache


@pytest.mark.parametrize("policy", ["lru", "rlt"])
def test_approximate_tracker_with_the_real_radix_cache(policy):
    _real_make_cache()
    v = views_with(m=3, capacity=600)
    for view in v:
        view.eviction_policy = policy
    r = lbgr(v, tracker="approximate", cache_factory=None)  # the default factory: repro.kvcache.make_cache
    rng = np.random.default_rng(0)
    systems = [rng.integers(0, 30_000, 150) for _ in range(5)]
    now = 0.0
    for i in range(60):
        now += 0.05
        prompt = np.concatenate([systems[i % 5], rng.integers(0, 30_000, 20)]).astype(np.int32)
        q = make_request(i, prompt, output_len=3)
        w = r.select_worker(q, v, now)
        assert r.caches[w].peek_prefix(prompt) == len(prompt)
        r.on_request_complete(q, w, 0.2, 0.05, 0, now + 0.2)
        assert r.caches[w].peek_prefix(q.full_tokens) == len(q.full_tokens)
        assert all(c.total_size() <= 600 for c in r.caches)
    assert all(view.view_calls == [] for view in v)

"""LBGR: estimates, decay, argmin, trackers and the online residual regression."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.routing import LBGRRouter
from repro.routing.trackers import SharedPrefixIndex
from repro.routing.learners import RidgeRLSLearner, RLSLearner, SGDLearner
from repro.kvcache import as_key
from tests.routing.fakes import FakeView, LinearCostModel, make_request, make_views, simple_cache_factory

# Exact binary fractions so that sums compare exactly: prefill = new / 1024 s, no decode.
EXACT_COST = LinearCostModel(prefill_base_s=0.0, per_new_s=1 / 1024, decode_base_s=0.0, per_batch_s=0.0)


def lbgr(views, seed=0, **kw):
    kw.setdefault("tracker", "exact")
    kw.setdefault("learner", "none")
    kw.setdefault("decay_factor", 0.9)  # the decay tests' hand-computed values use gamma = 0.9
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
    r = lbgr(v, service_model="batch1")
    long_answer = make_request(1, [1, 2, 3], output_len=50)
    _, _, s, _, _ = r.estimate(long_answer, v, 0.0)
    assert s[0] == pytest.approx(0.0)  # prior: 1 output token = no decode step
    for i, out in enumerate([3, 7]):
        q = make_request(10 + i, [5, 6], output_len=out)
        w = r.select_worker(q, v, 0.0)
        r.on_request_complete(q, w, 0.1, 0.05, 0, 0.1)
    _, _, s, _, _ = r.estimate(long_answer, v, 0.2)
    assert s[0] == pytest.approx(4 * 0.021)  # mean output 5 -> 4 decode steps at batch 1
    oracle = lbgr(v, service_model="batch1", oracle_output_len=True)
    _, _, s, _, _ = oracle.estimate(long_answer, v, 0.0)
    assert s[0] == pytest.approx(49 * 0.021)


def test_kv_batch_service_is_the_share_of_a_kv_full_decode_batch():
    # decode step = 0.02 + 0.001 * batch; prefill = 0.001 per new token.
    cost = LinearCostModel(prefill_base_s=0.0, per_new_s=0.001, decode_base_s=0.02, per_batch_s=0.001)
    v = views_with(m=2, cost=cost, capacity=1000)
    v[1].kv_capacity_tokens = 60  # reset reads the capacity
    r = lbgr(v, oracle_output_len=True)  # service_model: kv_batch (default)
    q = make_request(1, list(range(96)), output_len=4)
    _, _, s, _, _ = r.estimate(q, v, 0.0)
    # worker 0: b = 1000 // (96 + 4) = 10 -> 3 steps * (0.02 + 0.010) / 10 = 0.009
    # worker 1: b = max(1, 60 // 100) = 1 -> 3 steps * 0.021 = 0.063 (= batch1)
    np.testing.assert_allclose(s, [0.096 + 0.009, 0.096 + 0.063])
    assert r.decode_batch(0, 96, 4.0) == 10 and r.decode_batch(1, 96, 4.0) == 1
    b1 = lbgr(v, oracle_output_len=True, service_model="batch1")
    np.testing.assert_allclose(b1.estimate(q, v, 0.0)[2], [0.096 + 0.063] * 2)


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


def test_approximate_tracker_builds_one_cache_per_worker_like_the_worker():
    v = views_with(m=2, capacity=50)
    v[1].eviction_policy = "rlt"
    r = lbgr(v, tracker="approximate", cache_factory=simple_cache_factory)
    assert [c.eviction_cfg for c in r.caches] == [
        {"name": "lru", "granularity": "node"},
        {"name": "rlt", "granularity": "node"},
    ]
    assert [c.capacity_tokens for c in r.caches] == [50, 50]
    assert r.caches[0].seed != r.caches[1].seed
    assert r.index.num_workers == 2 and r.tracker_state.track_inflight  # tracker_update: inflight (default)


def test_dispatch_tracker_mirrors_dispatch_and_completion():
    """tracker_update: dispatch (ablation): the prompt is an access of the cache tree on dispatch."""
    v = views_with(m=2, capacity=50)
    r = lbgr(v, tracker="approximate", tracker_update="dispatch", cache_factory=simple_cache_factory)
    assert not r.tracker_state.track_inflight
    q = make_request(1, list(range(20)), output_len=4)
    w = r.select_worker(q, v, 0.0)
    assert r.caches[w].peek_prefix(q.prompt_tokens) == 20
    r.on_request_complete(q, w, 0.3, 0.1, 0, 0.3)
    # prompt + output - 1: the worker never feeds the last sampled token, so it caches no KV for it
    assert r.caches[w].peek_prefix(q.full_tokens) == 23
    # The next request with the same prefix goes where the tracker says the prefix is.
    assert r.select_worker(make_request(2, list(range(20)) + [99]), v, 0.31) == w
    assert all(view.view_calls == [] for view in v)  # approximate mode never reads the workers


def _nothing_in_flight(index) -> bool:
    stack = list(index.root.children.values())
    while stack:
        node = stack.pop()
        if node.imask or node.inflight:
            return False
        stack.extend(node.children.values())
    return True


def test_inflight_tracker_hand_computed():
    """In flight: the prompt is in the worker's in-flight tree (a hit for followers), not in its
    cache tree; on completion it leaves the in-flight tree and prompt + output - 1 enter the cache tree."""
    v = views_with(m=2, capacity=50)
    r = lbgr(v, tracker="approximate", cache_factory=simple_cache_factory)
    a = make_request(1, list(range(20)), output_len=4)
    w = r.select_worker(a, v, 0.0)
    assert r.caches[w].total_size() == 0  # not admitted yet as far as the router knows
    assert r.index.inflight_hits(as_key(a.prompt_tokens))[w] == 20 and r.index.inflight_size == 1
    b = make_request(2, list(range(20)) + [99])
    assert r.tracked_hits(as_key(b.prompt_tokens), v) == ([20, 0] if w == 0 else [0, 20])
    # S = [1, 21] / 1024 s, P_w = 20 / 1024 * 0.9^5 at t = 0.5: the prefix wins
    assert r.select_worker(b, v, 0.5) == w
    r.on_request_complete(a, w, 0.3, 0.1, 0, 0.6)
    assert r.caches[w].peek_prefix(a.full_tokens) == 23  # 20 + 4 - 1
    assert r.index.inflight_hits(as_key(a.prompt_tokens))[w] == 20  # b (same 20-token prefix) still in flight
    r.on_request_complete(b, w, 0.3, 0.1, 0, 0.61)
    assert r.index.inflight_size == 0 and _nothing_in_flight(r.index)
    assert r.caches[w].peek_prefix(b.full_tokens) == 24  # 21 + 4 - 1
    assert all(view.view_calls == [] for view in v)


def test_inflight_tracker_is_not_polluted_by_a_queue_longer_than_the_cache():
    """A burst larger than the worker's cache does not evict, in the tracker, what the worker holds."""
    v = views_with(m=1, capacity=30)
    old = make_request(0, list(range(500, 512)))
    for tu in ("inflight", "dispatch"):
        r = lbgr(v, tracker="approximate", tracker_update=tu, cache_factory=simple_cache_factory)
        r.on_request_complete(old, r.select_worker(old, v, 0.0), 0.1, 0.1, 0, 0.1)
        burst = [make_request(i, [1000 * i + k for k in range(12)]) for i in range(1, 6)]  # 60 tokens
        for q in burst:
            r.select_worker(q, v, 0.2)
        assert r.caches[0].total_size() <= 30
        hit = r.tracked_hits(as_key(old.prompt_tokens), v)[0]
        assert hit == (12 if tu == "inflight" else 0)


def test_approximate_tracker_evicts_to_capacity_and_cuts_long_paths():
    v = views_with(m=1, capacity=30)
    for tu in ("inflight", "dispatch"):
        r = lbgr(v, tracker="approximate", tracker_update=tu, cache_factory=simple_cache_factory)
        for i in range(5):
            q = make_request(i, [1000 * i + k for k in range(12)], output_len=1)
            r.on_request_complete(q, r.select_worker(q, v, 0.0), 0.1, 0.1, 0, 0.1)
            assert r.caches[0].total_size() <= 30
        q = make_request(99, list(range(45)), output_len=1)  # longer than the capacity
        r.on_request_complete(q, r.select_worker(q, v, 0.2), 0.1, 0.1, 0, 0.3)
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
        self.samples.append((worker, np.array(phi), y))


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


def _drive_synthetic_cluster(r, v, theta, n_requests, rng):
    """Latency = S + P + theta[w] . phi exactly, with every feature excited."""
    now = 0.0
    for i in range(n_requests):
        now += rng.exponential(0.05)
        n = int(rng.integers(256, 4096))
        for view in v:
            view.hit = int(rng.integers(0, n))
        r.load_est[:] = rng.uniform(0, 3, len(v))  # keep the load feature excited
        q = make_request(i, np.zeros(n, dtype=np.int32))
        w = r.select_worker(q, v, now)
        _, phi, base, _, _ = r.pending[q.id]
        r.on_request_complete(q, w, base + phi @ theta[w], 0.0, 0, now)


@pytest.mark.parametrize(
    "learner, kw, n",
    [
        ("rls", {"rls_regularization": 0.0}, 600),  # plain RLS per worker (ablation)
        ("rls", {"rls_regularization": 1.0, "rls_pooled": False}, 600),
        ("rls", {"rls_regularization": 1.0, "rls_pooled": True}, 600),  # a weak prior: own models win
        ("sgd", {"sgd_learning_rate": 0.05}, 4000),
    ],
)
def test_router_learns_the_residual_of_a_synthetic_cluster(learner, kw, n):
    """Different true residuals per worker: each worker's model converges to its own theta*."""
    rng = np.random.default_rng(3)
    v = [ScriptedView(worker_id=i, cost_model=EXACT_COST) for i in range(2)]
    r = lbgr(v, learner=learner, token_scale=1024.0, **kw)
    theta = {0: np.array([0.2, -0.1, 0.4, 0.5]), 1: np.array([0.1, 0.3, -0.2, 0.8])}
    _drive_synthetic_cluster(r, v, theta, n, rng)
    for w in (0, 1):
        np.testing.assert_allclose(r.learner.theta[w], theta[w], atol=0.05)


def test_default_learner_learns_a_residual_common_to_all_workers():
    """Default (pooled ridge prior worth 500 samples per worker): a cluster-wide bias is learned."""
    rng = np.random.default_rng(4)
    v = [ScriptedView(worker_id=i, cost_model=EXACT_COST) for i in range(4)]
    r = lbgr(v, learner="rls")
    assert isinstance(r.learner, RidgeRLSLearner) and r.learner.pooled
    common = np.array([0.3, -0.1, 0.2, -0.4])
    _drive_synthetic_cluster(r, v, {w: common for w in range(4)}, 2000, rng)
    for w in range(4):
        np.testing.assert_allclose(r.learner.theta[w], common, atol=0.02)


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
        {"tracker_update": "admission"},
        {"service_model": "batched"},
        {"min_load_weight": 1.5},
        {"rls_regularization": -1.0},
        {"rls_pool_regularization": 0.0},
    ],
)
def test_bad_config_fails_at_construction(kw):
    with pytest.raises(ValueError):
        LBGRRouter(**kw)


# ---------------------------------------------------------------------------- the real kvcache
def _real_make_cache():
    from repro.kvcache import make_cache  # a missing module is a failure, not a skip

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
        assert r.tracked_hits(as_key(prompt), v)[w] == len(prompt)  # through the in-flight tree
        r.on_request_complete(q, w, 0.2, 0.05, 0, now + 0.2)
        assert r.caches[w].peek_prefix(q.full_tokens) == len(q.full_tokens) - 1  # no KV for the last token
        assert all(c.total_size() <= 600 for c in r.caches)
        assert r.index.inflight_size == 0 and _nothing_in_flight(r.index)  # nothing in flight any more
    assert all(view.view_calls == [] for view in v)


# ---------------------------------------------------------------------------- learner reference
def _ridge_reference(samples, m, lam, delta, pooled, pool_delta):
    """Direct weighted ridge solutions from the whole sample list (obviously right, slow)."""
    d = len(samples[0][1])
    pool_lam = lam ** (1.0 / m)
    prior = np.zeros(d)
    if pooled:
        n = len(samples)
        w = np.array([pool_lam ** (n - 1 - k) for k in range(n)])
        X = np.array([s[1] for s in samples])
        y = np.array([s[2] for s in samples])
        prior = np.linalg.solve(X.T @ (w[:, None] * X) + pool_delta * np.eye(d), X.T @ (w * y))
    theta = np.zeros((m, d))
    for i in range(m):
        own = [s for s in samples if s[0] == i]
        n = len(own)
        X = np.array([s[1] for s in own]).reshape(n, d)
        y = np.array([s[2] for s in own])
        w = np.array([lam ** (n - 1 - k) for k in range(n)])
        theta[i] = np.linalg.solve(X.T @ (w[:, None] * X) + delta * np.eye(d), X.T @ (w * y) + delta * prior)
    return theta


@pytest.mark.parametrize("pooled", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_ridge_rls_matches_the_batch_ridge_solution(pooled, seed):
    rng = np.random.default_rng(seed)
    m, lam, delta, pool_delta = 3, float(rng.uniform(0.9, 1.0)), float(rng.uniform(0.5, 50)), float(rng.uniform(0.5, 5))
    learner = RidgeRLSLearner(m, 4, lam, delta, pooled, pool_delta)
    samples = []
    for _ in range(int(rng.integers(1, 60))):
        w = int(rng.integers(0, m))
        phi = np.concatenate([[1.0], rng.uniform(0, 4, 3)])
        y = float(rng.normal(0, 2))
        samples.append((w, phi, y))
        learner.update(w, phi, y)
    np.testing.assert_allclose(learner.theta, _ridge_reference(samples, m, lam, delta, pooled, pool_delta), atol=1e-9)
    assert learner.theta_rows == learner.theta.tolist()


def test_pooled_prior_keeps_a_worker_with_few_unlucky_samples_near_the_cluster_model():
    rng = np.random.default_rng(5)
    common = np.array([0.2, 0.0, 0.1, -0.3])
    pooled = RidgeRLSLearner(4, 4, 0.99, 500.0, True, 3.0)
    alone = RidgeRLSLearner(4, 4, 0.99, 500.0, False, 3.0)
    for k in range(400):
        w = k % 3  # workers 0-2 see the common residual ...
        phi = np.concatenate([[1.0], rng.uniform(0, 2, 3)])
        for learner in (pooled, alone):
            learner.update(w, phi, phi @ common)
    for _ in range(5):  # ... worker 3 only five 2-second outliers
        phi = np.array([1.0, 1.0, 0.0, 0.0])
        for learner in (pooled, alone):
            learner.update(3, phi, 2.0)
    typical = np.array([1.0, 1.0, 1.0, 1.0])
    np.testing.assert_allclose(pooled.theta[:3] @ typical, common @ typical, atol=0.05)
    # worker 3 predicts near the cluster's 0.2 s, not its outliers' 2 s; unpooled, near the prior 0
    assert abs(pooled.theta[3] @ phi - common @ phi) < 0.25
    assert abs(alone.theta[3] @ phi) < 0.1


# ---------------------------------------------------------------------------- load-weight floor
def test_min_load_weight_keeps_the_prediction_increasing_in_the_load():
    v = views_with(m=2)
    r = lbgr(v, learner="rls", load_scale_s=2.0)  # min_load_weight 0.25 (default)
    r.learner.theta[:] = [[0.0, 0.0, 0.0, -3.0], [0.0, 0.0, 0.0, -1.0]]
    r.learner.theta_rows = r.learner.theta.tolist()
    r.load_est[:] = [2.0, 2.0]
    q = make_request(1, list(range(1024)))  # S = 1.0 on both
    _, _, _, _, e = r.estimate(q, v, 0.0)
    # worker 0: theta3 = -3 raised to -(1 - 0.25) * 2 = -1.5 -> E = 1 + 2 - 1.5 * 2 / 2 = 1.5
    # worker 1: theta3 = -1 is allowed -> E = 1 + 2 - 1 * 2 / 2 = 2.0
    np.testing.assert_allclose(e, [1.5, 2.0])
    loose = lbgr(v, learner="rls", load_scale_s=2.0, min_load_weight=None)
    loose.learner.theta[:] = r.learner.theta
    loose.learner.theta_rows = r.learner.theta_rows
    loose.load_est[:] = [2.0, 2.0]
    np.testing.assert_allclose(loose.estimate(q, v, 0.0)[4], [0.0, 2.0])  # dE/dP = -0.5 < 0 on worker 0
    for w in (0, 1):  # with the floor, more load never predicts a lower latency
        r.load_est[:] = [3.0, 3.0]
        assert r.estimate(q, v, 0.0)[4][w] > e[w]


# ---------------------------------------------------------------------------- decision reference
class _ReferenceLBGR:
    """LBGR's decision recomputed from scratch (obviously right, slow): hits by brute-force
    longest common prefix over the in-flight prompts and a token-level LRU tracker updated on
    completion, P as the closed-form sum of decayed S over all dispatches, S from the cost
    model formula, theta read from the router's learner (tested against its own reference)."""

    def __init__(self, m, capacity, gamma, dt, min_load_weight):
        from tests.routing.fakes import SimpleLRUCache

        self.caches = [SimpleLRUCache(capacity) for _ in range(m)]
        self.capacity = capacity
        self.inflight = [dict() for _ in range(m)]  # id -> prompt tuple
        self.dispatches = []  # (tick, worker, S)
        self.gamma, self.dt, self.w_min = gamma, dt, min_load_weight
        self.outputs = []

    def tick(self, t):
        return int(np.floor(t / self.dt + 1e-9))

    def load(self, i, t):
        k = self.tick(t)
        return sum(s * self.gamma ** (k - k0) for k0, w, s in self.dispatches if w == i)

    def hit(self, i, prompt):
        best = self.caches[i].peek_prefix(prompt)
        for other in self.inflight[i].values():
            n = 0
            while n < min(len(prompt), len(other)) and prompt[n] == other[n]:
                n += 1
            best = max(best, n)
        return best

    def estimate(self, q, views, t, theta):
        prompt = tuple(int(x) for x in q.prompt_tokens)
        o = np.mean(self.outputs) if self.outputs else 1.0
        e, s_all = [], []
        for i, view in enumerate(views):
            h = self.hit(i, prompt)
            cm = view.cost_model
            b = max(1, int(self.capacity // (len(prompt) + o)))
            s = cm.prefill_time_s(len(prompt) - h, h) + (o - 1) * cm.decode_time_s(b, b * len(prompt)) / b
            p = self.load(i, t)
            t3 = max(theta[i][3], -(1 - self.w_min) * 1.0)
            r = theta[i][0] + theta[i][1] * h / 1024 + theta[i][2] * (len(prompt) - h) / 1024 + t3 * p
            e.append(s + p + r)
            s_all.append(s)
        return np.array(e), np.array(s_all), [self.load(i, t) for i in range(len(views))]

    def choose(self, e, loads):
        return min(range(len(e)), key=lambda i: (e[i], loads[i], i))

    def dispatch(self, q, w, t, s):
        self.dispatches.append((self.tick(t), w, s))
        self.inflight[w][q.id] = tuple(int(x) for x in q.prompt_tokens)

    def complete(self, q, w):
        del self.inflight[w][q.id]
        self.outputs.append(q.output_len)
        # the worker caches prompt + output - 1 (the last sampled token is never fed forward)
        full = tuple(int(x) for x in q.full_tokens)[: len(q.full_tokens) - 1][: self.capacity]
        c = self.caches[w]
        n = c.match_prefix(full).length
        c.inc_lock_ref(full[:n])
        if len(full) - n > c.free_tokens():
            c.evict(len(full) - n - c.free_tokens())
        c.dec_lock_ref(full[:n])
        c.insert(full[: n + min(len(full) - n, c.free_tokens())])


@pytest.mark.parametrize("seed", range(4))
def test_decisions_match_the_reference_on_random_streams(seed):
    import heapq

    rng = np.random.default_rng(seed)
    m, capacity = 3, 120
    cost = LinearCostModel(prefill_base_s=0.01, per_new_s=1e-3, per_new_cached_s=0.0, decode_base_s=0.02, per_batch_s=0.001)
    v = views_with(m=m, cost=cost, capacity=capacity)
    r = LBGRRouter(cache_factory=simple_cache_factory)  # the defaults: approximate, inflight, kv_batch, rls
    r.reset(v, seed)
    ref = _ReferenceLBGR(m, capacity, r.decay_factor, r.decay_interval_s, r.min_load_weight)
    systems = [list(rng.integers(0, 50, int(rng.integers(5, 40)))) for _ in range(4)]
    done: list = []
    t = 0.0
    for i in range(80):
        t += float(rng.exponential(0.05))
        while done and done[0][0] <= t:
            t_done, j, w, q = heapq.heappop(done)
            r.on_request_complete(q, w, t_done - q.arrival_s, 0.01, 0, t_done)
            ref.complete(q, w)
        prompt = systems[int(rng.integers(0, 4))] + list(rng.integers(0, 50, int(rng.integers(1, 10))))
        q = make_request(i, prompt, output_len=int(rng.integers(1, 6)), arrival_s=t)
        e_ref, s_ref, loads = ref.estimate(q, v, t, r.learner.theta)
        _, _, s, _, e = r.estimate(q, v, t)
        np.testing.assert_allclose(s, s_ref, rtol=1e-12)
        np.testing.assert_allclose(e, e_ref, rtol=1e-9, atol=1e-12)
        w = r.select_worker(q, v, t)
        assert w == ref.choose(e_ref, loads)
        ref.dispatch(q, w, t, s_ref[w])
        heapq.heappush(done, (t + float(rng.uniform(0.05, 0.6)), i, w, q))


# ---------------------------------------------------------------------------- in-flight prompt tree
def _lcp(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_inflight_prompts_match_brute_force(data):
    """hits() = per worker, the longest common prefix with its in-flight prompts, through any
    sequence of adds and removes (shared prefixes, duplicates, prompts that prefix others)."""
    m = 3
    tree = SharedPrefixIndex(m)
    live: list[tuple[tuple, int]] = []
    token = st.integers(0, 3)  # a tiny alphabet: many shared prefixes
    prompt = st.lists(token, min_size=1, max_size=12).map(tuple)
    for _ in range(data.draw(st.integers(1, 40))):
        if live and data.draw(st.booleans()):
            k, w = live.pop(data.draw(st.integers(0, len(live) - 1)))
            tree.remove_inflight(as_key(np.array(k)), w)
        else:
            k, w = data.draw(prompt), data.draw(st.integers(0, m - 1))
            tree.add_inflight(as_key(np.array(k)), w)
            live.append((k, w))
        q = data.draw(prompt)
        expected = [max([_lcp(q, k) for k, w in live if w == i], default=0) for i in range(m)]
        assert tree.hits(as_key(np.array(q))) == expected
        assert tree.inflight_size == len(live)
    for k, w in live:
        tree.remove_inflight(as_key(np.array(k)), w)
    assert not tree.root.children


def test_a_subtree_cut_off_the_index_is_freed_without_the_cycle_collector():
    """Nodes nobody holds leave the index at once (reference counting): a parent link left in
    place made each cut-off subtree a cycle, and such garbage had piled up to ~400k objects in
    a 250k-request cell between the rare full GC passes."""
    import gc

    from repro.routing.trackers import _Node

    rng = np.random.default_rng(0)
    tree = SharedPrefixIndex(4)
    gc.collect()
    gc.disable()
    try:
        for j in range(300):  # in flight, then cached, then evicted: branches come and go
            key = as_key(np.concatenate([[j % 5], rng.integers(0, 3, size=int(rng.integers(2, 9)))]))
            w = j % 4
            tree.add_inflight(key, w)
            tree.complete(key, key + as_key(np.array([7, 7])), len(key) // 4 + 2, w, inflight=True)
            tree.remove_cached(key + as_key(np.array([7, 7])), int(rng.integers(0, 3)), w)
        alive = sum(isinstance(o, _Node) for o in gc.get_objects())
    finally:
        gc.enable()
    assert alive == tree.num_nodes() + 1  # the root

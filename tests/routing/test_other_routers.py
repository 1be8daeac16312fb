"""Random, round-robin, power-of-two, Dynamo and llm-d rules on hand-computed cases."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from repro.routing import DynamoRouter, LLMDRouter, PowerOfTwoRouter, RandomRouter, RoundRobinRouter
from repro.routing.dynamo import block_hashes
from tests.routing.fakes import make_request, make_views


def run(router, views, n, seed=0, prompt=(1, 2, 3)):
    router.reset(views, seed)
    return [router.select_worker(make_request(i, list(prompt)), views, 0.0) for i in range(n)]


# ---------------------------------------------------------------------------- random / round robin
def test_random_is_uniform_and_seeded():
    v = make_views(4)
    picks = run(RandomRouter(), v, 4000, seed=1)
    counts = Counter(picks)
    assert set(counts) == {0, 1, 2, 3} and all(900 < c < 1100 for c in counts.values())
    assert run(RandomRouter(), v, 50, seed=1) == picks[:50]
    assert run(RandomRouter(), v, 50, seed=2) != picks[:50]


def test_round_robin_cycles_and_restarts_on_reset():
    v = make_views(3)
    r = RoundRobinRouter()
    assert run(r, v, 7) == [0, 1, 2, 0, 1, 2, 0]
    assert run(r, v, 2) == [0, 1]


# ---------------------------------------------------------------------------- power of two
def test_power_of_two_draws_two_distinct_workers_uniformly():
    v = make_views(4)
    r = PowerOfTwoRouter()
    r.reset(v, 0)
    picks = Counter()
    for i in range(4000):
        r.in_flight = [0, 0, 0, 10**6]  # worker 3 loses every pair: never picked (pairs are distinct)
        picks[r.select_worker(make_request(i, [1]), v, 0.0)] += 1
    assert picks[3] == 0
    # Worker k in {0,1,2} wins when it is drawn first (1/4), or second after worker 3 (1/12): 1/3 each.
    assert all(1200 < picks[k] < 1467 for k in range(3))


def test_power_of_two_prefers_the_less_loaded_of_two_draws():
    v = make_views(2)
    r = PowerOfTwoRouter()
    r.reset(v, 0)
    r.in_flight = [5, 0]
    assert all(r.select_worker(make_request(i, [1]), v, 0.0) == 1 for i in range(5))  # 1 stays <= 5
    assert r.in_flight == [5, 5]
    q = make_request(99, [1])
    w = r.select_worker(q, v, 0.0)
    r.on_request_complete(q, w, 1.0, 0.1, 0, 1.0)
    assert r.in_flight == [5, 5]


def test_power_of_two_tie_goes_to_first_draw_and_view_mode():
    v = make_views(4)
    r = PowerOfTwoRouter()
    r.reset(v, 7)
    rng = np.random.default_rng(7)
    first_draws = []
    for _ in range(4):
        first_draws.append(int(rng.integers(4)))
        rng.integers(3)  # the second draw
    r.in_flight = [0] * 4
    picks = []
    for i in range(4):
        picks.append(r.select_worker(make_request(i, [1]), v, 0.0))
        r.in_flight = [0] * 4  # keep every pair tied
    assert picks == first_draws
    v[0].in_flight, v[1].in_flight, v[2].in_flight, v[3].in_flight = 9, 9, 0, 9
    r = PowerOfTwoRouter(load="view")
    picks = run(r, v, 200)
    assert Counter(picks)[2] > 80  # worker 2 wins every pair it is drawn in (half of the pairs)


# ---------------------------------------------------------------------------- dynamo
def test_dynamo_logits_hand_computed():
    v = make_views(2)
    prompt = list(range(64))  # 4 blocks of 16
    v[0].cache.insert(prompt[:40])  # 2 full cached blocks
    v[0].waiting_prefill_tokens = 100
    r = DynamoRouter()
    r.reset(v, 0)
    logits, hashes = r.logits(make_request(1, prompt), v)
    # w0: (100 + 64 - 32) / 16 + (0 + 4) = 12.25; w1: 64 / 16 + (0 + 4) = 8
    assert list(logits) == [12.25, 8.0] and len(hashes) == 4
    a = make_request(1, prompt)
    assert r.select_worker(a, v, 0.0) == 1
    logits, _ = r.logits(make_request(2, prompt), v)
    assert list(logits) == [12.25, 8.0]  # w1: 4 active blocks, 0 new
    b = make_request(3, prompt[:32] + [999] * 40)  # shares 2 blocks; 4 full blocks
    assert r.select_worker(b, v, 0.0) == 1
    assert len(r.active[1]) == 6
    r.on_request_complete(a, 1, 1.0, 0.1, 0, 1.0)
    assert len(r.active[1]) == 4  # b's 4 blocks stay, a's own 2 go
    r.on_request_complete(b, 1, 1.0, 0.1, 0, 1.0)
    assert len(r.active[1]) == 0


def test_dynamo_weight_and_ties():
    v = make_views(3)
    r = DynamoRouter(overlap_score_weight=0.0)
    r.reset(v, 0)
    v[0].waiting_prefill_tokens = 10**6  # ignored with weight 0
    v[0].kv_used_tokens, v[1].kv_used_tokens, v[2].kv_used_tokens = 32, 64, 16
    assert r.select_worker(make_request(1, list(range(20))), v, 0.0) == 2  # tie -> smallest tree
    picks = set()
    for seed in range(20):
        views = make_views(3)
        picks.add(run(DynamoRouter(), views, 1, seed=seed, prompt=range(20))[0])
    assert picks == {0, 1, 2}  # equal trees: uniform draw


def test_dynamo_temperature_samples_lower_cost_more_often():
    v = make_views(2)
    v[0].waiting_prefill_tokens = 160  # 10 more prefill blocks on worker 0
    r = DynamoRouter(router_temperature=0.5)
    r.reset(v, 0)
    picks = Counter()
    for i in range(400):
        q = make_request(i, list(range(32)))
        w = r.select_worker(q, v, 0.0)
        r.on_request_complete(q, w, 0.1, 0.1, 0, 0.1)
        picks[w] += 1
    # logits [14, 4] (range 10) -> p_1 = 1 / (1 + exp(-(10 / 10) / 0.5)) ~ 0.88
    assert 0.8 < picks[1] / 400 < 0.95


def test_block_hashes_chain_the_prefix():
    a = np.arange(64, dtype=np.int32)
    b = a.copy()
    b[20] = -1  # inside block 1
    ha, hb = block_hashes(a, 16), block_hashes(b, 16)
    assert ha[0] == hb[0] and all(x != y for x, y in zip(ha[1:], hb[1:]))
    assert len(set(ha)) == 4 and block_hashes(a[:15], 16) == []
    swapped = np.concatenate([a[16:32], a[:16]])
    assert block_hashes(swapped, 16)[1] != ha[1]


# ---------------------------------------------------------------------------- llm-d
def test_llmd_scores_hand_computed():
    v = make_views(3, capacity=1000)
    prompt = list(range(64))
    v[0].cache.insert(prompt[:40])  # 2 of 4 blocks
    v[1].cache.insert(prompt)  # 4 of 4
    for view, waiting, active in zip(v, (0, 4, 2), (500, 0, 250)):
        view.waiting, view.active_kv_tokens = waiting, active
    r = LLMDRouter()
    r.reset(v, 0)
    # prefix [0.5, 1, 0], queue [1, 0, 0.5], kv [0.5, 1, 0.75]
    np.testing.assert_allclose(r.scores(make_request(1, prompt), v), [4.5, 5.0, 2.5])
    assert r.select_worker(make_request(1, prompt), v, 0.0) == 1


def test_llmd_equal_queues_and_used_mode_and_random_ties():
    v = make_views(2, capacity=100)
    v[0].kv_used_tokens, v[1].kv_used_tokens = 100, 0
    r = LLMDRouter(kv_usage="used")
    r.reset(v, 0)
    np.testing.assert_allclose(r.scores(make_request(1, [1] * 8), v), [2.0, 4.0])  # short prompt: no blocks
    picks = {run(LLMDRouter(), make_views(2), 1, seed=s)[0] for s in range(20)}
    assert picks == {0, 1}


@pytest.mark.parametrize(
    "cls, kw",
    [
        (DynamoRouter, {"block_size_tokens": 0}),
        (DynamoRouter, {"router_temperature": -1.0}),
        (LLMDRouter, {"queue_weight": -1.0}),
        (LLMDRouter, {"kv_usage": "free"}),
        (PowerOfTwoRouter, {"load": "tokens"}),
    ],
)
def test_bad_config_fails_at_construction(cls, kw):
    with pytest.raises(ValueError):
        cls(**kw)

"""Every router: same config + seed gives the same decisions, and two instances never interfere."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from repro.routing import (
    CacheAwareRouter,
    DynamoRouter,
    LBGRRouter,
    LLMDRouter,
    PowerOfTwoRouter,
    RandomRouter,
    RoundRobinRouter,
)
from tests.routing.fakes import make_request, make_views, simple_cache_factory

FACTORIES = {
    "random": RandomRouter,
    "round_robin": RoundRobinRouter,
    "cache_aware": lambda: CacheAwareRouter(balance_abs_threshold=2),
    "cache_aware_text": lambda: CacheAwareRouter(match_on="text", eviction_interval_secs=0.5, max_tree_size=40),
    "lbgr_exact": lambda: LBGRRouter(tracker="exact"),
    "lbgr_approx": lambda: LBGRRouter(tracker="approximate", cache_factory=simple_cache_factory),
    "lbgr_drain_sgd": lambda: LBGRRouter(tracker="exact", decay="drain", learner="sgd"),
    "power_of_two": PowerOfTwoRouter,
    "dynamo": DynamoRouter,
    "dynamo_temp": lambda: DynamoRouter(router_temperature=1.0),
    "llmd": LLMDRouter,
}


def stream(seed: int, n: int = 40):
    """A small GSP-like stream: 4 groups sharing 24-token system prompts, 8-token questions."""
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, 50_000, 24) for _ in range(4)]
    out = []
    for i in range(n):
        g = int(rng.integers(4))
        tokens = np.concatenate([systems[g], rng.integers(0, 50_000, 8)]).astype(np.int32)
        text = "".join(chr(97 + int(t) % 26) for t in tokens)
        out.append(make_request(i, tokens, output_len=int(rng.integers(1, 6)), text=text, group_id=g))
    return out


def static_views(seed: int):
    rng = np.random.default_rng(seed + 1000)
    views = make_views(3, capacity=400)
    for v in views:
        v.waiting = int(rng.integers(0, 4))
        v.waiting_prefill_tokens = int(rng.integers(0, 200))
        v.active_kv_tokens = int(rng.integers(0, 300))
        v.kv_used_tokens = int(rng.integers(0, 400))
        v.cache.insert(rng.integers(0, 50_000, 24).astype(np.int32))
    return views


class Player:
    """Feeds one stream to one router: arrivals every 50 ms, completions 0.3-0.36 s later."""

    def __init__(self, router, seed: int) -> None:
        self.router, self.requests, self.views = router, stream(seed), static_views(seed)
        router.reset(self.views, seed)
        self.done: list[tuple[float, int, int]] = []
        self.decisions: list[int] = []

    def step(self, i: int) -> None:
        now = 0.05 * i
        while self.done and self.done[0][0] <= now:
            t, rid, w = heapq.heappop(self.done)
            self.router.on_request_complete(self.requests[rid], w, t - 0.05 * rid, 0.1, 0, t)
        w = self.router.select_worker(self.requests[i], self.views, now)
        assert 0 <= w < len(self.views)
        self.decisions.append(w)
        heapq.heappush(self.done, (now + 0.3 + 0.01 * (i % 7), i, w))


def alone(name: str, seed: int) -> list[int]:
    p = Player(FACTORIES[name](), seed)
    for i in range(len(p.requests)):
        p.step(i)
    return p.decisions


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_same_seed_same_decisions(name):
    assert alone(name, 3) == alone(name, 3)


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_two_instances_never_interfere(name):
    a, b = Player(FACTORIES[name](), 3), Player(FACTORIES[name](), 4)
    for i in range(len(a.requests)):
        a.step(i)
        b.step(i)
    assert a.decisions == alone(name, 3)
    assert b.decisions == alone(name, 4)


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_reset_forgets_the_previous_run(name):
    router = FACTORIES[name]()
    p = Player(router, 5)
    for i in range(len(p.requests)):
        p.step(i)
    again = Player(router, 3)  # the same instance, reset for another run
    for i in range(len(again.requests)):
        again.step(i)
    assert again.decisions == alone(name, 3)


def test_routers_use_several_workers():
    # llm-d keeps no dispatch-side state: over these frozen views it rightly answers one worker.
    for name in set(FACTORIES) - {"llmd"}:
        assert len(set(alone(name, 3))) >= 2, name

"""on_request_abandoned: a request that will not complete on its worker (the live service's
retries and failures) releases everything the router holds for it and teaches it nothing."""

from __future__ import annotations

import numpy as np
import pytest

from tests.routing.test_isolation import FACTORIES, static_views, stream


def held(router) -> dict:
    """The per-request state each router keeps between dispatch and completion."""
    out = {}
    if hasattr(router, "loads"):  # cache-aware: in-flight count per worker
        out["loads"] = list(router.loads)
    if hasattr(router, "in_flight"):  # power-of-two
        out["in_flight"] = list(router.in_flight)
    if hasattr(router, "active"):  # dynamo: in-flight block users per worker
        out["active"] = [sum(c.values()) for c in router.active]
    if hasattr(router, "pending"):  # dynamo, lbgr
        out["pending"] = len(router.pending)
    if getattr(router, "index", None) is not None:  # lbgr: in-flight prompts in the shared prefix index
        out["inflight"] = (router.index.inflight_size, router.index.num_nodes())
    return out


def learned(router):
    learner = getattr(router, "learner", None)
    theta = None if learner is None else np.array(learner.theta, copy=True)
    return theta, getattr(router, "output_count", None)


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_abandoning_every_request_releases_what_dispatch_took(name):
    router = FACTORIES[name]()
    views = static_views(0)
    router.reset(views, seed=0)
    empty, before = held(router), learned(router)
    reqs = stream(0)
    chosen = [router.select_worker(q, views, 0.01 * i) for i, q in enumerate(reqs)]
    if empty:  # the router keeps per-request state: dispatch took some, so the check below can fail
        assert held(router) != empty
    for q, w in zip(reqs, chosen):
        router.on_request_abandoned(q, w, 1.0)
    assert held(router) == empty
    theta, count = learned(router)
    assert count == before[1] and (theta is None or np.array_equal(theta, before[0]))
    # unknown or repeated ids are ignored
    router.on_request_abandoned(reqs[0], chosen[0], 2.0)
    assert held(router) == empty


def test_lbgr_abandoned_prompt_no_longer_counts_as_in_flight():
    from repro.routing import LBGRRouter
    from tests.routing.fakes import simple_cache_factory

    router = LBGRRouter(tracker="approximate", cache_factory=simple_cache_factory)
    views = static_views(1)
    router.reset(views, seed=0)
    q = stream(1, n=1)[0]
    w = router.select_worker(q, views, 0.0)
    key = np.asarray(q.prompt_tokens).astype("<i4").tobytes()
    assert router.tracked_hits(key, views)[w] == len(q.prompt_tokens)
    router.on_request_abandoned(q, w, 0.5)
    assert router.tracked_hits(key, views)[w] < len(q.prompt_tokens)

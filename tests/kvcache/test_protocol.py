"""The KVCache protocol is the contract the simulator's caches meet (repro/kvcache/protocol.py)."""

from __future__ import annotations

import pytest

from repro.kvcache import KVCache, eviction_policies, make_cache
from repro.sim.worker import RequestTable, SchedulerConfig, SimWorker
from tests.sim.sim_fakes import FixedCostModel, TrieCache


@pytest.mark.parametrize("policy", sorted(n for n in eviction_policies() if n != "opt"))
@pytest.mark.parametrize("granularity", ["token", "node"])
def test_every_cache_meets_the_protocol(policy, granularity):
    assert isinstance(make_cache(100, {"name": policy, "granularity": granularity}, 0), KVCache)


def test_the_tests_reference_cache_meets_it_and_a_partial_one_does_not():
    assert isinstance(TrieCache(10), KVCache)

    class NoEvict:
        capacity_tokens = 10

        def match_prefix(self, tokens): ...

    assert not isinstance(NoEvict(), KVCache)


def test_the_worker_calls_only_the_protocol_and_its_optional_walk_free_verbs():
    called = set()

    class Recording:
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            called.add(name)
            return getattr(self._inner, name)

    from tests.sim.sim_fakes import gsp_requests

    reqs = gsp_requests(0, num_groups=2, per_group=3, rate=1000.0)
    table = RequestTable(reqs)
    cache = Recording(make_cache(400, {"name": "lru", "granularity": "node"}, 0))
    w = SimWorker(0, cache, FixedCostModel(), SchedulerConfig(chunked_prefill_size=8), table, "lru")
    for i in range(len(reqs)):
        table.key(i)
        w.enqueue(i)
    while w.start_step(0.0) >= 0:
        w.end_step(0.0)
    protocol = {n for n in dir(KVCache) if not n.startswith("_")}
    assert called - protocol <= {"insert_after", "access_path"}, called - protocol

"""The simulator on the real repro.kvcache RadixCache.

- Token granularity + LRU evicts exactly like the test trie (ALGORITHMS.md §2: stamping a
  path with one time gives the same leaf order), so the records must be identical.
- Node granularity (SGLang's, the simulator's default) with LRU and RLT: every invariant the
  auditor checks holds at every step.
"""

from __future__ import annotations

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from repro.kvcache import make_cache
from repro.sim.cluster import SimCluster
from tests.sim.sim_fakes import TrieCache
from tests.sim.test_sim_invariants import Auditor, cells


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cells())
def test_token_lru_radix_cache_gives_the_trie_records(cell):
    reqs, caps, sched, cost, router_cls, seed = cell
    trie = SimCluster(reqs, [TrieCache(c) for c in caps], cost, router_cls(), sched, "lru", seed).run()
    real_caches = [make_cache(c, {"name": "lru", "granularity": "token"}, 0) for c in caps]
    real = SimCluster(reqs, real_caches, cost, router_cls(), sched, "lru", seed).run()
    pd.testing.assert_frame_equal(trie.records, real.records, check_exact=True)
    assert trie.timings["eviction"]["evicted_tokens"] == real.timings["eviction"]["evicted_tokens"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cells(), st.sampled_from(["lru", "rlt"]))
def test_invariants_with_node_granularity_caches(cell, policy):
    reqs, caps, sched, cost, router_cls, seed = cell
    caches = [make_cache(c, {"name": policy, "granularity": "node"}, seed + k) for k, c in enumerate(caps)]
    auditor = Auditor(sched)
    rec = SimCluster(reqs, caches, cost, router_cls(), sched, policy, seed, auditor).run().records
    assert sorted(auditor.finished) == list(range(len(reqs)))
    assert (rec["first_token_s"] <= rec["finish_s"]).all()
    assert (rec["cached_tokens"] <= rec["prompt_tokens"]).all()
    assert all(c.protected_size() == 0 for c in caches)

"""RLT's fallback queue (`dirty`) stays bounded and pruning it changes no decision.

The queue is flushed only by a fallback, which may never come; before it was pruned it held
every node ever queued, evicted ones included (three per request in an LBGR+RLT cell: most of
the 4.98 -> 2.24 KB per request that bench_scaling's 1M cell lost when it was pruned)."""

from __future__ import annotations

import numpy as np
import pytest

from repro.kvcache import make_cache
from repro.kvcache.eviction import RLTEviction
from repro.kvcache.replay import replay


def test_the_queue_stays_bounded_without_fallbacks():
    c = make_cache(4000, {"name": "rlt", "granularity": "node"}, 0)
    pol = c.policy
    rng = np.random.default_rng(0)
    most = 0
    for j in range(20_000):  # distinct 40-token paths under 8 shared 8-token heads
        path = np.concatenate([np.full(8, j % 8), rng.integers(10, 10**6, size=32)])
        c.insert(path)
        if c.total_size() > 3000:
            c.evict(c.total_size() - 3000)
        most = max(most, len(pol.dirty))
        assert len(pol.dirty) <= 2 * c.num_nodes() + RLTEviction.DIRTY_SLACK + 64
    assert pol.fallback_evictions == 0 and pol.random_evictions > 15_000
    assert most < 3_000  # ~20k nodes were created: the queue did not keep them
    c.check_invariants()


def _paths(seed: int, n: int) -> list[np.ndarray]:
    """Paths of a ternary tree's tokens: shared prefixes, interior nodes, repeats."""
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 4, size=int(rng.integers(1, 12))) for _ in range(n)]


@pytest.mark.parametrize("granularity", ["node", "token"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pruning_the_queue_changes_no_victim(monkeypatch, granularity, seed):
    paths = _paths(seed, 3000)
    runs = []
    for slack in (0, 10**9):  # prune at every chance / never
        monkeypatch.setattr(RLTEviction, "DIRTY_SLACK", slack)
        res = replay(paths, 40, "rlt", granularity, batch=3, seed=seed, record_evictions=True)
        runs.append((res.misses_per_path.tolist(), res.cache.eviction_log, res.stats))
    pruned, kept = runs
    assert pruned == kept
    assert kept[2]["rlt_fallback_evictions"] > 0  # the fallback (the queue's reader) ran

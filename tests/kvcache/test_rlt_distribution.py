"""RLT: the fast tree and the reference draw victims from the same distribution.

Fixed traces and fixed seeds (no hypothesis), so the test is deterministic and cannot flake.
For each trace, N seeds run the fast tree (its own buffered-uniform draws, the inline
token-granularity path) and N other seeds run the reference (sorted candidates,
`Generator.integers`). Tolerance: |mean_fast - mean_ref| <= 4 standard errors of the
difference, SE = sqrt(var_fast / N + var_ref / N) from the observed sample variances; the
test also requires 4 SE < 10 % of the mean, so the check has teeth.
"""

import numpy as np
import pytest

from repro.kvcache import TraceIndex
from repro.kvcache.replay import replay
from repro.theory import random_prefix_tree_trace, theorem4_trace
from tests.kvcache.reference import ReferenceReplayer

N = 150  # seeds per side


def _cases():
    rand = random_prefix_tree_trace(11, num_requests=40, num_distinct=10, min_len=1, max_len=6, vocab=3)
    thm4 = theorem4_trace(6, 3, 30)  # B=6, L=3: 5 paths cycled through room for 4 leaves
    deep = random_prefix_tree_trace(5, num_requests=30, num_distinct=8, min_len=2, max_len=8, vocab=2)
    return {
        "random-single": (rand, max(len(p) for p in rand) + 4, 1),
        "thm4": (thm4, 6, 1),
        "deep-batched": (deep, None, 2),
    }


CASES = _cases()


def _capacity(paths, cap, batch):
    if cap is not None:
        return cap
    idx = TraceIndex(paths)
    return max(idx.distinct_tokens(range(g, min(len(paths), g + batch))) for g in range(0, len(paths), batch)) + 3


@pytest.mark.parametrize("gran", ["token", "node"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_rlt_mean_misses_fast_vs_reference(name, gran):
    check_mean_misses_vs_reference(name, gran)


def check_mean_misses_vs_reference(name: str, gran: str) -> None:
    """Mean RLT misses of the fast replayer over N seeds == the reference's, within 4 standard errors."""
    paths, cap, batch = CASES[name]
    cap = _capacity(paths, cap, batch)
    index = TraceIndex(paths)
    fast = np.array([replay(paths, cap, "rlt", gran, batch, seed=s, index=index).misses for s in range(N)])
    ref = []
    for s in range(N):
        r = ReferenceReplayer(cap, "rlt", gran, seed=10_000 + s, trace=paths)
        _, per_path = r.run(paths, batch)
        ref.append(sum(per_path))
    ref = np.array(ref)
    se = np.sqrt(fast.var(ddof=1) / N + ref.var(ddof=1) / N)
    assert se > 0 and len(set(fast.tolist())) > 1, "the trace must exercise random choices"
    assert 4 * se < 0.10 * ref.mean(), "tolerance too loose to mean anything: use more seeds"
    assert abs(fast.mean() - ref.mean()) <= 4 * se, (name, gran, fast.mean(), ref.mean(), se)

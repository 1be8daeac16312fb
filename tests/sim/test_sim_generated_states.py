"""Every scheduler mode decides on generated worker states without breaking the cache contract.

The states are those of the SGLang parity test (tests/sglang/sched_driver.py: running, chunked and
waiting requests over a shared tree); only our side runs here, so the default suite (no SGLang)
catches a fast path that reuses stale tree state: e.g. a ranking's prefix match reused after an
earlier admission of the same pass evicted part of it (insert then exceeds the free tokens).
"""

from __future__ import annotations

import numpy as np

from tests.sglang import sched_driver as D


# the parity test's first 3000 states; 1107 and 1246 broke the rank-match reuse of issue 20's first
# version (lpm_rank_access=match without exact budgets: _admit evicts between two admissions)
def test_every_mode_decides_on_generated_states():
    for k in range(3000):
        st = D.random_state(np.random.default_rng(k), big_queue=(k % 20 == 0))
        for mode, modes in D.MODES.items():
            d = D.ours_decide(st, **modes)
            assert set(d.kinds()) == set(D.KINDS), (k, mode)

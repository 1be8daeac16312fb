"""Theorems 4/5 numerically: L-LRU exactly B-L+1 (B-L-beta+2 batched), OPT 1, RLT ~ H per phase.

Why H_{B-L+1}: a phase of the Theorem 4 trace holds the L-1 shared tokens and K = B-L+1
leaves; the cache has K leaf slots for K+1 cycled leaves. Each phase starts with one clean
miss, which evicts a uniform one of the K stale leaves; the remaining K-1 requests hit the
stale leaves in a fixed order and the evicted one ("hole") stays uniform among the s not yet
requested, so request j misses with probability 1/s, s = K..2. Expected misses per phase:
1 + sum_{s=2..K} 1/s = H_K = H_{B-L+1} (batched: K' = B-L-beta+2 leaf slots, H_{K'}).
"""

import json

import pytest

from repro.kvcache.replay import replay
from repro.theory import (
    harmonic,
    lower_bound_paths,
    random_prefix_tree_trace,
    run_theory_cell,
    theorem4_trace,
    theorem5_trace,
)


def cell(construction, policy, x, **kw):
    p = {"construction": construction, "policy": policy, "granularity": "token", "num_phases": 10,
         "num_seeds": 1, "seed": 0}
    if construction == "thm4":
        p.update(b_minus_l_plus_1=x, min_path_len=kw.pop("L", 8), beta=1)
    else:
        p.update(b_minus_l_minus_beta_plus_2=x, min_path_len=kw.pop("L", 2), beta=kw.pop("beta", 4))
    p.update(kw)
    return p


@pytest.mark.parametrize("x, L", [(4, 8), (17, 3), (64, 1), (128, 8)])
def test_thm4_lru_exactly_b_minus_l_plus_1_and_opt_1(x, L):
    B = x + L - 1
    res = replay(theorem4_trace(B, L, 12 * x), B, "lru")
    per = res.misses_by_phase()
    assert len(per) == 12 and (per[1:] == x).all()  # every phase after the first, exactly
    res = replay(theorem4_trace(B, L, 12 * x), B, "opt")
    assert (res.misses_by_phase()[1:] == 1).all()


@pytest.mark.parametrize("x, L, beta", [(4, 2, 4), (10, 3, 2), (50, 2, 6)])
def test_thm5_batched_lru_exactly_b_minus_l_minus_beta_plus_2(x, L, beta):
    r = run_theory_cell(cell("thm5", "lru", x, L=L, beta=beta))
    assert r["misses_per_phase"] == x == r["capacity_tokens"] - L - beta + 2
    r = run_theory_cell(cell("thm5", "opt", x, L=L, beta=beta))
    assert r["misses_per_phase"] == 1


@pytest.mark.parametrize("construction, x", [("thm4", 32), ("thm4", 128), ("thm5", 32)])
def test_rlt_mean_within_10_percent_of_harmonic(construction, x):
    # steady state (phases 2..), fixed seeds; SE at these sizes is ~2 % of H
    r = run_theory_cell(cell(construction, "rlt", x, num_phases=30, num_seeds=16, seed=4))
    h = harmonic(x)
    assert r["harmonic"] == pytest.approx(h)
    assert abs(r["misses_per_phase"] - h) <= 0.10 * h, r
    assert r["ci95_low"] < r["misses_per_phase"] < r["ci95_high"]
    assert r["num_runs"] == 16 and r["phases_measured"] == 30


def test_rlt_no_fallback_on_the_construction():
    B, L = 20, 4
    res = replay(theorem4_trace(B, L, 200), B, "rlt", seed=1)
    assert res.stats["rlt_fallback_evicted_tokens"] == 0
    assert res.stats["rlt_phases"] == res.phases  # marking phases coincide with Fiat phases here


def test_constructions_shapes_and_errors():
    paths = lower_bound_paths(10, 4)
    assert len(paths) == 8 and all(len(p) == 4 for p in paths)
    assert all((p[:3] == paths[0][:3]).all() for p in paths) and len({int(p[-1]) for p in paths}) == 8
    t5 = theorem5_trace(10, 2, 3, 4)
    assert len(t5) == 12
    with pytest.raises(ValueError, match="beta \\* L <= B"):
        theorem5_trace(10, 4, 3, 4)
    with pytest.raises(ValueError, match="B >= L"):
        lower_bound_paths(3, 4)
    r = random_prefix_tree_trace(3, 50, num_distinct=6, min_len=2, max_len=5)
    assert len(r) == 50 and all(2 <= len(p) <= 5 for p in r)
    assert [p.tolist() for p in r] == [p.tolist() for p in random_prefix_tree_trace(3, 50, 6, 2, 5)]


def test_cell_params_validated():
    with pytest.raises(ValueError, match="construction"):
        run_theory_cell({"construction": "thm9", "policy": "lru"})
    with pytest.raises(ValueError, match="unknown theory cell params"):
        run_theory_cell({**cell("thm4", "lru", 4), "typo": 1})
    with pytest.raises(ValueError, match="beta must be 1"):
        run_theory_cell({**cell("thm4", "lru", 4), "beta": 2})
    with pytest.raises(ValueError, match="policy"):
        run_theory_cell(cell("thm4", "fifo", 4))


def test_random_cell_runs_and_is_deterministic():
    p = {"construction": "random", "policy": "rlt", "granularity": "token", "capacity_tokens": 12,
         "min_path_len": 2, "beta": 1, "num_phases": 3, "num_seeds": 3, "seed": 5, "num_distinct": 8,
         "max_len": 6, "vocab": 3, "num_requests": 60}
    a, b = run_theory_cell(p), run_theory_cell(p)
    a.pop("timings"), b.pop("timings")
    assert a == b and json.dumps(a)

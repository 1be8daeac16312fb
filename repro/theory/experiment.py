"""One cell of the competitive-ratio experiment: misses per phase of one policy on one trace.

`run_theory_cell(params)` is what the harness (and `python -m repro.theory.competitive_ratio`)
calls per cell. `params` fully define the cell:

    construction      "thm4" | "thm5" | "random"
    policy            a registered eviction policy that runs on the theory backend: "lru" | "rlt" | "opt"
    granularity       "token" (the paper's model) | "node"
    b_minus_l_plus_1  thm4: x = B - L + 1 (so B = x + L - 1)
    b_minus_l_minus_beta_plus_2   thm5: x = B - L - beta + 2 (so B = x + L + beta - 2)
    capacity_tokens   random: B
    min_path_len      L (thm4/thm5; random: the shortest path length)
    beta              batch size (thm5; 1 otherwise)
    num_phases        complete steady-state phases measured (phases 2 .. num_phases + 1)
    num_seeds         randomized policies (RLT): independent runs (LRU and OPT are deterministic: one run)
    seed              base seed; run i uses SeedSequence(seed).generate_state(num_seeds)[i]
    (random only: num_distinct, max_len, vocab, num_requests)

Misses per phase = misses inside Fiat phases 2 .. P-1 (complete phases after the cold first
one) divided by their number; the constructions are sized so that exactly `num_phases`
such phases exist. RLT: mean over seeds with a 95 % Student-t interval.
"""

from __future__ import annotations

import math
import time
from typing import Mapping

import numpy as np

from repro.kvcache import eviction_policies
from repro.kvcache.replay import replay, replay_policy_names
from repro.kvcache.trace_index import TraceIndex
from repro.theory.constructions import random_prefix_tree_trace, theorem4_trace, theorem5_trace

CONSTRUCTIONS = ("thm4", "thm5", "random")
_KEYS = {
    "thm4": {
        "construction",
        "policy",
        "granularity",
        "b_minus_l_plus_1",
        "min_path_len",
        "beta",
        "num_phases",
        "num_seeds",
        "seed",
    },
    "thm5": {
        "construction",
        "policy",
        "granularity",
        "b_minus_l_minus_beta_plus_2",
        "min_path_len",
        "beta",
        "num_phases",
        "num_seeds",
        "seed",
    },
    "random": {
        "construction",
        "policy",
        "granularity",
        "capacity_tokens",
        "min_path_len",
        "beta",
        "num_phases",
        "num_seeds",
        "seed",
        "num_distinct",
        "max_len",
        "vocab",
        "num_requests",
    },
}


def harmonic(n: int) -> float:
    return float(sum(1.0 / i for i in range(1, n + 1)))


def _int(params: Mapping, key: str, minimum: int) -> int:
    if key not in params:
        raise ValueError(f"theory cell params need {key!r}")
    v = params[key]
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
        raise ValueError(f"theory cell param {key} must be an int >= {minimum}, got {v!r}")
    return int(v)


def build_cell_trace(params: Mapping) -> tuple[list[np.ndarray], int, int, dict]:
    """(paths, capacity B, batch, reference values) for a cell; validates params first."""
    construction = params.get("construction")
    if construction not in CONSTRUCTIONS:
        raise ValueError(f"construction must be one of {CONSTRUCTIONS}, got {construction!r}")
    unknown = set(params) - _KEYS[construction]
    if unknown:
        raise ValueError(f"unknown theory cell params for {construction}: {sorted(unknown)}")
    L = _int(params, "min_path_len", 1)
    beta = _int(params, "beta", 1)
    phases = _int(params, "num_phases", 1)
    if construction == "thm4":
        if beta != 1:
            raise ValueError("thm4 is the single-query construction: beta must be 1")
        x = _int(params, "b_minus_l_plus_1", 1)
        B = x + L - 1
        # phase = x leaf requests; P = num_phases + 2 phases, measured: 2 .. P-1
        paths = theorem4_trace(B, L, (phases + 2) * x)
        ref = {"x": x, "lru_bound": x, "harmonic": harmonic(x), "opt_bound": 1}
    elif construction == "thm5":
        x = _int(params, "b_minus_l_minus_beta_plus_2", 1)
        B = x + L + beta - 2
        paths = theorem5_trace(B, L, beta, (phases + 2) * x)
        ref = {"x": x, "lru_bound": x, "harmonic": harmonic(x), "opt_bound": 1}
    else:
        B = _int(params, "capacity_tokens", 1)
        n = _int(params, "num_requests", 1)
        paths = random_prefix_tree_trace(
            np.random.default_rng(_int(params, "seed", 0) + 7919),  # the trace's own stream
            n,
            num_distinct=_int(params, "num_distinct", 1),
            min_len=L,
            max_len=_int(params, "max_len", L),
            vocab=_int(params, "vocab", 1),
        )
        ref = {"x": B - L + 1, "lru_bound": B - L + 1, "harmonic": harmonic(max(1, B - L + 1)), "opt_bound": None}
    return paths, B, beta, ref


def run_theory_cell(params: Mapping) -> dict:
    """Run one cell; returns JSON-able metrics (`timings` holds wall-clock seconds, kept apart)."""
    params = dict(params)
    paths, B, beta, ref = build_cell_trace(params)  # validates construction and sizes first
    policy = params.get("policy")
    names = replay_policy_names()
    if policy not in names:
        raise ValueError(f"policy must be one of {', '.join(repr(n) for n in names)}, got {policy!r}")
    randomized = eviction_policies()[policy].randomized
    granularity = params.get("granularity", "token")
    num_seeds = _int(params, "num_seeds", 1)
    seed = _int(params, "seed", 0)
    t0, c0 = time.perf_counter(), time.process_time()
    index = TraceIndex(paths)
    runs = num_seeds if randomized else 1  # LRU and OPT are deterministic
    seeds = [int(s) for s in np.random.SeedSequence(seed).generate_state(runs)] if randomized else [seed]
    per_seed, misses, phases = [], [], None
    for s in seeds:
        res = replay(paths, B, policy, granularity, beta, s, index=index)
        mpp = res.steady_misses_per_phase()
        if mpp is None:
            raise ValueError("fewer than 3 phases: raise num_phases")
        per_seed.append(mpp)
        misses.append(res.misses)
        phases = res.phases
    vals = np.asarray(per_seed)
    mean = float(vals.mean())
    if len(vals) > 1:
        from scipy import stats

        half = float(stats.t.ppf(0.975, len(vals) - 1) * vals.std(ddof=1) / math.sqrt(len(vals)))
        sd = float(vals.std(ddof=1))
    else:
        half, sd = 0.0, 0.0
    return {
        "construction": params["construction"],
        "policy": policy,
        "granularity": granularity,
        "capacity_tokens": B,
        "min_path_len": params["min_path_len"],
        "beta": beta,
        **ref,
        "misses_per_phase": mean,
        "ci95_low": mean - half,
        "ci95_high": mean + half,
        "std_over_seeds": sd,
        "per_seed": [float(v) for v in vals],
        "num_runs": len(vals),
        "phases_total": phases,
        "phases_measured": phases - 2,
        "total_misses_mean": float(np.mean(misses)),
        "num_paths": len(paths),
        "timings": {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0},
    }

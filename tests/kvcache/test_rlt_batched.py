"""RLT at token granularity: the batched sampler (multinomial windows) is the one-by-one process.

`RLTEviction._evict_random_tokens` draws a whole window of draws at once and resolves node
deaths (with sibling order by Beta death times) instead of one draw per token. These tests
check it against an independent, obviously right reference: the literal process on a set
of tokens (each step: sorted unmarked unlocked leaf tokens, one uniform draw, remove it).

* Distribution: on hand-built trees where windows see several deaths, parents joining,
  chains up to a grandparent, a marked parent and a locked parent, the histogram of whole
  final cache states (which tokens are left) of the fast tree and of the reference must be
  homogeneous: chi-square test on a 2 x K table (states with expected count < 5 pooled),
  fixed seeds (deterministic, cannot flake), reject at p < 1e-3. A negative control shows
  the test has teeth: the same test rejects a sampler whose deaths are applied in a fixed
  (wrong) order.
* The replayer distribution test (`test_rlt_distribution.py`) again with every budget drawn
  in windows (its traces are small enough that the default draws them one by one).
* Legality, invariants and hooks with windows forced: every run is a legal run of the
  reference semantics (forced victims), and recording evictions changes no outcome.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from unittest import mock

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import chi2_contingency

from repro.kvcache import make_cache
from repro.kvcache.eviction import RLTEviction
from repro.kvcache.replay import replay
from tests.kvcache.test_properties import FAST, check_rlt_valid, traces
from tests.kvcache.test_rlt_distribution import CASES, check_mean_misses_vs_reference

P_REJECT = 1e-3
SAMPLES = 3000  # per side


def _never(budget, candidates):
    return False


def _up_to_3(budget, candidates):
    return budget <= 3


ONE_BY_ONE = {"never": _never, "up to 3": _up_to_3, "default": RLTEviction._one_by_one_is_cheaper}


@contextmanager
def windows_always():
    """Every token-granularity budget is drawn in multinomial windows (none one by one)."""
    with mock.patch.object(RLTEviction, "_one_by_one_is_cheaper", staticmethod(_never)):
        yield


# ---------------------------------------------------------------- hand-built trees
def _tokens(cache, node) -> list[tuple]:
    full = tuple(np.frombuffer(cache.path_key(node), dtype=np.int32).tolist())
    return [full[:k] for k in range(len(full) - node.n + 1, len(full) + 1)]


def _siblings_chain_marked(cache):
    # P(3) -> {A(2), B(3)}; Q(2, marked) -> C(1); D(6); E(2) locked
    for path in ([1, 2, 3], [1, 2, 3, 4, 5], [1, 2, 3, 6, 7, 8], [9, 10], [9, 10, 11], [13, 14, 15, 16, 17, 18]):
        cache.insert(path)
    cache.inc_lock_ref(cache.insert([20, 21]).last_node)
    cache.policy.reset_phase()
    cache.match_prefix([9, 10])  # marks Q only: when C empties, Q joins the MARKED leaves
    return 10


def _deep_chain(cache):
    # G(2) -> P(2) -> {A(1), B(1), C(2)}; D(4); F(4): windows where a grandparent joins
    for path in ([1, 2], [1, 2, 3, 4], [1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 4, 7, 8], [9, 10, 11, 12],
                 [13, 14, 15, 16]):
        cache.insert(path)
    cache.policy.reset_phase()
    return 10


def _locked_parent(cache):
    # P(2, locked) -> {A(2), B(3)}; R(1) -> {S(2), T(1)}; D(5)
    for path in ([1, 2], [1, 2, 3, 4], [1, 2, 5, 6, 7], [8], [8, 9, 10], [8, 11], [12, 13, 14, 15, 16]):
        cache.insert(path)
    cache.inc_lock_ref(cache.match_prefix([1, 2]).last_node)
    cache.policy.reset_phase()
    return 10


def _uneven_siblings(cache):
    # P(4) -> {B(3), A(1)} (B created first); D(6): whether B or A dies last decides how many
    # of the window's draws pass to P
    for path in ([1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 8], [9, 10, 11, 12, 13, 14]):
        cache.insert(path)
    cache.policy.reset_phase()
    return 8


SCENARIOS = {
    "siblings-chain-marked": _siblings_chain_marked,
    "deep-chain": _deep_chain,
    "locked-parent": _locked_parent,
    "uneven-siblings": _uneven_siblings,
}


def build(name, seed, one_by_one="never"):
    cache = make_cache(64, {"name": "rlt", "granularity": "token"}, seed)
    cache.policy._one_by_one_is_cheaper = ONE_BY_ONE[one_by_one]
    r = SCENARIOS[name](cache)
    cache.check_invariants()
    return cache, r


def state_of(cache) -> frozenset:
    return frozenset(tuple(np.frombuffer(k, dtype=np.int32).tolist()) for k in cache.cached_keys())


def reference_start(cache):
    """(cached, marked, locked) token sets of a fast tree (all as path-prefix tuples)."""
    cached, marked, locked = set(), set(), set()
    for node in cache.iter_nodes():
        toks = _tokens(cache, node)
        cached.update(toks)
        if node.mark == cache.policy.phase:
            marked.update(toks)
        if node.lock_ref:
            locked.update(toks)
    return cached, marked, locked


def reference_evict(cached, marked, locked, r, rng) -> frozenset:
    """The literal process: r times, one uniform draw over the unmarked unlocked leaf tokens."""
    cached = set(cached)
    for _ in range(r):
        parents = {t[:-1] for t in cached}
        leaves = sorted(t for t in cached if t not in parents and t not in locked and t not in marked)
        assert leaves, "scenario must not need the LRU fallback"
        cached.remove(leaves[int(rng.integers(len(leaves)))])
    return frozenset(cached)


def fast_histogram(name, seeds, one_by_one="never") -> Counter:
    hist = Counter()
    for s in seeds:
        cache, r = build(name, s, one_by_one)
        assert cache.evict(r) == r
        cache.check_invariants()
        hist[state_of(cache)] += 1
    return hist


_REF: dict = {}


def reference_histogram(name) -> Counter:
    if name not in _REF:
        cache, r = build(name, 0)
        start = reference_start(cache)
        rng = np.random.default_rng(123_456)
        _REF[name] = Counter(reference_evict(*start, r, rng) for _ in range(SAMPLES))
    return _REF[name]


def homogeneity_p(h1: Counter, h2: Counter) -> float:
    """Chi-square p-value of 'same distribution' for two histograms (rare states pooled)."""
    n1, n2 = sum(h1.values()), sum(h2.values())
    keys = sorted(set(h1) | set(h2), key=lambda k: -(h1[k] + h2[k]))
    rows, pool = [], [0, 0]
    for k in keys:
        if (h1[k] + h2[k]) * min(n1, n2) / (n1 + n2) >= 5:
            rows.append([h1[k], h2[k]])
        else:
            pool[0] += h1[k]
            pool[1] += h2[k]
    if sum(pool):
        rows.append(pool)
    assert len(rows) >= 5, "too few states to say anything"
    return chi2_contingency(np.array(rows).T)[1]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_final_state_distribution_matches_the_literal_process(name):
    fast = fast_histogram(name, range(SAMPLES))
    p = homogeneity_p(fast, reference_histogram(name))
    assert p > P_REJECT, (name, p)


def test_windows_mixed_with_one_by_one_draws_match_too():
    # small extension budgets drawn one by one, larger ones in windows
    fast = fast_histogram("deep-chain", range(SAMPLES, 2 * SAMPLES), one_by_one="up to 3")
    assert homogeneity_p(fast, reference_histogram("deep-chain")) > P_REJECT


def test_the_distribution_test_has_teeth():
    """Deaths applied in a fixed order (every Beta death time 0.5: ties by node creation)
    instead of their random order: B always dies first and A, which usually empties early,
    always hands its many later draws to P; the test must reject it."""

    class FixedTimes(np.random.Generator):
        def beta(self, a, b):
            return 0.5

    fast = Counter()
    for s in range(SAMPLES):
        cache, r = build("uneven-siblings", s)
        pol = cache.policy
        pol.rng = FixedTimes(np.random.PCG64(s))
        cache.evict(r)
        fast[state_of(cache)] += 1
    assert homogeneity_p(fast, reference_histogram("uneven-siblings")) < P_REJECT


def test_windows_see_the_events_the_scenarios_are_built_for():
    """The scenarios do exercise several deaths per window, parents joining and chains."""
    seen = Counter()
    orig = RLTEviction._apply_deaths

    def spy(self, deaths):
        seen["windows with deaths"] += 1
        seen["multi-death windows"] += len(deaths) > 1
        before = {id(n) for n in self.unmarked}
        skipped = orig(self, deaths)
        seen["parents joined"] += sum(id(n) not in before for n in self.unmarked)
        seen["skipped draws"] += skipped
        return skipped

    with mock.patch.object(RLTEviction, "_apply_deaths", spy):
        for name in SCENARIOS:
            fast_histogram(name, range(200))
    assert seen["multi-death windows"] > 50 and seen["parents joined"] > 50 and seen["skipped draws"] > 50, seen


# ---------------------------------------------------------------- the replayer, windows forced
@pytest.mark.parametrize("gran", ["token"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_rlt_mean_misses_windows_vs_reference(name, gran):
    """Same cases, seeds and tolerance as test_rlt_distribution.py, every budget in windows."""
    with windows_always():
        check_mean_misses_vs_reference(name, gran)


# ---------------------------------------------------------------- legality, invariants, hooks
@FAST
@given(case=traces(), seed=st.integers(0, 2**16))
def test_rlt_windows_run_is_a_legal_reference_run(case, seed):
    with windows_always():
        check_rlt_valid(case, "token", seed)


@FAST
@given(case=traces(max_len=12), seed=st.integers(0, 1000))
def test_recording_evictions_changes_no_outcome(case, seed):
    """With the cache's debug hook / eviction log on and off, the draws are alike."""
    paths, cap, batch = case
    with windows_always():
        plain = replay(paths, cap, "rlt", "token", batch, seed=seed)
        logged = replay(paths, cap, "rlt", "token", batch, seed=seed, record_evictions=True)
    assert plain.misses_per_path.tolist() == logged.misses_per_path.tolist()
    assert plain.cache.cached_keys() == logged.cache.cached_keys()
    assert plain.stats == logged.stats
    assert len(logged.cache.eviction_log) == logged.evicted_tokens


@pytest.mark.parametrize("one_by_one", ["never", "default"])
def test_bulk_evict_exact_count_invariants_and_determinism(one_by_one):
    """Simulator-style bulk evictions (large budgets): exact counts, invariants, same seed -> same state."""
    rng = np.random.default_rng(7)
    prefixes = [rng.integers(0, 1000, 40).tolist() for _ in range(6)]
    prompts = [prefixes[int(rng.integers(6))] + rng.integers(0, 1000, int(rng.integers(1, 30))).tolist() for _ in range(200)]

    def run(seed):
        cache = make_cache(300, {"name": "rlt", "granularity": "token"}, seed)
        cache.policy._one_by_one_is_cheaper = ONE_BY_ONE[one_by_one]
        for p in prompts:
            m = cache.match_prefix(p)
            cache.inc_lock_ref(m.last_node)
            need = len(p) - m.length - cache.free_tokens()
            if need > 0:
                assert cache.evict(need) == need
            r = cache.insert(p)
            cache.dec_lock_ref(m.last_node)
            assert cache.peek_prefix(p) == len(p)
            cache.check_invariants()
        return state_of(cache), cache.stats()

    a, b, c = run(1), run(1), run(2)
    assert a == b and a != c
    assert a[1]["rlt_random_evicted_tokens"] + a[1]["rlt_fallback_evicted_tokens"] == a[1]["evicted_tokens"] > 1000

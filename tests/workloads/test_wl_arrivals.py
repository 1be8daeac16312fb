"""Poisson arrivals and the random / round-robin orders, against simple references."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.workloads.arrivals import component_rng, order_random, order_round_robin, poisson_arrivals


def test_poisson_mean_gap_within_tolerance_over_many_draws():
    rate = 12.0
    means = []
    for seed in range(200):
        t = poisson_arrivals(1024, rate, component_rng(seed, "arrivals"))
        assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
        means.append(np.diff(t).mean())
    means = np.array(means)
    # the spread of the per-draw means estimates the standard error of their average
    se = means.std(ddof=1) / math.sqrt(len(means))
    assert abs(means.mean() - 1 / rate) < 4 * se
    # and that spread is what an exponential gap predicts: (1/rate) / sqrt(n)
    assert 0.8 < means.std(ddof=1) / ((1 / rate) / math.sqrt(1023)) < 1.2


def test_poisson_gaps_are_exponential():
    gaps = np.sort(np.diff(poisson_arrivals(20000, 8.0, component_rng(3, "arrivals"))))
    n = len(gaps)
    cdf = 1.0 - np.exp(-8.0 * gaps)
    ks = max(np.max(np.arange(1, n + 1) / n - cdf), np.max(cdf - np.arange(n) / n))
    assert ks < 1.95 / math.sqrt(n)  # Kolmogorov-Smirnov critical value at alpha = 0.001


def test_infinite_rate_and_empty():
    assert np.array_equal(poisson_arrivals(5, math.inf, component_rng(0, "a")), np.zeros(5))
    assert len(poisson_arrivals(0, 1.0, component_rng(0, "a"))) == 0


def test_component_rngs_are_independent_and_reproducible():
    a = component_rng(0, "order").random(4)
    assert np.array_equal(a, component_rng(0, "order").random(4))
    assert not np.array_equal(a, component_rng(0, "arrivals").random(4))
    assert not np.array_equal(a, component_rng(1, "order").random(4))


def ref_round_robin(groups):
    queues = {g: [i for i, x in enumerate(groups) if x == g] for g in sorted(set(groups))}
    out = []
    while any(queues.values()):
        for g in sorted(queues):
            if queues[g]:
                out.append(queues[g].pop(0))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 6), max_size=40))
def test_round_robin_matches_reference(groups):
    assert order_round_robin(groups).tolist() == ref_round_robin(groups)


def test_round_robin_is_the_worst_case_cycle():
    groups = [0] * 3 + [1] * 3 + [2] * 3  # natural order: group by group
    got = [groups[i] for i in order_round_robin(groups)]
    assert got == [0, 1, 2, 0, 1, 2, 0, 1, 2]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5), max_size=40), st.integers(0, 2**31))
def test_random_order_is_a_permutation_keeping_turn_order(convs, seed):
    order = order_random(convs, np.random.default_rng(seed))
    assert sorted(order.tolist()) == list(range(len(convs)))
    pos = {q: k for k, q in enumerate(order.tolist())}
    for c in set(convs):
        queries = [i for i, x in enumerate(convs) if x == c]  # turn order = index order
        assert [pos[q] for q in queries] == sorted(pos[q] for q in queries)


def test_random_order_is_uniform_over_interleavings():
    convs = [0, 0, 1, 1]  # 4!/(2!2!) = 6 order-preserving interleavings
    rng = np.random.default_rng(0)
    counts = Counter(tuple(convs[i] for i in order_random(convs, rng)) for _ in range(6000))
    assert len(counts) == 6
    observed = np.array(list(counts.values()), dtype=float)
    chi2 = ((observed - 1000.0) ** 2 / 1000.0).sum()
    assert chi2 < 20.52  # chi-square critical value, 5 degrees of freedom, alpha = 0.001


def test_random_order_single_turn_is_a_full_shuffle():
    convs = list(range(5))
    rng = np.random.default_rng(1)
    seen = Counter(tuple(order_random(convs, rng).tolist()) for _ in range(12000))
    assert len(seen) == len(list(itertools.permutations(range(5))))

"""Arrival times and query orders (ALGORITHMS.md §4), plus per-component generators.

Choices the paper leaves open (documented here and in REPRODUCE.md):
* Poisson arrivals: the first request arrives at t = 0 and each next one after an
  Exp(1/rate) gap (SGLang's bench_serving sends the first request at once, then sleeps);
  `rate = inf` puts every arrival at 0. Arrivals are open-loop, also for multi-turn
  workloads: turn k+1 may arrive before turn k has finished (the spec's Poisson model).
* `random` order: a uniformly random interleaving of the conversations that keeps each
  conversation's turns in order (for single-turn workloads: a plain shuffle).
* `round_robin` order (LRU's adversary): one query from each group in turn, cycling over
  the groups in increasing group id; a group's own queries keep their natural order
  (turn order), exhausted groups are skipped.
* The cap `num_queries` keeps the first queries of the ordered stream, so a later turn is
  never kept without its earlier turns.
"""

from __future__ import annotations

import zlib
from typing import Sequence

import numpy as np


def component_rng(seed: int, component: str) -> np.random.Generator:
    """Independent generator per named component, all from one seed.

    Changing one knob (say the request rate) leaves every other component's draws
    unchanged, so a rate sweep replays the same queries in the same order.
    """
    return np.random.default_rng(np.random.SeedSequence([int(seed), zlib.crc32(component.encode())]))


def poisson_arrivals(n: int, rate_per_s: float, rng: np.random.Generator) -> np.ndarray:
    """`n` arrival times (seconds, float64, non-decreasing) of a Poisson process."""
    if n <= 0:
        return np.zeros(0, dtype=np.float64)
    if np.isinf(rate_per_s):
        return np.zeros(n, dtype=np.float64)
    gaps = rng.exponential(1.0 / rate_per_s, size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def order_random(conversation_ids: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """Positions of the queries in a random order that keeps each conversation's order.

    `conversation_ids[i]` is the conversation of query i; queries of one conversation
    appear in `conversation_ids` in turn order. Shuffling the multiset of conversation
    ids and giving the k-th occurrence of a conversation its k-th query yields every
    order-preserving interleaving with equal probability.
    """
    conv = np.asarray(conversation_ids, dtype=np.int64)
    n = len(conv)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    shuffled = conv[rng.permutation(n)]
    # queries of each conversation in their original order (stable sort keeps turn order)
    by_conv = np.argsort(conv, kind="stable")
    # occurrence rank of every slot of `shuffled` within its conversation
    slot_order = np.argsort(shuffled, kind="stable")
    out = np.empty(n, dtype=np.int64)
    # the j-th slot (in slot_order) of conversation c receives the j-th query of c:
    # both sorted lists group conversations in the same increasing order
    out[slot_order] = by_conv
    return out


def order_round_robin(group_ids: Sequence[int]) -> np.ndarray:
    """Positions of the queries in round-robin order over groups (see module docstring)."""
    grp = np.asarray(group_ids, dtype=np.int64)
    n = len(grp)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    by_group = np.argsort(grp, kind="stable")  # natural order inside each group
    sorted_groups = grp[by_group]
    starts = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])
    rank = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))  # index within group
    # sort by (rank within group, group id): round r takes the r-th query of each group
    key = np.lexsort((sorted_groups, rank))
    return by_group[key]

"""Traces for the competitive-ratio experiments (paper App. C): lower-bound constructions and random trees.

Every trace is a list of int32 token paths, replayed by `repro.kvcache.replay.replay`.

* Theorem 4 (single-query): k = B - L + 2 paths share one (L - 1)-token prefix and differ
  in one leaf token; requested round-robin. The B + 1 distinct tokens cycle through a
  cache of B: L-LRU misses every leaf, B - L + 1 per phase; OPT 1 per phase; RLT
  H_{B-L+1} in expectation (the marking algorithm on K + 1 pages cycled through K = B - L + 1
  slots: 1 clean miss + sum_{s=2..K} 1/s for the stale leaves, = H_K).
* Theorem 5 (continuous batching, batch beta, paper's assumption beta * L <= B): the same
  k paths; batch u = {Gamma_1..Gamma_{beta-1}, Gamma_{u+beta-1}} for u = 1..B-L-beta+3,
  looped. The beta - 1 fixed paths stay locked inside each batch, so K' = B - L - beta + 2
  leaf slots are cycled by K' + 1 leaves: L-LRU misses K' = B - L - beta + 2 per phase,
  OPT 1, RLT H_{K'}.
* Random prefix-tree traces: distinct paths grown by branching off random prefixes of the
  paths made so far, requested with uniform popularity.

Token ids: the shared prefix uses 0..L-2 and the leaves 1_000_000 + i (identity is the path
prefix anyway).
"""

from __future__ import annotations

import numpy as np

from repro.kvcache import as_key

LEAF_BASE = 1_000_000


def _check(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def lower_bound_paths(capacity: int, min_path_len: int) -> list[np.ndarray]:
    """The k = B - L + 2 paths of Theorems 4/5: a shared (L-1)-token prefix + one distinct leaf."""
    B = _check("capacity", capacity, 1)
    L = _check("min_path_len", min_path_len, 1)
    if B < L:
        raise ValueError(f"the construction needs capacity B >= L (got B={B}, L={L})")
    prefix = np.arange(L - 1, dtype=np.int32)
    return [np.append(prefix, np.int32(LEAF_BASE + i)).astype(np.int32) for i in range(B - L + 2)]


def theorem4_trace(capacity: int, min_path_len: int, num_requests: int) -> list[np.ndarray]:
    """Gamma_1, ..., Gamma_{B-L+2} requested round-robin, `num_requests` paths in all."""
    paths = lower_bound_paths(capacity, min_path_len)
    n = _check("num_requests", num_requests, 1)
    return [paths[i % len(paths)] for i in range(n)]


def theorem5_trace(capacity: int, min_path_len: int, beta: int, num_batches: int) -> list[np.ndarray]:
    """Batches {Gamma_1..Gamma_{beta-1}, Gamma_{u+beta-1}}, u = 1..B-L-beta+3 looped; replay with batch=beta."""
    B = _check("capacity", capacity, 1)
    L = _check("min_path_len", min_path_len, 1)
    beta = _check("beta", beta, 1)
    if beta * L > B:
        raise ValueError(f"Theorem 5 assumes beta * L <= B (got beta={beta}, L={L}, B={B})")
    cycle = B - L - beta + 3
    if cycle < 2:
        raise ValueError(f"Theorem 5 needs B - L - beta + 3 >= 2 batches to cycle (got {cycle})")
    paths = lower_bound_paths(B, L)
    fixed = paths[: beta - 1]
    out = []
    for u in range(_check("num_batches", num_batches, 1)):
        out.extend(fixed)
        out.append(paths[(u % cycle) + beta - 1])
    return out


def random_prefix_tree_trace(
    seed: int | np.random.Generator,
    num_requests: int,
    num_distinct: int = 16,
    min_len: int = 1,
    max_len: int = 8,
    vocab: int = 4,
) -> list[np.ndarray]:
    """Random prefix tree of `num_distinct` paths (lengths in [min_len, max_len]), requested uniformly.

    Each new distinct path copies a random prefix of a random earlier path (or starts at the
    root) and appends random tokens from `vocab` ids until its random target length.
    """
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    _check("num_requests", num_requests, 1)
    _check("num_distinct", num_distinct, 1)
    _check("min_len", min_len, 1)
    if max_len < min_len:
        raise ValueError("max_len must be >= min_len")
    distinct: list[np.ndarray] = []
    seen: set[bytes] = set()
    attempts = 0
    while len(distinct) < num_distinct:
        attempts += 1
        if attempts > 100 * num_distinct:
            raise ValueError("could not draw enough distinct paths: raise vocab or max_len")
        length = int(rng.integers(min_len, max_len + 1))
        if distinct and rng.random() < 0.8:
            base = distinct[int(rng.integers(len(distinct)))]
            cut = int(rng.integers(0, min(len(base), length) + 1))
            head = base[:cut]
        else:
            head = np.zeros(0, dtype=np.int32)
        tail = rng.integers(0, vocab, size=length - len(head)).astype(np.int32)
        path = np.concatenate([head, tail]).astype(np.int32)
        key = as_key(path)
        if key not in seen:
            seen.add(key)
            distinct.append(path)
    picks = rng.integers(0, len(distinct), size=num_requests)
    return [distinct[int(i)] for i in picks]

"""Reference replayer: one entry per token, plain sets and dicts, obviously right (and slow).

A token is its path prefix as a tuple. Semantics = repro.kvcache.replay (the paper's model):
paths in groups of `batch`; inside a path, token by token: hit if cached, else a miss that
(RLT) marks the token, resets the marks if B + 1 distinct tokens are marked, evicts one
victim if B tokens are cached, then caches the token. Locked = every token of the paths of
the current group processed so far (the current path included).

Marks live on cached tokens (plus the token being processed): an evicted token loses its mark.

Node mode mirrors the fast tree's node boundaries with an explicit set of "node start"
tokens: a token starts a node if it is the first new token of a path, the token after an
access boundary (the children of the last matched token), or the token at which an RLT
reset happened inside a new run. A leaf node = its leaf token and its ancestors up to the
nearest node start; node granularity evicts it whole (deepest token first).

Victim rules: LRU = least recent leaf token (node: the node's leaf token). OPT = furthest
next use (token: the leaf token; node: the node's first token), ties by LRU. RLT = uniform
over unmarked candidates (own RNG: sorted candidates, `Generator.integers`), else LRU.
`forced_victims` (RLT): instead of drawing, take the fast tree's victims in order and
assert each is a legal choice, so that marks, resets, hits and misses can be compared
exactly.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

INF = float("inf")


def fiat_phase_starts(paths, capacity):
    """Naive: global token positions where a phase starts (each holds <= B distinct tokens)."""
    starts, seen, pos = [], set(), 0
    for p in paths:
        p = tuple(int(x) for x in p)
        for k in range(1, len(p) + 1):
            t = p[:k]
            if t not in seen:
                if not starts or len(seen) == capacity:
                    starts.append(pos)
                    seen = set()
                seen.add(t)
            pos += 1
    return starts


class ReferenceReplayer:
    def __init__(self, capacity, policy, granularity="token", seed=0, trace=None, forced_victims=None):
        assert policy in ("lru", "rlt", "opt") and granularity in ("token", "node")
        self.B = capacity
        self.policy = policy
        self.granularity = granularity
        self.rng = np.random.default_rng(seed)
        self.trace = [tuple(int(x) for x in p) for p in trace] if trace is not None else None
        self.forced = list(forced_victims) if forced_victims is not None else None
        self.cached: set = set()
        self.children = defaultdict(set)
        self.stamp: dict = {}
        self.marked: set = set()
        self.node_start: set = set()
        self.locked: set = set()
        self.clock = 0
        self.now = -1
        self.resets = 0
        self.evicted: list = []

    # ---------------------------------------------------------------- helpers
    def _mark(self, t) -> bool:
        if t in self.marked:
            return False
        self.marked.add(t)
        if len(self.marked) == self.B + 1:
            self.marked = {t}
            self.resets += 1
            return True
        return False

    def _unit(self, leaf):
        """Tokens evicted together with `leaf`, deepest first."""
        if self.granularity == "token":
            return [leaf]
        unit = [leaf]
        t = leaf
        while t not in self.node_start:
            t = t[:-1]
            unit.append(t)
        return unit

    def _units(self):
        out = []
        for t in self.cached:
            if not self.children[t] and t not in self.locked:
                unit = self._unit(t)
                assert not any(u in self.locked for u in unit), "lock not uniform inside a node"
                out.append(unit)
        return out

    def _next_use(self, t):
        for j in range(self.now + 1, len(self.trace)):
            if self.trace[j][: len(t)] == t:
                return j
        return INF

    def _lru(self, units):
        return min(units, key=lambda u: self.stamp[u[0]])

    def _choose(self, units):
        if self.policy == "lru":
            return self._lru(units)
        if self.policy == "opt":
            probe = (lambda u: u[-1]) if self.granularity == "node" else (lambda u: u[0])
            return min(units, key=lambda u: (-self._next_use(probe(u)), self.stamp[u[0]]))
        unmarked = [u for u in units if u[0] not in self.marked]
        for u in unmarked:
            assert not any(x in self.marked for x in u), "marks not uniform inside a node"
        if self.forced is not None:
            leaf = self.forced[0]
            chosen = next((u for u in units if u[0] == leaf), None)
            assert chosen is not None, f"forced victim {leaf} is not an evictable leaf"
            if unmarked:
                assert chosen in unmarked, f"forced victim {leaf} is marked while unmarked leaves exist"
            else:
                assert chosen == self._lru(units), f"forced fallback victim {leaf} is not the LRU leaf"
            return chosen
        if unmarked:
            unmarked.sort()
            return unmarked[int(self.rng.integers(len(unmarked)))]
        return self._lru(units)

    def _evict_one(self):
        units = self._units()
        assert units, "nothing evictable (the reference is never called on inputs that do not fit)"
        unit = self._choose(units)
        for t in unit:  # deepest first
            if self.forced is not None and self.policy == "rlt":
                assert self.forced and self.forced.pop(0) == t, "forced victim sequence diverged"
            self.cached.remove(t)
            self.children[t[:-1]].discard(t)
            del self.stamp[t]
            self.marked.discard(t)
            self.node_start.discard(t)
            self.evicted.append(t)

    def _boundary_after(self, t):
        for c in self.children[t]:
            self.node_start.add(c)

    # ---------------------------------------------------------------- the model
    def process_path(self, path, j):
        self.now = j
        toks = [tuple(int(x) for x in path[:k]) for k in range(1, len(path) + 1)]
        self.locked.update(toks)
        hits = misses = 0
        for i, t in enumerate(toks):
            self.clock += 1
            if t in self.cached:
                hits += 1
                self.stamp[t] = self.clock
                self._mark(t)
                continue
            first_new = misses == 0
            if first_new:
                self._boundary_after(t[:-1])  # the match ended at the parent
            misses += 1
            reset = self._mark(t) if self.policy == "rlt" else False
            if len(self.cached) >= self.B:
                self._evict_one()
            self.cached.add(t)
            self.children[t[:-1]].add(t)
            self.stamp[t] = self.clock
            if first_new or reset:
                self.node_start.add(t)
        if misses == 0:
            self._boundary_after(toks[-1])
        return hits, misses

    def run(self, paths, batch=1):
        """Returns (hits, misses per path)."""
        paths = list(paths)
        hits = 0
        per_path = []
        for g in range(0, len(paths), batch):
            self.locked = set()
            for j in range(g, min(len(paths), g + batch)):
                h, m = self.process_path(paths[j], j)
                hits += h
                per_path.append(m)
        self.locked = set()
        return hits, per_path

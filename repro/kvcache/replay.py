"""Trace replayer: the paper's single-worker model on a file of complete token paths.

    python -m repro.kvcache.replay --trace FILE.jsonl --capacity B --policy lru|rlt|opt|... \
        [--granularity token|node] [--batch BETA] [--seed S] [--per-phase]

Input: one complete path Gamma_j per line, `{"tokens": [int, ...]}` (blank lines skipped).
Single-query processing (`--batch 1`): for each path, for k = 1..|Gamma|, the token
Gamma[:k] is a hit if cached, else a miss; a miss with B tokens cached evicts one victim
chosen by the policy among the evictable leaves (a whole leaf node at node granularity),
then caches the token. The path's tokens are locked while it is processed. With
`--batch beta`, paths are processed in consecutive groups of beta, one after the other,
and each path stays locked from its start until its whole group is done (Theorem 5's
model; the group must fit: its distinct tokens <= B). Default granularity: token (the
paper's model; the simulator's default is node).

Output: one JSON object on stdout: misses, hits, evicted_tokens, phases (Fiat et al. phases
of the token-access sequence: each phase but the last holds exactly B distinct tokens;
computed from the sequence, independent of the policy), policy, capacity, seed, ... and
`steady_misses_per_phase` (mean misses over the complete phases after the first).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from repro.kvcache.eviction import eviction_policies
from repro.kvcache.keys import as_key
from repro.kvcache.radix_cache import GRANULARITIES, CapacityError, PathResult, RadixCache
from repro.kvcache.trace_index import TraceIndex


@dataclass
class ReplayResult:
    policy: str
    granularity: str
    capacity: int
    batch: int
    seed: int
    num_paths: int
    num_tokens: int
    hits: int
    misses: int
    evicted_tokens: int
    phase_starts: list[int]
    path_lengths: np.ndarray
    misses_per_path: np.ndarray
    stats: dict = field(default_factory=dict)
    cache: RadixCache | None = field(default=None, repr=False)

    @property
    def phases(self) -> int:
        return len(self.phase_starts)

    def misses_by_phase(self) -> np.ndarray:
        """Misses inside each Fiat phase (a path's misses are the suffix of its tokens)."""
        ends = np.cumsum(self.path_lengths)
        keep = self.misses_per_path > 0
        s = (ends - self.misses_per_path)[keep]
        e = ends[keep]
        cum = np.concatenate([[0], np.cumsum(e - s)])
        bounds = np.asarray(list(self.phase_starts) + [self.num_tokens], dtype=np.int64)
        k = np.searchsorted(e, bounds, side="right")  # miss runs ending at or before each bound
        before = cum[k]
        inside = k < len(s)  # run k may straddle the bound
        before[inside] += np.maximum(0, bounds[inside] - s[k[inside]])
        return np.diff(before)

    def steady_misses_per_phase(self) -> float | None:
        """Mean misses per phase over phases 2 .. P-1 (complete phases after the first)."""
        per = self.misses_by_phase()
        return float(per[1:-1].mean()) if len(per) >= 3 else None

    def to_json(self, per_phase: bool = False) -> dict:
        out = {
            "policy": self.policy,
            "granularity": self.granularity,
            "capacity": self.capacity,
            "batch": self.batch,
            "seed": self.seed,
            "num_paths": self.num_paths,
            "num_tokens": self.num_tokens,
            "hits": self.hits,
            "misses": self.misses,
            "hit_rate": self.hits / self.num_tokens if self.num_tokens else None,
            "evicted_tokens": self.evicted_tokens,
            "phases": self.phases,
            "steady_misses_per_phase": self.steady_misses_per_phase(),
        }
        for k, v in self.stats.items():
            if k.startswith("rlt_"):
                out[k] = v
        if per_phase:
            out["misses_by_phase"] = [int(x) for x in self.misses_by_phase()]
        return out


def replay_policy_names() -> tuple[str, ...]:
    """The registered policies the replayer runs (those declaring the `theory` backend)."""
    return tuple(n for n, cls in eviction_policies().items() if "theory" in cls.backends)


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def replay(
    paths: Sequence,
    capacity: int,
    policy: str = "lru",
    granularity: str = "token",
    batch: int = 1,
    seed: int = 0,
    *,
    index: TraceIndex | None = None,
    on_path: Callable[[RadixCache, int, PathResult], None] | None = None,
    record_evictions: bool = False,
) -> ReplayResult:
    """Replay `paths` on one cache; every input is checked before any work starts."""
    capacity = _check_int("capacity", capacity, 1)
    batch = _check_int("batch", batch, 1)
    seed = _check_int("seed", seed, 0)
    names = replay_policy_names()
    if policy not in names:
        raise ValueError(f"policy must be one of {names}, got {policy!r}")
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    keys = index.keys if index is not None else [as_key(p) for p in paths]
    lengths = np.fromiter((len(k) >> 2 for k in keys), dtype=np.int64, count=len(keys))
    for j, n in enumerate(lengths):
        if n == 0:
            raise ValueError(f"path {j} is empty: every path needs at least one token")
        if n > capacity:
            raise CapacityError(
                f"path {j} has {n} tokens but the capacity is {capacity}: a path must fit in the cache "
                "(raise --capacity or drop the path)"
            )
    if index is None:
        index = TraceIndex(keys)
    if batch > 1:
        for g, d in zip(range(0, len(keys), batch), index.group_distinct_tokens(batch)):
            if d > capacity:
                raise CapacityError(
                    f"the batch group of paths {g}..{min(len(keys), g + batch) - 1} holds {d} distinct tokens "
                    f"> capacity {capacity}: all paths of a group stay locked, so lower --batch or raise --capacity"
                )
    pol = eviction_policies()[policy].create(seed, index)
    cache = RadixCache(capacity, pol, granularity, record_evictions=record_evictions)
    begin_path = pol.begin_path
    hits = 0
    evicted = 0
    process = cache.process_path
    per_path = []
    if batch == 1 and on_path is None:  # each path unlocked as soon as it is done: one verb
        for j, key in enumerate(keys):
            begin_path(j)
            h, m, e, _ = process(key, False)
            hits += h
            evicted += e
            per_path.append(m)
    else:
        unlock = cache.dec_lock_ref
        for g in range(0, len(keys), batch):
            locked = []
            for j in range(g, min(len(keys), g + batch)):
                begin_path(j)
                res = process(keys[j])
                h, m, e, node = res
                hits += h
                evicted += e
                per_path.append(m)
                locked.append(node)
                if on_path is not None:
                    on_path(cache, j, res)
            for node in locked:
                unlock(node)
    misses = np.array(per_path, dtype=np.int64)
    return ReplayResult(
        policy=policy,
        granularity=granularity,
        capacity=capacity,
        batch=batch,
        seed=seed,
        num_paths=len(keys),
        num_tokens=int(lengths.sum()),
        hits=hits,
        misses=int(misses.sum()),
        evicted_tokens=evicted,
        phase_starts=index.fiat_phases(capacity),
        path_lengths=lengths,
        misses_per_path=misses,
        stats=cache.stats(),
        cache=cache,
    )


def read_trace(path: str) -> list[bytes]:
    """Read a jsonl trace; raises ValueError naming the file and line of any bad record."""
    keys = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f'{path}:{lineno}: not valid JSON ({e.msg}); expected {{"tokens": [int, ...]}}'
                ) from None
            if not isinstance(obj, dict) or not isinstance(obj.get("tokens"), list):
                raise ValueError(f'{path}:{lineno}: expected an object {{"tokens": [int, ...]}}')
            toks = obj["tokens"]
            if not toks:
                raise ValueError(f"{path}:{lineno}: empty token list")
            if not all(type(t) is int for t in toks):
                raise ValueError(f"{path}:{lineno}: tokens must be integers")
            try:
                keys.append(as_key(np.asarray(toks, dtype=np.int64)))
            except (ValueError, OverflowError) as e:
                raise ValueError(f"{path}:{lineno}: {e}") from None
    if not keys:
        raise ValueError(f"{path}: no paths in the trace")
    return keys


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.kvcache.replay", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", required=True, help='jsonl file, one {"tokens": [...]} per line')
    ap.add_argument("--capacity", type=int, required=True, help="cache capacity B in tokens")
    ap.add_argument("--policy", required=True, choices=replay_policy_names())
    ap.add_argument("--granularity", default="token", choices=GRANULARITIES)
    ap.add_argument("--batch", type=int, default=1, help="batch size beta (Theorem 5 model)")
    ap.add_argument("--seed", type=int, default=0, help="RLT's random seed")
    ap.add_argument("--per-phase", action="store_true", help="also print misses_by_phase")
    args = ap.parse_args(argv)
    try:
        keys = read_trace(args.trace)
        res = replay(keys, args.capacity, args.policy, args.granularity, args.batch, args.seed)
    except (ValueError, CapacityError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(res.to_json(per_phase=args.per_phase), sort_keys=True))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

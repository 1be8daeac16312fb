"""Speed of our radix tree (repro.kvcache), measured side by side in one run.

    PYTHONPATH=. python tests/benchmarks/bench_kvcache.py [--quick] [--repeats N] [--baseline-rev REV]

1. match_prefix + insert + evict throughput (tokens/s) on a GSP-like trace (64 groups x 16
   prompts, 2048-token shared system prompts + 128-token questions, random order), capacity
   1/4 of the working set, per request: match_prefix, inc_lock_ref, evict(needed - free),
   insert, lock new / unlock old, unlock at finish (the simulator's sequence). `make_gsp_trace`
   and `run_ours(trace, capacity, policy)` are importable so that the SGLang benchmark runs
   the very same trace and operations against SGLang's RadixCache.
2. Eviction cost per evicted token (us, amortised: time inside evict() / tokens evicted),
   RLT vs LRU on the same trace and capacity, node and token granularity, interleaved
   repeats (best of each: the least disturbed estimate on a shared machine), ratio RLT / LRU.
   `--baseline-rev REV` adds, interleaved in the same run, RLT as implemented at git
   revision REV (its repro/kvcache/eviction/rlt.py loaded beside ours; valid while the cache's
   policy hooks and eviction verbs are unchanged, so not across the split of eviction.py into
   one module per policy): before/after numbers of a policy change, side by side.
3. peek_prefix of a 4096-token prompt against a tree of ~3200 nodes (what routers call for
   every worker on every request): full hit, miss after the shared prefix, divergence in
   the middle of the prefix; bytes and int32-array inputs (best of 5 rounds).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import timeit
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from repro.kvcache import RadixCache, as_key, make_cache  # noqa: E402


def make_gsp_trace(
    num_groups: int = 64,
    prompts_per_group: int = 16,
    prefix_tokens: int = 2048,
    question_tokens: int = 128,
    seed: int = 0,
    vocab: int = 32000,
    shuffle: bool = True,
) -> list[np.ndarray]:
    """GSP-like prompts (int32 arrays): group g = shared prefix g + a fresh question each."""
    rng = np.random.default_rng(seed)
    prefixes = rng.integers(0, vocab, size=(num_groups, prefix_tokens), dtype=np.int32)
    trace = [
        np.concatenate([prefixes[g], rng.integers(0, vocab, size=question_tokens, dtype=np.int32)])
        for g in range(num_groups)
        for _ in range(prompts_per_group)
    ]
    if shuffle:
        order = rng.permutation(len(trace))
        trace = [trace[i] for i in order]
    return trace


def working_set_tokens(trace) -> int:
    from repro.kvcache import TraceIndex

    return TraceIndex(trace).num_distinct_tokens


def _request(cache, key: bytes, timer: list | None = None) -> None:
    m = cache.match_prefix(key)
    cache.inc_lock_ref(m.last_node)
    need = (len(key) >> 2) - m.length - cache.free_tokens()
    if need > 0:
        if timer is None:
            cache.evict(need)
        else:
            t = time.perf_counter()
            cache.evict(need)
            timer[0] += time.perf_counter() - t
    r = cache.insert(key)
    cache.inc_lock_ref(r.last_node)
    cache.dec_lock_ref(m.last_node)
    cache.dec_lock_ref(r.last_node)  # request finished


def run_ours(trace, capacity: int, policy: str = "lru", granularity: str = "node", seed: int = 0) -> float:
    """Prompt tokens per second through match_prefix + insert + evict (+ locks) on our tree."""
    keys = [as_key(t) for t in trace]  # converted once, as the simulator does
    cache = make_cache(capacity, {"name": policy, "granularity": granularity}, seed)
    t0 = time.perf_counter()
    for key in keys:
        _request(cache, key)
    elapsed = time.perf_counter() - t0
    return sum(len(k) >> 2 for k in keys) / elapsed


def eviction_module_at(rev: str) -> types.ModuleType:
    """repro/kvcache/eviction/rlt.py as of git revision `rev`, loaded as a separate module
    (it is not in the policy registry: only modules of the package are)."""
    path = "repro/kvcache/eviction/rlt.py"
    src = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    mod = types.ModuleType(f"eviction_at_{rev}")
    exec(compile(src, f"{rev}:{path}", "exec"), mod.__dict__)
    return mod


def eviction_cost(
    trace, capacity: int, policy: str, granularity: str, seed: int = 0, module: types.ModuleType | None = None
) -> tuple[float, int]:
    """(us per evicted token, tokens evicted) with only evict() calls timed.

    `module`: take RLTEviction from this module (see `eviction_module_at`) instead of ours."""
    keys = [as_key(t) for t in trace]
    if module is None:
        cache = make_cache(capacity, {"name": policy, "granularity": granularity}, seed)
    else:
        assert policy == "rlt", "a baseline module is only used for RLT"
        cache = RadixCache(capacity, module.RLTEviction(seed), granularity)
    timer = [0.0]
    for key in keys:
        _request(cache, key, timer)
    ev = cache.evicted_tokens
    return (timer[0] / ev * 1e6 if ev else float("nan")), ev


def peek_cost(repeats: int = 2000) -> dict:
    trace = make_gsp_trace(num_groups=128, prompts_per_group=24, prefix_tokens=3968, question_tokens=128, seed=1)
    cache = make_cache(10**7, {"name": "lru", "granularity": "node"})
    for t in trace:
        cache.insert(t)
    nodes = cache.stats()["num_nodes"]
    rng = np.random.default_rng(2)
    hit = trace[5]
    new_q = np.concatenate([hit[:3968], rng.integers(0, 32000, 128, dtype=np.int32)])
    mid = hit.copy()
    mid[2000:] = rng.integers(0, 32000, len(mid) - 2000, dtype=np.int32)
    out = {"nodes": nodes}
    for name, arr in (("full hit", hit), ("new question", new_q), ("diverge mid-prefix", mid)):
        for kind, arg in (("bytes", arr.tobytes()), ("int32", arr)):
            # best of 5 rounds: the least disturbed estimate on a shared machine
            out[(name, kind)] = min(timeit.repeat(lambda: cache.peek_prefix(arg), number=repeats, repeat=5)) / repeats * 1e6
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller trace (16 groups), 1 repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline-rev", metavar="REV", help="also time RLT as of this git revision (section 2)")
    a = ap.parse_args(argv)
    base = eviction_module_at(a.baseline_rev) if a.baseline_rev else None
    groups = 16 if a.quick else 64
    reps = 1 if a.quick else a.repeats
    trace = make_gsp_trace(num_groups=groups)
    ws = working_set_tokens(trace)
    cap = ws // 4
    print(f"GSP-like trace: {len(trace)} prompts, {sum(len(t) for t in trace)} prompt tokens, "
          f"working set {ws} tokens, capacity {cap} (1/4)")

    print("\n1) match_prefix + insert + evict throughput (our tree; best of repeats)")
    print(f"   {'policy':6} {'granularity':11} {'Mtokens/s':>10}")
    for pol in ("lru", "rlt"):
        for gran in ("node", "token"):
            tps = max(run_ours(trace, cap, pol, gran) for _ in range(reps))
            print(f"   {pol:6} {gran:11} {tps / 1e6:>10.2f}")

    print("\n2) eviction cost per evicted token (us, amortised; LRU/RLT interleaved, best of repeats)")
    head = f"   {'granularity':11} {'LRU us/tok':>10} {'RLT us/tok':>10} {'RLT/LRU':>8} {'evicted':>9}"
    if base is not None:
        head += f" {'RLT@' + a.baseline_rev[:10]:>15} {'its /LRU':>8}"
    print(head)
    for gran in ("node", "token"):
        lru, rlt, old = [], [], []
        for _ in range(reps):
            c, ev = eviction_cost(trace, cap, "lru", gran)
            lru.append(c)
            c, ev_r = eviction_cost(trace, cap, "rlt", gran)
            rlt.append(c)
            if base is not None:
                old.append(eviction_cost(trace, cap, "rlt", gran, module=base)[0])
        ml, mr = min(lru), min(rlt)
        line = f"   {gran:11} {ml:>10.4f} {mr:>10.4f} {mr / ml:>8.2f} {ev_r:>9}"
        if base is not None:
            line += f" {min(old):>15.4f} {min(old) / ml:>8.2f}"
        print(line)

    print("\n3) peek_prefix, 4096-token prompt (us per call)")
    pc = peek_cost(300 if a.quick else 2000)
    print(f"   tree: {pc.pop('nodes')} nodes")
    for (name, kind), us in pc.items():
        print(f"   {name:20} {kind:6} {us:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

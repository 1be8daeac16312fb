"""Our radix tree vs SGLang 0.5.23's RadixCache: match_prefix + insert + evict throughput, side by side.

    bash scripts/make_sglang_env.sh                                   # once
    PYTHONPATH=. .venv-sglang/bin/python tests/benchmarks/bench_sglang.py [--quick] [--repeats N]

Same trace, same capacity, same operations, LRU: the GSP-like trace and `run_ours` of
tests/benchmarks/bench_kvcache.py (64 groups x 16 prompts of 2048 shared + 128 own tokens, random
order; capacity 1/4 of the working set), and per request on SGLang's tree the very sequence
`run_ours` runs on ours: match_prefix, inc_lock_ref, evict(needed - free), insert, lock the new
path, unlock the matched one, unlock at finish. SGLang's tree is
`RadixCache.create_simulated(mock_allocator=...)` (an allocator stand-in with `device` and
`free_segment`); its token capacity is what SGLang's scheduler would check (free = capacity -
evictable - protected). Keys: our tree takes packed int32 bytes converted once per trace (as
the simulator does); SGLang gets a `RadixKey` over an `array('q')` built once per trace item and
the KV-index tensor its scheduler would pass (`InsertParams.value`, also built once), so neither
side pays for conversions inside the timed loop. Runs are interleaved (ours, SGLang, ours, ...)
and the medians compared: ratio = ours tokens/s / SGLang tokens/s (target >= 3).

A second table: the patched SGLang with `rlt` (repro.backends.sglang.rlt_patch) vs SGLang's own
`lru` on the same trace -- what the RLT hooks cost inside a live server's tree.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from array import array
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))

from bench_kvcache import make_gsp_trace, run_ours, working_set_tokens  # noqa: E402

from tests.sglang.sglang_driver import SGLangTree, import_sglang  # noqa: E402


def run_sglang(sg, trace, capacity: int, policy: str = "lru", seed: int = 0) -> tuple[float, float]:
    """(prompt tokens per second, hit rate) through the per-request sequence on SGLang's RadixCache."""
    tree = SGLangTree(sg, capacity, policy, seed=seed)
    cache = tree.cache
    RadixKey, MatchPrefixParams, InsertParams, EvictParams = sg.RadixKey, sg.MatchPrefixParams, sg.InsertParams, sg.EvictParams
    keys = [array("q", np.asarray(t, dtype=np.int64).tobytes()) for t in trace]
    values = [tree.value_of(t) for t in trace]
    hits = 0
    t0 = time.perf_counter()
    for key, value in zip(keys, values):
        n = len(key)
        m = cache.match_prefix(MatchPrefixParams(key=RadixKey(key)))
        hits += m.device_prefix_len
        cache.inc_lock_ref(m.last_device_node)
        need = n - m.device_prefix_len - (capacity - cache.evictable_size_ - cache.protected_size_)
        if need > 0:
            cache.evict(EvictParams(num_tokens=need))
        r = cache.insert(InsertParams(key=RadixKey(key), value=value))
        cache.inc_lock_ref(r.last_device_node)
        cache.dec_lock_ref(m.last_device_node)
        cache.dec_lock_ref(r.last_device_node)  # request finished
    elapsed = time.perf_counter() - t0
    total = sum(len(k) for k in keys)
    return total / elapsed, hits / total


def ours_hit_rate(trace, capacity: int, policy: str = "lru") -> float:
    from repro.kvcache import as_key, make_cache

    cache = make_cache(capacity, {"name": policy, "granularity": "node"}, 0)
    hits = total = 0
    for t in trace:
        key = as_key(t)
        m = cache.match_prefix(key)
        hits += m.length
        total += len(t)
        cache.inc_lock_ref(m.last_node)
        need = len(t) - m.length - cache.free_tokens()
        if need > 0:
            cache.evict(need)
        r = cache.insert(key)
        cache.inc_lock_ref(r.last_node)
        cache.dec_lock_ref(m.last_node)
        cache.dec_lock_ref(r.last_node)
    return hits / total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="16 groups instead of 64, 1 repeat")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    sg = import_sglang()
    groups = 16 if a.quick else 64
    reps = 1 if a.quick else a.repeats
    trace = make_gsp_trace(num_groups=groups)
    ws = working_set_tokens(trace)
    cap = ws // 4
    tokens = sum(len(t) for t in trace)
    print(f"sglang {sg.version}; GSP-like trace: {len(trace)} prompts, {tokens} prompt tokens, "
          f"working set {ws} tokens, capacity {cap} (1/4); {reps} interleaved repeats, medians")

    ours, theirs = [], []
    for _ in range(reps):
        ours.append(run_ours(trace, cap, "lru"))
        theirs.append(run_sglang(sg, trace, cap, "lru")[0])
    mo, mt = statistics.median(ours), statistics.median(theirs)
    hr_o, hr_t = ours_hit_rate(trace, cap), run_sglang(sg, trace, cap, "lru")[1]
    print("\n1) match_prefix + insert + evict throughput, LRU, node granularity")
    print(f"   {'tree':28} {'Mtokens/s':>10} {'hit rate':>9}")
    print(f"   {'ours (repro.kvcache)':28} {mo / 1e6:>10.2f} {hr_o:>9.4f}")
    print(f"   {'SGLang RadixCache':28} {mt / 1e6:>10.2f} {hr_t:>9.4f}")
    print(f"   ratio ours / SGLang: {mo / mt:.1f}x  (target >= 3x)")

    from repro.backends.sglang import rlt_patch

    rlt_patch.apply()
    lru, rlt = [], []
    for _ in range(reps):
        lru.append(run_sglang(sg, trace, cap, "lru"))
        rlt.append(run_sglang(sg, trace, cap, "rlt"))
    ml, mr = statistics.median(x[0] for x in lru), statistics.median(x[0] for x in rlt)
    print("\n2) patched SGLang: rlt vs SGLang's own lru (same trace and capacity)")
    print(f"   {'policy':28} {'Mtokens/s':>10} {'hit rate':>9}")
    print(f"   {'SGLang lru (patched build)':28} {ml / 1e6:>10.2f} {lru[0][1]:>9.4f}")
    print(f"   {'SGLang rlt':28} {mr / 1e6:>10.2f} {rlt[0][1]:>9.4f}")
    print(f"   ratio rlt / lru: {mr / ml:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

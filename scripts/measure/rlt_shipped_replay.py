"""One SGLang-0.4.6 server's sequence of radix-tree calls, replayed on a tree: RLT as shipped vs ours.

    python scripts/measure/rlt_shipped_replay.py [--seeds 20] [--kv 1200 2400]   # from the repo root

What it drives (read from sglang 0.4.6's scheduler.py, schedule_policy.py, schedule_batch.py,
scheduler_output_processor_mixin.py, mem_cache/radix_cache.py; default flags: fcfs, no overlap
modelled, page 1, no chunking below 8192 prompt tokens, max prefill 16384 tokens):
* a prefill pass walks the waiting queue in order: `match_prefix(prompt[:-1])` (0.4.6 never lets
  a match cover the last prompt token), the PrefillAdder budget (free + evictable minus the
  running requests' clipped remaining outputs x new_token_ratio), a lock on the match;
* the batch's allocation: `evict(whole allocation)` when fewer slots are free (0.4.6's
  `alloc_token_slots`; 0.5.23 evicts the shortfall), then the prompt's first output token and
  `cache_unfinished_req`: `insert(prompt)`, a duplicate's KV freed, `match_prefix(prompt)`,
  the lock moved to the new last node;
* a decode step per running batch: `evict(batch size)` when fewer slots are free (check_decode_mem),
  one output token each; a finished request runs `cache_finished_req`: `insert(prompt + output[:-1])`
  and its unlock.
Prefill passes run when requests wait and the batch is not full; otherwise a decode step.
The pool = the tree's tokens + the KV of running requests held outside it (their decode tokens).

The trace: GSP-like (groups of requests sharing a system prompt, then their own question), a
fresh draw per seed. `cached` = the prefix tokens the admitting match found, summed.
Only our code is used here; the same driver, given another tree adapter, replays other trees.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from repro.kvcache import make_cache  # noqa: E402

CLIP_MAX_NEW = 4096  # CLIP_MAX_NEW_TOKENS_ESTIMATION
INIT_RATIO = 0.7  # global_config.default_init_new_token_ratio (schedule_conservativeness 1)
MIN_RATIO = INIT_RATIO * 0.14
RATIO_DECAY = (INIT_RATIO - MIN_RATIO) / 600


def gsp_trace(seed: int, n: int = 96, groups: int = 8, sys_len: int = 100, q_len: int = 100, out_len: int = 4):
    """[(prompt, output)] token lists: `groups` shared system prompts, each request its own question."""
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, 32000, sys_len).tolist() for _ in range(groups)]
    order = rng.permutation(np.arange(n) % groups)
    out = []
    for g in order:
        q = rng.integers(0, 32000, int(rng.integers(q_len // 2, q_len * 3 // 2 + 1))).tolist()
        out.append((systems[int(g)] + q, rng.integers(0, 32000, out_len).tolist()))
    return out


class OurTree:
    """The driver's view of our RadixCache."""

    def __init__(self, pool: int, eviction: dict, seed: int):
        self.cache = make_cache(pool, eviction, seed)

    def match(self, tokens):
        r = self.cache.match_prefix(tokens)
        return r.length, r.last_node

    def insert(self, tokens) -> int:
        return self.cache.insert(tokens).prefix_len

    def lock(self, node) -> None:
        self.cache.inc_lock_ref(node)

    def unlock(self, node) -> None:
        self.cache.dec_lock_ref(node)

    def evict(self, n: int) -> None:
        self.cache.evict(n)

    def size(self) -> int:
        return self.cache.total_size()

    def evictable(self) -> int:
        return self.cache.evictable_size()

    def phases(self) -> int:
        s = self.cache.stats()
        return int(s.get("rlt_phases", 0))


class _Req:
    __slots__ = ("prompt", "output", "max_new", "out", "prefix", "node")

    def __init__(self, prompt, output):
        self.prompt, self.output, self.max_new = prompt, output, len(output)
        self.out = 0  # output tokens generated
        self.prefix = 0
        self.node = None


def replay_046(tree, trace, pool: int, max_running: int | None = None, max_prefill: int = 16384) -> dict:
    """Serve `trace` on one 0.4.6-like scheduler over `tree` (module docstring); the counters."""
    max_running = max_running or pool // 2  # 0.4.6 tp_worker: max_total_num_tokens // 2
    waiting = [_Req(p, o) for p, o in trace]
    running: list[_Req] = []
    external = 0  # KV slots held outside the tree (running requests' decode tokens, a batch's extend)
    ratio = INIT_RATIO
    full = False
    cached = steps = 0
    hits = []  # each admitted request's cached prefix, in admission order

    def free() -> int:
        return pool - tree.size() - external

    def alloc(n: int) -> None:
        nonlocal external
        if free() < n:
            tree.evict(n)  # 0.4.6: the whole allocation, not the shortfall
        if free() < n:
            raise RuntimeError(f"out of memory: {n} slots asked, {free()} free")
        external += n

    def finish(r: _Req) -> None:
        nonlocal external
        key = r.prompt + r.output[: r.out - 1]
        tree.insert(key)
        external -= r.out - 1  # its decode tokens now belong to the tree (or were freed as duplicates)
        tree.unlock(r.node)

    while waiting or running:
        steps += 1
        batch: list[_Req] = []
        if waiting and not full and len(running) < max_running:
            offset = sum(min(r.max_new - r.out, CLIP_MAX_NEW) * ratio for r in running)
            cur_offset = 0
            rem_input = max_prefill
            for r in waiting:
                if len(running) + len(batch) >= max_running:
                    full = True
                    break
                r.prefix, r.node = tree.match(r.prompt[:-1])
                extend = len(r.prompt) - r.prefix
                total = extend + min(r.max_new, CLIP_MAX_NEW)
                if total >= free() + tree.evictable() - offset:
                    full = True
                    break
                if extend > rem_input and batch:
                    break
                tree.lock(r.node)
                if total > free() + tree.evictable() - offset:
                    tree.unlock(r.node)
                    full = True
                    break
                batch.append(r)
                offset += extend + min(r.max_new, CLIP_MAX_NEW)
                cur_offset += extend
                rem_input -= extend
                if free() + tree.evictable() - offset <= 0 or free() + tree.evictable() - cur_offset <= 0:
                    full = True
                    break
                if rem_input <= 0:
                    break
        elif len(running) >= max_running:
            full = True
        if batch:
            waiting = [r for r in waiting if r not in batch]
            alloc(sum(len(r.prompt) - r.prefix for r in batch))
            for r in batch:
                cached += r.prefix
                hits.append(r.prefix)
                r.out = 1
                if r.out >= r.max_new:
                    external -= len(r.prompt) - r.prefix
                    tree.insert(r.prompt)  # cache_finished_req with output[:-1] empty
                    tree.unlock(r.node)
                    continue
                tree.insert(r.prompt)  # cache_unfinished_req
                external -= len(r.prompt) - r.prefix
                _, node = tree.match(r.prompt)
                tree.unlock(r.node)
                tree.lock(node)
                r.node, r.prefix = node, len(r.prompt)
                running.append(r)
            continue
        if not running:
            raise RuntimeError("requests wait but none can be admitted (the pool is too small)")
        bs = len(running)
        alloc(bs)  # check_decode_mem, then alloc_token_slots: evict(bs) when short
        ratio = max(ratio - RATIO_DECAY, MIN_RATIO)
        still = []
        for r in running:
            r.out += 1
            if r.out >= r.max_new:
                finish(r)
            else:
                still.append(r)
        if len(still) < bs:
            full = False
        running = still
    return {"cached": cached, "phases": tree.phases(), "steps": steps, "hits": hits}


POLICIES = {
    "rlt_shipped": {"name": "rlt_shipped", "granularity": "node"},
    "rlt_node": {"name": "rlt", "granularity": "node"},
    "rlt_token": {"name": "rlt", "granularity": "token"},
    "lru": {"name": "lru", "granularity": "node"},
}


def table(rows: dict, seeds: int) -> str:
    """Markdown: per (kv, policy) the mean cached tokens (standard error) and mean phases."""
    lines = ["| KV tokens | policy | cached tokens, mean (s.e.) | phases, mean |", "|---|---|---|---|"]
    for (kv, name), vals in rows.items():
        c = [v["cached"] for v in vals]
        se = statistics.stdev(c) / len(c) ** 0.5 if len(c) > 1 else 0.0
        ph = statistics.fmean(v["phases"] for v in vals)
        lines.append(f"| {kv} | {name} | {statistics.fmean(c):,.0f} ({se:,.0f}) | {ph:.1f} |")
    return "\n".join(lines) + f"\n\n{seeds} seeds; seed s: trace seed s, tree seed s."


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--kv", type=int, nargs="+", default=[1200, 2400])
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--sys-len", type=int, default=100)
    ap.add_argument("--q-len", type=int, default=100)
    a = ap.parse_args(argv)
    rows: dict = {}
    for kv in a.kv:
        for name, cfg in POLICIES.items():
            rows[(kv, name)] = [replay_046(OurTree(kv, cfg, s), trace_of(a, s), kv) for s in range(a.seeds)]
    print(table(rows, a.seeds))


def trace_of(a, seed: int):
    return gsp_trace(seed, groups=a.groups, sys_len=a.sys_len, q_len=a.q_len)


if __name__ == "__main__":
    main()

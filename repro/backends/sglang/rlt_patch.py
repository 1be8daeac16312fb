"""RLT (Randomized Leaf Token, paper Algorithm 1) inside SGLang 0.5.23's RadixCache -- a patch, not a fork.

Two policies: `rlt` (our reconstruction, this docstring) and `rlt_shipped` (the authors' rules:
`rlt_shipped_patch.py`, whose strategy and eviction these hooks call).
`apply()` (idempotent, called at start-up by `repro.backends.sglang.server` in the server process
and, through the `spawn` start method, in every scheduler process) does four things:

1. registers `rlt` -> `RLTStrategy` and `rlt_shipped` -> `RLTShippedStrategy` in SGLang's
   eviction-policy name table (`sglang/srt/mem_cache/utils.py: _EVICTION_POLICY_FACTORIES`)
   and in the CLI choices of `--radix-eviction-policy`;
2. wraps `RadixCache` methods; each wrapper does nothing extra unless the cache's
   `eviction_strategy` is one of the two, so LRU/LFU/... caches behave exactly as before:
   * `match_prefix` / `insert`: mark every node of the accessed path (marking hook; rlt_shipped:
     an insert's path only, and `_match_prefix_helper` marks the upper part of a node it split);
   * `_split_node`: the new upper node inherits the split node's mark;
   * `_delete_leaf`: an evicted marked node takes its tokens out of the mark count;
   * `evict`: the phase check, then SGLang's own heap loop (see "Eviction" below; rlt_shipped:
     its own loop);
   * `reset` (flush): marks and counters start over;
3. registers the radix-cache backend `repro_radix` (`sglang/srt/mem_cache/registry.py`), whose
   factory builds SGLang's plain `RadixCache`. SGLang 0.5.23's *default* selection chain builds
   `UnifiedRadixCache` (a different tree with its own eviction loop, which these hooks do not
   reach), so the server entry point adds `--radix-cache-backend repro_radix` with `rlt`.

What the patched SGLang does (node granularity, as SGLang evicts)
-----------------------------------------------------------------
* Marks. A node is marked iff `node._rlt_phase == strategy.phase`, so clearing every mark is
  `phase += 1`. Every token SGLang accesses is marked: after `match_prefix` the matched path
  root..last_node, after `insert` the whole inserted path (cached prefix + new tokens). Marks
  are counted in tokens (`len(node.key)`). SGLang's match and insert already split the node
  where an access ends, so every access covers whole nodes and marks need no extra split:
  the patched tree has exactly the nodes the unpatched one has. A split node's two parts
  keep its mark. Marks live on cached tokens: evicting a marked node lowers the count (the
  project's decision, the same as `repro.kvcache.RLTEviction`; the paper does not say).
* Phase reset. B + 1 distinct marked tokens (B = the cache's token capacity) happen exactly
  when a miss needs room in a full cache whose cached tokens are all marked. SGLang evicts
  *before* it inserts the missed tokens, so the patch checks, before every victim, whether
  every cached token (`evictable_size + protected_size`) is marked and then starts a new
  phase. All marks are cleared: the "most recently accessed token" that the paper keeps marked
  is the missed token itself, not cached yet; the insert that follows marks it. In a live
  server the allocator also holds KV of running requests outside the tree, so there the reset
  is "no unmarked token left in the tree when an eviction is needed".
* Eviction. Victims are uniform among the UNMARKED evictable leaf nodes and are evicted whole;
  if no unmarked leaf is evictable (all locked or interior), the least recently used
  evictable leaf (`last_access_time`, SGLang's LRU clock) -- the fallback the paper leaves
  open. Priorities: `(0, key)` for unmarked, `(1, last_access_time)` for marked leaves, so
  every unmarked leaf sorts below every marked one. SGLang's `evict` computes all priorities
  once per call and then pops; to keep each pop uniform over the leaves present *at that
  moment* (a parent exposed mid-call included), keys are exponential clocks: a leaf present
  when the heap is built gets Exp(1), a parent exposed after its last child was popped gets
  (that child's key) + Exp(1) -- by memorylessness every pop is then a uniform draw. The
  phase check cannot run inside SGLang's loop, so `evict` calls it in chunks of at most the
  number of unmarked cached tokens: a chunk then ends at or before the moment all unmarked
  tokens are gone, and the next chunk checks the phase first.
* Randomness: a leaf's exponential clock is a hash of (seed, heap build since the last flush, the
  tokens on the leaf's path from the root) turned into Exp(1), not the next draw of a stream.
  SGLang builds its heap from `list(self.evictable_leaves)`, a set ordered by object address, so a
  stream's draws land on different leaves in every process: the same trace gave 9,300 / 8,700 /
  7,800 cached tokens on three fresh servers with one seed. SGLang's `TreeNode.id` is no cure:
  it counts the nodes a process ever made, flushes included. Keyed by path, the victims depend
  only on the seed and the sequence of cache calls: same seed, same trace, same evictions, across
  restarts and after `/flush_cache` (which restarts the heap-build count). The generated tokens
  enter the tree too, so they must repeat: the benchmark client sends temperature 0 (as
  sglang.bench_serving does); with sampling, LRU repeats (it reads times, not tokens), RLT does not.
  `seed` comes from `--radix-eviction-policy-config '{"seed": S}'` (default 0). With tensor
  parallelism every rank holds its own tree and must evict identically: they do, as they share
  the seed and see the same calls.
* Evidence in the server log: every eviction through the patched cache logs one line
  `repro-radix evict: policy=<lru|rlt> asked=N evicted=M total=T` (+ RLT's counters:
  `random=R fallback=F resets=X phase=P`); `eviction_log_stats(log_text)` parses the last one.

How it differs from our tree's node-granularity RLT (`repro.kvcache.RLTEviction`)
---------------------------------------------------------------------------------
Same marks, phase rule, victim distribution and fallback on the same sequence of bulk verbs
(match / insert / lock / evict). Differences: (1) the random streams (same distribution, not
the same draws); (2) SGLang stamps `last_access_time` on the whole node a match or insert
walks into, including the part after the access boundary that the split leaves unaccessed,
whereas our tree stamps accessed tokens only -- this changes the LRU *fallback* order, never
the uniform draws; (3) our replayer's token-by-token `process_path` can start a new phase in
the middle of a missed run; SGLang has no such verb (it inserts a request's tokens in bulk).

LRU: SGLang's `lru` is leaf LRU over `last_access_time`, our L-LRU up to difference (2), which
tests/sglang/test_parity.py pins down (identical on random sequences with SGLang's stamping
emulated on our tree; hit rate 0.4237 vs 0.4219 on the GSP trace without it).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import math
import re
from array import array

import numpy as np

from repro.backends.sglang import rlt_shipped_patch as shipped
from repro.kvcache import RLTEviction

logger = logging.getLogger(__name__)

RLT_POLICY_NAME = RLTEviction.name  # the registry's name (repro.kvcache.eviction_policies()), not a copy
RLT_SHIPPED_NAME = shipped.RLT_SHIPPED_NAME  # RLT as the authors shipped it (rlt_shipped_patch.py)
PATCHED_POLICY_NAMES = (RLT_POLICY_NAME, RLT_SHIPPED_NAME)  # the policies this patch adds to SGLang
RADIX_BACKEND_NAME = "repro_radix"

_applied = False


def _sglang():
    """Import the SGLang modules the patch touches (lazily: importing this module is cheap)."""
    from sglang.srt.arg_groups import choices
    from sglang.srt.mem_cache import base_prefix_cache, evict_policy, radix_cache, registry, utils

    return choices, base_prefix_cache, evict_policy, radix_cache, registry, utils


def _strategy_base():
    from sglang.srt.mem_cache.evict_policy import EvictionStrategy

    return EvictionStrategy


def _make_strategy_class():
    EvictionStrategy = _strategy_base()

    class RLTStrategy(EvictionStrategy):
        """RLT's priorities and mark state for one SGLang `RadixCache` (see the module docstring).

        Config (`--radix-eviction-policy-config`): `seed` (int, default 0).
        Counters: `phase`, `resets`, `marked_tokens`, `random_evicted_tokens`,
        `fallback_evicted_tokens`.
        """

        name = RLT_POLICY_NAME

        def __init__(self, seed: int = 0):
            if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
                raise ValueError(f"rlt: 'seed' must be an int, got {seed!r}")
            self.seed = int(seed)
            self._seed_hash = _mix64(self.seed & _MASK64)
            self.clear()

        def clear(self) -> None:
            """Fresh state (a new or flushed cache): phase 1, nothing marked."""
            self.phase = 1  # nodes start with _rlt_phase 0: unmarked
            self.marked_tokens = 0
            self.resets = 0
            self.random_evicted_tokens = 0
            self.fallback_evicted_tokens = 0
            self._epoch = 0  # one per heap build inside SGLang's evict

        # -- marks
        def is_marked(self, node) -> bool:
            return node._rlt_phase == self.phase

        def mark_path(self, node, root) -> None:
            """Mark root..node. A marked node's ancestors are marked (marks are only ever set on
            whole root paths, and a reset clears all), so the walk stops at the first marked one."""
            phase = self.phase
            while node is not root and node is not None and node._rlt_phase != phase:
                node._rlt_phase = phase
                self.marked_tokens += len(node.key)
                node = node.parent

        def reset_phase(self) -> None:
            self.phase += 1
            self.marked_tokens = 0
            self.resets += 1

        def on_delete(self, node) -> None:
            n = len(node.key)
            if node._rlt_phase == self.phase:
                self.marked_tokens -= n
                self.fallback_evicted_tokens += n
            else:
                self.random_evicted_tokens += n

        # -- priorities
        def begin_evict(self) -> None:
            """A new heap is about to be built: keys of earlier heaps no longer count."""
            self._epoch += 1

        def get_priority(self, node):
            if node._rlt_phase == self.phase:
                return (1, node.last_access_time)
            epoch = self._epoch
            floor = node._rlt_floor if node._rlt_floor_epoch == epoch else 0.0
            key = floor + _exp1(self._seed_hash, epoch, _path_id(node))
            parent = node.parent
            if parent is not None and (parent._rlt_floor_epoch != epoch or parent._rlt_floor < key):
                # the parent becomes a leaf only after all its children were popped, the last
                # of which had the largest key: the parent's clock starts there
                parent._rlt_floor = key
                parent._rlt_floor_epoch = epoch
            return (0, key)

        def stats(self) -> dict:
            return {
                "rlt_phase": self.phase,
                "rlt_resets": self.resets,
                "rlt_marked_tokens": self.marked_tokens,
                "rlt_random_evicted_tokens": self.random_evicted_tokens,
                "rlt_fallback_evicted_tokens": self.fallback_evicted_tokens,
            }

    return RLTStrategy


RLTStrategy = None  # the class, built by apply() (it subclasses SGLang's EvictionStrategy)
RLTShippedStrategy = None  # likewise, for rlt_shipped

_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a bijective 64-bit mix (Steele, Lea & Flood 2014)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _exp1(seed_hash: int, epoch: int, node_id: int) -> float:
    """An Exp(1) variate that is a function of (seed, heap build, node): order-free randomness."""
    u = (_mix64(_mix64(seed_hash ^ (epoch & _MASK64)) ^ (node_id & _MASK64)) >> 11) * 2.0**-53  # [0, 1)
    return -math.log1p(-u)


def _path_id(node) -> int:
    """64 bits of blake2b over the tokens from the root to the end of `node` (and its namespace keys).

    A node's full path never changes (a split puts a new node above it, the path to its end stays),
    so the value is computed once and kept on the node. It depends on the tree's content only: not on
    the process, the allocation order or what the cache held before a flush (SGLang's TreeNode.id, a
    per-process creation counter, would)."""
    cached = node._rlt_path_id
    if cached is not None:
        return cached
    parts = []
    n = node
    while n is not None and n.parent is not None:  # the root has no parent and no tokens
        k = n.key
        ids = k.token_ids if k.limit is None else k.token_ids[: k.limit]
        parts.append(ids if isinstance(ids, array) else array("q", ids))
        n = n.parent
    digest = hashlib.blake2b(digest_size=8)
    k = node.key
    digest.update(repr((k.extra_key, k.cache_salt)).encode())
    for ids in reversed(parts):
        digest.update(ids.tobytes() if ids.typecode == "q" else array("q", ids).tobytes())
    node._rlt_path_id = int.from_bytes(digest.digest(), "little")
    return node._rlt_path_id


EVICT_LOG_PREFIX = "repro-radix evict:"
_EVICT_LOG_RE = re.compile(re.escape(EVICT_LOG_PREFIX) + r"((?: \w+=\S+)+)")


def eviction_log_stats(log_text: str) -> dict | None:
    """The counters of the last eviction line in a server log (None: the cache never evicted)."""
    last = None
    for m in _EVICT_LOG_RE.finditer(log_text):
        last = m.group(1)
    if last is None:
        return None
    out: dict = {}
    for item in last.split():
        k, _, v = item.partition("=")
        out[k] = int(v) if v.lstrip("-").isdigit() else v
    return out


def _is_rlt(cache) -> bool:
    return RLTStrategy is not None and isinstance(getattr(cache, "eviction_strategy", None), RLTStrategy)


def _is_shipped(cache) -> bool:
    return RLTShippedStrategy is not None and isinstance(getattr(cache, "eviction_strategy", None), RLTShippedStrategy)


def _patch_radix_cache(radix_cache_mod, base_prefix_cache_mod) -> None:
    RadixCache = radix_cache_mod.RadixCache
    TreeNode = radix_cache_mod.TreeNode
    EvictResult = base_prefix_cache_mod.EvictResult

    # class-level defaults: every node (old or new, any policy) reads as unmarked
    TreeNode._rlt_phase = 0
    TreeNode._rlt_floor = 0.0
    TreeNode._rlt_floor_epoch = -1
    TreeNode._rlt_path_id = None  # _path_id's memo
    RadixCache._rlt_split = None  # rlt_shipped: the upper node of the latest split

    orig_match = RadixCache.match_prefix
    orig_match_helper = RadixCache._match_prefix_helper
    orig_insert = RadixCache.insert
    orig_split = RadixCache._split_node
    orig_delete = RadixCache._delete_leaf
    orig_evict = RadixCache.evict
    orig_reset = RadixCache.reset

    @functools.wraps(orig_match)
    def match_prefix(self, params):
        result = orig_match(self, params)
        if _is_rlt(self) and result.device_prefix_len > 0:
            self.eviction_strategy.mark_path(result.last_device_node, self.root_node)
        return result

    @functools.wraps(orig_match_helper)
    def _match_prefix_helper(self, node, key):
        if not _is_shipped(self):
            return orig_match_helper(self, node, key)
        self._rlt_split = None
        value, last = orig_match_helper(self, node, key)
        if self._rlt_split is last:  # rlt_shipped: a match marks the upper part of a node it split
            self.eviction_strategy.touch(self, last)
        self._rlt_split = None
        return value, last

    @functools.wraps(orig_insert)
    def insert(self, params):
        result = orig_insert(self, params)
        if result.last_device_node is not None:
            if _is_rlt(self):
                self.eviction_strategy.mark_path(result.last_device_node, self.root_node)
            elif _is_shipped(self):
                shipped.mark_inserted(self, self.eviction_strategy, result.last_device_node)
        return result

    @functools.wraps(orig_split)
    def _split_node(self, key, child, split_len):
        new_node = orig_split(self, key, child, split_len)
        if _is_rlt(self) or _is_shipped(self):
            new_node._rlt_phase = child._rlt_phase
            self._rlt_split = new_node
        return new_node

    @functools.wraps(orig_delete)
    def _delete_leaf(self, node):
        if _is_rlt(self):
            self.eviction_strategy.on_delete(node)
        return orig_delete(self, node)

    @functools.wraps(orig_evict)
    def evict(self, params):
        if self.disable:
            return orig_evict(self, params)
        if _is_shipped(self):
            strategy = self.eviction_strategy
            evicted = shipped.evict(self, strategy, params.num_tokens)
            if evicted:
                self._repro_evicted_total = getattr(self, "_repro_evicted_total", 0) + evicted
                logger.info(
                    "%s policy=%s asked=%d evicted=%d total=%d resets=%d phase=%d",
                    EVICT_LOG_PREFIX,
                    RLT_SHIPPED_NAME,
                    params.num_tokens,
                    evicted,
                    self._repro_evicted_total,
                    strategy.resets,
                    strategy.phase,
                )
            return EvictResult(num_tokens_evicted=evicted)
        if not _is_rlt(self):
            result = orig_evict(self, params)
            if getattr(self, "_repro_log_evictions", False) and result.num_tokens_evicted:
                self._repro_evicted_total = getattr(self, "_repro_evicted_total", 0) + result.num_tokens_evicted
                logger.info(
                    "%s policy=%s asked=%d evicted=%d total=%d",
                    EVICT_LOG_PREFIX,
                    self.eviction_policy,
                    params.num_tokens,
                    result.num_tokens_evicted,
                    self._repro_evicted_total,
                )
            return result
        strategy = self.eviction_strategy
        remaining = params.num_tokens
        evicted = 0
        while remaining > 0:
            total = self.evictable_size_ + self.protected_size_
            if total <= 0:
                break
            if strategy.marked_tokens >= total:
                strategy.reset_phase()  # the missed token would be the (B+1)-th marked one
            chunk = min(remaining, total - strategy.marked_tokens)
            strategy.begin_evict()
            got = orig_evict(self, dataclasses.replace(params, num_tokens=chunk)).num_tokens_evicted
            if got <= 0:
                break  # nothing evictable left
            evicted += got
            remaining -= got
        if evicted:
            self._repro_evicted_total = getattr(self, "_repro_evicted_total", 0) + evicted
            logger.info(
                "%s policy=%s asked=%d evicted=%d total=%d random=%d fallback=%d resets=%d phase=%d",
                EVICT_LOG_PREFIX,
                RLT_POLICY_NAME,
                params.num_tokens,
                evicted,
                self._repro_evicted_total,
                strategy.random_evicted_tokens,
                strategy.fallback_evicted_tokens,
                strategy.resets,
                strategy.phase,
            )
        return EvictResult(num_tokens_evicted=evicted)

    @functools.wraps(orig_reset)
    def reset(self):
        orig_reset(self)
        self._repro_evicted_total = 0  # the evidence line counts since the start or the last flush
        if _is_rlt(self) or _is_shipped(self):
            self.eviction_strategy.clear()

    for name, fn in (
        ("match_prefix", match_prefix),
        ("_match_prefix_helper", _match_prefix_helper),
        ("insert", insert),
        ("_split_node", _split_node),
        ("_delete_leaf", _delete_leaf),
        ("evict", evict),
        ("reset", reset),
    ):
        fn.__repro_rlt_patch__ = True
        setattr(RadixCache, name, fn)


def _radix_cache_factory(ctx):
    """`--radix-cache-backend repro_radix`: SGLang's plain RadixCache (where the RLT hooks live)."""
    from sglang.srt.mem_cache.radix_cache import RadixCache

    if str(ctx.params.eviction_policy).lower() == RLT_SHIPPED_NAME and ctx.params.page_size != 1:
        raise ValueError(
            f"--radix-eviction-policy {RLT_SHIPPED_NAME} evicts one token per draw: it needs --page-size 1"
        )
    cache = RadixCache(ctx.params)
    cache._repro_log_evictions = True  # the evidence line, for every policy on this backend
    return cache


def apply() -> None:
    """Patch SGLang in this process (idempotent). Call before SGLang builds its caches."""
    global _applied, RLTStrategy, RLTShippedStrategy
    if _applied:
        return
    choices, base_prefix_cache, _evict_policy, radix_cache, registry, utils = _sglang()
    if RLTStrategy is None:
        RLTStrategy = _make_strategy_class()
    if RLTShippedStrategy is None:
        RLTShippedStrategy = shipped.make_strategy_class(_strategy_base())
    if not getattr(radix_cache.RadixCache.match_prefix, "__repro_rlt_patch__", False):
        _patch_radix_cache(radix_cache, base_prefix_cache)
    utils._EVICTION_POLICY_FACTORIES.setdefault(RLT_POLICY_NAME, RLTStrategy)
    utils._EVICTION_POLICY_FACTORIES.setdefault(RLT_SHIPPED_NAME, RLTShippedStrategy)
    for name in PATCHED_POLICY_NAMES:
        if name not in choices.RADIX_EVICTION_POLICY_CHOICES:
            choices.add_radix_eviction_policy_choices([name])
    if registry.get_radix_cache_factory(RADIX_BACKEND_NAME) is None:
        registry.register_radix_cache_backend(RADIX_BACKEND_NAME, _radix_cache_factory)
    _applied = True
    logger.info(
        "repro: RLT patch applied (eviction policy %r, radix-cache backend %r)", RLT_POLICY_NAME, RADIX_BACKEND_NAME
    )


def patch_state() -> dict:
    """What this process sees: is `rlt` registered, are the hooks and the backend in place."""
    from sglang.srt.arg_groups import choices
    from sglang.srt.mem_cache import radix_cache, registry, utils

    import os

    return {
        "pid": os.getpid(),
        "rlt_in_name_table": all(n in utils._EVICTION_POLICY_FACTORIES for n in PATCHED_POLICY_NAMES),
        "rlt_in_cli_choices": all(n in choices.RADIX_EVICTION_POLICY_CHOICES for n in PATCHED_POLICY_NAMES),
        "radix_backend_registered": registry.get_radix_cache_factory(RADIX_BACKEND_NAME) is not None,
        "radix_cache_hooked": bool(getattr(radix_cache.RadixCache.match_prefix, "__repro_rlt_patch__", False)),
    }


def _report_patch_state(conn) -> None:
    """Target of the spawned probe process (a library function, like SGLang's run_scheduler_process)."""
    try:
        conn.send(patch_state())
    except BaseException as exc:  # report, never hang the parent
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        conn.close()


def spawn_check(timeout_s: float = 300.0) -> dict:
    """Start a child the way SGLang 0.5.23's engine starts its schedulers and return its patch_state().

    `sglang/srt/entrypoints/engine.py` calls `mp.set_start_method("spawn", force=True)` and then
    `mp.Process(target=run_scheduler_process, ...).start()`. A spawned child re-imports the
    parent's main module as `__mp_main__` before it unpickles its target, so whatever that
    module does at import time (here: `apply()`) happens in the child too.
    """
    import multiprocessing as mp

    mp.set_start_method("spawn", force=True)
    reader, writer = mp.Pipe(duplex=False)
    proc = mp.Process(target=_report_patch_state, args=(writer,))
    proc.start()
    writer.close()
    try:
        if not reader.poll(timeout_s):
            raise TimeoutError(f"the spawned probe sent nothing within {timeout_s:.0f} s")
        state = reader.recv()
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    state["parent"] = patch_state()
    return state

"""A slow, direct re-statement of the simulator's semantics (docs/ALGORITHMS.md §7), for tests.

Every scheduler mode: the switches off, and SGLang's exact admission arithmetic with either chunk
insertion (the default: per_chunk), the in-batch rule and ranking by match. No incremental
bookkeeping: every step recomputes the running batch, its context, which requests finish, and
which tree tokens are not computed yet (kept as a set of token-prefix tuples) from per-request
state; no peek caching, no walk-free verbs, no strategy objects. The fast SimCluster must produce
identical records and router views.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field

import numpy as np

from repro.sim.scheduler_config import NO_CHUNK_LIMIT, SchedulerConfig


@dataclass
class _Req:
    req: object
    prompt: tuple
    full: tuple
    out: int
    worker: int = -1
    phase: str = "new"  # new | waiting | prefill | running | done
    hit: int = 0
    c0: int = 0
    n_total: int = 0
    prefilled: int = 0
    generated: int = 0
    node: object = None
    prefill_start: float = math.nan  # start of the first step that prefills it
    first: float = math.nan
    finish: float = math.nan


@dataclass
class _Worker:
    cache: object
    queue: list = field(default_factory=list)
    chunked: int | None = None
    reserved: int = 0
    running: list = field(default_factory=list)  # SGLang's running batch: in the order requests joined it
    uncomputed: set = field(default_factory=set)
    alloc: int = 0  # per_chunk: KV allocated by the running prefill step, in the tree when it ends
    step: object = None  # ("prefill", [(i, n)]) or ("decode", [i...]) while busy
    end: float = math.inf
    start_seq: int = -1


def reference_simulate(requests, caches, cost_model, router, sched: SchedulerConfig, router_seed: int):
    R = [
        _Req(r, tuple(int(x) for x in r.prompt_tokens), tuple(int(x) for x in r.full_tokens), int(r.output_len))
        for r in requests
    ]
    W = [_Worker(c) for c in caches]
    chunk = sched.chunk_limit
    exact = sched.exact_budgets
    rank_match = sched.lpm_rank_access == "match"
    per_chunk = sched.chunk_insertion == "per_chunk"

    class View:  # the router-visible state, recomputed from scratch on every read
        def __init__(self, k):
            self.worker_id = k

        def _mine(self, *phases):
            return [q for q in R if q.worker == self.worker_id and q.phase in phases]

        @property
        def waiting(self):
            return len(self._mine("waiting"))

        @property
        def running(self):
            return len(self._mine("running"))

        @property
        def in_flight(self):
            return len(self._mine("waiting", "prefill", "running"))

        # KV a request holds: its prompt, then one token per decode step (the token fed); the
        # last sampled token is never fed (SGLang: kv_committed_len = prompt + output - 1 at the end)
        @property
        def active_kv_tokens(self):
            return sum(len(q.prompt) + max(q.generated - 1, 0) for q in self._mine("prefill", "running"))

        @property
        def kv_used_tokens(self):
            w = W[self.worker_id]
            return w.cache.total_size() + w.alloc + sum(q.generated - 1 for q in self._mine("running"))

        @property
        def kv_capacity_tokens(self):
            return W[self.worker_id].cache.capacity_tokens

    views = [View(k) for k in range(len(W))]
    router.reset(views, router_seed)

    def computed_hit(w, prompt):
        p = w.cache.peek_prefix(np.array(prompt, dtype=np.int32))
        for j in range(1, p + 1):
            if prompt[:j] in w.uncomputed:
                return j - 1
        return p

    def rank(w):
        """The queue's order at a pass (SGLang's calc_priority with the switches; plain lpm without them)."""
        order = list(w.queue)
        if sched.schedule_policy != "lpm" or len(order) > sched.lpm_max_queue:
            return order
        if not (sched.in_batch_prefix_caching or rank_match or exact):  # plain lpm: read-only peeks
            if len(order) >= 2:
                hits = {i: computed_hit(w, R[i].prompt) for i in order}
                order.sort(key=lambda i: -hits[i])
            return order
        if len(order) < 2 and not rank_match:
            return order
        keys, seen = {}, set()
        for i in order:  # in queue order: the matches are accesses, the in-batch rule looks back
            q = R[i]
            if rank_match:
                w.cache.match_prefix(np.array(q.prompt, dtype=np.int32))
            h = computed_hit(w, q.prompt)
            k = -h
            if exact and h >= len(q.prompt):  # SGLang's match is capped at len - 1
                k = 1 - len(q.prompt)
            if sched.in_batch_prefix_caching and h <= 32 and len(q.prompt) >= 32:
                # a short hit that shares its first 32 tokens with an earlier such request goes last
                if q.prompt[:32] in seen:
                    k = sys.maxsize
                seen.add(q.prompt[:32])
            keys[i] = k
        order.sort(key=lambda i: keys[i])
        if exact:  # SGLang sorts its queue in place: the order persists
            w.queue = list(order)
        return order

    def admit_plain(w, q, key, p):
        """Match, lock, evict, insert the prompt, one request at a time; False if it cannot fit."""
        cap = w.cache.capacity_tokens
        P = len(q.prompt)
        need = P - p + q.out
        free = cap - w.cache.total_size() - w.reserved
        if need <= free:
            w.cache.match_prefix(key)
            q.node = w.cache.insert(key).last_node
            w.cache.inc_lock_ref(q.node)
        else:
            ev = w.cache.evictable_size()
            if need > free + ev:
                return False
            unsure = need > free + ev - p
            m = w.cache.match_prefix(key)
            w.cache.inc_lock_ref(m.last_node)
            need = P - m.length + q.out
            if unsure and need > free + w.cache.evictable_size():
                w.cache.dec_lock_ref(m.last_node)
                return False
            w.cache.evict(need - free)
            assert cap - w.cache.total_size() - w.reserved >= need
            q.node = w.cache.insert(key).last_node
            w.cache.inc_lock_ref(q.node)
            w.cache.dec_lock_ref(m.last_node)
        w.reserved += q.out
        return True

    def commit_exact(w, admitted, phys):
        """SGLang allocates the batch: one eviction for the shortfall, then the prompts (whole) or
        only what the step computes (per_chunk: the prompts enter the tree when the step ends)."""
        cap = w.cache.capacity_tokens
        free = cap - w.cache.total_size() - w.reserved
        if phys > free:
            w.cache.evict(phys - free)
            assert cap - w.cache.total_size() - w.reserved >= phys
        if per_chunk:
            outs = sum(R[i].out for i in admitted)
            w.reserved += outs
            w.alloc = phys - outs
            return
        for i in admitted:
            q = R[i]
            node = w.cache.insert(np.array(q.prompt, dtype=np.int32)).last_node
            w.cache.inc_lock_ref(node)
            w.cache.dec_lock_ref(q.node)
            q.node = node
            w.reserved += q.out

    def form_batch(w):
        cap = w.cache.capacity_tokens
        rem_chunk, rem_input = chunk, sched.max_prefill_tokens
        n_running = sum(1 for q in R if q.phase == "running" and W[q.worker] is w)
        slots = sched.max_running_requests - n_running
        batch = []
        admitted = []
        extra = phys = 0  # exact: SGLang's reservations of this pass not yet in our tree; KV it allocates
        if w.chunked is not None:
            q = R[w.chunked]
            rest = q.n_total - q.prefilled
            n = min(rest, rem_chunk)
            batch.append((w.chunked, n))
            rem_chunk -= n
            rem_input -= n
            # SGLang reserves the chunk + 1 page, the output with the last chunk
            extra = n + 1 + (q.out if n == rest else 0) - q.out
            if per_chunk:
                phys = n
            else:
                extra -= rest  # our tree holds the rest already
        order = None
        if w.queue and (exact or rank_match) and (slots > 0 or w.chunked is not None):
            order = rank(w)  # SGLang ranks at every pass
        if w.queue and rem_chunk > 0 and rem_input > 0 and len(batch) < slots:
            if order is None:
                order = rank(w)
            for i in order:
                if len(batch) >= slots or rem_chunk <= 0 or rem_input <= 0:
                    break
                q = R[i]
                P = len(q.prompt)
                key = np.array(q.prompt, dtype=np.int32)
                p = w.cache.peek_prefix(key)
                h = computed_hit(w, q.prompt)
                c0 = min(h, P - 1)
                n_total = P - c0
                if exact:
                    if chunk == NO_CHUNK_LIMIT and batch and n_total >= rem_input:
                        break
                    want = P - c0 + q.out + 1 + extra
                    new = max(P - p, 1)  # a fully cached prompt recomputes its last token: one new slot
                    if per_chunk:
                        new = min(new, rem_chunk)
                    phys_i = phys + new + q.out
                    node = w.cache.match_prefix(key[: P - 1]).last_node
                    w.cache.inc_lock_ref(node)
                    room = cap - w.cache.total_size() - w.reserved + w.cache.evictable_size()
                    if want >= room or phys_i > room:
                        w.cache.dec_lock_ref(node)
                        break
                    q.node, phys = node, phys_i
                    extra += P - c0 + 1 + q.out
                else:
                    if batch and n_total >= rem_input:
                        break
                    if not admit_plain(w, q, key, p):
                        break
                admitted.append(i)
                w.queue.remove(i)
                q.phase, q.hit, q.c0, q.n_total, q.prefilled = "prefill", h, c0, n_total, 0
                for j in range(h + 1, P + 1):
                    w.uncomputed.add(q.prompt[:j])
                n = min(n_total, rem_chunk)
                batch.append((i, n))
                rem_chunk -= n
                rem_input -= n
                if n < n_total:
                    break
        if exact and (admitted or (per_chunk and w.chunked is not None)):
            commit_exact(w, admitted, phys)
        return batch

    def start(w, now, seq):
        batch = form_batch(w)
        if batch:
            for i, _ in batch:
                if math.isnan(R[i].prefill_start):
                    R[i].prefill_start = now
            tokens = sum(n for _, n in batch)
            attn = 0.0
            for i, n in batch:
                attn += n * (R[i].c0 + R[i].prefilled + n / 2)
            dur = cost_model.step_time_s(tokens, attn, 0, 0)
            w.step = ("prefill", batch)
        else:
            running = list(w.running)
            if not running:
                return False
            ctx = sum(len(R[i].prompt) + R[i].generated for i in running)
            dur = cost_model.step_time_s(0, 0.0, len(running), ctx)
            w.step = ("decode", running)
        w.end = now + dur
        w.start_seq = seq
        return True

    def finish(w, i, now, finished):
        q = R[i]
        w.reserved -= q.out
        w.cache.insert(np.array(q.full[: len(q.full) - 1], dtype=np.int32))  # prompt + output - 1
        w.cache.dec_lock_ref(q.node)
        q.phase, q.finish = "done", now
        finished.append(i)

    def end(w, now):
        kind, items = w.step
        finished = []
        if kind == "prefill":
            w.chunked = None
            w.alloc = 0
            for i, n in items:
                q = R[i]
                q.prefilled += n
                if per_chunk:  # the prompt as far as computed into the tree, the lock moved to its end
                    node = w.cache.insert(np.array(q.prompt[: q.c0 + q.prefilled], dtype=np.int32)).last_node
                    w.cache.inc_lock_ref(node)
                    w.cache.dec_lock_ref(q.node)
                    q.node = node
                if q.prefilled < q.n_total:
                    w.chunked = i
                    continue
                q.first, q.generated, q.phase = now, 1, "running"
                if q.out == 1:
                    finish(w, i, now, finished)
                else:
                    w.running.append(i)
            w.uncomputed = set()
            if w.chunked is not None and not per_chunk:  # per_chunk: its uncomputed rest is not in the tree
                q = R[w.chunked]
                for j in range(q.c0 + q.prefilled + 1, len(q.prompt) + 1):
                    w.uncomputed.add(q.prompt[:j])
        else:
            for i in items:
                R[i].generated += 1
                if R[i].generated == R[i].out:
                    w.running.remove(i)
                    finish(w, i, now, finished)
        w.step, w.end = None, math.inf
        return finished

    ai, seq = 0, 0
    while True:
        t_arr = R[ai].req.arrival_s if ai < len(R) else math.inf
        t_end = min(w.end for w in W)
        now = min(t_arr, t_end)
        if now == math.inf:
            break
        touched = []
        for k in sorted((k for k in range(len(W)) if W[k].end == now), key=lambda k: W[k].start_seq):
            for i in end(W[k], now):
                q = R[i]
                router.on_request_complete(q.req, k, q.finish - q.req.arrival_s, q.first - q.req.arrival_s, q.hit, now)
            touched.append(k)
        while ai < len(R) and R[ai].req.arrival_s == now:
            q = R[ai]
            k = int(router.select_worker(q.req, views, now))
            q.worker, q.phase = k, "waiting"
            W[k].queue.append(ai)
            touched.append(k)
            ai += 1
        for k in dict.fromkeys(touched):
            if W[k].step is None and start(W[k], now, seq):
                seq += 1
    assert all(q.phase == "done" for q in R)
    return {
        "worker": [q.worker for q in R],
        "first_token_s": [q.first for q in R],
        "finish_s": [q.finish for q in R],
        "queue_wait_s": [q.prefill_start - q.req.arrival_s for q in R],
        "prefill_s": [q.first - q.prefill_start for q in R],
        "decode_s": [q.finish - q.first for q in R],
        "cached_tokens": [q.hit for q in R],
    }

"""A slow, direct re-statement of the simulator's semantics (repro/sim docstrings), for tests.

No incremental bookkeeping: every step recomputes the running batch, its context, which
requests finish, and which tree tokens are not computed yet (kept as a set of token-prefix
tuples) from per-request state. The fast SimCluster must produce identical records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from repro.sim.worker import SchedulerConfig


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
    first: float = math.nan
    finish: float = math.nan


@dataclass
class _Worker:
    cache: object
    queue: list = field(default_factory=list)
    chunked: int | None = None
    reserved: int = 0
    uncomputed: set = field(default_factory=set)
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

        @property
        def active_kv_tokens(self):
            return sum(len(q.prompt) + q.generated for q in self._mine("prefill", "running"))

        @property
        def kv_used_tokens(self):
            return W[self.worker_id].cache.total_size() + sum(q.generated for q in self._mine("running"))

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

    def form_batch(w):
        cap = w.cache.capacity_tokens
        rem_chunk, rem_input = chunk, sched.max_prefill_tokens
        n_running = sum(1 for q in R if q.phase == "running" and W[q.worker] is w)
        slots = sched.max_running_requests - n_running
        batch = []
        if w.chunked is not None:
            q = R[w.chunked]
            n = min(q.n_total - q.prefilled, rem_chunk)
            batch.append((w.chunked, n))
            rem_chunk -= n
            rem_input -= n
        if not w.queue or rem_chunk <= 0 or rem_input <= 0 or len(batch) >= slots:
            return batch
        order = list(w.queue)
        if sched.schedule_policy == "lpm" and 2 <= len(order) <= sched.lpm_max_queue:
            hits = {i: computed_hit(w, R[i].prompt) for i in order}
            order.sort(key=lambda i: -hits[i])
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
            if batch and n_total >= rem_input:
                break
            need = P - p + q.out
            free = cap - w.cache.total_size() - w.reserved
            if need <= free:
                w.cache.match_prefix(key)
                q.node = w.cache.insert(key).last_node
                w.cache.inc_lock_ref(q.node)
            else:
                ev = w.cache.evictable_size()
                if need > free + ev:
                    break
                unsure = need > free + ev - p
                m = w.cache.match_prefix(key)
                w.cache.inc_lock_ref(m.last_node)
                need = P - m.length + q.out
                if unsure and need > free + w.cache.evictable_size():
                    w.cache.dec_lock_ref(m.last_node)
                    break
                w.cache.evict(need - free)
                assert cap - w.cache.total_size() - w.reserved >= need
                q.node = w.cache.insert(key).last_node
                w.cache.inc_lock_ref(q.node)
                w.cache.dec_lock_ref(m.last_node)
            w.reserved += q.out
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
        return batch

    def start(w, now, seq):
        batch = form_batch(w)
        if batch:
            tokens = sum(n for _, n in batch)
            attn = 0.0
            for i, n in batch:
                attn += n * (R[i].c0 + R[i].prefilled + n / 2)
            dur = cost_model.step_time_s(tokens, attn, 0, 0)
            w.step = ("prefill", batch)
        else:
            running = [i for i, q in enumerate(R) if q.phase == "running" and W[q.worker] is w]
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
        w.cache.insert(np.array(q.full, dtype=np.int32))
        w.cache.dec_lock_ref(q.node)
        q.phase, q.finish = "done", now
        finished.append(i)

    def end(w, now):
        kind, items = w.step
        finished = []
        if kind == "prefill":
            w.chunked = None
            for i, n in items:
                q = R[i]
                q.prefilled += n
                if q.prefilled < q.n_total:
                    w.chunked = i
                    continue
                q.first, q.generated, q.phase = now, 1, "running"
                if q.out == 1:
                    finish(w, i, now, finished)
            w.uncomputed = set()
            if w.chunked is not None:
                q = R[w.chunked]
                for j in range(q.c0 + q.prefilled + 1, len(q.prompt) + 1):
                    w.uncomputed.add(q.prompt[:j])
        else:
            for i in items:
                R[i].generated += 1
                if R[i].generated == R[i].out:
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
        "cached_tokens": [q.hit for q in R],
    }

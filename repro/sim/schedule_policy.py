"""The waiting queue's order at a prefill pass (SGLang's `SchedulePolicy.calc_priority`), one class per mode.

`make_schedule_policy` picks the class once per worker; docs/ALGORITHMS.md §7 has the rules.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from repro.kvcache.keys import TOKEN_BYTES, key_prefix
from repro.sim.scheduler_config import IN_BATCH_CHECK_THRESHOLD, IN_BATCH_DEPRIORITIZE_THRESHOLD, SchedulerConfig

if TYPE_CHECKING:  # pragma: no cover
    from repro.sim.worker import SimWorker

_IN_BATCH_HEAD_BYTES = IN_BATCH_DEPRIORITIZE_THRESHOLD * TOKEN_BYTES


class FcfsPolicy:
    """fcfs: the queue's (arrival) order."""

    rank_nodes: dict[int, Any] | None = None  # never matches while ranking

    def __init__(self, worker: "SimWorker", config: SchedulerConfig):
        self.w = worker

    def ranked(self) -> list[int]:
        return self.w.waiting


class LpmPolicy:
    """lpm with every SGLang-exact switch off: longest computed hit first (read-only peeks), ties in
    arrival order; more than `lpm_max_queue` waiting: fcfs."""

    rank_nodes: dict[int, Any] | None = None

    def __init__(self, worker: "SimWorker", config: SchedulerConfig):
        self.w = worker
        self.max_queue = config.lpm_max_queue

    def ranked(self) -> list[int]:
        w = self.w
        q = w.waiting
        if len(q) > self.max_queue or len(q) < 2:
            return q
        est = w.table.est_hit
        delta = 0
        hits = []
        for i in q:
            h = w.computed_hit(i, w.peek(i))
            delta += est[i] - h
            est[i] = h
            hits.append(h)
        w.waiting_uncached_tokens += delta
        order = sorted(range(len(q)), key=hits.__getitem__, reverse=True)
        # sorted(reverse=True) keeps equal keys in their original (arrival) order
        return [q[k] for k in order]


class SglangLpmPolicy:
    """lpm as SGLang's calc_priority does it, switch by switch:
    rank_match: every queued prompt is matched with `match_prefix` (an access) in queue order, the
    matches kept in `rank_nodes` for admission;
    in_batch: a request whose cached prefix is <= 32 tokens and that shares >= 32 tokens with an
    earlier such request of the queue goes last (SGLang's waiting-queue radix tree);
    exact: the key is the match capped at len - 1 and the sorted order persists (SGLang sorts its
    queue in place, so ties keep the previous round's order, not arrival order)."""

    def __init__(self, worker: "SimWorker", config: SchedulerConfig):
        self.w = worker
        self.max_queue = config.lpm_max_queue
        self.in_batch = config.in_batch_prefix_caching
        self.rank_match = config.lpm_rank_access == "match"
        self.exact = config.exact_budgets
        self.rank_nodes: dict[int, Any] | None = None  # this pass's rank matches: i -> MatchResult

    def ranked(self) -> list[int]:
        w = self.w
        q = w.waiting
        if len(q) > self.max_queue or (len(q) < 2 and not self.rank_match):
            return q
        t = w.table
        est = t.est_hit
        match_prefix = w.cache.match_prefix
        rank_match = self.rank_match
        if rank_match:
            nodes = self.rank_nodes = {}
        if len(q) == 1:  # the common case at light load: nothing to sort
            i = q[0]
            if rank_match:
                m = match_prefix(t.prompt_key[i])
                p = m.length
                nodes[i] = m
            else:
                p = w.peek(i)
            h = w.computed_hit(i, p) if w.pending and p else p
            w.waiting_uncached_tokens += est[i] - h
            est[i] = h
            return q
        exact, in_batch = self.exact, self.in_batch
        delta = 0
        keys = []
        seen = None
        for i in q:
            if rank_match:
                m = match_prefix(t.prompt_key[i])
                p = m.length
                nodes[i] = m
            else:
                p = w.peek(i)
            h = w.computed_hit(i, p) if w.pending and p else p
            delta += est[i] - h
            est[i] = h
            k = -h
            if exact and h >= t.prompt_len[i]:
                k = 1 - t.prompt_len[i]
            if in_batch and h <= IN_BATCH_CHECK_THRESHOLD:
                # SGLang matches it against a radix tree of the earlier such prompts; a match of
                # >= 32 tokens means the same first 32 tokens, so a set of 32-token heads decides
                head = key_prefix(t.prompt_key[i], IN_BATCH_DEPRIORITIZE_THRESHOLD)
                if len(head) == _IN_BATCH_HEAD_BYTES:
                    if seen is None:
                        seen = {head}
                    elif head in seen:
                        k = sys.maxsize
                    else:
                        seen.add(head)
            keys.append(k)
        w.waiting_uncached_tokens += delta
        order = sorted(range(len(q)), key=keys.__getitem__)  # stable: ties keep queue order
        ranked = [q[k] for k in order]
        if exact:
            w.waiting = ranked
        return ranked


def make_schedule_policy(worker: "SimWorker", config: SchedulerConfig) -> FcfsPolicy | LpmPolicy | SglangLpmPolicy:
    if config.schedule_policy == "fcfs":
        return FcfsPolicy(worker, config)
    if config.in_batch_prefix_caching or config.lpm_rank_access == "match" or config.exact_budgets:
        return SglangLpmPolicy(worker, config)
    return LpmPolicy(worker, config)

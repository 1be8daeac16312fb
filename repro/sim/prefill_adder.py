"""One prefill pass: which waiting requests join the next prefill batch, and their chunks (SGLang's
`Scheduler.get_new_batch_prefill` + `PrefillAdder`).

`PrefillAdder` is the pass with every SGLang-exact switch off (admission matches, evicts and inserts
request by request); `SglangPrefillAdder` is SGLang's admission arithmetic (`exact_budgets`).
`make_prefill_adder` picks one per worker; docs/ALGORITHMS.md §7 has the rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from repro.kvcache.keys import key_prefix
from repro.sim.scheduler_config import NO_CHUNK_LIMIT, SchedulerConfig

if TYPE_CHECKING:  # pragma: no cover
    from repro.sim.worker import SimWorker

# (request index, tokens prefilled this step), admitted request indices, prefill tokens, attention work
PrefillPass = tuple[list[tuple[int, int]], list[int], int, float]


def match_lock_insert(w: "SimWorker", i: int, p: int) -> bool:
    """Match, lock, evict, insert request i's prompt (`p`: its peeked prefix) and reserve its output;
    False (nothing changed) if it cannot fit even after evicting everything evictable."""
    t = w.table
    cache = w.cache
    key = t.prompt_key[i]
    out = t.output_len[i]
    plen = t.prompt_len[i]
    need = plen - p + out
    free = w.capacity - cache.total_size() - w.reserved_tokens
    matched_node = None
    if need <= free:  # no eviction, so nothing to protect until the prompt's own lock
        cache.match_prefix(key)
    else:
        evictable = cache.evictable_size()
        if need > free + evictable:
            return False
        # Locking the matched prefix removes up to p of its tokens from `evictable`.
        unsure = need > free + evictable - p
        m = cache.match_prefix(key)
        matched_node = m.last_node
        cache.inc_lock_ref(matched_node)
        need = plen - m.length + out
        if unsure and need > free + cache.evictable_size():
            cache.dec_lock_ref(matched_node)
            return False
        w.evict(need if w.config.evict_request == "whole" else need - free)
        free = w.capacity - cache.total_size() - w.reserved_tokens
        if need > free:  # the kvcache broke its evict contract
            raise RuntimeError(f"worker {w.worker_id}: after evict() {free} tokens are free, {need} needed")
    ins = cache.insert(key)
    cache.inc_lock_ref(ins.last_node)
    if matched_node is not None:
        cache.dec_lock_ref(matched_node)
    t.lock_node[i] = ins.last_node
    w.reserved_tokens += out
    w.tree_version += 1
    return True


class PrefillAdder:
    """The pass, all switches off: the input budget checked before every request after the first,
    admission by `match_lock_insert` (a request that does not fit stops the batch: head-of-line)."""

    def __init__(self, worker: "SimWorker", config: SchedulerConfig):
        self.w = worker
        self.max_running = config.running_limit(worker.capacity)
        self.stop_now = False  # set by an admit that leaves SGLang's budget spent (0.4.6's budget_state)
        self.evict_whole = config.evict_request == "whole"
        self.max_prefill_tokens = config.max_prefill_tokens
        self.chunk_limit = config.chunk_limit
        # rank at every pass SGLang ranks (its queue order and recency depend on it)
        self.rank_every_pass = config.exact_budgets or config.lpm_rank_access == "match"

    # --- the mode's hooks
    def continue_chunk(self, ch: int, n: int, rest: int) -> None:
        """The chunked request's next chunk (`n` of its `rest` tokens) opens the batch."""

    def admit(
        self, i: int, p: int, c0: int, n_total: int, n_batch: int, rem_input: int, rem_chunk: int, rm: Any
    ) -> bool:
        if n_batch and n_total >= rem_input:  # SGLang: input budget (OTHER)
            return False
        return match_lock_insert(self.w, i, p)  # memory (NO_TOKEN): head-of-line wait

    def commit(self, admitted: list[int]) -> None:
        """The batch's requests were inserted as they were admitted."""

    def continue_chunk_alone(self) -> None:
        """A pass with only the chunked request's next chunk."""

    def idle(self) -> None:
        """The worker found nothing to run (SGLang 0.4.6 resets its new_token_ratio then)."""

    # --- the pass
    def form_prefill_batch(self) -> PrefillPass:
        w = self.w
        t = w.table
        cstart, clen, prefilled = t.compute_start, t.compute_len, t.prefilled
        rem_chunk = self.chunk_limit
        rem_input = self.max_prefill_tokens
        slots = self.max_running - w.n_running
        batch: list[tuple[int, int]] = []
        admitted: list[int] = []
        tokens = 0
        attn = 0.0
        ch = w.chunked
        if ch >= 0:  # the chunked request's next chunk goes first
            c = cstart[ch] + prefilled[ch]
            rest = clen[ch] - prefilled[ch]
            n = min(rest, rem_chunk)
            batch.append((ch, n))
            tokens += n
            attn += n * (c + n / 2)
            rem_chunk -= n
            rem_input -= n
            self.continue_chunk(ch, n, rest)
        policy = w.schedule_policy
        ranked = None
        policy.rank_nodes = None
        if w.waiting and self.rank_every_pass and (slots > 0 or ch >= 0):
            # SGLang ranks (and, with lpm_rank_access=match, accesses) whenever a pass runs
            ranked = w.last_ranked = policy.ranked()
        if w.waiting and rem_chunk > 0 and rem_input > 0 and len(batch) < slots:
            pending = w.pending
            if ranked is None:
                ranked = w.last_ranked = policy.ranked()
            rank_nodes = policy.rank_nodes
            rank_version = w.tree_version
            admit = self.admit
            for i in ranked:
                if len(batch) >= slots or rem_chunk <= 0 or rem_input <= 0:
                    break
                plen = t.prompt_len[i]
                rm = rank_nodes.get(i) if rank_nodes is not None else None
                # the rank match is the tree's match while the tree is unchanged since the ranking
                # (exact mode changes nothing until the batch is committed; the plain adder evicts / inserts)
                p = rm.length if rm is not None and w.tree_version == rank_version else w.peek(i)
                h = w.computed_hit(i, p) if pending and p else p
                c0 = h if h < plen else plen - 1
                n_total = plen - c0
                if not admit(i, p, c0, n_total, len(batch), rem_input, rem_chunk, rm):
                    break
                admitted.append(i)
                w.waiting_uncached_tokens -= plen - t.est_hit[i]
                w.n_admitted += 1
                w.active_kv_tokens += plen
                t.cached_tokens[i] = h
                cstart[i] = c0
                clen[i] = n_total
                prefilled[i] = 0
                if h < plen:
                    pending.append((t.prompt_key[i], h))
                n = n_total if n_total <= rem_chunk else rem_chunk
                batch.append((i, n))
                tokens += n
                attn += n * (c0 + n / 2)
                rem_chunk -= n
                rem_input -= n
                if n < n_total or self.stop_now:  # became the chunked request, or (0.4.6) the room is spent
                    break
            if admitted:
                self.commit(admitted)
                if len(admitted) == len(w.waiting):
                    w.waiting = []
                else:
                    gone = set(admitted)
                    w.waiting = [i for i in w.waiting if i not in gone]
        if ch >= 0 and not admitted:
            self.continue_chunk_alone()
        return batch, admitted, tokens, attn


class SglangPrefillAdder(PrefillAdder):
    """SGLang's admission arithmetic: one page per request, checks against free + evictable minus the
    pass's reservations with the prefix capped at len - 1 locked, eviction once per batch in `commit`,
    the input budget checked between requests only when chunking is off."""

    def __init__(self, worker: "SimWorker", config: SchedulerConfig):
        super().__init__(worker, config)
        self.insertion = worker.chunk_insertion
        self.budget_per_request = self.chunk_limit == NO_CHUNK_LIMIT
        self._access_path = getattr(worker.cache, "access_path", None)  # RadixCache's walk-free verb
        self.extra: float = 0  # SGLang's pass reservations beyond what our tree and reservations hold
        self.pass_phys = 0  # KV the prefill batch being formed will allocate

    def form_prefill_batch(self) -> PrefillPass:
        self.extra = 0
        return super().form_prefill_batch()

    def continue_chunk(self, ch: int, n: int, rest: int) -> None:
        # SGLang reserves this chunk (+1 page) and the output with the last chunk
        self.extra, self.pass_phys = self.insertion.continuing_chunk(n, rest, self.w.table.output_len[ch])

    def admit(
        self, i: int, p: int, c0: int, n_total: int, n_batch: int, rem_input: int, rem_chunk: int, rm: Any
    ) -> bool:
        """SGLang's PrefillAdder.add_one_req memory rule.

        SGLang admits when extend + output + 1 (one page) < free + evictable - pass reservations,
        with the request's cached prefix (its match capped at len - 1) locked; an admitted request
        keeps that lock, and nothing is evicted or inserted until the batch is allocated (`commit`),
        so `extra` is the pass's reservations (SGLang's total_offset beyond the running batch) and our
        tree and reservations are those of the pass start. Physically the batch allocates the
        request's new tokens (per_chunk: only its first chunk) and its output.
        """
        if self.budget_per_request and n_batch and n_total >= rem_input:
            return False
        w = self.w
        t = w.table
        cache = w.cache
        out = t.output_len[i]
        plen = t.prompt_len[i]
        want = plen - c0 + out + 1 + self.extra
        # a fully cached prompt recomputes its last token (the match is capped at len - 1): one new slot
        phys = self.pass_phys + self.insertion.allocated_tokens(plen - p if p < plen else 1, rem_chunk) + out
        if rm is not None and p < plen and self._access_path is not None:
            # the match of the prompt capped at len - 1 ends where this pass's rank match did
            # (p < len): access that path again instead of walking a copy of the capped key
            node = self._access_path(rm.last_node).last_node
        else:
            node = cache.match_prefix(key_prefix(t.prompt_key[i], plen - 1)).last_node
        cache.inc_lock_ref(node)
        room = w.capacity - cache.total_size() - w.reserved_tokens + cache.evictable_size()
        if want >= room or phys > room:
            cache.dec_lock_ref(node)
            return False
        self.pass_phys = phys
        t.lock_node[i] = node
        self.extra += plen - c0 + 1 + out
        return True

    def commit(self, admitted: list[int]) -> None:
        """Allocate the batch SGLang-style: evict the shortfall once, then hand the admitted prompts
        to the chunk insertion mode."""
        w = self.w
        cache = w.cache
        phys = self.pass_phys
        free = w.capacity - cache.total_size() - w.reserved_tokens
        if phys > free:
            w.evict(phys if self.evict_whole else phys - free)
            free = w.capacity - cache.total_size() - w.reserved_tokens
            if phys > free:  # the kvcache broke its evict contract, or a chunk found no room
                raise RuntimeError(f"worker {w.worker_id}: after evict() {free} tokens are free, {phys} needed")
        self.pass_phys = 0
        self.insertion.allocate(admitted, phys)

    def continue_chunk_alone(self) -> None:
        self.insertion.continuing_chunk_alone(self)


def make_prefill_adder(worker: "SimWorker", config: SchedulerConfig) -> PrefillAdder:
    if config.prefill_adder == "sglang_0_4_6":
        from repro.sim.prefill_adder_046 import Sglang046PrefillAdder

        return Sglang046PrefillAdder(worker, config)
    return SglangPrefillAdder(worker, config) if config.exact_budgets else PrefillAdder(worker, config)

"""SGLang 0.4.6's prefill pass (`cluster.scheduler.prefill_adder: sglang_0_4_6`): the admission
arithmetic of the authors' servers, on top of the 0.5.23 pass (`SglangPrefillAdder`).

Read from sglang 0.4.6's managers/schedule_policy.py (PrefillAdder) and managers/scheduler.py
(get_new_batch_prefill, update_running_batch); docs/ALGORITHMS.md §7 lists every difference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from repro.kvcache.keys import key_prefix
from repro.sim.prefill_adder import PrefillAdder, PrefillPass, SglangPrefillAdder
from repro.sim.scheduler_config import (
    CLIP_MAX_NEW_TOKENS_ESTIMATION,
    INIT_NEW_TOKEN_RATIO,
    MIN_NEW_TOKEN_RATIO_FACTOR,
    NEW_TOKEN_RATIO_DECAY_STEPS,
    SchedulerConfig,
)

if TYPE_CHECKING:  # pragma: no cover
    from repro.sim.worker import SimWorker

_CLIP = CLIP_MAX_NEW_TOKENS_ESTIMATION


class Sglang046PrefillAdder(SglangPrefillAdder):
    """SGLang 0.4.6's PrefillAdder.add_one_req / add_chunked_req / budget_state, one pass.

    Its budget: rem_total = available + evictable - offset, where available is the free KV pool (the
    tree's tokens and the running requests' generated tokens taken) and offset starts at the running
    requests' remaining outputs times new_token_ratio (0.4.6 applies the ratio to ignore_eos requests
    too) and grows by each admitted request's extend + output (a request left chunked: its chunk
    only). No page per request; the input budget is checked before every request after the first,
    chunking or not (input > rem_input); after an admission the pass stops once rem_total or
    rem_total less outputs (cur_rem) is <= 0. The simulator still reserves outputs in full: when that
    physical check refuses what 0.4.6's arithmetic admits, the request waits (0.4.6 would admit it
    and retract under decode memory pressure, which is not modelled); `refused` says so.
    """

    def __init__(self, worker: "SimWorker", config: SchedulerConfig):
        super().__init__(worker, config)
        self.fcfs = config.schedule_policy == "fcfs"
        init = min(INIT_NEW_TOKEN_RATIO * config.schedule_conservativeness, 1.0)
        self.init_ratio = init
        self.min_ratio = min(init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.ratio_decay = (init - self.min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.ratio = init
        self._ratio_step = 0  # the worker's decode step the ratio is decayed up to
        self.running: dict[int, int] = {}  # SGLang's running batch, in its order: i -> decode step it joined
        self._joining: list[tuple[int, int]] = []  # the last batch's requests whose prefill it completes
        self.cur_extra = 0  # SGLang's cur_rem_token_offset: the pass's extend tokens
        self.avail = 0  # SGLang's available_size() at the pass start
        self._chunk_spent = False
        self.refused = ""  # why the last admit refused: memory | budget | physical (tests read it)

    # --- new_token_ratio (scheduler.py: -decay per decode step down to the floor, init when idle)
    def _decay(self) -> None:
        steps = self.w.decode_steps - self._ratio_step
        self._ratio_step = self.w.decode_steps
        r, lo, d = self.ratio, self.min_ratio, self.ratio_decay
        while steps > 0 and r > lo:
            r = max(r - d, lo)
            steps -= 1
        self.ratio = r

    def idle(self) -> None:
        self._decay()
        self.ratio = self.init_ratio

    def note_running(self, i: int, generated: int) -> None:
        """Request i is in the running batch with `generated` tokens (states built by tests)."""
        self.running[i] = self.w.decode_steps + 1 - generated

    # --- the pass
    def form_prefill_batch(self) -> PrefillPass:
        w = self.w
        t = w.table
        self.stop_now = False
        self.refused = ""
        self._chunk_spent = False
        if w.n_running >= self.max_running:  # 0.4.6: no pass, not even the chunked request's next chunk
            return [], [], 0, 0.0
        self._decay()
        running = self.running
        lock, prefilled, clen = t.lock_node, t.prefilled, t.compute_len
        for i, step in self._joining:  # merge_batch: the last batch's completed prefills join, in order
            if lock[i] is not None and prefilled[i] == clen[i]:
                running[i] = step
        for i in [i for i in running if lock[i] is None]:  # finished
            del running[i]
        ratio, now, out = self.ratio, w.decode_steps, t.output_len
        offset = 0.0  # summed in the running batch's order, as SGLang's sum() does
        for i, step in running.items():
            offset += min(out[i] - (1 + now - step), _CLIP) * ratio
        self.extra = offset
        self.cur_extra = 0
        cache = w.cache
        self.avail = w.capacity - cache.total_size() - w.live_generated - w.alloc_tokens
        batch = PrefillAdder.form_prefill_batch(self)
        rows, admitted = batch[0], batch[1]
        if (
            self._chunk_spent
            and not admitted
            and self.fcfs
            and w.waiting
            and len(rows) < self.max_running - w.n_running
        ):
            # 0.4.6 still matches the first waiting request (an access) before add_one_req refuses it
            i = w.waiting[0]
            cache.match_prefix(key_prefix(t.prompt_key[i], t.prompt_len[i] - 1))
        self._joining = [(i, now) for i, n in rows if prefilled[i] + n == clen[i]]
        return batch

    def continue_chunk(self, ch: int, n: int, rest: int) -> None:
        # add_chunked_req: the chunk, and the output with the last one; per_chunk allocates the chunk now
        self.extra += n + (min(self.w.table.output_len[ch], _CLIP) if n == rest else 0)
        self.cur_extra += n
        self.pass_phys = n
        self._chunk_spent = n >= self.chunk_limit or n >= self.max_prefill_tokens

    def admit(
        self, i: int, p: int, c0: int, n_total: int, n_batch: int, rem_input: int, rem_chunk: int, rm: object
    ) -> bool:
        w = self.w
        t = w.table
        cache = w.cache
        out = t.output_len[i]
        plen = t.prompt_len[i]
        if rm is not None and p < plen:  # lpm: the ranking's match (0.4.6 does not match again)
            node = rm.last_node  # type: ignore[attr-defined]
        else:  # fcfs: init_next_round_input matches the prompt capped at len - 1 (an access)
            node = cache.match_prefix(key_prefix(t.prompt_key[i], plen - 1)).last_node
        total = n_total + min(out, _CLIP)
        avail = self.avail
        if total >= avail + cache.evictable_size() - self.extra:
            self.refused = "memory"
            return False
        if n_batch and n_total > rem_input:
            self.refused = "budget"
            return False
        cache.inc_lock_ref(node)
        evictable = cache.evictable_size()
        if total > avail + evictable - self.extra:
            cache.dec_lock_ref(node)
            self.refused = "memory"
            return False
        phys = self.pass_phys + self.insertion.allocated_tokens(plen - p if p < plen else 1, rem_chunk) + out
        if phys > w.capacity - cache.total_size() - w.reserved_tokens + evictable:
            cache.dec_lock_ref(node)
            self.refused = "physical"
            return False
        self.pass_phys = phys
        t.lock_node[i] = node
        if n_total <= rem_chunk:
            self.extra += total
            self.cur_extra += n_total
        else:  # left chunked: only its first chunk is reserved
            self.extra += rem_chunk
            self.cur_extra += rem_chunk
        room = avail + evictable
        if room - self.extra <= 0 or room - self.cur_extra <= 0:  # budget_state: NO_TOKEN
            self.stop_now = True
        return True

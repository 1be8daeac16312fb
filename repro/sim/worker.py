"""One simulated LLM worker: SGLang's scheduler (continuous batching) over a radix KV cache.

The step loop and the worker's bookkeeping live here; the scheduler's modes are strategies chosen
once per worker: the queue order (`schedule_policy`), admission into a prefill batch
(`prefill_adder`), when prompts enter the tree (`chunked_prefill`). What is reproduced, every
SGLang-exact switch and every simplification: docs/ALGORITHMS.md §7.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any, Callable

from repro.kvcache.keys import TOKEN_BYTES
from repro.kvcache.protocol import KVCache
from repro.sim.chunked_prefill import make_chunk_insertion
from repro.sim.prefill_adder import PrefillPass, make_prefill_adder
from repro.sim.request_table import RequestTable, SimTimings
from repro.sim.schedule_policy import make_schedule_policy
from repro.sim.scheduler_config import NO_CHUNK_LIMIT, SchedulerConfig

__all__ = [
    "NO_CHUNK_LIMIT",
    "Observer",
    "RequestTable",
    "SchedulerConfig",
    "SimTimings",
    "SimWorker",
    "SimWorkerView",
    "StepInfo",
]

_INF = float("inf")
_NO_PREFILL: PrefillPass = ([], [], 0, 0.0)  # a decode step's prefill part (never changed)


# observer(event, worker, info): event "start" (info: StepInfo) or "end" (info: finished indices)
Observer = Callable[[str, "SimWorker", Any], None]


@dataclass(frozen=True, slots=True)
class StepInfo:
    """What one scheduler step does (given to an observer; tests check bounds with it)."""

    start_s: float
    duration_s: float
    prefill: tuple[tuple[int, int], ...]  # (request index, tokens prefilled this step)
    prefill_tokens: int
    prefill_attn_work: float
    decode_batch: int
    decode_context_tokens: int
    admitted: tuple[int, ...]  # requests admitted (matched, locked, inserted) by this step


class SimWorker:
    """One worker: waiting queue, running batch, chunked request, radix cache, step costs.

    Driven by the cluster's event loop: `enqueue` on dispatch, `start_step(now)` when idle
    (returns the step's duration, or -1 when there is nothing to do), `end_step(now)` when the
    step's end event fires (returns the indices of requests finished by it).
    """

    def __init__(
        self,
        worker_id: int,
        cache: KVCache,
        cost_model: Any,
        scheduler: SchedulerConfig,
        table: RequestTable,
        eviction_policy: str,
        timings: SimTimings | None = None,
        observer: Observer | None = None,
    ):
        self.worker_id = worker_id
        self.cache = cache
        self.cost_model = cost_model
        self.config = scheduler
        self.eviction_policy = eviction_policy
        self.capacity = int(cache.capacity_tokens)
        self.table = table
        self.timings = timings if timings is not None else SimTimings()
        self.observer = observer
        # SGLang admits only when prompt + output + 1 page < free KV: a longer request waits forever
        exact = scheduler.exact_budgets
        self.max_request_kv_tokens = self.capacity - 2 if exact else self.capacity
        if exact and table.n:
            worst = table.largest()
            if table.prompt_len[worst] + table.output_len[worst] > self.max_request_kv_tokens:
                raise ValueError(
                    f"request {table.requests[worst].id} needs {table.prompt_len[worst]} prompt + "
                    f"{table.output_len[worst]} output tokens; with scheduler.exact_budgets SGLang admits a "
                    f"request only when that + 2 <= the worker's KV capacity ({self.capacity} tokens)"
                )
        self._step_time_s = cost_model.step_time_s
        decode = getattr(cost_model, "decode_step_time_s", None)  # the same floats, memoised (StepCostModel)
        self._decode_time_s = decode if decode is not None else (lambda b, c: cost_model.step_time_s(0, 0.0, b, c))
        # walk-free verb of repro.kvcache.RadixCache (None for other caches: the plain insert then)
        self._insert_after = getattr(cache, "insert_after", None)

        self.waiting: list[int] = []  # request indices in arrival order
        self.waiting_uncached_tokens = 0  # sum of (prompt - est_hit) over waiting
        self.chunked = -1  # request in chunked prefill, -1 if none
        self.pending: list[tuple[bytes, int]] = []  # (prompt key, first uncomputed position)
        self.n_running = 0  # decode batch size
        self.n_admitted = 0  # admitted and unfinished (prefilling or running)
        self.context_tokens = 0  # sum of (prompt + generated) over the running batch
        self.active_kv_tokens = 0  # same over all admitted, unfinished requests
        # KV of generated tokens of unfinished requests (not in the tree yet): generated - 1 each,
        # the last sampled token is fed (gets KV) by the next decode step (SGLang's kv_committed_len)
        self.live_generated = 0
        self.reserved_tokens = 0  # output tokens reserved by admitted, unfinished requests
        self.decode_steps = 0
        self.prefill_steps = 0
        self.busy_s = 0.0
        self._finish_at: dict[int, list[int]] = {}  # decode step number -> requests finishing then
        self.busy = False
        self._batch: list[tuple[int, int]] | None = None  # current prefill batch, None = decode
        # Bumped by every insert / evict (the only calls that change prefix lengths), so a
        # queued request's peek_prefix is recomputed only after the tree changed.
        self.tree_version = 0
        self.alloc_tokens = 0  # per_chunk: KV of the running prefill step, not in the tree until it ends
        self.last_ranked: list[int] = []  # the queue order of the latest batch formation (tests read it)

        # the scheduler's modes, chosen once
        self.schedule_policy = make_schedule_policy(self, scheduler)
        self.chunk_insertion = make_chunk_insertion(self, scheduler)
        self.prefill_adder = make_prefill_adder(self, scheduler)

    # ------------------------------------------------------------------ knobs (the emulated worker's /server_info)
    @property
    def lpm(self) -> bool:
        return self.config.schedule_policy == "lpm"

    @property
    def max_running(self) -> int:
        return self.prefill_adder.max_running  # max_running_requests: null is sized from the KV pool

    @property
    def max_prefill_tokens(self) -> int:
        return self.config.max_prefill_tokens

    # ------------------------------------------------------------------ router-visible state
    @property
    def in_flight(self) -> int:
        return len(self.waiting) + self.n_admitted

    @property
    def waiting_prefill_tokens(self) -> int:
        """Uncached prompt tokens still to prefill: waiting requests (hit estimated with
        peek_prefix at dispatch, refreshed whenever lpm ranks the queue) + the chunked rest."""
        rest = 0
        ch = self.chunked
        if ch >= 0:
            rest = self.table.compute_len[ch] - self.table.prefilled[ch]
        return self.waiting_uncached_tokens + rest

    @property
    def kv_used_tokens(self) -> int:
        return int(self.cache.total_size()) + self.live_generated + self.alloc_tokens

    # ------------------------------------------------------------------ dispatch
    def enqueue(self, i: int) -> None:
        t = self.table
        key = t.prompt_key[i]
        if not key:
            key = t.key(i)
        # peek inlined: a request is enqueued once, so its peek is never cached yet
        p = t.peek_len[i] = self.cache.peek_prefix(key)
        t.peek_version[i] = self.tree_version
        h = self.computed_hit(i, p) if self.pending and p else p
        t.est_hit[i] = h
        self.waiting_uncached_tokens += t.prompt_len[i] - h
        self.waiting.append(i)

    # ------------------------------------------------------------------ hits
    def peek(self, i: int) -> int:
        """Request i's cached prefix (peek_prefix), recomputed only after the tree changed."""
        t = self.table
        if t.peek_version[i] != self.tree_version:
            t.peek_len[i] = self.cache.peek_prefix(t.prompt_key[i])
            t.peek_version[i] = self.tree_version
        return t.peek_len[i]

    def computed_hit(self, i: int, p: int) -> int:
        """Cap a tree match `p` at the first token whose KV is not computed yet.

        Uncomputed tokens are the suffixes [start, len) of the prompts in `self.pending`
        (the chunked request, and during batch formation the requests admitted so far).
        Request i's match reaches such a token iff it agrees with that prompt on
        positions 0..start.
        """
        if self.pending and p:
            key = self.table.prompt_key[i]
            for other, start in self.pending:  # other: a prompt key
                if p > start:
                    b = start * TOKEN_BYTES
                    if key[b : b + TOKEN_BYTES] == other[b : b + TOKEN_BYTES] and key.startswith(memoryview(other)[:b]):
                        p = start
        return p

    def evict(self, num_tokens: int) -> None:
        self.tree_version += 1
        tm = self.timings
        t0 = perf_counter_ns()
        evicted = self.cache.evict(num_tokens)
        tm.evict_ns += perf_counter_ns() - t0
        tm.evict_calls += 1
        tm.evicted_tokens += evicted

    # ------------------------------------------------------------------ steps
    def start_step(self, now: float) -> float:
        """Start the next step at `now`; its duration in seconds, or -1.0 if idle."""
        prefill = None
        if self.waiting or self.chunked >= 0:
            prefill = self.prefill_adder.form_prefill_batch()
        if prefill is not None and prefill[0]:
            batch, admitted, tokens, attn = prefill
            if admitted:  # their queue wait ends and their prefill starts with this step
                start = self.table.prefill_start_s
                for i in admitted:
                    start[i] = now
            self._batch = batch
            self.prefill_steps += 1
            decode_batch = context = 0
            dur = self._step_time_s(tokens, attn, 0, 0)
        elif self.n_running:
            self._batch = None
            batch, admitted, tokens, attn = _NO_PREFILL
            decode_batch, context = self.n_running, self.context_tokens
            dur = self._decode_time_s(decode_batch, context)
        else:
            self.prefill_adder.idle()
            return -1.0
        if not 0.0 <= dur < _INF:
            raise ValueError(
                f"worker {self.worker_id}: cost model returned step time {dur!r} for (prefill_tokens={tokens}, "
                f"attn_work={attn}, decode_batch={decode_batch}, context={context})"
            )
        self.busy = True
        self.busy_s += dur
        if self.observer is not None:
            info = StepInfo(now, dur, tuple(batch), tokens, attn, decode_batch, context, tuple(admitted))
            self.observer("start", self, info)
        return dur

    def end_step(self, now: float) -> list[int]:
        """Apply the effects of the step ending at `now`; return the requests it finished."""
        batch = self._batch
        done = self._end_prefill(now, batch) if batch is not None else self._end_decode(now)
        self.busy = False
        if self.observer is not None:
            self.observer("end", self, tuple(done))
        return done

    def _end_prefill(self, now: float, batch: list[tuple[int, int]]) -> list[int]:
        t = self.table
        done: list[int] = []
        prefilled, clen = t.prefilled, t.compute_len
        chunked = -1
        insertion = self.chunk_insertion
        insertion.begin_prefill_end()
        cache_computed = insertion.cache_computed
        for i, n in batch:
            pf = prefilled[i] + n
            prefilled[i] = pf
            cache_computed(i, pf)
            if pf < clen[i]:
                chunked = i
                continue
            t.first_token_s[i] = now  # its first token is sampled, not fed: no KV for it yet
            out = t.output_len[i]
            if out == 1:
                self._finish(i, now)
                done.append(i)
            else:
                self.n_running += 1
                self.context_tokens += t.prompt_len[i] + 1
                step = self.decode_steps + out - 1
                lst = self._finish_at.get(step)
                if lst is None:
                    self._finish_at[step] = [i]
                else:
                    lst.append(i)
        self.chunked = chunked
        self.pending = insertion.pending_after_step(chunked)
        self._batch = None
        return done

    def _end_decode(self, now: float) -> list[int]:
        self.decode_steps += 1
        nr = self.n_running
        self.context_tokens += nr
        self.live_generated += nr
        self.active_kv_tokens += nr
        fin = self._finish_at.pop(self.decode_steps, None)
        if not fin:
            return []
        t = self.table
        plen, olen = t.prompt_len, t.output_len
        for i in fin:
            self.n_running -= 1
            self.context_tokens -= plen[i] + olen[i]
            self._finish(i, now)
        return fin

    def _finish(self, i: int, now: float) -> None:
        t = self.table
        out = t.output_len[i]
        self.reserved_tokens -= out  # the reservation becomes the generated path's room
        lock = t.lock_node[i]
        if self._insert_after is not None and lock.depth == t.prompt_len[i]:
            # the prompt's locked last node: insert the generated tokens below it
            self._insert_after(lock, t.gen_key(i))
        else:
            self.cache.insert(t.full_key(i))
        self.tree_version += 1
        self.cache.dec_lock_ref(lock)
        t.lock_node[i] = None
        t.finish_s[i] = now
        self.live_generated -= out - 1  # it held prompt + out - 1 (the last token never fed)
        self.active_kv_tokens -= t.prompt_len[i] + out - 1
        self.n_admitted -= 1


class SimWorkerView:
    """Read-only `WorkerView` of a SimWorker (repro/routing/base.py); cheap properties."""

    __slots__ = ("worker_id", "_w")

    def __init__(self, worker: SimWorker):
        self.worker_id = worker.worker_id
        self._w = worker

    @property
    def in_flight(self) -> int:
        return self._w.in_flight

    @property
    def waiting(self) -> int:
        return len(self._w.waiting)

    @property
    def waiting_prefill_tokens(self) -> int:
        return self._w.waiting_prefill_tokens

    @property
    def running(self) -> int:
        return self._w.n_running

    @property
    def active_kv_tokens(self) -> int:
        return self._w.active_kv_tokens

    @property
    def kv_capacity_tokens(self) -> int:
        return self._w.capacity

    @property
    def kv_used_tokens(self) -> int:
        return self._w.kv_used_tokens

    @property
    def eviction_policy(self) -> str:
        return self._w.eviction_policy

    @property
    def cost_model(self) -> Any:
        return self._w.cost_model

    def peek_prefix(self, tokens: Any) -> int:
        return self._w.cache.peek_prefix(tokens)

    def __repr__(self) -> str:
        return (
            f"SimWorkerView(worker_id={self.worker_id}, waiting={self.waiting}, running={self.running}, "
            f"kv_used_tokens={self.kv_used_tokens}/{self.kv_capacity_tokens})"
        )

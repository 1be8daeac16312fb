"""One simulated LLM worker: SGLang's scheduler (continuous batching) over a radix KV cache.

One module over 450 lines on purpose: SimWorker is one state machine (waiting queue, budgets, tree
locks, step loop) that tests/sglang/test_sched_parity.py checks as a whole against SGLang's own
scheduler; what is separable (SchedulerConfig, RequestTable, SimTimings) is small and sits beside it.

What it reproduces (SGLang `Scheduler.get_next_batch_to_run` + `PrefillAdder`):
- A waiting queue ranked by `schedule_policy`: ``lpm`` (longest cached prefix first; ties keep
  the queue's order; like SGLang it falls back to fcfs when more than 128 requests wait) or ``fcfs``.
- Every iteration forms a prefill batch if it can and runs it; only when no prefill batch can be
  formed does the running batch take a decode step (prefill has priority; no mixed chunk).
- A prefill batch is bounded by `max_running_requests` (running + batch), `max_prefill_tokens`
  (new tokens; as in SGLang a request is refused when its new tokens >= the remaining budget and
  the batch is not empty, so the first request of a batch may exceed it -- with chunking on and
  `exact_budgets`, SGLang's rule: admission stops once the budget is spent) and
  `chunked_prefill_size` (a request whose new tokens exceed the remaining chunk budget is
  prefilled in chunks over several steps; at most one chunked request at a time; its next chunk
  goes first into the next batch). `chunked_prefill_size: null` (or <= 0) disables chunking.
- Admission of a request into a batch: ``match_prefix(prompt)`` (an access), lock, make room with
  ``evict``, ``insert(prompt)`` (with `chunk_insertion: per_chunk`, the default: after each step,
  as far as computed), move the lock to the inserted prompt's last node. A request that does not
  fit stops the batch (head-of-line, like SGLang's adder stopping at NO_TOKEN).
- The step holding a request's last prefill chunk produces its first token; then one token per
  decode step. On finish: ``insert(prompt + generated)``, release the reservation, unlock.

SGLang-exact switches (`cluster.scheduler`, all on by default; each decision of a pass -- queue
order, admitted requests, chunk sizes, credited prefix -- agrees with SGLang 0.5.23's own
SchedulePolicy / PrefillAdder on every case of tests/sglang/test_sched_parity.py; REPRODUCE.md has
the agreement rates with each switch off and what each changes in results):
- `in_batch_prefix_caching`: SGLang's in-batch prefix deprioritisation in lpm.
- `lpm_rank_access: match`: lpm ranking matches (accesses, stamps) every queued prompt at every pass
  SGLang ranks; `peek` ranks read-only.
- `exact_budgets`: SGLang's admission arithmetic (`_admit_exact`: one page per request, checks
  against free + evictable minus the pass's reservations with the prefix capped at len - 1 locked,
  eviction once per batch in `_commit_exact`, the input budget checked between requests only when
  chunking is on), lpm keys capped at len - 1, and the queue order persisting between passes.
- `chunk_insertion: per_chunk` (needs `exact_budgets`): a batch allocates only what its step
  computes (a chunked request's current chunk; `alloc_tokens`, counted in `kv_used_tokens`), and
  when the step ends each request's prompt goes into the tree as far as computed, its lock moved
  there (SGLang's `cache_unfinished_req`). So between steps the tree holds what SGLang's holds: a
  chunked prompt's uncomputed rest is neither cached nor allocated, routers' `peek_prefix` sees
  only the computed part, and nodes split at chunk boundaries. `whole`: the whole prompt is
  inserted (and its KV taken) when its batch is formed; decisions of a pass are the same (the
  budget arithmetic adds the held rest back), but eviction happens earlier and the rest is locked.
With all switches off (`chunk_insertion: whole`) the worker is the earlier simplified scheduler
(the slow reference in tests/sim/reference_sim.py restates that mode).

Simplifications and choices the paper leaves open (each one deliberate):
- Output tokens are RESERVED in full at admission, so a running request is never evicted or
  retracted. That is what SGLang does for `ignore_eos` requests (ratio 1.0 whatever its
  new_token_ratio), which is what our backend sends; EOS-terminated requests (new_token_ratio
  reservation, retraction under decode memory pressure) are not modelled.
- Hit tokens (`cached_tokens`) = the longest cached prefix whose KV is already COMPUTED when the
  batch is formed, as in SGLang where all requests of a batch are matched before any of them is
  inserted: a request cannot hit tokens that another request of the same batch is computing, nor
  the not-yet-prefilled chunks of the chunked request (their tree nodes exist only with
  `chunk_insertion: whole`).
- A fully cached prompt still computes one token (its last; SGLang caps the prefix at len - 1 to
  get logits); `cached_tokens` records the full match.
- With `exact_budgets` off, admission matches, evicts and inserts request by request (a need of
  uncached prompt + output against free + evictable, no page); if a request does not fit even after
  evicting everything evictable, it and everything behind it waits (head-of-line, like SGLang's
  adder stopping at NO_TOKEN).
- Decode context of a step = sum over the running batch of (prompt + tokens generated so far);
  prefill attention work = sum n * (c + n / 2) with n new and c already computed tokens.
- `kv_used_tokens` (router view) = tokens in the tree (evictable included) + KV of generated
  tokens not yet inserted (those still being decoded) + with per_chunk, during a prefill step, the
  KV it allocated (`alloc_tokens`, in the tree when the step ends); reservations are not counted.
- Not modelled: SGLang's sticky `batch_is_full` flag, mixed chunks, priority scheduling, the
  overlap scheduler, page size > 1 (page = 1 token), scheduler CPU time.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

import numpy as np

from repro.kvcache.keys import as_key

if TYPE_CHECKING:  # pragma: no cover
    from repro.workloads.request import Request

SCHEDULE_POLICIES = ("lpm", "fcfs")
LPM_RANK_ACCESS = ("peek", "match")
CHUNK_INSERTION = ("whole", "per_chunk")
# SGLang 0.5.23 schedule_policy.IN_BATCH_PREFIX_CACHING_{CHECK,DEPRIORITIZE}_THRESHOLD (env defaults)
IN_BATCH_CHECK_THRESHOLD = 32
IN_BATCH_DEPRIORITIZE_THRESHOLD = 32
NO_CHUNK_LIMIT = sys.maxsize
_INF = float("inf")


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler knobs of one worker (SGLang server-arg names and defaults): `cluster.scheduler`.

    The one place these defaults live: the config schema (repro.harness.schema) is derived from
    this class, and conf/config.yaml does not repeat them.
    """

    schedule_policy: str = "lpm"  # lpm (longest cached prefix first) | fcfs
    max_running_requests: int = 256
    max_prefill_tokens: int = 16384
    chunked_prefill_size: Optional[int] = 8192  # null / <= 0 (SGLang: -1): chunked prefill disabled
    lpm_max_queue: int = 128  # SGLang: lpm falls back to fcfs above this queue length
    # SGLang-exact switches (module docstring; checked against SGLang's own scheduling code in
    # tests/sglang/test_sched_parity.py):
    in_batch_prefix_caching: bool = True  # (a) SGLang's in-batch prefix deprioritisation in lpm
    lpm_rank_access: str = "match"  # (d) lpm ranking accesses (stamps) every queued prefix; "peek": not
    exact_budgets: bool = True  # SGLang's admission arithmetic (see SimWorker._admit_exact)
    # (c) "per_chunk": a prompt enters the tree as far as it is computed, after each prefill step
    # (SGLang's cache_unfinished_req); "whole": the whole prompt when its batch is formed
    chunk_insertion: str = "per_chunk"

    def __post_init__(self) -> None:
        problems = self.problems(self.__dict__)
        if problems:
            raise ValueError("; ".join(problems))

    @classmethod
    def problems(cls, values: Mapping[str, Any]) -> list[str]:
        """Every problem of a `cluster.scheduler` mapping (missing keys default), one message each."""
        errs: list[str] = []
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            errs.append(f"unknown cluster.scheduler keys {unknown}; known: {sorted(known)}")
        v = {f: values.get(f, cls.__dataclass_fields__[f].default) for f in known}

        def is_int(x: Any) -> bool:
            return isinstance(x, (int, np.integer)) and not isinstance(x, bool)

        def choice(name: str, allowed: Sequence[str]) -> None:
            if v[name] not in allowed:
                errs.append(f"cluster.scheduler.{name} must be one of {', '.join(allowed)} (got {v[name]!r})")

        choice("schedule_policy", SCHEDULE_POLICIES)
        for name in ("max_running_requests", "max_prefill_tokens", "lpm_max_queue"):
            if not is_int(v[name]) or v[name] < 1:
                errs.append(f"cluster.scheduler.{name} must be an integer >= 1 (got {v[name]!r})")
        c = v["chunked_prefill_size"]
        if not (c is None or is_int(c)):  # like SGLang, <= 0 (e.g. -1) turns chunking off
            errs.append(f"cluster.scheduler.chunked_prefill_size must be an integer, or null / <= 0 for no "
                        f"chunking (got {c!r})")
        for name in ("in_batch_prefix_caching", "exact_budgets"):
            if not isinstance(v[name], bool):
                errs.append(f"cluster.scheduler.{name} must be true or false (got {v[name]!r})")
        choice("lpm_rank_access", LPM_RANK_ACCESS)
        choice("chunk_insertion", CHUNK_INSERTION)
        if v["chunk_insertion"] == "per_chunk" and v["exact_budgets"] is False:
            errs.append("cluster.scheduler.chunk_insertion: per_chunk needs cluster.scheduler.exact_budgets: true")
        return errs

    @property
    def chunk_limit(self) -> int:
        c = self.chunked_prefill_size
        return NO_CHUNK_LIMIT if c is None or c <= 0 else int(c)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None) -> "SchedulerConfig":
        """From `cluster.scheduler` (a mapping); unknown keys are an error, missing ones default."""
        cfg = dict(cfg or {})
        problems = cls.problems(cfg)
        if problems:
            raise ValueError("; ".join(problems))
        return cls(**cfg)


def _int32_key(tokens) -> bytes:
    """as_key of the ids cast to int32 (a request's arrays are int32 already: no copy then)."""
    if type(tokens) is np.ndarray and tokens.dtype == np.int32:
        return as_key(tokens)
    return as_key(np.ascontiguousarray(tokens, dtype=np.int32))


class RequestTable:
    """Per-request state of one simulation, in flat lists indexed by arrival position.

    Workers write the record fields (worker, first_token_s, finish_s, cached_tokens) in place,
    so that building the records at the end is one conversion, not a loop over objects.
    A prompt's key (`prompt_key[i]`, the radix tree's format) exists only while the request is
    in flight: the cluster builds it once when the request arrives (`key`; routers get the same
    bytes through repro.routing.base.request_key) and drops it after the completion callback, so
    a cell holds keys for its in-flight requests only, not a copy of every prompt.
    (`prompt_tokens` stays for subclasses that keep their own copies; this class never fills it.)
    """

    __slots__ = (
        "requests",
        "n",
        "arrival_s",
        "prompt_len",
        "output_len",
        "prompt_tokens",
        "prompt_key",
        "worker",
        "first_token_s",
        "finish_s",
        "cached_tokens",
        "compute_start",
        "compute_len",
        "prefilled",
        "lock_node",
        "est_hit",
        "peek_len",
        "peek_version",
        "_largest",
    )

    def __init__(self, requests: Sequence["Request"]):
        self.requests = list(requests)
        n = self.n = len(self.requests)
        self.arrival_s = [float(r.arrival_s) for r in self.requests]
        self.prompt_tokens: list = []
        self.prompt_key: list[bytes | None] = [None] * n  # while in flight (see the class docstring)
        self.prompt_len = [int(r.prompt_len) for r in self.requests]
        self.output_len = [int(r.output_len) for r in self.requests]
        nan = float("nan")
        self.worker = [-1] * n
        self.first_token_s = [nan] * n
        self.finish_s = [nan] * n
        self.cached_tokens = [0] * n
        self.compute_start = [0] * n  # tokens already computed when its prefill starts
        self.compute_len = [0] * n  # tokens its prefill computes (>= 1)
        self.prefilled = [0] * n  # of compute_len, done so far (chunked prefill)
        self.lock_node: list[Any] = [None] * n
        self.est_hit = [0] * n  # hit estimate while waiting (for waiting_prefill_tokens)
        self.peek_len = [0] * n  # last peek_prefix of its prompt on its worker ...
        self.peek_version = [-1] * n  # ... valid while the worker's tree_version is this
        self._largest = -1

    def largest(self) -> int:
        """Index of the first request with the most prompt + output tokens (found once: every worker asks)."""
        if self._largest < 0:
            self._largest = int(np.argmax(np.add(self.prompt_len, self.output_len, dtype=np.int64)))
        return self._largest

    def key(self, i: int) -> bytes:
        """Request i's prompt key, built on first use (dispatch) and kept until it finishes."""
        k = self.prompt_key[i]
        if k is None:
            k = self.prompt_key[i] = self.requests[i].prompt_key
        return k

    def gen_key(self, i: int) -> bytes:
        """Key of the generated tokens alone."""
        return _int32_key(self.requests[i].generated_tokens)

    def full_key(self, i: int) -> bytes:
        """Key of the complete path prompt || generated."""
        return self.prompt_key[i] + self.gen_key(i)


class SimTimings:
    """Wall-clock CPU cost of routing decisions, completion callbacks and eviction calls.

    Machine-dependent; goes to timings.json only, never onto the simulated clock.
    """

    __slots__ = ("route_ns", "route_calls", "complete_ns", "complete_calls", "evict_ns", "evict_calls", "evicted_tokens")

    def __init__(self) -> None:
        self.route_ns = self.route_calls = 0
        self.complete_ns = self.complete_calls = 0
        self.evict_ns = self.evict_calls = self.evicted_tokens = 0

    def as_dict(self) -> dict:
        def per(total_ns: int, count: int, scale: float) -> float | None:
            return total_ns / count / scale if count else None

        return {
            "routing": {
                "decisions": self.route_calls,
                "total_s": self.route_ns / 1e9,
                "mean_ms_per_decision": per(self.route_ns, self.route_calls, 1e6),
            },
            "completion_callback": {
                "calls": self.complete_calls,
                "total_s": self.complete_ns / 1e9,
                "mean_ms_per_call": per(self.complete_ns, self.complete_calls, 1e6),
            },
            "eviction": {
                "calls": self.evict_calls,
                "evicted_tokens": self.evicted_tokens,
                "total_s": self.evict_ns / 1e9,
                "mean_ms_per_call": per(self.evict_ns, self.evict_calls, 1e6),
                "mean_us_per_evicted_token": per(self.evict_ns, self.evicted_tokens, 1e3),
            },
        }


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
        cache: Any,
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
        self.eviction_policy = eviction_policy
        self.capacity = int(cache.capacity_tokens)
        self.table = table
        self.timings = timings if timings is not None else SimTimings()
        self.observer = observer
        self.lpm = scheduler.schedule_policy == "lpm"
        self.lpm_max_queue = scheduler.lpm_max_queue
        self.max_running = scheduler.max_running_requests
        self.max_prefill_tokens = scheduler.max_prefill_tokens
        self.chunk_limit = scheduler.chunk_limit
        self.in_batch = scheduler.in_batch_prefix_caching
        self.rank_match = scheduler.lpm_rank_access == "match"
        self.exact = scheduler.exact_budgets
        self.per_chunk = scheduler.chunk_insertion == "per_chunk"
        # rank at every pass SGLang ranks (its queue order and recency depend on it)
        self.rank_sglang_times = self.exact or self.rank_match
        # SGLang admits only when prompt + output + 1 page < free KV: a longer request waits forever
        self.max_request_kv_tokens = self.capacity - 2 if self.exact else self.capacity
        if self.exact and table.n:
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
        # walk-free verbs of repro.kvcache.RadixCache (None for other caches: the plain verbs then)
        self._insert_after = getattr(cache, "insert_after", None)
        self._access_path = getattr(cache, "access_path", None)
        self._rank_nodes: dict[int, Any] | None = None  # this pass's rank matches: i -> (length, node)

        self.waiting: list[int] = []  # request indices in arrival order
        self._waiting_prefill = 0  # sum of (prompt - est_hit) over waiting
        self.chunked = -1  # request in chunked prefill, -1 if none
        self.pending: list[tuple[bytes, int]] = []  # (prompt key, first uncomputed position)
        self.n_running = 0  # decode batch size
        self.n_admitted = 0  # admitted and unfinished (prefilling or running)
        self.context_tokens = 0  # sum of (prompt + generated) over the running batch
        self.active_kv_tokens = 0  # same over all admitted, unfinished requests
        self.live_generated = 0  # generated tokens of unfinished requests (not in the tree yet)
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
        self._pass_phys = 0  # exact: KV the prefill batch being formed will allocate
        self.alloc_tokens = 0  # per_chunk: KV of the running prefill step, not in the tree until it ends
        self.last_ranked: list[int] = []  # the queue order of the latest batch formation (tests read it)

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
        return self._waiting_prefill + rest

    @property
    def kv_used_tokens(self) -> int:
        return int(self.cache.total_size()) + self.live_generated + self.alloc_tokens

    # ------------------------------------------------------------------ dispatch
    def enqueue(self, i: int) -> None:
        t = self.table
        key = t.prompt_key[i]
        if key is None:
            key = t.key(i)
        # _peek inlined: a request is enqueued once, so its peek is never cached yet
        p = t.peek_len[i] = self.cache.peek_prefix(key)
        t.peek_version[i] = self.tree_version
        h = self._computed_hit(i, p) if self.pending and p else p
        t.est_hit[i] = h
        self._waiting_prefill += t.prompt_len[i] - h
        self.waiting.append(i)

    # ------------------------------------------------------------------ hits
    def _peek(self, i: int) -> int:
        t = self.table
        if t.peek_version[i] != self.tree_version:
            t.peek_len[i] = self.cache.peek_prefix(t.prompt_key[i])
            t.peek_version[i] = self.tree_version
        return t.peek_len[i]

    def _computed_hit(self, i: int, p: int) -> int:
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
                    b = start << 2
                    if key[b : b + 4] == other[b : b + 4] and key.startswith(memoryview(other)[:b]):
                        p = start
        return p

    def _ranked_waiting(self) -> list[int]:
        w = self.waiting
        if not self.lpm or len(w) > self.lpm_max_queue:
            return w
        if len(w) < 2 and not self.rank_match:
            return w
        if self.in_batch or self.rank_match or self.exact:
            return self._ranked_waiting_exact()
        est = self.table.est_hit
        delta = 0
        hits = []
        for i in w:
            h = self._computed_hit(i, self._peek(i))
            delta += est[i] - h
            est[i] = h
            hits.append(h)
        self._waiting_prefill += delta
        order = sorted(range(len(w)), key=hits.__getitem__, reverse=True)
        # sorted(reverse=True) keeps equal keys in their original (arrival) order
        return [w[k] for k in order]

    def _ranked_waiting_exact(self) -> list[int]:
        """lpm as SGLang's SchedulePolicy.calc_priority does it, switch by switch:
        rank_match: every queued prompt is matched with `match_prefix` (an access) in queue order;
        in_batch: a request whose cached prefix is <= 32 tokens and that shares >= 32 tokens with an
        earlier such request of the queue goes last (SGLang's waiting-queue radix tree);
        exact: the key is the match capped at len - 1 and the sorted order persists (SGLang sorts
        its queue in place, so ties keep the previous round's order, not arrival order)."""
        t = self.table
        w = self.waiting
        est = t.est_hit
        cache = self.cache
        rank_match = self.rank_match
        if rank_match:
            nodes = self._rank_nodes = {}
        if len(w) == 1:  # the common case at light load: nothing to sort
            i = w[0]
            if rank_match:
                m = cache.match_prefix(t.prompt_key[i])
                p = m.length
                nodes[i] = m
            else:
                p = self._peek(i)
            h = self._computed_hit(i, p) if self.pending and p else p
            self._waiting_prefill += est[i] - h
            est[i] = h
            return w
        delta = 0
        keys = []
        seen = None
        for i in w:
            if rank_match:
                m = cache.match_prefix(t.prompt_key[i])
                p = m.length
                nodes[i] = m
            else:
                p = self._peek(i)
            h = self._computed_hit(i, p) if self.pending and p else p
            delta += est[i] - h
            est[i] = h
            k = -h
            if self.exact and h >= t.prompt_len[i]:
                k = 1 - t.prompt_len[i]
            if self.in_batch and h <= IN_BATCH_CHECK_THRESHOLD:
                # SGLang matches it against a radix tree of the earlier such prompts; a match of
                # >= 32 tokens means the same first 32 tokens, so a set of 32-token heads decides
                head = t.prompt_key[i][: IN_BATCH_DEPRIORITIZE_THRESHOLD << 2]
                if len(head) == IN_BATCH_DEPRIORITIZE_THRESHOLD << 2:
                    if seen is None:
                        seen = {head}
                    elif head in seen:
                        k = sys.maxsize
                    else:
                        seen.add(head)
            keys.append(k)
        self._waiting_prefill += delta
        order = sorted(range(len(w)), key=keys.__getitem__)  # stable: ties keep queue order
        ranked = [w[k] for k in order]
        if self.exact:
            self.waiting = ranked
        return ranked

    # ------------------------------------------------------------------ admission
    def _admit(self, i: int, p: int) -> bool:
        """Match, lock, evict, insert request i's prompt; False (nothing changed) if it cannot fit."""
        t = self.table
        cache = self.cache
        key = t.prompt_key[i]
        out = t.output_len[i]
        plen = t.prompt_len[i]
        need = plen - p + out
        free = self.capacity - cache.total_size() - self.reserved_tokens
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
            self._evict(need - free)
            free = self.capacity - cache.total_size() - self.reserved_tokens
            if need > free:  # the kvcache broke its evict contract
                raise RuntimeError(f"worker {self.worker_id}: after evict() {free} tokens are free, {need} needed")
        ins = cache.insert(key)
        cache.inc_lock_ref(ins.last_node)
        if matched_node is not None:
            cache.dec_lock_ref(matched_node)
        t.lock_node[i] = ins.last_node
        self.reserved_tokens += out
        self.tree_version += 1
        return True

    def _admit_exact(self, i: int, p: int, c0: int, extra: int, rem_chunk: int, rm: Any = None) -> int:
        """SGLang's PrefillAdder.add_one_req memory rule; returns this admission's `extra`, -1 if refused.

        SGLang admits when extend + output + 1 (one page) < free + evictable - pass reservations,
        with the request's cached prefix (its match capped at len - 1) locked; an admitted request
        keeps that lock, and nothing is evicted or inserted until the batch is allocated
        (`_commit_exact`), so `extra` is the pass's reservations (SGLang's total_offset beyond the
        running batch) and our tree and reservations are those of the pass start. Physically the
        batch allocates the request's new tokens (per_chunk: only its first chunk) and its output.
        """
        t = self.table
        cache = self.cache
        out = t.output_len[i]
        plen = t.prompt_len[i]
        want = plen - c0 + out + 1 + extra
        new = plen - p
        if self.per_chunk and new > rem_chunk:
            new = rem_chunk
        phys = self._pass_phys + new + out  # tokens the batch's allocation will need
        if rm is not None and p < plen and self._access_path is not None:
            # the match of the prompt capped at len - 1 ends where this pass's rank match did
            # (p < len): access that path again instead of walking a copy of the capped key
            node = self._access_path(rm.last_node).last_node
        else:
            node = cache.match_prefix(t.prompt_key[i][: (plen - 1) << 2]).last_node
        cache.inc_lock_ref(node)
        room = self.capacity - cache.total_size() - self.reserved_tokens + cache.evictable_size()
        if want >= room or phys > room:
            cache.dec_lock_ref(node)
            return -1
        self._pass_phys = phys
        t.lock_node[i] = node
        return plen - c0 + 1 + out

    def _commit_exact(self, admitted: list[int]) -> None:
        """Allocate the batch SGLang-style: evict the shortfall once, then insert and lock the prompts
        (per_chunk: they stay outside the tree, as allocated KV, until their step ends)."""
        t = self.table
        cache = self.cache
        free = self.capacity - cache.total_size() - self.reserved_tokens
        if self._pass_phys > free:
            self._evict(self._pass_phys - free)
            free = self.capacity - cache.total_size() - self.reserved_tokens
            if self._pass_phys > free:  # the kvcache broke its evict contract, or a chunk found no room
                raise RuntimeError(
                    f"worker {self.worker_id}: after evict() {free} tokens are free, {self._pass_phys} needed"
                )
        if self.per_chunk:
            outs = 0
            for i in admitted:
                outs += t.output_len[i]
            self.reserved_tokens += outs
            self.alloc_tokens = self._pass_phys - outs
            self._pass_phys = 0
            return
        self._pass_phys = 0
        for i in admitted:
            ins = cache.insert(t.prompt_key[i])
            cache.inc_lock_ref(ins.last_node)
            cache.dec_lock_ref(t.lock_node[i])
            t.lock_node[i] = ins.last_node
            self.reserved_tokens += t.output_len[i]
        self.tree_version += 1

    def _evict(self, num_tokens: int) -> None:
        self.tree_version += 1
        tm = self.timings
        t0 = perf_counter_ns()
        evicted = self.cache.evict(num_tokens)
        tm.evict_ns += perf_counter_ns() - t0
        tm.evict_calls += 1
        tm.evicted_tokens += evicted

    def _form_prefill_batch(self) -> tuple[list[tuple[int, int]], list[int], int, float]:
        t = self.table
        cstart, clen, prefilled = t.compute_start, t.compute_len, t.prefilled
        rem_chunk = self.chunk_limit
        rem_input = self.max_prefill_tokens
        slots = self.max_running - self.n_running
        batch: list[tuple[int, int]] = []
        admitted: list[int] = []
        tokens = 0
        attn = 0.0
        ch = self.chunked
        exact = self.exact
        extra = 0  # exact: SGLang's pass reservations beyond what our tree and reservations hold
        if ch >= 0:  # the chunked request's next chunk goes first
            c = cstart[ch] + prefilled[ch]
            rest = clen[ch] - prefilled[ch]
            n = min(rest, rem_chunk)
            batch.append((ch, n))
            tokens += n
            attn += n * (c + n / 2)
            rem_chunk -= n
            rem_input -= n
            if exact:  # SGLang reserves this chunk (+1 page) and the output with the last chunk
                out = t.output_len[ch]
                if self.per_chunk:  # our tree holds what SGLang's does; the chunk is allocated now
                    extra = n + 1 + (out if n == rest else 0) - out
                    self._pass_phys = n
                else:  # our tree already holds the rest
                    extra = n + 1 + (out if n == rest else 0) - rest - out
        ranked = None
        self._rank_nodes = None
        if self.waiting and (self.rank_sglang_times) and (slots > 0 or ch >= 0):
            # SGLang ranks (and, with lpm_rank_access=match, accesses) whenever a pass runs
            ranked = self.last_ranked = self._ranked_waiting()
        if self.waiting and rem_chunk > 0 and rem_input > 0 and len(batch) < slots:
            pending = self.pending
            if ranked is None:
                ranked = self.last_ranked = self._ranked_waiting()
            no_chunking = self.chunk_limit == NO_CHUNK_LIMIT
            rank_nodes = self._rank_nodes
            rank_version = self.tree_version
            for i in ranked:
                if len(batch) >= slots or rem_chunk <= 0 or rem_input <= 0:
                    break
                plen = t.prompt_len[i]
                rm = rank_nodes.get(i) if rank_nodes is not None else None
                # the rank match is the tree's match while the tree is unchanged since the ranking
                # (exact mode changes nothing until the batch is committed; _admit evicts / inserts)
                p = rm.length if rm is not None and self.tree_version == rank_version else self._peek(i)
                h = self._computed_hit(i, p) if pending and p else p
                c0 = h if h < plen else plen - 1
                n_total = plen - c0
                if exact:
                    # SGLang checks the input budget per request only without chunking
                    if no_chunking and batch and n_total >= rem_input:
                        break
                    e = self._admit_exact(i, p, c0, extra, rem_chunk, rm)
                    if e < 0:
                        break
                    extra += e
                else:
                    if batch and n_total >= rem_input:  # SGLang: input budget (OTHER)
                        break
                    if not self._admit(i, p):  # memory (NO_TOKEN): head-of-line wait
                        break
                admitted.append(i)
                self._waiting_prefill -= plen - t.est_hit[i]
                self.n_admitted += 1
                self.active_kv_tokens += plen
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
                if n < n_total:  # became the chunked request: the chunk budget is spent
                    if exact:  # SGLang reserves a chunk's tokens only, its output with the last chunk
                        extra += n - n_total - t.output_len[i]
                    break
            if admitted:
                if exact:
                    self._commit_exact(admitted)
                if len(admitted) == len(self.waiting):
                    self.waiting = []
                else:
                    gone = set(admitted)
                    self.waiting = [i for i in self.waiting if i not in gone]
        if self.per_chunk and ch >= 0 and not admitted:
            self._commit_exact(admitted)  # the continuing chunk alone: allocate it
        return batch, admitted, tokens, attn

    # ------------------------------------------------------------------ steps
    def start_step(self, now: float) -> float:
        """Start the next step at `now`; its duration in seconds, or -1.0 if idle."""
        batch = None
        if self.waiting or self.chunked >= 0:
            batch, admitted, tokens, attn = self._form_prefill_batch()
        if batch:
            self._batch = batch
            self.prefill_steps += 1
            decode_batch = context = 0
            dur = self._step_time_s(tokens, attn, 0, 0)
        elif self.n_running:
            self._batch = None
            batch, admitted, tokens, attn = (), (), 0, 0.0
            decode_batch, context = self.n_running, self.context_tokens
            dur = self._decode_time_s(decode_batch, context)
        else:
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
        t = self.table
        done: list[int] = []
        batch = self._batch
        if batch is not None:
            prefilled, clen = t.prefilled, t.compute_len
            chunked = -1
            per_chunk = self.per_chunk
            if per_chunk:
                cache, cstart, keys, locks = self.cache, t.compute_start, t.prompt_key, t.lock_node
                insert_after = self._insert_after
                self.alloc_tokens = 0
                self.tree_version += 1
            for i, n in batch:
                pf = prefilled[i] + n
                prefilled[i] = pf
                if per_chunk:  # SGLang's cache_unfinished_req: the computed prefix into the tree
                    key = keys[i]
                    end = (cstart[i] + pf) << 2
                    lock = locks[i]
                    if insert_after is not None:  # below the locked prefix: only the new chunk's bytes
                        ins = insert_after(lock, key[lock.depth << 2 : end])
                    else:
                        ins = cache.insert(key if end == len(key) else key[:end])
                    cache.inc_lock_ref(ins.last_node)
                    cache.dec_lock_ref(lock)
                    locks[i] = ins.last_node
                if pf < clen[i]:
                    chunked = i
                    continue
                t.first_token_s[i] = now
                self.live_generated += 1
                self.active_kv_tokens += 1
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
            if chunked >= 0 and not per_chunk:  # per_chunk: its uncomputed rest is not in the tree
                self.pending = [(t.prompt_key[chunked], t.compute_start[chunked] + prefilled[chunked])]
            else:
                self.pending = []
            self._batch = None
        else:
            self.decode_steps += 1
            nr = self.n_running
            self.context_tokens += nr
            self.live_generated += nr
            self.active_kv_tokens += nr
            fin = self._finish_at.pop(self.decode_steps, None)
            if fin:
                plen, olen = t.prompt_len, t.output_len
                for i in fin:
                    self.n_running -= 1
                    self.context_tokens -= plen[i] + olen[i]
                    self._finish(i, now)
                done = fin
        self.busy = False
        if self.observer is not None:
            self.observer("end", self, tuple(done))
        return done

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
        self.live_generated -= out
        self.active_kv_tokens -= t.prompt_len[i] + out
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

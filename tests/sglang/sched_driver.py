"""One scheduling decision, taken by SGLang 0.5.23's own scheduling code and by our SimWorker, on one state.

A `SchedState` is plain data: a worker's KV capacity, the scheduler knobs, the token sequences
already in the radix cache (evictable), the running batch (prompt, output_len, tokens generated so
far; its prompt KV is in the tree and locked, as after SGLang's `checkpoint_kv_cache`), an optional
chunked request (prompt, output_len, tokens computed so far) and the waiting queue (prompt,
output_len) in arrival order.

SGLang side (`sglang_decide`): SGLang's `RadixCache` holds the contents (inserted through its own
`insert`), SGLang's `SchedulePolicy.calc_priority` ranks the queue (its own `match_prefix`, its
in-batch prefix check), SGLang's `PrefillAdder` admits (`add_chunked_req`, `add_one_req`,
`budget_state`, `PrefillBudget` over an allocator stand-in whose `available_size()` is the KV
capacity minus what the tree and the running requests' generated tokens hold). What we write
ourselves is only the pass loop of `Scheduler._get_new_batch_prefill_raw` (the few lines that call
those pieces in order; the scheduler object itself needs a GPU model runner), restated below
with its conditions in SGLang's order. Requests are `ignore_eos` (what our SGLang backend sends:
repro/backends/sglang/protocol.py), so their output is reserved in full (ratio 1.0).

Our side (`ours_decide`): a SimWorker put into the same state through its own admission path
(repro.kvcache tree), then `prefill_adder.form_prefill_batch()`.

A `Decision`: the ranked waiting order, the admitted requests with the cached prefix each is
credited with (SGLang's `prefix_len`; ours: the compute start) and the tokens each prefills this
pass, and which request is left chunked.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np


@dataclass
class SchedState:
    capacity: int
    policy: str = "lpm"
    max_running_requests: int = 256
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int | None = 8192
    cached: list = field(default_factory=list)  # token lists inserted (evictable), in order
    running: list = field(default_factory=list)  # (prompt, output_len, generated)
    chunked: tuple | None = None  # (prompt, output_len, computed)
    waiting: list = field(default_factory=list)  # (prompt, output_len), arrival order

    def tokens_needed(self) -> int:
        """KV the state itself holds (a generator keeps it under capacity)."""
        seen = set()
        for seq in list(self.cached) + [r[0] for r in self.running]:
            for k in range(1, len(seq) + 1):
                seen.add(tuple(seq[:k]))
        if self.chunked is not None:
            for k in range(1, len(self.chunked[0]) + 1):
                seen.add(tuple(self.chunked[0][:k]))
        return len(seen) + sum(out for _, out, _ in self.running) + (self.chunked[1] if self.chunked else 0)


@dataclass
class Decision:
    order: list  # waiting indices, ranked
    admitted: list  # (waiting index, credited prefix, tokens prefilled this pass)
    chunk_continue: int | None  # tokens of the chunked request's next chunk (None: no chunked request)
    new_chunked: int | None  # waiting index left chunked by this pass
    stop: str = ""  # SGLang side: why admission stopped (drained, budget, memory, slots, no_pass)
    tree: tuple = ()  # the radix tree when the pass starts: (tokens held, evictable tokens)

    def kinds(self) -> dict:
        return {
            "order": tuple(self.order),
            "admitted": tuple(i for i, _, _ in self.admitted),
            "prefix": tuple((i, p) for i, p, _ in self.admitted),
            "chunk": (self.chunk_continue, self.new_chunked, tuple((i, n) for i, _, n in self.admitted)),
            "tree": self.tree,
        }


# ---------------------------------------------------------------------------------------- SGLang
_SG = None


def import_sglang_scheduler() -> SimpleNamespace:
    """SGLang's scheduling modules with a published default ServerArgs context. ImportError if missing."""
    global _SG
    if _SG is not None:
        return _SG
    from repro.backends.sglang import cpu_shims

    cpu_shims.install()
    import torch
    from sglang.srt.runtime_context import get_context
    from sglang.srt.server_args import ServerArgs

    # Published once so that get_schedule()/get_memory()/... answer; the knobs each decision uses
    # are passed to SchedulePolicy / PrefillAdder explicitly, as the Scheduler does.
    get_context().set_server_args(ServerArgs(model_path="dummy", device="cpu"))
    from sglang.srt.managers import schedule_policy
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker
    from sglang.srt.mem_cache.allocator.base import BaseTokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
    from sglang.srt.sampling.sampling_params import SamplingParams

    _SG = SimpleNamespace(
        torch=torch,
        sp=schedule_policy,
        Req=Req,
        NewTokenRatioTracker=NewTokenRatioTracker,
        Base=BaseTokenToKVPoolAllocator,
        InsertParams=InsertParams,
        RadixCache=RadixCache,
        RadixKey=RadixKey,
        SamplingParams=SamplingParams,
    )
    return _SG


class _Allocator:
    """The token pool stand-in: `available_size()` = capacity - tree tokens - held generated tokens.

    SGLang's own `create_prefill_budget` / `request_slot_reserve` (BaseTokenToKVPoolAllocator)
    are used unchanged; page size 1 (our simulator's)."""

    page_size = 1

    def __init__(self, sg, capacity: int):
        self.device = sg.torch.device("cpu")
        self.capacity = capacity
        self.tree = None
        self.held = 0  # generated tokens of running requests (not in the tree)
        self.create_prefill_budget = sg.Base.create_prefill_budget.__get__(self)
        self.request_slot_reserve = sg.Base.request_slot_reserve.__get__(self)

    def free_segment(self, value, start_pos=0):
        pass

    def available_size(self):
        return self.capacity - self.tree.total_size() - self.held


class _RunningBatch:
    def __init__(self, reqs):
        self.reqs = reqs

    def batch_size(self):
        return len(self.reqs)

    def is_empty(self):
        return not self.reqs


def _req(sg, rid, prompt, out, ignore_eos=True):
    params = sg.SamplingParams(max_new_tokens=int(out), ignore_eos=ignore_eos)
    params.normalize(None)
    return sg.Req(str(rid), "", array("q", [int(t) for t in prompt]), params)


def sglang_decide(state: SchedState, new_token_ratio: float | None = None, ignore_eos: bool = True) -> Decision:
    """`new_token_ratio`: None = the scheduler's initial value (NewTokenRatioTracker.from_config():
    SGLANG_INIT_NEW_TOKEN_RATIO x schedule_conservativeness, 0.7 by default)."""
    sg = import_sglang_scheduler()
    if new_token_ratio is None:
        new_token_ratio = sg.NewTokenRatioTracker.from_config().current
    torch = sg.torch
    alloc = _Allocator(sg, state.capacity)
    tree = sg.RadixCache.create_simulated(mock_allocator=alloc)
    alloc.tree = tree

    def insert(tokens):
        key = array("q", [int(t) for t in tokens])
        tree.insert(sg.InsertParams(key=sg.RadixKey(key), value=torch.arange(len(key), dtype=torch.int64)))
        m = tree.match_prefix(sg.sp.MatchPrefixParams(key=sg.RadixKey(key)))
        return m.last_device_node

    for seq in state.cached:
        insert(seq)
    running = []
    for k, (prompt, out, gen) in enumerate(state.running):
        r = _req(sg, f"run{k}", prompt, out, ignore_eos)
        node = insert(prompt)
        tree.inc_lock_ref(node)
        r.output_ids = array("q", [7] * int(gen))
        alloc.held += int(gen)
        running.append(r)
    chunked = None
    if state.chunked is not None:
        prompt, out, done = state.chunked
        chunked = _req(sg, "chunked", prompt, out, ignore_eos)
        node = insert(prompt[:done])  # checkpoint_kv_cache after each chunk
        tree.inc_lock_ref(node)
        chunked.prefix_len = int(done)
        chunked.last_node = node
    waiting = [_req(sg, i, prompt, out, ignore_eos) for i, (prompt, out) in enumerate(state.waiting)]
    batch = _RunningBatch(running)

    held = (int(tree.total_size()), int(tree.evictable_size()))
    policy = sg.sp.SchedulePolicy(state.policy, tree, False, False, False)
    chunk = state.chunked_prefill_size if state.chunked_prefill_size and state.chunked_prefill_size > 0 else None
    # --- the pass loop of Scheduler._get_new_batch_prefill_raw (non-LoRA, non-PP, non-HiCache)
    allocatable = state.max_running_requests - len(running)
    if (allocatable <= 0 or not waiting) and chunked is None:
        return Decision([int(r.rid) for r in waiting], [], None, None, "no_pass", held)
    policy.calc_priority(waiting, batch)
    order = [int(r.rid) for r in waiting]
    adder = sg.sp.PrefillAdder(
        1, tree, alloc, batch, new_token_ratio, state.max_prefill_tokens, chunk, 0, 0,
        max_running_requests=state.max_running_requests,
    )
    chunk_continue = None
    if chunked is not None:
        chunked.init_next_round_input()
        before = chunked.prefix_len
        still = adder.add_chunked_req(chunked)
        chunk_continue = chunked.extend_end - before if chunked in adder.can_run_list else 0
        del still
    stop = "drained"
    for r in waiting:
        if adder.budget_state() == sg.sp.AddReqResult.OTHER:
            stop = "budget"
            break
        if len(adder.can_run_list) >= allocatable:
            stop = "slots"
            break
        r.init_next_round_input(tree)
        res = adder.add_one_req(r, has_chunked_req=chunked is not None, truncation_align_size=None)
        if res != sg.sp.AddReqResult.CONTINUE:
            admitted_it = bool(adder.can_run_list) and adder.can_run_list[-1] is r
            stop = ("budget" if res == sg.sp.AddReqResult.OTHER else "memory") + ("" if admitted_it else "_refused")
            break
    admitted = [(int(r.rid), int(r.prefix_len), int(r.extend_end - r.prefix_len))
                for r in adder.can_run_list if r is not chunked]
    new_chunked = int(adder.new_chunked_req.rid) if adder.new_chunked_req is not None else None
    return Decision(order, admitted, chunk_continue, new_chunked, stop, held)


# ---------------------------------------------------------------------------------------- ours
class _NullCost:
    def step_time_s(self, *a):
        return 0.01


def _restore(w, running, chunked) -> None:
    """Put SimWorker `w` into the state: running requests and the chunked one admitted through its
    own admission path (`match_lock_insert`: match, lock, insert, reserve), then marked running / mid-prefill."""
    from repro.sim.prefill_adder import match_lock_insert

    t = w.table
    per_chunk = w.config.chunk_insertion == "per_chunk"
    for i, gen in running:
        assert match_lock_insert(w, i, w.cache.peek_prefix(t.key(i))), "state does not fit"
        w.n_admitted += 1
        w.n_running += 1
        t.compute_len[i] = t.prefilled[i] = t.prompt_len[i]
        w.context_tokens += t.prompt_len[i] + gen
        w.active_kv_tokens += t.prompt_len[i] + gen
        w.live_generated += gen
        w._finish_at.setdefault(w.decode_steps + t.output_len[i] - gen, []).append(i)
    if chunked is not None:
        i, done = chunked
        if per_chunk:  # as after its last step: the computed prefix in the tree, locked; output reserved
            node = w.cache.insert(t.key(i)[: done << 2]).last_node
            w.cache.inc_lock_ref(node)
            t.lock_node[i] = node
            w.reserved_tokens += t.output_len[i]
        else:
            assert match_lock_insert(w, i, w.cache.peek_prefix(t.key(i))), "state does not fit"
        w.n_admitted += 1
        w.active_kv_tokens += t.prompt_len[i]
        t.compute_start[i] = 0
        t.compute_len[i] = t.prompt_len[i]
        t.prefilled[i] = done
        w.chunked = i
        w.pending = [] if per_chunk else [(t.key(i), done)]


EXACT = dict(in_batch_prefix_caching=True, lpm_rank_access="match", exact_budgets=True, chunk_insertion="per_chunk")


def ours_decide(state: SchedState, before_pass=None, **modes) -> Decision:
    """`before_pass(worker)`: called on the restored worker just before its pass (the 0.4.6 driver
    sets the adder's new_token_ratio and running batch there)."""
    from repro.kvcache import make_cache
    from repro.sim.worker import RequestTable, SchedulerConfig, SimWorker
    from tests.sim.sim_fakes import make_request

    reqs = []
    for k, (prompt, out, gen) in enumerate(state.running):
        reqs.append(make_request(len(reqs), 0.0, prompt, output_len=out))
    if state.chunked is not None:
        reqs.append(make_request(len(reqs), 0.0, state.chunked[0], output_len=state.chunked[1]))
    base = len(reqs)
    for prompt, out in state.waiting:
        reqs.append(make_request(len(reqs), 0.0, prompt, output_len=out))
    table = RequestTable(reqs)
    for i in range(len(reqs)):  # every request of the state is in flight: its key exists (the cluster builds it on dispatch)
        table.key(i)
    cache = make_cache(state.capacity, {"name": "lru", "granularity": "node"}, 0)
    sched = SchedulerConfig(
        schedule_policy=state.policy,
        max_running_requests=state.max_running_requests,
        max_prefill_tokens=state.max_prefill_tokens,
        chunked_prefill_size=state.chunked_prefill_size,
        **modes,
    )
    w = SimWorker(0, cache, _NullCost(), sched, table, "lru")
    for seq in state.cached:
        cache.insert(np.asarray(seq, dtype=np.int32))
    _restore(w, [(k, gen) for k, (_, _, gen) in enumerate(state.running)],
             (len(state.running), state.chunked[2]) if state.chunked is not None else None)
    for j in range(len(state.waiting)):
        w.enqueue(base + j)
    w.last_ranked = None
    held = (int(cache.total_size()), int(cache.evictable_size()))
    if before_pass is not None:
        before_pass(w)
    batch, admitted, _, _ = w.prefill_adder.form_prefill_batch()
    if w.last_ranked is None:  # not ranked this pass: SGLang's queue keeps its order
        w.last_ranked = list(w.waiting) if w.prefill_adder.rank_every_pass or not w.waiting else w.schedule_policy.ranked()
    order = [i - base for i in w.last_ranked]
    chunk_continue = None
    rows = dict(batch)
    if state.chunked is not None:
        chunk_continue = rows.get(len(state.running), 0)
    adm = [(i - base, table.compute_start[i], rows[i]) for i in admitted]
    new_chunked = None
    for i in admitted:
        if rows[i] < table.compute_len[i]:
            new_chunked = i - base
    return Decision(order, adm, chunk_continue, new_chunked, "", held)


# ---------------------------------------------------------------------------------------- states
def _common(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def random_state(rng: np.random.Generator, *, big_queue: bool = False) -> SchedState:
    """A random small state: prompts share a few system prompts (some longer than SGLang's
    in-batch threshold of 32 tokens), knobs from SGLang's defaults and small budgets."""
    n_sys = int(rng.integers(1, 5))
    systems = [list(rng.integers(1000 * (g + 1), 1000 * (g + 1) + 900, int(rng.integers(4, 70)))) for g in range(n_sys)]

    def prompt():
        g = int(rng.integers(0, n_sys))
        cut = len(systems[g]) if rng.random() < 0.8 else int(rng.integers(1, len(systems[g]) + 1))
        return [int(x) for x in systems[g][:cut]] + [int(x) for x in rng.integers(1, 900, int(rng.integers(1, 24)))]

    cached = [systems[g][: int(rng.integers(1, len(systems[g]) + 1))] for g in range(n_sys) if rng.random() < 0.6]
    cached += [prompt() for _ in range(int(rng.integers(0, 4)))]
    max_running = int(rng.choice([256, 256, 2, 3, 5]))
    running = [(prompt(), int(rng.integers(1, 12)), 0) for _ in range(int(rng.integers(0, min(4, max_running + 1))))]
    running = [(p, out, int(rng.integers(0, out))) for p, out, _ in running]
    chunked = None
    if rng.random() < 0.25:
        p = prompt() + [int(x) for x in rng.integers(1, 900, int(rng.integers(8, 60)))]
        # its computed part covers at least what was cached when it was admitted
        cached_len = max([_common(p, q) for q in cached + [r[0] for r in running]] + [0])
        done = max(int(rng.integers(1, len(p))), min(cached_len, len(p) - 1))
        chunked = (p, int(rng.integers(1, 8)), done)
    n_wait = int(rng.integers(129, 140)) if big_queue else int(rng.integers(0, 12))
    waiting = [(prompt(), int(rng.integers(1, 12))) for _ in range(n_wait)]
    st = SchedState(
        capacity=0,
        policy="lpm" if rng.random() < 0.75 else "fcfs",
        max_running_requests=max_running,
        max_prefill_tokens=int(rng.choice([16384, 16384, 24, 48, 96])),
        chunked_prefill_size=[8192, 8192, None, 16, 32, 64][int(rng.integers(0, 6))],
        cached=cached, running=running, chunked=chunked, waiting=waiting,
    )
    if chunked is not None and st.chunked_prefill_size is None:
        st.chunked_prefill_size = 32  # a chunked request exists only with chunking on
    need = st.tokens_needed()
    st.capacity = need + int(rng.choice([0, 5, 20, 60, 150, 400, 5000]))
    # every request fits an empty worker (the cluster's validation, with SGLang's 1-page margin)
    every = waiting + [(p, out) for p, out, _ in running] + ([chunked[:2]] if chunked else [])
    st.capacity = max([st.capacity] + [len(p) + out + 2 for p, out in every])
    return st


def coverage(state: SchedState, d: Decision) -> set:
    """The listed cases a state (and SGLang's decision on it) exercises."""
    tags = set()
    n = len(state.waiting)
    if state.policy == "lpm" and 1 < n <= 128:
        tags.add("lpm")
        hits = [p for _, p, _ in d.admitted]
        if any(h > 0 for h in hits):
            tags.add("lpm_shared_prefix")
    if state.policy == "lpm" and n > 128:
        tags.add("fcfs_fallback_over_128")
    if state.policy == "fcfs":
        tags.add("fcfs")
    if state.chunked is not None:
        tags.add("chunked_continuing")
    if d.new_chunked is not None:
        tags.add("new_chunk")
    if d.stop in ("budget", "budget_refused"):
        tags.add("budget_edge")
    if d.stop == "memory_refused":
        tags.add("memory_too_full_to_admit")
    if d.stop == "slots":
        tags.add("max_running_requests")
    if state.policy == "lpm" and 1 < n <= 128 and _in_batch_applies(state):
        tags.add("in_batch_prefix_rule")
    return tags


def _in_batch_applies(state: SchedState) -> bool:
    """Some queued request has <= 32 cached tokens and shares >= 32 with another such request."""
    contents = [list(q) for q in state.cached] + [list(r[0]) for r in state.running]
    if state.chunked is not None:
        contents.append(list(state.chunked[0][: state.chunked[2]]))
    short = [p for p, _ in state.waiting if max([_common(p, q) for q in contents] + [0]) <= 32]
    return any(_common(a, b) >= 32 for k, a in enumerate(short) for b in short[:k])


KINDS = ("order", "admitted", "chunk", "prefix", "tree")
SIMPLE = dict(in_batch_prefix_caching=False, lpm_rank_access="peek", exact_budgets=False, chunk_insertion="whole")
MODES = {  # "simple": the simulator before these switches; each switch alone on top of it; all switches on
    "simple (all switches off)": SIMPLE,
    "a in_batch_prefix_caching": {**SIMPLE, "in_batch_prefix_caching": True},
    "d lpm_rank_access=match": {**SIMPLE, "lpm_rank_access": "match"},
    "exact_budgets": {**SIMPLE, "exact_budgets": True},
    "all but c (chunk_insertion=whole)": {**EXACT, "chunk_insertion": "whole"},
    "exact (all switches)": EXACT,
}


def agreement(n_states: int, seed0: int = 0) -> tuple[dict, dict]:
    """Per mode and decision kind, the fraction of `n_states` generated states on which ours
    decides as SGLang does; and how many states cover each listed case."""
    from collections import Counter

    agree = {m: Counter() for m in MODES}
    cover = Counter()
    for k in range(n_states):
        st = random_state(np.random.default_rng(seed0 + k), big_queue=(k % 20 == 0))
        theirs = sglang_decide(st)
        cover.update(coverage(st, theirs))
        ka = theirs.kinds()
        for m, modes in MODES.items():
            kb = ours_decide(st, **modes).kinds()
            agree[m].update(kind for kind in KINDS if ka[kind] == kb[kind])
    return {m: {kind: agree[m][kind] / n_states for kind in KINDS} for m in MODES}, dict(cover)


if __name__ == "__main__":  # PYTHONPATH=. .venv-sglang/bin/python -m tests.sglang.sched_driver [N]
    import sys

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    rates, cover = agreement(n)
    print(f"{n} generated states; agreement with SGLang 0.5.23 per decision kind:")
    for m, r in rates.items():
        print(f"  {m:28s} " + "  ".join(f"{kind} {100 * v:6.2f}%" for kind, v in r.items()))
    print("coverage: " + ", ".join(f"{c} {v} ({100 * v / n:.1f}%)" for c, v in sorted(cover.items())))

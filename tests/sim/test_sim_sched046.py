"""The SGLang 0.4.6 preset's knobs (repro/sim/prefill_adder_046.py, scheduler_config.py), each on small
hand-made cases against a reference written here; the parity with SGLang 0.4.6's own code is
tests/sglang/test_sched_parity046.py (marker sglang)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from repro.kvcache import make_cache
from repro.sim.scheduler_config import SchedulerConfig
from repro.sim.worker import RequestTable, SimWorker
from tests.sglang import sched_driver as D
from tests.sim.sim_fakes import make_request

ROOT = Path(__file__).resolve().parents[2]
V046 = dict(D.EXACT, prefill_adder="sglang_0_4_6")


class _Cost:
    def step_time_s(self, *a):
        return 0.01


def _seq(base, n):
    return list(range(base, base + n))


def _decide(state, ratio=None, adder_out=None, **modes):
    def hook(w):
        if adder_out is not None:
            adder_out.append(w.prefill_adder)
        if ratio is not None:
            w.prefill_adder.ratio = ratio
        if modes.get("prefill_adder") == "sglang_0_4_6":
            for k, (_, _, gen) in enumerate(state.running):
                w.prefill_adder.note_running(k, gen)

    return D.ours_decide(state, before_pass=hook, **modes)


# ------------------------------------------------------------------ the preset and its defaults
def test_defaults_are_0_5_23s_and_the_preset_file_sets_0_4_6s():
    c = SchedulerConfig()
    assert (c.prefill_adder, c.evict_request, c.max_running_requests) == ("sglang_0_5_23", "shortfall", 256)
    preset = yaml.safe_load((ROOT / "conf/exp/shared/sglang_0_4_6.yaml").read_text())
    assert preset["cluster"]["mem_fraction"] == 0.88
    p = SchedulerConfig.from_config(preset["cluster"]["scheduler"])
    assert (p.schedule_policy, p.max_running_requests, p.max_prefill_tokens, p.chunked_prefill_size) == (
        "fcfs",
        None,
        16384,
        8192,
    )
    # 0.4.6's admission needs decode-time retraction (not modelled): the preset admits as 0.5.23 does
    assert (p.prefill_adder, p.evict_request, p.chunk_insertion) == ("sglang_0_5_23", "whole", "per_chunk")


def _reference_running_limit(pool, context_len=131072):
    """tp_worker.py: min(pool // 2, req_to_token_pool.size); model_runner.py: size = max_num_reqs + 1,
    max_num_reqs = min(max(int(pool / context_len * 512), 2048), 4096)."""
    max_num_reqs = min(max(int(pool / context_len * 512), 2048), 4096)
    return min(pool // 2, max_num_reqs + 1)


@pytest.mark.parametrize("pool", [7, 1200, 4097, 4098, 32768, 201786, 600000, 2_000_000])
def test_max_running_requests_null_is_sized_from_the_pool(pool):
    c = SchedulerConfig(max_running_requests=None)
    assert c.running_limit(pool) == _reference_running_limit(pool)
    assert SchedulerConfig(max_running_requests=64).running_limit(pool) == 64
    w = SimWorker(0, make_cache(pool, {"name": "lru"}, 0), _Cost(), c, RequestTable([]), "lru")
    assert w.max_running == _reference_running_limit(pool)


def test_bad_preset_values_are_refused_before_work():
    with pytest.raises(ValueError, match="prefill_adder"):
        SchedulerConfig(prefill_adder="sglang_0_4_5")
    with pytest.raises(ValueError, match="evict_request"):
        SchedulerConfig(evict_request="all")
    with pytest.raises(ValueError, match="needs exact_budgets"):
        SchedulerConfig(prefill_adder="sglang_0_4_6", chunk_insertion="whole")
    with pytest.raises(ValueError, match="max_running_requests"):
        SchedulerConfig(max_running_requests=0)
    with pytest.raises(ValueError, match="schedule_conservativeness"):
        SchedulerConfig(schedule_conservativeness=-1.0)


# ------------------------------------------------------------------ evict_request
class _EvictSpy:
    def __init__(self, cache):
        self.cache = cache
        self.asked = []
        self._evict = cache.evict

    def __call__(self, n):
        self.asked.append(n)
        return self._evict(n)


def _evict_requests(evict_request, exact):
    """Capacity 100, 90 evictable tokens cached; one request of 30 prompt + 2 output tokens."""
    modes = dict(D.EXACT if exact else D.SIMPLE, evict_request=evict_request)
    reqs = [make_request(0, 0.0, _seq(5000, 30), output_len=2)]
    table = RequestTable(reqs)
    table.key(0)
    cache = make_cache(100, {"name": "lru", "granularity": "node"}, 0)
    for g in range(3):
        cache.insert(np.asarray(_seq(1000 * (g + 1), 30), dtype=np.int32))
    spy = _EvictSpy(cache)
    cache.evict = spy
    w = SimWorker(0, cache, _Cost(), SchedulerConfig(**modes), table, "lru")
    w.enqueue(0)
    w.start_step(0.0)
    return spy.asked, 100 - cache.total_size()


@pytest.mark.parametrize("exact", [True, False])
def test_evict_request_whole_asks_for_the_whole_allocation_shortfall_for_the_rest(exact):
    # 10 tokens free; the batch allocates 30 prompt tokens + 2 reserved outputs = 32
    assert _evict_requests("shortfall", exact)[0] == [22]
    asked, free_after = _evict_requests("whole", exact)
    assert asked == [32]
    assert free_after >= 32  # whole: the tree gave up the whole allocation (node granularity: >= 32)


# ------------------------------------------------------------------ the 0.4.6 admission arithmetic
def test_no_page_per_request():
    """A running request locks 40 prompt tokens and reserves 10 outputs: 50 of 100 are left. 0.4.6
    admits extend + output = 45 + 4 = 49 < 50; 0.5.23 needs 49 + 1 (a page) < 50 and refuses."""
    st = D.SchedState(capacity=100, policy="fcfs", running=[(_seq(1000, 40), 10, 0)], waiting=[(_seq(2000, 45), 4)])
    assert [i for i, _, _ in _decide(st, ratio=1.0, **V046).admitted] == [0]
    assert _decide(st, **D.EXACT).admitted == []


def test_input_budget_is_checked_between_requests_with_chunking_too():
    """chunk 64, max_prefill 40: after 30 tokens 10 are left; 0.4.6 refuses the next 30 (30 > 10),
    0.5.23 checks the input budget between requests only without chunking and admits it."""
    st = D.SchedState(
        capacity=4000,
        policy="fcfs",
        chunked_prefill_size=64,
        max_prefill_tokens=40,
        waiting=[(_seq(1000, 30), 2), (_seq(2000, 30), 2), (_seq(3000, 5), 2)],
    )
    assert [i for i, _, _ in _decide(st, **V046).admitted] == [0]
    assert [i for i, _, _ in _decide(st, **D.EXACT).admitted] == [0, 1]
    # the comparison is strict: exactly the remaining budget is admitted
    st.waiting[1] = (_seq(2000, 10), 2)
    assert [i for i, _, _ in _decide(st, **V046).admitted] == [0, 1]


def _reference_room(capacity, tree, generated, remaining, ratio):
    """0.4.6's rem_total before the pass: available + evictable - sum(min(rem, 4096) * ratio)."""
    return capacity - tree - generated + 0 - sum([min(r, 4096) * ratio for r in remaining])


@pytest.mark.parametrize("ratio", [1.0, 0.7, 0.098])
def test_running_outputs_are_reserved_at_new_token_ratio(ratio):
    """Two running requests (40 + 10 prompt tokens locked, 20 and 30 outputs, 5 and 10 generated):
    0.4.6 reserves their remaining 15 + 20 outputs times the ratio, so a waiting request
    (extend + output = total) passes its memory rule iff total < that room; the simulator's full
    output reservation then refuses what exceeds its physical room ("physical")."""
    cap = 200
    running = [(_seq(1000, 40), 20, 5), (_seq(2000, 10), 30, 10)]
    room = _reference_room(cap, 50, 15, [15, 20], ratio)
    physical_room = cap - 50 - 50  # 50 tree tokens, 50 outputs reserved in full
    seen = set()
    for total in range(60, 140, 3):
        st = D.SchedState(capacity=cap, policy="fcfs", running=running, waiting=[(_seq(3000, total - 4), 4)])
        adders = []
        d = _decide(st, ratio=ratio, adder_out=adders, **V046)
        want = "memory" if total >= room else ("physical" if total > physical_room else "")
        assert adders[0].refused == want and bool(d.admitted) == (want == ""), (total, room)
        seen.add(want)
    assert seen == ({"memory", ""} if ratio == 1.0 else {"memory", "physical", ""})


def test_new_token_ratio_decays_per_decode_step_and_resets_when_idle():
    """scheduler.py: ratio = max(ratio - (0.7 - 0.098) / 600, 0.098) at each decode step, 0.7 when idle."""
    reqs = [make_request(0, 0.0, _seq(100, 20), output_len=700), make_request(1, 0.0, _seq(900, 20), output_len=3)]
    table = RequestTable(reqs)
    table.key(0)
    table.key(1)
    w = SimWorker(0, make_cache(5000, {"name": "lru"}, 0), _Cost(), SchedulerConfig(**V046), table, "lru")
    adder = w.prefill_adder
    ref = 0.7
    decay = (0.7 - 0.7 * 0.14) / 600
    w.enqueue(0)
    now = 0.0
    for step in range(1, 700):
        dur = w.start_step(now)
        now += dur
        w.end_step(now)
        if step == 300:  # a pass: the ratio is brought up to date then
            w.enqueue(1)
        if step == 302:
            # the first step prefilled request 0; request 1's pass came after 299 decode steps
            for _ in range(299):
                ref = max(ref - decay, 0.7 * 0.14)
            assert adder.ratio == ref and 0.098 < ref < 0.7
    w.prefill_adder._decay()
    assert adder.ratio == 0.7 * 0.14  # the floor, after 698 decode steps
    while w.start_step(now) >= 0:
        now += 0.01
        w.end_step(now)
    assert adder.ratio == 0.7  # idle: back to its initial value


def test_a_full_running_batch_stops_even_the_chunked_request():
    """0.4.6 returns no prefill batch when max_running_requests run, chunked request or not."""
    st = D.SchedState(
        capacity=4000,
        max_running_requests=1,
        chunked_prefill_size=32,
        running=[(_seq(1000, 10), 5, 1)],
        chunked=(_seq(20000, 90), 3, 32),
        waiting=[(_seq(3000, 5), 2)],
    )
    assert _decide(st, **V046).chunk_continue == 0
    assert _decide(st, **D.EXACT).chunk_continue == 32


# ------------------------------------------------------------------ a reference of the 0.4.6 pass (fcfs)
def _prefixes(seq):
    return {tuple(seq[:k]) for k in range(1, len(seq) + 1)}


def _match(trie, seq):
    m = 0
    while m < len(seq) and tuple(seq[: m + 1]) in trie:
        m += 1
    return m


def _reference_046(st, ratio):
    """0.4.6's get_new_batch_prefill + PrefillAdder under fcfs, restated over sets of prefixes (the
    tree: every prefix of what is cached; locked: every prefix of what a request holds), plus the
    simulator's full output reservation ("physical"). Returns (admitted, chunk_continue, new_chunked)."""
    trie = set()
    for seq in list(st.cached) + [p for p, _, _ in st.running]:
        trie |= _prefixes(seq)
    locked = set()
    for p, _, _ in st.running:
        locked |= _prefixes(p)
    if st.chunked is not None:
        trie |= _prefixes(st.chunked[0][: st.chunked[2]])
        locked |= _prefixes(st.chunked[0][: st.chunked[2]])
    total = len(trie)
    avail = st.capacity - total - sum(g for _, _, g in st.running)
    reserved = sum(o for _, o, _ in st.running) + (st.chunked[1] if st.chunked else 0)
    offset = sum([min(o - g, 4096) * ratio for _, o, g in st.running])
    cur = 0
    chunk = st.chunked_prefill_size if st.chunked_prefill_size and st.chunked_prefill_size > 0 else None
    if not st.waiting and st.chunked is None:
        return [], None, None
    if len(st.running) >= st.max_running_requests:
        return [], (0 if st.chunked else None), None
    rem_input, rem_chunk = st.max_prefill_tokens, chunk
    n_run, phys, chunk_continue = 0, 0, None
    if st.chunked is not None:
        p, o, done = st.chunked
        n = len(p) - done if chunk is None else min(len(p) - done, rem_chunk)
        offset += n + (min(o, 4096) if n == len(p) - done else 0)
        cur += n
        rem_input -= n
        rem_chunk = None if chunk is None else rem_chunk - n
        n_run, phys, chunk_continue = 1, n, n
    admitted, new_chunked = [], None
    if rem_input <= 0 or (rem_chunk is not None and rem_chunk <= 0):
        return admitted, chunk_continue, new_chunked
    for i, (p, o) in enumerate(st.waiting):
        if len(st.running) + n_run >= st.max_running_requests:
            break
        m = _match(trie, p[:-1])
        extend = len(p) - m
        need = extend + min(o, 4096)
        if need >= avail + total - len(locked) - offset:
            break
        if n_run and extend > rem_input:
            break
        now_locked = locked | _prefixes(p[:m])
        room = avail + total - len(now_locked)
        if need > room - offset:
            break
        full = _match(trie, p)
        new = len(p) - full if full < len(p) else 1
        alloc = new if rem_chunk is None else min(new, rem_chunk)
        if phys + alloc + o > st.capacity - total - reserved + total - len(now_locked):
            break  # the simulator's full output reservation
        phys += alloc + o  # the pass's KV: its new tokens and reserved outputs
        locked = now_locked
        n = extend if rem_chunk is None or extend <= rem_chunk else rem_chunk
        offset += need if n == extend else n
        cur += n
        rem_input -= n
        admitted.append((i, m, n))
        n_run += 1
        if n < extend:
            new_chunked = i
            break
        rem_chunk = None if rem_chunk is None else rem_chunk - n
        if room - offset <= 0 or room - cur <= 0 or rem_input <= 0 or (rem_chunk is not None and rem_chunk <= 0):
            break
    return admitted, chunk_continue, new_chunked


def test_the_0_4_6_pass_agrees_with_a_reference_on_generated_fcfs_states():
    kinds = set()
    for seed in range(400):
        st = D.random_state(np.random.default_rng(10_000 + seed))
        st.policy = "fcfs"
        ratio = (1.0, 0.7, 0.098)[seed % 3]
        d = _decide(st, ratio=ratio, **V046)
        admitted, chunk_continue, new_chunked = _reference_046(st, ratio)
        assert (d.admitted, d.chunk_continue, d.new_chunked) == (admitted, chunk_continue, new_chunked), seed
        assert d.order == list(range(len(st.waiting)))
        kinds.add((bool(admitted), new_chunked is not None, chunk_continue is not None))
    assert len(kinds) >= 5  # admissions, refusals, chunks continued and new ones all occur

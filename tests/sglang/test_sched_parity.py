"""Scheduler parity: our SimWorker's prefill-batch decision vs SGLang 0.5.23's own scheduling code.

Each state is built in both (tests/sglang/sched_driver.py): SGLang's `RadixCache` +
`SchedulePolicy.calc_priority` + `PrefillAdder` on one side, our SimWorker + repro.kvcache on
the other. Compared decision by decision: the waiting-queue order, which requests the batch
admits, how many tokens each prefills (the chunk), and the cached prefix each is credited with
(SGLang's own `match_prefix`, never fed our numbers). The exact mode (every switch of
repro/sim/worker.py's SchedulerConfig on) must agree on every case and every generated state;
the rates without the switches, and with each alone, are printed (the REPRODUCE.md table).

    .venv-sglang/bin/python -m pytest -m sglang tests/sglang/test_sched_parity.py
    PYTHONPATH=. .venv-sglang/bin/python -m tests.sglang.sched_driver 3000   # the rates table
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.sglang import sched_driver as D

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def sgs(sg):  # the radix-cache import (conftest) first: it skips with the reason if SGLang is missing
    return D.import_sglang_scheduler()


def _same(state, **kw):
    theirs = D.sglang_decide(state, **kw)
    ours = D.ours_decide(state, **D.EXACT)
    ka, kb = theirs.kinds(), ours.kinds()
    diff = {k: (ka[k], kb[k]) for k in D.KINDS if ka[k] != kb[k]}
    assert not diff, f"SGLang vs ours (exact): {diff}"
    return theirs, ours


def _seq(base, n, start=0):
    return list(range(base + start, base + start + n))


SYS_A = _seq(1000, 48)
SYS_B = _seq(2000, 40)


def _cases():
    q = lambda sys, k, n=6: sys + _seq(5000 + 100 * k, n)  # noqa: E731
    yield "lpm_shared_prefixes", D.SchedState(
        capacity=2000, cached=[SYS_A, SYS_B[:20]],
        waiting=[(_seq(9000, 10), 4), (q(SYS_B, 1), 4), (q(SYS_A, 2), 4), (q(SYS_A[:30], 3), 4)])
    # four requests that share a 40-token prefix nothing in the cache holds: SGLang lets one go
    # first and puts the others last, so that they hit what it computes
    yield "in_batch_prefix_rule", D.SchedState(
        capacity=2000, cached=[SYS_A[:10]],
        waiting=[(q(SYS_B, k), 4) for k in range(4)] + [(q(SYS_A, 9), 4), (_seq(9000, 12), 4)])
    yield "fcfs_fallback_over_128", D.SchedState(
        capacity=20000, cached=[SYS_A], max_prefill_tokens=600,
        waiting=[(q(SYS_A if k % 3 == 0 else SYS_B, k), 2) for k in range(130)])
    yield "fcfs", D.SchedState(capacity=2000, policy="fcfs", cached=[SYS_A],
                               waiting=[(q(SYS_B, 1), 4), (q(SYS_A, 2), 4)])
    # max_prefill_tokens without chunking: the first request may exceed it, a later one stops the batch
    yield "input_budget_no_chunking", D.SchedState(
        capacity=4000, chunked_prefill_size=None, max_prefill_tokens=60,
        waiting=[(_seq(10000, 70), 2), (_seq(11000, 5), 2), (_seq(12000, 5), 2)])
    yield "input_budget_no_chunking_second", D.SchedState(
        capacity=4000, chunked_prefill_size=None, max_prefill_tokens=60,
        waiting=[(_seq(10000, 30), 2), (_seq(11000, 30), 2), (_seq(12000, 5), 2)])
    # with chunking SGLang checks max_prefill_tokens only between requests (it may overshoot)
    yield "input_budget_with_chunking", D.SchedState(
        capacity=4000, chunked_prefill_size=64, max_prefill_tokens=40,
        waiting=[(_seq(10000, 30), 2), (_seq(11000, 30), 2), (_seq(12000, 5), 2)])
    yield "chunk_budget_exact_fit", D.SchedState(
        capacity=4000, chunked_prefill_size=32,
        waiting=[(_seq(10000, 20), 2), (_seq(11000, 12), 2), (_seq(12000, 5), 2)])
    yield "new_chunked_request", D.SchedState(
        capacity=4000, chunked_prefill_size=32, waiting=[(_seq(10000, 20), 2), (_seq(11000, 40), 2)])
    yield "chunked_request_continuing", D.SchedState(
        capacity=4000, chunked_prefill_size=32, chunked=(_seq(20000, 90), 3, 32),
        waiting=[(_seq(20000, 40) + [7, 7], 2), (_seq(11000, 10), 2)])
    yield "chunked_request_last_chunk", D.SchedState(
        capacity=4000, chunked_prefill_size=32, chunked=(_seq(20000, 80), 3, 64),
        waiting=[(_seq(20000, 70) + [7], 2), (_seq(11000, 10), 2)])
    yield "max_running_requests", D.SchedState(
        capacity=4000, max_running_requests=3, running=[(q(SYS_A, 1), 5, 2)],
        waiting=[(q(SYS_A, k), 3) for k in range(2, 6)])
    running = [(q(SYS_A, 1), 10, 3), (q(SYS_B, 2), 10, 1)]
    need = D.SchedState(capacity=0, cached=[SYS_A, SYS_B], running=running).tokens_needed()
    # memory: SYS_A and SYS_B locked by the running batch; room for one more prompt + output
    yield "memory_too_full_to_admit", D.SchedState(
        capacity=need + 20, cached=[SYS_A, SYS_B], running=running,
        waiting=[(q(SYS_A, 3, 8), 6), (q(SYS_B, 4, 8), 6), (q(SYS_A, 5, 2), 1)])
    yield "memory_exact_edge", D.SchedState(
        capacity=need + 16, cached=[SYS_A, SYS_B], running=running,
        waiting=[(q(SYS_A, 3, 8), 6), (q(SYS_A, 5, 2), 1)])
    # evictable cache makes room: admission evicts an unrelated cached prompt
    yield "memory_by_eviction", D.SchedState(
        capacity=need + 30, cached=[SYS_A, SYS_B, _seq(30000, 25)], running=running,
        waiting=[(q(SYS_A, 3, 20), 6), (q(SYS_B, 4, 8), 6)])
    yield "fully_cached_prompt", D.SchedState(
        capacity=2000, cached=[SYS_A + [1, 2, 3]], waiting=[(SYS_A + [1, 2, 3], 2), (SYS_A[:47], 2), (q(SYS_A, 7), 2)])


CASES = dict(_cases())


@pytest.mark.parametrize("name", sorted(CASES))
def test_listed_case(sgs, name):
    state = CASES[name]
    theirs, _ = _same(state)
    tags = D.coverage(state, theirs)
    wanted = {
        "lpm_shared_prefixes": "lpm_shared_prefix", "in_batch_prefix_rule": "in_batch_prefix_rule",
        "fcfs_fallback_over_128": "fcfs_fallback_over_128", "memory_too_full_to_admit": "memory_too_full_to_admit",
        "chunked_request_continuing": "chunked_continuing", "new_chunked_request": "new_chunk",
        "max_running_requests": "max_running_requests", "input_budget_no_chunking_second": "budget_edge",
    }.get(name)
    assert wanted is None or wanted in tags, (name, tags)  # the case exercises what it is named after


def test_in_batch_rule_changes_the_order_and_the_simple_mode_differs(sgs):
    """The listed in-batch case really separates the modes: SGLang defers the duplicates."""
    state = CASES["in_batch_prefix_rule"]
    theirs = D.sglang_decide(state)
    assert theirs.order[:1] == [4] and theirs.order[-3:] == [1, 2, 3], theirs.order
    assert D.ours_decide(state, **D.SIMPLE).order != theirs.order  # without the switches: plain lpm


@pytest.mark.parametrize("ratio", [0.098, 0.3, 0.7, 1.0])
def test_reservation_with_ignore_eos_is_full_whatever_new_token_ratio(sgs, ratio):
    """(b): our harness sends ignore_eos (repro/backends/sglang/protocol.py), and SGLang then
    reserves running requests' remaining output in full (ratio 1.0), so its new_token_ratio --
    from the initial 0.7 down to its floor 0.098 -- does not change a decision."""
    _same(CASES["memory_too_full_to_admit"], new_token_ratio=ratio)
    _same(CASES["memory_exact_edge"], new_token_ratio=ratio)


def test_without_ignore_eos_sglang_reserves_less_and_the_test_sees_it(sgs):
    """The same state with EOS-terminated requests: SGLang reserves new_token_ratio of the running
    requests' outputs and admits more than full reservation allows (what we do not model)."""
    state = CASES["memory_too_full_to_admit"]
    full = D.sglang_decide(state)
    ratio = D.sglang_decide(state, new_token_ratio=0.098, ignore_eos=False)
    assert len(ratio.admitted) > len(full.admitted)


N_GENERATED = 3000


def test_generated_states_agree_in_exact_mode_with_coverage(sgs, capsys):
    """N_GENERATED random states (fixed seeds): 100 % agreement per decision kind in exact mode;
    every listed case is covered by at least 1 % of them; the per-mode rates are printed."""
    rates, cover = D.agreement(N_GENERATED)
    with capsys.disabled():
        print(f"\n{N_GENERATED} generated states, agreement with SGLang 0.5.23:")
        for m, r in rates.items():
            print(f"  {m:28s} " + "  ".join(f"{k} {100 * v:6.2f}%" for k, v in r.items()))
        print("  coverage: " + ", ".join(f"{c} {100 * v / N_GENERATED:.1f}%" for c, v in sorted(cover.items())))
    assert rates["exact (all switches)"] == {k: 1.0 for k in D.KINDS}
    for case in ("lpm_shared_prefix", "in_batch_prefix_rule", "fcfs_fallback_over_128", "fcfs", "budget_edge",
                 "chunked_continuing", "new_chunk", "memory_too_full_to_admit", "max_running_requests"):
        assert cover.get(case, 0) >= 0.01 * N_GENERATED, (case, cover)
    assert min(rates["simple (all switches off)"].values()) < 1.0  # the generator reaches the differences


_COVER = Counter()


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), big=st.integers(0, 19))
def test_generated_states_property(sgs, seed, big):
    state = D.random_state(np.random.default_rng(seed), big_queue=big == 0)
    theirs, _ = _same(state)
    for tag in D.coverage(state, theirs):
        event(tag)


@pytest.mark.parametrize("name", ["chunked_request_continuing", "chunked_request_last_chunk"])
def test_chunk_insertion_tree_held_and_credited_prefix_mid_chunk(sgs, name):
    """(c): while a request is mid-chunk SGLang's tree holds its prompt only as far as prefilled
    (cache_unfinished_req after each chunk); a later request sharing that prompt is credited the
    computed part only. per_chunk (the default) agrees on both; whole (the prompt inserted at
    admission) credits the same prefix but holds the uncomputed rest in the tree (more tokens
    held, more locked)."""
    state = CASES[name]
    theirs = D.sglang_decide(state)
    done = state.chunked[2]
    credited = dict((i, p) for i, p, _ in theirs.admitted)
    if name == "chunked_request_last_chunk":  # request 0 shares more than `done` tokens with the chunked prompt
        assert credited.get(0) == done
    else:  # the continuing chunk spends the chunk budget: nothing else is admitted
        assert not credited
    whole = D.ours_decide(state, **{**D.EXACT, "chunk_insertion": "whole"})
    per_chunk = D.ours_decide(state, **D.EXACT)
    assert per_chunk.kinds() == theirs.kinds()
    assert whole.kinds()["prefix"] == theirs.kinds()["prefix"]
    rest = len(state.chunked[0]) - done
    assert whole.tree == (theirs.tree[0] + rest, theirs.tree[1])  # the rest held, and locked

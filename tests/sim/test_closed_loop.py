"""The simulator driven by a client (repro.workloads.clients): the authors' closed loop and the
warm-up-then-open-loop GSP client, checked against a plain reference client written here."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_fakes import FixedCostModel, RandomRouter, RoundRobinRouter, TrieCache, make_request

from repro.sim.cluster import SimCluster
from repro.sim.worker import SchedulerConfig
from repro.workloads.clients import ClosedLoopPlan, WarmupThenOpenLoopPlan

COST = FixedCostModel(base_s=0.01, prefill_token_s=0.0005, decode_seq_s=0.001)


def conversation_universe(turns: list[int], base_len: int = 12):
    """Universe of turn requests: conversation c's turn k extends turn k-1's full path."""
    reqs, convs = [], []
    for c, n in enumerate(turns):
        ids, prompt = [], np.array([], dtype=np.int32)
        for k in range(n):
            msg = 10_000 * (c + 1) + 100 * k + np.arange(base_len)
            prompt = np.concatenate([prompt, msg]).astype(np.int32)
            gen = 900_000 + 1000 * c + 10 * k + np.arange(2)
            r = make_request(len(reqs), 0.0, prompt, 2, group=c, generated=gen)
            object.__setattr__(r, "conversation_id", c)
            object.__setattr__(r, "turn", k)
            ids.append(r.id)
            reqs.append(r)
            prompt = np.concatenate([prompt, gen]).astype(np.int32)
        convs.append(tuple(ids))
    return reqs, tuple(convs)


class Recorder:
    """Wraps a client: records in flight at each send and the completion -> slot links."""

    def __init__(self, inner):
        self.inner = inner
        self.expected_requests = inner.expected_requests
        self.in_flight = 0
        self.max_in_flight = 0
        self.sent: list[tuple[int, float, int, int]] = []  # (id, time, conversation, turn)
        self.completions: list[tuple[float, int]] = []  # (time, slots opened)

    def start(self):
        return self.inner.start()

    def send(self, now, rid):
        r = self.inner.send(now, rid)
        if r is not None:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.sent.append((r.id, now, r.conversation_id, r.turn))
        return r

    def on_complete(self, request, now):
        self.in_flight -= 1
        slots = self.inner.on_complete(request, now)
        self.completions.append((now, len(slots)))
        return slots


def run(plan, universe, workers=2, router=None, cap=100_000):
    client = Recorder(plan.start(universe))
    sim = SimCluster(
        universe,
        [TrieCache(cap) for _ in range(workers)],
        COST,
        router or RoundRobinRouter(),
        SchedulerConfig(),
        "lru",
        0,
        client=client,
    )
    return sim.run(), client


@pytest.mark.parametrize("concurrency", [1, 3, 8])
def test_closed_loop_keeps_at_most_concurrency_in_flight_and_finishes_every_conversation(concurrency):
    universe, convs = conversation_universe([2, 4, 6, 8, 2, 4])
    plan = ClosedLoopPlan(convs, concurrency=concurrency, poll_rate_per_s=20.0, seed=3, warmup=(convs[0][0],))
    res, client = run(plan, universe)
    assert client.max_in_flight <= concurrency
    recs = res.records
    assert recs["finish_s"].notna().all() and len(recs) == len(client.sent)
    # every conversation's last turn was sent and completed (the loop ends only then)
    last = {(c, len(t) - 1) for c, t in enumerate(convs)}
    assert last <= {(c, k) for _, _, c, k in client.sent[1:]}
    # ids are the send order, arrivals are the send times, non-decreasing
    assert recs["id"].tolist() == list(range(len(recs)))
    assert np.all(np.diff(recs["arrival_s"].to_numpy()) >= 0)
    # a turn k > 0 is sent only after some send of turn k - 1 of its conversation completed
    finish = dict(zip(recs["id"], recs["finish_s"]))
    for _, t, c, k in client.sent[1:]:
        if k > 0:
            done = [finish[r] for r, _, c2, k2 in client.sent[1:] if c2 == c and k2 == k - 1]
            assert min(done) <= t


def test_every_completion_opens_a_slot_at_the_next_poll_and_duplicates_happen():
    universe, convs = conversation_universe([3] * 4)
    plan = ClosedLoopPlan(convs, concurrency=8, poll_rate_per_s=50.0, seed=0)
    res, client = run(plan, universe)
    # the first fill draws 8 times among 4 conversations: some conversation is in flight twice,
    # and both sends are its turn 0
    first = [(c, k) for _, t, c, k in client.sent if t == 0.0]
    assert len(first) == 8 and len({c for c, _ in first}) < 8 and {k for _, k in first} == {0}
    # more requests than distinct turns: duplicate draws resend turns
    assert len(client.sent) > sum(len(c) for c in convs)
    # every completion (after the warm-up-free start) opened at least one slot
    assert all(n >= 1 for _, n in client.completions)


def test_poll_pacing_delays_the_refill_and_inf_refills_at_once():
    universe, convs = conversation_universe([4] * 3)
    fast, fc = run(ClosedLoopPlan(convs, 2, math.inf, seed=1), universe)
    slow, sc = run(ClosedLoopPlan(convs, 2, 0.5, seed=1), universe)
    finish = sorted(fast.records["finish_s"])
    sends = sorted(fast.records["arrival_s"])[2:]
    assert all(any(abs(s - f) < 1e-12 for f in finish) for s in sends)  # inf: sent at a completion
    assert slow.records["finish_s"].max() > fast.records["finish_s"].max()


def test_closed_loop_is_deterministic_per_seed():
    universe, convs = conversation_universe([2, 4, 6, 8])
    a, ca = run(ClosedLoopPlan(convs, 3, 12.0, seed=5, warmup=(0,)), universe, router=RandomRouter())
    b, cb = run(ClosedLoopPlan(convs, 3, 12.0, seed=5, warmup=(0,)), universe, router=RandomRouter())
    c, cc = run(ClosedLoopPlan(convs, 3, 12.0, seed=6, warmup=(0,)), universe, router=RandomRouter())
    assert a.records.equals(b.records) and ca.sent == cb.sent
    assert ca.sent != cc.sent


def test_warmup_runs_alone_then_the_loop_starts_after_the_gap():
    universe, convs = conversation_universe([2, 2, 2])
    plan = ClosedLoopPlan(convs, 3, 12.0, seed=0, warmup=(convs[1][0],), start_gap_s=1.0)
    res, client = run(plan, universe)
    recs = res.records
    warm_finish = recs.loc[recs["id"] == 0, "finish_s"].item()
    assert client.sent[0][2:] == (1, 0)
    assert (recs["arrival_s"][1:] == warm_finish + 1.0).sum() == 3  # the first fill
    # the warm-up has its own state: conversation 1 still starts at turn 0
    assert (1, 0) in {(c, k) for _, _, c, k in client.sent[1:]}


def reference_states(plan, events):
    """multi-turn.py's state rule replayed on (kind, conversation, turn) events in order."""
    done = [0] * len(plan.conversations)
    for kind, c, k in events:
        if kind == "send":
            assert done[c] == k  # a send is the conversation's next turn
            assert k < len(plan.conversations[c])
        else:
            done[c] = k + 1  # a completion sets it, also backwards
    return done


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=st.lists(st.integers(1, 5), min_size=1, max_size=6),
    conc=st.integers(1, 6),
    rate=st.sampled_from([0.7, 5.0, 40.0, math.inf]),
    seed=st.integers(0, 10_000),
)
def test_client_follows_the_reference_state_rule(turns, conc, rate, seed):
    universe, convs = conversation_universe(turns, base_len=5)
    plan = ClosedLoopPlan(convs, conc, rate, seed=seed)
    res, client = run(plan, universe, router=RandomRouter())
    recs = res.records.set_index("id")
    events = []
    for rid, t, c, k in client.sent:
        events.append((t, 1, rid, "send", c, k))
        events.append((recs.loc[rid, "finish_s"], 0, rid, "done", c, k))
    events.sort(key=lambda e: (e[0], e[1], e[2]))  # completions before sends at the same time
    done = reference_states(plan, [(kind, c, k) for *_, kind, c, k in events])
    assert done == [len(c) for c in convs]  # the loop ran every conversation to its end
    assert client.max_in_flight <= conc


def test_warmup_then_open_loop_shifts_the_stream_behind_the_warmup():
    reqs = [make_request(i, 0.0, 100 * i + np.arange(30), 3) for i in range(5)]
    offsets = (0.0, 0.1, 0.1, 0.5, 2.0)
    plan = WarmupThenOpenLoopPlan(warmup=(2,), stream=(2, 0, 1, 3, 4), offsets_s=offsets, start_gap_s=1.0)
    res, client = run(plan, reqs, workers=1)
    recs = res.records
    w = recs.loc[0, "finish_s"]
    assert recs["arrival_s"].tolist() == [0.0] + [w + 1.0 + o for o in offsets]
    assert [s[0] for s in client.sent] == list(range(6))
    # the first timed request repeats the warm-up's prompt, which nothing flushed: a cache hit
    assert recs.loc[1, "cached_tokens"] > 0 and recs.loc[2, "cached_tokens"] == 0


def test_open_loop_without_a_client_is_unchanged():
    """The client code path leaves the plain path alone: an open-loop list runs as before, and a
    client replaying the same times gives the same records."""
    reqs = [make_request(i, 0.05 * i, (i % 3) * 1000 + np.arange(20 + i), 2, group=i % 3) for i in range(12)]
    plain = SimCluster(
        reqs, [TrieCache(10_000) for _ in range(2)], COST, RoundRobinRouter(), SchedulerConfig(), "lru", 0
    )
    a = plain.run().records
    plan = WarmupThenOpenLoopPlan(warmup=(), stream=tuple(range(12)), offsets_s=tuple(r.arrival_s for r in reqs))
    b, _ = run(plan, [r.resent(r.id, 0.0) for r in reqs])
    assert a.equals(b.records)

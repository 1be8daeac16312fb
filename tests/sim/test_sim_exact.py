"""Tiny scenarios on one worker with a fixed-coefficient cost model: exact expected times.

Cost model unless stated: step = 10 ms + 1 ms per prefilled token + 2 ms per decoding request.
Each expected value is derived by hand in the comments.
"""

from __future__ import annotations

import numpy as np
import pytest

from repro.sim.cluster import SimCluster
from repro.sim.worker import SchedulerConfig
from tests.sim.sim_fakes import FixedCostModel, FixedRouter, TrieCache, make_request

COST = FixedCostModel(base_s=0.010, prefill_token_s=0.001, decode_seq_s=0.002)


def run(requests, capacity=1000, cost=COST, observer=None, router=None, **sched):
    router = router or FixedRouter()
    sim = SimCluster(requests, [TrieCache(capacity)], cost, router, SchedulerConfig(**sched), "lru", 0, observer)
    res = sim.run()
    return res, router


def by_id(records, column):
    return dict(zip(records["id"], records[column]))


def assert_times(records, first, finish, cached):
    for column, want in (("first_token_s", first), ("finish_s", finish)):
        got = by_id(records, column)
        for rid, t in want.items():
            assert got[rid] == pytest.approx(t, abs=1e-12), (column, rid)
    assert by_id(records, "cached_tokens") == cached


def test_prefix_hit_decode_batching_and_multi_turn_follow_up():
    a = make_request(0, 0.000, range(1, 11), output_len=3)  # 10 prompt tokens
    b = make_request(1, 0.005, [1, 2, 3, 4, 5, 6, 50, 51, 52, 53, 54, 55], output_len=2)
    c_prompt = np.concatenate([a.prompt_tokens, a.generated_tokens, [77, 78]])  # a's full path + 2
    c = make_request(2, 0.100, c_prompt, output_len=1)
    res, router = run([a, b, c])
    # t=0     prefill [a] 10 new                       -> 0.010+0.010 = 0.020 (a's first token)
    # t=0.020 prefill [b]: a's 6-token prefix is cached -> 6 new: 0.016 -> 0.036 (b's first token)
    # t=0.036 decode [a, b]: 0.010+0.004 -> 0.050: b has 2 tokens (done), a has 2
    # t=0.050 decode [a]: 0.012 -> 0.062: a done
    # t=0.100 prefill [c]: a left its prompt + 2 of its 3 output tokens (12) in the tree (the last
    #         sampled token is never fed forward, so SGLang has no KV for it); 3 new: 0.013 -> 0.113
    assert_times(
        res.records,
        first={0: 0.020, 1: 0.036, 2: 0.113},
        finish={0: 0.062, 1: 0.050, 2: 0.113},
        cached={0: 0, 1: 6, 2: 12},
    )
    # the router heard of each completion once, at its finish time, in finish order
    assert [(rid, round(now, 9)) for rid, _, _, _, _, now in router.completions] == [
        (1, 0.050),
        (0, 0.062),
        (2, 0.113),
    ]
    rid, worker, latency, ttft, cached, _ = router.completions[0]
    assert (worker, cached) == (0, 6)
    assert latency == pytest.approx(0.045) and ttft == pytest.approx(0.031)
    assert res.stats == {"prefill_steps": [3], "decode_steps": [2], "busy_s": [pytest.approx(0.075)]}


def test_no_hit_on_tokens_computed_in_the_same_batch():
    shared = [9, 8, 7, 6, 5, 4, 3, 2]
    d = make_request(0, 0.0, shared + [100, 101])
    e = make_request(1, 0.0, shared + [200, 201])
    f = make_request(2, 1.0, shared + [300, 301, 302])
    res, _ = run([d, e, f])
    # d and e arrive together and share one batch: neither may hit the other's uncomputed
    # prefix (SGLang matches every request of a batch before inserting any): 20 new tokens
    # -> 0.030. f later hits the 8 shared tokens: 3 new -> 1.013.
    assert_times(
        res.records,
        first={0: 0.030, 1: 0.030, 2: 1.013},
        finish={0: 0.030, 1: 0.030, 2: 1.013},
        cached={0: 0, 1: 0, 2: 8},
    )


def test_chunked_prefill_exact_times_and_chunk_order():
    g = make_request(0, 0.000, range(1, 11), output_len=2)  # 10 tokens, chunks of 4
    h = make_request(1, 0.001, [500, 501, 502], output_len=1)
    steps = []

    def observer(event, worker, info):
        if event == "start":
            steps.append((info.prefill, info.decode_batch))

    res, _ = run([g, h], observer=observer, chunked_prefill_size=4)
    # t=0     [g:4]            0.014 -> 0.014
    # t=0.014 [g:4] (chunk budget spent, h waits)        -> 0.028
    # t=0.028 [g:2, h:2] (h chunked with the 2 left)     -> 0.042  g's first token
    # t=0.042 [h:1] prefill has priority over decode     -> 0.053  h done
    # t=0.053 decode [g] 0.012                           -> 0.065  g done
    assert steps == [
        (((0, 4),), 0),
        (((0, 4),), 0),
        (((0, 2), (1, 2)), 0),
        (((1, 1),), 0),
        ((), 1),
    ]
    assert_times(res.records, first={0: 0.042, 1: 0.053}, finish={0: 0.065, 1: 0.053}, cached={0: 0, 1: 0})


def test_max_running_requests_caps_the_batch():
    reqs = [make_request(i, 0.0, [10 * i + k + 1 for k in range(5)], output_len=3) for i in range(4)]
    res, _ = run(reqs, max_running_requests=2)
    # prefill [0,1] 10 tokens 0.020; decode x2 (0.014 each) -> 0.048: 0,1 done
    # prefill [2,3] -> 0.068; decode x2 -> 0.096
    assert_times(
        res.records,
        first={0: 0.020, 1: 0.020, 2: 0.068, 3: 0.068},
        finish={0: 0.048, 1: 0.048, 2: 0.096, 3: 0.096},
        cached={0: 0, 1: 0, 2: 0, 3: 0},
    )


def test_max_prefill_tokens_budget_follows_sglang():
    # budget 8: the first request of a batch always goes in (even a 12-token one, chunking
    # disabled); a later one only if its new tokens < the remaining budget.
    big = make_request(0, 0.0, range(1, 13))
    r1 = make_request(1, 0.0, range(100, 105))  # 5 >= 8 - 12: waits
    r2 = make_request(2, 0.0, range(200, 205))
    steps = []
    res, _ = run(
        [big, r1, r2],
        observer=lambda ev, w, info: steps.append(info.prefill) if ev == "start" else None,
        max_prefill_tokens=8,
        chunked_prefill_size=None,
        schedule_policy="fcfs",
    )
    # [big] 0.022; [r1] (5 < 8, then r2: 5 >= 3 refused) 0.015 -> 0.037; [r2] -> 0.052
    assert steps == [((0, 12),), ((1, 5),), ((2, 5),)]
    assert_times(res.records, first={0: 0.022, 1: 0.037, 2: 0.052}, finish={0: 0.022, 1: 0.037, 2: 0.052},
                 cached={0: 0, 1: 0, 2: 0})


def test_fully_cached_prompt_still_computes_one_token():
    a = make_request(0, 0.0, range(1, 9), output_len=2)
    # a leaves its prompt + its first output token (9 tokens: the second was never fed forward)
    again = make_request(1, 1.0, np.concatenate([a.prompt_tokens, a.generated_tokens[:1]]), output_len=1)
    res, _ = run([a, again])
    # a: 0.018 + decode 0.012 -> 0.030. again: all 9 tokens cached, 1 recomputed -> 1.011
    assert_times(res.records, first={0: 0.018, 1: 1.011}, finish={0: 0.030, 1: 1.011}, cached={0: 0, 1: 9})


def test_request_waits_head_of_line_until_memory_frees_then_evicts():
    k = make_request(0, 0.0, range(1, 11), output_len=5)  # needs 10 + 5 reserved
    l_ = make_request(1, 0.0, range(100, 110), output_len=5)
    res, _ = run([k, l_], capacity=20)
    # k: prefill 0.020, 4 decodes of 0.012 -> 0.068. l needs 15 > 20 - 15 free (k's KV and
    # reservation), waits; at 0.068 k leaves 14 tokens (10 + 5 - 1: its last token has no KV)
    # unlocked: 6 free, evict 9, admit l.
    # l: prefill -> 0.088, 4 decodes -> 0.136
    assert_times(res.records, first={0: 0.020, 1: 0.088}, finish={0: 0.068, 1: 0.136}, cached={0: 0, 1: 0})
    assert res.timings["eviction"]["calls"] == 1
    assert res.timings["eviction"]["evicted_tokens"] == 9


def test_lpm_admits_the_longest_cached_prefix_first_fcfs_does_not():
    warm = make_request(0, 0.0, range(1, 9))
    other = make_request(1, 1.0, range(100, 106))  # arrives first, nothing cached
    sharer = make_request(2, 1.0, list(range(1, 9)) + [7, 7])  # 8 cached tokens
    first = {}
    for policy in ("lpm", "fcfs"):
        res, _ = run([warm, other, sharer], schedule_policy=policy, max_running_requests=1)
        first[policy] = by_id(res.records, "first_token_s")
    # lpm: sharer (2 new) 1.012, then other (6 new) 1.028; fcfs: other 1.016 then sharer 1.028
    assert first["lpm"][2] == pytest.approx(1.012) and first["lpm"][1] == pytest.approx(1.028)
    assert first["fcfs"][1] == pytest.approx(1.016) and first["fcfs"][2] == pytest.approx(1.028)


def test_arrival_at_a_step_end_joins_the_next_batch():
    a = make_request(0, 0.0, range(1, 11))  # prefill ends at exactly 0.020
    b = make_request(1, 0.020, range(100, 105))
    c = make_request(2, 0.020, range(200, 205))
    res, _ = run([a, b, c])
    # both arrivals at 0.020 are queued before the worker forms its next batch: [b, c] 0.020
    assert_times(res.records, first={0: 0.020, 1: 0.040, 2: 0.040}, finish={0: 0.020, 1: 0.040, 2: 0.040},
                 cached={0: 0, 1: 0, 2: 0})


def test_too_large_request_is_a_configuration_error_before_running():
    # the cell assembly checks requests before a simulator (or a live process) is built
    from repro.backends.assembly import validate_requests

    with pytest.raises(ValueError, match="whole KV cache"):
        validate_requests([make_request(0, 0.0, range(1, 20), output_len=2)], [20])
    with pytest.raises(ValueError, match="not sorted"):
        validate_requests([make_request(0, 1.0, [1]), make_request(1, 0.5, [2])], [20])
    with pytest.raises(ValueError, match="duplicate request id"):
        validate_requests([make_request(0, 0.0, [1]), make_request(0, 0.5, [2])], [20])
    with pytest.raises(ValueError, match="no requests"):
        SimCluster([], [TrieCache(20)], COST, FixedRouter(), SchedulerConfig(), "lru", 0)
    with pytest.raises(ValueError, match="schedule_policy"):
        SchedulerConfig(schedule_policy="lifo")
    with pytest.raises(ValueError, match="unknown cluster.scheduler keys"):
        SchedulerConfig.from_config({"max_batch": 3})

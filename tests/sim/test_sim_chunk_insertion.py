"""(c) chunk_insertion: per_chunk (SGLang's cache_unfinished_req after each prefill step) vs whole
(the prompt inserted when its batch is formed), on one worker, outcomes derived by hand.

The decisions of a pass are checked against SGLang's own scheduling code in
tests/sglang/test_sched_parity.py (the pass-start tree -- tokens held, evictable -- among them).
Cost model: 10 ms per step + 1 ms per prefilled token + 2 ms per decoding request.
"""

from __future__ import annotations

import pytest

from repro.kvcache import make_cache
from repro.sim.cluster import SimCluster
from repro.sim.worker import SchedulerConfig
from tests.sim.sim_fakes import FixedCostModel, FixedRouter, make_request

COST = FixedCostModel(base_s=0.010, prefill_token_s=0.001, decode_seq_s=0.002)
X = list(range(1, 61))  # 60 tokens, cached by request 0
B = list(range(1000, 1120))  # 120 fresh tokens, prefilled in chunks of 32: 32, 32, 32, 24


def _run(mode, capacity=150, extra=()):
    reqs = [make_request(0, 0.0, X, output_len=1), make_request(1, 1.0, B, output_len=2), *extra]
    cache = make_cache(capacity, {"name": "lru", "granularity": "node"}, 0)
    seen = []  # per prefill step of B, at its start and end: (event, B's tokens in the tree, X's, kv_used_tokens)
    in_b = [False]

    def observer(event, w, info):
        if event == "start":
            in_b[0] = any(i == 1 for i, _ in info.prefill)
        if in_b[0]:
            # the requests' own prompts (the table keeps a key only while its request is in flight)
            seen.append((event, w.cache.peek_prefix(reqs[1].prompt_tokens), w.cache.peek_prefix(reqs[0].prompt_tokens),
                         w.kv_used_tokens))

    sched = SchedulerConfig(chunked_prefill_size=32, chunk_insertion=mode)
    sim = SimCluster(reqs, [cache], COST, FixedRouter(), sched, "lru", 0, observer=observer)
    recs = sim.run().records.set_index("id")
    return recs, seen


def test_default_is_per_chunk_and_bad_values_are_errors():
    assert SchedulerConfig().chunk_insertion == "per_chunk"
    with pytest.raises(ValueError, match="chunk_insertion"):
        SchedulerConfig(chunk_insertion="eager")
    with pytest.raises(ValueError, match="per_chunk needs cluster.scheduler.exact_budgets"):
        SchedulerConfig(exact_budgets=False)  # per_chunk is defined on SGLang's admission arithmetic
    SchedulerConfig(exact_budgets=False, chunk_insertion="whole")


def _steps(seen):
    """(B in tree, X in tree, kv_used) at the start and end of each of B's four prefill steps."""
    start = [s[1:] for s in seen if s[0] == "start"]
    end = [s[1:] for s in seen if s[0] == "end"]
    return start, end


def test_per_chunk_tree_holds_the_prompt_as_far_as_prefilled():
    # Request 0 (1 output token) leaves X alone (60 tokens) evictable: its one sampled token was
    # never fed forward, so it has no KV (SGLang caches prompt + output - 1). B (120 + 2 output) is
    # admitted: SGLang's check 120 + 2 + 1 < 90 free + 60 evictable. per_chunk allocates only the
    # first chunk (32 + 2 reserved <= 90 free): X stays; B is in the tree 32, 64, 96, 120 after
    # each step. X, itself prefilled in chunks (32 + 28), is the nodes [0, 32) [32, 60). The third
    # chunk finds 150 - 60 - 64 - 2 = 24 free < 32: LRU evicts the leaf [32, 60) (28 >= 8); the
    # fourth finds 20 < 24 and evicts [0, 32).
    _, seen = _run("per_chunk")
    start, end = _steps(seen)
    assert [b for b, _, _ in end[:4]] == [32, 64, 96, 120]
    assert [x for _, x, _ in end[:4]] == [60, 60, 32, 0]
    # during a step the router sees the tree + the step's allocated chunk (as SGLang's token usage)
    assert [u for _, _, u in start[:4]] == [60 + 32, 60 + 64, 32 + 64 + 32, 96 + 24]
    assert [b for b, _, _ in start[:4]] == [0, 32, 64, 96]  # nothing beyond the computed prefix


def test_whole_tree_holds_the_whole_prompt_from_admission():
    # whole: B's 120 + 2 is allocated at admission (122 > 89 free): X is evicted at once
    _, seen = _run("whole")
    start, end = _steps(seen)
    assert [b for b, _, _ in start[:4]] == [120] * 4
    assert [x for _, x, _ in end[:4]] == [0] * 4
    assert [u for _, _, u in start[:4]] == [120] * 4


def test_a_later_request_sharing_x_is_credited_alike_in_both_modes():
    # C = X + 5 arrives during B's first chunk; B's continuing chunks take the whole chunk budget
    # (32), so C can only join B's last chunk (24 + 5 <= 32). At capacity 150 X is (partly) gone
    # by then in both modes and C does not fit beside B's last chunk (per_chunk: 33 new + 1 output
    # + 24 > 20 free + 0 unlocked evictable), so it waits and finds X evicted: 0. At capacity 200
    # nothing is ever evicted (60 + 120 + 2 + 5 + 1 < 200): C hits 60 in both modes. The modes
    # differ in when X is evicted (above), not in what a pass credits.
    c = make_request(2, 1.02, X + [900, 901, 902, 903, 904], output_len=1)
    for mode in ("per_chunk", "whole"):
        recs, _ = _run(mode, capacity=150, extra=[c])
        assert recs.loc[2, "cached_tokens"] == 0
        recs, _ = _run(mode, capacity=200, extra=[c])
        assert recs.loc[2, "cached_tokens"] == 60


def test_credited_prefix_of_a_request_sharing_a_prompt_mid_chunk():
    # D shares B's first 100 tokens and arrives during B's second chunk: it is admitted with B's
    # last chunk (24 tokens; 8 of the budget left for D) and credited what B had computed when the
    # pass began (96), in both modes (whole caps the tree match at the computed KV)
    d = make_request(2, 1.06, B[:100] + [5, 6, 7], output_len=1)
    for mode in ("per_chunk", "whole"):
        recs, _ = _run(mode, capacity=400, extra=[d])
        assert recs.loc[2, "cached_tokens"] == 96, mode

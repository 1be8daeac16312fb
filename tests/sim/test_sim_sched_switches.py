"""The SGLang-exact scheduler switches on tiny one-worker scenarios (hand-derived outcomes).

The switches are checked decision by decision against SGLang's own scheduling code in
tests/sglang/test_sched_parity.py (CPU SGLang env); these run in the default suite and pin
what each switch changes. Cost model: 10 ms per step + 1 ms per prefilled token + 2 ms per
decoding request (test_sim_exact.py's).
"""

from __future__ import annotations

import pytest

from repro.kvcache import make_cache
from repro.sim.cluster import SimCluster
from repro.sim.worker import SchedulerConfig
from tests.sim.sim_fakes import FixedCostModel, FixedRouter, TrieCache, make_request

COST = FixedCostModel(base_s=0.010, prefill_token_s=0.001, decode_seq_s=0.002)
SIMPLE = dict(in_batch_prefix_caching=False, lpm_rank_access="peek", exact_budgets=False, chunk_insertion="whole")


def run(requests, capacity=1000, cache=None, **sched):
    cache = cache or TrieCache(capacity)
    sim = SimCluster(requests, [cache], COST, FixedRouter(), SchedulerConfig(**sched), "lru", 0)
    return sim.run().records.set_index("id")


def test_defaults_are_the_sglang_exact_switches():
    c = SchedulerConfig()
    assert (c.in_batch_prefix_caching, c.lpm_rank_access, c.exact_budgets) == (True, "match", True)


def _in_batch_requests():
    busy = make_request(0, 0.0, range(10_000, 10_050), output_len=30)  # keeps the worker busy
    shared = list(range(1, 41))  # 40 tokens nothing in the cache holds
    sharers = [make_request(k, 0.001, shared + [500 + k, 600 + k], output_len=1) for k in (1, 2, 3)]
    loner = make_request(4, 0.001, range(700, 710), output_len=1)
    return [busy, *sharers, loner]


def test_in_batch_prefix_caching_defers_requests_sharing_an_uncached_prefix():
    # After `busy`'s prefill (t=0.060) two slots are left (max_running_requests=3), so the next
    # batch takes two of the four queued requests (all hits 0: plain lpm keeps arrival order).
    reqs = _in_batch_requests()
    simple = run(reqs, max_running_requests=3, **SIMPLE)
    exact = run(reqs, max_running_requests=3, in_batch_prefix_caching=True)
    # simple: batch [1, 2] computes the shared prefix twice (no hit for 2)
    assert simple.loc[2, "cached_tokens"] == 0
    # SGLang: 2 and 3 are deferred behind 4 (they share >= 32 tokens with 1), so batch [1, 4]
    # computes the prefix once and 2, 3 hit all 40 tokens of it
    assert exact.loc[2, "cached_tokens"] == 40 and exact.loc[3, "cached_tokens"] == 40
    assert exact.loc[4, "first_token_s"] < exact.loc[2, "first_token_s"]
    assert simple.loc[2, "first_token_s"] < simple.loc[4, "first_token_s"]


def test_exact_budgets_reserve_one_page_per_request():
    # SGLang admits only when extend + output + 1 < free: 20 tokens, a 10 + 8 request fits
    # (19 < 20), a 10 + 9 one does not until ... it never does: a clear error up front
    ok = make_request(0, 0.0, range(1, 11), output_len=8)
    assert run([ok], capacity=20).loc[0, "first_token_s"] == pytest.approx(0.020)
    too_big = make_request(0, 0.0, range(1, 11), output_len=9)
    with pytest.raises(ValueError, match=r"\+ 2 <= the worker's KV capacity \(20 tokens\)"):
        run([too_big], capacity=20)
    assert run([too_big], capacity=20, **SIMPLE).loc[0, "first_token_s"] == pytest.approx(0.020)


def test_exact_budgets_with_chunking_may_exceed_max_prefill_tokens():
    # chunked prefill on: SGLang checks max_prefill_tokens only between requests, so the second
    # request (30 new tokens, 10 left of the 40-token budget) still joins the batch
    a = make_request(0, 0.0, range(1, 31))
    b = make_request(1, 0.0, range(100, 130))
    exact = run([a, b], max_prefill_tokens=40, chunked_prefill_size=64)
    assert exact.loc[1, "first_token_s"] == pytest.approx(0.070)  # one batch: 10 + 60 ms
    simple = run([a, b], max_prefill_tokens=40, chunked_prefill_size=64, **SIMPLE)
    assert simple.loc[1, "first_token_s"] == pytest.approx(0.040 + 0.040)  # its own batch


class RecordingCache(TrieCache):
    """TrieCache that records the prompts it is asked to match (an access, unlike peek)."""

    def __init__(self, capacity):
        super().__init__(capacity)
        self.matched = []

    def match_prefix(self, key):
        self.matched.append(bytes(key))
        return super().match_prefix(key)


def test_lpm_rank_access_match_accesses_queued_prompts_every_pass():
    # warm: A cached. Then three requests queue behind the input budget (no chunking, 5 tokens):
    # each pass admits one. With match-ranking every queued prompt is matched (stamped) in
    # every pass, as SGLang's calc_priority does; with peek-ranking only at its admission.
    A = list(range(1, 9))
    warm = make_request(0, 0.0, A, output_len=1)
    queued = [make_request(k, 1.0, A + [10 * k, 10 * k + 1, 10 * k + 2, 10 * k + 3, 10 * k + 4, 10 * k + 5],
                           output_len=1) for k in (1, 2, 3)]
    counts = {}
    for access in ("match", "peek"):
        cache = RecordingCache(1000)
        run([warm, *queued], cache=cache, chunked_prefill_size=None, max_prefill_tokens=5, lpm_rank_access=access,
            exact_budgets=False, in_batch_prefix_caching=False, chunk_insertion="whole")
        keys = [r.prompt_tokens.astype("int32").tobytes() for r in queued]
        counts[access] = [sum(m == k for m in cache.matched) for k in keys]
    # peek: each queued prompt is matched once, at admission
    assert counts["peek"] == [1, 1, 1]
    # match: passes at t=1.0 (3 queued), then 2, then 1; each admitted prompt is matched at
    # admission too: the last one admitted is matched in 3 ranking passes + 1 admission
    assert sorted(counts["match"]) == [2, 3, 4]


@pytest.mark.parametrize("bad", [{"in_batch_prefix_caching": "yes"}, {"lpm_rank_access": "touch"},
                                 {"exact_budgets": 1}])
def test_bad_switch_values_are_clear_errors(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SchedulerConfig(**bad)

"""The KV a request holds and leaves behind, as SGLang counts it: prompt + output - 1.

SGLang 0.5.23 (.venv-sglang): prefill sets `req.kv.kv_committed_len` to the prompt
(mem_cache/allocation.py, the extend allocation); each decode step allocates one slot for the token
it feeds and adds 1 (the decode allocation: `kv_committed_len += token_per_req`); a finished
request's `release_kv_cache` (mem_cache/common.py) checkpoints `full_untruncated_fill_ids[:owned_kv_len]`
into the tree (radix_cache.py `checkpoint`), owned_kv_len = kv_committed_len. An output of n
tokens takes 1 prefill + n - 1 decode steps, so the last sampled token is never fed forward and
has no KV: the tree gets prompt + n - 1 tokens. Measured on a real server (issue 40): the
simulator agrees request by request only with this rule.

The reference here is the rule itself, counted per request from the steps the observer sees.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from repro.sim.cluster import SimCluster
from repro.sim.worker import SchedulerConfig
from tests.sim.sim_fakes import FixedCostModel, FixedRouter, RoundRobinRouter, TrieCache, make_request

COST = FixedCostModel(base_s=0.010, prefill_token_s=0.001, decode_seq_s=0.002)


def test_a_finished_request_leaves_prompt_plus_output_minus_one():
    a = make_request(0, 0.0, range(1, 11), output_len=4)
    cache = TrieCache(1000)
    SimCluster([a], [cache], COST, FixedRouter(), SchedulerConfig(), "lru", 0).run()
    path = np.concatenate([a.prompt_tokens, a.generated_tokens])
    assert cache.peek_prefix(path) == 10 + 4 - 1
    assert cache.total_size() == 13


def test_a_one_token_output_leaves_the_prompt_alone():
    a = make_request(0, 0.0, range(1, 11), output_len=1)
    cache = TrieCache(1000)
    SimCluster([a], [cache], COST, FixedRouter(), SchedulerConfig(), "lru", 0).run()
    assert cache.total_size() == 10


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(1, 12),
    workers=st.integers(1, 3),
    exact=st.booleans(),
)
def test_held_and_cached_kv_follow_the_rule_on_random_cells(seed, n, workers, exact):
    """No eviction (a large cache): at every step start a worker's KV in use is its tree plus, per
    running request, generated - 1 tokens (prompts are in the tree); at the end each request's
    path prompt + output is cached up to prompt + output - 1."""
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(n):
        shared = list(range(1, 1 + int(rng.integers(0, 6))))  # a short shared prefix, sometimes none
        prompt = shared + [100 * (i + 1) + k for k in range(int(rng.integers(1, 8)))]
        reqs.append(make_request(i, float(rng.uniform(0, 0.2)), prompt, output_len=int(rng.integers(1, 6))))
    reqs.sort(key=lambda r: r.arrival_s)
    reqs = [make_request(i, r.arrival_s, r.prompt_tokens, r.output_len) for i, r in enumerate(reqs)]
    caches = [TrieCache(10_000) for _ in range(workers)]
    sched = SchedulerConfig() if exact else SchedulerConfig(exact_budgets=False, chunk_insertion="whole")
    generated = [0] * n  # sampled tokens per request, counted from the steps
    running: list[set[int]] = [set() for _ in range(workers)]
    prefill_of: dict[int, list[int]] = {}
    checked = [0]

    def observer(event, w, info):
        k = w.worker_id
        if event == "start":
            prefill_of[k] = [i for i, _ in info.prefill]
            # the rule, from counts alone: every running request holds generated - 1 tokens off-tree
            off_tree = sum(generated[i] - 1 for i in running[k])
            assert w.kv_used_tokens - w.alloc_tokens == w.cache.total_size() + off_tree
            checked[0] += 1
            return
        finished = set(info)
        if prefill_of[k]:  # a prefill step: a request whose prompt is done samples its first token
            for i in prefill_of[k]:
                if w.table.prefilled[i] == w.table.compute_len[i] and generated[i] == 0:
                    generated[i] = 1
                    running[k].add(i)
            prefill_of[k] = []
        else:  # a decode step: every running request samples one more
            for i in running[k]:
                generated[i] += 1
        running[k] -= finished
        for i in finished:
            assert generated[i] == w.table.output_len[i]

    res = SimCluster(reqs, caches, COST, RoundRobinRouter(), sched, "lru", 0, observer=observer).run()
    assert checked[0] > 0
    where = dict(zip(res.records["id"], res.records["worker"]))
    for i, r in enumerate(reqs):
        path = np.concatenate([r.prompt_tokens, r.generated_tokens])
        w = int(where[r.id])
        assert caches[w].peek_prefix(path) == r.prompt_len + r.output_len - 1, i

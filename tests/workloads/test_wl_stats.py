"""Stats: the prefix index against a naive reference, and the CLI with Hydra overrides."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.workloads.request import Request
from repro.workloads.stats import PrefixIndex, infinite_cache_bound, main


def lcp(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def naive_bound(paths_prompt, paths_full):
    """Hit = longest prefix shared with any earlier full path; working set = distinct prefixes."""
    hit = sum(max((lcp(p, f) for f in paths_full[:j]), default=0) for j, p in enumerate(paths_prompt))
    total = sum(len(p) for p in paths_prompt)
    working = sum(len(f) - max((lcp(f, g) for g in paths_full[:j]), default=0) for j, f in enumerate(paths_full))
    return hit / total, working


SEQ = st.lists(st.integers(0, 3), min_size=1, max_size=12)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(SEQ, st.lists(st.integers(0, 3), min_size=1, max_size=3)), min_size=1, max_size=12))
def test_infinite_cache_bound_matches_naive_reference(items):
    reqs = [
        Request(id=i, arrival_s=float(i), prompt_tokens=np.array(p, np.int32), output_len=len(g),
                generated_tokens=np.array(g, np.int32), group_id=0, conversation_id=i, turn=0)
        for i, (p, g) in enumerate(items)
    ]
    got = infinite_cache_bound(reqs, use_radix_cache=False)
    want = naive_bound([p for p, _ in items], [p + g for p, g in items])
    assert abs(got[0] - want[0]) < 1e-12 and got[1] == want[1]


def test_prefix_index_basic():
    idx = PrefixIndex()
    idx.insert(np.array([1, 2, 3, 4], np.int32))
    idx.insert(np.array([1, 2, 9], np.int32))
    assert idx.size == 5
    assert idx.match_prefix(np.array([1, 2, 3, 7], np.int32)) == 3
    assert idx.match_prefix(np.array([1, 2], np.int32)) == 2
    assert idx.match_prefix(np.array([5], np.int32)) == 0


def test_radix_cache_and_prefix_index_agree():
    from repro.workloads.stats import _radix_cache_or_none

    assert _radix_cache_or_none() is not None  # infinite_cache_bound uses repro.kvcache's RadixCache
    from wl_helpers import wl_cfg

    from repro.workloads import build_workload

    wl = build_workload(wl_cfg("gsp", num_queries=64, num_groups=8, prompts_per_group=8,
                               system_prompt_len_range=[50, 100], question_len=10), seed=0)
    assert infinite_cache_bound(wl.requests) == infinite_cache_bound(wl.requests, use_radix_cache=False)


def test_cli_with_hydra_overrides(capsys):
    args = ["workload=gsp", "workload.num_queries=32", "workload.num_groups=4", "workload.prompts_per_group=8",
            "workload.system_prompt_len_range=[40,60]", "workload.question_len=10", "workload.request_rate=8",
            "workload.order=round_robin", "seed=2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    for fragment in ("workload gsp", "requests         32", "prompt tokens", "output tokens", "working set",
                     "hit-rate bound"):
        assert fragment in out
    assert main(args + ["--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["num_requests"] == 32 and s["num_groups"] == 4 and 0 < s["hit_rate_upper_bound"] < 1
    # 4 groups x 8 prompts, system prompt 40-60 tokens, questions 10: the bound counts
    # every prompt's system prompt as a hit except the first of each group
    assert s["working_set_tokens"] < s["total_prompt_tokens"] + 32 * 4


def test_cli_labels_stand_ins(capsys):
    assert main(["workload=loogle", "workload.num_queries=8", "workload.stand_in.doc_tokens_range=[100,200]"]) == 0
    assert "SYNTHETIC STAND-IN" in capsys.readouterr().out

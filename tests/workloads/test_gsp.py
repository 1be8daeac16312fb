"""GSP: SGLang structure, the paper's variability and prefix-ratio knobs, determinism."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from wl_helpers import requests_equal, wl_cfg

from repro.workloads import WorkloadError, build_workload
from repro.workloads.tokenizer import BuiltinTokenizer

SMALL = dict(num_queries=64, num_groups=8, prompts_per_group=8, system_prompt_len=300, question_len=20,
             system_prompt_len_range=None)


def by_group(wl):
    groups = defaultdict(list)
    for r in wl.requests:
        groups[r.group_id].append(r)
    return groups


def lcp(a, b):
    m = min(len(a), len(b))
    d = np.flatnonzero(a[:m] != b[:m])
    return int(d[0]) if len(d) else m


def test_sglang_structure_exact_lengths_and_shared_system_prompt():
    wl = build_workload(wl_cfg("gsp", **SMALL), seed=0)
    groups = by_group(wl)
    assert len(wl.requests) == 64 and sorted(groups) == list(range(8))
    assert all(len(g) == 8 for g in groups.values())
    for g in groups.values():
        for r in g:
            assert r.prompt_len == 300 + 20 and r.output_len == 4 and r.turn == 0
            assert np.array_equal(r.prompt_tokens[:300], g[0].prompt_tokens[:300])
        # questions differ: the shared prefix is exactly the system prompt
        assert lcp(g[0].prompt_tokens, g[1].prompt_tokens) == 300
    firsts = [g[0].prompt_tokens for g in groups.values()]
    assert all(lcp(firsts[0], f) < 5 for f in firsts[1:])
    assert len({r.conversation_id for r in wl.requests}) == 64
    assert wl.provenance["source"] == "generated" and wl.provenance["synthetic"] is False


def test_text_is_the_prompt_under_the_builtin_tokenizer():
    wl = build_workload(wl_cfg("gsp", **SMALL), seed=0)
    tok = BuiltinTokenizer()
    for r in wl.requests[:10]:
        assert np.array_equal(tok.encode(r.text), r.prompt_tokens)


def test_per_group_system_prompt_range_default_variability():
    cfg = wl_cfg("gsp", num_queries=256, num_groups=64, prompts_per_group=4)
    assert cfg["system_prompt_len_range"] == [1024, 3072]
    wl = build_workload(cfg, seed=0)
    sys_lens = [g[0].prompt_len - 128 for g in by_group(wl).values()]
    assert min(sys_lens) >= 1024 and max(sys_lens) <= 3072
    assert len(set(sys_lens)) > 40  # varies per group
    for g in by_group(wl).values():
        assert len({r.prompt_len for r in g}) == 1  # ... but not within a group


@pytest.mark.parametrize("ratio", [0.1, 0.5, 0.9])
def test_shared_prefix_ratio_at_fixed_total_length(ratio):
    wl = build_workload(wl_cfg("gsp", **{**SMALL, "shared_prefix_ratio": ratio}), seed=1)
    total = 300 + 20
    sys_len = round(ratio * total)
    for g in by_group(wl).values():
        for r in g:
            assert r.prompt_len == total
        assert lcp(g[0].prompt_tokens, g[1].prompt_tokens) == sys_len


def test_range_ratio_follows_sglang():
    wl = build_workload(wl_cfg("gsp", **{**SMALL, "range_ratio": 0.5, "output_len": 8}), seed=2)
    outs = {r.output_len for r in wl.requests}
    assert outs <= set(range(4, 9)) and len(outs) > 1
    for g in by_group(wl).values():
        sys_len = lcp(g[0].prompt_tokens, g[1].prompt_tokens)
        assert 150 <= sys_len <= 300 + 1  # + chance agreement of the first question token
        for r in g:
            assert 10 <= r.prompt_len - sys_len <= 20 + 1


def test_determinism_and_seed_sensitivity():
    cfg = wl_cfg("gsp", **SMALL)
    a = build_workload(cfg, seed=5, use_cache=False)
    b = build_workload(cfg, seed=5, use_cache=False)
    c = build_workload(cfg, seed=6, use_cache=False)
    assert requests_equal(a.requests, b.requests)
    assert not np.array_equal(a.requests[0].prompt_tokens, c.requests[0].prompt_tokens)


def test_rate_and_order_do_not_change_the_queries():
    base = build_workload(wl_cfg("gsp", **SMALL), seed=0, use_cache=False)
    fast = build_workload(wl_cfg("gsp", **SMALL, request_rate=20.0), seed=0, use_cache=False)
    assert [r.prompt_tokens.tobytes() for r in base.requests] == [r.prompt_tokens.tobytes() for r in fast.requests]
    assert fast.requests[-1].arrival_s < base.requests[-1].arrival_s
    rr = build_workload(wl_cfg("gsp", **SMALL, order="round_robin"), seed=0, use_cache=False)
    assert sorted(r.prompt_tokens.tobytes() for r in rr.requests) == sorted(
        r.prompt_tokens.tobytes() for r in base.requests)
    assert [r.group_id for r in rr.requests[:16]] == list(range(8)) * 2


def test_prompts_per_group_null_and_too_many_queries():
    wl = build_workload(wl_cfg("gsp", **{**SMALL, "prompts_per_group": None, "num_queries": 20}), seed=0)
    assert len(wl.requests) == 20
    with pytest.raises(WorkloadError, match="only 64 requests available"):
        build_workload(wl_cfg("gsp", **{**SMALL, "num_queries": 65}), seed=0)


def test_sglang_defaults_with_variability_off():
    wl = build_workload(wl_cfg("gsp", system_prompt_len_range=None), seed=0)
    assert len(wl.requests) == 1024 and {r.prompt_len for r in wl.requests} == {2048 + 128}
    assert wl.max_request_tokens == 2048 + 128 + 4

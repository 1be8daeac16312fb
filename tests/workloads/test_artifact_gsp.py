"""GSP as bench_serving.py generates it (variant artifact), against a plain restatement here."""

from __future__ import annotations

import numpy as np
import pytest
from wl_helpers import wl_cfg

from repro.workloads import WorkloadConfigError, build_workload
from repro.workloads.arrivals import component_rng, poisson_arrivals
from repro.workloads.tokenizer import Llama3Tokenizer

SMALL = {"num_groups": 7, "prompts_per_group": 3, "total_lens": [24, 40, 64], "prefix_ratio": 0.5}


def artifact_cfg(**art):
    return wl_cfg(
        "gsp",
        variant="artifact",
        artifact={**SMALL, **art},
        num_queries=None,
        tokenizer={"kind": "llama3", "path": None},
    )


def reference(seed: int, a: dict, out_len: int = 4):
    """bench_serving's loop, one prompt at a time: (group, text, server ids) per prompt."""
    tok = Llama3Tokenizer()
    rng = component_rng(seed, "gsp.artifact.tokens")

    def enc(text):  # transformers' encode: BOS first
        return [tok.bos_id] + tok.encode(text).tolist()

    def gen(n):
        text = tok.decode(rng.integers(0, tok.vocab_size, size=n))
        ids = enc(text)
        if len(ids) != n:
            ids = ids[:n] if len(ids) > n else ids + ids[: n - len(ids)]
            text = tok.decode(ids)
        return text

    out = []
    for g in range(a["num_groups"]):
        L = a["total_lens"][g % len(a["total_lens"])]
        sp = gen(min(max(1, round(a["prefix_ratio"] * L)), max(L - 1, 1)))
        Q = max(1, L - len(enc(sp)))
        qs = [gen(Q) for _ in range(a["prompts_per_group"])]
        for q in qs:
            rng.integers(0, tok.vocab_size, size=out_len)  # the generated ids
            full = f"{sp}\n\n{q}"
            out.append((g, full, [tok.bos_id] + tok.encode(full).tolist()))
    return out


def test_prompts_lengths_groups_and_text_match_the_reference():
    wl = build_workload(artifact_cfg(), seed=0)
    ref = reference(1, SMALL)  # artifact.seed 1: the scripts' fixed seed, whatever the cell's
    assert len(wl.requests) == 7 * 3
    for r, (g, text, ids) in zip(wl.requests, ref):
        assert r.group_id == g and r.text == text and r.prompt_tokens.tolist() == ids
    # group g's total length cycles over total_lens (the server's count: within a few ids of it)
    for r in wl.requests:
        L = SMALL["total_lens"][r.group_id % 3]
        assert abs(r.prompt_len - L) <= 6
    # one group's prompts share a prefix of about half their length
    by_g = {}
    for r in wl.requests:
        by_g.setdefault(r.group_id, []).append(r.prompt_tokens)
    for g, ps in by_g.items():
        lcp = next(i for i in range(len(ps[0])) if any(p[i] != ps[0][i] for p in ps))
        assert abs(lcp - SMALL["total_lens"][g % 3] / 2) <= 4


def test_order_warmup_and_arrivals():
    wl = build_workload(artifact_cfg(), seed=3)
    plan = wl.client
    n = 21
    assert (
        sorted(plan.stream) == list(range(n))
        and list(plan.stream) == component_rng(1, "gsp.artifact.order").permutation(n).tolist()
    )
    assert plan.warmup == plan.stream[:1] and plan.start_gap_s == 1.0
    assert np.allclose(plan.offsets_s, poisson_arrivals(n, 12.0, component_rng(3, "arrivals")))
    assert all(r.arrival_s == 0.0 and r.id == i for i, r in enumerate(wl.requests))
    rr = build_workload(artifact_cfg() | {"order": "round_robin"}, seed=3).client
    groups = [wl.requests[q].group_id for q in rr.stream]
    assert groups == [g for _ in range(3) for g in range(7)]
    capped = build_workload(artifact_cfg() | {"num_queries": 5}, seed=3).client
    assert capped.stream == plan.stream[:5]


def test_the_cell_seed_moves_only_the_arrivals_unless_the_artifact_seed_is_null():
    a, b = build_workload(artifact_cfg(), seed=0), build_workload(artifact_cfg(), seed=1)
    assert [r.text for r in a.requests] == [r.text for r in b.requests]
    assert a.client.stream == b.client.stream and a.client.offsets_s != b.client.offsets_s
    c = build_workload(artifact_cfg(seed=None), seed=2)  # (cell seed 1 would equal the fixed 1)
    assert [r.text for r in c.requests] != [r.text for r in a.requests]


@pytest.mark.parametrize(
    "bad",
    [
        {"artifact": {**SMALL, "prefix_ratio": 1.0}},
        {"artifact": {**SMALL, "total_lens": []}},
        {"artifact": {**SMALL, "colour": 1}},
        {"tokenizer": {"kind": "builtin", "path": None}},
        {"variant": "other"},
        {"num_groups": 8},  # a text-variant key: refused, not ignored
    ],
)
def test_bad_artifact_settings_are_refused_before_work(bad):
    with pytest.raises(WorkloadConfigError):
        build_workload(artifact_cfg() | bad, seed=0)


def test_the_text_variant_has_no_new_keys():
    wl = build_workload(wl_cfg("gsp", num_queries=16, num_groups=4, prompts_per_group=4), seed=0)
    assert "variant" not in wl.provenance["config"] and "artifact" not in wl.provenance["config"]
    assert wl.client is None
    with pytest.raises(WorkloadConfigError):
        build_workload(wl_cfg("gsp", artifact={}), seed=0)


def test_fig10s_prefix_ratio_is_their_prefix_ratio():
    a = build_workload(artifact_cfg(), seed=0)
    b = build_workload(artifact_cfg(prefix_ratio=0.25), seed=0)
    c = build_workload(artifact_cfg() | {"shared_prefix_ratio": 0.25}, seed=0)
    assert [r.text for r in b.requests] == [r.text for r in c.requests] != [r.text for r in a.requests]
    assert c.provenance["config"]["artifact"]["prefix_ratio"] == 0.25

"""Invariants every workload keeps (small configs of all four), and per-seed determinism."""

from __future__ import annotations

import json

import numpy as np
import pytest
from wl_helpers import requests_equal, wl_cfg

from repro.workloads import build_workload
from repro.workloads.tokenizer import BuiltinTokenizer, make_tokenizer

SMALL = {
    "gsp": dict(num_queries=48, num_groups=6, prompts_per_group=8, system_prompt_len_range=[40, 80], question_len=12),
    "sharegpt": dict(num_queries=48),  # a small file in the real format (the real one: test_sharegpt.py)
    "ultrachat": dict(num_queries=48, stand_in={"mean_utterance_tokens": 40}),
    "loogle": dict(num_queries=48, stand_in={"doc_tokens_range": [300, 600]}),
}


@pytest.fixture(scope="module")
def built():
    import os
    import tempfile

    # module-scoped: one build per workload, in a private cache (the autouse fixture is per test)
    with tempfile.TemporaryDirectory() as d:
        old = os.environ.get("REPRO_CACHE_DIR"), os.environ.get("REPRO_DATA_DIR")
        os.environ["REPRO_CACHE_DIR"] = d
        os.environ["REPRO_DATA_DIR"] = os.path.join(d, "no-data")
        from test_sharegpt import conv

        sharegpt_file = os.path.join(d, "sharegpt.json")
        with open(sharegpt_file, "w") as f:
            json.dump([conv(i, 1 + i % 4) for i in range(40)], f)
        SMALL["sharegpt"]["path"] = sharegpt_file
        try:
            yield {n: build_workload(wl_cfg(n, **kw), seed=0) for n, kw in SMALL.items()}
        finally:
            for k, v in zip(("REPRO_CACHE_DIR", "REPRO_DATA_DIR"), old):
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@pytest.mark.parametrize("name", list(SMALL))
def test_request_stream_invariants(built, name):
    wl = built[name]
    reqs = wl.requests
    assert [r.id for r in reqs] == list(range(48))
    arr = np.array([r.arrival_s for r in reqs])
    assert arr[0] == 0.0 and np.all(np.diff(arr) >= 0)
    tok = make_tokenizer(wl.provenance["config"]["tokenizer"])  # the workload's own (GSP: builtin)
    for r in reqs:
        assert r.prompt_tokens.dtype == np.int32 and r.generated_tokens.dtype == np.int32
        assert not r.prompt_tokens.flags.writeable and not r.generated_tokens.flags.writeable
        assert len(r.generated_tokens) == r.output_len == 4 and r.prompt_len > 0
    for r in reqs[:16]:
        assert r.text is not None and np.array_equal(tok.encode(r.text), r.prompt_tokens)
    assert wl.max_request_tokens == max(r.prompt_len + r.output_len for r in reqs)
    p = wl.provenance
    for key in ("workload", "source", "synthetic", "data_file", "data_sha256", "sample_seed", "tokenizer",
                "malformed_rows", "num_requests", "order", "request_rate", "config"):
        assert key in p, key
    assert p["num_requests"] == 48 and p["workload"] == name and p["sample_seed"] == 0
    json.dumps(p)  # JSON-able


@pytest.mark.parametrize("name", list(SMALL))
def test_same_seed_same_workload_other_seed_differs(built, name):
    again = build_workload(wl_cfg(name, **SMALL[name]), seed=0, use_cache=False)
    assert requests_equal(built[name].requests, again.requests)
    assert built[name].provenance == again.provenance
    other = build_workload(wl_cfg(name, **SMALL[name]), seed=1, use_cache=False)
    assert not requests_equal(built[name].requests, other.requests)


@pytest.mark.parametrize("name", list(SMALL))
def test_turns_of_a_conversation_keep_their_order(built, name):
    last = {}
    for r in built[name].requests:
        assert r.turn == last.get(r.conversation_id, -1) + 1
        last[r.conversation_id] = r.turn

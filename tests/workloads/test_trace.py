"""The trace workload (repro/workloads/trace.py): a recorded JSONL trace replayed as it was, checked
line by line before anything is built, and the fixed router that sends each request to its `server`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.routing.fixed import FixedRouter
from repro.workloads import WorkloadError, build_workload
from repro.workloads.trace import read_trace, trace_rows, write_trace


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _cfg(path, **kw):
    return {"_target_": "repro.workloads.trace.TraceWorkload", "name": "trace", "path": str(path), **kw}


def test_rows_become_requests_in_arrival_order(tmp_path):
    p = _write(tmp_path / "t.jsonl", [
        {"input_ids": [5, 6, 7], "arrival_s": 0.5, "output_len": 2, "output_ids": [9, 8], "server": 1},
        {"input_ids": [5, 6], "arrival_s": 0.0, "output_len": 3, "server": 0, "group": 4},
        {"input_ids": [1], "arrival_s": 0.5, "output_len": 1},
    ])
    wl = build_workload(_cfg(p), seed=0, use_cache=False)
    r = wl.requests
    assert [x.id for x in r] == [0, 1, 2]
    assert [x.arrival_s for x in r] == [0.0, 0.5, 0.5]  # sorted; the tie keeps file order
    assert [x.prompt_tokens.tolist() for x in r] == [[5, 6], [5, 6, 7], [1]]
    assert [x.server for x in r] == [0, 1, None] and r[0].group_id == 4
    assert r[1].generated_tokens.tolist() == [9, 8] and r[0].output_len == 3 and len(r[0].generated_tokens) == 3
    assert wl.provenance["with_server"] == 2 and wl.provenance["data_sha256"]
    fast = build_workload(_cfg(p, speedup=2.0, num_queries=2), seed=0, use_cache=False)
    assert [x.arrival_s for x in fast.requests] == [0.0, 0.25]


def test_text_rows_are_tokenized(tmp_path):
    p = _write(tmp_path / "t.jsonl", [{"text": "hello world hello", "arrival_s": 0, "output_len": 1}])
    wl = build_workload(_cfg(p, tokenizer={"kind": "builtin", "path": None}), seed=0, use_cache=False)
    (req,) = wl.requests
    assert req.prompt_len >= 2 and req.text == "hello world hello"


@pytest.mark.parametrize("row, why", [
    ({"arrival_s": 0, "output_len": 1}, "exactly one of input_ids and text"),
    ({"input_ids": [1], "text": "a", "arrival_s": 0, "output_len": 1}, "exactly one of input_ids and text"),
    ({"input_ids": [1], "arrival_s": -1, "output_len": 1}, "arrival_s must be a number >= 0"),
    ({"input_ids": [1], "arrival_s": 0, "output_len": 0}, "output_len must be an integer >= 1"),
    ({"input_ids": [1], "arrival_s": 0, "output_len": 2, "output_ids": [3]}, "output_ids has 1 ids but output_len is 2"),
    ({"input_ids": [1], "arrival_s": 0, "output_len": 1, "server": -1}, "server must be an integer >= 0"),
    ({"input_ids": [1.5], "arrival_s": 0, "output_len": 1}, "input_ids must be a list of integers"),
    ({"input_ids": [1], "arrival_s": 0, "output_len": 1, "sever": 0}, "unknown key(s) sever"),
    ({"input_ids": [], "arrival_s": 0, "output_len": 1}, "input_ids is empty"),
    ("{not json", "not valid JSON"),
])
def test_bad_rows_fail_with_their_line_before_anything_is_built(tmp_path, row, why):
    good = {"input_ids": [1, 2], "arrival_s": 0, "output_len": 1}
    p = _write(tmp_path / "t.jsonl", [good, row, good])
    with pytest.raises(WorkloadError, match="line 2: .*" + __import__("re").escape(why)):
        build_workload(_cfg(p), seed=0, use_cache=False)


def test_bad_config_is_refused(tmp_path):
    example = build_workload({"_target_": "repro.workloads.trace.TraceWorkload", "name": "trace"}, seed=0).requests
    assert len(example) == 16 and {r.server for r in example} == {0, 1}  # path: null = the packaged example
    with pytest.raises(WorkloadError, match="request_rate does not apply"):
        build_workload(_cfg(tmp_path / "x.jsonl", request_rate=2.0), seed=0)
    with pytest.raises(WorkloadError, match="trace file not found"):
        build_workload(_cfg(tmp_path / "missing.jsonl"), seed=0, use_cache=False)


class _View:
    def __init__(self, i):
        self.worker_id = i


def test_the_fixed_router_sends_each_request_to_its_server(tmp_path):
    p = _write(tmp_path / "t.jsonl", [{"input_ids": [k + 1], "arrival_s": k, "output_len": 1, "server": k % 3}
                                      for k in range(6)] + [{"input_ids": [9], "arrival_s": 9, "output_len": 1}])
    reqs = build_workload(_cfg(p), seed=0, use_cache=False).requests
    views = [_View(i) for i in range(3)]
    router = FixedRouter()
    router.reset(views, 0)
    assert [router.select_worker(r, views, 0.0) for r in reqs[:6]] == [0, 1, 2, 0, 1, 2]
    with pytest.raises(ValueError, match="request 6 has no assigned server"):
        router.select_worker(reqs[6], views, 0.0)
    router.reset(views[:2], 0)
    with pytest.raises(ValueError, match="assigned server 2, but the cell has 2 workers"):
        router.select_worker(reqs[2], views[:2], 0.0)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 50), min_size=1, max_size=6), st.floats(0, 100),
                          st.integers(1, 4), st.integers(0, 3)), min_size=1, max_size=12))
def test_written_traces_read_back_the_same_requests(tmp_path_factory, rows):
    """trace_rows + write_trace (the observe side) and the workload agree: the reference is the rows."""
    import pandas as pd

    from repro.workloads.request import Request

    reqs = [Request(i, a, np.array(p, np.int32), n, np.arange(n, dtype=np.int32) + 7, 0, i, 0, server=s)
            for i, (p, a, n, s) in enumerate(sorted(rows, key=lambda r: r[1]))]
    records = pd.DataFrame({"failed": [False] * len(reqs), "output_tokens": [r.output_len for r in reqs],
                            "arrival_s": [r.arrival_s for r in reqs], "worker": [r.server for r in reqs],
                            "cached_tokens": 0, "prompt_tokens": [r.prompt_len for r in reqs],
                            "first_token_s": 1.0, "finish_s": 2.0, "queue_wait_s": float("nan")})
    path = tmp_path_factory.mktemp("t") / "trace.jsonl"
    write_trace(path, trace_rows(reqs, records, [r.generated_tokens.tolist() for r in reqs]))
    assert len(read_trace(path)) == len(reqs)
    back = build_workload(_cfg(path), seed=0, use_cache=False).requests
    for a, b in zip(reqs, back):
        assert a.prompt_tokens.tolist() == b.prompt_tokens.tolist() and a.arrival_s == b.arrival_s
        assert a.generated_tokens.tolist() == b.generated_tokens.tolist() and a.server == b.server

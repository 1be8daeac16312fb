"""Mooncake-format traces: the packaged FAST'25 trace's statistics, token ids from hash blocks,
other files of the format, bad files, arrivals and the common keys."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest
from wl_helpers import wl_cfg

from repro.workloads import WorkloadConfigError, WorkloadError, build_workload
from repro.workloads.mooncake import ID_RANGE, block_tokens, prompt_tokens
from repro.workloads.stats import format_stats, workload_stats


def write_trace(path, rows, gz=False):
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


def small_rows(bs=4):
    # a: [1, 2, 3] ; b shares 2 blocks with a ; c shares only the first ; d new
    return [
        {"timestamp": 0, "input_length": 3 * bs - 1, "output_length": 5, "hash_ids": [1, 2, 3]},
        {"timestamp": 500, "input_length": 3 * bs, "output_length": 2, "hash_ids": [1, 2, 4]},
        {"timestamp": 1500, "input_length": bs + 1, "output_length": 1, "hash_ids": [1, 5]},
        {"timestamp": 4000, "input_length": 2, "output_length": 3, "hash_ids": [9], "extra": "ignored"},
    ]


def common_prefix(a, b):
    m = min(len(a), len(b))
    d = np.flatnonzero(a[:m] != b[:m])
    return int(d[0]) if len(d) else m


def test_packaged_trace_reproduces_the_readme_numbers():
    wl = build_workload(wl_cfg("mooncake"), seed=0)
    tr = wl.provenance["trace"]
    # README (shared/data/mooncake): 12,031 requests, 58.9 min (~3.4 req/s), mean input 12,035
    # (max 126,195), mean output 343, 288,500 blocks of which 182,790 distinct (36.6 % reuses)
    assert tr["requests"] == len(wl) == 12031
    assert round(tr["span_min"], 1) == 58.9 and round(tr["req_per_s"], 1) == 3.4
    assert round(tr["mean_input"]) == 12035 and tr["max_input"] == 126195
    assert round(tr["mean_output"]) == 343
    assert (tr["blocks"], tr["distinct_blocks"]) == (288500, 182790)
    assert round(100 * tr["block_reuse"], 1) == 36.6
    assert wl.provenance["data_file"].endswith("conversation_trace.jsonl.gz")
    assert wl.provenance["source"] == "real" and not wl.provenance["synthetic"]
    assert np.mean([r.prompt_len for r in wl.requests]) == pytest.approx(12035.1, abs=0.1)
    arr = np.array([r.arrival_s for r in wl.requests])
    assert arr[0] == 0.0 and np.all(np.diff(arr) >= 0) and arr[-1] == pytest.approx(3536.999)


def test_block_tokens_same_id_same_ids_distinct_ids_differ_early():
    bs = 512
    ids = np.arange(0, 200_000, dtype=np.int64)
    t = block_tokens(ids[:2_000], bs)  # whole 512-token blocks for 2k ids (200k of them: 400 MB, ~10 s)
    assert t.shape == (2_000, bs) and t.dtype == np.int32
    assert t.min() >= 0 and t.max() < ID_RANGE
    # the first two ids are a bijection of the hash id: no two blocks start alike (checked on all 200k ids;
    # a block's first two ids do not depend on the block size)
    head = block_tokens(ids, 2)
    assert np.array_equal(head[:2_000], t[:, :2])
    pairs = head[:, 0].astype(np.int64) * ID_RANGE + head[:, 1]
    assert len(np.unique(pairs)) == len(ids)
    assert np.array_equal(block_tokens([123, 7, 123], bs)[0], block_tokens([123], bs)[0])
    assert np.array_equal(block_tokens([123, 7, 123], bs)[2], t[123])
    # pinned: the scheme is part of the workload definition (changing it moves every result)
    assert t[0, :4].tolist() == block_tokens([0], bs)[0, :4].tolist()
    assert prompt_tokens([5, 6], 600, bs).tolist() == np.concatenate([t[5], t[6][:88]]).tolist()


def test_shared_prefix_is_exactly_what_the_hashes_say(tmp_path):
    bs = 4
    f = write_trace(tmp_path / "t.jsonl", small_rows(bs))
    wl = build_workload(wl_cfg("mooncake", path=str(f), block_size=bs), seed=0)
    a, b, c, d = (r.prompt_tokens for r in wl.requests)
    assert [len(x) for x in (a, b, c, d)] == [11, 12, 5, 2]
    assert common_prefix(a, b) == 2 * bs
    assert common_prefix(a, c) == bs and common_prefix(b, c) == bs
    assert common_prefix(a, d) <= 1
    assert [r.output_len for r in wl.requests] == [5, 2, 1, 3]
    # generated tokens never continue a later prompt
    assert common_prefix(np.concatenate([a[: 2 * bs], wl.requests[0].generated_tokens]), b) == 2 * bs


def test_other_file_of_the_format_reports_its_own_stats(tmp_path):
    bs = 4
    f = write_trace(tmp_path / "other.jsonl.gz", small_rows(bs), gz=True)
    wl = build_workload(wl_cfg("mooncake", path=str(f), block_size=bs), seed=0)
    s = workload_stats(wl)
    tr = s["trace"]
    assert tr["requests"] == 4 and tr["blocks"] == 9 and tr["distinct_blocks"] == 6
    assert tr["block_reuse"] == pytest.approx(1 - 6 / 9)
    assert tr["span_min"] == pytest.approx(4.0 / 60) and tr["max_input"] == 12
    assert s["prompt_tokens"]["max"] == 12 and s["total_prompt_tokens"] == 11 + 12 + 5 + 2
    # infinite-cache bound: b hits 8 of 12 (a's first two blocks), c hits 4 of 5
    assert s["hit_rate_upper_bound"] == pytest.approx((8 + 4) / 30, abs=1 / 30)
    text = format_stats(s)
    assert "9 hash blocks, 6 distinct (33.3 % of blocks are reuses)" in text
    # the plain file gives the same workload as the gzipped one
    g = write_trace(tmp_path / "other.jsonl", small_rows(bs))
    wl2 = build_workload(wl_cfg("mooncake", path=str(g), block_size=bs), seed=0)
    assert all(np.array_equal(x.prompt_tokens, y.prompt_tokens) for x, y in zip(wl.requests, wl2.requests))


@pytest.mark.parametrize(
    "rows, expect",
    [
        ([{"timestamp": 0, "input_length": 5, "output_length": 1}], "line 1: missing key(s) hash_ids"),
        ([{"timestamp": 0, "input_length": 9, "output_length": 1, "hash_ids": [1]}],
         "1 hash_ids for input_length 9: expected ceil(9 / block_size 4) = 3"),
        ([{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [1]}], "timestamp must be"),
        ([{"timestamp": 0, "input_length": 1, "output_length": 0, "hash_ids": [1]}], "output_length must be"),
        ([{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": ["x"]}], "hash_ids must be"),
        (["[1, 2]"], "not a JSON object"),
    ],
)
def test_bad_file_is_a_clear_error_naming_the_line(tmp_path, rows, expect):
    good = small_rows(4)[:2]
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in good)
                    + "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    with pytest.raises(WorkloadError, match="does not follow the Mooncake trace format") as e:
        build_workload(wl_cfg("mooncake", path=str(path), block_size=4), seed=0)
    assert expect.replace("line 1", "line 3") in str(e.value)


def test_not_json_empty_and_missing_files(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text("{not json\n")
    with pytest.raises(WorkloadError, match="line 1: not valid JSON"):
        build_workload(wl_cfg("mooncake", path=str(p)), seed=0)
    p.write_text("\n")
    with pytest.raises(WorkloadError, match="holds no requests"):
        build_workload(wl_cfg("mooncake", path=str(p)), seed=0)
    with pytest.raises(WorkloadError, match="trace file not found"):
        build_workload(wl_cfg("mooncake", path=str(tmp_path / "nope.jsonl")), seed=0)


def test_arrivals_speedup_prefix_and_common_keys(tmp_path):
    bs = 4
    f = str(write_trace(tmp_path / "t.jsonl", small_rows(bs)))
    base = dict(path=f, block_size=bs)
    wl = build_workload(wl_cfg("mooncake", **base, speedup=2.0, num_queries=3), seed=0)
    assert [r.arrival_s for r in wl.requests] == [0.0, 0.25, 0.75]
    wl = build_workload(wl_cfg("mooncake", **base, output_len=7), seed=0)
    assert {r.output_len for r in wl.requests} == {7}
    wl = build_workload(wl_cfg("mooncake", **base, max_context_len=15), seed=0)
    assert len(wl) == 3 and wl.provenance["filtered"] == {"over_max_context_len": 1}
    # Poisson re-timing: null rate = the trace's mean rate (3 gaps over 4 s)
    p1 = build_workload(wl_cfg("mooncake", **base, arrivals="poisson"), seed=1)
    p2 = build_workload(wl_cfg("mooncake", **base, arrivals="poisson", request_rate=0.75), seed=1)
    assert [r.arrival_s for r in p1.requests] == [r.arrival_s for r in p2.requests]
    assert [r.arrival_s for r in p1.requests] != [r.arrival_s for r in wl.requests[:4]]
    rr = build_workload(wl_cfg("mooncake", **base, arrivals="poisson", order="round_robin"), seed=0)
    # groups = the first hash id after the prefix all requests share (none here: 1,1,1,9)
    assert sorted(r.group_id for r in rr.requests) == [0, 0, 0, 1]
    assert [r.group_id for r in rr.requests][:2] == [0, 1]
    with pytest.raises(WorkloadError, match="num_queries=9 but the trace has 4"):
        build_workload(wl_cfg("mooncake", **base, num_queries=9), seed=0)


@pytest.mark.parametrize("over, msg", [
    ({"request_rate": 5.0}, "request_rate applies to arrivals=poisson"),
    ({"order": "random"}, "needs arrivals=poisson"),
    ({"arrivals": "later"}, "arrivals must be one of"),
    ({"speedup": 0}, "speedup must be >"),
    ({"block_size": 0}, "block_size must be >= 1"),
])
def test_bad_config_is_rejected_before_reading(over, msg):
    with pytest.raises(WorkloadConfigError, match=msg):
        build_workload(wl_cfg("mooncake", **over), seed=0)

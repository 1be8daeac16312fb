"""LooGLE: jsonl loader (qa_pairs as a string list), both modes, round-robin order, the stand-in."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
from test_sharegpt import check_multiturn_invariants, sentence
from wl_helpers import wl_cfg

from repro.workloads import MissingDataError, WorkloadError, build_workload
from repro.workloads.loogle import parse_qa_pairs


def doc_row(d, n_q, as_json=False):
    qa = [{"Q": f"What is item {d}-{k} about?", "A": sentence(d + k, n=3), "S": "evidence"} for k in range(n_q)]
    return {"title": f"doc {d}", "input": " ".join(sentence(d * 31 + i) for i in range(40)),
            "qa_pairs": json.dumps(qa) if as_json else str(qa)}


def write_loogle(path, rows, extra_lines=()):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        for line in extra_lines:
            f.write(line + "\n")
    return str(path)


def small(**kw):
    return wl_cfg("loogle", **kw)


def test_parse_qa_pairs_formats():
    assert parse_qa_pairs("[{'Q': 'q?', 'A': 'a', 'S': ['s']}]") == [("q?", "a")]
    assert parse_qa_pairs('[{"Q": "q?", "A": "a"}]') == [("q?", "a")]
    assert parse_qa_pairs("none") == [] and parse_qa_pairs("") == []
    assert parse_qa_pairs("[{'Q': 1}]") is None and parse_qa_pairs("__import__('os')") is None


def test_shared_prefix_mode_from_jsonl(tmp_path):
    rows = [doc_row(0, 3), doc_row(1, 4, as_json=True), doc_row(2, 2)]
    extra = ['{"input": "x", "qa_pairs": "none"}', '{"input": 5, "qa_pairs": "[]"}', "not json",
             '{"input": "doc", "qa_pairs": "[{\'Q\': oops"}']
    path = write_loogle(tmp_path / "longdep_qa.jsonl", rows, extra)
    wl = build_workload(small(path=path, num_queries=9), seed=0)
    p = wl.provenance
    assert p["source"] == "real" and p["synthetic"] is False and p["mode"] == "shared_prefix"
    assert p["malformed_rows"] == 3 and p["filtered"]["documents_without_questions"] == 1
    by_doc = defaultdict(list)
    for r in wl.requests:
        assert r.turn == 0 and "Input: " in r.text and "Question: What is item" in r.text
        by_doc[r.group_id].append(r)
    assert sorted(len(v) for v in by_doc.values()) == [2, 3, 4]
    assert len({r.conversation_id for r in wl.requests}) == 9
    for reqs in by_doc.values():
        doc_end = reqs[0].text.index("Question: ")
        # the document is a shared token prefix of every question of that document
        # (questions here are < 30 tokens incl. headers, documents ~400)
        shared = min(r.prompt_len for r in reqs) - 30
        for r in reqs[1:]:
            assert r.text[:doc_end] == reqs[0].text[:doc_end]
            assert np.array_equal(r.prompt_tokens[:shared], reqs[0].prompt_tokens[:shared])


def test_round_robin_is_one_question_per_document_in_turn(tmp_path):
    path = write_loogle(tmp_path / "d.jsonl", [doc_row(d, 4) for d in range(3)])
    wl = build_workload(small(path=path, num_queries=12, order="round_robin"), seed=0)
    assert [r.group_id for r in wl.requests] == [0, 1, 2] * 4
    # each document's questions still come in their recorded order
    for d in range(3):
        qs = [r.text.split("Question: ")[1] for r in wl.requests if r.group_id == d]
        ks = [int(q.split("-")[1].split()[0]) for q in qs]
        assert ks == sorted(ks)


def test_follow_up_mode(tmp_path):
    path = write_loogle(tmp_path / "d.jsonl", [doc_row(d, 3) for d in range(3)])
    wl = build_workload(small(path=path, num_queries=9, mode="follow_up"), seed=0)
    check_multiturn_invariants(wl)
    for r in wl.requests:
        assert r.group_id == r.conversation_id
        if r.turn > 0:
            assert r.text.count("Input: ") == 1 and r.text.count("Question: ") == r.turn + 1


def test_missing_file_is_a_clear_error(isolated_dirs):
    _, data = isolated_dirs
    with pytest.raises(MissingDataError) as exc:
        build_workload(small(source="real", config="shortdep_qa"), seed=0)
    msg = str(exc.value)
    assert str(data / "loogle" / "shortdep_qa.jsonl") in msg and "bigainlco/LooGLE" in msg


def test_file_of_garbage_is_a_clear_error(tmp_path):
    p = tmp_path / "g.jsonl"
    p.write_text("nope\n")
    with pytest.raises(WorkloadError, match="no parsable JSON line"):
        build_workload(small(path=str(p)), seed=0)
    p.write_text('{"input": "a", "qa_pairs": "none"}\n')
    with pytest.raises(WorkloadError, match="no document with questions"):
        build_workload(small(path=str(p)), seed=0)


def test_stand_in_has_published_statistics():
    wl = build_workload(small(num_queries=40), seed=0)
    p = wl.provenance
    assert p["source"] == "synthetic" and p["synthetic"] is True
    by_doc = defaultdict(list)
    for r in wl.requests:
        by_doc[r.group_id].append(r)
    for reqs in by_doc.values():
        shared = reqs[0].prompt_tokens
        for r in reqs[1:]:
            m = min(len(shared), r.prompt_len)
            shared = shared[: int(np.argmax(np.r_[shared[:m] != r.prompt_tokens[:m], True]))]
        assert 21000 <= len(shared) <= 36000 + 10  # the document (+ headers) is the shared prefix
    complete = list(by_doc.values())[:-1]  # the last document may be cut by num_queries
    assert all(6 <= len(v) <= 16 for v in complete)


def test_stand_in_knobs_are_configurable():
    st = {"doc_tokens_range": [100, 120], "questions_per_doc_range": [2, 2]}
    wl = build_workload(small(num_queries=10, stand_in=st, order="round_robin"), seed=3)
    assert len({r.group_id for r in wl.requests}) == 5
    assert all(100 <= r.prompt_len <= 120 + 60 for r in wl.requests)

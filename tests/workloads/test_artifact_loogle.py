"""LooGLE as long.py builds it (variant artifact), against a restatement here."""

from __future__ import annotations

import ast
import json

import pytest
from wl_helpers import wl_cfg

from repro.workloads import WorkloadConfigError, build_workload
from repro.workloads.tokenizer import Llama3Tokenizer

ART = {"doc_lens": [10, 20, 40, 400], "max_q_per_group": 3, "context_limit": 120, "context_safety": 8}


def loogle_file(tmp_path):
    rows = []
    for i in range(6):
        qa = [
            {"Q": f"what is item {k} of document {i}?", "A": f"item {k} is " + "x " * k, "S": ""} for k in range(2 + i)
        ]
        rows.append(
            {
                "input": f"Document {i}. " + " ".join(f"w{i}_{j}" for j in range(200)),
                "title": str(i),
                "qa_pairs": str(qa),
            }
        )
    rows.insert(2, {"input": "no questions here", "qa_pairs": "none"})
    p = tmp_path / "longdep_qa.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows))
    return p, [r for r in rows if r["qa_pairs"] != "none"]


def reference(rows, a, out_len=4):
    """long.py's groups: (document index, prompt text, server ids) per question."""
    tok = Llama3Tokenizer()
    out = []
    for g, row in enumerate(rows):
        qs = [qa["Q"] for qa in ast.literal_eval(row["qa_pairs"])][: a["max_q_per_group"]]
        tmpl = max(len(tok.encode(f"Input:\n{{DOC}}\n\nQuestion: {q}")) for q in qs)
        budget = max(a["context_limit"] - a["context_safety"] - out_len - tmpl, 0)
        target = min(a["doc_lens"][g % len(a["doc_lens"])], budget)
        ids = [tok.bos_id] + tok.encode(row["input"]).tolist()
        doc = row["input"] if len(ids) <= target else tok.decode(ids[1:target])
        for q in qs:
            text = f"Input:\n{doc}\n\nQuestion: {q}"
            out.append((g, text, [tok.bos_id] + tok.encode(text).tolist()))
    return out


def test_documents_cut_in_rotation_and_prompts_match_the_reference(tmp_path):
    path, rows = loogle_file(tmp_path)
    wl = build_workload(wl_cfg("loogle", variant="artifact", artifact=ART, num_queries=None, path=str(path)), seed=0)
    ref = reference(rows, {**ART})
    assert len(wl.requests) == len(ref) == sum(min(2 + i, 3) for i in range(6))
    for r, (g, text, ids) in zip(wl.requests, ref):
        assert r.group_id == g and r.text == text and r.prompt_tokens.tolist() == ids
    assert wl.provenance["synthetic"] is False and wl.client.warmup == ()
    lens = {r.group_id: r.prompt_len for r in wl.requests}
    assert lens[0] < lens[1] < lens[2] < lens[3]  # 10, 20, 40, then the context budget


def test_stand_in_is_labelled_and_a_document_sample_is_drawn_when_over_num_groups(tmp_path):
    wl = build_workload(
        wl_cfg(
            "loogle", variant="artifact", artifact={"stand_in_documents": 3, "max_q_per_group": 2}, num_queries=None
        ),
        seed=0,
    )
    assert wl.provenance["synthetic"] is True and wl.provenance["documents_used"] == 3
    assert len(wl.requests) == 6 and sorted(wl.client.stream) == list(range(6))
    path, _ = loogle_file(tmp_path)
    wl2 = build_workload(
        wl_cfg("loogle", variant="artifact", artifact={**ART, "num_groups": 2}, num_queries=None, path=str(path)),
        seed=0,
    )
    assert wl2.provenance["documents_used"] == 2


def test_follow_up_mode_is_refused():
    with pytest.raises(WorkloadConfigError, match="shared_prefix"):
        build_workload(wl_cfg("loogle", variant="artifact", artifact={}, num_queries=None, mode="follow_up"), seed=0)

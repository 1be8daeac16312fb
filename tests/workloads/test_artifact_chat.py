"""ShareGPT / UltraChat as multi-turn.py builds them (variant artifact), against a restatement here."""

from __future__ import annotations

import json

import numpy as np
import pytest
from wl_helpers import wl_cfg

from repro.workloads import WorkloadConfigError, build_workload
from repro.workloads.artifact_chat import force_len
from repro.workloads.tokenizer import Llama3Tokenizer

ART = {"num_clients": 5, "min_user_turns": 3, "turns_per_client": [1, 2, 3], "user_tokens": [20, 33]}
SYSTEM = (
    "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
    "Today Date: 26 Jul 2024\n\n<|eot_id|>"
)


def sharegpt_file(tmp_path):
    rows = []
    for i in range(12):
        n_user = [1, 3, 4, 2, 3][i % 5]  # rows 0 and 3 (mod 5) are too short
        conv = [{"from": "system", "value": "be brief"}] if i % 4 == 0 else []
        for k in range(n_user):
            conv.append({"from": "human", "value": f"question {k} of conversation {i}, " + "word " * (5 + 7 * k)})
            conv.append({"from": "gpt", "value": f"answer {k} to {i}: " + "reply " * (3 + k)})
        rows.append({"id": str(i), "conversations": conv})
    p = tmp_path / "sg.json"
    p.write_text(json.dumps(rows))
    return p, rows


def reference_prompts(rows, a, out_len=4):
    """(conversation, turn, prompt ids) with the Llama-3.1 template and 4-token replies."""
    tok = Llama3Tokenizer()
    picked = [r for r in rows if sum(m["from"] == "human" for m in r["conversations"]) >= a["min_user_turns"]]
    picked = picked[: a["num_clients"]]
    out = []
    for c, row in enumerate(picked):
        T = min(a["turns_per_client"][c % len(a["turns_per_client"])], a["min_user_turns"])
        n = a["user_tokens"][c % len(a["user_tokens"])]
        msgs = row["conversations"]
        text = "<|begin_of_text|>" + SYSTEM
        users = [j for j, m in enumerate(msgs) if m["from"] == "human"][:T]
        for k, j in enumerate(users):
            u = force_len(tok, msgs[j]["value"], n).strip()
            text += f"<|start_header_id|>user<|end_header_id|>\n\n{u}<|eot_id|>"
            text += "<|start_header_id|>assistant<|end_header_id|>\n\n"
            out.append((c, k, tok.encode(text).tolist()))
            reply = tok.encode(msgs[j + 1]["value"].strip())[:out_len]
            text += tok.decode(reply) + "<|eot_id|>"
    return out


def test_sharegpt_turns_prompts_and_rotation_match_the_reference(tmp_path):
    path, rows = sharegpt_file(tmp_path)
    cfg = wl_cfg("sharegpt", variant="artifact", artifact=ART, num_queries=None, path=str(path))
    wl = build_workload(cfg, seed=0)
    ref = reference_prompts(rows, ART)
    assert len(wl.requests) == len(ref) == (1 + 2 + 3 + 1 + 2)
    for r, (c, k, ids) in zip(wl.requests, ref):
        assert (r.conversation_id, r.turn) == (c, k)
        assert r.prompt_tokens.tolist() == ids
    plan = wl.client
    assert [len(c) for c in plan.conversations] == [1, 2, 3, 1, 2]
    assert plan.concurrency == 5 and plan.poll_rate_per_s == 12.0 and plan.warmup == (0,)
    # turn k + 1's prompt extends turn k's full path (prompt + the 4 generated tokens)
    for a, b in zip(wl.requests, wl.requests[1:]):
        if a.conversation_id == b.conversation_id:
            full = np.concatenate([a.prompt_tokens, a.generated_tokens])
            assert np.array_equal(b.prompt_tokens[: len(full)], full)


def test_force_len_gives_exactly_n_tokens_on_plain_text():
    tok = Llama3Tokenizer()
    for text, n in [("hello there, how are you today?", 64), ("word " * 300, 100), ("", 7), ("x", 1)]:
        assert len(tok.encode(force_len(tok, text, n))) == n


def test_ultrachat_stand_in_keeps_its_label_and_the_turn_rotation():
    cfg = wl_cfg("ultrachat", variant="artifact", artifact=ART, num_queries=None, source="synthetic")
    wl = build_workload(cfg, seed=0)
    assert wl.provenance["synthetic"] is True and wl.provenance["data_file"].startswith("stand-in")
    assert [len(c) for c in wl.client.conversations] == [1, 2, 3, 1, 2]
    assert wl.provenance["client"]["client"] == "closed_loop"


def test_closed_loop_workloads_refuse_a_query_cap(tmp_path):
    path, _ = sharegpt_file(tmp_path)
    with pytest.raises(WorkloadConfigError, match="num_queries must be null"):
        build_workload(wl_cfg("sharegpt", variant="artifact", artifact=ART, num_queries=64, path=str(path)), seed=0)
    with pytest.raises(ValueError, match="conversations have"):
        build_workload(
            wl_cfg(
                "sharegpt", variant="artifact", artifact={**ART, "num_clients": 50}, num_queries=None, path=str(path)
            ),
            seed=0,
        )

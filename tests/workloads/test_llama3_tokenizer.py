"""Llama-3 tokenizer (the default for text workloads): pinned ids, the chat template, batch
encoding, the cache key, stand-in lengths, and the live path using the cell's tokenizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from wl_helpers import wl_cfg

from repro.workloads import WorkloadConfigError, build_workload, resolve_spec
from repro.workloads.synthetic import llama3_word_pool, words_segment
from repro.workloads.tokenizer import (
    LLAMA3_BOS_ID, LLAMA3_EOT_ID, BuiltinTokenizer, Llama3Tokenizer, chat_template, make_tokenizer,
)

TOK = Llama3Tokenizer()
CONF = Path(__file__).resolve().parents[2] / "conf"
HEADER_USER = [128006, 882, 128007, 271]  # <|start_header_id|> user <|end_header_id|> \n\n
HEADER_ASSISTANT = [128006, 78191, 128007, 271]


def test_pinned_ids_of_meta_vocabulary():
    assert TOK.encode("Hello world").tolist() == [9906, 1917]  # the issue: [128000, 9906, 1917] with BOS
    assert TOK.encode("\n").tolist() == [198] and TOK.encode("\n\n").tolist() == [271]
    assert TOK.encode("<|start_header_id|>user<|end_header_id|>\n\nHi there.<|eot_id|>").tolist() == \
        HEADER_USER + [13347, 1070, 13, LLAMA3_EOT_ID]
    assert TOK.encode("<|begin_of_text|>").tolist() == [LLAMA3_BOS_ID]
    assert TOK.decode([9906, 1917]) == "Hello world"
    assert TOK.vocab_size == 128_256 and TOK.eos_id == LLAMA3_EOT_ID
    assert make_tokenizer(None).kind == "llama3"  # the default
    d = TOK.describe()
    assert d["name"] == "llama-3.2" and len(d["files_sha256"]) == 64


def test_encode_batch_equals_one_by_one():
    texts = ["Hello world", "", "日本語のテキスト", "  two  spaces\n\n", "x" * 5000, "<|eot_id|>a"]
    assert [t.tolist() for t in TOK.encode_batch(texts)] == [TOK.encode(t).tolist() for t in texts]
    assert all(t.dtype == np.int32 for t in TOK.encode_batch(texts))


def test_sharegpt_prompts_use_llama3_chat_template():
    wl = build_workload(wl_cfg("sharegpt", num_queries=32), seed=0)
    assert wl.provenance["tokenizer"]["kind"] == "llama3"
    turns = {}
    for r in wl.requests:
        p = r.prompt_tokens.tolist()
        assert p[:5] == [LLAMA3_BOS_ID] + HEADER_USER and p[-4:] == HEADER_ASSISTANT
        # whole-text encoding = the concatenated segments (the live path sends the text)
        assert TOK.encode(r.text).tolist() == p
        turns.setdefault(r.conversation_id, []).append(r)
    multi = [rs for rs in turns.values() if len(rs) > 1]
    assert multi
    for rs in multi:  # turn k+1 = turn k + the recorded reply + <|eot_id|> + the next user turn
        prev, nxt = rs[0], rs[1]
        cut = nxt.prompt_tokens[prev.prompt_len:].tolist()
        eot = cut.index(LLAMA3_EOT_ID)
        assert cut[eot + 1: eot + 5] == HEADER_USER


def test_cache_key_includes_the_tokenizer():
    a = resolve_spec(wl_cfg("sharegpt"))
    b = resolve_spec(wl_cfg("sharegpt", tokenizer={"kind": "builtin"}))
    data = a.resolve_data()
    ka = a.pool_key(0, make_tokenizer(a.cfg["tokenizer"]), data)
    kb = b.pool_key(0, make_tokenizer(b.cfg["tokenizer"]), data)
    assert ka != kb
    assert "llama3:" in TOK.identity()
    wb = build_workload(wl_cfg("sharegpt", num_queries=8, tokenizer={"kind": "builtin"}), seed=0)
    wa = build_workload(wl_cfg("sharegpt", num_queries=8), seed=0)
    assert wa.cache_file != wb.cache_file and not wa.cache_hit
    assert wb.requests[0].prompt_tokens[0] != LLAMA3_BOS_ID  # builtin keeps its plain template


def test_gsp_default_stays_builtin_and_bad_tokenizer_keys_fail():
    assert resolve_spec(wl_cfg("gsp")).cfg["tokenizer"]["kind"] == "builtin"
    for w in ("sharegpt", "ultrachat", "loogle"):
        assert yaml.safe_load((CONF / "workload" / f"{w}.yaml").read_text())["tokenizer"]["kind"] == "llama3"
    with pytest.raises(WorkloadConfigError, match="tokenizer.path must be null"):
        resolve_spec(wl_cfg("sharegpt", tokenizer={"kind": "llama3", "path": "/x"}))


def test_word_pool_words_are_single_tokens_and_segments_encode_exactly():
    words, ids = llama3_word_pool(str(TOK.file))
    assert len(words) == 20336 and len(set(ids.tolist())) == len(ids)
    sample = np.random.default_rng(0).choice(len(words), 300, replace=False)
    text = "".join(words[sample])
    assert TOK.encode(text).tolist() == ids[sample].tolist()
    rng = np.random.default_rng(1)
    for prefix in ("", "Input: "):
        t, toks = words_segment(rng, 50, TOK, prefix=prefix)
        assert TOK.encode(t).tolist() == toks.tolist()
        assert len(toks) == 50 + 1 + len(TOK.encode(prefix))


def test_stand_in_lengths_keep_their_published_statistics():
    wl = build_workload(wl_cfg("loogle", num_queries=16), seed=0)
    lo, hi = wl_cfg("loogle")["stand_in"]["doc_tokens_range"]
    # document + chat template + question: within a few dozen tokens of the configured range
    assert all(lo <= r.prompt_len <= hi + 80 for r in wl.requests)


def test_live_workers_and_router_tokenize_text_with_the_cells_tokenizer(tmp_path):
    pytest.importorskip("aiohttp")
    from repro.backends.sglang import orchestrate, protocol
    from repro.backends.sglang.emulated_worker import EmulatedWorker, EmulatorConfig
    from repro.backends.sglang.router_service import RouterService, RouterServiceConfig
    from repro.backends.assembly import SeedPlan

    model = yaml.safe_load((CONF / "model" / "llama31_8b.yaml").read_text())
    hw = yaml.safe_load((CONF / "hardware" / "l40.yaml").read_text())
    text = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello world<|eot_id|>"
    inp = protocol.parse_generate_request({"text": text, "sampling_params": {"max_new_tokens": 2}})
    for tok_cfg, want in ((None, TOK.encode(text)), ({"kind": "builtin", "path": None}, BuiltinTokenizer().encode(text))):
        w = EmulatedWorker(EmulatorConfig(worker_id=0, kv_capacity_tokens=10_000, eviction={"name": "lru"}, seed=0,
                                          model=model, hardware=hw, tokenizer=tok_cfg))
        assert w._prompt_ids(inp).tolist() == want.tolist()
        svc = RouterService(None, RouterServiceConfig(worker_urls=["http://127.0.0.1:1"], tokenizer=tok_cfg))
        assert svc._prompt_ids(inp).tolist() == want.tolist()
    # the orchestration hands the workload's tokenizer to every worker and to the router
    cfg = {"seed": 0, "cluster": {"num_workers": 1, "mem_fraction": 0.9, "kv_cache_tokens": None, "scheduler": {}},
           "model": model, "hardware": hw, "router": {"_target_": "repro.routing.RandomRouter"},
           "eviction": {"name": "lru", "granularity": "node"}, "workload": wl_cfg("sharegpt"),
           "backend": {"name": "sglang", "emulate": True, "time_scale": 1.0, "router_impl": "ours"}}
    plan = orchestrate.plan_cell(cfg, [10_000], SeedPlan.spawn(0, 1), tmp_path, ports=[1001, 1002])
    assert plan.workers[0].config["tokenizer"] == {"kind": "llama3", "path": None}
    assert plan.router.config["service"]["tokenizer"] == {"kind": "llama3", "path": None}

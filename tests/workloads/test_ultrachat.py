"""UltraChat: raw jsonl and ultrachat_200k parquet loaders, missing-file errors, the stand-in."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_sharegpt import TOK, check_multiturn_invariants, sentence
from wl_helpers import wl_cfg

from repro.workloads import MissingDataError, WorkloadError, build_workload
from repro.workloads.chat import ASSISTANT_HEADER, USER_HEADER


def raw_rows(n, turns=2):
    return [{"id": i, "data": [sentence(10 * i + k, n=5 + k % 3) for k in range(2 * turns)]} for i in range(n)]


def write_jsonl(path, rows, extra_lines=()):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        for line in extra_lines:
            f.write(line + "\n")
    return str(path)


def write_parquet(path, convs):
    messages = [
        [{"role": "user" if k % 2 == 0 else "assistant", "content": c} for k, c in enumerate(conv)] for conv in convs
    ]
    table = pa.table({"prompt": [c[0] for c in convs], "prompt_id": [str(i) for i in range(len(convs))],
                      "messages": messages})
    pq.write_table(table, path)
    return str(path)


def test_raw_jsonl_loader(tmp_path):
    path = write_jsonl(
        tmp_path / "ultrachat.jsonl",
        raw_rows(5, turns=3),
        extra_lines=['{"id": 9, "data": "not a list"}', "{broken json", '{"id": 10, "data": ["only one"]}',
                     json.dumps({"id": 11, "data": ["a b c d e", "f g h i j", "k l m n o"]}), ""],
    )
    wl = build_workload(wl_cfg("ultrachat", path=path, num_queries=15), seed=0)
    p = wl.provenance
    assert p["source"] == "real" and p["synthetic"] is False and p["data_file"] == path
    assert p["malformed_rows"] == 2 and p["rows_read"] == 9
    assert p["filtered"]["conversations_too_short"] == 1 and p["filtered"]["conversations_odd_length"] == 1
    assert len({r.conversation_id for r in wl.requests}) == 5
    check_multiturn_invariants(wl)


def test_ultrachat_200k_parquet_loader_and_folder(tmp_path):
    convs = [[sentence(7 * i + k) for k in range(4)] for i in range(4)]
    bad_roles = [{"role": "assistant", "content": "x y z w v"}, {"role": "user", "content": "a b c d e"}]
    folder = tmp_path / "uc"
    folder.mkdir()
    write_parquet(folder / "train_sft.parquet", convs)
    table = pa.table({"messages": [bad_roles]})
    pq.write_table(table, folder / "zz_bad.parquet")
    wl = build_workload(wl_cfg("ultrachat", path=str(folder), num_queries=8), seed=0)
    assert wl.provenance["malformed_rows"] == 1 and wl.provenance["rows_read"] == 5
    check_multiturn_invariants(wl)
    texts = " ".join(r.text for r in wl.requests)
    assert sentence(0) in texts


def test_parquet_without_messages_column_is_a_clear_error(tmp_path):
    pq.write_table(pa.table({"text": ["a"]}), tmp_path / "x.parquet")
    with pytest.raises(WorkloadError, match="messages"):
        build_workload(wl_cfg("ultrachat", path=str(tmp_path / "x.parquet")), seed=0)


def test_unparsable_jsonl_is_a_clear_error(tmp_path):
    p = tmp_path / "u.jsonl"
    p.write_text("garbage\nmore garbage\n")
    with pytest.raises(WorkloadError, match="no parsable JSON line"):
        build_workload(wl_cfg("ultrachat", path=str(p), source="real"), seed=0)


def test_missing_file_names_file_dataset_and_place(isolated_dirs):
    _, data = isolated_dirs
    with pytest.raises(MissingDataError) as exc:
        build_workload(wl_cfg("ultrachat", source="real"), seed=0)
    msg = str(exc.value)
    assert str(data / "ultrachat") in msg and "stingning/ultrachat" in msg and "ultrachat_200k" in msg
    assert "workload.path" in msg and "source=synthetic" in msg


def test_default_location_is_used_when_present(isolated_dirs):
    _, data = isolated_dirs
    (data / "ultrachat").mkdir()
    write_jsonl(data / "ultrachat" / "part.jsonl", raw_rows(4))
    wl = build_workload(wl_cfg("ultrachat", num_queries=8), seed=0)  # source: auto
    assert wl.provenance["source"] == "real" and wl.provenance["data_file"] == "$REPRO_DATA_DIR/ultrachat"


def test_auto_without_file_is_a_labelled_stand_in_with_published_stats():
    wl = build_workload(wl_cfg("ultrachat", num_queries=600), seed=0)
    p = wl.provenance
    assert p["source"] == "synthetic" and p["synthetic"] is True and "stand-in" in p["data_file"]
    check_multiturn_invariants(wl)
    # turns per conversation ~ 3.8 (the tail of the stream is cut at num_queries, so use complete ones)
    turns = {}
    for r in wl.requests:
        turns[r.conversation_id] = max(turns.get(r.conversation_id, 0), r.turn + 1)
    assert 3.2 < np.mean(list(turns.values())) < 4.4  # +-3 standard errors at ~160 conversations
    # utterance length ~ 309 tokens: turn 0 prompt = user header + message + "\n" + assistant header
    overhead = len(TOK.encode(USER_HEADER)) + 1 + len(TOK.encode(ASSISTANT_HEADER))
    first = [r.prompt_len - overhead for r in wl.requests if r.turn == 0]
    assert 250 < np.mean(first) < 370

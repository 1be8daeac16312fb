"""repro.results: run signatures (identity) and the cell folder (atomic writes: tests/test_fileio.py)."""

from __future__ import annotations

import pandas as pd

from repro.results import CellStore, run_signature


def test_signature_ignores_non_result_keys_and_key_order():
    a = {"seed": 1, "workload": {"request_rate": 8.0, "name": "gsp"}, "results_dir": "/a", "tracking": {"mode": "x"}}
    b = {"tracking": {"mode": "y"}, "workload": {"name": "gsp", "request_rate": 8.0}, "seed": 1, "results_dir": "/b",
         "n_jobs": 4, "keep_stale": True, "exp_name": "other"}
    assert run_signature(a) == run_signature(b)
    assert run_signature(a) != run_signature({**a, "seed": 2})
    assert run_signature(a) != run_signature({**a, "workload": {"request_rate": 8, "name": "gsp", "x": 1}})


def test_parquet_bytes_are_deterministic(tmp_path):
    df = pd.DataFrame({"a": [1, 2, 3], "b": [0.5, 0.25, 0.125]})
    s1, s2 = CellStore(tmp_path, "e", "s1"), CellStore(tmp_path, "e", "s2")
    assert s1.write_parquet("r.parquet", df).read_bytes() == s2.write_parquet("r.parquet", df.copy()).read_bytes()


def test_finished_means_summary_present(tmp_path):
    s = CellStore(tmp_path, "e", "sig")
    assert not s.is_finished()
    s.write_json("summary.json", {"x": 1})
    assert s.is_finished() and s.read_summary() == {"x": 1}

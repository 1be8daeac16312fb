"""repro.results: run signatures (identity) and atomic, readable writes."""

from __future__ import annotations

import os
import stat

import pandas as pd
import pytest

from repro.results import CellStore, atomic_write_bytes, atomic_write_json, run_signature
from repro.results.store import FILE_MODE


def test_signature_ignores_non_result_keys_and_key_order():
    a = {"seed": 1, "workload": {"request_rate": 8.0, "name": "gsp"}, "results_dir": "/a", "tracking": {"mode": "x"}}
    b = {"tracking": {"mode": "y"}, "workload": {"name": "gsp", "request_rate": 8.0}, "seed": 1, "results_dir": "/b",
         "n_jobs": 4, "keep_stale": True, "exp_name": "other"}
    assert run_signature(a) == run_signature(b)
    assert run_signature(a) != run_signature({**a, "seed": 2})
    assert run_signature(a) != run_signature({**a, "workload": {"request_rate": 8, "name": "gsp", "x": 1}})


def test_atomic_write_replaces_and_leaves_no_temp_files(tmp_path):
    p = tmp_path / "d" / "f.json"
    atomic_write_json(p, {"b": 1, "a": [1, 2]})
    assert p.read_text() == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}\n'
    atomic_write_bytes(p, b"new")
    assert p.read_bytes() == b"new" and os.listdir(p.parent) == ["f.json"]


def test_files_are_readable_by_others_per_umask(tmp_path):
    p = atomic_write_bytes(tmp_path / "x", b"1")
    mask = os.umask(0)
    os.umask(mask)
    assert FILE_MODE == 0o666 & ~mask  # what open() gives, not mkstemp's 0600
    assert stat.S_IMODE(p.stat().st_mode) == FILE_MODE


def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    p = atomic_write_bytes(tmp_path / "x", b"old")

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        atomic_write_bytes(p, b"new")
    assert p.read_bytes() == b"old" and os.listdir(tmp_path) == ["x"]


def test_parquet_bytes_are_deterministic(tmp_path):
    df = pd.DataFrame({"a": [1, 2, 3], "b": [0.5, 0.25, 0.125]})
    s1, s2 = CellStore(tmp_path, "e", "s1"), CellStore(tmp_path, "e", "s2")
    assert s1.write_parquet("r.parquet", df).read_bytes() == s2.write_parquet("r.parquet", df.copy()).read_bytes()


def test_finished_means_summary_present(tmp_path):
    s = CellStore(tmp_path, "e", "sig")
    assert not s.is_finished()
    s.write_json("summary.json", {"x": 1})
    assert s.is_finished() and s.read_summary() == {"x": 1}

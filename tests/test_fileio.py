"""repro.fileio: atomic, readable writes (temp file + rename; fsync unless told not to)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from repro.fileio import FILE_MODE, dumps_json, write_atomic, write_json_atomic


def test_atomic_write_replaces_and_leaves_no_temp_files(tmp_path):
    p = tmp_path / "d" / "f.json"
    write_json_atomic(p, {"b": 1, "a": [1, 2]})
    assert p.read_text() == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}\n'
    write_atomic(p, b"new")
    assert p.read_bytes() == b"new" and os.listdir(p.parent) == ["f.json"]
    write_atomic(p, "text é")
    assert p.read_bytes() == "text é".encode() and os.listdir(p.parent) == ["f.json"]


def test_json_is_canonical():
    assert dumps_json({"b": float("nan"), "a": 1}) == '{\n  "a": 1,\n  "b": NaN\n}\n'


def test_files_are_readable_by_others_per_umask(tmp_path):
    p = write_atomic(tmp_path / "x", b"1")
    mask = os.umask(0)
    os.umask(mask)
    assert FILE_MODE == 0o666 & ~mask  # what open() gives, not mkstemp's 0600
    assert stat.S_IMODE(p.stat().st_mode) == FILE_MODE


def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    p = write_atomic(tmp_path / "x", b"old")

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        write_atomic(p, b"new")
    assert p.read_bytes() == b"old" and os.listdir(tmp_path) == ["x"]


def test_fsync_false_skips_the_flush(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("fsync called")

    monkeypatch.setattr(os, "fsync", boom)
    p = write_atomic(tmp_path / "x", b"data", fsync=False)
    assert p.read_bytes() == b"data" and os.listdir(tmp_path) == ["x"]
    assert stat.S_IMODE(p.stat().st_mode) == FILE_MODE


def test_digests_match_hashlib_on_the_canonical_bytes(tmp_path):
    import hashlib

    from repro.fileio import sha256_file, sha256_json

    data = bytes(range(256)) * 40_000  # > one 4 MiB chunk
    p = write_atomic(tmp_path / "big", data)
    assert sha256_file(p) == hashlib.sha256(data).hexdigest()
    # compact, sorted, non-JSON values as str(): signatures and cache keys depend on these bytes
    obj = {"b": [1, 2.5, None], "a": {"y": Path("/x"), "x": "é"}}
    blob = '{"a":{"x":"\\u00e9","y":"/x"},"b":[1,2.5,null]}'
    assert sha256_json(obj) == hashlib.sha256(blob.encode()).hexdigest()

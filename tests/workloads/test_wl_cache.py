"""The disk cache: second build identical and a hit, corrupt files rebuilt, keys that must differ do."""

from __future__ import annotations

import json

import numpy as np
import pytest
from wl_helpers import requests_equal, wl_cfg

from repro.workloads import build_workload
from repro.workloads import cache as wl_cache

SMALL_GSP = dict(num_queries=32, num_groups=4, prompts_per_group=8, system_prompt_len_range=[50, 90], question_len=10)


def only_pool(cache_dir):
    files = sorted(cache_dir.glob("*.pool"))
    assert len(files) == 1, files
    return files[0]


def test_second_build_is_a_hit_and_identical(isolated_dirs):
    cache_dir, _ = isolated_dirs
    a = build_workload(wl_cfg("gsp", **SMALL_GSP), seed=0)
    b = build_workload(wl_cfg("gsp", **SMALL_GSP), seed=0)
    assert not a.cache_hit and b.cache_hit and b.cache_file == str(only_pool(cache_dir))
    assert requests_equal(a.requests, b.requests) and a.provenance == b.provenance
    assert str(cache_dir) in b.cache_file
    # cache status is not provenance (provenance must not depend on what ran before)
    assert "cache" not in json.dumps(a.provenance)


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty", "valid_checksum_bad_payload"])
def test_corrupt_cache_file_is_detected_and_rebuilt(isolated_dirs, damage, caplog):
    cache_dir, _ = isolated_dirs
    ref = build_workload(wl_cfg("gsp", **SMALL_GSP), seed=0)
    path = only_pool(cache_dir)
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        i = len(data) - 100
        path.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :])
    elif damage == "garbage":
        path.write_bytes(b"\x00" * 1000)
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        wl_cache.write_payload(path, b"this is not an npz archive")
    again = build_workload(wl_cfg("gsp", **SMALL_GSP), seed=0)
    assert not again.cache_hit and requests_equal(ref.requests, again.requests)
    assert "rebuilding" in caplog.text
    third = build_workload(wl_cfg("gsp", **SMALL_GSP), seed=0)
    assert third.cache_hit  # the rebuilt file replaced the bad one


def test_rate_and_order_reuse_the_pool_other_knobs_do_not(isolated_dirs):
    cache_dir, _ = isolated_dirs
    base = build_workload(wl_cfg("gsp", **SMALL_GSP), seed=0)
    fast = build_workload(wl_cfg("gsp", **SMALL_GSP, request_rate=20.0, order="round_robin"), seed=0)
    assert fast.cache_hit and fast.provenance["request_rate"] == 20.0
    assert fast.requests[-1].arrival_s != base.requests[-1].arrival_s
    assert not build_workload(wl_cfg("gsp", **SMALL_GSP, output_len=8), seed=0).cache_hit
    assert not build_workload(wl_cfg("gsp", **SMALL_GSP), seed=1).cache_hit
    assert len(list(cache_dir.glob("*.pool"))) == 3


def test_data_checksum_is_part_of_the_key(tmp_path):
    from test_sharegpt import conv, write

    path = write(tmp_path, [conv(i, 2) for i in range(3)])
    a = build_workload(wl_cfg("sharegpt", path=path, num_queries=4), seed=0)
    assert build_workload(wl_cfg("sharegpt", path=path, num_queries=4), seed=0).cache_hit
    write(tmp_path, [conv(i + 10, 2) for i in range(3)])  # same path, new content
    b = build_workload(wl_cfg("sharegpt", path=path, num_queries=4), seed=0)
    assert not b.cache_hit and a.provenance["data_sha256"] != b.provenance["data_sha256"]
    assert b.requests[0].text != a.requests[0].text


def test_code_change_invalidates(monkeypatch):
    build_workload(wl_cfg("gsp", **SMALL_GSP), seed=0)
    monkeypatch.setattr(wl_cache, "code_fingerprint", lambda module: "0" * 64)
    assert not build_workload(wl_cfg("gsp", **SMALL_GSP), seed=0).cache_hit


def test_checksum_memo(tmp_path, isolated_dirs):
    import hashlib

    cache_dir, _ = isolated_dirs
    small = tmp_path / "small.bin"
    small.write_bytes(b"abc")
    assert wl_cache.file_sha256(small) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert not (cache_dir / "checksums.json").exists()  # small files are always hashed, never memoised
    f = tmp_path / "data.bin"
    body = bytes(wl_cache.ALWAYS_HASH_BYTES + 1)
    f.write_bytes(body)
    first = wl_cache.file_sha256(f)
    assert first == hashlib.sha256(body).hexdigest()
    assert first in (cache_dir / "checksums.json").read_text()
    f.write_bytes(body + b"x")  # new size -> new memo key -> rehashed
    assert wl_cache.file_sha256(f) != first
    (cache_dir / "checksums.json").write_text("{corrupt")
    assert wl_cache.file_sha256(f) == wl_cache.file_sha256(f)


def test_checksum_memo_sees_a_same_size_edit_with_its_mtime_put_back(tmp_path, isolated_dirs):
    """Issue 34 point 7: path + size + mtime alone would serve the old checksum here."""
    import hashlib
    import os

    f = tmp_path / "data.bin"
    f.write_bytes(bytes(wl_cache.ALWAYS_HASH_BYTES + 8))
    st = f.stat()
    first = wl_cache.file_sha256(f)
    probe = tmp_path / "probe"
    probe.touch()
    while probe.stat().st_ctime_ns <= st.st_ctime_ns:  # the clock's next tick (coarse on some filesystems)
        probe.touch()
    with open(f, "r+b") as fh:  # same inode, same size, other bytes
        fh.write(b"edited!")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (f.stat().st_size, f.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert wl_cache.file_sha256(f) == hashlib.sha256(f.read_bytes()).hexdigest() != first


def test_use_cache_false_writes_nothing(isolated_dirs):
    cache_dir, _ = isolated_dirs
    wl = build_workload(wl_cfg("gsp", **SMALL_GSP), seed=0, use_cache=False)
    assert wl.cache_file is None and not list(cache_dir.glob("*.pool"))
    assert wl.requests[0].prompt_tokens.dtype == np.int32


def test_sweep_memo_reads_each_pool_once(isolated_dirs, monkeypatch):
    """With the sweep memo on, workloads that share a pool (rate, order) read its file once and
    are the same requests as built without the memo; off again, the file is read each time."""
    from repro.workloads import base
    from repro.workloads.pool import Pool

    cfgs = [wl_cfg("gsp", **SMALL_GSP, request_rate=r, order=o) for r, o in ((4.0, "random"), (20.0, "round_robin"))]
    build_workload(cfgs[0], seed=1)  # writes another pool file
    plain = [build_workload(c, seed=0) for c in cfgs]
    reads = []
    real_read = Pool.read
    monkeypatch.setattr(Pool, "read", staticmethod(lambda f: reads.append(1) or real_read(f)))
    base.use_memo(True)
    try:
        memo = [build_workload(c, seed=0) for c in cfgs] + [build_workload(cfgs[0], seed=1)]
        assert len(reads) == 2  # one per pool file (seed 1 is another pool)
        assert all(w.cache_hit for w in memo[:2])
        for a, b in zip(plain, memo):
            assert requests_equal(a.requests, b.requests) and a.provenance == b.provenance
        assert memo[0].requests[0]._pool is memo[1].requests[0]._pool
        for seed in range(2, 2 + base.POOL_MEMO_MAX):  # made pools are remembered too; the oldest go
            build_workload(cfgs[0], seed=seed)
        assert len(reads) == 2 and len(base._pools) == base.POOL_MEMO_MAX
        build_workload(wl_cfg("gsp", **SMALL_GSP, request_rate=8.0), seed=0)  # its pool was dropped
        assert len(reads) == 3
    finally:
        base.use_memo(False)
    assert not base._pools
    reads.clear()
    build_workload(cfgs[1], seed=0)
    assert len(reads) == 1

"""A dry run's validation builds no workload pool that is not cached, and says so (harness.validate)."""

from __future__ import annotations

import io

import pytest

from repro.analysis.cells import compose_cell
from repro.confutil import to_plain
from repro.harness.compose import resolve
from repro.harness.validate import pools_unbuilt, validate_configs


@pytest.fixture
def cell(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path / "pools"))
    cfg = compose_cell(["workload=gsp", "workload.num_queries=16", "workload.num_groups=4", "seed=3"])
    return to_plain(resolve(cfg)), tmp_path / "pools"


def test_dry_run_leaves_an_uncached_pool_unbuilt_and_names_it(cell):
    cfg, pools = cell
    out = io.StringIO()
    with pools_unbuilt(out):
        validate_configs([("0", cfg)])
    assert not list(pools.glob("*.pool"))
    assert "not in the cache and not built: gsp seed" in out.getvalue()


def test_a_real_validation_builds_the_pool_and_a_dry_run_then_uses_it(cell, capsys):
    cfg, pools = cell
    validate_configs([("0", cfg)])
    assert "building workload pool gsp seed" in capsys.readouterr().err
    assert len(list(pools.glob("gsp-*.pool"))) == 1
    out = io.StringIO()
    with pools_unbuilt(out):
        validate_configs([("0", cfg)])
    assert out.getvalue() == ""
    assert "building" not in capsys.readouterr().err


def test_a_bad_request_size_is_still_caught_when_the_pool_is_cached(cell):
    cfg, _ = cell
    validate_configs([("0", cfg)])
    cfg["cluster"]["kv_cache_tokens"] = 64
    with pools_unbuilt(io.StringIO()), pytest.raises(Exception, match="cache smaller than one request"):
        validate_configs([("0", cfg)])

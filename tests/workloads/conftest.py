"""Workload tests: every test gets its own cache dir and an empty data dir."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path, monkeypatch):
    """Every test gets its own cache dir and an empty data dir (no stray real files)."""
    cache = tmp_path / "wl-cache"
    data = tmp_path / "wl-data"
    data.mkdir()
    monkeypatch.setenv("REPRO_CACHE_DIR", str(cache))
    monkeypatch.setenv("REPRO_DATA_DIR", str(data))
    return cache, data

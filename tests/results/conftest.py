"""Fixtures shared by the results tests."""

from __future__ import annotations

import pytest

from tests.harness.helpers import run_inprocess


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    results = tmp_path_factory.mktemp("grid")
    mp = pytest.MonkeyPatch()
    try:
        assert run_inprocess(results, "+exp=tiny", "tracking=disabled", "n_jobs=1", monkeypatch=mp) == 0
    finally:
        mp.undo()
    return results

"""W&B trouble costs one warning and no local file (issue 41, point 8): after W&B failed in a sweep's
first cell, the later cells (tracking off for the sweep) still write their timeseries.parquet, and a
tracked cell without one is not fresh (status, the next sweep)."""

from __future__ import annotations

import warnings

import pytest

from repro.results.__main__ import main as results_main
from repro.results.store import CellStore
from tests.harness.helpers import run_inprocess


def _broken(*a, **k):
    raise RuntimeError("W&B is down")


@pytest.mark.parametrize("where", ["init", "offline_writer"])
def test_every_cell_keeps_its_series_when_wandb_fails(tmp_path, monkeypatch, capsys, where):
    if where == "init":  # the SDK run of a streamed cell cannot start
        import wandb

        monkeypatch.setattr(wandb, "init", _broken)
        args = ["tracking=online", "tracking.stream=true"]
    else:  # the run file of a simulated cell cannot be written
        from repro.tracking import wandb_file

        monkeypatch.setattr(wandb_file, "write_offline_run", _broken)
        args = ["tracking=offline"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run_inprocess(tmp_path, "+exp=tiny", "n_jobs=1", *args, monkeypatch=monkeypatch) == 0
    ours = [w for w in caught if "W&B tracking" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    cells = sorted(p.parent for p in tmp_path.glob("tiny/*/summary.json"))
    assert len(cells) == 4
    for cell in cells:
        assert (cell / CellStore.SERIES).is_file(), cell
    capsys.readouterr()
    assert results_main(["status", "--results-dir", str(tmp_path), "tiny"]) == 0


def test_a_tracked_cell_without_its_series_is_stale(tmp_path, monkeypatch, capsys):
    assert run_inprocess(tmp_path, "+exp=tiny", "n_jobs=1", "tracking=offline", monkeypatch=monkeypatch) == 0
    cell = sorted(p.parent for p in tmp_path.glob("tiny/*/summary.json"))[0]
    (cell / CellStore.SERIES).unlink()  # sealed without it, as a cell whose W&B failed was
    manifest = cell / CellStore.MANIFEST
    manifest.write_text("".join(ln for ln in manifest.read_text().splitlines(True) if CellStore.SERIES not in ln))
    assert CellStore.at(cell).integrity() == ("intact", [])
    capsys.readouterr()
    assert results_main(["status", "--results-dir", str(tmp_path), "tiny"]) == 1
    assert "no timeseries.parquet although tracking was offline" in capsys.readouterr().out
    assert run_inprocess(tmp_path, "+exp=tiny", "n_jobs=1", "tracking=offline", monkeypatch=monkeypatch) == 0
    assert (cell / CellStore.SERIES).is_file()  # the sweep recomputed it


def test_untracked_cells_need_no_series(tmp_path, monkeypatch, capsys):
    assert run_inprocess(tmp_path, "+exp=tiny", "n_jobs=1", "tracking=disabled", monkeypatch=monkeypatch) == 0
    assert not list(tmp_path.glob("tiny/*/timeseries.parquet"))
    assert results_main(["status", "--results-dir", str(tmp_path), "tiny"]) == 0

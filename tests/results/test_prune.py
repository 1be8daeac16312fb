"""Issue 42: `python -m repro.results prune` lists (dry) and with --yes deletes the folders that hold
no finished cell, cells no current grid produces and failed cells; `status` says when to run it."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from repro.results.__main__ import main
from repro.results.lock import CellLock
from repro.results.prune import remove, scan
from repro.results.store import CellStore


@functools.lru_cache(maxsize=None)
def _grid_sig() -> str:
    """A signature fig5_request_rate's current grid produces (no committed results/ needed)."""
    from repro.harness.grids import grid_signatures

    return sorted(grid_signatures(["fig5_request_rate"])["fig5_request_rate"])[0]


def _finished(cell: Path) -> None:
    """A finished cell as prune sees it: its summary.json (what CellStore.is_finished reads)."""
    cell.mkdir(parents=True)
    (cell / CellStore.SUMMARY).write_text(json.dumps({"p50_ttft_s": 0.1}))


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    fig5 = root / "fig5_request_rate"
    fig5.mkdir(parents=True)
    _finished(fig5 / _grid_sig())  # a cell of the current grid
    _finished(fig5 / "0123456789ab")  # finished, but no grid makes it
    left = fig5 / "aaaaaaaaaaaa"  # what `git clean` leaves: git-ignored files only
    (left / "wandb").mkdir(parents=True)
    (left / "requests.parquet").write_bytes(b"x")
    (fig5 / "bbbbbbbbbbbb").mkdir()
    (fig5 / "bbbbbbbbbbbb" / "error.txt").write_text("Traceback ...\n")
    (fig5 / "cccccccccccc").mkdir()  # being computed: its lock is held
    (fig5 / "notes").mkdir()  # not named like a signature: not a cell, never touched
    mine = root / "fig5_request_rate+kv16384" / "dddddddddddd"
    (mine / "wandb").mkdir(parents=True)
    return root


def test_prune_is_dry_by_default_and_deletes_with_yes(tmp_path, capsys):
    root = _tree(tmp_path)
    fig5 = root / "fig5_request_rate"
    sig = _grid_sig()  # the cell of the grid
    lock = CellLock(fig5 / "cccccccccccc")
    assert lock.try_acquire()
    try:
        before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
        assert main(["prune", "--results-dir", str(root), "fig5_request_rate", "fig5_request_rate+kv16384"]) == 0
        out = capsys.readouterr().out
        assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before  # dry: nothing deleted
        assert "1 unfinished" not in out and "2 unfinished, 1 failed, 1 not in the grid, 1 empty experiment" in out
        assert "dry run" in out and "--yes" in out
        assert main(["prune", "--yes", "--results-dir", str(root), "fig5_request_rate",
                     "fig5_request_rate+kv16384"]) == 0
        assert sorted(p.name for p in fig5.iterdir()) == sorted([sig, "cccccccccccc", "notes"])
        assert not (root / "fig5_request_rate+kv16384").exists()
    finally:
        lock.release()


def test_scan_without_grids_keeps_every_finished_cell(tmp_path):
    root = _tree(tmp_path)
    found = scan(root, ["fig5_request_rate"], grids=None)
    assert {p.kind for p in found} == {"unfinished", "failed"}  # the lock-less "cccc..." folder included
    assert {p.path.name for p in found} == {"aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc"}
    assert remove(found) == 3 and len(list((root / "fig5_request_rate").iterdir())) == 3


def test_inverse_search_cells_are_never_called_foreign(tmp_path):
    root = tmp_path / "r"
    _finished(root / "inverse_search" / "0123456789ab")
    assert scan(root, ["inverse_search"], grids={"inverse_search": set()}) == []


def test_status_says_when_to_prune(tmp_path, capsys):
    root = _tree(tmp_path)
    # exit 1: an unfinished cell folder is a gap (the reliability branch: status exits 1 on one)
    assert main(["status", "--results-dir", str(root), "fig5_request_rate+kv16384"]) == 1
    out = capsys.readouterr().out
    assert "1 folder(s) hold no finished cell" in out and "python -m repro.results prune" in out

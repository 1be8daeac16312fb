"""Nothing incomplete or hand-edited is read silently (issue 41, point 6): a folder in place of a
cell file is damage (status, verify), `status` exits 1 with unfinished cells, and the figures name
the unfinished and unsealed cells they read and refuse a metric that is not a number."""

from __future__ import annotations

import json
import shutil

import pytest

from repro.figures import captions
from repro.figures.load import ResultsError, load_cells
from repro.results.__main__ import main
from repro.results.store import CellStore


@pytest.fixture
def copy(grid, tmp_path):
    out = tmp_path / "r"
    shutil.copytree(grid, out)
    return out


def _cells(root):
    return sorted(p.parent for p in root.glob("tiny/*/summary.json"))


def test_the_committed_like_grid_is_fine(copy, capsys):
    assert main(["status", "--results-dir", str(copy)]) == 0


def test_a_folder_in_place_of_requests_parquet_is_damage(copy, capsys):
    cell = _cells(copy)[0]
    (cell / CellStore.REQUESTS).unlink()
    (cell / CellStore.REQUESTS).mkdir()
    assert CellStore.at(cell).integrity() == ("damaged", ["requests.parquet is not a plain file"])
    capsys.readouterr()
    assert main(["status", "--results-dir", str(copy)]) == 1
    assert f"DAMAGED {cell}: requests.parquet is not a plain file" in capsys.readouterr().out
    assert main(["verify", "--results-dir", str(copy), "--all"]) == 1
    assert f"tiny/{cell.name}: DIFFERENT: damaged: requests.parquet is not a plain file" in capsys.readouterr().out


def test_a_folder_in_place_of_a_covered_file_is_damage(copy):
    cell = _cells(copy)[0]
    (cell / CellStore.TIMINGS).unlink()
    (cell / CellStore.TIMINGS).mkdir()
    state, why = CellStore.at(cell).integrity()
    assert state == "damaged" and any(w.startswith("timings.json") for w in why)


@pytest.mark.parametrize("how", ["summary_deleted", "empty_folder"])
def test_unfinished_cells_fail_status_and_are_named_in_captions(copy, capsys, how):
    cell = _cells(copy)[0]
    if how == "summary_deleted":
        (cell / CellStore.SUMMARY).unlink()
    else:
        (copy / "tiny" / "0123456789ab").mkdir()
    missing = cell.name if how == "summary_deleted" else "0123456789ab"
    assert main(["status", "--results-dir", str(copy)]) == 1
    assert "1 unfinished" in capsys.readouterr().out
    df = load_cells(copy, "tiny")
    text = captions.provenance_caption(df, ["policy_name"])
    assert "INCOMPLETE: 1 cell(s) not finished" in text and missing in text


def _unseal_and_edit(cell, value):
    (cell / CellStore.MANIFEST).unlink()
    s = json.loads((cell / CellStore.SUMMARY).read_text())
    s["hit_rate"] = value
    (cell / CellStore.SUMMARY).write_text(json.dumps(s))


def test_an_unsealed_hand_edited_cell_is_named_in_the_caption(copy):
    cell = _cells(copy)[0]
    _unseal_and_edit(cell, 0.999)
    df = load_cells(copy, "tiny")
    text = captions.provenance_caption(df, ["policy_name"])
    assert "UNSEALED: 1 cell(s) without a checksum manifest" in text and cell.name in text
    assert "INCOMPLETE" not in text


@pytest.mark.parametrize("value", ["high", True, [0.5]])
def test_a_metric_that_is_no_number_is_refused(copy, value):
    cell = _cells(copy)[0]
    _unseal_and_edit(cell, value)
    with pytest.raises(ResultsError, match=f"{cell}/summary.json: hit_rate=.* is not a number"):
        load_cells(copy, "tiny")


def test_an_edited_manifest_digest_is_named_as_such(copy):
    """issue 41 (9): a digest changed in checksums.sha256 was reported as "config.yaml changed"."""
    import os

    cell = _cells(copy)[0]
    manifest = cell / CellStore.MANIFEST
    lines = manifest.read_text().splitlines(True)
    i = next(k for k, ln in enumerate(lines) if ln.endswith("  config.yaml\n"))
    lines[i] = ("0" if lines[i][0] != "0" else "1") + lines[i][1:]
    manifest.write_text("".join(lines))
    later = (cell / CellStore.SUMMARY).stat().st_mtime + 10  # written after the summary, as an edit is
    os.utime(manifest, (later, later))
    state, why = CellStore.at(cell).integrity()
    assert state == "damaged" and why == [
        "config.yaml does not match its digest in checksums.sha256, which was written after summary.json "
        "(the manifest was edited?)"
    ]


def test_a_changed_file_is_still_named_changed(copy):
    cell = _cells(copy)[0]
    (cell / CellStore.CONFIG).write_text((cell / CellStore.CONFIG).read_text() + "# edited\n")
    assert CellStore.at(cell).integrity() == ("damaged", ["config.yaml changed since the cell was finished"])

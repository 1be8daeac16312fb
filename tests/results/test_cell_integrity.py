"""A finished cell defends itself (issue 34, defects 1-2): its checksum manifest is checked by
`status`, a sweep's skip, the figures loader and `verify`; a changed, truncated or removed file is
`damaged` (named, rerun, never read as data); a cell without a manifest is `stale` (regeneration
mends it). `sha256sum -c`, the real tool for the manifest's format, is the judge of the format."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.figures.load import ResultsError, load_cells
from repro.results.__main__ import main
from repro.results.store import CellStore
from tests.harness.helpers import run_inprocess

TAMPERED = 0.9512345


@pytest.fixture
def copy(grid, tmp_path):
    out = tmp_path / "r"
    shutil.copytree(grid, out)
    return out


def _cells(root):
    return sorted(p.parent for p in root.glob("tiny/*/summary.json"))


def _tamper_hit_rate(cell):
    s = json.loads((cell / "summary.json").read_text())
    s["hit_rate"] = TAMPERED
    (cell / "summary.json").write_text(json.dumps(s, sort_keys=True, indent=2) + "\n")


def _sha256sum_ok(cell) -> bool:
    return subprocess.run(["sha256sum", "--quiet", "-c", CellStore.MANIFEST], cwd=cell,
                          capture_output=True).returncode == 0


def test_a_finished_cell_is_sealed_and_sha256sum_agrees(copy):
    for cell in _cells(copy):
        assert CellStore.at(cell).integrity() == ("intact", [])
        assert _sha256sum_ok(cell)
        listed = CellStore.at(cell).manifest()
        assert {"summary.json", "config.yaml", "fingerprint.json", "timings.json", "requests.sha256"} <= set(listed)
    cell = _cells(copy)[0]
    _tamper_hit_rate(cell)
    assert not _sha256sum_ok(cell)
    state, why = CellStore.at(cell).integrity()
    assert state == "damaged" and why == ["summary.json changed since the cell was finished"]


def test_status_names_a_tampered_or_truncated_cell_damaged(copy, capsys):
    a, b = _cells(copy)[:2]
    _tamper_hit_rate(a)
    with open(b / "summary.json", "r+b") as f:
        f.truncate(100)
    assert main(["status", "--results-dir", str(copy)]) == 1
    out = capsys.readouterr().out
    assert "2 fresh     0 stale     2 damaged" in out, out
    assert f"DAMAGED {a}: summary.json changed" in out and f"DAMAGED {b}: summary.json changed" in out


def test_a_cell_without_manifest_is_stale_not_damaged(copy, capsys):
    cell = _cells(copy)[0]
    (cell / CellStore.MANIFEST).unlink()
    assert CellStore.at(cell).integrity()[0] == "unsealed"
    assert main(["status", "--results-dir", str(copy)]) == 1
    out = capsys.readouterr().out
    assert "3 fresh     1 stale     0 damaged" in out and "no checksums.sha256" in out, out


def test_the_sweep_reruns_a_damaged_cell_and_says_so(copy, capsys, monkeypatch):
    cell = _cells(copy)[0]
    before = (cell / "summary.json").read_bytes()
    _tamper_hit_rate(cell)
    assert run_inprocess(copy, "+exp=tiny", "tracking=disabled", "n_jobs=1", monkeypatch=monkeypatch) == 0
    out = capsys.readouterr().out
    assert "3 skipped" in out and "1 were damaged" in out and f"was damaged, recomputed: {cell}" in out, out
    assert str(TAMPERED)[:6] not in out
    assert (cell / "summary.json").read_bytes() == before  # recomputed byte for byte
    assert CellStore.at(cell).integrity() == ("intact", [])


def test_keep_stale_never_keeps_a_damaged_cell(copy, capsys, monkeypatch):
    cell = _cells(copy)[0]
    _tamper_hit_rate(cell)
    assert run_inprocess(copy, "+exp=tiny", "tracking=disabled", "n_jobs=1", "keep_stale=true",
                         monkeypatch=monkeypatch) == 0
    assert "1 were damaged" in capsys.readouterr().out
    assert json.loads((cell / "summary.json").read_text())["hit_rate"] != TAMPERED


def test_the_figures_loader_refuses_a_damaged_cell_by_name(copy):
    assert len(load_cells(copy, "tiny")) == 4
    cell = _cells(copy)[1]
    _tamper_hit_rate(cell)
    with pytest.raises(ResultsError, match=f"{cell}: damaged .*summary.json changed"):
        load_cells(copy, "tiny")


def test_the_figures_loader_marks_an_unsealed_cell_stale(copy):
    (_cells(copy)[0] / CellStore.MANIFEST).unlink()
    assert sorted(load_cells(copy, "tiny")["stale"]) == [False, False, False, True]


def test_a_local_requests_parquet_must_be_the_one_its_hash_names(copy):
    cell = _cells(copy)[0]
    data = bytearray((cell / "requests.parquet").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (cell / "requests.parquet").write_bytes(bytes(data))
    state, why = CellStore.at(cell).integrity()
    assert state == "damaged" and "requests.parquet is not the one requests.sha256 names" in why
    (cell / "requests.parquet").unlink()  # a clone holds only the hash: not damage
    assert CellStore.at(cell).integrity() == ("intact", [])


def test_verify_lists_damaged_cells_and_checks_the_others(copy, capsys):
    a, b, c = _cells(copy)[:3]
    data = bytearray((a / "requests.parquet").read_bytes())
    data[-20] ^= 0xFF
    (a / "requests.parquet").write_bytes(bytes(data))
    with open(b / "summary.json", "r+b") as f:
        f.truncate(100)
    (c / "config.yaml").unlink()
    assert main(["verify", "--results-dir", str(copy), "--all"]) == 1
    out = capsys.readouterr().out
    lines = {line.split(":", 1)[0]: line for line in out.splitlines() if line.startswith("tiny/")}
    assert len(lines) == 4, out
    assert "damaged: requests.parquet is not the one" in lines[f"tiny/{a.name}"]
    assert "damaged: summary.json changed" in lines[f"tiny/{b.name}"]
    assert "config.yaml" in lines[f"tiny/{c.name}"] and "DIFFERENT" in lines[f"tiny/{c.name}"]
    d = (set(_cells(copy)) - {a, b, c}).pop()
    assert lines[f"tiny/{d.name}"].endswith("identical")


def test_diff_survives_a_truncated_summary(grid, copy, capsys):
    cell = _cells(copy)[0]
    with open(cell / "summary.json", "r+b") as f:
        f.truncate(100)
    assert main(["diff", str(grid), str(copy)]) == 1
    out = capsys.readouterr().out
    assert f"tiny/{cell.name}: unreadable summary.json" in out and "4 cell(s) in both" in out


@settings(max_examples=40, deadline=None)
@given(files=st.dictionaries(st.sampled_from(["config.yaml", "timings.json", "fingerprint.json", "notes.txt"]),
                             st.binary(max_size=64), min_size=1),
       summary=st.binary(min_size=1, max_size=64), edit=st.integers(min_value=-1, max_value=3))
def test_integrity_against_a_reference_on_random_folders(tmp_path_factory, files, summary, edit):
    """Reference: a manifest is every listed file's sha256; any later change to one of them (or a
    file added beside them) is damage, nothing else is."""
    import hashlib

    store = CellStore(tmp_path_factory.mktemp("cells"), "e", "s")
    for name, data in files.items():
        store.write_bytes(name, data)
    store.finish(summary)
    expected = {n: hashlib.sha256(d).hexdigest() for n, d in {**files, "summary.json": summary}.items()}
    assert store.manifest() == expected
    names = sorted(expected)
    if edit >= 0:
        name = names[edit % len(names)]
        old = (store.dir / name).read_bytes()
        (store.dir / name).write_bytes(old + b"!")
        assert store.integrity() == ("damaged", [f"{name} changed since the cell was finished"])
        (store.dir / name).write_bytes(old)
    assert store.integrity() == ("intact", [])
    (store.dir / "added.txt").write_bytes(b"x")
    assert store.integrity() == ("damaged", ["added.txt was added after the cell was finished"])

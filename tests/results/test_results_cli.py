"""python -m repro.results status | diff | verify on the tiny fixture grid."""

from __future__ import annotations

import json

from repro.results.__main__ import main
from repro.results.store import CellStore


def test_status_fresh_then_stale(grid, tmp_path, capsys):
    import shutil

    copy = tmp_path / "r"
    shutil.copytree(grid, copy)
    assert main(["status", "--results-dir", str(copy)]) == 0
    assert "tiny" in (out := capsys.readouterr().out) and "4 fresh     0 stale     0 damaged" in out
    f = next(copy.glob("tiny/*/fingerprint.json"))
    d = json.loads(f.read_text())
    d["versions"]["numpy"], d["fingerprint"] = "0.1", "x"
    f.write_text(json.dumps(d))
    store = CellStore.at(f.parent)
    store.finish(store.summary_path.read_bytes())  # sealed again: made by other code, not damaged
    assert main(["status", "--results-dir", str(copy)]) == 1
    out = capsys.readouterr().out
    assert "3 fresh     1 stale     0 damaged" in out and "versions: numpy 0.1 ->" in out


def test_diff_shows_old_to_new(grid, tmp_path, capsys):
    import shutil

    copy = tmp_path / "r"
    shutil.copytree(grid, copy)
    assert main(["diff", str(grid), str(copy)]) == 0
    assert "4 cell(s) in both" in capsys.readouterr().out
    s = next(copy.glob("tiny/*/summary.json"))
    d = json.loads(s.read_text())
    old = d["hit_rate"]
    d["hit_rate"] = 0.123
    s.write_text(json.dumps(d))
    assert main(["diff", str(grid), str(copy)]) == 1
    out = capsys.readouterr().out
    assert f"tiny/{s.parent.name}: hit_rate: {old!r} -> 0.123" in out and "1 differ" in out


def test_diff_pairs_cells_whose_signature_changed_by_their_settings(grid, tmp_path, capsys):
    """A new config key renames every cell: diff still pairs them by the swept settings."""
    import shutil

    import yaml

    copy = tmp_path / "r"
    shutil.copytree(grid, copy)
    cells = sorted(copy.glob("tiny/*/summary.json"))
    for i, s in enumerate(cells):
        cfg = s.parent / "config.yaml"
        c = yaml.safe_load(cfg.read_text())
        c["cluster"]["new_knob"] = True  # present in the new folder only: not a pairing key
        cfg.write_text(yaml.safe_dump(c))
        s.parent.rename(s.parent.with_name(f"renamed{i:02d}"))
    first = copy / "tiny" / "renamed00" / "summary.json"
    d = json.loads(first.read_text())
    old, d["hit_rate"] = d["hit_rate"], 0.5
    first.write_text(json.dumps(d))
    assert main(["diff", str(grid), str(copy)]) == 1
    out = capsys.readouterr().out
    assert "4 of them paired by their swept settings" in out and "1 differ" in out, out
    assert "0 only in" in out and f"->renamed00 [" in out and f"hit_rate: {old!r} -> 0.5" in out, out


def test_verify_reruns_from_scratch_byte_for_byte(grid, tmp_path, capsys):
    import shutil

    assert main(["verify", "--results-dir", str(grid), "--all"]) == 0
    assert capsys.readouterr().out.count("identical") == 4
    copy = tmp_path / "r"
    shutil.copytree(grid, copy)
    sha = next(copy.glob("tiny/*/requests.sha256"))
    sha.write_text("0" * 64 + "  requests.parquet\n")
    assert main(["verify", "--results-dir", str(copy), "--all"]) == 1
    assert "requests.parquet sha256 0000" in capsys.readouterr().out


def test_verify_reruns_each_cell_alone_even_when_a_twin_was_rerun_before(grid, tmp_path, capsys):
    """The same cell in two experiments: the second rerun must run, not copy the first one's result."""
    import shutil

    copy = tmp_path / "r"
    shutil.copytree(grid, copy)
    shutil.copytree(copy / "tiny", copy / "tiny_twin")  # same signatures, another experiment
    assert main(["verify", "--results-dir", str(copy), "--all"]) == 0
    out = capsys.readouterr().out
    assert out.count("identical") == 8 and "copied" not in out, out

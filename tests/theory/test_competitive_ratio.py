"""python -m repro.theory.competitive_ratio: stores one cell per grid point, skips finished ones,
and leaves rendering to the figures layer (theory never imports repro.figures)."""

import ast
import json
from pathlib import Path

import repro.theory.competitive_ratio as cr


def test_quick_cli_stores_cells_and_skips_finished(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the old CLI rendered into ./figures: nothing may appear there now
    res = tmp_path / "results"
    assert cr.main(["--quick", "--results-dir", str(res)]) == 0
    out = capsys.readouterr().out
    cells = sorted((res / "thm_competitive_ratio").iterdir())
    assert len(cells) == 18 and "18 cells run" in out
    assert "python -m repro.figures thm_competitive_ratio" in out
    for d in cells:
        assert {p.name for p in d.iterdir()} == {"config.yaml", "timings.json", "checksums.sha256", "summary.json"}
        s = json.loads((d / "summary.json").read_text())
        if s["policy"] == "lru":
            assert s["misses_per_phase"] == s["x"]
        if s["policy"] == "opt":
            assert s["misses_per_phase"] == 1
        assert "wall_s" not in s and "timings" not in s  # wall clock lives in timings.json only
    mtimes = {d.name: (d / "summary.json").stat().st_mtime_ns for d in cells}
    assert cr.main(["--quick", "--results-dir", str(res)]) == 0
    assert "0 cells run, 18 skipped" in capsys.readouterr().out
    assert mtimes == {d.name: (d / "summary.json").stat().st_mtime_ns for d in cells}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]

    # the figures layer renders these cells, deterministically
    from repro.figures.thm_competitive_ratio import render

    fig = tmp_path / "figures"
    first = [p.read_bytes() for p in render(res, fig)]
    assert [p.name for p in sorted(fig.iterdir())] == ["thm_competitive_ratio.pdf", "thm_competitive_ratio.png"]
    assert [p.read_bytes() for p in render(res, fig)] == first


def test_theory_does_not_import_figures():
    tree = ast.parse(Path(cr.__file__).read_text())
    mods = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    mods += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert mods and not [m for m in mods if m.startswith("repro.figures")]

"""Rendering is deterministic: the same results give byte-identical files."""

from __future__ import annotations

from repro.figures import artefact, claims


def test_render_twice_identical_bytes(fixture_results, tmp_path):
    outs = []
    for run in ("a", "b"):
        paths = artefact("fig4_order").render(fixture_results, tmp_path / run)
        outs.append({p.name: p.read_bytes() for p in paths})
    assert set(outs[0]) == {"fig4_order.png", "fig4_order.pdf", "fig4_order.csv", "fig4_order.caption.txt"}
    assert outs[0] == outs[1]


def test_tables_and_claims_twice_identical(fixture_results, tmp_path):
    a = artefact("tab2_ablation").render(fixture_results, tmp_path / "a")
    b = artefact("tab2_ablation").render(fixture_results, tmp_path / "b")
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert claims.to_markdown(claims.evaluate(fixture_results)) == claims.to_markdown(claims.evaluate(fixture_results))

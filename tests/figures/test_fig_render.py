"""Every artefact renders from the small fixture: files exist, are non-empty, have the expected shape."""

from __future__ import annotations

import pandas as pd
import pytest

from repro.figures import ARTEFACTS, artefact, claims
from repro.figures.reproduce import outputs, read_block
from repro.figures.load import METRICS
from fig_fixture import out_file

PLOTS = [n for n in ARTEFACTS if n not in ("tab2_ablation", "tab3_single_worker", "thm_competitive_ratio")]
# regime_map: heatmaps, its own test; gap_ladder / fig2_speed: their own tables (rung x system, speed factor)
OWN_TABLE_PLOTS = ["gap_ladder", "fig2_speed"]
PERF_PLOTS = [n for n in PLOTS if n != "regime_map" and n not in OWN_TABLE_PLOTS]


def test_cli_renders_every_artefact(rendered):
    rc, figures, _ = rendered
    assert rc == 0
    for name in ARTEFACTS:
        for out in outputs(name, "text"):
            assert (figures / out).stat().st_size > 0, out


def test_an_artefact_without_results_fails_the_run_after_the_rest(fixture_results, tmp_path):
    import shutil

    from repro.figures.__main__ import main

    results = tmp_path / "results"
    shutil.copytree(fixture_results, results)
    shutil.rmtree(results / "fig4_order")
    rc = main(["fig4_order", "tab3_single_worker", "--results-dir", str(results), "--figures-dir",
               str(tmp_path / "f"), "--reproduce-md", str(tmp_path / "none.md")])
    assert rc == 1
    assert (tmp_path / "f" / "tab3_single_worker.md").is_file() and not (tmp_path / "f" / "fig4_order.png").exists()


def test_thm_caption(rendered):
    _, figures, _ = rendered
    cap = (figures / "thm_competitive_ratio.caption.txt").read_text()
    assert "Backend: theory" in cap and "RLT: mean of 8 seeded runs" in cap


@pytest.mark.parametrize("name", PLOTS)
def test_plot_files(rendered, name):
    _, figures, _ = rendered
    png, pdf = (figures / out_file(name, ".png")).read_bytes(), (figures / out_file(name, ".pdf")).read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert pdf.startswith(b"%PDF") and len(pdf) > 5_000
    assert b"CreationDate" not in pdf and b"Producer" not in pdf  # no timestamps / versions
    caption = (figures / out_file(name, ".caption.txt")).read_text()
    assert "Backend: sim" in caption and "model/GPU:" in caption and "seed" in caption


@pytest.mark.parametrize("name", PERF_PLOTS)
def test_plot_data_has_every_point(rendered, fixture_results, name):
    """The CSV next to each plot has one row per (facet, system, x) point, mean and SD per metric."""
    _, figures, _ = rendered
    fig = artefact(name).FIGURE
    cells, _ = fig.table(fixture_results)
    data = pd.read_csv(figures / out_file(name, ".csv"))
    keys = fig.point_keys(cells)
    assert len(data) == len(cells.drop_duplicates(keys))
    for m in METRICS:
        assert m in data and f"{m}_sd" in data
    assert set(data["policy_name"]) == set(cells["policy_name"])


@pytest.mark.parametrize("name", OWN_TABLE_PLOTS)
def test_own_table_plot_data_has_every_row(rendered, fixture_results, name):
    """gap_ladder's CSV: one row per (rung, system), mean and SD per metric and the ratios on the
    LBGR+RLT rows; fig2_speed's: one row per speed factor with each metric's ratio and seed range."""
    from repro.figures import gap_ladder

    _, figures, _ = rendered
    mod = artefact(name)
    _, out = mod.table(fixture_results)
    data = pd.read_csv(figures / out_file(name, ".csv"))
    assert len(data) == len(out) > 0
    for m in gap_ladder.METRICS:
        assert all(f"{m}_{k}" in data for k in ("ratio", "lo", "hi"))
    if name == "gap_ladder":
        assert len(data) == 2 * data[gap_ladder.RUNG].nunique()
        assert set(data[gap_ladder.SYSTEM]) == {gap_ladder.BASE, gap_ladder.OURS}
        for m in gap_ladder.METRICS:
            assert m in data and f"{m}_sd" in data
    else:
        assert list(data[mod.SPEED]) == sorted(set(data[mod.SPEED]))


def test_captions_carry_data_provenance(rendered):
    _, figures, _ = rendered
    fig2 = (figures / out_file("fig2_main", ".caption.txt")).read_text()
    assert "mean ± SD over seeds 0, 1" in fig2
    assert "first 17,671 complete conversations" in fig2  # ShareGPT truncation note
    fig4 = (figures / "fig4_order.caption.txt").read_text()
    assert "SYNTHETIC stand-in data" in fig4 and "loogle" in fig4  # the fixture's LooGLE is a stand-in
    fig3 = (figures / "fig3_models.caption.txt").read_text()
    assert "llama31_70b (fp8 weights) on h200" in fig3


def _md_table(path):
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]
    return header, rows


def test_tab2_rows_and_columns(rendered):
    _, figures, _ = rendered
    header, rows = _md_table(figures / out_file("tab2_ablation", ".md"))
    assert header == ["System", "P50 latency (ms)", "P95 latency (ms)", "P50 TTFT (ms)", "P95 TTFT (ms)",
                      "Hit rate (%)", "Throughput (req/s)", "Eviction (ms/query)", "Routing (ms/query)"]
    assert [r[0] for r in rows] == ["CacheAware+LRU", "CacheAware+RLT", "LBGR+LRU", "LBGR+RLT"]
    assert all("±" in c for r in rows for c in r[1:])  # two seeds: mean ± SD everywhere
    tex = (figures / out_file("tab2_ablation", ".tex")).read_text()
    assert r"\toprule" in tex and r"\caption{" in tex and tex.count(r"\\") == 5  # header + 4 rows


def test_tab3_rows_and_columns(rendered):
    _, figures, _ = rendered
    header, rows = _md_table(figures / "tab3_single_worker.md")
    assert header[:2] == ["Workload", "Eviction"] and header[-1] == "Eviction (ms/query)"
    assert [(r[0], r[1]) for r in rows] == [("gsp", "L-LRU"), ("gsp", "RLT"), ("sharegpt", "L-LRU"), ("sharegpt", "RLT")]


def test_reproduce_md_blocks_filled_and_prose_kept(rendered):
    _, figures, md = rendered
    text = md.read_text()
    for prose in ("hand-written text before", "hand-written text between", "hand-written text after"):
        assert prose in text
    assert "| fig2_main " in text and "`python -m repro.run +exp=fig2_main`" in text
    assert "`fig2.lbgr_rlt_lowest`" in text
    n = len(claims.CLAIMS)
    assert (figures / "claims.md").read_text().count("\n| `") == n
    assert read_block(text, "claims").count("\n| `") == n
    index = (figures / "README.md").read_text()
    assert all(f"## {n}" in index for n in ARTEFACTS)

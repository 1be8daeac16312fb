"""The load regime in the figures and the claims: a point's regime is its worst seed's, sweeps mark
non-stable points, the claims table names the regime of the points each claim compared, and the
load ladder's caption says where each system leaves the stable regime."""

from __future__ import annotations

import json

import pandas as pd

from fig_fixture import matching_cells

from repro.figures import artefact, claims
from repro.figures.claims_evidence import regime_text
from repro.figures.load import SYSTEM, aggregate, load_cells, worst_regime


def set_regime(root, exp: str, regime: str, **match) -> int:
    """Write `regime` into the summary of every cell of results/<exp>/ whose config matches
    (fig_fixture.matching_cells); returns how many changed."""
    cells = matching_cells(root, exp, **match)
    for d in cells:
        s = json.loads((d / "summary.json").read_text())
        s["regime"] = regime
        (d / "summary.json").write_text(json.dumps(s, sort_keys=True, indent=2))
    return len(cells)


def test_worst_regime():
    assert worst_regime(["stable", "overloaded", "backlogged"]) == "overloaded"
    assert worst_regime(["stable", "backlogged", None]) == "backlogged"
    assert worst_regime([None, float("nan")]) is None


def test_a_point_is_as_stable_as_its_worst_seed(results_copy):
    set_regime(results_copy, "fig2_main", "stable")
    set_regime(results_copy, "fig2_main", "backlogged", policy_name="LBGR+RLT", seed=1, workload__name="gsp")
    agg = aggregate(load_cells(results_copy, "fig2_main"), ["workload.name", SYSTEM], "fig2_main")
    bad = agg[agg["regime"] != "stable"]
    assert list(zip(bad["workload.name"], bad[SYSTEM], bad["regime"])) == [("gsp", "LBGR+RLT", "backlogged")]


def test_regime_text():
    assert regime_text({}) == "n/a"
    assert regime_text({1: ("A", "stable"), 2: ("B", "stable")}) == "stable"
    seen = {1: ("LBGR+RLT", "stable"), 2: ("CacheAware+LRU", "backlogged"), 3: ("Random+LRU", "overloaded"),
            4: ("CacheAware+LRU", "backlogged")}
    assert regime_text(seen) == ("1 of 4 compared points stable; overloaded (Random+LRU); "
                                 "backlogged (CacheAware+LRU)")  # each system named once


def test_claims_say_the_regime_of_what_they_compare(results_copy):
    set_regime(results_copy, "fig2_main", "stable")
    set_regime(results_copy, "fig2_main", "backlogged", policy_name="CacheAware+LRU", workload__name="gsp")
    table = claims.evaluate(results_copy).set_index("id")
    # LBGR+RLT vs CacheAware+LRU on two benchmarks: 4 points, CacheAware+LRU's GSP point backlogged
    assert table.loc["fig2.p50_latency_vs_ca", "regime"] == "3 of 4 compared points stable; backlogged (CacheAware+LRU)"
    assert table.loc["thm.lru_linear", "regime"] == "n/a"  # theory cells have no load
    md = claims.to_markdown(table.reset_index())
    assert "| Ours (text) | Verdict (text) | Load regime |" in md and "backlogged (CacheAware+LRU)" in md
    assert table.loc["fig2.p50_latency_vs_ca", "regime:artifact"] == "—"  # the fixture has no artifact cells


def test_sweeps_mark_non_stable_points():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from repro.figures.style import mark_regimes, regime_legend_handles

    fig, ax = plt.subplots()
    mark_regimes(ax, [1, 2, 3, 4], [1, 2, 3, 4], ["stable", "backlogged", "overloaded", "overloaded"])
    drawn = {line.get_marker(): len(line.get_xdata()) for line in ax.get_lines()}
    assert drawn == {"o": 1, "x": 2}
    assert [h.get_label() for h in regime_legend_handles(["stable", "overloaded"])] == ["overloaded"]
    plt.close(fig)


def test_load_ladder_renders_and_names_where_systems_leave_stable(fixture_results, tmp_path):
    mod = artefact("load_ladder")
    paths = mod.render(fixture_results, tmp_path)
    assert {p.name for p in paths} == {"load_ladder.png", "load_ladder.pdf", "load_ladder.csv",
                                       "load_ladder.caption.txt"}
    cells = load_cells(fixture_results, "load_ladder")
    csv = pd.read_csv(tmp_path / "load_ladder.csv")
    assert len(csv) == len(cells.drop_duplicates(["workload.name", SYSTEM, "workload.request_rate"]))
    # reference: per workload and system, the lowest rate of a cell that is not stable
    caption = (tmp_path / "load_ladder.caption.txt").read_text()
    for wl, g in cells.groupby("workload.name"):
        bad = g[g["regime"] != "stable"].groupby(SYSTEM)["workload.request_rate"].min()
        for system, rate in bad.items():
            assert f"{system} {rate:g}" in caption
        assert f"{wl}, the first rate (req/s) at which a system is not stable" in caption

"""todays_baselines' figure: who stands where, against a plain recomputation from the cells."""

from __future__ import annotations

from repro.figures import todays_baselines as tb
from repro.figures.load import load_cells


def test_standing_names_the_best_rival_of_each_row(fixture_results):
    df = load_cells(fixture_results, "todays_baselines")
    rows = tb.standing(df)
    assert {r["workload"] for r in rows} == set(df["workload.name"])
    for r in rows:
        part = df[df["workload.name"] == r["workload"]]
        means = part.groupby("policy_name")[r["metric"]].mean()
        rivals = {**tb.EVICTION_ROWS, **tb.ROUTER_ROWS}[r["ours"]]
        pick = means[list(rivals)]
        best = pick.idxmax() if r["metric"] == "hit_rate" else pick.idxmin()
        assert (r["best_rival"], r["rival_value"], r["value"]) == (best, pick[best], means[r["ours"]])
    assert len(rows) == 2 * 3 * len(set(df["workload.name"]))  # 2 metrics x 3 rows per benchmark
    assert "LBGR+RLT: hit rate" in tb._caption(df)

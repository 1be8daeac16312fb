"""The claims table is computed from results: change a number and the verdict follows."""

from __future__ import annotations

import pytest
from fig_fixture import REPRODUCE_TEMPLATE, set_metric

from repro.figures import claims, claims_why
from repro.figures.__main__ import main, write_generated
from repro.figures.claims import NO_DATA, NOT, PARTLY, REPRODUCED, numeric, pct, times


def verdicts(results_dir) -> dict[str, tuple[str, str]]:
    t = claims.evaluate(results_dir)
    return {r["id"]: (r["verdict"], r["ours"]) for _, r in t.iterrows()}


def test_every_claim_is_evaluated_once(fixture_results):
    t = claims.evaluate(fixture_results)
    assert list(t["id"]) == [c.id for c in claims.CLAIMS]
    assert t["id"].is_unique
    assert set(t["verdict"]) <= set(claims.VERDICTS)


def test_qualitative_claims_hold_on_the_fixture(fixture_results):
    """The fixture is built so that the paper's qualitative findings hold."""
    v = verdicts(fixture_results)
    for c in claims.CLAIMS:
        if c.paper == "qualitative":
            assert v[c.id][0] == REPRODUCED, (c.id, v[c.id])


def test_slower_lbgr_rlt_flips_the_lowest_latency_claim(results_copy):
    before = verdicts(results_copy)
    assert before["fig2.lbgr_rlt_lowest"][0] == REPRODUCED
    assert set_metric(results_copy, "fig2_main", "LBGR+RLT", "latency_p50_s", 50.0, workload__name="gsp") == 2
    after = verdicts(results_copy)
    assert after["fig2.lbgr_rlt_lowest"] == (PARTLY, after["fig2.lbgr_rlt_lowest"][1])  # 3 of 4 comparisons
    assert "gsp P50 latency" in after["fig2.lbgr_rlt_lowest"][1]
    assert after["fig2.p50_latency_vs_ca"][1] != before["fig2.p50_latency_vs_ca"][1]
    assert after["fig2.p50_ttft_vs_ca"] == before["fig2.p50_ttft_vs_ca"]  # TTFT untouched


def test_numeric_verdict_follows_the_number(results_copy):
    # fixture: CacheAware+RLT cuts P50 latency by ~75 % vs the paper's 28.1 % -> same direction, > 2x off
    assert verdicts(results_copy)["tab2.ca_rlt_latency"][0] == PARTLY
    set_metric(results_copy, "tab2_ablation", "CacheAware+RLT", "latency_p50_s", 2.6)  # now about -36 %
    assert verdicts(results_copy)["tab2.ca_rlt_latency"][0] == REPRODUCED
    set_metric(results_copy, "tab2_ablation", "CacheAware+RLT", "latency_p50_s", 10.0)  # now slower than CA+LRU
    v = verdicts(results_copy)
    assert v["tab2.ca_rlt_latency"][0] == NOT and v["tab2.ca_rlt_latency"][1].startswith("+")
    assert v["tab2.ca_rlt_all_metrics"][0] == PARTLY  # 5 of 6 metrics still better


def test_overhead_claim_reads_timings(results_copy):
    import json

    v = verdicts(results_copy)["tab2.route_overhead_lru"]
    assert v == (REPRODUCED, "+0.385 ms")  # fixture: LBGR 0.44 ms vs Cache-Aware 0.055 ms per query
    for d in (results_copy / "tab2_ablation").iterdir():
        t = json.loads((d / "timings.json").read_text())
        t["routing"]["total_s"] *= 10
        (d / "timings.json").write_text(json.dumps(t))
    assert verdicts(results_copy)["tab2.route_overhead_lru"][0] == NOT  # ~3.9 ms > 2 x 0.56 ms


@pytest.mark.parametrize(
    "ours, paper, fmt, verdict",
    [
        (11.0, 11.96, times, REPRODUCED),
        (6.0, 11.96, times, REPRODUCED),  # just inside the factor-2 band (6 / 11.96 > 0.5)
        (5.9, 11.96, times, PARTLY),
        (1.2, 11.96, times, PARTLY),
        (0.9, 11.96, times, NOT),
        (0.30, 0.3645, pct, REPRODUCED),
        (0.05, 0.3645, pct, PARTLY),
        (-0.05, 0.3645, pct, NOT),
        (float("nan"), 2.0, times, NO_DATA),
    ],
)
def test_numeric_rule(ours, paper, fmt, verdict):
    assert numeric(ours, paper, fmt).verdict == verdict


def test_mean_of_per_benchmark_ratios_not_ratio_of_means():
    """'On average' = mean over benchmarks of the per-benchmark ratio (CA / ours)."""
    import pandas as pd

    agg = pd.DataFrame({
        "workload.name": ["a", "a", "b", "b"],
        "policy_name": ["CacheAware+LRU", "LBGR+RLT"] * 2,
        "latency_p50_s": [2.0, 1.0, 40.0, 10.0],  # ratios 2 and 4; ratio of means 42 / 11
    })

    class R:
        def perf(self, name, where=None):
            return agg

    f = claims.mean_ratio("x", "CacheAware+LRU", "LBGR+RLT", "latency_p50_s", 3.0)(R())
    assert f.ours.startswith("3.00×") and f.verdict == REPRODUCED


def test_why_column_is_keyed_by_verdict(fixture_results, monkeypatch):
    monkeypatch.setattr(claims_why, "WHY", {"tab2.ca_rlt_latency": {PARTLY: "because of X"},
                                        "tab2.lbgr_rlt_ttft": {NOT: "written for another verdict"}})
    t = claims.evaluate(fixture_results).set_index("id")
    assert t.loc["tab2.ca_rlt_latency", "why"] == "because of X"
    assert t.loc["tab2.lbgr_rlt_ttft", "verdict"] == PARTLY
    assert "written for: not reproduced" in t.loc["tab2.lbgr_rlt_ttft", "why"]  # stale explanation not shown
    assert t.loc["fig2.lbgr_rlt_lowest", "why"] == ""
    assert pct(-0.281) == "−28.1 %"


def test_no_results_means_no_data(tmp_path):
    t = claims.evaluate(tmp_path)
    assert set(t["verdict"]) == {NO_DATA}


def test_check_detects_drift(results_copy, tmp_path):
    md, figures = tmp_path / "REPRODUCE.md", tmp_path / "figures"
    md.write_text(REPRODUCE_TEMPLATE)
    args = ["--results-dir", str(results_copy), "--figures-dir", str(figures), "--reproduce-md", str(md)]
    figures.mkdir()
    write_generated(results_copy, figures, md)  # what a whole build writes after its renders
    assert main(["--check", *args]) == 0
    md.write_text(md.read_text().replace("hand-written text after", "edited prose"))
    assert main(["--check", *args]) == 0  # prose outside the blocks is not checked
    set_metric(results_copy, "fig2_main", "LBGR+RLT", "latency_p50_s", 50.0, workload__name="gsp")
    assert main(["--check", *args]) == 1  # a committed summary changed: the claims table is stale
    write_generated(results_copy, figures, md)
    assert main(["--check", *args]) == 0
    (figures / "claims.md").write_text((figures / "claims.md").read_text().replace("**partly**", "**reproduced**", 1))
    assert main(["--check", *args]) == 1  # a hand edit of the generated table is caught too


def test_theory_claims_follow_the_numbers(results_copy):
    import json

    v = verdicts(results_copy)
    assert [v[k][0] for k in ("thm.lru_linear", "thm.rlt_harmonic", "thm.opt_one")] == [REPRODUCED] * 3
    for d in (results_copy / "thm_competitive_ratio").iterdir():
        s = json.loads((d / "summary.json").read_text())
        if s["policy"] == "lru" and s["x"] == 64:
            s["misses_per_phase"] = 40.0  # L-LRU no longer at its lower bound at x = 64
        if s["policy"] == "rlt":
            s["misses_per_phase"] = s["x"] / 2  # linear, not logarithmic
        (d / "summary.json").write_text(json.dumps(s))
    v = verdicts(results_copy)
    assert v["thm.lru_linear"][0] == PARTLY and "x=64" in v["thm.lru_linear"][1]
    assert v["thm.rlt_harmonic"][0] == NOT


def test_cited_notes_are_listed_under_the_table(fixture_results, monkeypatch):
    monkeypatch.setattr(claims_why, "NOTES", {"a": "note a cites [b]", "b": "note b", "c": "unused"})
    monkeypatch.setattr(claims_why, "WHY", {"tab2.ca_rlt_latency": {PARTLY: "see [a]"}})
    md = claims.to_markdown(claims.evaluate(fixture_results))
    assert "- **[a]** note a cites [b]" in md and "- **[b]** note b" in md and "unused" not in md

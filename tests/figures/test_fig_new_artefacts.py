"""The artefacts beyond the paper (fig2_router_rules, regime_map) and the appendix Figures 8/9."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest
import yaml

from repro.figures import artefact
from repro.figures.load import SYSTEM


def test_router_rules_joins_fig2_and_labels_the_other_rules(fixture_results):
    mod = artefact("fig2_router_rules")
    df, agg = mod.FIGURE.table(fixture_results)
    systems = set(agg[SYSTEM])
    assert {"CacheAware+LRU (<=0.2.3)", "CacheAware+RLT (<=0.2.3)", "CacheAware+LRU (smg 1.13)",
            "CacheAware+RLT (smg 1.13)", "CacheAware+LRU", "LBGR+RLT"} <= systems
    # the six systems' rows are fig2_main's own cells, unchanged
    fig2 = artefact("fig2_main").FIGURE.table(fixture_results)[1]
    key = ["workload.name", SYSTEM]
    both = agg.merge(fig2, on=key, suffixes=("", "_fig2"))
    assert len(both) == len(fig2)
    assert np.allclose(both["latency_p50_s"], both["latency_p50_s_fig2"])
    cap = mod.headline(df)
    assert "(0.3.2)" in cap and "(<=0.2.3)" in cap and "(smg 1.13)" in cap


def test_router_rules_refuses_the_papers_rule_in_its_own_folder(results_copy):
    d = next(p for p in sorted((results_copy / "fig2_router_rules").iterdir()))
    cfg = yaml.safe_load((d / "config.yaml").read_text())
    cfg["router"]["generation"] = "v0_3_2"  # the paper's rule: fig2_main's
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(ValueError, match="not under the other rules"):
        artefact("fig2_router_rules").FIGURE.table(results_copy)


def test_router_rules_refuses_fig2_cells_from_before_the_rule(results_copy):
    d = next(p for p in sorted((results_copy / "fig2_main").iterdir())
             if yaml.safe_load((p / "config.yaml").read_text())["router"]["name"] == "cache_aware")
    cfg = yaml.safe_load((d / "config.yaml").read_text())
    del cfg["router"]["generation"]  # a cell from before router.generation existed
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(ValueError, match="rerun fig2_main"):
        artefact("fig2_router_rules").FIGURE.table(results_copy)


def test_regime_map_ratios(fixture_results, tmp_path):
    mod = artefact("regime_map")
    df, r = mod.table(fixture_results)
    n_points = df.groupby([mod.RATE, mod.BUDGET]).ngroups
    assert len(r) == len(mod.PANELS) * n_points
    # reference: ratio of seed means, computed plainly
    g = df[(df[mod.RATE] == 4.0) & (df[mod.BUDGET] == 8192)]
    ref = g[g[SYSTEM] == "LBGR+RLT"]["latency_p50_s"].mean() / g[g[SYSTEM] == "CacheAware+LRU"]["latency_p50_s"].mean()
    row = r[(r["metric"] == "latency_p50_s") & (r[mod.RATE] == 4.0) & (r[mod.BUDGET] == 8192)].iloc[0]
    assert row["ratio"] == pytest.approx(ref)
    assert row["paper_direction"] and not row["tie"]  # fixture: LBGR+RLT much faster on both seeds
    paths = mod.render(fixture_results, tmp_path)
    assert {p.name for p in paths} == {"regime_map.png", "regime_map.pdf", "regime_map.csv", "regime_map.caption.txt"}
    csv = pd.read_csv(tmp_path / "regime_map.csv")
    assert len(csv) == len(r)
    caption = (tmp_path / "regime_map.caption.txt").read_text()
    assert "ties within noise" in caption and mod.WHY_COMMAND in caption


def test_regime_map_marks_a_noisy_cell_as_tie(results_copy):
    from fig_fixture import set_metric

    mod = artefact("regime_map")
    # CacheAware+RLT's hit rate below LRU's on seed 0, above on seed 1, at one point: a tie
    set_metric(results_copy, "regime_map", "CacheAware+RLT", "hit_rate", 0.5, seed=0,
               workload__request_rate=4.0, cluster__kv_cache_tokens=8192)
    _, r = mod.table(results_copy)
    row = r[(r["metric"] == "hit_rate") & (r[mod.RATE] == 4.0) & (r[mod.BUDGET] == 8192)].iloc[0]
    assert bool(row["tie"])


def test_regime_map_rejects_duplicate_cells(results_copy):
    src = next(p for p in sorted((results_copy / "regime_map").iterdir()))
    shutil.copytree(src, src.with_name(src.name + "dup"))
    with pytest.raises(ValueError, match="same point and seed"):
        artefact("regime_map").table(results_copy)


@pytest.mark.parametrize("name, model", [("fig8_llama70b_benchmarks", "llama31_70b"),
                                         ("fig9_mixtral_benchmarks", "mixtral_8x7b")])
def test_appendix_figures_read_their_model(fixture_results, name, model):
    fig = artefact(name).FIGURE
    df, agg = fig.table(fixture_results)
    assert set(agg["model.name"]) == {model}
    assert "sharegpt" not in set(agg["workload.name"])
    assert "our reading" in fig.notes.lower()

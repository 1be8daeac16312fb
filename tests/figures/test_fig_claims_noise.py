"""Noise-aware verdicts and stamped Why texts (repro/figures/claims.py docstring)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from fig_fixture import set_metric

from repro.figures import claims, claims_why
from repro.figures.claims import LOSS, NOT, PARTLY, REPRODUCED, TIE, WIN, Why


def reference_outcome(d):
    """Plain re-statement of the rule: mean vs K_SE standard errors (sample SD / sqrt n)."""
    d = list(d)
    m = sum(d) / len(d)
    if len(d) > 1:
        var = sum((x - m) ** 2 for x in d) / (len(d) - 1)
        if abs(m) <= claims.K_SE * (var / len(d)) ** 0.5:
            return TIE
    return TIE if m == 0 else (WIN if m > 0 else LOSS)


@pytest.mark.parametrize("d", [[0.1, 0.1, 0.1], [1.0, -1.0, 0.5], [0.3, 0.2, 0.25], [-0.3, -0.31, -0.2],
                               [0.5], [-0.01], [0.0, 0.0], [1.0, 0.0]])
def test_paired_rule(d):
    assert claims.paired(np.array(d)) == reference_outcome(d)


def test_compare_uses_common_seeds_and_direction():
    # lower is better: a is lower on every seed by a steady margin -> WIN
    assert claims.compare("latency_p50_s", {0: 1.0, 1: 1.1, 2: 0.9}, {0: 1.2, 1: 1.3, 2: 1.1}, 1.0, 1.2) == (WIN, 3)
    # the same differences, higher-is-better metric -> LOSS
    assert claims.compare("hit_rate", {0: 1.0, 1: 1.1, 2: 0.9}, {0: 1.2, 1: 1.3, 2: 1.1}, 1.0, 1.2) == (LOSS, 3)
    # seed means say "a better", per seed it flips: TIE
    assert claims.compare("latency_p50_s", {0: 0.5, 1: 2.0}, {0: 1.0, 1: 1.2}, 1.25, 1.1)[0] == TIE
    # no per-seed values: strict on the means
    assert claims.compare("latency_p50_s", {}, {}, 1.0, 1.01) == (WIN, 1)
    # throughput within 0.5 % is "not worse"
    assert claims.compare("throughput_rps", {0: 11.95}, {0: 12.0}, 11.95, 12.0)[0] == WIN


def verdict(results_dir, cid):
    t = claims.evaluate(results_dir).set_index("id")
    return t.loc[cid, "verdict"], t.loc[cid, "ours"]


def test_a_win_of_the_seed_means_that_flips_between_seeds_is_a_tie(results_copy):
    assert verdict(results_copy, "tab2.ca_rlt_all_metrics")[0] == REPRODUCED
    # CacheAware+RLT becomes slower than CacheAware+LRU on seed 0 only: its seed mean still wins
    assert set_metric(results_copy, "tab2_ablation", "CacheAware+RLT", "latency_p50_s", 6.0, seed=0) == 1
    v, ours = verdict(results_copy, "tab2.ca_rlt_all_metrics")
    assert v == PARTLY and "tie within noise" in ours and "P50 latency" in ours


def test_qualitative_rule_counts_wins_ties_losses():
    def f(*outcomes):
        c = claims.Checks()
        for o in outcomes:
            c.add(o, 3, "x")
        return claims.qualitative(c, "u").verdict

    assert f(WIN, WIN) == REPRODUCED
    assert f(WIN, TIE) == PARTLY
    assert f(TIE, TIE) == NOT  # no difference shown anywhere
    assert f(WIN, LOSS) == PARTLY and f(WIN, LOSS, LOSS) == NOT and f(WIN, WIN, TIE, LOSS) == PARTLY


def test_why_texts_go_stale_when_the_numbers_change(results_copy, monkeypatch, tmp_path):
    cid = "tab2.ca_rlt_latency"
    t = claims.evaluate(results_copy).set_index("id")
    v, stamp = t.loc[cid, "verdict"], t.loc[cid, "stamp"]
    monkeypatch.setattr(claims_why, "WHY", {cid: {v: Why("because of X", stamp)}})
    assert claims.evaluate(results_copy).set_index("id").loc[cid, "why"] == "because of X"
    assert cid not in [e["id"] for e in claims.stale_entries(claims.evaluate(results_copy))]
    set_metric(results_copy, "tab2_ablation", "CacheAware+RLT", "latency_p50_s", 1.05)  # same verdict, new numbers
    t2 = claims.evaluate(results_copy)
    row = t2.set_index("id").loc[cid]
    assert row["verdict"] == v and row["stamp"] != stamp
    assert row["why"].startswith("(stale") and "because of X" not in row["why"]
    listed = [e for e in claims.stale_entries(t2) if e["id"] == cid]
    assert len(listed) == 1 and "written for stamp" in listed[0]["reason"]
    # --stamp on a copy of the file records today's numbers
    path = tmp_path / "why.yaml"
    shutil.copy(claims.WHY_FILE, path)
    import yaml

    data = yaml.safe_load(path.read_text())
    data["why"][cid] = {v: {"text": "because of X", "stamp": stamp}}
    claims.write_why(data, path)
    assert claims.stamp_entries(t2, [cid], path) == [cid]
    _, why = claims.load_why(path)
    assert why[cid][v].stamp == row["stamp"]


def test_committed_why_file_loads_and_every_id_is_a_claim():
    notes, why = claims.load_why()
    ids = {c.id for c in claims.CLAIMS}
    assert set(why) <= ids
    assert all(e.text for per in why.values() for e in per.values())
    assert all(set(per) <= set(claims.VERDICTS) for per in why.values())
    assert notes


def test_stale_cli_lists_and_stamp_cli_refuses_unknown_ids(fixture_results, capsys):
    rc = claims.main(["--results-dir", str(fixture_results), "--stale"])
    out = capsys.readouterr().out
    # the committed texts were written for the committed results, not for the fixture: all stale
    assert rc == 1 and "text(s) to rewrite" in out and "written for stamp" in out
    assert claims.main(["--results-dir", str(fixture_results), "--stamp", "no.such.claim"]) == 2
    assert "unknown claim id" in capsys.readouterr().err
